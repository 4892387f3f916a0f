"""The checks that need no paxml, run before it is imported: a typo costs half a second, not a
TensorFlow start-up on every host.

Best effort on purpose: it reads only the `--name=value` / `--name value` forms of the flags it
checks and gives up on anything else (e.g. --flagfile); pax_autockpt.main repeats every check on
absl's parsed flags, so nothing depends on this module catching a problem. It raises ConfigError;
the entry point prints it and exits 2. It also answers --help, which absl could only answer after
paxml is imported, and without the --autockpt_* flags.
"""

import difflib
import os

from pax_autockpt import settings as settings_lib
from pax_autockpt.hosts import hosts
from pax_autockpt.local import lock
from pax_autockpt.startup import environment
from pax_autockpt.startup import experiment_names

PRINT_WIRING_HELP = 'Print the resolved host_idx/num_hosts/server_addr line and exit 0.'
EXP_REQUIRED = f'--exp is required: e.g. --exp={experiment_names.EXAMPLE}'
JOB_REQUIRED = '--job_log_dir is required: the directory for checkpoints and logs (local or gs://)'
# The flags of pax_autockpt.main that mean something before paxml is imported, for --help.
MAIN_FLAGS = {
    '--exp=MODULE.CLASS': f'the registered experiment to train (required), e.g. {experiment_names.EXAMPLE}',
    '--job_log_dir=DIR': 'checkpoints, logs and the event log, local or gs:// (required)',
    '--host_idx=INT --num_hosts=INT --server_addr=HOST:PORT': (
        'host wiring for jax.distributed; derived (one local host, Cloud TPU, multislice, Slurm) when all '
        'three are left out'),
    '--[no]autockpt_print_wiring': PRINT_WIRING_HELP,
}

_SETTING_FLAGS = {settings_lib.flag_name(f): f for f in settings_lib.FIELDS if settings_lib.flag_name(f)}
_TYPES = {'host_idx': int, 'num_hosts': int, 'server_addr': str, 'job_log_dir': str, 'exp': str,
          'autockpt_print_wiring': bool, 'jax_fully_async_checkpoint': bool, 'multiprocess_gpu': bool,
          **{flag: settings_lib.flag_type(field) for flag, field in _SETTING_FLAGS.items()}}
_TRUE = ('', 'true', '1', 't', 'yes')
_HELP = ('--help', '-help', '--helpshort', '-helpshort', '-h', '-?')
_ABSL_HELP = ('--helpfull', '-helpfull', '--helpxml', '-helpxml')  # absl's, after paxml defined its flags


def no_distributed(num_hosts: int) -> str:
  """The error line for several hosts with paxml told not to start jax.distributed."""
  return (f'--jax_fully_async_checkpoint=false on {num_hosts} hosts: paxml then starts no jax.distributed, which '
          'hosts need to train together (the CPU backend fails to start): leave the flag out (pax-autockpt turns '
          'it on)')


class PrintWiring(Exception):
  """--autockpt_print_wiring with a wiring that needs no paxml: print this line and exit 0."""


class PrintHelp(Exception):
  """--help: print this text after main's docstring and exit 0."""


def usage() -> str:
  """The flags part of --help: main's own, then every --autockpt_* setting with its default."""
  lines = ['Flags (--helpfull lists every flag of paxml, jax and absl too, after importing paxml):']
  for head, meaning in MAIN_FLAGS.items():
    lines += settings_lib.help_entry(head, meaning)
  lines += ['', 'Autocheckpoint settings: each also an experiment class attribute AUTOCKPT_<NAME>; a flag given '
            'wins over it.', *settings_lib.flag_help()]
  objects = [settings_lib.attribute(f) for f in settings_lib.FIELDS if not settings_lib.flag_name(f)]
  lines += ['', f'Class attributes only (policy objects): {", ".join(objects)}; see docs/settings.md.']
  return '\n'.join(lines)


def _args(argv: list[str]) -> list[str]:
  """The arguments absl reads flags from: up to a `--`."""
  args = argv[1:]
  return args[:args.index('--')] if '--' in args else args


def _names(argv: list[str]) -> list[str]:
  return [arg.lstrip('-').partition('=')[0] for arg in _args(argv) if arg.startswith('-')]


def given(argv: list[str]) -> dict[str, str] | None:
  """The checked flags as written on the command line; None when it cannot tell for sure."""
  out, args, i = {}, _args(argv), 0
  while i < len(args):
    arg = args[i]
    if arg.startswith(('--flagfile', '-flagfile')):
      return None
    name, eq, value = arg.lstrip('-').partition('=')
    if _TYPES.get(name) is bool:
      out[name] = 'true' if value.lower() in _TRUE else 'false'
    elif name.startswith('no') and _TYPES.get(name[2:]) is bool and not eq:
      out[name[2:]] = 'false'
    elif name in _TYPES:
      if not eq:
        if i + 1 >= len(args):
          return None
        i, value = i + 1, args[i + 1]
      out[name] = value
    i += 1
  return out


def unknown_flag(name: str, known: list[str]) -> str:
  """The one line for a flag nobody defines, with the closest `known` name (or its --no form)."""
  close = difflib.get_close_matches(name, known + [f'no{k}' for k in known], n=1, cutoff=0.75)
  hint = (f'did you mean --{close[0]}?' if close else
          f'{environment.command("python")} -m pax_autockpt.main --help lists the flags')
  return f'unknown flag --{name}: {hint}'


def _check_flag_names(argv: list[str]) -> None:
  """An unknown --autockpt_* name is a typo for sure: no paxml, jax or absl flag has that prefix. Other
  unknown names wait for absl (after paxml defines its hundreds of flags)."""
  known = [*_SETTING_FLAGS, 'autockpt_print_wiring']
  for name in _names(argv):
    base = name[2:] if name.startswith('noautockpt_') else name
    if base.startswith('autockpt_') and base not in known:
      raise settings_lib.ConfigError(unknown_flag(name, known + ['exp', 'job_log_dir', 'host_idx', 'num_hosts',
                                                                 'server_addr']))


def _typed(values: dict[str, str]) -> dict[str, object]:
  typed = {}
  for name, value in values.items():
    kind = _TYPES[name]
    if kind is bool:
      typed[name] = value == 'true'
      continue
    try:
      typed[name] = kind(value)
    except ValueError:
      field = _SETTING_FLAGS.get(name)
      fix = (field and settings_lib.fix_for(field, value, f'--{name}')) or 'fix the value'
      raise settings_lib.ConfigError(
          f'--{name}={value} is not {"an integer" if kind is int else "a number"}: {fix}') from None
  return typed


def _required(name: str, message: str, argv: list[str]) -> settings_lib.ConfigError:
  """A missing required flag, naming a given flag that looks like its misspelling."""
  near = difflib.get_close_matches(name, _names(argv), n=1, cutoff=0.8)
  return settings_lib.ConfigError(f'{message}; --{near[0]} was given: a misspelling?' if near else message)


def _check_required(values: dict[str, str], argv: list[str]) -> None:
  """--exp (or a Fiddle config, paxml's other way in) and --job_log_dir, before anything is created."""
  if not values.get('exp') and not any(name.startswith('fdl') for name in _names(argv)):
    raise _required('exp', EXP_REQUIRED, argv)
  if not values.get('job_log_dir'):
    raise _required('job_log_dir', JOB_REQUIRED, argv)


def _unwritable(path: str, itself: str = 'it') -> str | None:
  """Why a directory cannot be made or written at `path` (`itself`: how the reason names `path` when it is a
  file), else None. Tried for real (root passes os.access() on /proc) without making it: a directory made
  and removed in it, or in its nearest existing parent."""
  path = existing = os.path.abspath(path)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    return f'{itself if existing == path else existing} is a file'
  probe = os.path.join(existing, f'.autockpt-probe-{os.getpid()}')
  try:
    os.mkdir(probe)
    os.rmdir(probe)
  except OSError as e:
    return e.strerror
  return None


def job_dir_unwritable(job: str) -> str | None:
  """The error line for a local job directory that cannot be made or written, else None."""
  why = _unwritable(job)
  return why and f'--job_log_dir={job} is not writable ({why}): choose a directory you can write to.'


def _on_loopback(server_addr: str | None) -> bool:
  """Whether the coordinator listens on loopback: then every host of the job runs on this machine."""
  host = (server_addr or '').rpartition(':')[0].strip('[]')
  return host == 'localhost' or host.startswith('127.') or host == '::1'


def local_dir_unusable(template: str, host: int, num_hosts: int, server_addr: str | None,
                       name: str = '--autockpt_local_dir') -> str | None:
  """The error line for a local tier this host cannot use, else None: several hosts on one machine sharing one
  directory (no `{host}`: they would delete each other's steps), or a directory that cannot be made or written
  (else made at the first local save, after paxml started and wrote the job directory: a traceback)."""
  if num_hosts > 1 and '{host}' not in template and _on_loopback(server_addr):
    return (f'{name}={template} has no {{host}} and the {num_hosts} hosts share this machine (--server_addr='
            f'{server_addr}): each would write the same directory; put {{host}} in it, e.g. '
            f'{template.rstrip("/")}-{{host}}')
  mine = template.replace('{host}', str(host))
  why = _unwritable(mine, itself=mine)
  return why and f"{name}={template} is not writable ({why}): choose a directory on this host's own disk."


def run(argv: list[str]) -> None:
  """Raises PrintHelp for --help; ConfigError on an unknown --autockpt_* flag, a missing required flag, a
  wiring, flag-value or job-directory error or an --exp whose module does not exist; PrintWiring for
  --autockpt_print_wiring when the answer needs no paxml."""
  if any(arg in _HELP for arg in _args(argv)):
    raise PrintHelp(usage())
  if any(arg in _ABSL_HELP for arg in _args(argv)):
    return
  _check_flag_names(argv)
  values = given(argv)
  if values is None:
    return
  flag = _typed(values)
  try:
    wiring = hosts.resolve(host_idx=flag.get('host_idx'), num_hosts=flag.get('num_hosts'),
                           server_addr=flag.get('server_addr'), free_port=lambda: 0)
  except hosts.MetadataUnavailable:
    raise
  except hosts.WiringError as e:
    raise settings_lib.ConfigError(str(e)) from None
  if flag.get('autockpt_print_wiring') and wiring.source != 'local':
    raise PrintWiring(wiring.line())
  if (wiring.num_hosts or 1) > 1 and flag.get('jax_fully_async_checkpoint') is False and \
      not flag.get('multiprocess_gpu'):
    raise settings_lib.ConfigError(no_distributed(wiring.num_hosts))
  if not flag.get('autockpt_print_wiring'):
    _check_required(values, argv)
  fields = {field: flag[name] for name, field in _SETTING_FLAGS.items() if name in flag}
  settings_lib.validate_values(settings_lib.Settings(**fields),
                               {field: f'--{name}' for name, field in _SETTING_FLAGS.items()})
  job = flag.get('job_log_dir')
  problem = job_dir_unwritable(job) if job and '://' not in job else None
  if problem:
    raise settings_lib.ConfigError(problem)
  local = flag.get('autockpt_local_dir')
  problem = local and local_dir_unusable(local, wiring.host_idx or 0, wiring.num_hosts or 1, wiring.server_addr)
  if problem:
    raise settings_lib.ConfigError(problem)
  if local and job:  # another live job on it: exit 2 now, ~1 s in, not after paxml's start-up
    lock.hold(local.replace('{host}', str(wiring.host_idx or 0)), job, wiring.host_idx or 0)
  missing = experiment_names.unknown(values['exp']) if values.get('exp') else None
  if missing:
    raise settings_lib.ConfigError(missing)
