"""When to save, and which checkpoints to keep: orbax-latest's policy shapes, for orbax 0.5.9.

Pure decision functions fed a context object. The checkpointer asks them on the primary host and
publishes the answer to every host (pax_autockpt.agreement), so all hosts start the same saves.
Deliberate difference from orbax-latest: a clock that jumped backwards (negative elapsed time) does
not stall continuous checkpointing; the next save is allowed.
"""

import dataclasses
from typing import Protocol, Sequence, runtime_checkable


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
  """A checkpoint as the policies see it: its step and when its save started (unix seconds)."""

  step: int
  time: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecisionContext:
  """What a save decision may look at besides the step and the previous checkpoints."""

  now: float
  is_saving_in_progress: bool
  reached_preemption: bool = False


@runtime_checkable
class SaveDecisionPolicy(Protocol):
  """Returns True when a checkpoint should be saved at `step` (before the step runs)."""

  def should_save(self, step: int, previous: Sequence[CheckpointInfo], *,
                  context: DecisionContext) -> bool:
    ...


@dataclasses.dataclass(frozen=True)
class FixedIntervalPolicy:
  """Save every `interval` steps."""

  interval: int

  def should_save(self, step, previous, *, context):
    del previous, context
    return step % self.interval == 0


@dataclasses.dataclass(frozen=True)
class SpecificStepsPolicy:
  """Save at the listed steps."""

  steps: tuple[int, ...]

  def should_save(self, step, previous, *, context):
    del previous, context
    return step in self.steps


@dataclasses.dataclass(frozen=True)
class ContinuousCheckpointingPolicy:
  """Save as soon as the previous save has committed, no two starts closer than the minimum."""

  minimum_interval_secs: float | None = None

  def should_save(self, step, previous, *, context):
    del step
    if context.is_saving_in_progress:
      return False
    if not previous or not self.minimum_interval_secs:
      return True
    elapsed = context.now - previous[-1].time
    return elapsed < 0 or elapsed >= self.minimum_interval_secs


@dataclasses.dataclass(frozen=True)
class PreemptionCheckpointingPolicy:
  """Save at the step every host agreed on after a preemption signal."""

  def should_save(self, step, previous, *, context):
    del step, previous
    return context.reached_preemption


@dataclasses.dataclass(frozen=True)
class InitialSavePolicy:
  """Save as soon as possible when no checkpoint exists yet."""

  def should_save(self, step, previous, *, context):
    del step, context
    return not previous


@dataclasses.dataclass(frozen=True)
class AnySavePolicy:
  """Save when any of the policies says so."""

  policies: tuple[SaveDecisionPolicy, ...]

  def should_save(self, step, previous, *, context):
    return any(p.should_save(step, previous, context=context) for p in self.policies)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreservationContext:
  """What a preservation decision may look at besides the checkpoints."""

  now: float


@runtime_checkable
class PreservationPolicy(Protocol):
  """Returns, for each checkpoint (oldest first), whether to keep it."""

  def should_preserve(self, checkpoints: Sequence[CheckpointInfo], *,
                      context: PreservationContext) -> Sequence[bool]:
    ...


@dataclasses.dataclass(frozen=True)
class PreserveAll:
  """Keep everything."""

  def should_preserve(self, checkpoints, *, context):
    del context
    return [True] * len(checkpoints)


@dataclasses.dataclass(frozen=True)
class LatestN:
  """Keep the newest n checkpoints."""

  n: int

  def should_preserve(self, checkpoints, *, context):
    del context
    cut = max(0, len(checkpoints) - self.n)
    return [i >= cut for i in range(len(checkpoints))]


def _spaced(values: Sequence[float], gap: float) -> list[bool]:
  """Keeps the first value, then each one at least `gap` after the last one kept."""
  keep, last = [], None
  for v in values:
    keep.append(last is None or v - last >= gap)
    last = v if keep[-1] else last
  return keep


@dataclasses.dataclass(frozen=True)
class EveryNSeconds:
  """Keep the oldest, then each one at least `interval_secs` after the last one kept."""

  interval_secs: float

  def should_preserve(self, checkpoints, *, context):
    del context
    return _spaced([c.time for c in checkpoints], self.interval_secs)


@dataclasses.dataclass(frozen=True)
class EveryNSteps:
  """Keep multiples of `interval_steps` (or, not exact, the first and then every >= N steps)."""

  interval_steps: int
  exact_interval: bool = True

  def should_preserve(self, checkpoints, *, context):
    del context
    if self.exact_interval:
      return [c.step % self.interval_steps == 0 for c in checkpoints]
    return _spaced([c.step for c in checkpoints], self.interval_steps)


@dataclasses.dataclass(frozen=True)
class CustomSteps:
  """Keep the listed steps."""

  steps: tuple[int, ...]

  def should_preserve(self, checkpoints, *, context):
    del context
    return [c.step in self.steps for c in checkpoints]


@dataclasses.dataclass(frozen=True)
class AnyPreservationPolicy:
  """Keep a checkpoint when any of the policies keeps it."""

  policies: tuple[PreservationPolicy, ...]

  def should_preserve(self, checkpoints, *, context):
    votes = [p.should_preserve(checkpoints, context=context) for p in self.policies]
    return [any(v[i] for v in votes) for i in range(len(checkpoints))]


def to_delete(policy: PreservationPolicy, checkpoints: Sequence[CheckpointInfo], *,
              context: PreservationContext, protected: set[int]) -> list[int]:
  """Steps the policy does not keep; the newest and the `protected` steps are never among them."""
  checkpoints = sorted(checkpoints, key=lambda c: c.step)
  if not checkpoints:
    return []
  keep = list(policy.should_preserve(checkpoints, context=context))
  if len(keep) != len(checkpoints):
    raise ValueError(f'{policy!r}.should_preserve returned {len(keep)} answers for '
                     f'{len(checkpoints)} checkpoints')
  newest = checkpoints[-1].step
  return [c.step for c, k in zip(checkpoints, keep)
          if not k and c.step != newest and c.step not in protected]
