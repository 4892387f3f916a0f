"""The checks that need no paxml, run before it is imported: a typo costs half a second, not a
TensorFlow start-up on every host.

Best effort on purpose: it reads only the `--name=value` / `--name value` forms of the flags it
checks and gives up on anything else (e.g. --flagfile); pax_autockpt.main repeats every check on
absl's parsed flags, so nothing depends on this module catching a problem.
"""

import os
import sys
from typing import NoReturn

from pax_autockpt import hosts
from pax_autockpt import settings as settings_lib

_INT = ('host_idx', 'num_hosts', 'autockpt_exit_code', 'autockpt_keep_latest')
_FLOAT = ('autockpt_min_interval_secs', 'autockpt_keep_every_secs')
_STR = ('server_addr', 'job_log_dir')
_BOOL = ('autockpt_continuous', 'autockpt_print_wiring')
_TRUE = ('', 'true', '1', 't', 'yes')


def fail(message: str) -> NoReturn:
  """Bad input: one line on stderr, exit 2, nothing written."""
  print(f'error: {message}', file=sys.stderr, flush=True)
  sys.exit(2)


def given(argv: list[str]) -> dict[str, str] | None:
  """The checked flags as written on the command line; None when it cannot tell for sure."""
  out, args, i = {}, argv[1:], 0
  while i < len(args):
    arg = args[i]
    if arg == '--':
      break
    if arg.startswith('--flagfile') or arg.startswith('-flagfile'):
      return None
    name, eq, value = arg.lstrip('-').partition('=')
    if name in _INT + _FLOAT + _STR:
      if not eq:
        if i + 1 >= len(args):
          return None
        i, value = i + 1, args[i + 1]
      out[name] = value
    elif name in _BOOL:
      out[name] = 'true' if value.lower() in _TRUE else 'false'
    elif name.startswith('no') and name[2:] in _BOOL and not eq:
      out[name[2:]] = 'false'
    i += 1
  return out


def _typed(values: dict[str, str]) -> dict[str, object]:
  typed = {}
  for name, value in values.items():
    try:
      typed[name] = int(value) if name in _INT else float(value) if name in _FLOAT else value
    except ValueError:
      kind = 'an integer' if name in _INT else 'a number'
      fail(f'--{name}={value} is not {kind}: fix the value')
  return typed


def run(argv: list[str]) -> None:
  """Exits 2 on a wiring, flag-value or job-directory error; exits 0 after --autockpt_print_wiring."""
  values = given(argv)
  if values is None:
    return
  flag = _typed(values)
  try:
    wiring = hosts.resolve(host_idx=flag.get('host_idx'), num_hosts=flag.get('num_hosts'),
                           server_addr=flag.get('server_addr'), free_port=lambda: 0)
  except hosts.WiringError as e:
    fail(str(e))
  if flag.get('autockpt_print_wiring') == 'true' and wiring.source != 'local':
    print(wiring.line(), flush=True)
    sys.exit(0)
  fields = {f: flag[name] for f, (_, name) in settings_lib.SOURCES.items() if name in flag}
  if 'continuous' in fields:
    fields['continuous'] = fields['continuous'] == 'true'
  try:
    settings_lib.validate_values(settings_lib.Settings(**fields),
                                 {f: f'--{name}' for f, (_, name) in settings_lib.SOURCES.items()})
  except settings_lib.ConfigError as e:
    fail(str(e))
  job = flag.get('job_log_dir')
  if job and '://' not in job and os.path.exists(job) and not os.path.isdir(job):
    fail(f'--job_log_dir={job} is not writable (it is a file): choose a directory you can write to.')
