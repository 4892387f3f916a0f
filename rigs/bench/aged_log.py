"""`agedlog`: a restart's cost must not grow with the job's age (issue 38, item 5).

A job that ran a week with the local tier committing every second has a week of events in its log: one
`local_committed` summary a minute (pax_autockpt.local.saving.CommitTally), a job directory save every ten minutes
(started, committed, a policy's deletion) and a restart a day. Every start reads host 0's log (the steps it
ever committed for the lineage rules, past save durations for the grace budget, metrics for BestN). Measured:
process start -> first step of a restart of that job against the same restart of a job whose log holds only
its first run, same checkpoint, alternating. Local disk, the tiny experiment.
"""

import json
import os
import shutil

from pax_autockpt import layout
from rigs.bench import measure
from rigs.bench import scenarios
from rigs.bench.measure import Figure
from rigs.bench.measure import Storage

_WEEK_S = 7 * 24 * 3600


def week_of_events(t0: float) -> list[dict]:
  """A week's events of host 0, oldest first (10,080 local summaries, 1,008 saves, 7 restarts)."""
  out = []
  for minute in range(_WEEK_S // 60):
    t = t0 + 60.0 * minute
    out.append({'t': t, 'host': 0, 'event': 'local_committed', 'step': 100 * minute, 'duration_s': 0.02,
                'bytes': 1_300_000, 'commits': 60, 'interval_s': 1.0})
    if minute % 10 == 0:
      step = 100 * minute
      out += [{'t': t, 'host': 0, 'event': 'save_started', 'step': step, 'reason': 'continuous', 'blocking_s': 0.01},
              {'t': t + 1, 'host': 0, 'event': 'save_committed', 'step': step, 'duration_s': 1.0},
              {'t': t + 1, 'host': 0, 'event': 'deleted', 'step': max(0, step - 3000), 'policy': 'keep_latest'}]
    if minute % (24 * 60) == 0:
      out += [{'t': t, 'host': 0, 'event': 'exit', 'code': 143, 'step': 100 * minute},
              {'t': t + 30, 'host': 0, 'event': 'start', 'num_hosts': 1, 'pid': 1, 'restored_step': 100 * minute,
               'restored_from': 'local'}]
  return out


def _prepend(job_dir: str, events: list[dict]) -> None:
  """`events` in front of host 0's log (written at once: the bench sets the scene, it is not the writer)."""
  path = os.fspath(layout.events_path(job_dir, 0))
  with open(path) as f:
    own = f.read()
  with open(path, 'w') as f:
    f.write(''.join(json.dumps(e) + '\n' for e in events) + own)


def aged_restart(storage: Storage, pairs: int) -> list[Figure]:
  """Restart -> first step with a week's events in the log against the same restart with one run's."""
  if storage.is_gcs:
    raise ValueError('agedlog runs on local disk')
  base = storage.job_dir('agedlog-base')
  argv = scenarios.ours('TinyAutockpt', '--autockpt_notices=off')
  measure.timed_run(storage, argv, 'agedlog-base', train_secs=2.0, preempt=True, job_dir=base)  # a checkpoint
  first = json.loads(open(os.fspath(layout.events_path(base, 0))).readline())
  week = week_of_events(first['t'] - _WEEK_S)
  aged, young = [], []
  for i in range(pairs):
    for name, extra, into in ((f'agedlog-young-{i}', [], young), (f'agedlog-aged-{i}', week, aged)):
      job_dir = storage.job_dir(name)
      shutil.copytree(base, job_dir)
      if extra:
        _prepend(job_dir, extra)
      into.append(scenarios._first_step_secs(storage, argv, name, job_dir))  # pylint: disable=protected-access
      storage.clean(job_dir)
    measure.say(f'agedlog #{i}: a week of events {aged[-1]:.2f} s, one run {young[-1]:.2f} s to the first step')
  storage.clean(base)
  return [Figure(f'restart -> first step, a week of events ({len(week):,}) vs one run\'s, tiny',
                 's', aged, young, 'one run\'s events')]
