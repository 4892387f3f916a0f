"""orbax-latest's answers, in its own interpreter: .venv-orbax/bin/python tests/orbax_latest/oracle.py

Reads one JSON query a line on stdin, writes one JSON answer a line on stdout ({"answer": ...} or {"error": ...}).
A query is {"kind": "save" | "preserve", "policy": spec, "rows": [[step, microseconds or null, metrics or null]],
"now_us", and for "save" "step" and "saving"}; times are microseconds after BASE, a null time is what orbax-latest
reads for a checkpoint without metadata on gs:// (its directory's mtime, 0), and metric values may be the strings
'nan', 'inf', '-inf'. orbax's `should_save` of CheckpointManager refuses a step not after the latest first, as here.
Nothing from pax_autockpt is imported (another Python, another jax): only orbax-checkpoint 0.12.8's policies.
"""

import datetime
import json
import sys

from orbax.checkpoint import options as orbax_options
from orbax.checkpoint._src.checkpoint_managers import preservation_policy
from orbax.checkpoint._src.checkpoint_managers import save_decision_policy
from orbax.checkpoint._src.metadata import checkpoint_info

BASE = 1_700_000_000  # unix seconds
UTC = datetime.timezone.utc


def when(us):
  if us is None:
    return datetime.datetime.fromtimestamp(0, tz=UTC)
  return datetime.datetime.fromtimestamp(BASE, tz=UTC) + datetime.timedelta(microseconds=us)


class _Clock(datetime.datetime):
  """orbax's LatestDuration asks datetime.datetime.now(): it gets the query's `now_us`."""

  now_us = 0

  @classmethod
  def now(cls, tz=None):
    del tz
    return when(cls.now_us)


preservation_policy.datetime = type('datetime_module', (), {
    'datetime': _Clock, 'timedelta': datetime.timedelta, 'timezone': datetime.timezone})


def number(v):
  return float(v) if isinstance(v, str) else v


def infos(rows):
  return [checkpoint_info.CheckpointInfo(step=s, time=when(us), metrics=None if m is None else {
      k: number(v) for k, v in m.items()}) for s, us, m in rows]


def save_policy(spec):
  args = {k: v for k, v in spec.items() if k != 'type'}
  if spec['type'] == 'AnySavePolicy':
    return save_decision_policy.AnySavePolicy([save_policy(p) for p in args['policies']])
  return getattr(save_decision_policy, spec['type'])(**args)


def kept_policy(spec):
  args = {k: v for k, v in spec.items() if k != 'type'}
  kind = spec['type']
  if kind == 'AnyPreservationPolicy':
    return preservation_policy.AnyPreservationPolicy([kept_policy(p) for p in args['policies']])
  if kind == 'BestN':
    metric = args.pop('metric')
    return preservation_policy.BestN(get_metric_fn=lambda m: m[metric], **args)
  if kind == 'LatestDuration':
    return preservation_policy.LatestDuration(datetime.timedelta(microseconds=args['duration_us']))
  return getattr(preservation_policy, kind)(**args)


def answer(query):
  rows = query['rows']
  if query['kind'] == 'preserve':
    _Clock.now_us = query['now_us']
    kept = kept_policy(query['policy']).should_preserve(infos(rows), context=preservation_policy.PreservationContext())
    return [bool(k) for k in kept]
  if rows and max(s for s, _, _ in rows) >= query['step']:
    return False  # CheckpointManager.should_save: not after the latest step
  context = save_decision_policy.DecisionContext(
      is_saving_in_progress=query['saving'], reached_preemption=False,
      multiprocessing_options=orbax_options.MultiprocessingOptions())
  current = checkpoint_info.CheckpointInfo(step=query['step'], time=when(query['now_us']), metrics=None)
  return bool(save_policy(query['policy']).should_save(current, previous_steps=infos(rows), context=context))


def main():
  for line in sys.stdin:
    try:
      out = {'answer': answer(json.loads(line))}
    except Exception as e:  # pylint: disable=broad-except
      out = {'error': f'{type(e).__name__}: {e}'.splitlines()[0]}
    sys.stdout.write(json.dumps(out) + '\n')
    sys.stdout.flush()


if __name__ == '__main__':
  main()
