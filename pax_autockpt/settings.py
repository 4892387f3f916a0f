"""Autocheckpoint settings, each declared once: a field of `Settings` with its default, doc and rule.

From that one declaration come the experiment class attribute `AUTOCKPT_<FIELD>` (on AutockptMixin),
the `--autockpt_<field>` flag of `pax_autockpt.main` (unless `flag=False`), the check of that flag
before paxml is imported, and the settings table of docs/settings.md (`markdown_table`; a test fails when
that page drifts). A flag given on the command line wins over the attribute.
"""

import dataclasses
import importlib.util
import math
import re
import textwrap
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


def _seconds_at_least_0(v):  # finite: an infinite retry budget never ends its backoff's list
  return None if _number(v) and 0 <= v < math.inf else 'use a number of seconds >= 0'


def _seconds_above_0(v):  # finite: no wait takes an infinite timeout (OverflowError)
  return None if _number(v) and 0 < v < math.inf else 'use a number of seconds > 0'


GRACE_SECS_MAX = 7 * 24 * 3600.0  # a week: longer is no scheduler's grace period, and waits beyond
# threading.TIMEOUT_MAX (~9.2e9 s) raise OverflowError at SIGTERM, killing the watchdog


def _grace_secs(v):
  if _number(v) and 0 < v <= GRACE_SECS_MAX:
    return None
  return f'use a number of seconds > 0 and at most {GRACE_SECS_MAX:.0f} (a week): the time from SIGTERM to SIGKILL'


def _optional(ok: Callable[[Any], bool], fix: str) -> Rule:
  """A rule for a setting that None leaves unset. `fix` says `{unset}` where the other choice goes: a flag
  cannot be None, so `fix_for` writes "None" for an attribute and "leave the flag out" for a flag."""
  def rule(v):
    return None if v is None or ok(v) else fix
  return rule


_optional_count = _optional(lambda v: _integer(v) and v >= 1,
                            'use an integer N >= 1, or {unset} to keep what Pax keeps')
_optional_seconds = _optional(lambda v: _number(v) and v > 0,
                              'use a number of seconds > 0, or {unset} to keep what Pax keeps')
_local_interval = _optional(lambda v: _number(v) and v >= 0,
                            "use a number of seconds >= 0, or {unset} for 20x the last save's duration")
_optional_hours = _optional(lambda v: _number(v) and v > 0,
                            'use a number of hours > 0, or {unset} for no adaptive interval')


def _count_at_least_1(v):
  return None if _integer(v) and v >= 1 else 'use an integer N >= 1'


def _local_dir(v):
  if not isinstance(v, str):
    return "use a path on the host's own disk, e.g. /dev/shm/autockpt-{host}, or '' for no local tier"
  if '://' in v:
    return ("use a path on the host's own disk (e.g. a local SSD or /dev/shm/autockpt-{host}); the job "
            "directory is --job_log_dir")
  return None


def _port(v):
  return None if _integer(v) and 0 <= v <= 65535 else 'use a TCP port 1..65535, or 0 for any free port'


def _mb_per_sec(v):
  return None if _number(v) and v > 0 else 'use a rate in MB/s > 0'


def _compilation_cache(v):
  if isinstance(v, str) and v.strip() and v == v.strip():
    return None
  return "use 'auto' (under the job directory), 'off', or a directory: a path or a gs:// URL"


def _nice(v):
  return None if _integer(v) and 0 <= v <= 19 else 'use a Linux nice value from 0 (as training) to 19 (the lowest)'


def _choice(*allowed: str) -> Rule:
  def rule(v):
    return None if v in allowed else 'use one of ' + ', '.join(repr(a) for a in allowed)
  return rule


def _metric_name(v):
  return None if isinstance(v, str) and v.strip() else 'use the name of a metric Pax logs, e.g. train/loss'


def _best_mode(v):
  return None if v in ('min', 'max') else "use 'min' (keep the lowest, e.g. a loss) or 'max'"


def _save_policy(v):
  if v is None:
    return None
  if not isinstance(v, policies.SaveDecisionPolicy):
    return ('use an object with should_save(step, previous_steps, *, context), e.g. '
            'pax_autockpt.policies.ContinuousCheckpointingPolicy(minimum_interval_secs=30)')
  return policies.problem_with(v, policies.SaveDecisionPolicy)


def _preservation_policy(v):
  if v is None:
    return None
  if not isinstance(v, policies.PreservationPolicy):
    return ('use an object with should_preserve(checkpoints, *, context), e.g. '
            'pax_autockpt.policies.LatestN(10)')
  return policies.problem_with(v, policies.PreservationPolicy)


GOODPUT_INSTALL = "pip install 'pax-autockpt[goodput]'"


def _goodput_run_name(v):
  if not isinstance(v, str) or not re.fullmatch(r'[A-Za-z0-9._-]{0,100}', v):
    return "use a name of up to 100 letters, digits, '.', '_' or '-' (the job's name in Cloud Logging), or '' for none"
  if v and importlib.util.find_spec('ml_goodput_measurement') is None:
    return f'recording needs ml-goodput-measurement, which is not installed: {GOODPUT_INSTALL}'
  return None


def _goodput_logger_name(v):
  if isinstance(v, str) and re.fullmatch(r'[A-Za-z0-9._/-]{0,200}', v):
    return None
  return "use a Cloud Logging log name (letters, digits, '.', '_', '/', '-'), or '' for goodput_<run name>"


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
  mtbf_hours: float | None = option(None, 'continuous, the minimum interval set itself: the Young/Daly optimum '
                                    'for the measured save cost and this mean time between failures',
                                    rule=_optional_hours)
  keep_latest: int | None = option(None, 'preservation: keep the newest N', rule=_optional_count)
  keep_every_secs: float | None = option(None, 'preservation: one checkpoint per N seconds',
                                         rule=_optional_seconds)
  notices: str = option('auto', "act on the metadata server's maintenance and preemption notices: 'auto' (where "
                        "it answers), 'on' or 'off'", rule=_choice('auto', 'on', 'off'))
  notice_action: str = option('save', "on a notice every host saves one agreed step, then 'save' trains on, "
                              "'save_and_exit' exits 143 once it is committed",
                              rule=_choice('save', 'save_and_exit'))
  keep_every_steps: int | None = option(None, 'preservation: the checkpoints at multiples of N steps',
                                        rule=_optional_count)
  keep_best: int | None = option(None, 'preservation: the best N by `best_metric`', rule=_optional_count)
  best_metric: str = option('train/loss', 'keep_best: the metric to rank by (docs/continuous.md, "Metrics for BestN")',
                            rule=_metric_name)
  best_mode: str = option('min', "keep_best: 'min' keeps the lowest values, 'max' the highest", rule=_best_mode)
  checksums: bool = option(True, 'write a content manifest (xxh3 of every array shard) inside each checkpoint '
                           'before its commit, and check it before training resumes from the checkpoint', rule=_bool)
  restore_retry_secs: float = option(300.0, 'a restore that fails with a storage or network error is retried '
                                     'with backoff this long, then the run exits 1 with nothing moved',
                                     rule=_seconds_at_least_0)
  input_on_host_change: str = option('exit', "input checkpointing on, a restart on another number of hosts than "
                                     "the checkpoint's: 'exit' (2, nothing moved) or 'restart' (the weights "
                                     "restore, the input starts over; a warning and an `input_restarted` event)",
                                     rule=_choice('exit', 'restart'))
  grace_secs: float = option(300.0, "seconds from SIGTERM's arrival to the scheduler's SIGKILL (Cloud TPU 300; "
                             "Spot VMs ~30; GKE's terminationGracePeriodSeconds; Slurm's --signal=TERM@N): the "
                             "exit path saves only what fits and always ends before it; at most a week",
                             rule=_grace_secs)
  compression: str = option('auto', "zstd for array chunks, which orbax 0.5.9 sets for every array: 'auto' (every "
                            "save but the one a signal's exit waits for, written raw: float weights shrink by "
                            "little and the grace period is short), 'zstd' (every save), 'none' (no save); "
                            "checkpoints of either kind restore alike", rule=_choice('auto', 'zstd', 'none'))
  background_nice: int = option(10, "Linux nice value (0-19) of the threads writing a continuous or interval save: "
                                 "above 0 they yield the CPU to training (at 10 a contended core gives them ~10%), "
                                 "so training slows less and each save takes longer; an on-demand or final save "
                                 "runs at 0", rule=_nice)
  local_dir: str = option('', "the local tier: a directory on each host's own disk (a local SSD, or a RAM disk "
                          "such as /dev/shm/autockpt-{host}; `{host}` becomes the host index), saved continuously "
                          "beside the job directory's checkpoints; a restart restores whichever complete copy is "
                          "newer; '' for none", rule=_local_dir)
  local_min_interval_secs: float | None = option(None, 'local tier: no two local save starts closer than this (0: '
                                                 "back to back); not set, 20x the previous local save's duration, "
                                                 'at least 1 s', rule=_local_interval)
  local_keep: int = option(2, 'local tier: the newest N committed local steps kept on each host',
                           rule=_count_at_least_1)
  local_peer_port: int = option(0, "local tier: the TCP port a host serves its copy of a local step on to a peer "
                                "that lost its own (a replaced VM), on the address the job's wiring reaches the "
                                'coordinator from; each request carries a secret made for the transfer (0: any free '
                                'port)', rule=_port)
  local_buddy: bool = option(False, "local tier: each host also keeps its neighbour's newest committed local step "
                             "(the same host of the next slice, else the next host), copied over the peer path in "
                             "the background after each local commit: a restart where any one host lost its disk "
                             "restores the newest local step even without a data-parallel replica (twice the local "
                             "tier's disk space; each commit's share crosses the network once more)", rule=_bool)
  local_buddy_mb_per_sec: float = option(200.0, "local tier, buddy copies: the most MB/s a host's background copy "
                                         "of its neighbour's step takes (so that it leaves the network and disk to "
                                         'training and the job directory saves)', rule=_mb_per_sec)
  compilation_cache: str = option('auto', "JAX's persistent compilation cache, which spares a restart its compiles "
                                  "(the train step's: seconds on CPU, minutes for a large model): 'auto' "
                                  "(JOB_LOG_DIR/autockpt/compilation_cache, bounded to 2 GB at each start, unless "
                                  "JAX_COMPILATION_CACHE_DIR or --jax_compilation_cache_dir names one), 'off' (none "
                                  "of ours), or a directory (a path or a gs:// URL)", rule=_compilation_cache)
  finish_first_compile: str = option('sigterm', "a signal during the first step's compile, nothing trained yet: "
                                     "'sigterm' lets the compile finish into the compilation cache first where the "
                                     "grace period holds it (this job's measured compile, x1.5), then exits 143, and a "
                                     "Ctrl-C exits at once; 'sigterm_and_ctrl_c' does the same for a Ctrl-C (130); "
                                     "'off' exits at once", rule=_choice('sigterm', 'sigterm_and_ctrl_c', 'off'))
  goodput_run_name: str = option('', "record the job for Google's goodput tools (ml-goodput-measurement's "
                                 "GoodputRecorder, host 0, to Cloud Logging) under this job name: every run of the "
                                 "job uses the same name; '' for none (docs/report.md, \"Recording for Google's "
                                 'goodput tools")', rule=_goodput_run_name)
  goodput_logger_name: str = option('', "goodput_run_name: the Cloud Logging log the entries go to; '' for "
                                    'goodput_<run name>, as MaxText names it', rule=_goodput_logger_name)
  save_policy: Any = option(None, 'any save-decision policy object, or a `pax_fiddle.Config` of one',
                            rule=_save_policy, flag=False,
                            replaced_by=('continuous', 'min_interval_secs', 'mtbf_hours'))
  preservation_policy: Any = option(None, 'any preservation policy object, or a `pax_fiddle.Config` of one',
                                    rule=_preservation_policy, flag=False,
                                    replaced_by=('keep_latest', 'keep_every_secs', 'keep_every_steps', 'keep_best'))


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


def describe(s: Settings) -> str:
  """The settings that differ from their defaults, for one log line ('defaults' when none do)."""
  changed = [f'{name}={getattr(s, name)!r}' for name, f in FIELDS.items() if getattr(s, name) != f.default]
  return ', '.join(changed) or 'defaults'


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The `--autockpt_*` flags of pax_autockpt.main; None means "not given: use the attribute"."""
  define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
            str: flags.DEFINE_string}
  for name, f in FIELDS.items():
    if f.metadata['flag']:
      define[flag_type(name)](flag_name(name), None, f'{f.metadata["doc"]} (default {f.default!r}).',
                              flag_values=flag_values)


def markdown_table() -> str:
  """The settings table of docs/settings.md."""
  rows = ['| attribute | flag | default | meaning |', '|---|---|---|---|']
  for name, f in FIELDS.items():
    replaced = ' / '.join(f'`--{flag_name(r)}`' for r in f.metadata['replaced_by'])
    flag = f'`--{flag_name(name)}`' if flag_name(name) else f'({replaced} replace it)'
    rows.append(f'| `{attribute(name)}` | {flag} | {f.default!r} | {f.metadata["doc"]} |')
  return '\n'.join(rows)


def help_entry(head: str, meaning: str, width: int = 100) -> list[str]:
  """One flag in `--help`: the flag on its own line, its meaning wrapped below it (absl's layout)."""
  return [f'  {head}', *textwrap.wrap(meaning, width, initial_indent=' ' * 6, subsequent_indent=' ' * 6)]


def flag_help() -> list[str]:
  """The `--autockpt_*` part of `python -m pax_autockpt.main --help`, from the same fields as docs/settings.md."""
  metavar = {int: 'INT', float: 'NUMBER', str: 'TEXT'}
  lines = []
  for name, f in FIELDS.items():
    flag, kind = flag_name(name), flag_type(name)
    if flag:
      head = f'--[no]{flag}' if kind is bool else f'--{flag}={metavar[kind]}'
      default = 'not set' if f.default is None else repr(f.default)
      lines += help_entry(f'{head}  (default {default})', f.metadata['doc'])
  return lines


def _given_flag(field: str) -> tuple[bool, Any]:
  """The flag's value if it was given on the command line (the flags exist only under our main)."""
  name = flag_name(field)
  if name and name in flags.FLAGS and flags.FLAGS[name].present:
    return True, flags.FLAGS[name].value
  return False, None


def resolve(experiment: Any) -> Settings:
  """Class attributes first, then any `--autockpt_*` flag given on the command line wins.

  A flag also wins over a policy object: the flags of the simple settings a policy field names in
  `replaced_by` (e.g. --autockpt_continuous, --autockpt_mtbf_hours for AUTOCKPT_SAVE_POLICY;
  --autockpt_keep_latest, --autockpt_keep_best for AUTOCKPT_PRESERVATION_POLICY) replace it. Set as
  attributes together, they conflict (exit 2). Policy objects have their parameters checked here too.
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
  if s.mtbf_hours and s.min_interval_secs:
    raise ConfigError(f'{origin["min_interval_secs"]} and {origin["mtbf_hours"]} are both set: keep one (the '
                      'MTBF sets the minimum interval itself)')
  if s.min_interval_secs and not s.continuous and s.save_policy is None:
    raise ConfigError(f'{origin["min_interval_secs"]}={s.min_interval_secs!r} is invalid: it only applies '
                      'to continuous checkpointing: also set AUTOCKPT_CONTINUOUS = True (or '
                      '--autockpt_continuous)')
  if s.goodput_logger_name and not s.goodput_run_name:
    raise ConfigError(f'{origin["goodput_logger_name"]}={s.goodput_logger_name!r} is invalid: it only applies to '
                      'recording: also set AUTOCKPT_GOODPUT_RUN_NAME (or --autockpt_goodput_run_name)')
  for name in ('best_metric', 'best_mode'):
    if getattr(s, name) != FIELDS[name].default and not s.keep_best:
      raise ConfigError(f'{origin[name]}={getattr(s, name)!r} is invalid: it only applies to keep_best: also '
                        'set AUTOCKPT_KEEP_BEST (or --autockpt_keep_best)')


def validate_values(s: Settings, origin: dict[str, str]) -> None:
  """Each value on its own, by its field's rule (what a command line alone can get wrong)."""
  for name in FIELDS:
    value = getattr(s, name)
    fix = fix_for(name, value, origin.get(name, name))
    if fix:
      raise ConfigError(f'{origin.get(name, name)}={_shown(value)} is invalid: {fix}')


def fix_for(field: str, value: Any, origin: str) -> str | None:
  """The rule's fix for `value`, worded for where it came from: a flag's fix must be a value a flag
  accepts (absl has no None for an integer flag; leaving the flag out is how to get the default)."""
  fix = FIELDS[field].metadata['rule'](value)
  return fix and fix.replace('{unset}', 'leave the flag out' if origin.startswith('--') else 'None')


def _shown(value: Any, limit: int = 240) -> str:
  """A value's repr on one line (a user's policy class may print over several), cut to `limit`."""
  text = ' '.join(repr(value).split())
  return text if len(text) <= limit else text[:limit - 3] + '...'


def save_policy(s: Settings) -> policies.SaveDecisionPolicy | None:
  """The save-decision policy in effect; None means Pax's own save interval."""
  if s.mtbf_hours:
    return policies.YoungDalyPolicy(mtbf_hours=s.mtbf_hours)
  if s.continuous:
    return policies.AnySavePolicy((policies.InitialSavePolicy(), policies.ContinuousCheckpointingPolicy(
        minimum_interval_secs=s.min_interval_secs or None)))
  return s.save_policy


def continuous(s: Settings) -> bool:
  """Whether saves start as soon as allowed (reason 'continuous'), not at Pax's interval."""
  return bool(s.continuous or s.mtbf_hours)


def preservation_policy(s: Settings) -> policies.PreservationPolicy | None:
  """The preservation policy in effect; None means Pax's own max_to_keep. Simple settings combine:
  a checkpoint any of them keeps is kept."""
  parts = []
  if s.keep_latest:
    parts.append(policies.LatestN(s.keep_latest))
  if s.keep_every_secs:
    parts.append(policies.EveryNSeconds(s.keep_every_secs))
  if s.keep_every_steps:
    parts.append(policies.EveryNSteps(s.keep_every_steps))
  if s.keep_best:
    parts.append(policies.BestN(metric=s.best_metric, reverse=s.best_mode == 'min', n=s.keep_best))
  if len(parts) > 1:
    return policies.AnyPreservationPolicy(tuple(parts))
  return parts[0] if parts else s.preservation_policy
