"""The program hook: Pax's default executor with its checkpointer wrapped by AutockptCheckpointer."""

import errno
import os
import sys

from absl import logging
import jax
from paxml import executors

from pax_autockpt import checkpointer as checkpointer_lib
from pax_autockpt import events as events_lib
from pax_autockpt import settings as settings_lib


class AutockptExecutor(executors.DefaultExecutor):
  """Runs Pax's own training loop; preemption, saves and exits go through the wrapped checkpointer."""

  def __init__(self, settings: settings_lib.Settings):
    super().__init__()
    self._settings = settings
    self._events: events_lib.EventLog | None = None

  def setup(self, jax_task, job_log_dir, checkpointer, *args, exit_after_ondemand_checkpoint=False,
            **kwargs):
    self._events = events_lib.EventLog(job_log_dir, jax.process_index())
    # Wrapped before the restore, so that a SIGTERM during the restore is already watched for.
    wrapped = checkpointer_lib.AutockptCheckpointer(
        checkpointer, settings=self._settings, events=self._events,
        exit_after_ondemand_checkpoint=exit_after_ondemand_checkpoint,
        enable_summaries=kwargs.get('enable_summary_writer', True))
    logging.info('[autockpt] host %d/%d, restoring step %s, settings %s', jax.process_index(),
                 jax.process_count(), checkpointer.step_to_restore, self._settings)
    super().setup(jax_task, job_log_dir, wrapped, *args,
                  exit_after_ondemand_checkpoint=exit_after_ondemand_checkpoint, **kwargs)
    # After the restore: a damaged newest checkpoint may have been passed over.
    self._events.write('start', num_hosts=jax.process_count(), pid=os.getpid(),
                       restored_step=wrapped.step_to_restore)

  def start(self):
    try:
      super().start()
    except Exception as e:  # pylint: disable=broad-except
      if not _out_of_space(e):
        raise
      # Pax's own writers (summaries, logs) fail on a full disk once our failed saves no longer
      # can: one line naming what a restart resumes from, instead of a traceback.
      logging.error('[autockpt] training stopped at step %s, the disk is full (%s); the newest '
                    'committed checkpoint is %s; exiting 1.', self._checkpointer.last_step,
                    checkpointer_lib.one_line(e), self._checkpointer.newest_committed())
      self._events.write('exit', code=1, step=self._checkpointer.last_step)
      sys.exit(1)
    self._events.write('exit', code=0, step=self._checkpointer.last_step)


def _out_of_space(error: BaseException) -> bool:
  """ENOSPC from Python, TensorFlow or tensorstore, which report it only in their messages."""
  return getattr(error, 'errno', None) == errno.ENOSPC or 'No space left on device' in str(error)
