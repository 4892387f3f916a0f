"""Starts and watches real training processes: for the demo, the launcher, tests and benchmarks."""

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from typing import Sequence

TINY_EXP = 'experiments.lm_cloud_autockpt.LmCloudSpmdTinyAutockpt'


def ours_argv(exp: str, job_log_dir: str, *flags: str) -> list[str]:
  """`python -m pax_autockpt.main` with this interpreter."""
  return [sys.executable, '-m', 'pax_autockpt.main', f'--exp={exp}', f'--job_log_dir={job_log_dir}',
          *flags]


def stock_argv(exp: str, job_log_dir: str, *flags: str) -> list[str]:
  """Stock `paxml/main.py`, located without importing paxml (and TensorFlow) here."""
  paxml_dir = importlib.util.find_spec('paxml').submodule_search_locations[0]
  return [sys.executable, os.path.join(paxml_dir, 'main.py'), f'--exp={exp}',
          f'--job_log_dir={job_log_dir}', *flags]


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
    with open(self.log_path, errors='replace') as f:
      return f.read()

  def wait_for_log(self, pattern: str, timeout: float = 180) -> re.Match:
    """Polls the log for a regex; raises TimeoutError (or RuntimeError if the process died)."""
    regex = re.compile(pattern)
    deadline = time.time() + timeout
    while time.time() < deadline:
      match = regex.search(self.log())
      if match:
        return match
      if self.proc.poll() is not None:
        raise RuntimeError(f'process exited {self.proc.returncode} before /{pattern}/ in {self.log_path}')
      time.sleep(0.1)
    raise TimeoutError(f'/{pattern}/ not in {self.log_path} after {timeout} s')

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
