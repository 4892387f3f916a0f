"""`make soak`'s checks, tested on made-up events (they must be able to fail); and one chaos cycle on one
host, then a run to the target step, in `make soak` beside its 30 and 10 cycles (local and gs://)."""

import pytest

from rigs import soak

pytestmark = pytest.mark.e2e

@pytest.mark.soak  # make soak runs the same soak.run at 30 and 10 cycles; ~65 s of make test's 12 minutes
def test_one_chaos_cycle_then_the_target_loses_nothing_it_must_not(tmp_path):
  tally = soak.run(cycles=1, num_hosts=1, workdir=str(tmp_path), seed=7, exp='tests.e2e_experiments.TinyShortSchedule',
                   target_step=600, interval=200)
  print(f'[soak] {tally}')
  assert tally.failures == []
  assert tally.cycles >= 1 and tally.sigterm + tally.sigkill == tally.cycles
  assert tally.final_step == 600
  assert tally.max_lost <= 200

def test_checks_catch_a_lost_sigterm():
  """The soak's own check must be able to fail: a SIGTERM exit followed by an older restore."""
  tally = soak.Tally()
  prev = [{'event': 'start', 'restored_step': 0}, {'event': 'preemption', 'step': 321},
          {'event': 'exit', 'code': 143, 'step': 321}]
  run = [{'event': 'start', 'restored_step': 0}]
  soak._check(tally, 1, prev, run, committed_before={0, 321}, interval=500)  # pylint: disable=protected-access
  assert any('restored 0, newest committed was 321' in f for f in tally.failures)
  assert any('SIGTERM exit lost 321 steps' in f for f in tally.failures)
  assert tally.sigterm_steps_lost == 321


def test_checks_catch_a_lost_or_set_aside_checkpoint(tmp_path):
  """Restore safety's counts must be able to fail: a committed checkpoint gone without a policy's
  `deleted` event, one set aside though no damage was injected, an uncommitted one restored."""
  from pax_autockpt import layout  # pylint: disable=g-import-not-at-top
  from pax_autockpt.shared import events as events_lib  # pylint: disable=g-import-not-at-top
  job = tmp_path / 'job'
  for step in (500, 1000):
    (layout.step_dir(layout.checkpoint_dir(job), step) / 'state').mkdir(parents=True)
  log = events_lib.EventLog(job, 0)
  log.write('deleted', step=0)
  tally = soak.Tally()
  soak._safety(tally, 3, str(job), 1, committed_before={0, 500, 1000, 1500}, events_before=[0])  # pylint: disable=protected-access
  assert tally.committed_lost == 1 and 'committed checkpoints [1500] are gone' in tally.failures[0]
  log.write('restore_skipped', step=1000, error='x')
  soak._safety(tally, 4, str(job), 1, committed_before={500, 1000}, events_before=[1])  # pylint: disable=protected-access
  assert tally.set_aside_without_damage == 1 and tally.committed_lost == 1
  soak._check(tally, 5, [{'event': 'start', 'restored_step': None}], [{'event': 'start', 'restored_step': 700}],  # pylint: disable=protected-access
              committed_before={500}, interval=500)
  assert tally.uncommitted_restored == 1


@pytest.mark.soak
def test_eight_hosts_sigterm_to_one_saves_one_step_everywhere_and_all_restore_it(tmp_path):
  """`make soak` (not CI: 8 paxml processes on 2 cores take minutes): 8 local hosts in 2 slices."""
  out = soak.scale(8, str(tmp_path), preempt_host=5)
  print(f'[soak] {out}')
  assert out['failures'] == []
  assert out['agreed_step'] is not None and out['relaunch_agreed_step'] >= out['agreed_step']


def test_scale_check_catches_hosts_that_disagree(tmp_path):
  """The 8-host check must be able to fail: hosts that preempted at different steps are reported."""
  from pax_autockpt.shared import events as events_lib  # pylint: disable=g-import-not-at-top
  for host, step in ((0, 120), (1, 121)):
    log = events_lib.EventLog(str(tmp_path), host)
    log.write('start', num_hosts=2, pid=1, restored_step=None)
    log.write('preemption', step=step, signal='SIGTERM')
    log.write('exit', code=143, step=step)
  step, problems = soak._agreed(str(tmp_path), 2, restored=None)  # pylint: disable=protected-access
  assert step is None and any('agreed steps [120, 121]' in p for p in problems)
