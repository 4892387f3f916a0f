"""A Python process that imports paxml once, then runs each `python -m MODULE ARGS` it is sent in a forked child.

Most of a training process's start here is importing paxml, jax and TensorFlow: ~10 of the ~13 CPU-seconds
before its first step on these 2 cores, for each of the suite's dozens of processes. A command run through
this server is still a process of its own: its own pid and session (the test signals it, or its whole group,
like any other), its own working directory, environment, output files and exit status (`-N` for a signal,
as `subprocess` says), and the same module code run as `__main__` (`runpy`, as `-m` does). At its end the
child does what the interpreter does: joins its non-daemon threads, runs the `atexit` functions, flushes, and
an uncaught KeyboardInterrupt ends it by SIGINT. What is not the same is what happened before the fork: a
test about a signal that arrives *during* those imports, or of stock `paxml/main.py` (its flags are defined
by the import here), starts a fresh interpreter (`pax_autockpt.tools.process.Job`).

Variables read while jax and TensorFlow import (JAX_*, the gs:// client's settings) are the server's; a
command whose environment differs in any variable but those read later (`RUNTIME_VARIABLES`) gets a server
of its own (`server_for`).

Protocol, one JSON object per line. To the server: {module, args, env, cwd, stdout, stderr}. From it:
{"pid": N} for each command, in order, and {"exit": N, "code": C} when a child has ended.
"""

import atexit
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import traceback

from pax_autockpt.startup import standby
from pax_autockpt.tools import launcher
from pax_autockpt.tools import process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = 'pax_autockpt.main'
# Read after the fork: the key of `server_for` leaves them out (the product's standby processes, which import
# ahead of need as this server does, draw the same line).
RUNTIME_VARIABLES = standby.RUNTIME_VARIABLES


def _preload() -> None:
  """What `pax_autockpt.main` imports after its own checks (`pax_autockpt.startup.standby.preload`)."""
  standby.preload()


def _redirect(request: dict) -> None:
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  fds = {}
  for fd, path in ((1, request['stdout']), (2, request['stderr'])):
    if path not in fds:
      fds[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fds[path], fd)


def _child(request: dict) -> None:
  """In the forked child: a session of its own, the command's working directory, environment and output
  files, the module, then the interpreter's own ending. Never returns."""
  code = 1
  try:
    os.setsid()
    _redirect(request)  # first: until then the child's stdout is the server's answers
    os.chdir(request['cwd'])
    os.environ.clear()
    os.environ.update(request['env'])
    sys.path[0] = os.getcwd()  # what `python -m` puts first
    sys.argv = [request['module'], *request['args']]
    code = standby.run_as_main(request['module'])
  except BaseException:  # pylint: disable=broad-except  (before the module ran: say why, exit 1)
    traceback.print_exc()
  standby.end_as_the_interpreter_does(code)


def _say(message) -> None:
  os.write(1, (json.dumps(message) + '\n').encode())


def serve() -> None:
  """One thread only (a fork copies just the caller): reads commands, forks, reports each child's end;
  at the end of its input it kills the sessions of the children still running."""
  _preload()
  _say('ready')
  children, pending, open_input = set(), b'', True
  while open_input or children:
    readable, _, _ = select.select([0] if open_input else [], [], [], 0.05)
    if readable:
      data = os.read(0, 1 << 16)
      open_input = bool(data)
      pending += data
      while b'\n' in pending:
        line, pending = pending.split(b'\n', 1)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = standby.fork()
        if pid == 0:
          _child(json.loads(line))
        children.add(pid)
        _say({'pid': pid})
      if not open_input:
        for pid in children:
          _kill_session(pid)
    while children:
      pid, status = os.waitpid(-1, os.WNOHANG)
      if pid == 0:
        break
      children.discard(pid)
      _say({'exit': pid, 'code': os.waitstatus_to_exitcode(status)})


def _kill_session(pid: int) -> None:
  try:
    os.killpg(pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


class ForkedProcess(launcher._Forked):  # pylint: disable=protected-access
  """What the tests use of `subprocess.Popen`, for a child of the fork server (the launcher's view of a host its
  standby forked, with `wait` and `kill`; its output goes to files, not a pipe)."""

  def __init__(self, server: 'ForkServer', pid: int):
    super().__init__(server, pid, stdout=None)
    self._server = server

  def wait(self, timeout: float | None = None) -> int:
    self.returncode = self._server.exit_code(self.pid, wait=True, timeout=timeout)
    return self.returncode

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)


class ForkServer:
  """The test side: starts the server with `env` in `cwd`; `start` runs a command through it, `run` runs
  one to its end; `stop` closes its input (it kills what still runs and ends) and kills it if it has not
  ended within 30 s."""

  def __init__(self, env: dict[str, str], cwd: str = ROOT):
    own = {k: v for k, v in env.items() if not k.startswith('AUTOCKPT_FAULT_')}  # its children's faults, not its own
    self._proc = subprocess.Popen([sys.executable, '-m', 'tests.forkserver'], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, env=own, cwd=cwd)
    self._pids = queue.Queue()
    self._codes = {}
    self._ended = threading.Condition()
    self._send = threading.Lock()
    if self._proc.stdout.readline() != b'"ready"\n':
      raise RuntimeError(f'the fork server did not start ({self._proc.wait()})')
    threading.Thread(target=self._read, daemon=True, name='forkserver-reader').start()

  def _read(self) -> None:
    for line in self._proc.stdout:
      message = json.loads(line)
      if 'pid' in message:
        self._pids.put(message['pid'])
      else:
        with self._ended:
          self._codes[message['exit']] = message['code']
          self._ended.notify_all()
    with self._ended:
      self._codes[None] = 'the fork server exited'
      self._ended.notify_all()
    self._pids.put(None)

  def exit_code(self, pid: int, *, wait: bool = False, timeout: float | None = None) -> int | None:
    deadline = None if timeout is None else time.monotonic() + timeout
    with self._ended:
      while pid not in self._codes and wait:
        if None in self._codes:
          raise RuntimeError(f'the fork server exited before its child {pid}')
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
          raise subprocess.TimeoutExpired(f'pid {pid}', timeout)
        self._ended.wait(left)
      return self._codes.get(pid)

  def start(self, module: str, args: list[str], *, env: dict[str, str], cwd: str, stdout: str,
            stderr: str) -> ForkedProcess:
    request = dict(module=module, args=list(args), env=dict(env), cwd=os.path.abspath(cwd), stdout=stdout,
                   stderr=stderr)
    with self._send:
      self._proc.stdin.write((json.dumps(request) + '\n').encode())
      self._proc.stdin.flush()
      pid = self._pids.get(timeout=60)
    if pid is None:
      raise RuntimeError(f'the fork server exited ({self._proc.wait()})')
    return ForkedProcess(self, pid)

  def run(self, module: str, args: list[str], **kwargs) -> int:
    return self.start(module, args, **kwargs).wait()

  def stop(self) -> None:
    self._proc.stdin.close()
    try:
      self._proc.wait(30)
    except subprocess.TimeoutExpired:
      self._proc.kill()
      self._proc.wait()


_servers: dict[tuple, ForkServer] = {}
_servers_lock = threading.Lock()


# tests/conftest.py switches TensorFlow's gs:// caches off for the test process's own checks; every job
# started here runs with a user's settings (TensorFlow's defaults).
users_env = process.users_env


def server_for(env: dict[str, str]) -> ForkServer:
  """This process's server for `env` (variables read after the fork aside), started on first use."""
  key = tuple(sorted((k, v) for k, v in env.items() if not RUNTIME_VARIABLES.match(k)))
  with _servers_lock:
    if key not in _servers:
      if not _servers:
        atexit.register(stop_all)
      _servers[key] = ForkServer(env)
    return _servers[key]


def stop_all() -> None:
  with _servers_lock:
    for server in _servers.values():
      server.stop()
    _servers.clear()


class ForkedJob(process.Job):
  """A `process.Job` of `python -m pax_autockpt.main ARGS`, forked by a server that imported paxml."""

  def __init__(self, argv, log_path: str, env: dict[str, str] | None = None, cwd: str | None = None):  # pylint: disable=super-init-not-called
    self.argv = list(argv)
    self.log_path = log_path
    self.started = time.time()
    env = users_env(env)
    self.proc = server_for(env).start(argv[2], argv[3:], env=env, cwd=cwd or os.getcwd(), stdout=log_path,
                                      stderr=log_path)


def job(argv, log_path: str, env: dict[str, str] | None = None, cwd: str | None = None) -> process.Job:
  """`process.Job(argv, ...)`, forked from a server when it runs `python -m pax_autockpt.main`."""
  if list(argv[:3]) == [sys.executable, '-m', MAIN]:
    return ForkedJob(argv, log_path, env=env, cwd=cwd)
  return process.Job(argv, log_path, env=users_env(env), cwd=cwd)


if __name__ == '__main__':
  serve()
