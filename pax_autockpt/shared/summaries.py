"""TensorBoard scalars for saves, in the job's own summaries: JOB_LOG_DIR/summaries/autockpt."""

import os
import threading

from etils import epath
import tensorflow.compat.v2 as tf  # paxml's own summary stack

from pax_autockpt import layout


class SaveSummaries:
  """Written by the primary host only; safe to call from the commit-watcher threads."""

  def __init__(self, job_log_dir: epath.PathLike, enabled: bool):
    self._writer = tf.summary.create_file_writer(os.fspath(layout.summary_dir(job_log_dir))) if enabled else None
    self._lock = threading.Lock()
    self._last_start: tuple[int, float] | None = None

  def _scalars(self, step: int, values: dict[str, float]) -> None:
    if self._writer is None:
      return
    with self._lock, self._writer.as_default():
      for tag, value in values.items():
        tf.summary.scalar(tag, value, step=step)
      self._writer.flush()

  def started(self, step: int, start: float, blocking_s: float) -> None:
    values = {'autockpt/save_blocking_s': blocking_s}
    if self._last_start is not None and step > self._last_start[0]:
      values['autockpt/save_interval_steps'] = step - self._last_start[0]
      values['autockpt/save_interval_s'] = start - self._last_start[1]
    self._last_start = (step, start)
    self._scalars(step, values)

  def committed(self, step: int, duration_s: float) -> None:
    self._scalars(step, {'autockpt/save_duration_s': duration_s})
