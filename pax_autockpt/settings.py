"""Autocheckpoint settings: experiment class attributes, overridden by `--autockpt_*` flags."""

import dataclasses
from typing import Any

from absl import flags


class ConfigError(ValueError):
  """Bad configuration: one line naming the attribute or flag and the fix; the run exits 2."""


@dataclasses.dataclass(frozen=True)
class Settings:
  """What the hook does; see README "Settings" for each field."""

  exit_code: int = 143
  continuous: bool = False
  min_interval_secs: float = 0.0
  keep_latest: int | None = None
  keep_every_secs: float | None = None


# field -> (experiment class attribute, command-line flag)
SOURCES = {
    'exit_code': ('AUTOCKPT_EXIT_CODE', 'autockpt_exit_code'),
    'continuous': ('AUTOCKPT_CONTINUOUS', 'autockpt_continuous'),
    'min_interval_secs': ('AUTOCKPT_MIN_INTERVAL_SECS', 'autockpt_min_interval_secs'),
    'keep_latest': ('AUTOCKPT_KEEP_LATEST', 'autockpt_keep_latest'),
    'keep_every_secs': ('AUTOCKPT_KEEP_EVERY_SECS', 'autockpt_keep_every_secs'),
}


def _given_flag(name: str) -> tuple[bool, Any]:
  """The flag's value if it was given on the command line (flags exist only under our main)."""
  if name in flags.FLAGS and flags.FLAGS[name].present:
    return True, flags.FLAGS[name].value
  return False, None


def resolve(experiment: Any) -> Settings:
  """Class attributes first, then any `--autockpt_*` flag given on the command line wins."""
  values, origin = {}, {}
  for field, (attr, flag) in SOURCES.items():
    values[field] = getattr(experiment, attr, getattr(Settings, field))
    origin[field] = f'{type(experiment).__name__}.{attr}'
    given, value = _given_flag(flag)
    if given:
      values[field], origin[field] = value, f'--{flag}'
  settings = Settings(**values)
  validate(settings, origin)
  return settings


def validate(s: Settings, origin: dict[str, str]) -> None:
  """Raises ConfigError for the first invalid value, naming where it came from."""

  def bad(field, rule):
    value = getattr(s, field)
    raise ConfigError(f'{origin[field]}={value!r} is invalid: {rule}')

  def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)

  if not isinstance(s.exit_code, int) or isinstance(s.exit_code, bool) or not 3 <= s.exit_code <= 255:
    bad('exit_code', 'use an integer 3..255 (0 means success, 1 failure, 2 bad configuration); default 143')
  if not isinstance(s.continuous, bool):
    bad('continuous', 'use True or False')
  if not is_number(s.min_interval_secs) or s.min_interval_secs < 0:
    bad('min_interval_secs', 'use a number of seconds >= 0')
  if s.keep_latest is not None and (
      not isinstance(s.keep_latest, int) or isinstance(s.keep_latest, bool) or s.keep_latest < 1):
    bad('keep_latest', 'use an integer N >= 1, or None to keep what Pax keeps')
  if s.keep_every_secs is not None and (not is_number(s.keep_every_secs) or s.keep_every_secs <= 0):
    bad('keep_every_secs', 'use a number of seconds > 0, or None')
