"""The per-host event log (CONTRACT §6): its writer, and the one reader everything uses.

Local disk: one file per host, each event one appended line, fsynced, so that a SIGKILL leaves at
most a torn last line. Object storage (gs://) cannot append, and rewriting the whole history on every
event would cost quadratic bytes over a long run; there the log is a series of parts of at most
`PART_EVENTS` lines, each part rewritten whole as it grows, by a background thread so that the training
loop never waits for storage (the queue drains at exit). An object is replaced atomically, so a part
is never torn; a SIGKILL loses at most the events still queued.

"No log" is decided only by a listing that succeeded: on gs:// `is_dir()` answers False when the storage
fails, and a run that took that for "no log" saw no committed history and started its parts at 0, over
the oldest. A listing that fails is asked again briefly, then raises (EventLogUnreadable).
"""

import concurrent.futures
import dataclasses
import json
import math
import os
import re
import secrets
import threading
import time
from typing import Any, Callable

from absl import logging
from etils import epath

from pax_autockpt import layout
from pax_autockpt.shared import failures

PART_EVENTS = 64

# Where a run's restored step came from: a `start` event's `restored_from` (None: a fresh start). Persisted,
# so a new name needs the old one read as it: logs written before issue 50 name the job directory 'bucket',
# though most job directories are on local disk.
JOB_DIR = 'job_dir'  # the job's checkpoint directory, JOB_LOG_DIR/checkpoints (local disk or gs://)
LOCAL = 'local'  # the local tier (--autockpt_local_dir)
_OLD_TIERS = {'bucket': JOB_DIR}
_LIST_PAUSES = (0.5, 1.0, 2.0)  # before each retry of a listing the storage failed; then it raises
_FILE_NAME = re.compile(r'events\.host(\d+)(?:\.(\d{6}))?\.jsonl')  # layout.events_path's names
# Where a record starts inside a torn line (the writer puts "t" first).
_RECORD_START = re.compile(r'\{\s*"t"\s*:')


def restored_tier(value: Any) -> Any:
  """A `start` event's `restored_from` by today's name: an older log's 'bucket' is the job directory."""
  return _OLD_TIERS.get(value, value) if isinstance(value, str) else value


def _record(text: str) -> dict[str, Any] | None:
  """A JSON object with a string "event" and a finite number "t", else None (only json.loads)."""
  try:
    rec = json.loads(text)
  except (ValueError, RecursionError):
    return None
  if not isinstance(rec, dict) or not isinstance(rec.get('event'), str):
    return None
  t = rec.get('t')
  if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
    return None
  return rec


def parse(data: bytes) -> tuple[list[dict[str, Any]], int]:
  """The records of one file in order, and how many lines were not records.

  A killed writer can leave a torn line with the next process's first record appended to it: that
  record is salvaged, the torn part counted.
  """
  records, bad = [], 0
  for raw in data.split(b'\n'):
    line = raw.decode('utf-8', errors='replace').strip()
    if not line:
      continue
    rec = _record(line)
    if rec is None:
      bad += 1
      rec = next((r for r in (_record(line[m.start():]) for m in _RECORD_START.finditer(line, 1))
                  if r is not None), None)
    if rec is not None:
      records.append(rec)
  return records, bad


@dataclasses.dataclass
class HostLog:
  host: int
  records: list[dict[str, Any]]
  unparsable: int
  files: list[str]


class EventLogUnreadable(OSError):
  """The event log's folder could not be listed: "could not ask", never to be read as "no log"."""


def _entries(folder: epath.Path) -> dict[str, epath.Path]:
  """A listing's answer ({} when it says the folder is absent); raises when the storage gives none. On
  object storage a glob: one listing request, [] for an empty prefix, raising when the request fails (TF's
  directory listing answers NotFoundError for both when its first request fails)."""
  if layout.is_object_store(folder):
    return {p.name: p for p in folder.glob('events.host*.jsonl')}
  return layout.entries(folder)


def _listing(folder: epath.Path) -> dict[str, epath.Path]:
  """`_entries`, asked again briefly after a failure (a storage hiccup), then EventLogUnreadable."""
  for pause in _LIST_PAUSES:
    try:
      return _entries(folder)
    except Exception:  # pylint: disable=broad-except  (asked again; the last failure is raised)
      time.sleep(pause)
  try:
    return _entries(folder)
  except Exception as e:  # pylint: disable=broad-except
    raise EventLogUnreadable(f'the event log could not be listed in {folder} ({1 + len(_LIST_PAUSES)} tries): '
                             f'{failures.one_line(e)}') from e


def event_files(job_log_dir: epath.PathLike) -> dict[int, list[epath.Path]]:
  """Host -> its event files in write order (the whole file, or its parts by number); raises
  EventLogUnreadable when the storage cannot say."""
  found: dict[int, list[tuple[int, epath.Path]]] = {}
  for name, path in _listing(layout.autockpt_dir(job_log_dir)).items():
    m = _FILE_NAME.fullmatch(name)
    if m:
      found.setdefault(int(m.group(1)), []).append((int(m.group(2) or -1), path))
  return {host: [p for _, p in sorted(parts)] for host, parts in sorted(found.items())}


def next_part(job_log_dir: epath.PathLike, host: int) -> int:
  """A new process's first part: one past the highest part of this host (counting them would overwrite the
  newest part after a gap, e.g. a part removed by hand); never a guess when the listing fails."""
  parts = [_FILE_NAME.fullmatch(p.name) for p in event_files(job_log_dir).get(host, [])]
  return 1 + max((int(m.group(2)) for m in parts if m and m.group(2)), default=-1)


def read_job(job_log_dir: epath.PathLike) -> dict[int, HostLog]:
  """Every host's events, in the order they were written."""
  out = {}
  for host, paths in event_files(job_log_dir).items():
    records, bad = [], 0
    for path in paths:
      got, skipped = parse(path.read_bytes())
      records += got
      bad += skipped
    out[host] = HostLog(host, records, bad, [p.name for p in paths])
  return out


def read(job_log_dir: epath.PathLike, host: int = 0) -> list[dict[str, Any]]:
  """One host's events so far."""
  log = read_job(job_log_dir).get(host)
  return log.records if log else []


class EventLog:
  """Appends one JSON object per event; safe to call from any thread. Never stops training: a
  write that fails is logged and the event is lost."""

  def __init__(self, job_log_dir: epath.PathLike, host: int):
    self.host = host
    # This process's mark on each of its events, new at each start: `report` tells a restart's events written before
    # its `start` (a failed restore's) from the run before it, where a container's pid is the same every time.
    self.process = secrets.token_hex(4)
    self.job_log_dir = epath.Path(job_log_dir)
    layout.autockpt_dir(job_log_dir).mkdir(parents=True, exist_ok=True)
    self._lock = threading.Lock()
    self._parts: _Parts | None = None
    self.kinds_written: set[str] = set()  # by this process (e.g. whether its `exit` is written)
    # sees each record (pax_autockpt.hook.goodput_recording)
    self.observer: Callable[[dict[str, Any]], None] | None = None
    if layout.is_object_store(job_log_dir):
      self._parts = _Parts(job_log_dir, host)
    self.path = layout.events_path(job_log_dir, host)

  def write(self, event: str, *, t: float | None = None, **fields: Any) -> dict[str, Any]:
    """Logs one event; `t` defaults to now (a save_started is stamped with its start)."""
    record = {'t': time.time() if t is None else t, 'host': self.host, 'event': event, 'process': self.process,
              **fields}
    line = json.dumps(record)
    if self.observer is not None:
      self.observer(record)
    with self._lock:
      self.kinds_written.add(event)
      if self._parts is not None:
        self._parts.add(line)
        return record
      try:
        # One write() of a whole line, then fsync: a SIGKILL leaves at most a torn last line.
        with open(self.path, 'a') as f:
          f.write(line + '\n')
          f.flush()
          os.fsync(f.fileno())
      except OSError as e:
        logging.warning('[autockpt] could not write the %s event to %s: %s', event, self.path, e)
    return record

  def flush(self) -> None:
    """Waits until every event so far is on storage (object storage; local writes are synchronous)."""
    if self._parts is not None:
      self._parts.flush()


class _Parts:
  """Object storage: the current part's lines, uploaded whole by one background thread."""

  def __init__(self, job_log_dir: epath.PathLike, host: int):
    self._job, self._host = job_log_dir, host
    self._part = next_part(job_log_dir, host)  # a new process, a new part: nothing read back
    self._lines: list[str] = []
    self._uploads = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='autockpt-events')

  def add(self, line: str) -> None:
    if len(self._lines) == PART_EVENTS:
      self._part, self._lines = self._part + 1, []
    self._lines.append(line)
    self._uploads.submit(self._upload, self._part, '\n'.join(self._lines) + '\n')

  def _upload(self, part: int, text: str) -> None:
    path = layout.events_path(self._job, self._host, part)
    try:
      path.write_text(text)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('[autockpt] could not write %s: %s', path, e)

  def flush(self) -> None:
    # At interpreter exit the pool's own shutdown drains the queue; submit() then refuses.
    try:
      self._uploads.submit(lambda: None).result()
    except RuntimeError:
      pass
