"""The launcher's own record, `JOB_LOG_DIR/autockpt/launch.jsonl` (CONTRACT §6): one JSON line per restart that
`pax-autockpt launch --max_restarts` makes, with its reason and its backoff, for `report` to show.

Beside the hosts' event logs but not one of them (`events.host<IDX>.jsonl` is a host's runs, `start` to `exit`;
a line of the launcher's in host 0's file would sit inside a run and move its last event). Written as the hosts'
are, one whole line per write, fsynced, on local disk; on object storage (no appends) the whole object again each
time (a restart is rare). Read with `pax_autockpt.shared.events.parse`, the one parser (`json.loads` only).
"""

import json
import os
import time
from typing import Any

from etils import epath

from pax_autockpt import layout
from pax_autockpt.shared import events

NAME = 'launch.jsonl'


def path(job_log_dir: epath.PathLike) -> epath.Path:
  return layout.autockpt_dir(job_log_dir) / NAME


def write(job_log_dir: epath.PathLike, event: str, **fields: Any) -> dict[str, Any]:
  """Appends one record (`t` now); raises OSError when the storage refuses (the caller says so and goes on)."""
  record = {'t': time.time(), 'event': event, **fields}
  line = json.dumps(record) + '\n'
  target = path(job_log_dir)
  if layout.is_object_store(job_log_dir):
    target.write_text((target.read_text() if target.exists() else '') + line)
    return record
  target.parent.mkdir(parents=True, exist_ok=True)
  with open(target, 'a') as f:
    f.write(line)
    f.flush()
    os.fsync(f.fileno())
  return record


def read(job_log_dir: epath.PathLike) -> list[dict[str, Any]]:
  """The launcher's records in the order written; [] when the job was never restarted by `launch`."""
  target = path(job_log_dir)
  if not target.exists():
    return []
  return events.parse(target.read_bytes())[0]
