"""Records orbax-latest's policy decisions on seeded random checkpoint histories, once.

    /root/.pyenv/versions/3.11.7/bin/python -m venv /tmp/orbax-latest-venv
    /tmp/orbax-latest-venv/bin/pip install orbax-checkpoint==0.12.8
    /tmp/orbax-latest-venv/bin/python tests/data/make_orbax_policy_answers.py

writes tests/data/orbax_policy_answers.json, which tests/test_policies_orbax.py feeds to
pax_autockpt.policies (orbax-latest needs a newer jax than paxml 1.4.0, so it cannot run in the test).
Only valid parameters are drawn; times are whole microseconds after BASE, so both sides build the same
datetimes. orbax's LatestDuration reads the clock: here it reads the case's `now` instead.
"""

import datetime
import json
import os
import random
import sys

import orbax.checkpoint as ocp
from orbax.checkpoint import options as orbax_options
from orbax.checkpoint._src.checkpoint_managers import preservation_policy
from orbax.checkpoint._src.checkpoint_managers import save_decision_policy
from orbax.checkpoint._src.metadata import checkpoint_info

SEED = 14
BASE = 1_700_000_000  # unix seconds; a case's times are microseconds after it
SECOND = 1_000_000
SAVE_CASES = 300
PRESERVE_CASES = 600
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'orbax_policy_answers.json')


def when(us: int) -> datetime.datetime:
  return datetime.datetime.fromtimestamp(BASE, tz=datetime.timezone.utc) + datetime.timedelta(microseconds=us)


# --- random histories -----------------------------------------------------------------------------


def history(rng: random.Random, n: int) -> list[list]:
  """[step, microseconds, metrics or None], steps increasing, times not decreasing (ties happen)."""
  rows, step, us = [], rng.choice([0, 0, 1, 7, 100]), rng.randrange(0, 100 * SECOND)
  for _ in range(n):
    metrics = None
    if rng.random() > 0.2:
      metrics = {'loss': rng.choice([0.5, 1.0, 1.5, round(rng.uniform(0, 3), 2)]),
                 'accuracy': round(rng.uniform(0, 1), 1)}
    rows.append([step, us, metrics])
    step += rng.choice([1, 1, 2, 3, 5, 10, 25, 50, 100, 137])
    us += rng.choice([0, SECOND, 30 * SECOND, 60 * SECOND, rng.randrange(0, 200 * SECOND)])
  if rng.random() < 0.3:  # steps around multiples of 10, some equally far on both sides of one
    around = sorted({10 * rng.randrange(1, 20) + d for d in (-3, 3, -2, 2, 0, 5) for _ in range(2)})
    for row, step in zip(rows, sorted(rng.sample(around, min(len(rows), len(around))))):
      row[0] = step
  return rows


# --- random valid policies, as JSON specs ---------------------------------------------------------


def save_leaf(rng: random.Random, steps: list[int]) -> dict:
  kind = rng.choice(['FixedIntervalPolicy', 'SpecificStepsPolicy', 'ContinuousCheckpointingPolicy',
                     'ContinuousCheckpointingPolicy', 'PreemptionCheckpointingPolicy', 'InitialSavePolicy'])
  if kind == 'FixedIntervalPolicy':
    return {'type': kind, 'interval': rng.choice([1, 2, 3, 5, 10, 100])}
  if kind == 'SpecificStepsPolicy':
    return {'type': kind, 'steps': sorted(set(rng.sample(steps + list(range(0, 400, 7)), 5)))}
  if kind == 'ContinuousCheckpointingPolicy':
    return {'type': kind, 'minimum_interval_secs': rng.choice([None, 0, 1, 5, 30, 60])}
  return {'type': kind}


def save_spec(rng: random.Random, steps: list[int]) -> dict:
  if rng.random() < 0.25:
    return {'type': 'AnySavePolicy', 'policies': [save_leaf(rng, steps) for _ in range(rng.randint(1, 3))]}
  return save_leaf(rng, steps)


def preserve_leaf(rng: random.Random, steps: list[int]) -> dict:
  kind = rng.choice(['PreserveAll', 'LatestN', 'EveryNSeconds', 'EveryNSteps', 'EveryNStepsClosest',
                     'CustomSteps', 'BestN', 'BestN', 'LatestDuration'])
  interval = rng.choice([1, 2, 3, 5, 10, 25, 50, 100])
  max_to_keep = rng.choice([None, None, 1, 2, 3])
  if kind == 'LatestN':
    return {'type': kind, 'n': rng.choice([None, 0, 1, 2, 3, 5, 20])}
  if kind == 'EveryNSeconds':
    return {'type': kind, 'interval_secs': rng.choice([1, 30, 60, 100])}
  if kind == 'EveryNSteps':
    return {'type': kind, 'interval_steps': interval, 'exact_interval': rng.random() < 0.5,
            'max_to_keep': max_to_keep}
  if kind == 'EveryNStepsClosest':
    return {'type': kind, 'interval_steps': interval, 'max_to_keep': max_to_keep}
  if kind == 'CustomSteps':
    return {'type': kind, 'steps': sorted(set(rng.sample(steps + [3, 50, 100, 1000], min(4, len(steps) + 4))))}
  if kind == 'BestN':
    return {'type': kind, 'metric': rng.choice(['loss', 'accuracy']), 'reverse': rng.random() < 0.5,
            'n': rng.choice([None, 0, 1, 2, 3, 10]), 'keep_checkpoints_without_metrics': rng.random() < 0.5}
  if kind == 'LatestDuration':
    return {'type': kind, 'duration_us': rng.choice([1, 30, 60, 300]) * SECOND}
  return {'type': kind}


def preserve_spec(rng: random.Random, steps: list[int]) -> dict:
  if rng.random() < 0.25:
    return {'type': 'AnyPreservationPolicy',
            'policies': [preserve_leaf(rng, steps) for _ in range(rng.randint(1, 3))]}
  return preserve_leaf(rng, steps)


# --- orbax's objects from the specs ---------------------------------------------------------------


def orbax_save(spec: dict):
  args = {k: v for k, v in spec.items() if k != 'type'}
  if spec['type'] == 'AnySavePolicy':
    return save_decision_policy.AnySavePolicy([orbax_save(p) for p in args['policies']])
  return getattr(save_decision_policy, spec['type'])(**args)


def orbax_preserve(spec: dict):
  args = {k: v for k, v in spec.items() if k != 'type'}
  kind = spec['type']
  if kind == 'AnyPreservationPolicy':
    return preservation_policy.AnyPreservationPolicy([orbax_preserve(p) for p in args['policies']])
  if kind == 'BestN':
    metric = args.pop('metric')
    return preservation_policy.BestN(get_metric_fn=lambda m: m[metric], **args)
  if kind == 'LatestDuration':
    return preservation_policy.LatestDuration(datetime.timedelta(microseconds=args['duration_us']))
  return getattr(preservation_policy, kind)(**args)


def infos(rows: list[list]) -> list:
  return [checkpoint_info.CheckpointInfo(step=s, time=when(us), metrics=m) for s, us, m in rows]


class _Clock(datetime.datetime):
  """orbax's LatestDuration asks datetime.datetime.now(); it gets the case's `now`."""

  now_us = 0

  @classmethod
  def now(cls, tz=None):
    del tz  # orbax asks for UTC, which `when` is
    return when(cls.now_us)


preservation_policy.datetime = type('datetime_module', (), {
    'datetime': _Clock, 'timedelta': datetime.timedelta, 'timezone': datetime.timezone})


# --- the cases ------------------------------------------------------------------------------------


def save_case(rng: random.Random) -> dict:
  rows = history(rng, rng.randint(0, 6))
  steps = [s for s, _, _ in rows]
  step = (steps[-1] if steps else 0) + rng.choice([0, 1, 2, 5, 10, 100]) + (1 if steps else 0)
  last = rows[-1][1] if rows else 0
  now = last + rng.choice([-5 * SECOND, 0, SECOND, 5 * SECOND, 30 * SECOND, 60 * SECOND,
                           rng.randrange(0, 90 * SECOND)])
  spec = save_spec(rng, steps + [step])
  saving, preempted = rng.random() < 0.3, rng.random() < 0.2
  context = save_decision_policy.DecisionContext(
      is_saving_in_progress=saving, reached_preemption=preempted,
      multiprocessing_options=orbax_options.MultiprocessingOptions())
  current = checkpoint_info.CheckpointInfo(step=step, time=when(now), metrics=None)
  answer = orbax_save(spec).should_save(current, previous_steps=infos(rows), context=context)
  return {'policy': spec, 'previous': rows, 'step': step, 'now_us': now, 'saving': saving,
          'preempted': preempted, 'answer': bool(answer)}


def preserve_case(rng: random.Random) -> dict:
  rows = history(rng, rng.randint(0, 10))
  spec = preserve_spec(rng, [s for s, _, _ in rows])
  last = rows[-1][1] if rows else 0
  _Clock.now_us = last + rng.choice([0, SECOND, 30 * SECOND, 60 * SECOND, 300 * SECOND,
                                     rng.randrange(0, 400 * SECOND)])
  answer = orbax_preserve(spec).should_preserve(infos(rows), context=preservation_policy.PreservationContext())
  return {'policy': spec, 'checkpoints': rows, 'now_us': _Clock.now_us, 'answer': [bool(a) for a in answer]}


def main() -> int:
  rng = random.Random(SEED)
  data = {'orbax_checkpoint': ocp.__version__, 'python': sys.version.split()[0], 'seed': SEED, 'base': BASE,
          'save': [save_case(rng) for _ in range(SAVE_CASES)],
          'preserve': [preserve_case(rng) for _ in range(PRESERVE_CASES)]}
  with open(OUT, 'w') as f:
    head = {k: v for k, v in data.items() if k not in ('save', 'preserve')}
    f.write(json.dumps(head)[:-1])
    for kind in ('save', 'preserve'):  # one case a line: small, and a diff shows what changed
      f.write(f', "{kind}": [\n' + ',\n'.join(json.dumps(c, separators=(',', ':')) for c in data[kind]) + '\n]')
    f.write('}\n')
  print(f'{OUT}: {SAVE_CASES} save and {PRESERVE_CASES} preservation cases, orbax {ocp.__version__}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
