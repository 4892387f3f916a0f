"""Measured goodput and badput (`pax_autockpt.tools.report.goodput`) on hand-made event logs whose times are known."""

import dataclasses
import io
import json

import pytest

from pax_autockpt.tools import report
from pax_autockpt.tools.report import json_report
from pax_autockpt.tools.report import measured
from tests import test_report

Job = test_report.Job


def _process(started, imported, distributed):
  """A `start` event's start-up fields: the process started at `started` s, imports and distributed init took."""
  return dict(process_start_t=test_report.T0 + started, imported_s=imported, distributed_s=distributed)


def three_runs(tmp_path, phases=False, progress=False):
  """0.1 s a step, 0.5 s blocking per interval save. Run 1: 2 s to its first step, saves 100 and 200, SIGTERM at
  250 (on-demand save, 0.2 s blocking), exit 143 at 29 s. Run 2 starts at 40 s from 250 (restored in 4 s): 3 s to
  its first step, saves 300 (committed) and 400 (started at 58.5 s, never committed: SIGKILL). Run 3 starts at 70 s
  from 300 (restored in 6 s): 2.5 s to its first step, saves 400 and the final 500, exit 0 at 94.5 s.

  With `phases`, each restart's process start and its start-up, and its first step's end (one 0.1 s step after its
  start-up): run 2's process started at 30 s, imports 5 s, distributed init 0.5 s, first step done at 43.1 s
  (compile 2.5 s); run 3's at 60 s, imports 2.5 s, distributed init 0.5 s, first step done at 72.6 s (compile 2 s).
  With `progress`, run 2 writes a `progress` event at step 450, 64 s, before its SIGKILL.
  """
  job = Job(tmp_path)
  job.start(0, 0.0)
  job.save(0, 12.0, 100)
  job.save(0, 22.5, 200)
  job.ev(0, 28.0, 'preemption', step=250, signal='SIGTERM')
  job.save(0, 28.0, 250, reason='preemption', blocking=0.2, duration=0.6)
  job.ev(0, 29.0, 'exit', code=143, step=250)
  job.ev(0, 40.0, 'start', num_hosts=1, pid=2, restored_step=250, restored_from='job_dir', restore_s=4.0,
         **(_process(30.0, 5.0, 0.5) if phases else {}))
  if phases:
    job.ev(0, 43.1, 'first_step', step=251, compile_s=2.5)
  job.save(0, 48.0, 300)
  job.save(0, 58.5, 400, commit=False)  # then kill -9: no commit, no exit event
  if progress:
    job.ev(0, 64.0, 'progress', step=450)
  job.ev(0, 70.0, 'start', num_hosts=1, pid=3, restored_step=300, restored_from='job_dir', restore_s=6.0,
         **(_process(60.0, 2.5, 0.5) if phases else {}))
  if phases:
    job.ev(0, 72.6, 'first_step', step=301, compile_s=2.0)
  job.save(0, 82.5, 400)
  job.save(0, 93.0, 500, reason='final')
  job.ev(0, 94.5, 'exit', code=0, step=500)
  return job.write(checkpoints=(400, 500))


def test_three_runs_preempted_killed_finished_split_into_buckets(tmp_path):
  r = report.load(three_runs(tmp_path))
  m = measured.measure(r)
  assert m.step_time_s == pytest.approx(0.1)
  assert m.wall_s == pytest.approx(94.5)
  expected = {
      'productive_training': 25.0 + 5.0 + 20.0,  # 0->250, 250->300, 300->500 at 0.1 s a step
      'wasted_progress': 10.0,                   # run 2's 300->400, which run 3 did not restore
      'training_prep': 2.0 + 3.0 + 2.5,
      'checkpoint_save': 1.2 + 1.0 + 1.0,        # blocking of run 1 (0.5, 0.5, 0.2), run 2, run 3
      'checkpoint_restore': 4.0 + 6.0,
      'idle_between_runs': 0.0, 'start_up': 0.0,  # no `start` records its process's start: in between_runs
      'between_runs': 11.0 + 11.0 - 10.0,        # 29 -> 40; run 2's end (58.5 + its save's 0.5 s) -> 70; less restores
      'other': 0.8 + 1.0,                        # run 1 and run 3's exit after their last save's blocking
  }
  assert list(m.seconds) == list(measured.BUCKETS)
  assert m.seconds == pytest.approx(expected)
  assert sum(m.seconds.values()) == pytest.approx(m.wall_s)
  assert m.goodput == pytest.approx(50.0 / 94.5)
  assert (m.killed_runs, m.last_run_open, m.restore_unrecorded, m.note) == (1, False, 0, None)
  line = next(x for x in report.format_text(r).splitlines() if x.startswith('goodput (measured)'))
  assert line == ('goodput (measured): 52.9% of 1.6 min wall, productive training 50.0 s; badput: wasted progress '
                  '10.0 s (10.6%), start-up 7.5 s (7.9%), save blocking 3.2 s (3.4%), restore 10.0 s (10.6%), between '
                  'runs (no process start recorded) 12.0 s (12.7%), other 1.8 s (1.9%); 1 killed run(s) end at their '
                  'last event here: wasted progress is a lower bound, the time between runs an upper bound')



def test_a_progress_event_moves_a_killed_runs_end_from_between_runs_to_wasted_progress(tmp_path):
  """pax_autockpt.hook.progress's event after the last save: run 2 trained 300 -> 450 before its SIGKILL, and the
  5 s after its last save count as wasted progress, not as time between runs."""
  m = measured.measure(report.load(three_runs(tmp_path, progress=True)))
  assert m.seconds['wasted_progress'] == pytest.approx(15.0)  # 300 -> 450 at 0.1 s a step, less 2 x 0.5 s blocking
  assert m.seconds['between_runs'] == pytest.approx(11.0 + 6.0 - 10.0)  # run 2 ends at 64 s, not 59 s
  assert sum(m.seconds.values()) == pytest.approx(m.wall_s) == pytest.approx(94.5)


def test_restart_phases_add_up_to_each_restart_s_downtime_up_to_its_first_step(tmp_path):
  """Run 2: run 1's exit 29 s -> process start 30 s -> (imports 5, distributed init 0.5, set-up 0.5, restore 4)
  -> start 40 s -> first step 43.1 s. Run 3: run 2's last event 58.5 s -> 60 s -> (2.5, 0.5, 1, 6) -> 70 s -> 72.6 s."""
  r = report.load(three_runs(tmp_path, phases=True))
  got = [dataclasses.asdict(x.phases) for x in r.restart_details]
  assert got == [
      pytest.approx({'scheduler_s': 1.0, 'imports_s': 5.0, 'distributed_s': 0.5, 'setup_s': 0.5, 'restore_s': 4.0,
                     'first_step_s': 3.1, 'compile_s': 2.5, 'total_s': 14.1}),
      pytest.approx({'scheduler_s': 1.5, 'imports_s': 2.5, 'distributed_s': 0.5, 'setup_s': 1.0, 'restore_s': 6.0,
                     'first_step_s': 2.6, 'compile_s': 2.0, 'total_s': 14.1})]
  for x in r.restart_details:
    assert sum(v for k, v in dataclasses.asdict(x.phases).items() if k not in ('compile_s', 'total_s')) == \
        pytest.approx(x.phases.total_s)
    assert x.phases.total_s - x.phases.first_step_s == pytest.approx(x.downtime_s)  # the rest: up to `start`
  assert r.restart_phases == pytest.approx({'restarts': 2, 'scheduler_s': 1.25, 'imports_s': 3.75, 'distributed_s': 0.5,
                                            'setup_s': 0.75, 'restore_s': 5.0, 'first_step_s': 2.85, 'compile_s': 2.25,
                                            'total_s': 14.1})
  lines = report.format_text(r).splitlines()
  assert ('restart phases (median of 2 restarts): scheduler 1.2 s, imports 3.8 s, distributed init 0.5 s, set-up '
          '0.75 s, restore 5.0 s, to the first step 2.8 s (compile 2.2 s); 14.1 s in all, from the previous run\'s '
          'last event') in lines
  got = json.loads(json.dumps(json_report.as_dict(r)))
  assert got['restart_details'][1]['phases']['scheduler_s'] == pytest.approx(1.5)
  assert got['restart_phases']['total_s'] == pytest.approx(14.1)


def test_between_runs_splits_into_idle_and_start_up_where_the_process_start_is_known(tmp_path):
  """three_runs' 12 s between runs (less the restores): 29 -> 30 s idle, 30 -> 40 s start-up less the 4 s restore;
  run 2's end (59 s: its last save's blocking) -> 60 s idle, 60 -> 70 s less 6 s; the rest as without."""
  r = report.load(three_runs(tmp_path, phases=True))
  m = measured.measure(r)
  without = measured.measure(report.load(three_runs(tmp_path / 'without')))
  assert m.seconds == pytest.approx({**without.seconds, 'idle_between_runs': 1.0 + 1.0, 'start_up': 6.0 + 4.0,
                                     'between_runs': 0.0})
  assert sum(m.seconds.values()) == pytest.approx(m.wall_s) and m.process_start_known == 2
  line = next(x for x in report.format_text(r).splitlines() if x.startswith('goodput (measured)'))
  assert ('start-up 17.5 s (18.5%), save blocking 3.2 s (3.4%), restore 10.0 s (10.6%), idle between runs 2.0 s '
          '(2.1%), other 1.8 s (1.9%); ') in line  # start-up: 7.5 s after the `start` events, 10 s before them


def test_a_log_without_process_starts_says_the_restart_phases_are_not_known(tmp_path):
  r = report.load(three_runs(tmp_path))
  assert all(x.phases is None for x in r.restart_details) and r.restart_phases is None
  assert ("restart phases: n/a (no restart's start event records its process's start: off Linux, or a log before "
          'process_start_t)') in report.format_text(r).splitlines()


def test_the_json_holds_the_same_figures(tmp_path):
  d = three_runs(tmp_path)
  out = io.StringIO()
  assert report.run(d, as_json=True, out=out) == 0
  got = json.loads(out.getvalue())['goodput_measured']
  assert got['wall_s'] == pytest.approx(94.5)
  assert got['seconds']['wasted_progress'] == pytest.approx(10.0)
  assert got['shares']['productive_training'] == pytest.approx(50.0 / 94.5)


def test_one_uninterrupted_run_wastes_nothing(tmp_path):
  """test_report's single run: saves 100..500 at 10, 20, 30, 40, 52 s, the final 600 at 72 s, exit at 74 s; the
  step time is the median (10 - 0.5) / 100 s."""
  m = measured.measure(report.load(test_report.single_run(tmp_path)))
  assert m.step_time_s == pytest.approx(0.095)
  assert m.seconds == pytest.approx({
      'productive_training': 72.0 - 0.5 - 5 * 0.5, 'wasted_progress': 0.0, 'training_prep': 10.0 - 100 * 0.095,
      'checkpoint_save': 6 * 0.5, 'checkpoint_restore': 0.0, 'idle_between_runs': 0.0, 'start_up': 0.0,
      'between_runs': 0.0, 'other': 74.0 - 72.0 - 0.5})
  assert m.goodput == pytest.approx(69.0 / 74.0)
  assert (m.killed_runs, m.last_run_open) == (0, False)


def test_a_job_that_just_started_says_not_enough_yet(tmp_path):
  job = Job(tmp_path)
  job.start(0, 0.0)
  r = report.load(job.write())
  m = measured.measure(r)
  assert (m.wall_s, m.goodput, m.seconds) == (None, None, {})
  assert ("goodput (measured): not enough events yet: it needs a run's start and a later event"
          in report.format_text(r).splitlines())
  assert json.loads(json.dumps(json_report.as_dict(r)))['goodput_measured']['wall_s'] is None


def test_a_running_job_without_a_step_time_says_at_least_and_why(tmp_path):
  """One run still going (no exit event), one save: no step time, so start-up is not split off the training."""
  job = Job(tmp_path)
  job.start(0, 0.0)
  job.save(0, 10.0, 100, commit=False)
  m = measured.measure(report.load(job.write()))
  assert m.seconds == pytest.approx({'productive_training': 10.0, 'wasted_progress': 0.0, 'training_prep': 0.0,
                                     'checkpoint_save': 0.5, 'checkpoint_restore': 0.0, 'idle_between_runs': 0.0,
                                     'start_up': 0.0, 'between_runs': 0.0, 'other': 0.0})
  assert m.last_run_open and m.killed_runs == 1
  line = report.format_text(report.load(str(tmp_path)))
  assert 'goodput (measured): 95.2% of at least 10.5 s wall' in line
  assert 'no step time measured' in line


def test_a_restore_of_an_older_step_loses_every_later_run_s_steps_above_it(tmp_path):
  """Run 2 restored 300 and trained to 400; run 3 restored 200 (say the newer checkpoints were damaged): run 1's
  200->300 and run 2's 300->400 are both lost."""
  job = Job(tmp_path)
  job.start(0, 0.0)
  job.save(0, 10.0, 100)
  job.save(0, 20.5, 200)
  job.save(0, 31.0, 300)
  job.ev(0, 32.0, 'exit', code=143, step=300)
  job.start(0, 40.0, restored=300)
  job.save(0, 50.0, 400)
  job.ev(0, 51.0, 'exit', code=143, step=400)
  job.start(0, 60.0, restored=200)
  job.save(0, 70.0, 300, reason='final')
  job.ev(0, 71.0, 'exit', code=0, step=300)
  m = measured.measure(report.load(job.write()))
  assert m.step_time_s == pytest.approx(0.1)
  assert m.seconds['wasted_progress'] == pytest.approx(10.0 + 10.0)
  assert m.seconds['productive_training'] == pytest.approx(20.0 + 0.0 + 10.0)
  assert sum(m.seconds.values()) == pytest.approx(71.0)


def test_a_log_without_restore_s_leaves_the_restore_between_runs_and_says_so(tmp_path):
  """test_report's preempted run: exit at 123.9 s, the restart's `start` (no restore_s: an older log) at 140 s."""
  r = report.load(test_report.preempted_then_restarted(tmp_path))
  m = measured.measure(r)
  assert (m.seconds['checkpoint_restore'], m.seconds['between_runs']) == (0.0, pytest.approx(16.1))
  assert m.restore_unrecorded == 1
  assert '1 restore(s) not recorded (a log before restore_s): in between runs' in report.format_text(r)


@pytest.mark.usefixtures('clean_signals')
def test_the_checkpointer_times_a_restore_for_the_start_event_and_not_a_fresh_start(tmp_path):
  """The writer's side of `restore_s` (the executor writes it into `start`): set by a restore, None without one."""
  from pax_autockpt import layout  # pylint: disable=g-import-not-at-top
  from tests import fakes  # pylint: disable=g-import-not-at-top  (JAX: only this test needs it)
  fresh, _ = fakes.wrap(tmp_path / 'fresh')
  fresh.get_model_states(None, None, None)
  assert fresh.restore_s is None
  job = tmp_path / 'job'
  fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), 10))
  ckpt, _ = fakes.wrap(job)
  assert ckpt.get_model_states(None, None, None)[2] == 10
  assert ckpt.restored_from == 'job_dir' and ckpt.restore_s is not None and ckpt.restore_s >= 0
