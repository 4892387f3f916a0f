"""Differential test: pax_autockpt.policies against orbax-latest's recorded answers.

tests/data/orbax_policy_answers.json holds seeded random histories (steps, times, metrics) and random
valid policies, with the decisions orbax-checkpoint 0.12.8 took on them (made once by
tests/data/make_orbax_policy_answers.py in a Python 3.11 venv: orbax-latest needs a newer jax).
"""

import datetime
import json
import os

import pytest

from pax_autockpt import policies as P

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', 'orbax_policy_answers.json')
with open(DATA) as _f:
  ANSWERS = json.load(_f)
BASE = datetime.datetime.fromtimestamp(ANSWERS['base'], tz=datetime.timezone.utc)


def when(us):
  return BASE + datetime.timedelta(microseconds=us)


def infos(rows):
  return [P.CheckpointInfo(step, when(us), metrics) for step, us, metrics in rows]


def save_policy(spec):
  args = {k: v for k, v in spec.items() if k != 'type'}
  if spec['type'] == 'AnySavePolicy':
    return P.AnySavePolicy([save_policy(p) for p in args['policies']])
  return getattr(P, spec['type'])(**args)


def preservation_policy(spec, by_name=False):
  """Ours, built as orbax's was: BestN with orbax's get_metric_fn, or (`by_name`) with `metric=`."""
  args = {k: v for k, v in spec.items() if k != 'type'}
  kind = spec['type']
  if kind == 'AnyPreservationPolicy':
    return P.AnyPreservationPolicy([preservation_policy(p, by_name) for p in args['policies']])
  if kind == 'BestN' and not by_name:
    metric = args.pop('metric')
    return P.BestN(get_metric_fn=lambda m: m[metric], **args)
  if kind == 'LatestDuration':
    return P.LatestDuration(datetime.timedelta(microseconds=args['duration_us']))
  return getattr(P, kind)(**args)


def uses(spec, kind):
  return spec['type'] == kind or any(uses(p, kind) for p in spec.get('policies', ()))


def test_the_recorded_answers_are_orbax_latest_and_cover_every_policy():
  assert ANSWERS['orbax_checkpoint'] == '0.12.8'
  assert len(ANSWERS['save']) >= 300 and len(ANSWERS['preserve']) >= 600
  kinds = {c['policy']['type'] for c in ANSWERS['save'] + ANSWERS['preserve']}
  assert kinds == {'FixedIntervalPolicy', 'SpecificStepsPolicy', 'ContinuousCheckpointingPolicy',
                   'PreemptionCheckpointingPolicy', 'InitialSavePolicy', 'AnySavePolicy', 'PreserveAll',
                   'LatestN', 'EveryNSeconds', 'EveryNSteps', 'EveryNStepsClosest', 'CustomSteps', 'BestN',
                   'LatestDuration', 'AnyPreservationPolicy'}


def test_every_recorded_policy_is_valid_here():
  for case in ANSWERS['save']:
    assert P.problem_with(save_policy(case['policy']), P.SaveDecisionPolicy) is None, case['policy']
  for case in ANSWERS['preserve']:
    assert P.problem_with(preservation_policy(case['policy']), P.PreservationPolicy) is None, case['policy']


def test_save_decisions_agree_with_orbax():
  compared, excluded = 0, 0
  for case in ANSWERS['save']:
    previous = infos(case['previous'])
    now = when(case['now_us'])
    # Documented difference (docs/continuous.md): a clock that jumped backwards does not stall continuous
    # checkpointing here, where orbax-latest waits until the clock has caught up. Excluded.
    if uses(case['policy'], 'ContinuousCheckpointingPolicy') and previous and now < previous[-1].time:
      excluded += 1
      continue
    context = P.DecisionContext(is_saving_in_progress=case['saving'], reached_preemption=case['preempted'])
    ours = P.ask_save(save_policy(case['policy']), case['step'], now=now.timestamp(), previous=previous,
                      context=context)
    assert ours == case['answer'], case
    compared += 1
  assert compared >= 250 and excluded >= 1
  print(f'save decisions: {compared} agree with orbax 0.12.8, {excluded} excluded (clock jumped back)')


@pytest.mark.parametrize('by_name', [False, True], ids=['get_metric_fn', 'metric_name'])
def test_preservation_agrees_with_orbax(by_name):
  checkpoints_compared = 0
  for case in ANSWERS['preserve']:
    ckpts = infos(case['checkpoints'])
    context = P.PreservationContext(now=when(case['now_us']))
    policy = preservation_policy(case['policy'], by_name)
    assert list(policy.should_preserve(ckpts, context=context)) == case['answer'], case
    # Documented difference (docs/continuous.md): orbax deletes every checkpoint its policy does not keep; here
    # `to_delete` never deletes the newest one. So ours = orbax's minus the newest, nothing else.
    orbax_deletes = [c.step for c, keep in zip(ckpts, case['answer']) if not keep]
    newest = [ckpts[-1].step] if ckpts else []
    assert P.to_delete(policy, ckpts, context=context, protected=set()) == [
        s for s in orbax_deletes if s not in newest]
    checkpoints_compared += len(ckpts)
  assert checkpoints_compared >= 2500
