"""Autocheckpoint settings, each declared once: a field of `Settings` with its default, doc and rule.

From that one declaration come the experiment class attribute `AUTOCKPT_<FIELD>` (on AutockptMixin),
the `--autockpt_<field>` flag of `pax_autockpt.main` (unless `flag=False`), the check of that flag
before paxml is imported, and the README's settings table (`markdown_table`; a test fails when the
README drifts). A flag given on the command line wins over the attribute.
"""

import dataclasses
import types
from typing import Any, Callable

from absl import flags

from pax_autockpt import policies

DEFAULT_EXIT_CODE = 143  # 128 + SIGTERM, what a shell reports for a process the signal ended


class ConfigError(ValueError):
  """Bad configuration: one line naming the attribute or flag and the fix; the run exits 2."""


Rule = Callable[[Any], str | None]  # the fix for an invalid value, None when the value is fine


def _number(v: Any) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def _integer(v: Any) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _exit_code(v):
  if not _integer(v) or not 3 <= v <= 255:
    return f'use an integer 3..255 (0 means success, 1 failure, 2 bad configuration); default {DEFAULT_EXIT_CODE}'


def _bool(v):
  return None if isinstance(v, bool) else 'use True or False'


def _seconds_at_least_0(v):
  return None if _number(v) and v >= 0 else 'use a number of seconds >= 0'


def _optional_count(v):
  return None if v is None or (_integer(v) and v >= 1) else 'use an integer N >= 1, or None to keep what Pax keeps'


def _optional_seconds(v):
  return None if v is None or (_number(v) and v > 0) else 'use a number of seconds > 0, or None'


def _choice(*allowed: str) -> Rule:
  def rule(v):
    return None if v in allowed else 'use one of ' + ', '.join(repr(a) for a in allowed)
  return rule


def _save_policy(v):
  if v is not None and not isinstance(v, policies.SaveDecisionPolicy):
    return ('use an object with should_save(step, previous, *, context), e.g. '
            'pax_autockpt.policies.ContinuousCheckpointingPolicy(30)')


def _preservation_policy(v):
  if v is not None and not isinstance(v, policies.PreservationPolicy):
    return ('use an object with should_preserve(checkpoints, *, context), e.g. '
            'pax_autockpt.policies.LatestN(10)')


def option(default: Any, doc: str, *, rule: Rule, flag: bool = True, replaced_by: tuple[str, ...] = ()) -> Any:
  """One setting: its default, its one-line meaning, its validity rule, whether it is a flag, and
  (for a policy object) the simple settings whose flags replace it."""
  return dataclasses.field(default=default,
                           metadata={'doc': doc, 'rule': rule, 'flag': flag, 'replaced_by': replaced_by})


@dataclasses.dataclass(frozen=True)
class Settings:
  """What the hook does. Each field is one setting (see the module docstring)."""

  exit_code: int = option(DEFAULT_EXIT_CODE, 'exit code after a committed on-demand checkpoint (3..255)',
                          rule=_exit_code)
  continuous: bool = option(False, 'start a new async save as soon as the previous one committed',
                            rule=_bool)
  min_interval_secs: float = option(0.0, 'continuous: no two save starts closer than this',
                                    rule=_seconds_at_least_0)
  keep_latest: int | None = option(None, 'preservation: keep the newest N', rule=_optional_count)
  keep_every_secs: float | None = option(None, 'preservation: one checkpoint per N seconds',
                                         rule=_optional_seconds)
  notices: str = option('auto', "act on the metadata server's maintenance and preemption notices: 'auto' (where "
                        "it answers), 'on' or 'off'", rule=_choice('auto', 'on', 'off'))
  notice_action: str = option('save', "on a notice every host saves one agreed step, then 'save' trains on, "
                              "'save_and_exit' exits 143 once it is committed",
                              rule=_choice('save', 'save_and_exit'))
  save_policy: Any = option(None, 'any save-decision policy object, or a `pax_fiddle.Config` of one',
                            rule=_save_policy, flag=False, replaced_by=('continuous', 'min_interval_secs'))
  preservation_policy: Any = option(None, 'any preservation policy object, or a `pax_fiddle.Config` of one',
                                    rule=_preservation_policy, flag=False,
                                    replaced_by=('keep_latest', 'keep_every_secs'))


FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def attribute(field: str) -> str:
  return f'AUTOCKPT_{field.upper()}'


def flag_name(field: str) -> str | None:
  return f'autockpt_{field}' if FIELDS[field].metadata['flag'] else None


def flag_type(field: str) -> type:
  """bool, int, float or str: the flag's type, from the field's annotation (`int | None` -> int)."""
  kind = FIELDS[field].type
  if isinstance(kind, types.UnionType):
    kind = next(k for k in kind.__args__ if k is not type(None))
  return kind


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The `--autockpt_*` flags of pax_autockpt.main; None means "not given: use the attribute"."""
  define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
            str: flags.DEFINE_string}
  for name, f in FIELDS.items():
    if f.metadata['flag']:
      define[flag_type(name)](flag_name(name), None, f'{f.metadata["doc"]} (default {f.default!r}).',
                              flag_values=flag_values)


def markdown_table() -> str:
  """The README's settings table."""
  rows = ['| attribute | flag | default | meaning |', '|---|---|---|---|']
  for name, f in FIELDS.items():
    replaced = ' / '.join(f'`--{flag_name(r)}`' for r in f.metadata['replaced_by'])
    flag = f'`--{flag_name(name)}`' if flag_name(name) else f'({replaced} replace it)'
    rows.append(f'| `{attribute(name)}` | {flag} | {f.default!r} | {f.metadata["doc"]} |')
  return '\n'.join(rows)


def _given_flag(field: str) -> tuple[bool, Any]:
  """The flag's value if it was given on the command line (the flags exist only under our main)."""
  name = flag_name(field)
  if name and name in flags.FLAGS and flags.FLAGS[name].present:
    return True, flags.FLAGS[name].value
  return False, None


def resolve(experiment: Any) -> Settings:
  """Class attributes first, then any `--autockpt_*` flag given on the command line wins.

  A flag also wins over a policy object: --autockpt_continuous / --autockpt_min_interval_secs replace
  AUTOCKPT_SAVE_POLICY, --autockpt_keep_latest / --autockpt_keep_every_secs replace
  AUTOCKPT_PRESERVATION_POLICY. Set as attributes together, they conflict (exit 2).
  """
  import fiddle as fdl  # pylint: disable=g-import-not-at-top  (not needed by the pre-import checks)
  values, origin = {}, {}
  for name, f in FIELDS.items():
    values[name] = getattr(experiment, attribute(name), f.default)
    origin[name] = f'{type(experiment).__name__}.{attribute(name)}'
    given, value = _given_flag(name)
    if given:
      values[name], origin[name] = value, f'--{flag_name(name)}'
  for name in values:
    if isinstance(values[name], fdl.Buildable):
      try:
        values[name] = fdl.build(values[name])
      except Exception as e:  # pylint: disable=broad-except
        raise ConfigError(f'{origin[name]} could not be built: {type(e).__name__}: {e}') from e
  _apply_flag_precedence(values, origin)
  settings = Settings(**values)
  validate(settings, origin)
  return settings


def _apply_flag_precedence(values: dict[str, Any], origin: dict[str, str]) -> None:
  """Flags replace policy objects; attributes that would both apply are a conflict."""
  for policy_field, f in FIELDS.items():
    simple = f.metadata['replaced_by']
    if not simple or values[policy_field] is None:
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
  if s.min_interval_secs and not s.continuous and s.save_policy is None:
    raise ConfigError(f'{origin["min_interval_secs"]}={s.min_interval_secs!r} is invalid: it only applies '
                      'to continuous checkpointing: also set AUTOCKPT_CONTINUOUS = True (or '
                      '--autockpt_continuous)')


def validate_values(s: Settings, origin: dict[str, str]) -> None:
  """Each value on its own, by its field's rule (what a command line alone can get wrong)."""
  for name, f in FIELDS.items():
    value = getattr(s, name)
    fix = f.metadata['rule'](value)
    if fix:
      raise ConfigError(f'{origin.get(name, name)}={value!r} is invalid: {fix}')


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
