"""The failure-trace bench scenario's pure helpers (rigs.bench.trace): no training process here."""

import statistics

from pax_autockpt.tools.report import measured
from rigs.bench import trace
from rigs.bench.trace import Failure
from rigs.bench.trace import Segment


def test_failure_trace_is_the_seeds_and_the_same_every_time():
  assert trace.failure_trace(0) == [Failure(337.769, 'crash')]
  assert trace.failure_trace(1) == trace.failure_trace(1) == [Failure(53.746, 'preemption')]
  assert len(trace.failure_trace(0, window_s=1200.0)) == 3  # the window's expected count, never 0 by chance
  assert len(trace.failure_trace(0, window_s=100.0)) == 1


def test_failure_trace_gaps_are_those_of_a_poisson_process_and_every_kind_comes():
  long = trace.failure_trace(7, window_s=200_000.0, mtbf_s=35.0)
  gaps = [b.t - a.t for a, b in zip(long, long[1:])]
  assert 34.0 < statistics.mean(gaps) < 36.0 and 0.9 < statistics.stdev(gaps) / statistics.mean(gaps) < 1.1
  assert all(0 < f.t < 200_000.0 for f in long) and all(g >= 0 for g in gaps)
  shares = [sum(f.kind == k for f in long) / len(long) for k in trace.KINDS]
  assert all(0.3 < s < 0.37 for s in shares)


def test_a_failure_waits_for_the_runs_first_step_and_the_guard():
  assert trace.due(65.1, first_step_t=20.0) == 65.1
  assert trace.due(5.05, first_step_t=20.0) == 25.0
  assert trace.due(66.6, first_step_t=63.0, guard_s=5.0) == 68.0


_RESTARTED = """I1126 [PAX STATUS]: Step `906` completed.
I1126 [PAX STATUS]: Step `907` completed.
I1126 programs.py:512] steps/sec: 40.1
I1126 programs.py:512] steps/sec: 41.0
I1126 programs.py:512] steps/sec: 41.2
"""


def test_last_and_restored_step_of_a_restarted_run_that_was_killed():
  assert trace.restored_step(_RESTARTED) == 906
  assert trace.last_step(_RESTARTED) == 930  # 908 trained exactly, then 910, 920, 930
  summary = _RESTARTED + 'I1126 summary_utils.py:612] Metrics values at step 1000:\nsteps/sec: 44.0\nsteps/sec: 44\n'
  assert trace.last_step(summary) == 1020
  preempted = summary + 'checkpoint_manager.py:893] Saving checkpoint at step 1026 due to preemption.\n'
  assert trace.last_step(preempted) == 1026
  assert trace.last_step('I1126 [PAX STATUS]: Step `0` completed.\n') == 1
  assert trace.last_step('still importing') is None and trace.restored_step('still importing') is None


def test_lost_steps_and_restart_time_over_a_job_of_three_runs():
  runs = [Segment(started=0.0, restored=0, first_step=20.0, ended=60.0, last_step=1800),   # crash: 1000 restored
          Segment(started=60.0, restored=1000, first_step=78.0, ended=90.0, last_step=1420),  # preemption: saved
          Segment(started=90.0, restored=1420, first_step=None, ended=120.0, last_step=1420)]  # still starting at W
  assert trace.lost_steps(runs, final_step=1420) == 800
  assert trace.lost_steps(runs, final_step=1000) == 800 + 420  # the last run's own steps not kept either
  assert trace.restart_secs(runs) == (78.0 - 60.0) + (120.0 - 90.0)
  assert trace.lost_steps(runs[:1], final_step=1800) == 0 and trace.restart_secs(runs[:1]) == 0


def test_badput_adds_the_restart_buckets_of_the_measured_split():
  seconds = dict(productive_training=60.0, wasted_progress=12.0, training_prep=3.0, checkpoint_save=0.5,
                 checkpoint_restore=1.5, idle_between_runs=0.25, start_up=20.0, between_runs=0.0, other=2.75)
  got = measured.Measured(100.0, seconds, {}, 0.6, 2, False, 0.02)
  assert trace.badput(got) == dict(restarts=24.75, lost=12.0, save=0.5, goodput=0.6)
  assert trace.badput(None) is None and trace.badput(measured.Measured(None, {}, {}, None, 0, False, None)) is None


class _FakeJob:
  """replay()'s view of a job on a fake clock: each run's first step comes 20 s after its start."""

  def __init__(self, clock):
    self.clock, self.starts, self.firsts, self.strikes = clock, [], [], []

  def now(self):
    return self.clock[0]

  def start(self):
    self.starts.append(self.clock[0])

  def first_step(self, window_s):
    self.clock[0] = max(self.clock[0], self.starts[-1] + 20.0)
    self.firsts.append(self.clock[0])
    return self.clock[0]

  def strike(self, kind):
    self.strikes.append((self.clock[0], kind))


def test_replay_waits_for_the_last_restarts_first_step(monkeypatch):
  """The restart after the window's last failure is measured to its first step, not to the window's end."""
  clock = [0.0]
  monkeypatch.setattr(trace.time, 'sleep', lambda s: clock.__setitem__(0, clock[0] + s))
  job = _FakeJob(clock)
  struck = trace.replay(job, [Failure(100.0, 'crash')], window_s=400.0)
  assert struck == [(100.0, 'crash')] and job.starts == [0.0, 100.0]
  assert job.firsts == [20.0, 120.0] and job.strikes == [(100.0, 'crash'), (400.0, 'end')]
