"""The program hook: Pax's default executor with its checkpointer wrapped, and the one place a training
process decides how it ends (exit code and `exit` event), under our main and under stock paxml main."""

import errno
import math
import os
import sys
import threading

from absl import logging
import jax
from paxml import executors

from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt.exit import owed_work
from pax_autockpt.hook import checkpointer as checkpointer_lib
from pax_autockpt.hook import goodput_recording
from pax_autockpt.hosts import agreement
from pax_autockpt.save import metrics as metrics_lib
from pax_autockpt.shared import coordination
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import failures
from pax_autockpt.shared import internals
from pax_autockpt.shared import stops
from pax_autockpt.signals import console
from pax_autockpt.signals import signals
from pax_autockpt.startup import startup_times


class AutockptExecutor(executors.DefaultExecutor):
  """Runs Pax's own training loop; preemption and saves go through the wrapped checkpointer."""

  def __init__(self, settings: settings_lib.Settings):
    super().__init__()
    self._settings = settings
    self._events: events_lib.EventLog | None = None

  def setup(self, jax_task, job_log_dir, checkpointer, *args, exit_after_ondemand_checkpoint=False,
            **kwargs):
    self._events = events_lib.EventLog(job_log_dir, jax.process_index())
    recording = goodput_recording.start(self._settings, jax.process_index(), job_log_dir)  # host 0, if asked
    if recording is not None:
      self._events.observer = recording.on_event
    step_metrics = metrics_lib.StepMetrics()
    # Wrapped before the restore, so that a SIGTERM during the restore is already watched for.
    try:
      wrapped = checkpointer_lib.AutockptCheckpointer(
          checkpointer, settings=self._settings, events=self._events,
          exit_after_ondemand_checkpoint=exit_after_ondemand_checkpoint,
          enable_summaries=kwargs.get('enable_summary_writer', True), metrics=step_metrics,
          slices=math.prod(getattr(jax_task.model, 'dcn_mesh_shape', None) or [1]), end=self._stopped)
    except settings_lib.ConfigError as e:  # e.g. a local directory another live job holds (pax_autockpt.local.lock)
      self._exit(2, checkpointer.step_to_restore, f'{e}; exiting 2.', error=True)
    if recording is not None:
      wrapped.on_step = recording.step_started
    step = checkpointer.step_to_restore
    where = 'no checkpoint: starting fresh' if step is None else f'restoring step {step}'
    if self._settings.local_dir:
      where = f'newest checkpoint {step}, the local tier may hold a newer step'
    logging.info('[autockpt] host %d/%d, %s, settings: %s', jax.process_index(), jax.process_count(), where,
                 settings_lib.describe(self._settings))
    try:
      super().setup(jax_task, job_log_dir, wrapped, *args,
                    exit_after_ondemand_checkpoint=exit_after_ondemand_checkpoint, **kwargs)
    except stops.RestoreMismatch as stop:  # a config slip: nothing moved, the same command fixed resumes
      self._exit(2, stop.step, f'{stop}; exiting 2.', error=True)
    except stops.RestoreFailed as stop:
      self._exit(1, stop.step, f'{stop}; exiting 1.', error=True)
    step_metrics.tap(*internals.programs(self))  # each saved step's metrics, for BestN
    internals.instrument_programs(*internals.programs(self), internals.decode_programs(self), wrapped.phases)
    # After the restore: a damaged newest checkpoint may have been passed over.
    self._events.write('start', num_hosts=jax.process_count(), pid=os.getpid(),
                       restored_step=wrapped.step_to_restore, restored_from=wrapped.restored_from,
                       **({} if wrapped.restore_s is None else {'restore_s': round(wrapped.restore_s, 6)}),
                       **startup_times.start_fields(), **wrapped.verified)
    self._owe_cut_programs(wrapped, job_log_dir, jax_task.train.num_train_steps)

  def _owe_cut_programs(self, wrapped: checkpointer_lib.AutockptCheckpointer, job_log_dir, num_train_steps: int
                        ) -> None:
    """A restart at the last step after an exit that cut its eval or decode short runs them before the loop
    ends (pax_autockpt.exit.owed_work): host 0 reads its event log, every host follows its answer."""
    mine = None
    if jax.process_index() == 0:
      try:
        mine = ','.join(owed_work.owed(events_lib.read(job_log_dir, 0), wrapped.step_to_restore, num_train_steps))
      except events_lib.EventLogUnreadable as e:
        logging.warning('[autockpt] the event log could not be read (%s): no owed eval or decode is run.', e)
    owed = agreement.first_report(coordination.OWED_WORK, jax.process_index(), mine or None)
    if owed:
      logging.info('[autockpt] The previous run was stopped in the %s at step %s, the last: running %s first.',
                   owed.split(',')[0], wrapped.step_to_restore, ' and '.join(owed.split(',')))
      wrapped.before_first_step = lambda step, state: owed_work.run(self, tuple(owed.split(',')), step, state)

  def start(self):
    try:
      super().start()
    except (stops.Preempted, stops.SaveFailed) as stop:
      self._stopped(stop)
    except Exception as e:  # pylint: disable=broad-except
      if not _out_of_space(e):
        raise
      # Pax's own writers (summaries, logs) fail on a full disk once our failed saves no longer
      # can: one line naming what a restart resumes from, instead of a traceback.
      self._exit(1, self._checkpointer.last_step,
                 f'training stopped at step {self._checkpointer.last_step}, the disk is full '
                 f'({failures.one_line(e)}); the newest committed checkpoint is '
                 f'{layout.step_text(self._checkpointer.newest_committed())}; exiting 1.', error=True)
    self._log_run_recap(0)
    self._events.write('exit', code=0, step=self._checkpointer.last_step, **console.lost_fields())
    self._events.flush()
    console.settle()

  def _stopped(self, stop: stops.StopTraining) -> None:
    """Training stopped for a preemption (exit 143, or 130 after Ctrl-C) or a save that did not commit (1); in
    the main thread, or in pax_autockpt.exit.rescue's when the main thread was held."""
    if isinstance(stop, stops.Preempted):
      code = signals.INTERRUPT_EXIT_CODE if stop.signal == 'SIGINT' else self._settings.exit_code
      self._log_run_recap(code)
      self._exit(code, stop.step, f'{stop} ({stop.signal}); exiting {code}.')
    else:
      self._log_run_recap(1)
      self._exit(1, stop.step, f'{stop}; exiting 1.', error=True)

  def _log_run_recap(self, code: int) -> None:
    """One line that tells this run's story: what it trained and saved, and what a rerun does (the log's
    `run summary:` line; TensorBoard's summaries are pax_autockpt.shared.summaries')."""
    ckpt = self._checkpointer
    first, last, saved = ckpt.step_to_restore or 0, ckpt.last_step, ckpt.committed_this_run
    newest = ckpt.newest_committed()
    rerun = '' if newest is None or code == 0 else f'; rerunning the same command resumes from step {newest}'
    listed = f' ({layout.newest_steps_text(saved, 6)})' if saved else ''
    logging.info('[autockpt] run summary: trained steps %s to %s, %d checkpoint(s) committed%s, newest committed '
                 '%s; exit %d%s.', first, last, len(saved), listed, layout.step_text(newest), code, rerun)

  def _exit(self, code: int, step: int | None, message: str, error: bool = False) -> None:
    (logging.error if error else logging.info)('[autockpt] %s', message)
    self._events.write('exit', code=code, step=step, **console.lost_fields())
    self._events.flush()
    console.settle()  # a broken stdout must not turn the code into 120 (Python's code for a failed final flush)
    held = threading.current_thread() is not threading.main_thread()  # the main thread is held elsewhere
    if held or getattr(getattr(self, '_checkpointer', None), 'save_in_flight', False):
      # A save the grace period cut short is still writing from C++ threads, and Python's finalization
      # would abort under them (std::terminate, exit -6). It can no longer commit: end here. (And from
      # another thread, sys.exit would end only that thread.)
      logging.flush()
      os._exit(code)  # pylint: disable=protected-access
    sys.exit(code)


def _out_of_space(error: BaseException) -> bool:
  """ENOSPC from Python, TensorFlow or tensorstore, which report it only in their messages."""
  return getattr(error, 'errno', None) == errno.ENOSPC or 'No space left on device' in str(error)
