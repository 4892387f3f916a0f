"""The checks that need no paxml, run before it is imported: a typo costs half a second, not a
TensorFlow start-up on every host.

Best effort on purpose: it reads only the `--name=value` / `--name value` forms of the flags it
checks and gives up on anything else (e.g. --flagfile); pax_autockpt.main repeats every check on
absl's parsed flags, so nothing depends on this module catching a problem. It raises ConfigError;
the entry point prints it and exits 2.
"""

import os

from pax_autockpt import hosts
from pax_autockpt import settings as settings_lib

_SETTING_FLAGS = {settings_lib.flag_name(f): f for f in settings_lib.FIELDS if settings_lib.flag_name(f)}
_TYPES = {'host_idx': int, 'num_hosts': int, 'server_addr': str, 'job_log_dir': str,
          'autockpt_print_wiring': bool,
          **{flag: settings_lib.flag_type(field) for flag, field in _SETTING_FLAGS.items()}}
_TRUE = ('', 'true', '1', 't', 'yes')


class PrintWiring(Exception):
  """--autockpt_print_wiring with a wiring that needs no paxml: print this line and exit 0."""


def given(argv: list[str]) -> dict[str, str] | None:
  """The checked flags as written on the command line; None when it cannot tell for sure."""
  out, args, i = {}, argv[1:], 0
  while i < len(args):
    arg = args[i]
    if arg == '--':
      break
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
      raise settings_lib.ConfigError(
          f'--{name}={value} is not {"an integer" if kind is int else "a number"}: fix the value') from None
  return typed


def run(argv: list[str]) -> None:
  """Raises ConfigError on a wiring, flag-value or job-directory error, PrintWiring for
  --autockpt_print_wiring when the answer needs no paxml."""
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
  fields = {field: flag[name] for name, field in _SETTING_FLAGS.items() if name in flag}
  settings_lib.validate_values(settings_lib.Settings(**fields),
                               {field: f'--{name}' for name, field in _SETTING_FLAGS.items()})
  job = flag.get('job_log_dir')
  if job and '://' not in job and os.path.exists(job) and not os.path.isdir(job):
    raise settings_lib.ConfigError(
        f'--job_log_dir={job} is not writable (it is a file): choose a directory you can write to.')
