"""Save-decision and preservation policies on synthetic (step, time) histories."""

import pytest

from pax_autockpt import policies as P

CI = P.CheckpointInfo


def ctx(now=100.0, saving=False, preempted=False):
  return P.DecisionContext(now=now, is_saving_in_progress=saving, reached_preemption=preempted)


def history(*pairs):
  return [CI(s, t) for s, t in pairs]


def test_fixed_interval_and_specific_steps():
  assert [s for s in range(0, 25) if P.FixedIntervalPolicy(10).should_save(s, [], context=ctx())] == [0, 10, 20]
  assert [s for s in range(10) if P.SpecificStepsPolicy((3, 7)).should_save(s, [], context=ctx())] == [3, 7]


def test_continuous_saves_back_to_back_without_minimum():
  p = P.ContinuousCheckpointingPolicy()
  assert p.should_save(5, [], context=ctx())
  assert p.should_save(6, history((5, 99.9)), context=ctx(now=100.0))
  assert not p.should_save(6, history((5, 99.9)), context=ctx(saving=True))  # previous still saving


def test_continuous_minimum_interval():
  p = P.ContinuousCheckpointingPolicy(minimum_interval_secs=30)
  prev = history((0, 1000.0))
  assert not p.should_save(1, prev, context=ctx(now=1029.9))
  assert p.should_save(1, prev, context=ctx(now=1030.0))
  assert not p.should_save(1, prev, context=ctx(now=1100.0, saving=True))


def test_continuous_clock_jump_backwards_does_not_stall():
  p = P.ContinuousCheckpointingPolicy(minimum_interval_secs=30)
  assert p.should_save(2, history((1, 5000.0)), context=ctx(now=4000.0))


def test_continuous_clock_jump_forwards_saves():
  p = P.ContinuousCheckpointingPolicy(minimum_interval_secs=30)
  assert p.should_save(2, history((1, 1000.0)), context=ctx(now=1_000_000.0))


def test_preemption_initial_and_any():
  assert P.PreemptionCheckpointingPolicy().should_save(7, [], context=ctx(preempted=True))
  assert not P.PreemptionCheckpointingPolicy().should_save(7, [], context=ctx())
  assert P.InitialSavePolicy().should_save(7, [], context=ctx())
  assert not P.InitialSavePolicy().should_save(7, history((0, 1.0)), context=ctx())
  anyp = P.AnySavePolicy((P.FixedIntervalPolicy(100), P.PreemptionCheckpointingPolicy()))
  assert anyp.should_save(100, [], context=ctx())
  assert anyp.should_save(7, [], context=ctx(preempted=True))  # preemption during a continuous save
  assert not anyp.should_save(7, [], context=ctx(saving=True))


def test_policies_satisfy_the_protocols():
  for p in (P.FixedIntervalPolicy(1), P.ContinuousCheckpointingPolicy(), P.InitialSavePolicy(),
            P.PreemptionCheckpointingPolicy(), P.AnySavePolicy(()), P.SpecificStepsPolicy(())):
    assert isinstance(p, P.SaveDecisionPolicy)
  for p in (P.LatestN(1), P.EveryNSeconds(1), P.EveryNSteps(1), P.CustomSteps(()), P.PreserveAll(),
            P.AnyPreservationPolicy(())):
    assert isinstance(p, P.PreservationPolicy)


PCTX = P.PreservationContext(now=0.0)
CKPTS = history((0, 0.0), (100, 50.0), (200, 100.0), (300, 170.0), (400, 180.0), (500, 400.0))


def keep(policy, ckpts=CKPTS):
  return [c.step for c, k in zip(ckpts, policy.should_preserve(ckpts, context=PCTX)) if k]


def test_latest_n():
  assert keep(P.LatestN(2)) == [400, 500]
  assert keep(P.LatestN(10)) == [0, 100, 200, 300, 400, 500]


def test_every_n_seconds_keeps_first_then_spaced():
  assert keep(P.EveryNSeconds(100)) == [0, 200, 500]  # t = 0, 100, 400


def test_every_n_steps_exact_and_not():
  assert keep(P.EveryNSteps(200)) == [0, 200, 400]
  odd = history((3, 0.0), (150, 0.0), (260, 0.0), (390, 0.0), (420, 0.0))
  assert keep(P.EveryNSteps(200, exact_interval=False), odd) == [3, 260]


def test_custom_and_any():
  assert keep(P.CustomSteps((100, 400))) == [100, 400]
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
      return [c.step % 200 == 0 for c in checkpoints]

  assert isinstance(KeepEven(), P.PreservationPolicy)
  assert P.to_delete(KeepEven(), CKPTS, context=PCTX, protected=set()) == [100, 300]

  class Broken:
    def should_preserve(self, checkpoints, *, context):
      return [True]

  with pytest.raises(ValueError, match='returned 1 answers for 6 checkpoints'):
    P.to_delete(Broken(), CKPTS, context=PCTX, protected=set())
