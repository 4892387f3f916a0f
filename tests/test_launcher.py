"""`pax-autockpt launch`'s restart rule, its standby process's environment check, and the standby forking hosts
(a light host in place of paxml; the launch itself, and its restart, run end to end in
tests/test_e2e_multihost.py)."""

import functools
import os
import select
import signal
import sys
import threading
import time

import pytest

from pax_autockpt.startup import standby
from pax_autockpt.tools import launcher


@pytest.mark.parametrize('codes, first_failed, stopped_by, restarts, expected', [
    ([137, 134], 0, None, 0, 'host 0 ended with exit 137'),  # a crash: the host that failed first is named
    ([134, 137], 1, None, 0, 'host 1 ended with exit 137'),
    ([1, 1], None, None, 0, 'host 0 ended with exit 1'),  # a failure exit a rerun may cure
    ([143, 143], None, None, 0, 'host 0 ended with exit 143'),  # a SIGTERM from elsewhere: a preempted VM
    ([137, 134], 0, None, 1, None),  # restarts used up
    ([143, 143], None, 'SIGTERM', 0, None),  # the launcher's own stop is honoured, not undone
    ([130, 130], None, 'SIGINT', 0, None),
    ([0, 0], None, None, 0, None),  # finished
    ([2, 2], 1, None, 0, None),  # bad input: a rerun fails the same way
    ([130, 130], None, None, 0, None),  # a Ctrl-C on a host (kill -INT): a person stopped it
    ([130, 137], 1, None, 0, None),  # ... even where another host then failed
])
def test_a_failed_job_restarts_until_the_budget_but_never_after_a_stop_success_bad_input_or_ctrl_c(
    codes, first_failed, stopped_by, restarts, expected):
  assert launcher.restart_reason(codes, first_failed, stopped_by, restarts, max_restarts=1) == expected


def test_restarts_back_off_from_2_s_doubling_to_60_s_and_start_over_after_a_long_run():
  backoff = launcher.Backoff()
  assert [backoff.next(run_secs=5.0) for _ in range(7)] == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
  assert backoff.next(run_secs=600.0) == 2.0  # it trained 10 min: a new failure, not the crash loop
  assert backoff.next(run_secs=1.0) == 4.0
  assert [launcher.Backoff(quick_runs=10_000).next(run_secs=0.0)] == [60.0]  # no overflow however long the loop


def test_max_restarts_below_zero_is_bad_input():
  cfg = launcher.LaunchConfig(num_hosts=2, max_restarts=-1, args=('--exp=x', '--job_log_dir=/tmp/j'))
  with pytest.raises(launcher.LaunchError, match=r'^--max_restarts=-1: use 0 \(no restart\) or more$'):
    launcher.validate(cfg)


def test_a_standby_takes_only_an_environment_its_imports_saw_but_the_runtime_variables_may_differ():
  imported_with = {'PATH': '/usr/bin', 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': '--a', 'AUTOCKPT_X': '1'}
  runtime_only = {**imported_with, 'XLA_FLAGS': '--b', 'JAX_COORDINATOR_BIND_ADDRESS': '127.0.0.1:5',
                  'AUTOCKPT_Y': '2'}
  assert standby.stale(imported_with, runtime_only) == []
  assert standby.stale(imported_with, {**runtime_only, 'JAX_PLATFORMS': 'tpu', 'TF_CPP_MIN_LOG_LEVEL': '3'}) == [
      'JAX_PLATFORMS', 'TF_CPP_MIN_LOG_LEVEL']
  assert standby.stale(imported_with, {k: v for k, v in imported_with.items() if k != 'PATH'}) == ['PATH']


_LIGHT_STANDBY = (sys.executable, '-c', 'from pax_autockpt.startup import standby; standby.preload = lambda: None; '
                  'standby.MAIN = "tests.standby_fake_host"; standby.serve()')


def test_the_standby_forks_each_host_asked_for_with_its_arguments_environment_output_and_exit(tmp_path):
  """`launch`'s standby process (with a light host in place of pax_autockpt.main, and no imports): each host
  forked with its own arguments and environment, stdin /dev/null, output on its own pipe, its exit code or its
  signal as subprocess gives them; an environment the imports did not see gets None (a fresh interpreter)."""
  env = {**os.environ, 'AUTOCKPT_X': 'standby'}
  spare = launcher._Standby(env, str(tmp_path / 'standby.log'), argv=_LIGHT_STANDBY)
  try:
    assert spare.wait_ready()
    first, second = (spare.fork([code], {**env, 'AUTOCKPT_X': code}) for code in ('3', 'wait'))
    assert first.stdout.read() == b"argv=['3'] AUTOCKPT_X=3 stdin=''\n" and _wait_for(first) == 3
    assert second.stdout.readline() == b"argv=['wait'] AUTOCKPT_X=wait stdin=''\n"
    assert os.getsid(second.pid) == second.pid  # a session of its own: a terminal's Ctrl-C is the launcher's
    second.send_signal(signal.SIGKILL)
    assert _wait_for(second) == -signal.SIGKILL and first.pid != second.pid
    assert spare.fork(['0'], {**env, 'JAX_PLATFORMS': 'tpu'}) is None
  finally:
    spare.stop()
  assert spare.proc.returncode == 0


def test_a_host_gets_sigterm_when_the_standby_dies_and_its_unknown_exit_counts_as_a_failure(tmp_path):
  """The launcher's death SIGTERMs the standby (Linux's parent-death signal), whose death SIGTERMs each host it
  forked: the host saves and exits. Its exit code, which no one can report then, is a failure (1)."""
  env = dict(os.environ)
  spare = launcher._Standby(env, str(tmp_path / 'standby.log'), argv=_LIGHT_STANDBY)
  host = spare.fork(['wait'], env)
  assert host.stdout.readline().startswith(b"argv=['wait']")
  spare.proc.send_signal(signal.SIGTERM)
  assert select.select([host.stdout], [], [], 30)[0], 'the host did not get SIGTERM when the standby died'
  assert host.stdout.read() == b'' and _wait_for(host) == 1  # its pipe closed: it exited
  spare.stop()


def _wait_for(host, secs: float = 30.0) -> int:
  deadline = time.time() + secs
  while host.poll() is None:
    assert time.time() < deadline, f'host {host.pid} did not end'
    time.sleep(0.02)
  return host.returncode


def test_a_stop_while_the_standby_imports_starts_no_host_and_exits_with_the_signals_code(tmp_path, monkeypatch,
                                                                                         capsys):
  """SIGTERM to the launcher before its standby is ready (its imports take seconds): no host is started (none
  would have anything to save), the standby is ended, and the launcher exits 143 with one line."""
  never_ready = (sys.executable, '-c', 'import time; time.sleep(60)')
  monkeypatch.setattr(launcher, '_Standby', functools.partial(launcher._Standby, argv=never_ready))
  threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
  job = tmp_path / 'job'
  # Without the stop, the never-ready standby would be waited for 120 s and then fresh hosts started: their
  # logs would be in the directory and their exit (2: no such experiment) the launcher's.
  assert launcher.launch(launcher.LaunchConfig(num_hosts=2, args=('--exp=x', f'--job_log_dir={job}'))) == 143
  out = capsys.readouterr().out
  assert out.splitlines()[-1] == '[launch] SIGTERM before any host started: nothing to save; exit 143', out
  assert sorted(os.listdir(job / 'autockpt')) == ['standby.log']
