"""Our measured goodput against Google's (ml-goodput-measurement 0.2.3's GoodputCalculator) on one job's timeline,
and the recording that feeds theirs (pax_autockpt.hook.goodput_recording).

One hand-made but realistic job, two runs (`_job`): it is written once through the hook's own paths, the event log
(pax_autockpt.shared.events.EventLog, whose observer is the recording, as in a training process) and the per-step point
(the recording's step_started, as the checkpointer's save_if_needed calls it), so that `pax-autockpt report` reads
the event log and Google's calculator reads what the recording wrote to an in-memory Cloud Logging log.
docs/report.md, "Against ml-goodput-measurement", explains each bucket that differs.
"""

import datetime
import os
import time

import pytest

from pax_autockpt import settings as settings_lib
from pax_autockpt.hook import goodput_recording
from pax_autockpt.shared import events as events_lib
from pax_autockpt.startup import startup_times
from pax_autockpt.tools import report
from pax_autockpt.tools.report import measured

pytest.importorskip('ml_goodput_measurement')
goodput = goodput_recording.import_goodput()
Badput = goodput.BadputType

T0 = 1_700_000_000.0
JOB = 'crosscheck'
STEP_S = 0.5      # one training step
BLOCKING_S = 0.4  # each save's blocking (the loop waits for the state's copy)
COMMIT_S = 2.0    # each save's start -> commit
TOLERANCE_PP = 0.5  # goodput, percentage points, once both count the same wall (see test_goodput_agrees)


class MemoryLog:
  """The Cloud Logging log that 0.2.3's _CloudLogger writes and reads, in memory: entries in the order written
  (Cloud Logging orders by each entry's write time), each with an insert id; read back after `last_entry_info`."""

  def __init__(self, job_name: str):
    self.job_name = job_name
    self.entries: list[tuple[datetime.datetime, str, dict]] = []

  def write_cloud_logging_entry(self, entry):
    if entry is None or entry['job_name'] != self.job_name:
      return
    self.entries.append((datetime.datetime.now(datetime.timezone.utc), f'{len(self.entries):09d}', dict(entry)))

  def flush(self):
    pass

  def read_cloud_logging_entries(self, start_time=None, end_time=None, last_entry_info=None):
    rows = [e for e in self.entries if end_time is None or e[0] <= end_time]
    if last_entry_info and last_entry_info[1] is not None:
      rows = [e for e in rows if e[1] > last_entry_info[1]]
    elif start_time is not None:
      rows = [e for e in rows if e[0] > start_time]
    return [e[2] for e in rows], ((rows[-1][0], rows[-1][1]) if rows else (None, None))


def _recording(log: MemoryLog, directory: str, marks: dict[str, float]) -> goodput_recording.GoodputRecording:
  """One process's recording, as goodput_recording.start makes it, on the in-memory log."""
  recorder = goodput.GoodputRecorder(JOB, 'goodput_' + JOB, True, log)
  return goodput_recording.GoodputRecording(recorder, log, job_name=JOB, directory=directory,
                                            marks=lambda name: marks.get(name))


class _Run:
  """One process of the job: its event log with the recording as observer, and the training loop's points."""

  def __init__(self, job_dir, log: MemoryLog, *, process_start: float, imports: float, distributed: float,
               setup: float, restore: float, restored: int | None, pid: int):
    self.events = events_lib.EventLog(job_dir, 0)
    jax_setup = process_start + imports
    validated = jax_setup + distributed
    marks = {startup_times.IMPORTED: T0 + process_start + imports - 0.3, startup_times.JAX_SETUP: T0 + jax_setup,
             startup_times.VALIDATED: T0 + validated}
    self.recording = _recording(log, str(job_dir), marks)
    self.events.observer = self.recording.on_event
    self.t = validated + setup + restore  # the `start` event, once the restore is done
    self.events.write('start', t=T0 + self.t, num_hosts=1, pid=pid, restored_step=restored,
                      restored_from=None if restored is None else 'job_dir',
                      **({} if restored is None else {'restore_s': restore}), process_start_t=T0 + process_start,
                      imported_s=imports, distributed_s=distributed)
    self.step = restored or 0

  def loop(self, to_step: int, *, first_step_after: float, compile_s: float, saves=(), kill_after: float = None):
    """Pax's loop from this run's step to `to_step`: each iteration records its step's start, saves where due
    (blocking), then runs the step (the first one compiles); `kill_after` s into the last step: SIGKILL."""
    self.t += first_step_after
    first = True
    while True:
      self.recording.step_started(self.step, now=T0 + self.t)
      if not first and self.step == self._first + 1:
        self.events.write('first_step', t=T0 + self.t, step=self.step, compile_s=compile_s)
      if first:
        self._first, first = self.step, False
      if self.step in saves:
        start = self.t
        self.t += BLOCKING_S
        self.events.write('save_started', t=T0 + start, step=self.step, reason='interval', blocking_s=BLOCKING_S,
                          wait_s=0.0)
        self._commit = (start + COMMIT_S, self.step)
      if self.step == to_step:
        if kill_after is not None:
          self.t += kill_after
        return
      self.t += STEP_S + (compile_s if self.step == self._first else 0.0)
      self._committed_due()
      self.step += 1

  def _committed_due(self):
    commit = getattr(self, '_commit', None)
    if commit is not None and commit[0] <= self.t:
      self.events.write('save_committed', t=T0 + commit[0], step=commit[1], duration_s=COMMIT_S)
      self._commit = None

  def exit(self, code: int):
    """The loop ended: wait for the save in flight to commit, then the `exit` event."""
    commit = getattr(self, '_commit', None)
    if commit is not None:
      self.t = max(self.t, commit[0])
      self._committed_due()
    self.t += 0.1
    self.events.write('exit', t=T0 + self.t, code=code, step=self.step)


def _job(tmp_path):
  """Run 1: process start 0 s, imports 6.5 s, distributed init 0.5 s, set-up 2 s, fresh; step 0 at 9.2 s (3 s
  compile), saves of 100 and 200 (committed), SIGKILL 0.3 s into step 260. Run 2: 20 s later, imports 5.4 s,
  distributed 0.5 s, set-up 1.1 s, restore of 200 in 3 s; step 200 0.2 s after its start (2 s compile), a save
  of 300, the loop's last iteration at 400 saves it (Pax's interval), its commit, exit 0."""
  job_dir = tmp_path / 'job'
  log = MemoryLog(JOB)
  one = _Run(job_dir, log, process_start=0.0, imports=6.5, distributed=0.5, setup=2.0, restore=0.0, restored=None,
             pid=1)
  one.loop(260, first_step_after=0.2, compile_s=3.0, saves=(100, 200), kill_after=0.3)
  killed = one.t
  two = _Run(job_dir, log, process_start=killed + 20.0, imports=5.4, distributed=0.5, setup=1.1, restore=3.0,
             restored=200, pid=2)
  two.loop(400, first_step_after=0.2, compile_s=2.0, saves=(300, 400))
  two.exit(0)
  checkpoints = job_dir / 'checkpoints'
  checkpoints.mkdir()
  for step in (100, 200, 300, 400):
    (checkpoints / f'checkpoint_{step:08d}').mkdir()
  return job_dir, log, dict(run1_start=one, run2=two, killed=killed)


def _theirs(log: MemoryLog, tmp_path):
  """Google's figures in seconds: goodput, the job's wall time, and each bucket (0.2.3 answers percentages)."""
  calculator = goodput.GoodputCalculator(JOB, 'goodput_' + JOB, cloud_logger=log, cache_dir=str(tmp_path / 'cache'))
  percent, breakdown, last_step = calculator.get_job_goodput(include_badput_breakdown=True)
  wall = calculator._get_total_job_time(datetime.datetime.now(datetime.timezone.utc))  # pylint: disable=protected-access
  seconds = {k: v * wall / 100 for k, v in breakdown.items() if not isinstance(v, dict)}
  return percent, wall, seconds, last_step


def test_goodput_agrees_and_each_bucket_that_differs_differs_as_docs_report_md_says(tmp_path):
  job_dir, log, runs = _job(tmp_path)
  ours = measured.measure(report.load(str(job_dir)))
  percent, wall, theirs, last_step = _theirs(log, tmp_path)
  one, two, killed = runs['run1_start'], runs['run2'], runs['killed']
  assert last_step == 400
  # The wall: theirs from the first process's start, ours from the first run's `start` event (after its start-up).
  first_start_up = 9.0  # run 1: imports, distributed init, set-up; fresh, nothing restored
  assert wall == pytest.approx(ours.wall_s + first_start_up, abs=0.01)
  # Goodput on the same wall agrees within TOLERANCE_PP; unrebased, ours is higher by run 1's start-up's share.
  assert percent == pytest.approx(100 * ours.seconds['productive_training'] / wall, abs=TOLERANCE_PP)
  assert 100 * ours.goodput - percent == pytest.approx(
      100 * ours.seconds['productive_training'] * first_start_up / (wall * ours.wall_s), abs=TOLERANCE_PP)
  # Productive training: theirs also counts the job's last iteration -> its end (the last save's commit and the
  # exit: ours `other`, with that save's blocking in checkpoint_save), and takes every save's blocking off it,
  # including that of the save whose step was then lost (ours takes it off wasted progress); the first steps'
  # extra time is measured against a mean step that includes the saves' blocking (a few ms).
  tail = ours.seconds['other']
  assert tail == pytest.approx(2.1 - BLOCKING_S, abs=1e-6)
  assert theirs_productive(percent, wall) == pytest.approx(ours.seconds['productive_training'] + tail - BLOCKING_S,
                                                           abs=0.01)
  # Saves and restores: the same seconds, from the same events.
  assert theirs[Badput.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME] == pytest.approx(ours.seconds['checkpoint_save'], abs=1e-6)
  assert theirs[Badput.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME] == pytest.approx(ours.seconds['checkpoint_restore'],
                                                                              abs=1e-6)
  # The SIGKILL: theirs sees every step start, so its wasted progress is exact (steps 200 -> 260, with the save of
  # 200's blocking) and its recovery starts at the last step's start; our log ends at the save of 200's commit, so
  # ours counts the steps after it as idle between runs (wasted progress is a lower bound). Together the same time.
  assert theirs[Badput.WASTED_PROGRESS_FROM_DISRUPTION] == pytest.approx(60 * STEP_S + BLOCKING_S, abs=0.01)
  assert theirs[Badput.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION] == pytest.approx(0.3 + 20.0, abs=0.01)
  assert ours.seconds['wasted_progress'] < theirs[Badput.WASTED_PROGRESS_FROM_DISRUPTION]
  assert ours.seconds['wasted_progress'] + ours.seconds['idle_between_runs'] + BLOCKING_S == pytest.approx(
      theirs[Badput.WASTED_PROGRESS_FROM_DISRUPTION] + theirs[Badput.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION],
      abs=0.01)
  # Start-up: ours start-up (run 2's, before its `start`) and start-up to the first step (both runs'), plus run 1's
  # start-up before our wall; theirs TPU initialization, training preparation and program startup.
  start_up = [Badput.TPU_INITIALIZATION, Badput.TRAINING_PREP, Badput.PROGRAM_STARTUP]
  assert theirs[Badput.TPU_INITIALIZATION] == pytest.approx(0.5 + 0.5, abs=1e-6)  # distributed_s of both runs
  assert sum(theirs[k] for k in start_up) == pytest.approx(
      ours.seconds['start_up'] + ours.seconds['training_prep'] + first_start_up, abs=0.02)
  assert theirs[Badput.OTHER] == pytest.approx(0.0, abs=0.01)
  del one, two, killed


def theirs_productive(percent: float, wall: float) -> float:
  return percent * wall / 100


def test_each_step_start_costs_microseconds(tmp_path):
  """The one per-step call (the checkpointer's save_if_needed -> step_started), into an in-memory log: the
  recorder's own cost (its dict and datetime), what a training step pays on top of the real log's queue put."""
  log = MemoryLog(JOB)
  recording = _recording(log, str(tmp_path), {})
  n, rounds = 2_000, 5
  per_call = []
  for r in range(rounds):
    began = time.perf_counter()
    for step in range(r * n, (r + 1) * n):
      recording.step_started(step)
    per_call.append((time.perf_counter() - began) / n)
  assert len(log.entries) == n * rounds and recording.on
  print(f'step_started: {min(per_call) * 1e6:.1f} us per call (best of {rounds} x {n})')
  assert min(per_call) < 100e-6  # ~5 us on an idle CI core; the bound leaves room for a busy machine


def test_a_writer_that_falls_behind_turns_recording_off(tmp_path, monkeypatch):
  """No network: the library's writer retries its token for minutes before it reports anything, holding every
  entry; past MAX_BACKLOG unsent entries recording stops (one line), checked every BACKLOG_EVERY steps."""
  warnings = []
  monkeypatch.setattr(goodput_recording.logging, 'warning', lambda *a: warnings.append(a[0] % a[1:]))
  log = MemoryLog(JOB)
  recording = _recording(log, str(tmp_path), {})
  recording.backlog = lambda: len(log.entries)
  stopped = []
  recording.stop_writer = lambda: stopped.append(True)
  for step in range(goodput_recording.MAX_BACKLOG + 2 * goodput_recording.BACKLOG_EVERY):
    recording.step_started(step)
  assert not recording.on and stopped == [True]
  assert len(log.entries) == 40 * goodput_recording.BACKLOG_EVERY  # the first check past 10,000: 10,240
  assert warnings == ["[autockpt] recording for Google's goodput tools is off from here on (training goes on): "
                      'Cloud Logging: 10240 entries not sent (unreachable, or too slow for this step rate)']


def test_several_steps_per_program_fill_the_steps_between(tmp_path):
  log = MemoryLog(JOB)
  recording = _recording(log, str(tmp_path), {})
  recording.step_started(10, now=T0)
  recording.step_started(14, now=T0 + 2.0)
  assert [e['step_count'] for _, _, e in log.entries] == [10, 11, 12, 13, 14]
  assert [e['step_start_time'] - T0 for _, _, e in log.entries] == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0])


def test_an_exit_other_than_0_records_no_job_end(tmp_path):
  """A preempted run's exit (143) is a disruption: the next run's repeated step says so; a job end would stop the
  calculator's clock for the runs after it."""
  log = MemoryLog(JOB)
  recording = _recording(log, str(tmp_path), {})
  recording.on_event({'t': T0, 'event': 'exit', 'code': 143, 'step': 5})
  recording.on_event({'t': T0 + 1, 'event': 'exit', 'code': 0, 'step': 9})
  assert [e for _, _, e in log.entries] == [{'job_name': JOB, 'job_end_time': T0 + 1}]


class _Unreachable(MemoryLog):
  def write_cloud_logging_entry(self, entry):
    raise ConnectionError('Cloud Logging unreachable')


def test_a_failing_recorder_is_one_warning_line_and_recording_turns_itself_off(tmp_path, monkeypatch):
  warnings = []
  monkeypatch.setattr(goodput_recording.logging, 'warning', lambda *a: warnings.append(a[0] % a[1:]))
  recording = _recording(_Unreachable(JOB), str(tmp_path), {})
  for step in range(5):
    recording.step_started(step)
  recording.on_event({'t': T0, 'event': 'save_started', 'step': 4, 'blocking_s': 0.1})
  assert not recording.on
  assert warnings == ["[autockpt] recording for Google's goodput tools is off from here on (training goes on): "
                      'ConnectionError: Cloud Logging unreachable']


def test_the_library_s_background_writer_failing_is_caught_the_same_way(tmp_path, monkeypatch):
  """With credentials but no way to Cloud Logging, the upload fails in the library's writer thread, which logs it
  with a traceback (every batch): the first turns recording off with one line; none reaches the log."""
  import logging as std_logging  # pylint: disable=g-import-not-at-top
  warnings = []
  monkeypatch.setattr(goodput_recording.logging, 'warning', lambda *a: warnings.append(a[0] % a[1:]))
  recording = _recording(MemoryLog(JOB), str(tmp_path), {})
  failures = goodput_recording._WriterFailures(recording)  # pylint: disable=protected-access
  try:
    raise ConnectionError('failed to connect to all addresses')
  except ConnectionError:
    import sys  # pylint: disable=g-import-not-at-top
    exc_info = sys.exc_info()
  record = std_logging.LogRecord(goodput_recording._WRITER_LOG, std_logging.ERROR, __file__, 1,  # pylint: disable=protected-access
                                 'Failed to submit %d logs.', (3,), exc_info)
  record.threadName = goodput_recording._WRITER_THREAD  # pylint: disable=protected-access
  assert failures.filter(record) is False and failures.filter(record) is False
  assert not recording.on
  assert warnings == ["[autockpt] recording for Google's goodput tools is off from here on (training goes on): "
                      'Cloud Logging: ConnectionError: failed to connect to all addresses']


def test_without_credentials_recording_is_off_with_one_line(monkeypatch):
  monkeypatch.setenv('GOOGLE_APPLICATION_CREDENTIALS', '/nonexistent/key.json')
  warnings = []
  monkeypatch.setattr(goodput_recording.logging, 'warning', lambda *a: warnings.append(a[0] % a[1:]))
  settings = settings_lib.Settings(goodput_run_name='x')
  assert goodput_recording.start(settings, 0, '/tmp/job') is None
  assert len(warnings) == 1 and '\n' not in warnings[0]
  assert warnings[0].startswith("[autockpt] recording for Google's goodput tools is off (training goes on): ")
  assert goodput_recording.start(settings, 1, '/tmp/job') is None  # host 1 records nothing, says nothing
  assert goodput_recording.start(settings_lib.Settings(), 0, '/tmp/job') is None
  assert len(warnings) == 1


def test_the_setting_without_the_package_is_one_line_naming_the_setting_and_the_fix(monkeypatch):
  import importlib.util  # pylint: disable=g-import-not-at-top
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec',
                      lambda name, *a: None if name == 'ml_goodput_measurement' else real(name, *a))
  from pax_autockpt.startup import precheck  # pylint: disable=g-import-not-at-top
  with pytest.raises(settings_lib.ConfigError) as e:
    precheck.run(['main', '--exp=experiments.lm_cloud_autockpt.LmCloudSpmdTinyAutockpt',
                  f'--job_log_dir={os.devnull}-not-used', '--autockpt_goodput_run_name=myjob'])
  assert str(e.value) == ("--autockpt_goodput_run_name='myjob' is invalid: recording needs ml-goodput-measurement, "
                          "which is not installed: pip install 'pax-autockpt[goodput]'")
  assert settings_lib.fix_for('goodput_run_name', '', 'X.AUTOCKPT_GOODPUT_RUN_NAME') is None  # off: not needed


def test_the_logger_name_alone_is_a_config_error():
  class Exp:
    AUTOCKPT_GOODPUT_LOGGER_NAME = 'mylog'
  with pytest.raises(settings_lib.ConfigError, match='only applies to recording'):
    settings_lib.resolve(Exp())
  assert goodput_recording.logger_name(settings_lib.Settings(goodput_run_name='r')) == 'goodput_r'
  assert goodput_recording.logger_name(settings_lib.Settings(goodput_run_name='r', goodput_logger_name='l')) == 'l'
