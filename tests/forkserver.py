"""A Python process that imports paxml once, then runs each command it is sent in a forked child.

The bad-input rows that fail *after* paxml loads (an experiment's settings, a paxml flag) are each a real
`python -m <module> ARGS` run: their own process with its own pid, exit status, stdout and stderr, from
the same module code (`runpy`, as `-m` does). What the fork saves is importing paxml, jax and TensorFlow
again: ~10 CPU-seconds per command on these 2 cores, ~80 for the suite's rows. The rows that must fail
*before* paxml loads still start a fresh interpreter each (`-X importtime` shows what it imported).

Protocol, one JSON object per line: the test writes {module, args, env, cwd, stdout, stderr} to stdin,
the server answers with the child's exit code (as `subprocess` reports it: -N for a signal).
"""

import json
import os
import runpy
import subprocess
import sys
import traceback


def _preload() -> None:
  """What `pax_autockpt.main` imports after its own checks, in the same order (its lambda-source
  lookup first); `pax_autockpt.main` itself is not imported, since it defines its flags when run."""
  from pax_autockpt import lambda_source  # pylint: disable=g-import-not-at-top
  lambda_source.install()
  import importlib  # pylint: disable=g-import-not-at-top
  for module in ('jax', 'paxml.main'):
    importlib.import_module(module)


def _child(request: dict) -> int:
  """In the forked child: the command's working directory, environment and output files, then the
  module as `__main__`; returns its exit code."""
  os.chdir(request['cwd'])
  os.environ.clear()
  os.environ.update(request['env'])
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)
  for fd, path in ((1, request['stdout']), (2, request['stderr'])):
    os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
  sys.argv = [request['module'], *request['args']]
  try:
    runpy.run_module(request['module'], run_name='__main__', alter_sys=True)
    return 0
  except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
      return e.code or 0
    print(e.code, file=sys.stderr)  # what the interpreter does with sys.exit('message')
    return 1
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    return 1


def serve() -> None:
  _preload()
  print(json.dumps('ready'), flush=True)
  for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      code = 1
      try:
        code = _child(request)
      finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # pylint: disable=protected-access
    _, status = os.waitpid(pid, 0)
    print(json.dumps(os.waitstatus_to_exitcode(status)), flush=True)


class ForkServer:
  """The test side: starts the server in `env`, runs commands through it; `stop` closes its input (it
  ends there) and kills it if it has not ended within 30 s."""

  def __init__(self, env: dict[str, str], cwd: str):
    self._proc = subprocess.Popen([sys.executable, '-m', 'tests.forkserver'], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env, cwd=cwd)
    if self._answer() != 'ready':
      raise RuntimeError('the fork server did not start')

  def _answer(self):
    line = self._proc.stdout.readline()
    if not line:
      raise RuntimeError(f'the fork server exited ({self._proc.wait()})')
    return json.loads(line)

  def run(self, module: str, args: list[str], *, env: dict[str, str], cwd: str, stdout: str, stderr: str) -> int:
    request = dict(module=module, args=args, env=env, cwd=cwd, stdout=stdout, stderr=stderr)
    self._proc.stdin.write(json.dumps(request) + '\n')
    self._proc.stdin.flush()
    return self._answer()

  def stop(self) -> None:
    self._proc.stdin.close()
    try:
      self._proc.wait(30)
    except subprocess.TimeoutExpired:
      self._proc.kill()
      self._proc.wait()


if __name__ == '__main__':
  serve()
