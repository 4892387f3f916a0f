"""End to end, continuous checkpointing: back-to-back saves, LatestN preservation, preemption."""

import signal
import statistics

import pytest

from pax_autockpt.tools import process
from tests import forkserver
from tests.conftest import assert_restorable
from tests.conftest import checkpoint_steps
from tests.conftest import events_of

pytestmark = pytest.mark.e2e

EXP = 'experiments.lm_cloud_autockpt.LmCloudSpmdTinyContinuousAutockpt'  # min 1 s, keep latest 3
MIN_INTERVAL = 1.0


def _sigterm_right_after_a_save_starts(job, job_dir, saves):
  """Waits for `saves` continuous saves to have started, then SIGTERMs as soon as a new one starts."""
  process.wait_until(lambda: len([e for e in events_of(job_dir, 'save_started')
                                  if e['reason'] == 'continuous']) >= saves, f'{saves} continuous saves', job=job)
  seen = len(events_of(job_dir, 'save_started'))
  process.wait_until(lambda: len(events_of(job_dir, 'save_started')) > seen, 'another save', 30, 0.01, job)
  return job.send(signal.SIGTERM)


def on_demand_nice(started, step):
  return [e['nice'] for e in started if e['step'] == step][0]


def test_continuous_saves_back_to_back_keeps_latest_3_and_commits_on_demand_mid_save(
    jobs, job_dir, tmp_path):
  job = forkserver.job(process.ours_argv(EXP, job_dir), str(tmp_path / 'run.log'))
  jobs.append(job)
  sent = _sigterm_right_after_a_save_starts(job, job_dir, saves=11)
  assert job.wait(120) == 143, job.log()[-3000:]

  started = events_of(job_dir, 'save_started')
  committed = {e['step']: e['t'] for e in events_of(job_dir, 'save_committed')}
  regular = [e for e in started if e['reason'] == 'continuous']
  assert len(regular) >= 10, f'only {len(regular)} continuous saves'
  # Back to back: the next save starts as soon as the previous committed and the minimum passed.
  gaps = [nxt['t'] - committed[cur['step']] for cur, nxt in zip(regular, regular[1:])]
  starts = [nxt['t'] - cur['t'] for cur, nxt in zip(regular, regular[1:])]
  step_secs = (regular[-1]['t'] - regular[0]['t']) / (regular[-1]['step'] - regular[0]['step'])
  bound = max(MIN_INTERVAL, 5 * step_secs)
  print(f'{len(regular)} saves; median commit->next start {statistics.median(gaps):.3f} s, '
        f'median start->start {statistics.median(starts):.3f} s, step {step_secs * 1000:.1f} ms')
  assert statistics.median(gaps) <= bound
  assert min(starts) >= MIN_INTERVAL - 0.01  # never closer than the minimum interval

  # The preemption: agreed step committed, exit 143; it came while a continuous save was running.
  preemption = events_of(job_dir, 'preemption')[0]
  step = preemption['step']
  assert [e['reason'] for e in started if e['step'] == step] == ['preemption']
  assert step in committed and events_of(job_dir, 'exit')[-1] == {
      **events_of(job_dir, 'exit')[-1], 'code': 143, 'step': step}
  # Routine saves are written below training's CPU priority (--autockpt_background_nice, 10), the on-demand
  # one at training's.
  assert {e['nice'] for e in regular} == {10} and on_demand_nice(started, step) == 0
  previous = [e for e in regular if e['step'] < step][-1]
  on_demand = [e for e in started if e['step'] == step][0]
  print(f'SIGTERM at 0; save of step {previous["step"]} started {previous["t"] - sent:+.3f} s, '
        f'committed {committed[previous["step"]] - sent:+.3f} s; on-demand save of step {step} '
        f'started {on_demand["t"] - sent:+.3f} s, committed {committed[step] - sent:+.3f} s')

  # Preservation: the newest 3 until the signal; after it nothing is deleted until the on-demand save
  # committed, then the policy runs once (the exit leaves what it allows: the newest 3), and no continuous save
  # starts once the signal arrived.
  arrival = preemption['signal_at']
  assert sent - 0.05 <= arrival <= sent + 1.0, (sent, preemption)
  # A save is stamped when it starts, after the step it waits for: decided before the arrival, it may be
  # stamped a step later.
  assert all(e['t'] < arrival + 0.25 for e in regular), 'a continuous save started after the SIGTERM arrived'
  saved = sorted(e['step'] for e in started)
  complete, incomplete = checkpoint_steps(job_dir)
  deleted = events_of(job_dir, 'deleted')
  assert incomplete == [] and sorted(complete + [e['step'] for e in deleted]) == saved
  assert all(e['t'] < arrival or e['t'] >= committed[step] for e in deleted), (arrival, committed[step], deleted)
  assert {e['policy'] for e in deleted} == {'LatestN(n=3)'}
  assert complete == sorted(committed)[-3:] and step in complete, (complete, sorted(committed))
  assert_restorable(job_dir, step)
