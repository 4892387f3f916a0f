"""End to end, Ctrl-C: real paxml processes, real SIGINT. The first saves the agreed step and exits 130."""

import os
import signal
import time

import pytest

from pax_autockpt import events as events_lib
from pax_autockpt import layout
from tests.test_e2e_multihost import _assert_all_preempted_at_same_step
from tests.test_e2e_multihost import _launch
from tests.test_e2e_multihost import _wait_event
from tests.test_e2e_multihost import _wait_training

pytestmark = pytest.mark.e2e

STEP_DONE = r'\[PAX STATUS\]: Step `\d+` completed'
CTRL_C_LINE = '[autockpt] Ctrl-C: saving at the step every host agrees on'


def _assert_interrupted_at_one_step(job_dir, num_hosts, restored) -> int:
  """Every host's newest run: one preemption by SIGINT at the same step, committed, exit 130 there."""
  return _assert_all_preempted_at_same_step(job_dir, num_hosts, restored, code=130, signal_name='SIGINT')


# One host: Ctrl-C saves, exits 130 with one line, and the next run restores that step is part of
# tests/test_e2e_exact_resume.py (which also checks that the resumed job ends identical to an
# uninterrupted one).


def test_ctrl_c_on_one_host_or_through_the_launcher_stops_every_host_at_one_step(jobs, job_dir, tmp_path):
  """SIGINT to host 1 only: both hosts save the same step and exit 130. Then a terminal's Ctrl-C (SIGINT
  to the launcher's process group): it reaches each host once, through the launcher, and all exit 130."""
  first = _launch(jobs, job_dir, str(tmp_path / 'launch1.log'), 2)
  _wait_training(job_dir, 1, first)
  os.kill(events_lib.read(job_dir, 1)[0]['pid'], signal.SIGINT)
  assert first.wait(120) == 130, first.log()[-3000:]
  step = _assert_interrupted_at_one_step(job_dir, 2, restored=None)
  assert 'host 0 exit code 130' in first.log() and 'host 1 exit code 130' in first.log()

  logs = [os.fspath(layout.host_log_path(job_dir, host)) for host in (0, 1)]
  seen = [os.path.getsize(log) for log in logs]  # host logs are appended to: this launch's part only
  relaunch_t = time.time()
  second = _launch(jobs, job_dir, str(tmp_path / 'launch2.log'), 2)
  for host in (0, 1):  # restored; a Ctrl-C before the first step saves nothing new and still exits 130
    _wait_event(job_dir, host, 'start', second, after=relaunch_t)
  os.killpg(second.pid, signal.SIGINT)  # what a terminal does: the launcher's whole process group
  assert second.wait(120) == 130, second.log()[-3000:]
  assert _assert_interrupted_at_one_step(job_dir, 2, restored=step) >= step
  assert second.log().count('[launch] forwarding SIGINT to every host') == 1
  for host in (0, 1):
    with open(logs[host], 'rb') as f:
      log = f.read()[seen[host]:].decode(errors='replace')
    assert log.count(CTRL_C_LINE) == 1, f'host {host} saw {log.count(CTRL_C_LINE)} Ctrl-C'
    assert 'second Ctrl-C' not in log
