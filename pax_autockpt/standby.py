"""A host process that imported paxml, jax and TensorFlow before it was needed: a restart without the imports.

`pax-autockpt launch --max_restarts N` keeps one standby per host while the job runs. Importing is most of a
host's start on these CPUs (~7-11 s of the ~13-20 s before its first step, at every start, so at every restart),
and it does not depend on the run: a standby does it ahead of the failure, then waits for one line on stdin —
the host's arguments and environment, as JSON — and becomes that host (`python -m pax_autockpt.main ARGS`, run
as `__main__`, as `-m` runs it; its exit is the interpreter's own).

jax's backend is not started before the line comes (the host's `jax.distributed.initialize` must come first).
Variables jax and TensorFlow read while importing must be the standby's: a host environment that differs in any
other than `RUNTIME_VARIABLES` (read later) gets a fresh interpreter instead (`stale`; the launcher checks, and
the standby exits `STALE_EXIT` if it is handed one anyway).
"""

import importlib
import json
import os
import re
import runpy
import sys
import time

from pax_autockpt import startup_times

# Read after the imports (by pax_autockpt, when XLA's backend starts, or when jax.distributed starts).
RUNTIME_VARIABLES = re.compile(r'AUTOCKPT_|XLA_FLAGS$|JAX_COORDINATOR_BIND_ADDRESS$|GCE_METADATA_HOST$|'
                               r'PYTEST_|MEGASCALE_|TPU_WORKER_|SLURM_')
READY = b'[pax_autockpt.standby] ready\n'  # on stdout once the imports are done: the launcher waits for it
STALE_EXIT = 75  # EX_TEMPFAIL: handed an environment its imports did not see; nothing was started
MAIN = 'pax_autockpt.main'
_STARTED_WITH = dict(os.environ)  # before the imports, some of which set variables of their own


def preload() -> None:
  """What `pax_autockpt.main` imports after its own checks, in the same order (its lambda-source lookup
  first), and the program hook its experiments import. `pax_autockpt.main` itself is not imported: it
  defines its flags when it runs."""
  from pax_autockpt import lambda_source  # pylint: disable=g-import-not-at-top
  lambda_source.install()
  for module in ('jax', 'paxml.main', 'fiddle.absl_flags', 'etils.epath', 'pax_autockpt.hosts',
                 'pax_autockpt.mesh', 'pax_autockpt.outcomes', 'pax_autockpt.experiment'):
    importlib.import_module(module)


def stale(imported_with: dict[str, str], host_env: dict[str, str]) -> list[str]:
  """The variables, other than RUNTIME_VARIABLES, whose value differs between the two environments."""
  names = {n for n in (*imported_with, *host_env) if not RUNTIME_VARIABLES.match(n)}
  return sorted(n for n in names if imported_with.get(n) != host_env.get(n))


def request(argv: list[str], env: dict[str, str]) -> bytes:
  """The line that makes a standby the host `python -m pax_autockpt.main ARGV` with environment `env`."""
  return (json.dumps({'argv': list(argv), 'env': dict(env)}) + '\n').encode()


def _become(line: bytes) -> None:
  """Runs pax_autockpt.main as the host the line asks for; the start-up it reports begins now."""
  asked = json.loads(line)
  if stale(_STARTED_WITH, asked['env']):
    sys.exit(STALE_EXIT)
  startup_times.started_at(time.time())
  null = os.open(os.devnull, os.O_RDONLY)
  os.dup2(null, 0)  # as the launcher starts a host: stdin is /dev/null
  for name in {*_STARTED_WITH, *asked['env']}:  # the runtime ones (the rest are equal): as a fresh start's
    if name in asked['env']:
      os.environ[name] = asked['env'][name]
    else:
      os.environ.pop(name, None)
  sys.argv = [MAIN, *asked['argv']]
  runpy.run_module(MAIN, run_name='__main__', alter_sys=True)


def main() -> None:
  preload()
  sys.stdout.flush()
  sys.stderr.flush()
  os.write(1, READY)
  line = sys.stdin.buffer.readline()
  if not line.strip():
    return  # the launcher ended without a restart: nothing to do
  _become(line)


if __name__ == '__main__':
  main()
