"""One live job per local directory: an OS lock on `LOCAL_DIR/autockpt.lock`.

Two jobs on one local directory (`/dev/shm/autockpt-{host}` is the same path for any two single-host jobs on a
VM) would each remove the other's steps as leftovers, silently. So a run takes an exclusive `flock` on the
lock file at start-up (pax_autockpt.precheck, ~1 s in, before paxml starts and before the job directory is
touched; main for an experiment's AUTOCKPT_LOCAL_DIR) and holds it for the life of the process; the kernel
releases it when the process ends, however it ends, so a SIGKILLed run never blocks its own restart. A second
job finds it held and stops (exit 2, one line) naming the holder from what the holder wrote into the file.
"""

import datetime
import fcntl
import json
import os
import socket
import time

from pax_autockpt import failures
from pax_autockpt import settings as settings_lib

LOCK_FILE = 'autockpt.lock'
PathLike = str | os.PathLike  # not etils.epath's: this module is imported before paxml, at start-up (~0.3 s)
_held: dict[str, int] = {}  # real path -> the open descriptor holding its lock (for the life of the process)


class InUse(settings_lib.ConfigError):
  """The local directory is held by another live process: the run exits 2 in one line naming it."""


def hold(folder: PathLike, job_log_dir: PathLike, host: int) -> None:
  """Makes `folder` and holds its lock until this process ends; InUse when another live process holds it,
  ConfigError when the directory cannot be made or its lock file opened. Once per process and directory
  (a process's local tier may be set up again: it is still the same job)."""
  path = os.path.realpath(os.fspath(folder))
  if path in _held:
    return
  try:
    os.makedirs(path, exist_ok=True)
    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by exec'd children
  except OSError as e:
    raise settings_lib.ConfigError(f'--autockpt_local_dir {folder} cannot be made or written '
                                   f'({failures.one_line(e)}): choose a directory on the host\'s own disk') from None
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    holder = _read(fd)
    os.close(fd)
    raise InUse(busy_line(folder, holder, os.fspath(job_log_dir), host)) from None
  _write(fd, {'pid': os.getpid(), 'machine': socket.gethostname(), 'job_log_dir': os.fspath(job_log_dir),
              'host': host, 'since': time.time()})
  _held[path] = fd


def busy_line(folder: PathLike, holder: dict, job_log_dir: str, host: int) -> str:
  """Who holds `folder` (as it wrote, possibly nothing yet) and the fix: another host of this same job means
  `{host}` is missing from the path; anything else is another job."""
  since = holder.get('since')
  when = (datetime.datetime.fromtimestamp(since, datetime.timezone.utc).strftime(', since %Y-%m-%d %H:%M:%S UTC')
          if isinstance(since, (int, float)) else '')
  who = (f'pid {holder.get("pid", "?")} on {holder.get("machine", "?")}, job directory '
         f'{holder.get("job_log_dir", "?")}, host {holder.get("host", "?")}{when}')
  if holder.get('job_log_dir') == job_log_dir and holder.get('host') != host:
    fix = 'put {host} in --autockpt_local_dir so that each host of this job has its own directory'
  else:
    fix = 'one local directory serves one job at a time: give this job its own --autockpt_local_dir, or stop the other'
  return f'--autockpt_local_dir {folder} is held by a live process ({who}); {fix}'


def _read(fd: int) -> dict:
  """What the holder wrote ({} while it is still writing it, or for a file of something else)."""
  try:
    found = json.loads(os.pread(fd, 4096, 0) or b'{}')
  except (OSError, ValueError):
    return {}
  return found if isinstance(found, dict) else {}


def _write(fd: int, record: dict) -> None:
  data = json.dumps(record).encode()
  os.ftruncate(fd, 0)
  os.pwrite(fd, data, 0)
