"""Starts and watches real training processes: for the demo, the launcher, tests and benchmarks."""

import importlib.util
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence, TypeVar

T = TypeVar('T')

TINY_EXP = 'experiments.lm_cloud_autockpt.LmCloudSpmdTinyAutockpt'

# TensorFlow's gs:// caches switched off: what a checking process (a test, the soak) sets so that it sees the
# jobs' writes at once; never a job's own setting (a user's job runs with TensorFlow's defaults).
CHECKS_ONLY = ('GCS_STAT_CACHE_MAX_AGE', 'GCS_READ_CACHE_MAX_SIZE_MB')


def users_env(env: dict[str, str] | None = None) -> dict[str, str]:
  """`env` (default: this process's) as a user's job has it: without the checking process's settings."""
  return {k: v for k, v in (os.environ if env is None else env).items() if k not in CHECKS_ONLY}


def ours_argv(exp: str, job_log_dir: str, *flags: str) -> list[str]:
  """`python -m pax_autockpt.main` with this interpreter."""
  return [sys.executable, '-m', 'pax_autockpt.main', f'--exp={exp}', f'--job_log_dir={job_log_dir}',
          *flags]


def stock_argv(exp: str, job_log_dir: str, *flags: str) -> list[str]:
  """Stock `paxml/main.py`, located without importing paxml (and TensorFlow) here."""
  paxml_dir = importlib.util.find_spec('paxml').submodule_search_locations[0]
  return [sys.executable, os.path.join(paxml_dir, 'main.py'), f'--exp={exp}',
          f'--job_log_dir={job_log_dir}', *flags]


def note_stop_signals() -> list[int]:
  """From now on SIGTERM and SIGINT (SIGINT too: a shell starts a background job with it ignored) are only
  appended to the list returned. A handler runs in the main thread between two bytecodes, possibly inside a
  `with lock:`: one that set an Event or started a thread could wait on that lock forever (seen: a local GCS
  server that did not stop in 30 s under `make test`; an Event set from a handler hung 3 processes in 300)."""
  got: list[int] = []
  for signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, lambda s, _: got.append(s))
  return got


def serve_until_stopped(server) -> None:
  """`server.serve_forever()` (a socketserver) until SIGTERM or SIGINT, then its shutdown."""
  got = note_stop_signals()
  threading.Thread(target=server.serve_forever, name='serve', daemon=True).start()
  wait_until(lambda: got, 'a stop signal', timeout=math.inf)
  server.shutdown()


def wait_until(cond: Callable[[], T], what: str, timeout: float = 300, every: float = 0.1,
               job: 'Job | None' = None) -> T:
  """Polls `cond` until it returns something truthy, and returns that: what tests, the soak and the
  benchmarks wait for instead of sleeping. Raises TimeoutError after `timeout` s and, given the `job`
  that should bring it about, RuntimeError as soon as that job has exited; both name `what` and end
  with the job's last log lines."""
  deadline = time.time() + timeout
  while True:
    exited = job is not None and job.proc.poll() is not None  # before cond: its last words count
    value = cond()
    if value:
      return value
    if exited:
      raise RuntimeError(f'process exited {job.proc.returncode} before {what}{_tail(job)}')
    if time.time() > deadline:
      raise TimeoutError(f'no {what} after {timeout} s{_tail(job)}')
    time.sleep(every)


def text_of(path: str, since: int = 0) -> str:
  """A log file's text so far, from byte `since` on; '' before the process created it."""
  if not os.path.exists(path):
    return ''
  with open(path, 'rb') as f:
    f.seek(since)
    return f.read().decode(errors='replace')


def _tail(job: 'Job | None') -> str:
  return '' if job is None else f'; {job.log_path} ends:\n{job.log()[-3000:]}'


class Job:
  """One process in its own session, its output in a log file."""

  def __init__(self, argv: Sequence[str], log_path: str, env: dict[str, str] | None = None,
               cwd: str | None = None):
    self.argv = list(argv)
    self.log_path = log_path
    self.started = time.time()
    with open(log_path, 'ab') as log:
      self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                   start_new_session=True)

  @property
  def pid(self) -> int:
    return self.proc.pid

  def log(self) -> str:
    return text_of(self.log_path)

  def wait_for_log(self, pattern: str, timeout: float = 180) -> re.Match:
    """Polls the log for a regex; raises TimeoutError (or RuntimeError if the process died)."""
    regex = re.compile(pattern)
    return wait_until(lambda: regex.search(self.log()), f'/{pattern}/ in {self.log_path}', timeout, job=self)

  def send(self, signum: int = signal.SIGTERM) -> float:
    """Sends a signal to the process (not its children); returns when, for timing."""
    self.proc.send_signal(signum)
    return time.time()

  def wait(self, timeout: float = 300) -> int:
    try:
      return self.proc.wait(timeout)
    except subprocess.TimeoutExpired:
      self.kill()
      raise

  def kill(self) -> None:
    """SIGKILL to the whole session (also the launcher's children)."""
    if self.proc.poll() is None:
      try:
        os.killpg(self.proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      self.proc.wait()
