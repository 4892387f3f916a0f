"""The report's runs bounded by processes (issue 57): a restart's events written before its `start` are the
restart's, not the killed run's before it. Each case is a history of tests/report_histories.py, written through the
product's writer, with its true timeline; the property test there generates many more."""

import json
import os
import subprocess
import sys

import hypothesis
from hypothesis import strategies as st
import pytest

from pax_autockpt.shared import events as events_lib
from pax_autockpt.tools import report
from pax_autockpt.tools.report import measured
from pax_autockpt.tools.report import model
from tests import report_histories as rh


def _run(steps, ending, *, idle=5.0, restore='normal', failed=(), process_start=True, local=False):
  return rh.Run(idle_s=idle, startup_s=20.0, restore_s=3.0, compile_s=5.0, steps=steps, ending=ending,
                kill_into_step=0.5, local=local, restore=restore, process_start=process_start,
                failed_before=list(failed))


def _history(*runs, marks=True):
  return rh.History(hosts=1, skew_s=[0.0], step_s=1.0, every=100, blocking_s=0.5, duration_s=1.0, local_every=10,
                    runs=list(runs), marks=marks)


def _load(history, tmp_path):
  sim = rh.write(history, tmp_path)
  return report.load(tmp_path), rh.truth(sim)


def _buckets_hold(r, truth):
  m = measured.measure(r)
  assert m.seconds == pytest.approx(truth.seconds, abs=truth.tolerance_s)
  assert m.wall_s == pytest.approx(truth.wall_s, abs=truth.tolerance_s)
  return m


@pytest.mark.parametrize('marks', [True, False])
def test_a_killed_run_then_a_restart_whose_restore_fails_loses_what_the_killed_run_trained(tmp_path, marks):
  """Run 1 trains to 399 (checkpoint 300) and is killed; run 2's restore fails 2,800 s later (exit 1); run 3
  restores 300. The exit 1 is run 2's: run 1 was killed (~369 or later in its log), not 'exit 1, 0 lost', and
  the 2,800 s are idle between runs, not `other`."""
  r, truth = _load(_history(_run(399, 'kill'), _run(50, 'finish', failed=[rh.Failed('restore_failed', 2800.0, 30.0)]),
                            marks=marks), tmp_path)
  assert r.restored_steps == [None, None, 300]
  run2, run3 = r.restart_details
  assert (run2.trained, run2.exit_code) == (False, 1)
  assert (run3.previous_index, run3.lower_bound, run3.restored_step) == (0, True, 300) and run3.steps_lost >= 69
  assert 'run 2 ended before training (exit 1); run 1 was killed at step ~' in report.format_text(r)
  m = _buckets_hold(r, truth)
  assert m.seconds['other'] < 2.0 and m.seconds['idle_between_runs'] > 2800.0


@pytest.mark.parametrize('marks', [True, False])
def test_a_killed_run_then_a_restart_that_sets_a_damaged_checkpoint_aside(tmp_path, marks):
  """Issue 57's end-to-end story: run 1 SIGTERMed (saves 140 on demand), run 2 killed 25 s in, 60 s idle, run 3
  sets the newest checkpoint aside and trains 20 s. Run 3's `restore_skipped` is its own: run 2 ends at its last
  event, the 60 s are idle, and training is what it was."""
  r, truth = _load(_history(_run(140, 'sigterm'), _run(25, 'kill', idle=10.0),
                            _run(20, 'finish', idle=60.0, restore='set_aside'), marks=marks), tmp_path)
  assert [x.restored_step for x in r.restart_details] == [140, 100]
  assert r.restore_skipped_steps == [140]
  from pax_autockpt.tools.report import timeline  # pylint: disable=g-import-not-at-top
  ring = next(c for c in timeline.figure(r).axes[0].collections if c.get_label() == 'set aside by a restore (damaged)')
  saved = next(s for s in r.saves if s.step == 140)  # run 1's on-demand save: the one run 3 set aside
  assert [tuple(p) for p in ring.get_offsets()] == [(saved.t - r.t0, 140)]
  m = _buckets_hold(r, truth)
  assert m.seconds['idle_between_runs'] >= 60.0 + 10.0
  trained = m.seconds['productive_training'] + m.seconds['wasted_progress']
  assert trained == pytest.approx(140 + 25.5 + 20 - 4 * 0.5 - 0.5, abs=truth.tolerance_s)


def test_a_restart_killed_in_its_restore_is_a_run_of_its_own_by_its_process_mark(tmp_path):
  """A process killed while it restored leaves only `local_restore_failed`; the next process's `start` follows.
  Only the processes' marks tell them apart (a container's pid is the same every time)."""
  r, truth = _load(_history(_run(399, 'sigterm'), _run(50, 'finish', failed=[rh.Failed('killed', 30.0, 40.0)])),
                   tmp_path)
  assert r.restored_steps == [None, None, 399] and r.starts_per_host == {0: 3}
  assert 'run 2 ended before training (killed)' in report.format_text(r)
  _buckets_hold(r, truth)


def test_idle_time_between_runs_is_idle_not_training(tmp_path):
  """A kill, an hour's idle, a restart: the hour is idle between runs; start-up is the restart's 20 s before its
  `start` and each run's 5 s to its first step (the first run's process start-up is before the wall time)."""
  r, truth = _load(_history(_run(399, 'kill'), _run(50, 'finish', idle=3600.0)), tmp_path)
  m = _buckets_hold(r, truth)
  assert m.seconds['idle_between_runs'] == pytest.approx(3600.0, abs=truth.tolerance_s)
  assert m.seconds['start_up'] + m.seconds['training_prep'] == pytest.approx(20.0 + 5.0 + 5.0, abs=0.01)
  assert 'start-up 30.0 s' in report.format_text(r)


_LOAD_LIMITED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # 1 GiB: the old expansion of 1e10 commits needed 80 GB
from pax_autockpt.tools import report
r = report.load(sys.argv[1])
print(report.format_text(r))
print(r.local.saves_committed, r.local.duration_s.n, r.local.duration_s.p50, r.local.interval_s.p50)
"""


@pytest.mark.parametrize('commits', [2e6, 1e10, 1e300])
def test_one_odd_local_event_costs_one_figure_not_memory_or_time(tmp_path, commits):
  """A `local_committed` event claiming 1e10 commits is counted as such, in the time and memory of any event (it
  was expanded into one list entry per commit: 1e10 would need ~80 GB). The report runs in a child limited to
  1 GiB of address space and 60 s, so that the old code fails here instead of taking the machine."""
  log = events_lib.EventLog(tmp_path, 0)
  log.write('start', t=1000.0, num_hosts=1, pid=1, restored_step=None, restored_from=None)
  log.write('local_committed', t=1001.0, step=10, duration_s=0.1, bytes=1, commits=1)
  log.write('local_committed', t=1061.0, step=20, duration_s=0.03, bytes=1, commits=commits, interval_s=0.5)
  log.write('exit', t=1062.0, code=0, step=20)
  done = subprocess.run([sys.executable, '-c', _LOAD_LIMITED, str(tmp_path)], capture_output=True, text=True,
                        timeout=60, check=False, cwd=os.path.dirname(os.path.dirname(__file__)))
  assert done.returncode == 0, done.stderr[-2000:]
  count, n, p50, interval = done.stdout.splitlines()[-1].split()
  assert int(count) == int(n) == 1 + int(commits)
  assert (float(p50), float(interval)) == pytest.approx((0.03, 0.5))
  assert f'local tier: {1 + int(commits)} saves committed' in done.stdout


@hypothesis.given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.integers(1, 6)), min_size=1, max_size=8))
def test_weighted_statistics_are_those_of_the_list_they_stand_for(pairs):
  """Stats.of_weighted, which never builds the list, says what Stats.of says of the list it stands for."""
  flat = [v for v, w in pairs for _ in range(w)]
  got, want = model.Stats.of_weighted(pairs), model.Stats.of(flat)
  assert (got.n, got.max) == (want.n, want.max)
  assert (got.mean, got.p50, got.p90) == pytest.approx((want.mean, want.p50, want.p90), rel=1e-9, abs=1e-6)


_ODD = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.sampled_from([1e300, -1e300, 1e10, 2e6,
                 -1.0, 0.5, float('inf'), float('nan')]), st.text(max_size=5), st.lists(st.integers(), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_TUTORIAL = os.path.join(os.path.dirname(__file__), 'data', 'tutorial_job_dir', 'autockpt', 'events.host0.jsonl')


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(st.data())
def test_one_odd_field_in_any_event_costs_one_figure_never_the_report(tmp_path_factory, data):
  """The tutorial's real log with one field of one event replaced by an odd value (a huge count, a string, a list,
  NaN): the report, its JSON and its plot's figure still come out."""
  from pax_autockpt.tools.report import json_report  # pylint: disable=g-import-not-at-top
  from pax_autockpt.tools.report import timeline  # pylint: disable=g-import-not-at-top
  with open(_TUTORIAL) as f:
    records = [json.loads(line) for line in f]
  rec = data.draw(st.sampled_from(records))
  rec[data.draw(st.sampled_from(sorted(set(rec) - {'t', 'event', 'host'}) or ['step']))] = data.draw(_ODD)
  job = tmp_path_factory.mktemp('job')
  (job / 'autockpt').mkdir()
  (job / 'autockpt' / 'events.host0.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  r = report.load(job)
  assert report.format_text(r, mtbf_hours=1.0).startswith('job: ')
  json.dumps(json_report.as_dict(r, 1.0), allow_nan=False)
  if data.draw(st.integers(0, 9), label="plot") == 0:  # a tenth: the figure takes ~0.4 s
    timeline.figure(r)


@pytest.mark.parametrize('field', ['blocking_s', 'mtbf_hours'])
def test_a_negative_time_reads_as_unknown_not_as_a_math_error(tmp_path, field):
  """Found by the test above: a save's blocking_s of -1 made the Young/Daly optimum's square root fail."""
  log = events_lib.EventLog(tmp_path, 0)
  log.write('start', t=1000.0, num_hosts=1, pid=1, restored_step=None, restored_from=None)
  for i, step in enumerate((100, 200, 300)):
    fields = {'blocking_s': 0.5, 'interval_s': 10.0, 'mtbf_hours': 1.0, field: -1.0}
    log.write('save_started', t=1010.0 + 10 * i, step=step, reason='continuous', **fields)
    log.write('save_committed', t=1011.0 + 10 * i, step=step, duration_s=1.0)
  log.write('exit', t=1040.0, code=0, step=300)
  assert 'goodput @ MTBF 1 h: ' in report.format_text(report.load(tmp_path), mtbf_hours=1.0)
