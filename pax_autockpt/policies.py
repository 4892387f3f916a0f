"""When to save, and which checkpoints to keep: orbax-latest's policies (0.12.8), for orbax 0.5.9.

The classes, fields, constructors and call shapes are orbax-latest's `save_decision_policy` and
`preservation_policy`, re-made here because paxml 1.4.0 is pinned to orbax 0.5.9 (and orbax-latest
needs a newer jax): a policy written against orbax-latest's interface runs here unchanged. A save
decision is `should_save(step_info, previous_steps, *, context)`, where `step_info` is the current step
as a `CheckpointInfo` whose `time` is now; `time` is a timezone-aware datetime, as in orbax.

Pure decisions fed a context object. The checkpointer asks them on the primary host and publishes the
answer to every host (pax_autockpt.hosts.agreement), so all hosts start the same saves. `ask_save` and
`to_delete` are the boundary where the checkpointer's facts (int steps, unix times, the metrics Pax
logged) become orbax-shaped objects, and where a policy's answer becomes plain bools again. Inside, every
time is a timezone-aware datetime (`utc`): `CheckpointInfo.time` and `PreservationContext.now`, which
refuses anything else, so that a unix float can never reach a policy's datetime arithmetic.

Deliberate differences from orbax-latest (docs/continuous.md): a clock that jumped backwards (negative elapsed
time) does not stall continuous checkpointing; the newest checkpoint is never deleted (`to_delete`); a
checkpoint whose time is unknown (`time=None`) is kept by the time-based policies (orbax dates it at its
directory's mtime, 1970 on gs://); NaN and infinite metrics rank worst in BestN (orbax sorts them as they
come, which ranks NaN by its position and +inf best for an ascending metric);
parameters are checked before training (`problem_with`) instead of failing, or silently keeping
everything, at the first decision. Additions: `BestN(metric=...)` for Pax's metric names,
`YoungDalyPolicy`, and the measured save cost in `DecisionContext`.
"""

import dataclasses
import datetime
import math
import numbers
from typing import Any, Callable, Collection, Container, Mapping, Protocol, Sequence, runtime_checkable

UTC = datetime.timezone.utc


def utc(unix_seconds: float) -> datetime.datetime:
  return datetime.datetime.fromtimestamp(unix_seconds, tz=UTC)


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
  """A checkpoint (or the current step) as the policies see it, as orbax's CheckpointInfo.

  `time` is when its save started, None when neither the event log nor storage can tell (a checkpoint
  of stock paxml on gs://): no time-based policy deletes it without evidence. `metrics` are the values
  Pax logged for its step (docs/continuous.md, "Metrics for BestN"), None when unknown. Equal and hashed
  by step and time only, as in orbax.
  """

  step: int
  time: datetime.datetime | None
  metrics: Mapping[str, float] | None = dataclasses.field(default=None, compare=False)

  @classmethod
  def at(cls, step: int, unix_seconds: float | None,
         metrics: Mapping[str, float] | None = None) -> 'CheckpointInfo':
    return cls(step, None if unix_seconds is None else utc(unix_seconds), metrics)


@dataclasses.dataclass(frozen=True)
class MultiprocessingOptions:
  """The part of orbax's MultiprocessingOptions a policy may read; the primary host is process 0."""

  primary_host: int | None = 0
  active_processes: frozenset[int] | None = None
  barrier_sync_key_prefix: str | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecisionContext:
  """orbax's DecisionContext, plus what this job measured of its saves so far (None: not yet)."""

  is_saving_in_progress: bool
  reached_preemption: bool = False
  multiprocessing_options: MultiprocessingOptions = MultiprocessingOptions()
  save_cost_secs: float | None = None  # mean loop-blocking time of a save (not preemption saves)
  save_duration_secs: float | None = None  # mean time from a save's start to its commit


@runtime_checkable
class SaveDecisionPolicy(Protocol):
  """Returns True when a checkpoint should be saved at `step.step` (before that step runs)."""

  def should_save(self, step: CheckpointInfo, previous_steps: Sequence[CheckpointInfo], *,
                  context: DecisionContext) -> bool:
    ...


# --- parameter checks ------------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
  return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
  return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def _int_at_least(name: str, v: Any, low: int, *, optional: bool = False) -> str | None:
  if (optional and v is None) or (_is_int(v) and v >= low):
    return None
  return f'{name}={v!r}: use an integer >= {low}' + (', or None' if optional else '')


def _seconds(name: str, v: Any, *, zero: bool, optional: bool = False) -> str | None:
  if (optional and v is None) or (_is_number(v) and (v > 0 or (zero and v == 0))):
    return None
  return f'{name}={v!r}: use a number of seconds {">=" if zero else ">"} 0' + (', or None' if optional else '')


def _flag(name: str, v: Any) -> str | None:
  return None if isinstance(v, bool) else f'{name}={v!r}: use True or False'


def _steps(name: str, v: Any) -> str | None:
  if isinstance(v, range) or (isinstance(v, Collection) and not isinstance(v, (str, bytes, Mapping))
                              and all(_is_int(s) for s in v)):
    return None
  return f'{name}={v!r}: use a collection of integer steps'


def _members(policies: Any, kind: type) -> str | None:
  if isinstance(policies, (str, bytes, Mapping)) or not isinstance(policies, Sequence) or not policies:
    return f'policies={policies!r}: use a non-empty sequence of policies'
  for i, p in enumerate(policies):
    found = problem_with(p, kind)
    if found:
      return f'policies[{i}]: {found}'
  return None


def problem_with(policy: Any, kind: type) -> str | None:
  """Why `policy` cannot serve as a `kind` (SaveDecisionPolicy or PreservationPolicy), else None.

  Our policies check their own parameters (`problem()`); any other object with the method is taken
  as it is. Called at start (pax_autockpt.settings), so that a bad parameter is one line and exit 2
  before training rather than an exception, or a policy that silently keeps everything, later.
  """
  method = 'should_save' if kind is SaveDecisionPolicy else 'should_preserve'
  if not isinstance(policy, kind):
    return f'{type(policy).__name__} has no {method}() method'
  check = getattr(policy, 'problem', None)
  found = check() if callable(check) and type(policy).__module__ == __name__ else None
  return f'{type(policy).__name__}.{found}' if found else None


# --- save decisions ---------------------------------------------------------------------------------


def _elapsed_at_least(step: CheckpointInfo, previous: CheckpointInfo, seconds: float) -> bool:
  """A negative elapsed time is a clock that jumped backwards: it must not stall saving (docs/continuous.md).
  A previous checkpoint of unknown time counts as long ago (orbax dates it at its mtime, 1970 on gs://: the
  same answer). Compared as timedeltas (exact microseconds), as orbax does, not as float seconds."""
  if previous.time is None:
    return True
  elapsed = step.time - previous.time
  return elapsed < datetime.timedelta(0) or elapsed >= datetime.timedelta(seconds=seconds)


@dataclasses.dataclass(frozen=True)
class FixedIntervalPolicy:
  """Save every `interval` steps."""

  interval: int

  def problem(self) -> str | None:
    return _int_at_least('interval', self.interval, 1)

  def should_save(self, step, previous_steps, *, context):
    del previous_steps, context
    return step.step % self.interval == 0


@dataclasses.dataclass(frozen=True)
class SpecificStepsPolicy:
  """Save at the listed steps (any container: a tuple, a set, a range)."""

  steps: Container[int]

  def problem(self) -> str | None:
    return _steps('steps', self.steps)

  def should_save(self, step, previous_steps, *, context):
    del previous_steps, context
    return step.step in self.steps


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContinuousCheckpointingPolicy:
  """Save as soon as the previous save has committed, no two starts closer than the minimum."""

  minimum_interval_secs: float | None = None

  def problem(self) -> str | None:
    return _seconds('minimum_interval_secs', self.minimum_interval_secs, zero=True, optional=True)

  def should_save(self, step, previous_steps, *, context):
    if context.is_saving_in_progress:
      return False
    if not previous_steps or self.minimum_interval_secs is None:
      return True
    return _elapsed_at_least(step, previous_steps[-1], self.minimum_interval_secs)


@dataclasses.dataclass(frozen=True)
class PreemptionCheckpointingPolicy:
  """True at the step every host agreed on after a preemption signal.

  Kept so that orbax configurations run unchanged: here the agreed step is saved before any policy is
  asked (a preemption always wins), so this policy never changes a decision.
  """

  def should_save(self, step, previous_steps, *, context):
    del step, previous_steps
    return context.reached_preemption


@dataclasses.dataclass(frozen=True)
class InitialSavePolicy:
  """Save as soon as possible when no checkpoint exists yet."""

  def should_save(self, step, previous_steps, *, context):
    del step, context
    return not previous_steps


@dataclasses.dataclass(frozen=True)
class AnySavePolicy:
  """Save when any of the policies says so."""

  policies: Sequence[SaveDecisionPolicy]

  def problem(self) -> str | None:
    return _members(self.policies, SaveDecisionPolicy)

  def should_save(self, step, previous_steps, *, context):
    return any(p.should_save(step, previous_steps=previous_steps, context=context) for p in self.policies)


def young_daly_interval(save_cost_secs: float, mtbf_secs: float) -> float:
  """Young/Daly: the checkpoint interval sqrt(2 delta M) that maximises `goodput` to first order."""
  return math.sqrt(2.0 * save_cost_secs * mtbf_secs)


def goodput(save_cost_secs: float, interval_secs: float, restart_cost_secs: float, mtbf_secs: float) -> float:
  """max(0, 1 - delta/tau - (tau/2 + R)/M): each interval tau pays the save cost delta, and each failure
  (every M seconds on average) loses half an interval of work plus the restart cost R."""
  if interval_secs <= 0:
    return max(0.0, 1.0 - restart_cost_secs / mtbf_secs) if save_cost_secs == 0 else 0.0
  return max(0.0, 1.0 - save_cost_secs / interval_secs - (interval_secs / 2.0 + restart_cost_secs) / mtbf_secs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class YoungDalyPolicy:
  """Continuous checkpointing whose minimum interval sets itself: the Young/Daly optimum for the save
  cost this job measured so far (`context.save_cost_secs`, re-estimated as saves commit).

  Bounded below by the measured save duration (a save cannot start before the previous one committed
  anyway) and above by the MTBF (where the first-order model stops holding). Until a save was
  measured, it saves: the first save is the measurement. Not in orbax.
  """

  mtbf_hours: float

  def problem(self) -> str | None:
    if _is_number(self.mtbf_hours) and self.mtbf_hours > 0:
      return None
    return f'mtbf_hours={self.mtbf_hours!r}: use a number of hours > 0'

  def interval_secs(self, save_cost_secs: float | None, save_duration_secs: float | None) -> float | None:
    """The minimum interval for the measured costs; None before the first measurement."""
    if save_cost_secs is None:
      return None
    mtbf = self.mtbf_hours * 3600.0
    return min(max(young_daly_interval(save_cost_secs, mtbf), save_duration_secs or 0.0), mtbf)

  def should_save(self, step, previous_steps, *, context):
    if context.is_saving_in_progress:
      return False
    interval = self.interval_secs(context.save_cost_secs, context.save_duration_secs)
    if not previous_steps or interval is None:
      return True
    return _elapsed_at_least(step, previous_steps[-1], interval)


def find(policy: Any, kind: type) -> Any:
  """The first `kind` in a policy, looking inside Any* policies (e.g. the YoungDalyPolicy to log)."""
  if isinstance(policy, kind):
    return policy
  for member in getattr(policy, 'policies', None) or ():
    found = find(member, kind)
    if found is not None:
      return found
  return None


def ask_save(policy: SaveDecisionPolicy, step: int, *, now: float, previous: Sequence[CheckpointInfo],
             context: DecisionContext) -> bool:
  """The boundary for save decisions: the current step as an orbax-shaped info, a plain bool back."""
  return bool(policy.should_save(CheckpointInfo.at(step, now), previous, context=context))


# --- preservation -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreservationContext:
  """orbax's (empty) PreservationContext, plus `now` for LatestDuration (None: the clock's now).

  `now` is a timezone-aware datetime or None, nothing else: a unix float here once made LatestDuration
  raise on every commit, so that nothing was ever deleted.
  """

  now: datetime.datetime | None = None

  def __post_init__(self):
    if self.now is not None and not (isinstance(self.now, datetime.datetime) and self.now.tzinfo is not None):
      raise TypeError(f'PreservationContext.now={self.now!r}: use a timezone-aware datetime '
                      '(pax_autockpt.policies.utc(unix_seconds)), or None for the clock\'s now')


@runtime_checkable
class PreservationPolicy(Protocol):
  """Returns, for each checkpoint (oldest first), whether to keep it."""

  def should_preserve(self, checkpoints: Sequence[CheckpointInfo], *,
                      context: PreservationContext) -> Sequence[bool]:
    ...


def _newest_kept(keep: list[bool], max_to_keep: int | None) -> list[bool]:
  """Of the checkpoints kept, only the newest `max_to_keep` stay kept."""
  if max_to_keep is None:
    return keep
  kept = [i for i, k in enumerate(keep) if k]
  for i in kept[:max(0, len(kept) - max_to_keep)]:
    keep[i] = False
  return keep


def _known_times(checkpoints: Sequence[CheckpointInfo], decide: Callable[[list[datetime.datetime]], list[bool]]
                 ) -> list[bool]:
  """`decide` over the checkpoints whose time is known; those of unknown time are kept (no evidence that
  they are old), and take no part in the others' decision."""
  known = [i for i, c in enumerate(checkpoints) if c.time is not None]
  keep = [True] * len(checkpoints)
  for i, k in zip(known, decide([checkpoints[i].time for i in known])):
    keep[i] = k
  return keep


def _spaced(values: Sequence[Any], gap: Any) -> list[bool]:
  """Keeps the first value, then each one at least `gap` after the last one kept (steps and an int,
  or datetimes and a timedelta)."""
  keep, last = [], None
  for v in values:
    keep.append(last is None or v - last >= gap)
    last = v if keep[-1] else last
  return keep


@dataclasses.dataclass(frozen=True)
class PreserveAll:
  """Keep everything."""

  def should_preserve(self, checkpoints, *, context):
    del context
    return [True] * len(checkpoints)


@dataclasses.dataclass(frozen=True)
class LatestN:
  """Keep the newest n checkpoints; everything with n=None."""

  n: int | None = None

  def problem(self) -> str | None:
    return _int_at_least('n', self.n, 0, optional=True)

  def should_preserve(self, checkpoints, *, context):
    del context
    cut = 0 if self.n is None else len(checkpoints) - self.n
    return [i >= cut for i in range(len(checkpoints))]


@dataclasses.dataclass(frozen=True)
class EveryNSeconds:
  """Keep the oldest, then each one at least `interval_secs` after the last one kept; one of unknown
  time is kept and spaces nothing."""

  interval_secs: float

  def problem(self) -> str | None:
    return _seconds('interval_secs', self.interval_secs, zero=False)

  def should_preserve(self, checkpoints, *, context):
    del context
    gap = datetime.timedelta(seconds=self.interval_secs)
    return _known_times(checkpoints, lambda times: _spaced(times, gap))


@dataclasses.dataclass(frozen=True)
class EveryNSteps:
  """Keep multiples of `interval_steps` (not exact: the first, then each >= N steps after the last
  kept); with `max_to_keep`, only the newest of those."""

  interval_steps: int
  exact_interval: bool = True
  max_to_keep: int | None = None

  def problem(self) -> str | None:
    return (_int_at_least('interval_steps', self.interval_steps, 1)
            or _flag('exact_interval', self.exact_interval)
            or _int_at_least('max_to_keep', self.max_to_keep, 1, optional=True))

  def should_preserve(self, checkpoints, *, context):
    del context
    if self.exact_interval:
      keep = [c.step % self.interval_steps == 0 for c in checkpoints]
    else:
      keep = _spaced([c.step for c in checkpoints], self.interval_steps)
    return _newest_kept(keep, self.max_to_keep)


@dataclasses.dataclass(frozen=True)
class EveryNStepsClosest:
  """For each multiple k*N of `interval_steps`, keep the checkpoint closest to it (the newer one on a
  tie), and always the newest; with `max_to_keep`, only the newest of those. Unlike EveryNSteps(N,
  exact_interval=False), irregular saves do not make the kept steps drift."""

  interval_steps: int
  max_to_keep: int | None = None

  def problem(self) -> str | None:
    return (_int_at_least('interval_steps', self.interval_steps, 1)
            or _int_at_least('max_to_keep', self.max_to_keep, 1, optional=True))

  def should_preserve(self, checkpoints, *, context):
    del context
    closest: dict[int, tuple[int, int]] = {}  # grid index -> (distance, checkpoint index)
    for i, c in enumerate(checkpoints):
      k = round(c.step / self.interval_steps)  # Python's rounding: halves go to the even k, as in orbax
      distance = abs(c.step - k * self.interval_steps)
      if k not in closest or distance <= closest[k][0]:
        closest[k] = (distance, i)
    chosen = {i for _, i in closest.values()} | {len(checkpoints) - 1}
    return _newest_kept([i in chosen for i in range(len(checkpoints))], self.max_to_keep)


@dataclasses.dataclass(frozen=True)
class CustomSteps:
  """Keep the listed steps."""

  steps: Collection[int]

  def problem(self) -> str | None:
    return _steps('steps', self.steps)

  def should_preserve(self, checkpoints, *, context):
    del context
    return [c.step in self.steps for c in checkpoints]


@dataclasses.dataclass(frozen=True)
class LatestDuration:
  """Keep the checkpoints saved within `duration` of now (and every newer one), and those of unknown time."""

  duration: datetime.timedelta

  def problem(self) -> str | None:
    if isinstance(self.duration, datetime.timedelta) and self.duration > datetime.timedelta(0):
      return None
    return f'duration={self.duration!r}: use a datetime.timedelta > 0'

  def should_preserve(self, checkpoints, *, context):
    now = context.now or datetime.datetime.now(tz=UTC)

    def recent(times):
      first = next((i for i, t in enumerate(times) if now - t <= self.duration), len(times))
      return [i >= first for i in range(len(times))]

    return _known_times(checkpoints, recent)


def _finite(value: Any) -> bool:
  """False for NaN and +-inf, which BestN ranks worst; a value that is no number ranks by its own order."""
  try:
    return math.isfinite(value)
  except TypeError:
    return True


@dataclasses.dataclass(frozen=True, kw_only=True)
class BestN:
  """Keep the n best checkpoints by a metric, as orbax's BestN.

  The metric is `get_metric_fn(metrics)` (orbax's way), or the value of the Pax metric named `metric`
  (e.g. 'train/loss'; a checkpoint without that metric counts as one without metrics). Ranked
  ascending, or descending with `reverse=True`, and the last n of that order kept: `reverse=True`
  keeps the lowest values (a loss). A NaN or infinite value ranks worst either way (a diverged loss,
  oldest first among them); orbax-latest sorts it as it comes. Checkpoints without metrics are kept unless
  `keep_checkpoints_without_metrics=False`; n=None keeps everything, n=0 nothing.
  """

  get_metric_fn: Callable[[Mapping[str, float]], float] | None = None
  metric: str | None = None
  reverse: bool = False
  n: int | None = None
  keep_checkpoints_without_metrics: bool = True

  def problem(self) -> str | None:
    if (self.get_metric_fn is None) == (self.metric is None):
      return 'get_metric_fn / metric: give exactly one of them'
    if self.get_metric_fn is not None and not callable(self.get_metric_fn):
      return f'get_metric_fn={self.get_metric_fn!r}: use a function of the metrics dict'
    if self.metric is not None and (not isinstance(self.metric, str) or not self.metric):
      return f'metric={self.metric!r}: use a metric name such as "train/loss"'
    return (_flag('reverse', self.reverse) or _int_at_least('n', self.n, 0, optional=True)
            or _flag('keep_checkpoints_without_metrics', self.keep_checkpoints_without_metrics))

  def _value(self, c: CheckpointInfo) -> Any:
    return self.get_metric_fn(c.metrics) if self.get_metric_fn is not None else c.metrics[self.metric]

  def _has_metrics(self, c: CheckpointInfo) -> bool:
    return c.metrics is not None and (self.metric is None or self.metric in c.metrics)

  def should_preserve(self, checkpoints, *, context):
    del context
    if self.n is None or len(checkpoints) <= self.n:
      return [True] * len(checkpoints)
    if self.n == 0:
      return [False] * len(checkpoints)
    measured = [i for i, c in enumerate(checkpoints) if self._has_metrics(c)]
    unmeasured = set(range(len(checkpoints))) - set(measured)
    values = {i: self._value(checkpoints[i]) for i in measured}
    worst = [i for i in measured if not _finite(values[i])]
    # A stable sort: among equal values the newer checkpoint ranks later, so it is the one kept.
    ranked = worst + sorted((i for i in measured if _finite(values[i])), key=values.get, reverse=self.reverse)
    chosen = set(ranked[len(ranked) - min(self.n, len(ranked)):])
    return [i in chosen or (self.keep_checkpoints_without_metrics and i in unmeasured)
            for i in range(len(checkpoints))]


@dataclasses.dataclass(frozen=True)
class AnyPreservationPolicy:
  """Keep a checkpoint when any of the policies keeps it."""

  policies: Sequence[PreservationPolicy]

  def problem(self) -> str | None:
    return _members(self.policies, PreservationPolicy)

  def should_preserve(self, checkpoints, *, context):
    votes = [list(p.should_preserve(checkpoints, context=context)) for p in self.policies]
    return [any(v[i] for v in votes) for i in range(len(checkpoints))]


def to_delete(policy: PreservationPolicy, checkpoints: Sequence[CheckpointInfo], *,
              context: PreservationContext, protected: set[int]) -> list[int]:
  """The boundary for preservation: the steps the policy does not keep, as plain ints (a policy may
  answer with numpy bools). The newest and the `protected` steps are never among them."""
  checkpoints = sorted(checkpoints, key=lambda c: c.step)
  if not checkpoints:
    return []
  keep = [bool(k) for k in policy.should_preserve(checkpoints, context=context)]
  if len(keep) != len(checkpoints):
    raise ValueError(f'{policy!r}.should_preserve returned {len(keep)} answers for '
                     f'{len(checkpoints)} checkpoints')
  newest = checkpoints[-1].step
  return [c.step for c, k in zip(checkpoints, keep)
          if not k and c.step != newest and c.step not in protected]
