"""Recording for Google's goodput tools (`--autockpt_goodput_run_name`): ml-goodput-measurement 0.2.3's
GoodputRecorder, fed from the hook's lifecycle points on host 0 only (as MaxText records), writes to Cloud
Logging, where Google's GoodputCalculator and GoodputMonitor read the job (docs/report.md, "Recording for Google's
goodput tools"). Every run of the job records under the same job name.

What each point records:

- the `start` event (once the restore is done): the job's start at this process's start (`process_start_t`); TPU
  initialization: paxml's setup_jax (jax.distributed's initialisation, startup_times' marks); training
  preparation: the rest of the start-up before the restore (imports, the experiment, the model, the checkpoint
  listing); and the restore as an orbax-style `restore` entry (`checkpoint_manager_duration_secs`: `restore_s`),
  which the calculator counts as checkpoint restore;
- each iteration of Pax's loop (`save_if_needed`, before its step runs): the step's start (a program that runs
  several steps at once has the steps between filled in evenly: the calculator counts only consecutive steps); the
  first one also records the loop's own set-up since the `start` event as training preparation;
- each `save_started`: an orbax-style `save` entry whose blocking is the event's `blocking_s` (0.2.3's
  `record_checkpoint_progress` records nothing, and its calculator counts save badput from these entries, which
  orbax 0.5.9 does not write);
- the `exit` event with code 0 (the job trained to its end): the job's end. Another exit is a disruption: the next
  run's repeated step start tells the calculator so, and a job end there would stop the job's clock.

Recording never stops training: the first exception from the recorder (no credentials, no project, Cloud Logging
unreachable: the library's background writer reports that one) is one warning line, and recording turns itself off.
"""

import atexit
import datetime
import importlib
import logging as std_logging
import queue
import threading
import time
from typing import Any, Callable
import warnings

from absl import logging

from pax_autockpt import settings as settings_lib
from pax_autockpt.shared import failures
from pax_autockpt.startup import startup_times

# The library's background writer logs a failed upload here (with a traceback), every batch: caught, one line.
_WRITER_LOG = 'google.cloud.logging_v2.handlers.transports.background_thread'
_WRITER_THREAD = 'google.cloud.logging.Worker'
# How long the library's atexit handler waits for entries still queued (its default 5 s): the exit after a
# signal has a grace period to keep (pax_autockpt.exit.exit_path's watchdog ends the process before it regardless).
GRACE_SECS = 2.0
# Entries the library's writer has not sent yet, past which Cloud Logging counts as unreachable (a writer that cannot
# get a token retries for minutes before it reports anything, and holds every entry meanwhile): checked every
# BACKLOG_EVERY steps.
MAX_BACKLOG = 10_000
BACKLOG_EVERY = 256


def logger_name(settings: settings_lib.Settings) -> str:
  """The Cloud Logging log: the setting, else `goodput_<run name>` (MaxText's name)."""
  return settings.goodput_logger_name or f'goodput_{settings.goodput_run_name}'


def import_goodput() -> Any:
  """ml_goodput_measurement's `goodput` module. google.api_core warns about Python 3.10 at import (a FutureWarning
  of several lines on every host): not shown."""
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', FutureWarning)
    return importlib.import_module('ml_goodput_measurement.src.goodput')


def _utc(t: float) -> datetime.datetime:
  return datetime.datetime.fromtimestamp(t, datetime.timezone.utc)


class GoodputRecording:
  """Turns the hook's lifecycle points into GoodputRecorder calls (see the module docstring). `entries` is the
  recorder's Cloud Logging writer (`write_cloud_logging_entry`), for the orbax-style save and restore entries;
  `marks` gives startup_times' marks. Safe from the training thread and the save threads."""

  def __init__(self, recorder: Any, entries: Any, *, job_name: str, directory: str,
               marks: Callable[[str], float | None] = startup_times.reached):
    self._recorder = recorder
    self._entries = entries
    self._job = job_name
    self._directory = directory
    self._marks = marks
    self._lock = threading.Lock()
    self.on = True
    self._loop_set_up: float | None = None  # this run's `start` event, until its first step starts
    self._last: tuple[int, float] | None = None  # the step whose start was recorded last, and when
    self.stop_writer: Callable[[], None] | None = None  # stops the library's background writer, once off
    self.backlog: Callable[[], int] | None = None  # entries the library's writer holds, not sent yet
    self._steps = 0

  # --- the hook's points --------------------------------------------------------------------------

  def on_event(self, record: dict[str, Any]) -> None:
    """An event the hook writes to its event log (pax_autockpt.shared.events.EventLog's observer)."""
    if not self.on:
      return
    try:
      kind = record['event']
      if kind == 'start':
        self._started(record)
      elif kind == 'save_started':
        self._save(record)
      elif kind == 'exit' and record.get('code') == 0:
        self._recorder.record_job_end_time(_utc(record['t']))
    except Exception as e:  # pylint: disable=broad-except  (recording never stops training)
      self.fail(e)

  def step_started(self, step: int, now: float | None = None) -> None:
    """Pax's loop is about to run `step` (its checkpointer's save_if_needed). The one per-step call."""
    if not self.on:
      return
    try:
      now = time.time() if now is None else now
      if self._loop_set_up is not None:
        self._span('training_preparation', self._loop_set_up, now)
        self._loop_set_up = None
      last = self._last
      if last is not None and step > last[0] + 1:  # several steps per program: the ones between, evenly
        for s in range(last[0] + 1, step):
          self._recorder.record_step_start_time(s, _utc(last[1] + (now - last[1]) * (s - last[0]) / (step - last[0])))
      self._recorder.record_step_start_time(step, _utc(now))
      self._last = (step, now)
      self._steps += 1
      if self.backlog is not None and self._steps % BACKLOG_EVERY == 0:
        waiting = self.backlog()
        if waiting > MAX_BACKLOG:
          self.fail(f'Cloud Logging: {waiting} entries not sent (unreachable, or too slow for this step rate)')
    except Exception as e:  # pylint: disable=broad-except
      self.fail(e)

  def fail(self, error: BaseException | str) -> None:
    """The first failure: one warning line, and recording is off from now on."""
    with self._lock:
      if not self.on:
        return
      self.on = False
    why = error if isinstance(error, str) else failures.one_line(error)
    logging.warning("[autockpt] recording for Google's goodput tools is off from here on (training goes on): %s",
                    why)
    if self.stop_writer is not None:
      try:
        self.stop_writer()
      except Exception:  # pylint: disable=broad-except
        pass

  # --- what each records ----------------------------------------------------------------------------

  def _span(self, kind: str, begin: float | None, end: float | None) -> None:
    """A start/end pair of the recorder's (`tpu_init`, `training_preparation`), if it has a length."""
    if begin is None or end is None or end <= begin:
      return
    getattr(self._recorder, f'record_{kind}_start_time')(_utc(begin))
    getattr(self._recorder, f'record_{kind}_end_time')(_utc(end))

  def _started(self, record: dict[str, Any]) -> None:
    """The job's (re)start: its start, TPU initialization, training preparation, and the restore."""
    t = record['t']
    restore_s = record.get('restore_s') or 0.0
    restored = t - restore_s  # the restore's start
    setup, validated = self._marks(startup_times.JAX_SETUP), self._marks(startup_times.VALIDATED)
    began = record.get('process_start_t') or self._marks(startup_times.IMPORTED) or setup or restored
    self._recorder.record_job_start_time(_utc(began))
    if setup is not None and validated is not None and began <= setup <= validated <= restored:
      self._span('training_preparation', began, setup)
      self._span('tpu_init', setup, validated)
      self._span('training_preparation', validated, restored)
    else:
      self._span('training_preparation', began, restored)
    if restore_s > 0 and record.get('restored_step') is not None:
      local = record.get('restored_from') == 'local'
      self._entries.write_cloud_logging_entry({
          'job_name': self._job, 'event_type': 'emergency_restore' if local else 'restore',
          'step': record['restored_step'], 'directory': 'local' if local else self._directory,
          'checkpoint_manager_start_time': restored, 'checkpoint_manager_duration_secs': restore_s,
          'checkpointer_start_time': restored, 'checkpointer_duration_secs': restore_s})
    self._loop_set_up = t
    self._last = None

  def _save(self, record: dict[str, Any]) -> None:
    blocking = float(record.get('blocking_s') or 0.0)
    self._entries.write_cloud_logging_entry({
        'job_name': self._job, 'event_type': 'save', 'step': record['step'], 'directory': self._directory,
        'checkpoint_manager_blocking_start_time': record['t'], 'checkpoint_manager_blocking_duration_secs': blocking,
        'checkpointer_blocking_start_time': record['t'], 'checkpointer_blocking_duration_secs': blocking,
        'wait_for_prev_duration_secs': 0.0, 'get_old_steps_duration_secs': 0.0,
        'reached_preemption': record.get('reason') in ('preemption', 'notice'), 'synchronous': False})


class _WriterFailures(std_logging.Filter):
  """The library's background writer's errors (an upload that failed: no network, no permission): the first
  turns recording off with one line; all are kept off the log (the writer would print a traceback per batch)."""

  def __init__(self, recording: GoodputRecording):
    super().__init__()
    self._recording = recording

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.threadName != _WRITER_THREAD or record.levelno < std_logging.WARNING:
      return True
    error = record.exc_info[1] if record.exc_info and record.exc_info[1] is not None else record.getMessage()
    self._recording.fail(f'Cloud Logging: {failures.one_line(error) if not isinstance(error, str) else error}')
    return False


def _stop(worker: Any) -> None:
  """The library's background writer, once recording is off: what it still holds is dropped, it ends after the
  batch in hand, and the process's exit no longer waits for it (its atexit handler would wait GRACE_SECS)."""
  from google.cloud.logging_v2.handlers.transports import background_thread  # pylint: disable=g-import-not-at-top
  atexit.unregister(worker._main_thread_terminated)  # pylint: disable=protected-access
  pending = worker._queue  # pylint: disable=protected-access
  try:
    while True:
      pending.get_nowait()
      pending.task_done()
  except queue.Empty:
    pass
  pending.put_nowait(background_thread._WORKER_TERMINATOR)  # pylint: disable=protected-access


def start(settings: settings_lib.Settings, host: int, job_log_dir: str) -> GoodputRecording | None:
  """The recording for this process: None without `goodput_run_name`, on a host other than 0, or when the recorder
  cannot be made (one warning line: e.g. no Google credentials; training goes on)."""
  if not settings.goodput_run_name or host != 0:
    return None
  name, log = settings.goodput_run_name, logger_name(settings)
  try:
    goodput = import_goodput()
    recorder = goodput.GoodputRecorder(name, log, logging_enabled=True, background_grace_period_s=GRACE_SECS)
    writer = recorder._cloud_logger  # pylint: disable=protected-access  (0.2.3 has no public entry writer)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("[autockpt] recording for Google's goodput tools is off (training goes on): %s",
                    failures.one_line(e))
    return None
  recording = GoodputRecording(recorder, writer, job_name=name, directory=str(job_log_dir))
  std_logging.getLogger(_WRITER_LOG).addFilter(_WriterFailures(recording))
  handler = getattr(writer, '_async_handler', None)
  worker = getattr(getattr(handler, 'transport', None), 'worker', None)
  if worker is not None:
    recording.stop_writer = lambda: _stop(worker)
    recording.backlog = worker._queue.qsize  # pylint: disable=protected-access
  logging.info("[autockpt] recording for Google's goodput tools: job %s, Cloud Logging log %s (project %s).", name,
               log, getattr(writer, 'project_id', '?'))
  return recording
