"""Save-decision and preservation policies on synthetic histories (orbax-latest's interface)."""

import dataclasses
import datetime
import math
from typing import Sequence

import numpy as np
import pytest

from pax_autockpt import policies as P

CI = P.CheckpointInfo.at
T0 = 1_700_000_000.0


def ctx(saving=False, preempted=False, cost=None, duration=None):
  return P.DecisionContext(is_saving_in_progress=saving, reached_preemption=preempted, save_cost_secs=cost,
                           save_duration_secs=duration)


def history(*pairs):
  return [CI(s, T0 + t) for s, t in pairs]


def saves(policy, step, now=100.0, previous=(), **context):
  return P.ask_save(policy, step, now=T0 + now, previous=list(previous), context=ctx(**context))


def test_fixed_interval_and_specific_steps():
  assert [s for s in range(0, 25) if saves(P.FixedIntervalPolicy(10), s)] == [0, 10, 20]
  assert [s for s in range(10) if saves(P.SpecificStepsPolicy((3, 7)), s)] == [3, 7]
  assert [s for s in range(10) if saves(P.SpecificStepsPolicy(range(2, 10, 4)), s)] == [2, 6]


def test_the_current_step_is_an_info_whose_time_is_now():
  seen = []

  class Spy:
    def should_save(self, step, previous_steps, *, context):
      seen.append((step, list(previous_steps), context))
      return False

  previous = history((1, 5.0))
  assert not saves(Spy(), 2, now=7.5, previous=previous)
  step, prev, context = seen[0]
  assert (step.step, step.time, step.metrics) == (2, datetime.datetime.fromtimestamp(T0 + 7.5, P.UTC), None)
  assert step.time.tzinfo is not None and prev == previous
  assert context.multiprocessing_options.primary_host == 0


def test_continuous_saves_back_to_back_without_minimum():
  p = P.ContinuousCheckpointingPolicy()
  assert saves(p, 5)
  assert saves(p, 6, now=100.0, previous=history((5, 99.9)))
  assert not saves(p, 6, previous=history((5, 99.9)), saving=True)  # previous still saving


def test_continuous_minimum_interval():
  p = P.ContinuousCheckpointingPolicy(minimum_interval_secs=30)
  prev = history((0, 1000.0))
  assert not saves(p, 1, now=1029.9, previous=prev)
  assert saves(p, 1, now=1030.0, previous=prev)
  assert not saves(p, 1, now=1100.0, previous=prev, saving=True)


def test_continuous_clock_jump_backwards_does_not_stall():
  """The documented difference from orbax-latest (which would wait until the clock caught up)."""
  p = P.ContinuousCheckpointingPolicy(minimum_interval_secs=30)
  assert saves(p, 2, now=4000.0, previous=history((1, 5000.0)))


def test_continuous_clock_jump_forwards_saves():
  p = P.ContinuousCheckpointingPolicy(minimum_interval_secs=30)
  assert saves(p, 2, now=1_000_000.0, previous=history((1, 1000.0)))


def test_constructors_are_keyword_only_where_orbax_latest_s_are():
  with pytest.raises(TypeError):
    P.ContinuousCheckpointingPolicy(30)  # pylint: disable=too-many-function-args
  with pytest.raises(TypeError):
    P.BestN(lambda m: m['loss'])  # pylint: disable=too-many-function-args
  with pytest.raises(TypeError):
    P.YoungDalyPolicy(1.0)  # pylint: disable=too-many-function-args
  assert P.EveryNSeconds(180) == P.EveryNSeconds(interval_secs=180)  # positional, as in orbax's docs


def test_preemption_initial_and_any():
  assert saves(P.PreemptionCheckpointingPolicy(), 7, preempted=True)
  assert not saves(P.PreemptionCheckpointingPolicy(), 7)
  assert saves(P.InitialSavePolicy(), 7)
  assert not saves(P.InitialSavePolicy(), 7, previous=history((0, 1.0)))
  anyp = P.AnySavePolicy((P.FixedIntervalPolicy(100), P.PreemptionCheckpointingPolicy()))
  assert saves(anyp, 100)
  assert saves(anyp, 7, preempted=True)
  assert not saves(anyp, 7, saving=True)


def test_young_daly_interval_and_goodput():
  assert P.young_daly_interval(0.5, 3600.0) == pytest.approx(60.0)
  d, tau, r, m = 0.5, 10.0, 2.0, 3600.0
  assert P.goodput(d, tau, r, m) == pytest.approx(1 - d / tau - (tau / 2 + r) / m)
  assert P.goodput(0.0, 0.0, 36.0, m) == pytest.approx(0.99)
  assert P.goodput(1.0, 0.0, 0.0, m) == 0.0


def test_young_daly_policy_sets_its_interval_from_the_measured_cost():
  p = P.YoungDalyPolicy(mtbf_hours=1.0)  # tau = sqrt(2 * 0.5 * 3600) = 60 s
  assert p.interval_secs(None, None) is None
  assert p.interval_secs(0.5, 0.2) == pytest.approx(60.0)
  assert p.interval_secs(0.5, 90.0) == pytest.approx(90.0)  # never below the save duration
  assert p.interval_secs(5000.0, 1.0) == pytest.approx(3600.0)  # never above the MTBF
  prev = history((10, 1000.0))
  assert saves(p, 1)  # the first save measures the cost
  assert saves(p, 11, now=1001.0, previous=prev)  # cost not measured yet: save
  assert not saves(p, 11, now=1059.9, previous=prev, cost=0.5)
  assert saves(p, 11, now=1060.0, previous=prev, cost=0.5)
  assert not saves(p, 11, now=1060.0, previous=prev, cost=0.5, saving=True)
  assert not saves(p, 11, now=1060.0, previous=prev, cost=2.0)  # costlier saves: 120 s apart
  assert saves(p, 11, now=500.0, previous=prev, cost=0.5)  # clock jumped back: as continuous


def test_find_looks_inside_any_policies():
  yd = P.YoungDalyPolicy(mtbf_hours=2.0)
  assert P.find(P.AnySavePolicy((P.InitialSavePolicy(), P.AnySavePolicy((yd,)))), P.YoungDalyPolicy) is yd
  assert P.find(P.FixedIntervalPolicy(3), P.YoungDalyPolicy) is None
  assert P.find(None, P.YoungDalyPolicy) is None


ALL_SAVE = (P.FixedIntervalPolicy(1), P.SpecificStepsPolicy(()), P.ContinuousCheckpointingPolicy(),
            P.PreemptionCheckpointingPolicy(), P.InitialSavePolicy(), P.AnySavePolicy((P.InitialSavePolicy(),)),
            P.YoungDalyPolicy(mtbf_hours=1))
ALL_PRESERVE = (P.PreserveAll(), P.LatestN(1), P.LatestN(None), P.EveryNSeconds(1), P.EveryNSteps(1),
                P.EveryNSteps(2, max_to_keep=3), P.EveryNStepsClosest(5), P.CustomSteps(()),
                P.LatestDuration(datetime.timedelta(hours=1)), P.BestN(metric='train/loss', n=2),
                P.BestN(get_metric_fn=lambda m: m['x']), P.AnyPreservationPolicy((P.LatestN(1),)))


def test_policies_satisfy_the_protocols_and_are_valid():
  for p in ALL_SAVE:
    assert isinstance(p, P.SaveDecisionPolicy) and P.problem_with(p, P.SaveDecisionPolicy) is None, p
  for p in ALL_PRESERVE:
    assert isinstance(p, P.PreservationPolicy) and P.problem_with(p, P.PreservationPolicy) is None, p


@pytest.mark.parametrize('policy,needle', [
    (P.FixedIntervalPolicy(0), 'FixedIntervalPolicy.interval=0: use an integer >= 1'),
    (P.FixedIntervalPolicy(2.5), 'FixedIntervalPolicy.interval=2.5'),
    (P.SpecificStepsPolicy('100'), "SpecificStepsPolicy.steps='100': use a collection of integer steps"),
    (P.ContinuousCheckpointingPolicy(minimum_interval_secs=-1), 'minimum_interval_secs=-1: use a number'),
    (P.AnySavePolicy(()), 'AnySavePolicy.policies=(): use a non-empty sequence'),
    (P.AnySavePolicy((P.LatestN(1),)), 'AnySavePolicy.policies[0]: LatestN has no should_save() method'),
    (P.AnySavePolicy((P.FixedIntervalPolicy(-5),)), 'policies[0]: FixedIntervalPolicy.interval=-5'),
    (P.YoungDalyPolicy(mtbf_hours=0), 'YoungDalyPolicy.mtbf_hours=0: use a number of hours > 0'),
    (P.YoungDalyPolicy(mtbf_hours=math.inf), 'YoungDalyPolicy.mtbf_hours=inf'),
    ('every 100 steps', 'str has no should_save() method'),
])
def test_invalid_save_policy_parameters(policy, needle):
  assert needle in P.problem_with(policy, P.SaveDecisionPolicy)


@pytest.mark.parametrize('policy,needle', [
    (P.LatestN(-1), 'LatestN.n=-1: use an integer >= 0, or None'),
    (P.LatestN('3'), "LatestN.n='3'"),
    (P.EveryNSeconds(0), 'EveryNSeconds.interval_secs=0: use a number of seconds > 0'),
    (P.EveryNSteps(0), 'EveryNSteps.interval_steps=0: use an integer >= 1'),
    (P.EveryNSteps(10, exact_interval='yes'), "EveryNSteps.exact_interval='yes': use True or False"),
    (P.EveryNSteps(10, max_to_keep=0), 'EveryNSteps.max_to_keep=0: use an integer >= 1, or None'),
    (P.EveryNStepsClosest(-100), 'EveryNStepsClosest.interval_steps=-100'),
    (P.CustomSteps(None), 'CustomSteps.steps=None'),
    (P.LatestDuration(3600), 'LatestDuration.duration=3600: use a datetime.timedelta > 0'),
    (P.LatestDuration(datetime.timedelta(0)), 'LatestDuration.duration'),
    (P.BestN(), 'BestN.get_metric_fn / metric: give exactly one of them'),
    (P.BestN(get_metric_fn=len, metric='train/loss'), 'give exactly one'),
    (P.BestN(get_metric_fn='train/loss'), 'BestN.get_metric_fn=\'train/loss\': use a function'),
    (P.BestN(metric='', n=3), "BestN.metric='': use a metric name"),
    (P.BestN(metric='train/loss', n=-1), 'BestN.n=-1'),
    (P.BestN(metric='train/loss', reverse=None), 'BestN.reverse=None: use True or False'),
    (P.AnyPreservationPolicy([]), 'AnyPreservationPolicy.policies=[]'),
    (P.AnyPreservationPolicy([P.LatestN(1), P.EveryNSteps(0)]),
     'AnyPreservationPolicy.policies[1]: EveryNSteps.interval_steps=0'),
    (42, 'int has no should_preserve() method'),
])
def test_invalid_preservation_policy_parameters(policy, needle):
  found = P.problem_with(policy, P.PreservationPolicy)
  assert found and needle in found and '\n' not in found


def test_only_our_own_policies_are_asked_for_their_problem():
  class Theirs:
    def problem(self):
      return 'not a validity check'

    def should_preserve(self, checkpoints, *, context):
      return [True] * len(checkpoints)

  assert P.problem_with(Theirs(), P.PreservationPolicy) is None


NOW = P.utc(T0 + 1000.0)
PCTX = P.PreservationContext(now=NOW)
CKPTS = history((0, 0.0), (100, 50.0), (200, 100.0), (300, 170.0), (400, 180.0), (500, 400.0))


def keep(policy, ckpts=CKPTS, context=PCTX):
  return [c.step for c, k in zip(ckpts, policy.should_preserve(ckpts, context=context)) if k]


def test_latest_n():
  assert keep(P.LatestN(2)) == [400, 500]
  assert keep(P.LatestN(10)) == [0, 100, 200, 300, 400, 500]
  assert keep(P.LatestN()) == keep(P.LatestN(None)) == [0, 100, 200, 300, 400, 500]  # orbax: everything
  assert keep(P.LatestN(0)) == []


def test_every_n_seconds_keeps_first_then_spaced():
  assert keep(P.EveryNSeconds(100)) == [0, 200, 500]  # t = 0, 100, 400
  assert keep(P.EveryNSeconds(100), history((0, 0.0), (1, 99.999999), (2, 100.000001))) == [0, 2]


def test_every_n_steps_exact_and_not_and_max_to_keep():
  assert keep(P.EveryNSteps(200)) == [0, 200, 400]
  odd = history((3, 0.0), (150, 0.0), (260, 0.0), (390, 0.0), (420, 0.0))
  assert keep(P.EveryNSteps(200, exact_interval=False), odd) == [3, 260]
  assert keep(P.EveryNSteps(100, max_to_keep=2)) == [400, 500]
  assert keep(P.EveryNSteps(200, max_to_keep=5)) == [0, 200, 400]


def test_every_n_steps_closest():
  irregular = history((0, 0), (95, 0), (105, 0), (190, 0), (310, 0), (350, 0), (420, 0))
  # 95 and 105 are equally close to 100: the newer one; 350 and 420 are both nearest 400: 420.
  assert keep(P.EveryNStepsClosest(100), irregular) == [0, 105, 190, 310, 420]
  # Python's rounding, as orbax's: 150 and 250 both go to 200 (halves to even), and 250 is newer.
  assert keep(P.EveryNStepsClosest(100), history((150, 0), (250, 0))) == [250]
  assert keep(P.EveryNStepsClosest(100, max_to_keep=2), irregular) == [310, 420]
  assert keep(P.EveryNStepsClosest(1000), irregular) == [0, 420]  # the newest always kept
  assert keep(P.EveryNStepsClosest(100), []) == []


def test_custom_steps_and_latest_duration():
  assert keep(P.CustomSteps((100, 400))) == [100, 400]
  assert keep(P.CustomSteps({100, 400})) == [100, 400]
  assert keep(P.LatestDuration(datetime.timedelta(seconds=830))) == [300, 400, 500]  # ages 830, 820, 600
  assert keep(P.LatestDuration(datetime.timedelta(seconds=829))) == [400, 500]
  assert keep(P.LatestDuration(datetime.timedelta(seconds=1))) == []
  clock = P.PreservationContext()  # no `now`: the clock's, as orbax-latest
  assert keep(P.LatestDuration(datetime.timedelta(days=1)), history((9, 0.0)), clock) == []
  assert keep(P.LatestDuration(datetime.timedelta(days=1)), [CI(9, datetime.datetime.now().timestamp())], clock) == [9]


def with_metrics(*rows):
  """(step, metrics) rows, a second apart."""
  return [CI(s, T0 + i, m) for i, (s, m) in enumerate(rows)]


LOSSES = with_metrics((1, {'loss': 3.0}), (2, None), (3, {'loss': 1.0}), (4, {'loss': 2.0}),
                      (5, {'loss': 1.0}), (6, {'acc': 0.5}))


def test_best_n_keeps_the_lowest_with_reverse_and_those_without_metrics():
  by_fn = P.BestN(get_metric_fn=lambda m: m.get('loss', 9.0), reverse=True, n=2)
  assert keep(by_fn, LOSSES) == [2, 3, 5]  # lowest two (the tie: both), step 2 has no metrics
  by_name = P.BestN(metric='loss', reverse=True, n=2)
  assert keep(by_name, LOSSES) == [2, 3, 5, 6]  # step 6 lacks 'loss': counted as without metrics
  strict = P.BestN(metric='loss', reverse=True, n=2, keep_checkpoints_without_metrics=False)
  assert keep(strict, LOSSES) == [3, 5]
  assert keep(P.BestN(metric='loss', n=1), LOSSES) == [1, 2, 6]  # reverse=False keeps the highest


def test_best_n_ties_keep_the_newer_and_orbax_s_n_rules():
  tie = P.BestN(metric='loss', reverse=True, n=1, keep_checkpoints_without_metrics=False)
  assert keep(tie, LOSSES) == [5]  # 3 and 5 both 1.0: the newer
  assert keep(dataclasses.replace(tie, reverse=False), with_metrics((1, {'loss': 2.0}), (2, {'loss': 2.0}),
                                                                    (3, {'loss': 1.0}))) == [2]
  assert keep(P.BestN(metric='loss', n=None), LOSSES) == [1, 2, 3, 4, 5, 6]
  assert keep(P.BestN(metric='loss', n=0), LOSSES) == []  # orbax: n=0 keeps nothing, metrics or not
  assert keep(P.BestN(metric='loss', n=6, keep_checkpoints_without_metrics=False), LOSSES) == [1, 2, 3, 4, 5, 6]


def test_any_preservation():
  assert keep(P.AnyPreservationPolicy((P.LatestN(1), P.CustomSteps((100,))))) == [100, 500]


def test_to_delete_never_removes_newest_or_protected():
  everything = P.CustomSteps(())
  assert P.to_delete(everything, CKPTS, context=PCTX, protected={200}) == [0, 100, 300, 400]
  assert P.to_delete(P.LatestN(2), list(reversed(CKPTS)), context=PCTX, protected=set()) == [0, 100, 200, 300]
  assert P.to_delete(P.LatestN(1), [], context=PCTX, protected=set()) == []


def test_user_defined_policy_protocol_and_bad_answer_length():

  class KeepEven:
    """A user's own policy: any object with should_preserve()."""

    def should_preserve(self, checkpoints, *, context):
      del context
      return np.array([c.step % 200 == 0 for c in checkpoints])  # numpy answers are fine

  assert isinstance(KeepEven(), P.PreservationPolicy)
  assert P.to_delete(KeepEven(), CKPTS, context=PCTX, protected=set()) == [100, 300]

  class Broken:
    def should_preserve(self, checkpoints, *, context):
      return [True]

  with pytest.raises(ValueError, match='returned 1 answers for 6 checkpoints'):
    P.to_delete(Broken(), CKPTS, context=PCTX, protected=set())


# Written against orbax-latest's documented interface, shape for shape (the CustomizedPreservationPolicy
# of the Orbax/MaxText continuous checkpointing article and a save decision in the style of orbax's own):
# only the import of the base classes differs (`from pax_autockpt.policies import ...` for orbax's
# modules).
PolicyCheckpointInfo = P.CheckpointInfo
PreservationContext = P.PreservationContext
PreservationPolicy = P.PreservationPolicy
SaveDecisionPolicy = P.SaveDecisionPolicy
DecisionContext = P.DecisionContext


def is_checkpoint_preservable(checkpoint: PolicyCheckpointInfo) -> bool:
  return checkpoint.step % 200 == 0 or (checkpoint.metrics is not None and checkpoint.metrics['train/loss'] < 1.5)


@dataclasses.dataclass
class CustomizedPreservationPolicy(PreservationPolicy):
  """Implement your own policy for reserving checkpoints."""

  def should_preserve(
      self,
      checkpoints: Sequence[PolicyCheckpointInfo],
      *,
      context: PreservationContext,
  ) -> Sequence[bool]:
    result = [is_checkpoint_preservable(checkpoint) for checkpoint in checkpoints]
    return np.asarray(result).tolist()


@dataclasses.dataclass(kw_only=True)
class SaveEveryDurationUnlessPreempted(SaveDecisionPolicy):
  """Checkpoint when `minimum_interval` has passed since the previous checkpoint, or on preemption."""

  minimum_interval: datetime.timedelta = datetime.timedelta(minutes=5)

  def should_save(
      self,
      step: PolicyCheckpointInfo,
      previous_steps: Sequence[PolicyCheckpointInfo],
      *,
      context: DecisionContext,
  ) -> bool:
    if context.reached_preemption:
      return True
    if context.is_saving_in_progress:
      return False
    if context.multiprocessing_options.primary_host is None:
      return False
    if not previous_steps:
      return True
    return step.time - previous_steps[-1].time >= self.minimum_interval


def test_policies_written_for_orbax_latest_run_unchanged():
  prev = history((10, 0.0))
  policy = SaveEveryDurationUnlessPreempted(minimum_interval=datetime.timedelta(seconds=30))
  assert P.problem_with(policy, P.SaveDecisionPolicy) is None
  assert not saves(policy, 11, now=29.0, previous=prev)
  assert saves(policy, 11, now=30.0, previous=prev)
  assert saves(policy, 11, now=1.0, previous=prev, preempted=True)
  assert saves(P.AnySavePolicy([P.FixedIntervalPolicy(1000), policy]), 11, now=31.0, previous=prev)
  ckpts = with_metrics((100, {'train/loss': 1.0}), (200, None), (300, {'train/loss': 2.0}),
                       (400, {'train/loss': 1.7}))
  assert P.problem_with(CustomizedPreservationPolicy(), P.PreservationPolicy) is None
  assert P.to_delete(CustomizedPreservationPolicy(), ckpts, context=PCTX, protected=set()) == [300]
  anyp = P.AnyPreservationPolicy([CustomizedPreservationPolicy(), P.LatestN(n=2)])
  assert P.to_delete(anyp, ckpts, context=PCTX, protected=set()) == []
