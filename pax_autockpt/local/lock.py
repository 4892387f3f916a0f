"""One live job per local directory: an OS lock on `LOCAL_DIR/autockpt.lock`.

Two jobs on one local directory (`/dev/shm/autockpt-{host}` is the same path for any two single-host jobs on a
VM) would each remove the other's steps as leftovers, silently. So a run takes an exclusive `flock` on the
lock file at start-up (pax_autockpt.startup.precheck, ~1 s in, before paxml starts and before the job directory is
touched; main for an experiment's AUTOCKPT_LOCAL_DIR) and holds it for the life of the process; the kernel
releases it when the process ends, however it ends, so a SIGKILLed run never blocks its own restart. A second
job finds it held and stops (exit 2, one line) naming the holder from what the holder wrote into the file.

The directory is also this user's alone (issue 57): a local step passes every check a restart makes (the job id
and the event log are readable by anyone, xxh3 is not a keyed hash), so another user who could write into the
directory could plant the weights this job restores. A directory the job makes (and the parents it makes for it)
is mode 0700; one that another user owns, or that group or others can write, stops the run (exit 2, one line).
A lock error other than "held" (NFS without lock support: ENOLCK) says the filesystem cannot lock.
"""

import datetime
import errno
import fcntl
import json
import os
import pwd
import socket
import time

from pax_autockpt import settings as settings_lib
from pax_autockpt.shared import failures

LOCK_FILE = 'autockpt.lock'
PathLike = str | os.PathLike  # not etils.epath's: this module is imported before paxml, at start-up (~0.3 s)
_held: dict[str, int] = {}  # real path -> the open descriptor holding its lock (for the life of the process)


class InUse(settings_lib.ConfigError):
  """The local directory is held by another live process: the run exits 2 in one line naming it."""


_HELD_ERRNOS = (errno.EWOULDBLOCK, errno.EAGAIN)  # flock's "another descriptor holds it"; anything else cannot lock


def hold(folder: PathLike, job_log_dir: PathLike, host: int) -> None:
  """Makes `folder` (mode 0700), checks that it is this user's alone, and holds its lock until this process ends;
  InUse when another live process holds it, ConfigError when the directory cannot be made, is another user's or
  writable by others, or its lock file cannot be opened or locked. Once per process and directory (a process's
  local tier may be set up again: it is still the same job)."""
  path = os.path.realpath(os.fspath(folder))
  if path in _held:
    return
  try:
    _make_private(path)
    _check_private(folder, path)
    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by exec'd children
  except OSError as e:
    raise settings_lib.ConfigError(f'--autockpt_local_dir {folder} cannot be made or written '
                                   f'({failures.one_line(e)}): choose a directory on the host\'s own disk') from None
  _lock(fd, folder, os.fspath(job_log_dir), host)
  _write(fd, {'pid': os.getpid(), 'machine': socket.gethostname(), 'job_log_dir': os.fspath(job_log_dir),
              'host': host, 'since': time.time()})
  _held[path] = fd


def _lock(fd: int, folder: PathLike, job_log_dir: str, host: int) -> None:
  """The exclusive lock, else InUse naming the holder; ConfigError where the filesystem cannot lock at all (an
  NFS mount without lock support answers ENOLCK): no live holder exists to name, and none to stop."""
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    holder = _read(fd) if e.errno in _HELD_ERRNOS else {}
    os.close(fd)
    if e.errno in _HELD_ERRNOS:
      raise InUse(busy_line(folder, holder, job_log_dir, host)) from None
    raise settings_lib.ConfigError(
        f'--autockpt_local_dir {folder}: its filesystem cannot lock ({failures.one_line(e)}), so one job per directory '
        'cannot be enforced: choose a directory on the host\'s own disk (/dev/shm, a local SSD), not a network '
        'filesystem') from None


def _make_private(path: str) -> None:
  """`path` and each parent it lacks, made mode 0700 (os.makedirs gives the parents 0777 less the umask): the
  tier's directories are this user's alone."""
  if os.path.isdir(path):
    return
  parent = os.path.dirname(path)
  if parent != path:
    _make_private(parent)
  try:
    os.mkdir(path, 0o700)
  except FileExistsError:
    if not os.path.isdir(path):
      raise


def _check_private(folder: PathLike, path: str) -> None:
  """ConfigError when `path` (the directory `folder` resolves to, or `folder` itself where it is a symlink) is
  another user's or writable by group or others: that user could plant a step this job would restore."""
  given = os.path.abspath(os.fspath(folder))
  for where, found in ((path, os.stat(path)), (given, os.lstat(given))):
    if found.st_uid != os.geteuid():
      raise settings_lib.ConfigError(
          f'--autockpt_local_dir {folder}: {where} is owned by {_user(found.st_uid)}, not by this job\'s user '
          f'{_user(os.geteuid())}, who could put a step in it that this job would restore: choose a directory of '
          'your own, or remove it so that the job makes it (mode 0700)')
    if found.st_mode & 0o022 and not os.path.islink(where):
      raise settings_lib.ConfigError(
          f'--autockpt_local_dir {folder}: {where} is writable by group or others (mode {found.st_mode & 0o7777:o}): '
          f'another user could put a step in it that this job would restore: run chmod go-w {where}, or choose '
          'another directory (the job makes its own with mode 0700)')


def _user(uid: int) -> str:
  try:
    return f'{pwd.getpwuid(uid).pw_name} (uid {uid})'
  except KeyError:
    return f'uid {uid}'


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
