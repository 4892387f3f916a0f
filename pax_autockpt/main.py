r"""Drop-in for paxml/main.py that is preemption-safe by default.

  python -m pax_autockpt.main --exp=experiments.lm_cloud_autockpt.LmCloudSpmdTinyAutockpt \
      --job_log_dir=/tmp/job

Same flags as paxml/main.py, with --jax_fully_async_checkpoint and --exit_after_ondemand_checkpoint
defaulting to true, --tensorstore_use_ocdbt to true for a gs:// job directory,
--host_idx/--num_hosts/--server_addr derived when not given (pax_autockpt.hosts.hosts),
and the --autockpt_* flags of pax_autockpt.settings.
"""

# Before the heavy imports below (~7 s): a SIGTERM from now on is recorded, not fatal, and the
# checks that need no paxml fail fast.
import sys  # pylint: disable=g-bad-import-order

from pax_autockpt.startup import environment  # pylint: disable=g-bad-import-order

_UNFIT = environment.problem()
if _UNFIT:  # one line, not a traceback, from an interpreter without paxml's environment
  print(f'error: {_UNFIT}', file=sys.stderr, flush=True)
  sys.exit(2)

from pax_autockpt import settings as settings_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from pax_autockpt.signals import signals
from pax_autockpt.startup import precheck


def _fail(message: str, code: int = 2) -> None:
  """Bad input: one line on stderr, exit 2, nothing written (1: a failure a rerun may cure)."""
  print(f'error: {message}', file=sys.stderr, flush=True)
  sys.exit(code)


signals.install()
if __name__ == '__main__':
  try:
    precheck.run(sys.argv)
  except settings_lib.ConfigError as e:
    _fail(str(e))
  except precheck.hosts.MetadataUnavailable as e:
    _fail(str(e), code=1)
  except precheck.PrintWiring as e:
    print(e, flush=True)
    sys.exit(0)
  except precheck.PrintHelp as e:
    print(f'{__doc__.strip()}\n\n{e}', flush=True)
    sys.exit(0)

# pylint: disable=g-import-not-at-top,wrong-import-position
from pax_autockpt.startup import lambda_source

lambda_source.install()  # ~3 s off importing paxml just below

import contextlib
import importlib.metadata
import os
import re

from absl import app
from absl import flags
from absl import logging
from etils import epath
from fiddle import absl_flags
from fiddle._src.absl_flags import flags as fdl_flags  # rewrite_fdl_args: what absl_flags.flags_parser applies
import jax
from paxml import experiment_registry
from paxml import main as pax_main

from pax_autockpt import layout
from pax_autockpt.exit import compile_on_exit
from pax_autockpt.hosts import hosts
from pax_autockpt.hosts import mesh
from pax_autockpt.local import lock
from pax_autockpt.shared import failures
from pax_autockpt.shared import stops
from pax_autockpt.startup import compilation_cache
from pax_autockpt.startup import experiment_names
from pax_autockpt.startup import startup_times

startup_times.mark(startup_times.IMPORTED)  # process start -> here: the `start` event's imported_s

FLAGS = flags.FLAGS
TENSORSTORE_FIXED = '0.1.59'  # the Makefile installs this one over paxml's pin

settings_lib.define_flags()
flags.DEFINE_bool('autockpt_print_wiring', False, precheck.PRINT_WIRING_HELP)


def _resolve_wiring() -> hosts.Wiring:
  try:
    return hosts.resolve(host_idx=FLAGS.host_idx, num_hosts=FLAGS.num_hosts,
                         server_addr=FLAGS.server_addr)
  except hosts.MetadataUnavailable as e:
    _fail(str(e), code=1)
  except hosts.WiringError as e:
    _fail(str(e))


def _check_experiment(wiring: hosts.Wiring) -> settings_lib.Settings | None:
  """Resolves --exp and its autockpt settings now, so that a typo costs no paxml start-up and a missing
  --exp leaves no job directory behind (paxml would create it first). The settings, where it has them."""
  if FLAGS.exp is None:
    if FLAGS.fdl is None and not absl_flags.fdl_flags_supplied():
      _fail(precheck.EXP_REQUIRED)
    return None
  try:
    with _RegistrationsUnprinted():
      experiment = pax_main.get_experiment(FLAGS.exp)()
  except ValueError as e:
    _fail(experiment_names.not_registered(FLAGS.exp, e, experiment_registry.get_all()))
  if not hasattr(experiment, 'autockpt_settings'):
    return None
  try:
    settings = experiment.autockpt_settings()
    _check_local_dir(settings.local_dir, type(experiment).__name__, wiring)
  except settings_lib.ConfigError as e:
    _fail(str(e))
  return settings


def _check_local_dir(local_dir: str, experiment: str, wiring: hosts.Wiring) -> None:
  """precheck's local-directory check again, for what it could not see (an AUTOCKPT_LOCAL_DIR attribute, a
  --flagfile): before the job directory is touched, not at the first local save's mkdir."""
  given = FLAGS['autockpt_local_dir'].present
  problem = local_dir and precheck.local_dir_unusable(
      local_dir, wiring.host_idx, wiring.num_hosts, wiring.server_addr,
      name='--autockpt_local_dir' if given else f'{experiment}.AUTOCKPT_LOCAL_DIR')
  if problem:
    _fail(problem)
  if local_dir:  # held from now on (a no-op where precheck took it): a second live job stops here, exit 2
    try:
      lock.hold(layout.local_dir(local_dir, wiring.host_idx or 0), FLAGS.job_log_dir, wiring.host_idx or 0)
    except settings_lib.ConfigError as e:
      _fail(str(e))


class _RegistrationsUnprinted:
  """stderr without paxml's `Registered experiment ...` line per class (27 lines before every start of a
  registered experiment here, and before its one-line error), while --exp's module is imported; any
  other output passes."""

  def __init__(self):
    self._stream, self._line = sys.stderr, ''

  def write(self, text: str) -> int:
    *lines, self._line = (self._line + text).split('\n')
    for line in lines:
      if not line.startswith('Registered experiment `'):
        self._stream.write(line + '\n')
    return len(text)

  def flush(self) -> None:
    self._stream.flush()

  def __getattr__(self, name: str):
    return getattr(self._stream, name)  # isatty(), fileno(), encoding, ...

  def __enter__(self):
    sys.stderr = self
    return self

  def __exit__(self, *exc_info) -> None:
    sys.stderr = self._stream
    self._stream.write(self._line)


def _check_job_log_dir() -> None:
  """Creates the job directory (as paxml would) or fails with precheck's line (which found most such
  directories before paxml loaded); runs after every other check passed."""
  if FLAGS.job_log_dir is None:
    _fail(precheck.JOB_REQUIRED)
  path = os.fspath(FLAGS.job_log_dir)
  if layout.is_object_store(path):
    _default_format_for_object_storage()
    return
  with contextlib.suppress(OSError):  # what stopped it, the probe below names
    os.makedirs(path, exist_ok=True)
  problem = precheck.job_dir_unwritable(path)
  if problem:
    _fail(problem)
  # orbax refuses relative paths for OCDBT checkpoints: every save would fail.
  FLAGS.job_log_dir = epath.Path(os.path.abspath(path))


def _default_format_for_object_storage() -> None:
  """OCDBT on gs:// unless --tensorstore_use_ocdbt is given: a bucket pays per request, and one
  key-value database per checkpoint takes a tiny state's save from ~570 requests to ~80 and from 12 s to
  2 s at 30 ms per request (make bench, formats_gcs30). Checkpoints in the other format still restore:
  orbax reads each checkpoint's own format."""
  if not FLAGS['tensorstore_use_ocdbt'].present:
    FLAGS.tensorstore_use_ocdbt = True
    logging.info('[autockpt] gs:// job directory: OCDBT checkpoints (--tensorstore_use_ocdbt=false for zarr).')


def _warn_if_tensorstore_spins() -> None:
  """tensorstore 0.1.55-0.1.58 (paxml 1.4.0 pins 0.1.55) keeps one thread spinning in futex calls
  for 20 s after every use of its thread pool, i.e. a whole core for as long as checkpoints are being
  written (measured here: 7.3 s of system CPU per process start, 10 s per idle 10 s after a write);
  0.1.59 fixed it and works with orbax 0.5.9 and jax 0.4.26 (the whole suite passes on it)."""
  installed = importlib.metadata.version('tensorstore')
  if (0, 1, 55) <= tuple(int(x) for x in re.findall(r'\d+', installed)[:3]) < (0, 1, 59):
    logging.warning('[autockpt] tensorstore %s spins a CPU core for 20 s after each checkpoint I/O: '
                    "pip install --no-deps 'tensorstore==%s' (make venv does).", installed, TENSORSTORE_FIXED)


def _use_compilation_cache(settings: settings_lib.Settings | None, wiring: hosts.Wiring) -> None:
  """JAX's persistent compilation cache under the job directory, unless the user named JAX's own or set
  --autockpt_compilation_cache (AUTOCKPT_COMPILATION_CACHE): after the flags are parsed (JAX's own are
  applied then), before paxml's first compile."""
  setting = settings.compilation_cache if settings else FLAGS.autockpt_compilation_cache or compilation_cache.AUTO
  compile_on_exit.watch()  # counts compiles and cache loads from here on (the `first_step` event's)
  compilation_cache.use(setting, os.fspath(FLAGS.job_log_dir), prune=not wiring.host_idx)


def main(argv):
  wiring = _resolve_wiring()
  if FLAGS.autockpt_print_wiring:
    print(wiring.line(), flush=True)
    return 0
  settings = _check_experiment(wiring)
  _check_job_log_dir()
  FLAGS.host_idx, FLAGS.num_hosts, FLAGS.server_addr = (
      wiring.host_idx, wiring.num_hosts, wiring.server_addr)
  if wiring.source == 'local':
    # The one-host coordinator listens on loopback only (jax's default binds every address).
    os.environ.setdefault('JAX_COORDINATOR_BIND_ADDRESS', wiring.server_addr)
  if wiring.num_hosts > 1 and not (FLAGS.jax_fully_async_checkpoint or FLAGS.multiprocess_gpu):
    _fail(precheck.no_distributed(wiring.num_hosts))  # (a --flagfile hides it from precheck)
  if wiring.num_hosts > 1:
    # CPU hosts need Gloo for cross-process collectives; other platforms ignore it.
    jax.config.update('jax_cpu_enable_gloo_collectives', True)
  logging.info('[autockpt] %s', wiring.line())
  _use_compilation_cache(settings, wiring)
  _warn_if_tensorstore_spins()
  mesh.use_process_group_slices()  # GPU multislice: slices are process groups
  startup_times.mark(startup_times.JAX_SETUP)  # -> the experiment's validate(): setup_jax, distributed_s
  try:
    pax_main.main(argv)
  except stops.RestoreFailed as e:  # before the executor exists (listing the checkpoints): one line
    _fail(f'{e}; exiting 1.', code=1)
  except Exception as e:  # pylint: disable=broad-except
    if failures.classify(e) is not failures.Kind.TRANSIENT:
      raise  # a bug or bad input keeps its traceback
    # The storage stopped answering (e.g. orbax's start-up clean-up asking `exists` through an outage, after
    # TensorFlow's ~200 s of retries): nothing was moved or marked, a rerun once it answers resumes.
    logging.debug('[autockpt] the storage error in full', exc_info=True)
    _fail(f'the job directory\'s storage did not answer ({failures.one_line(e)}); nothing was moved or marked: rerun '
          'the same command once it answers; exiting 1.', code=1)
  return 0


def _parse_flags(argv: list[str]) -> list[str]:
  """Fiddle's parser, as paxml's main uses, but a flag error is bad input: exit 2, one line (absl: exit 1,
  a FATAL line and a pointer to --helpfull)."""
  try:
    return FLAGS(fdl_flags.rewrite_fdl_args(argv))
  except flags.UnrecognizedFlagError as e:
    _fail(precheck.unknown_flag(e.flagname, list(FLAGS)))
  except (flags.Error, ValueError) as e:
    _fail(' '.join(str(e).split()))


def run() -> None:
  FLAGS.set_default('jax_fully_async_checkpoint', True)
  FLAGS.set_default('exit_after_ondemand_checkpoint', True)
  jax.config.config_with_absl()  # as paxml/main.py: --jax_* flags on the command line
  app.run(main, flags_parser=_parse_flags)


if __name__ == '__main__':
  run()
