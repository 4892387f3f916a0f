"""Autocheckpoint settings: experiment class attributes, overridden by `--autockpt_*` flags."""

import dataclasses
from typing import Any

from absl import flags
import fiddle as fdl

from pax_autockpt import policies


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
  save_policy: Any = None  # a policies.SaveDecisionPolicy (or a Fiddle config of one)
  preservation_policy: Any = None  # a policies.PreservationPolicy (or a Fiddle config of one)


# field -> (experiment class attribute, command-line flag or None)
SOURCES = {
    'exit_code': ('AUTOCKPT_EXIT_CODE', 'autockpt_exit_code'),
    'continuous': ('AUTOCKPT_CONTINUOUS', 'autockpt_continuous'),
    'min_interval_secs': ('AUTOCKPT_MIN_INTERVAL_SECS', 'autockpt_min_interval_secs'),
    'keep_latest': ('AUTOCKPT_KEEP_LATEST', 'autockpt_keep_latest'),
    'keep_every_secs': ('AUTOCKPT_KEEP_EVERY_SECS', 'autockpt_keep_every_secs'),
    'save_policy': ('AUTOCKPT_SAVE_POLICY', None),
    'preservation_policy': ('AUTOCKPT_PRESERVATION_POLICY', None),
}


def _given_flag(name: str | None) -> tuple[bool, Any]:
  """The flag's value if it was given on the command line (flags exist only under our main)."""
  if name and name in flags.FLAGS and flags.FLAGS[name].present:
    return True, flags.FLAGS[name].value
  return False, None


def resolve(experiment: Any) -> Settings:
  """Class attributes first, then any `--autockpt_*` flag given on the command line wins.

  A flag also wins over a policy object: --autockpt_continuous / --autockpt_min_interval_secs replace
  AUTOCKPT_SAVE_POLICY, --autockpt_keep_latest / --autockpt_keep_every_secs replace
  AUTOCKPT_PRESERVATION_POLICY. Set as attributes together, they conflict (exit 2).
  """
  values, origin = {}, {}
  for field, (attr, flag) in SOURCES.items():
    values[field] = getattr(experiment, attr, getattr(Settings, field))
    origin[field] = f'{type(experiment).__name__}.{attr}'
    given, value = _given_flag(flag)
    if given:
      values[field], origin[field] = value, f'--{flag}'
  for field in ('save_policy', 'preservation_policy'):
    if isinstance(values[field], fdl.Buildable):
      try:
        values[field] = fdl.build(values[field])
      except Exception as e:  # pylint: disable=broad-except
        raise ConfigError(f'{origin[field]} could not be built: {type(e).__name__}: {e}') from e
  _apply_flag_precedence(values, origin)
  settings = Settings(**values)
  validate(settings, origin)
  return settings


def _apply_flag_precedence(values: dict[str, Any], origin: dict[str, str]) -> None:
  """Flags replace policy objects; attributes that would both apply are a conflict."""
  groups = {'save_policy': ('continuous', 'min_interval_secs'),
            'preservation_policy': ('keep_latest', 'keep_every_secs')}
  for policy_field, simple in groups.items():
    if values[policy_field] is None:
      continue
    flagged = [f for f in simple if origin[f].startswith('--')]
    if flagged and any(values[f] for f in flagged):
      values[policy_field] = None  # the command line wins
      continue
    clash = [f for f in simple if values[f] and not origin[f].startswith('--')]
    if clash:
      raise ConfigError(f'{origin[policy_field]} and {origin[clash[0]]} are both set: keep one '
                        '(the policy object, or the simple setting)')


def validate(s: Settings, origin: dict[str, str]) -> None:
  """Raises ConfigError for the first invalid value or combination, naming where it came from."""
  validate_values(s, origin)
  _validate_combinations(s, origin)


def validate_values(s: Settings, origin: dict[str, str]) -> None:
  """Each value on its own (what a command line alone can get wrong)."""

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


def _validate_combinations(s: Settings, origin: dict[str, str]) -> None:

  def bad(field, rule):
    raise ConfigError(f'{origin[field]}={getattr(s, field)!r} is invalid: {rule}')

  if s.min_interval_secs and not s.continuous and s.save_policy is None:
    bad('min_interval_secs', 'it only applies to continuous checkpointing: also set '
        'AUTOCKPT_CONTINUOUS = True (or --autockpt_continuous)')
  if s.save_policy is not None and not isinstance(s.save_policy, policies.SaveDecisionPolicy):
    bad('save_policy', 'use an object with should_save(step, previous, *, context), e.g. '
        'pax_autockpt.policies.ContinuousCheckpointingPolicy(30)')
  if s.preservation_policy is not None and not isinstance(s.preservation_policy,
                                                          policies.PreservationPolicy):
    bad('preservation_policy', 'use an object with should_preserve(checkpoints, *, context), e.g. '
        'pax_autockpt.policies.LatestN(10)')


def save_policy(s: Settings) -> policies.SaveDecisionPolicy | None:
  """The save-decision policy in effect; None means Pax's own save interval."""
  if s.continuous:
    return policies.AnySavePolicy((policies.InitialSavePolicy(),
                                   policies.ContinuousCheckpointingPolicy(s.min_interval_secs or None)))
  return s.save_policy


def preservation_policy(s: Settings) -> policies.PreservationPolicy | None:
  """The preservation policy in effect; None means Pax's own max_to_keep."""
  parts = []
  if s.keep_latest:
    parts.append(policies.LatestN(s.keep_latest))
  if s.keep_every_secs:
    parts.append(policies.EveryNSeconds(s.keep_every_secs))
  if len(parts) > 1:
    return policies.AnyPreservationPolicy(tuple(parts))
  return parts[0] if parts else s.preservation_policy
