"""The per-host event log: `JOB_LOG_DIR/autockpt/events.host<IDX>.jsonl` (CONTRACT §6)."""

import json
import os
import threading
import time
from typing import Any

from absl import logging
from etils import epath


def log_dir(job_log_dir: epath.PathLike) -> epath.Path:
  return epath.Path(job_log_dir) / 'autockpt'


def events_path(job_log_dir: epath.PathLike, host: int) -> epath.Path:
  return log_dir(job_log_dir) / f'events.host{host}.jsonl'


def read(job_log_dir: epath.PathLike, host: int) -> list[dict[str, Any]]:
  """A host's events so far; a torn last line (a killed writer) is skipped. Only json.loads."""
  path = events_path(job_log_dir, host)
  if not path.exists():
    return []
  out = []
  for line in path.read_text().splitlines():
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    if isinstance(record, dict):
      out.append(record)
  return out


class EventLog:
  """Appends one JSON object per line; safe to call from the commit-watcher threads."""

  def __init__(self, job_log_dir: epath.PathLike, host: int):
    self.host = host
    self.job_log_dir = epath.Path(job_log_dir)
    self.path = events_path(job_log_dir, host)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._lock = threading.Lock()
    # Object stores (gs://) cannot append: there the whole file is rewritten.
    self._local = os.path.isabs(os.fspath(self.path)) and '://' not in os.fspath(self.path)
    self._lines = [] if self._local or not self.path.exists() else self.path.read_text().splitlines()

  def write(self, event: str, *, t: float | None = None, **fields: Any) -> dict[str, Any]:
    """Appends one event; `t` defaults to now (a save_started is stamped with its start)."""
    record = {'t': time.time() if t is None else t, 'host': self.host, 'event': event, **fields}
    line = json.dumps(record, sort_keys=False)
    with self._lock:
      try:
        if self._local:
          # One write() of a whole line, then fsync: a SIGKILL leaves at most a torn last line.
          with open(self.path, 'a') as f:
            f.write(line + '\n')
            f.flush()
            os.fsync(f.fileno())
        else:
          self._lines.append(line)
          self.path.write_text('\n'.join(self._lines) + '\n')
      except OSError as e:
        # The log must never stop training (e.g. a full disk): the event is lost, said once here.
        logging.warning('[autockpt] could not write the %s event to %s: %s', event, self.path, e)
    return record
