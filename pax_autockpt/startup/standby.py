"""One process per `pax-autockpt launch` that imports paxml, jax and TensorFlow once and forks every host.

Importing is most of a host's start on these CPUs (~7-20 s before its first step, at every start, for every
host: N local hosts importing the same modules N times on the same cores). The launcher starts one standby;
once its imports are done it forks each host the launcher asks for, at the first start and at every restart
(`--max_restarts`), and the child becomes that host: `python -m pax_autockpt.main ARGS` run as `__main__` (as
`-m` runs it) in a session of its own, with the host's environment, stdin /dev/null, its output on the pipe the
launcher passed, SIGTERM if the standby dies (which gets SIGTERM if the launcher dies), and the interpreter's
own ending (`run_as_main`, `end_as_the_interpreter_does`).

jax's backend is never started here (each host's `jax.distributed.initialize` must come first). Variables jax
and TensorFlow read while importing must be the standby's: a host environment that differs in any other than
`RUNTIME_VARIABLES` (read later) gets a fresh interpreter instead (`stale`; the launcher checks).

Protocol. Requests on fd 0, a SOCK_SEQPACKET Unix socket: one JSON object {argv, env} per message, the write
end of the host's output pipe attached (SCM_RIGHTS). Answers on stdout, one JSON value per line: "ready" once
the imports are done, {"pid": N} for each request in order, {"exit": N, "code": C} when a host ended (C as
`subprocess` gives it: -S for signal S). The end of the requests ends the standby once its hosts have ended.
"""

import atexit
import ctypes
import importlib
import json
import os
import re
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback
import warnings

from pax_autockpt.startup import startup_times

# Read after the imports (by pax_autockpt, when XLA's backend starts, or when jax.distributed starts).
RUNTIME_VARIABLES = re.compile(r'AUTOCKPT_|XLA_FLAGS$|JAX_COORDINATOR_BIND_ADDRESS$|GCE_METADATA_HOST$|'
                               r'PYTEST_|MEGASCALE_|TPU_WORKER_|SLURM_')
READY = 'ready'
MAIN = 'pax_autockpt.main'
MAX_REQUEST_BYTES = 1 << 20  # one host's arguments and environment
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def preload() -> None:
  """What `pax_autockpt.main` imports after its own checks, in the same order (its lambda-source lookup
  first), and the program hook its experiments import. `pax_autockpt.main` itself is not imported: it
  defines its flags when it runs."""
  from pax_autockpt.startup import lambda_source  # pylint: disable=g-import-not-at-top
  lambda_source.install()
  for module in ('jax', 'paxml.main', 'fiddle.absl_flags', 'etils.epath', 'pax_autockpt.hosts.hosts',
                 'pax_autockpt.hosts.mesh', 'pax_autockpt.shared.stops', 'pax_autockpt.experiment'):
    importlib.import_module(module)


def stale(imported_with: dict[str, str], host_env: dict[str, str]) -> list[str]:
  """The variables, other than RUNTIME_VARIABLES, whose value differs between the two environments."""
  names = {n for n in (*imported_with, *host_env) if not RUNTIME_VARIABLES.match(n)}
  return sorted(n for n in names if imported_with.get(n) != host_env.get(n))


def request(argv: list[str], env: dict[str, str]) -> bytes:
  """The message that asks for the host `python -m pax_autockpt.main ARGV` with environment `env`."""
  return json.dumps({'argv': list(argv), 'env': dict(env)}).encode()


def fork() -> int:
  """os.fork, where jax has not started its backend (its threads would not be in the child): jax warns of
  a deadlock at every fork once imported, which is not so here; the child gets the warning filters back."""
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  if xla_bridge._backends:  # pylint: disable=protected-access
    raise RuntimeError('jax started a backend before a fork')
  filters = list(warnings.filters)
  warnings.filterwarnings('ignore', message=r'os\.fork\(\) was called', category=RuntimeWarning)
  pid = os.fork()
  warnings.filters[:] = filters
  warnings._filters_mutated()  # pylint: disable=protected-access
  return pid


def run_as_main(module: str) -> int:
  """The module as `__main__`; its exit code as the interpreter would give it (-SIGINT: an uncaught
  KeyboardInterrupt, which `end_as_the_interpreter_does` turns into death by SIGINT)."""
  try:
    runpy.run_module(module, run_name='__main__', alter_sys=True)
    return 0
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      return e.code or 0
    print(e.code, file=sys.stderr)  # what the interpreter does with sys.exit('message')
    return 1
  except KeyboardInterrupt:
    traceback.print_exc()
    return -signal.SIGINT
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    return 1


def end_as_the_interpreter_does(code: int) -> None:
  """A forked child's ending: non-daemon threads joined, `atexit` functions run, output flushed, then the
  exit code (or death by SIGINT). Never returns."""
  try:
    threading._shutdown()  # pylint: disable=protected-access
    atexit._run_exitfuncs()  # pylint: disable=protected-access
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    if code == -signal.SIGINT:
      signal.signal(signal.SIGINT, signal.SIG_DFL)
      os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)  # pylint: disable=protected-access


def sigterm_when_parent_dies(parent: int) -> None:
  """Linux: SIGTERM to this process when `parent` dies (even by SIGKILL), so that a host saves at the agreed
  step and exits instead of training on as an orphan."""
  if sys.platform.startswith('linux'):
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # died before the call
      os.kill(os.getpid(), signal.SIGTERM)


def _host(asked: dict, output: int, parent: int) -> None:
  """In the forked child: becomes the host `asked` names. Never returns."""
  code = 1
  try:
    os.setsid()
    sigterm_when_parent_dies(parent)
    for fd in (1, 2):
      os.dup2(output, fd)
    os.close(output)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # as a fresh host's: stdin is /dev/null
    startup_times.started_at(time.time())
    os.environ.clear()
    os.environ.update(asked['env'])
    sys.argv = [MAIN, *asked['argv']]
    code = run_as_main(MAIN)
  except BaseException:  # pylint: disable=broad-except  (before the module ran: say why, exit 1)
    traceback.print_exc()
  end_as_the_interpreter_does(code)


def _say(answers: int, message) -> None:
  os.write(answers, (json.dumps(message) + '\n').encode())


def serve() -> None:
  """One thread only (a fork copies just the caller): imports, then forks a host per request and reports each
  host's end; returns at the end of the requests once every host it forked has ended."""
  requests = socket.socket(fileno=0)
  answers = os.dup(1)
  os.dup2(2, 1)  # what the imports print goes to the standby's log, not into its answers
  preload()
  sys.stdout.flush()
  sys.stderr.flush()
  _say(answers, READY)
  hosts, open_input = set(), True
  while open_input or hosts:
    if open_input and select.select([requests], [], [], 0.05)[0]:
      message, fds, _, _ = socket.recv_fds(requests, MAX_REQUEST_BYTES, 1)
      open_input = bool(message)
      if message:
        pid = fork()
        if pid == 0:
          requests.close()
          os.close(answers)
          _host(json.loads(message), fds[0], os.getppid())
        os.close(fds[0])
        hosts.add(pid)
        _say(answers, {'pid': pid})
    elif not open_input:
      time.sleep(0.05)
    hosts -= _reap(answers)


def _reap(answers: int) -> set[int]:
  """The hosts that ended since the last call, each reported."""
  ended = set()
  while True:
    try:
      pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return ended
    if pid == 0:
      return ended
    ended.add(pid)
    _say(answers, {'exit': pid, 'code': os.waitstatus_to_exitcode(status)})


if __name__ == '__main__':
  serve()
