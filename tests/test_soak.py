"""The CI version of `make soak`: 5 chaos cycles on one host, then a run to the target step."""

import pytest

from pax_autockpt.tools import soak

pytestmark = pytest.mark.e2e

def test_five_chaos_cycles_lose_nothing_they_must_not(tmp_path):
  tally = soak.run(cycles=5, num_hosts=1, workdir=str(tmp_path), seed=7,
                   exp='experiments.lm_cloud_autockpt.LmCloudSpmdTinyAutockpt', target_step=2000)
  print(f'[soak] {tally}')
  assert tally.failures == []
  assert tally.cycles >= 5 and tally.sigterm + tally.sigkill == tally.cycles
  assert tally.final_step == 2000
  assert tally.max_lost <= 500

def test_checks_catch_a_lost_sigterm():
  """The soak's own check must be able to fail: a SIGTERM exit followed by an older restore."""
  tally = soak.Tally()
  prev = [{'event': 'start', 'restored_step': 0}, {'event': 'preemption', 'step': 321},
          {'event': 'exit', 'code': 143, 'step': 321}]
  run = [{'event': 'start', 'restored_step': 0}]
  soak._check(tally, 1, prev, run, committed_before={0, 321}, interval=500)  # pylint: disable=protected-access
  assert any('restored 0, newest committed was 321' in f for f in tally.failures)
  assert any('SIGTERM exit lost 321 steps' in f for f in tally.failures)


@pytest.mark.soak
def test_eight_hosts_sigterm_to_one_saves_one_step_everywhere_and_all_restore_it(tmp_path):
  """`make soak` (not CI: 8 paxml processes on 2 cores take minutes): 8 local hosts in 2 slices."""
  out = soak.scale(8, str(tmp_path), preempt_host=5)
  print(f'[soak] {out}')
  assert out['failures'] == []
  assert out['agreed_step'] is not None and out['relaunch_agreed_step'] >= out['agreed_step']


def test_scale_check_catches_hosts_that_disagree(tmp_path):
  """The 8-host check must be able to fail: hosts that preempted at different steps are reported."""
  from pax_autockpt import events as events_lib  # pylint: disable=g-import-not-at-top
  for host, step in ((0, 120), (1, 121)):
    log = events_lib.EventLog(str(tmp_path), host)
    log.write('start', num_hosts=2, pid=1, restored_step=None)
    log.write('preemption', step=step, signal='SIGTERM')
    log.write('exit', code=143, step=step)
  step, problems = soak._agreed(str(tmp_path), 2, restored=None)  # pylint: disable=protected-access
  assert step is None and any('agreed steps [120, 121]' in p for p in problems)
