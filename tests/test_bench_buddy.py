"""The buddy-copy bench scenarios' pure helpers (rigs.bench.buddy, plan_scale): no bench runs here,
no timed assert."""

import math
import os
import subprocess
import sys
import time

from pax_autockpt import layout
from pax_autockpt.local import restoring
from rigs.bench import buddy as bench_buddy
from rigs.bench import plan_scale


def test_planscale_reports_plan_the_newest_step_own_copies_or_one_share_from_its_keepers_buddy_copy():
  for hosts in (2, 8, 128):
    plan = restoring.choose(plan_scale.reports(hosts), hosts, plan_scale.NEWEST - 1000)
    assert plan.step == plan_scale.NEWEST and plan.donors == {h: h for h in range(hosts)} and not plan.sources
    missing = hosts // 2
    plan = restoring.choose(plan_scale.reports(hosts, missing), hosts, plan_scale.NEWEST - 1000)
    keeper = (missing + 1) % hosts  # one slice: the next host keeps its copy
    assert plan.step == plan_scale.NEWEST and plan.filled == {missing: keeper} and plan.from_buddy == {missing}
    assert plan.sources == {missing: ((keeper, True),)}


def test_planscale_reports_survive_the_coordination_services_json():
  found = plan_scale.reports(8, 3)
  assert {h: restoring.HostReport.decode(r.encode()) for h, r in found.items()} == found
  assert found[3].has == {} and found[3].buddy == {} and found[0].job_dir == plan_scale.NEWEST - 1000


def test_per_call_ms_takes_the_calls_in_turn_for_at_least_min_secs():
  calls = []
  took = plan_scale.per_call_ms(lambda: calls.append('a'), lambda: calls.append('b'), min_secs=0.01)
  assert len(calls) > 2 and calls[:4] == ['a', 'b', 'a', 'b'] and calls.count('a') == calls.count('b')
  assert len(took) == 2 and all(t > 0 for t in took)
  assert len(plan_scale.per_call_ms(lambda: None, min_secs=0)) == 1  # at least one call


def test_expected_steps_intact_and_with_host_1s_directory_gone():
  # Killed right after the copies caught up: both hosts hold 110, host 0 keeps host 1's 110.
  assert bench_buddy.expected_steps([100, 110], [100, 110], [110], [110]) == {'intact': 110, 'replaced': 110}
  # Killed after the commit of 120, before its copies: host 1's share of 120 is only on host 1's disk.
  assert bench_buddy.expected_steps([110, 120], [110, 120], [110], [110]) == {'intact': 120, 'replaced': 110}
  # Host 0's own steps no longer hold the step its buddy copy is of: nothing without host 1's directory.
  assert bench_buddy.expected_steps([120, 130], [120, 130], [110], []) == {'intact': 130, 'replaced': None}


def _commit(folder, step):
  path = layout.local_step_dir(folder, step)
  path.mkdir(parents=True)
  (path / layout.LOCAL_INDEX).write_text('{}')


def test_caught_up_once_both_hosts_hold_two_steps_and_host_0s_copy_is_of_the_newest(tmp_path):
  local = [os.fspath(tmp_path / f'local-{h}') for h in (0, 1)]
  kept = layout.local_buddy_dir(local[0])
  _commit(local[0], 10), _commit(local[1], 10), _commit(kept, 10)
  assert bench_buddy._caught_up(local) is None  # one step each: not the steady state yet
  _commit(local[0], 20), _commit(local[1], 20)
  assert bench_buddy._caught_up(local) is None  # the copy of 20 not there yet
  _commit(kept, 20)
  assert bench_buddy._caught_up(local) == 20


def test_restored_from_reads_the_relaunchs_host_logs():
  log0 = 'I1125 [autockpt] local step 120 restored in 0.812 s.\n'
  log1 = ('I1125 [autockpt] local step 120 received from host 0 (the buddy copy it keeps for this host) in 0.651 s '
          '(250.1 MB, 384 MB/s).\nI1125 [autockpt] local step 120 restored in 0.790 s.\n')
  assert bench_buddy.restored_from(log0, log1) == dict(step=120, restore=0.812, fill_step=120, fill=0.651,
                                                        fill_mb=250.1)
  assert bench_buddy.restored_from(log0, log0)['fill'] is None
  assert bench_buddy.restored_from('', '')['step'] is None


def test_children_finds_a_launchers_hosts_and_alive_sees_them_go():
  child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
  try:
    assert child.pid in bench_buddy._children(os.getpid()) and bench_buddy._alive(child.pid)
  finally:
    child.kill()
    child.wait()
  assert not bench_buddy._alive(child.pid)


def test_mean_step_secs_between_the_local_tiers_captures_after_warm_up_across_midnight():
  lines = ['I1125 23:59:30.000000 1402 saving.py:232] [autockpt] local save of step 0 committed in 2.752 s '
           '(250.1 MB); from now on one line every 10 s sums up the local commits.']
  for step, t, took in ((1, '23:59:42.000000', 2.0), (4, '23:59:53.000000', 3.0), (7, '00:00:01.500000', 1.5),
                        (10, '00:00:11.000000', 2.0)):
    lines.append(f'I1125 {t} 1402 saving.py:236] [autockpt] local tier: 1 commit(s) in the last 11 s (one '
                 f'every 10.61 s), newest step {step}, committed in {took:.3f} s (250.1 MB).')
  lines.insert(2, 'I1125 23:59:43.000000 1402 executors.py:496] [PAX STATUS]: Step `3` completed.')
  # Captures: step 4 at 23:59:50, step 10 at 00:00:09: 19 s for 6 steps.
  assert abs(bench_buddy.mean_step_secs('\n'.join(lines)) - 19 / 6) < 1e-9
  assert abs(bench_buddy.mean_step_secs('\n'.join(lines), first=0) - (32.752 + 9) / 10) < 1e-9  # from step 0's capture
  assert math.isnan(bench_buddy.mean_step_secs('\n'.join(lines[:4])))  # one capture after warm-up: no interval


def test_cpu_secs_counts_a_busy_processs_cpu_time():
  child = subprocess.Popen([sys.executable, '-c', 'import time\nend = time.process_time() + 0.3\n'
                            'while time.process_time() < end: pass\ntime.sleep(60)'])
  try:
    deadline = time.time() + 30
    while bench_buddy._cpu_secs([child.pid]) < 0.3 and time.time() < deadline:
      time.sleep(0.05)
    assert bench_buddy._cpu_secs([child.pid]) >= 0.3
  finally:
    child.kill()
    child.wait()
