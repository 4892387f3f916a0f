"""A signal during the first compile (pax_autockpt.exit.compile_on_exit, pax_autockpt.exit.startup_exit): the
projection, the decision, the wait for the main thread on one and two hosts, the compile counts; the harsh bench
trace's pure parts. The real compile, cache and exit: tests/test_e2e_first_compile.py."""

import atexit
import signal
import threading
import time

from hypothesis import given
from hypothesis import strategies as st
import pytest

from pax_autockpt.exit import compile_on_exit
from pax_autockpt.exit import startup_exit
from pax_autockpt.shared import coordination
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import phases as phases_lib
from pax_autockpt.signals import grace
from pax_autockpt.signals import signals
from rigs.bench import harsh
from tests import fakes
from tests.test_startup_exit import _Service


def _compiling(monkeypatch, setting=compile_on_exit.SIGTERM_ONLY, past=(), cache=True):
  monkeypatch.setattr(compile_on_exit, 'cache_on', lambda: cache)
  phases = phases_lib.LoopPhases()
  phases.enter(phases_lib.TRAIN)  # the first train_step call: its trace and compile
  return phases, compile_on_exit.FirstCompile(phases, setting, past)


def test_the_projection_finishes_a_compile_only_where_its_rest_and_the_margins_fit():
  assert compile_on_exit.project(300.0, 15.0, 20.0).finish  # 30 - 15 + 3 s needed
  assert compile_on_exit.project(19.0, 15.0, 20.0).finish
  late = compile_on_exit.project(17.0, 15.0, 20.0)
  assert not late.finish and '~18 s more projected' in late.note and '17 s of the grace period left' in late.note
  assert not compile_on_exit.project(30.0, 5.0, None).finish  # nothing measured: the default, 120 s
  assert compile_on_exit.project(300.0, 5.0, None).finish


@given(remaining=st.floats(0, 1e4), into=st.floats(0, 1e3), compile_s=st.none() | st.floats(0, 1e3))
def test_the_projection_is_the_rest_times_the_margin_factor_plus_the_margins(remaining, into, compile_s):
  estimate = compile_on_exit.DEFAULT_COMPILE_S if compile_s is None else compile_s
  needed = max(0.0, estimate * grace.MARGIN_FACTOR - into) + grace.MARGIN_SECS + grace.WATCHDOG_LEAD_SECS
  assert compile_on_exit.project(remaining, into, compile_s).finish == (needed <= remaining)


def test_the_measured_compile_is_the_longest_of_the_runs_that_paid_one():
  past = [{'event': 'first_step', 'compile_s': 9.0, 'compiles': 2}, {'event': 'first_step', 'compile_s': 30.0},
          {'event': 'first_step', 'compile_s': 80.0, 'compiles': 0}, {'event': 'start', 'compile_s': 500.0}]
  assert compile_on_exit.measured_compile_s(past) == 30.0  # the 80 s one loaded from the cache; an old event counts
  assert compile_on_exit.measured_compile_s([]) is None


def test_the_decision_needs_a_compile_in_flight_a_cache_and_a_sigterm(monkeypatch):
  now = time.time()
  phases, first = _compiling(monkeypatch)
  assert first.decide(signal.SIGTERM, now, 300.0, now).finish
  ctrl_c = first.decide(signal.SIGINT, now, 300.0, now)
  assert not ctrl_c.finish and '--autockpt_finish_first_compile=sigterm_and_ctrl_c' in ctrl_c.note
  assert _compiling(monkeypatch, compile_on_exit.SIGTERM_AND_CTRL_C)[1].decide(signal.SIGINT, now, 300.0, now).finish
  assert not _compiling(monkeypatch, compile_on_exit.OFF)[1].decide(signal.SIGTERM, now, 300.0, now).finish
  uncached = _compiling(monkeypatch, cache=False)[1].decide(signal.SIGTERM, now, 300.0, now)
  assert not uncached.finish and 'no compilation cache' in uncached.note
  short = _compiling(monkeypatch, past=[{'event': 'first_step', 'compile_s': 40.0}])[1]
  assert not short.decide(signal.SIGTERM, now, 30.0, now).finish  # 60 s projected, 30 s of grace
  phases.trained(1, None)
  phases.enter(phases_lib.TRAIN)  # the second step's call: no first compile in flight
  assert first.decide(signal.SIGTERM, now, 300.0, now) == compile_on_exit.Decision(False, '')


def _one_host(tmp_path, first, grace_secs=300.0, client=None, host=0):
  return startup_exit.StartupExit(client, host, events_lib.EventLog(tmp_path, host), 143, grace_secs, lambda: True,
                                  lambda: 400, first_compile=first)


def test_one_host_waits_for_the_compile_and_its_main_thread_exits_143(tmp_path, exits, monkeypatch):
  codes, _ = exits
  _, first = _compiling(monkeypatch)
  host = _one_host(tmp_path, first)
  signals._record(signal.SIGTERM, None)  # pylint: disable=protected-access
  time.sleep(0.3)
  assert codes == [] and events_lib.read(tmp_path) == []  # the compile goes on; nothing exits yet
  with pytest.raises(fakes.ProcessExited):
    host.first_step_done()  # the main thread, back at the loop with the compile done and cached
  assert codes == [('MainThread', 143)]
  preemption, = [e for e in events_lib.read(tmp_path, 0) if e['event'] == 'preemption']
  assert preemption['plan'] == 'nothing_to_save' and preemption['first_compile'] == 'finished'


def test_a_compile_that_overruns_its_projection_is_not_waited_for_past_the_grace_period(tmp_path, exits, monkeypatch):
  codes, cond = exits
  _, first = _compiling(monkeypatch)
  monkeypatch.setattr(compile_on_exit, 'project', lambda *_: compile_on_exit.Decision(True, ''))  # fits, says it
  _one_host(tmp_path, first, grace_secs=grace.MARGIN_SECS + grace.WATCHDOG_LEAD_SECS + 0.5)
  signals._record(signal.SIGTERM, None)  # pylint: disable=protected-access
  with cond:
    assert cond.wait_for(lambda: codes, 10)
  assert codes == [('autockpt-first-compile', 143)]
  preemption, = [e for e in events_lib.read(tmp_path, 0) if e['event'] == 'preemption']
  assert preemption['first_compile'] == 'not_finished'


def test_a_compile_that_does_not_fit_exits_at_once_saying_why(tmp_path, exits, monkeypatch, capsys):
  codes, _ = exits
  _, first = _compiling(monkeypatch)
  _one_host(tmp_path, first, grace_secs=30.0)  # nothing measured: 120 s x 1.5 projected
  signals._record(signal.SIGTERM, None)  # pylint: disable=protected-access
  assert codes == [('MainThread', 143)]  # the recording thread (here: this one) ends the process, as before
  preemption, = [e for e in events_lib.read(tmp_path, 0) if e['event'] == 'preemption']
  assert preemption['first_compile'] == 'dropped' and 'of the grace period left' in preemption['why']
  del capsys


def test_every_host_lets_its_compile_finish_and_each_main_thread_ends_its_process(tmp_path, exits, monkeypatch):
  codes, cond = exits
  service = _Service()
  _, first = _compiling(monkeypatch)
  hosts = [_one_host(tmp_path, first, client=service, host=h) for h in (0, 1)]
  signals._record(signal.SIGTERM, None)  # pylint: disable=protected-access  (one host's signal)
  assert service.values[coordination.STARTUP_EXIT].startswith('finish|SIGTERM|')
  time.sleep(0.3)
  assert codes == []
  for host in hosts:  # each host's main thread, back at the loop
    main = threading.Thread(target=host.first_step_done, name=f'main-{host._host}', daemon=True)  # pylint: disable=protected-access
    main.start()
    main.join(10)
  assert sorted(codes) == [('main-0', 143), ('main-1', 143)]
  for h in (0, 1):
    assert [e['first_compile'] for e in events_lib.read(tmp_path, h) if e['event'] == 'preemption'] == ['finished']
  for host in hosts:
    atexit.unregister(host._release)  # pylint: disable=protected-access
  del cond


def test_compile_counts_split_cache_loads_compiles_kept_and_compiles_never_kept(monkeypatch):
  monkeypatch.setattr(compile_on_exit, '_totals', dict.fromkeys(compile_on_exit._totals, 0))  # pylint: disable=protected-access
  monkeypatch.setattr(compile_on_exit, '_watching', [True])
  threshold = compile_on_exit.jax.config.jax_persistent_cache_min_compile_time_secs
  compile_on_exit.jax.config.update('jax_persistent_cache_min_compile_time_secs', 1.0)  # JAX's default
  try:
    backend = compile_on_exit.dispatch.BACKEND_COMPILE_EVENT
    compile_on_exit._on_event('/jax/compilation_cache/cache_hits')  # pylint: disable=protected-access
    compile_on_exit._on_duration(backend, 0.05)  # pylint: disable=protected-access
    compile_on_exit._on_duration(backend, 7.0)  # pylint: disable=protected-access
    compile_on_exit._on_duration(backend, 0.25)  # pylint: disable=protected-access
    compile_on_exit._on_duration('/jax/other', 9.0)  # pylint: disable=protected-access
  finally:
    compile_on_exit.jax.config.update('jax_persistent_cache_min_compile_time_secs', threshold)
  assert compile_on_exit.counts() == {'cache_hits': 1, 'compiles': 1, 'compiles_s': 7.0, 'uncached_compile_s': 0.25}


def test_the_harsh_trace_strikes_the_first_compile_first_then_every_one_and_a_half_to_two_restarts():
  failures = harsh.harsh_trace(180.0, 22.0)
  assert failures[0] == harsh.trace.Failure(0.0, harsh.COMPILE_SIGTERM)
  assert all(33.0 <= f.t <= 44.0 for f in failures[1:]) and sum(f.t for f in failures[1:]) >= 180.0
  assert [f.kind for f in failures[1:6]] == ['crash', 'replaced VM', 'crash', 'preemption', 'crash']


def test_the_harsh_trace_counts_the_train_steps_compiles_paid_and_dropped_from_a_runs_log():
  compiled = ("Compiling _wrapped_step_fn for with global shapes\nFinished XLA compilation of pjit(_wrapped_step_fn) "
              "in 10.1 sec\n")
  loaded = ("Compiling _wrapped_step_fn for with\nPersistent compilation cache hit for 'pjit__wrapped_step_fn'\n"
            "Finished XLA compilation of pjit(_wrapped_step_fn) in 0.3 sec\n")
  assert harsh.compiles(compiled) == {'paid': 1, 'dropped': 0}
  assert harsh.compiles(loaded) == {'paid': 0, 'dropped': 0}
  assert harsh.compiles(loaded + 'Compiling _wrapped_step_fn for with\n') == {'paid': 0, 'dropped': 1}
  hit = "Persistent compilation cache hit for 'pjit__wrapped_step_fn'\n"
  twice = (f'Compiling _wrapped_step_fn for with\nDEBUG:2026-11-28 20:12:56,409:jax._src.compiler:290: {hit}'
           f'I1128 20:12:56.409311 1 compiler.py:290] {hit}Finished XLA compilation of pjit(_wrapped_step_fn) in 0.1 '
           'sec\nCompiling _wrapped_step_fn for with\nFinished XLA compilation of pjit(_wrapped_step_fn) in 0.4 sec\n')
  assert harsh.compiles(twice) == {'paid': 1, 'dropped': 0}  # one hit logged twice; the eval step compiled
