"""One exit plan for every host, for real (issue 60): 2 hosts under `pax-autockpt launch` on the local GCS
server, saving continuously with a preservation policy, and a SIGTERM while host 0's background thread still
runs that policy after a commit."""

import os
import re
import signal
import sys

import pytest

from pax_autockpt import layout
from pax_autockpt.tools import process
from tests import forkserver
from tests.conftest import assert_restorable
from tests.conftest import checkpoint_steps
from tests.conftest import events_of

pytestmark = pytest.mark.e2e

EXP = 'tests.e2e_experiments.TwoHostsContinuousHeldPreservation'  # holds host 0's thread 12 s after each commit
HOLDING = '[test] preservation after a commit: holding'  # in host 0's log (launch's console shows only ours)


def _preserving_in_the_loop(log: str) -> bool:
  """Host 0 holds the preservation after a continuous save's commit (the first hold, after the step-0 save, comes
  before the first step: a signal then exits with nothing to save)."""
  trained = re.search(r'continuous save of step [1-9]\d* committed', log)
  return trained is not None and HOLDING in log[trained.end():]


@pytest.mark.soak
def test_a_sigterm_while_host_0_preserves_after_a_commit_saves_the_agreed_step_and_exits_143_everywhere(
    jobs, gcs, tmp_path):
  """`make soak` (~110 s on 2 busy cores: two hosts' start-up, a 12 s hold after the step-0 save). Host 0's thread
  outlives the commit (the policy holds it), its peer's does not. The SIGTERM comes there: the hosts agree on a
  step, host 0 plans it with nothing in flight (the commit was), and both save it and exit 143 inside the 60 s
  grace period. (Previous main: host 0 took its live thread for a save in flight and waited for re-plan reports
  host 1 never sent, host 1 waited for host 0 at the save's barrier: exit 1 at the watchdog, no on-demand
  checkpoint.)"""
  job = gcs.url('exit-plan')
  host0_log = os.fspath(layout.host_log_path(job, 0))  # outside the test's folder: appended to by every run
  since = os.path.getsize(host0_log) if os.path.exists(host0_log) else 0
  launcher = forkserver.job([sys.executable, '-m', 'pax_autockpt.tools.cli', 'launch', '--num_hosts=2', '--',
                             f'--exp={EXP}', f'--job_log_dir={job}'], str(tmp_path / 'launch.log'))
  jobs.append(launcher)
  process.wait_until(lambda: _preserving_in_the_loop(process.text_of(host0_log, since)),
                     'host 0 preserving after a continuous save\'s commit', 300, 0.05, launcher)
  launcher.send(signal.SIGTERM)  # forwarded to both hosts
  assert launcher.wait(180) == 143, launcher.log()[-4000:]
  preemptions = [events_of(job, 'preemption', host=h) for h in (0, 1)]
  assert all(len(p) == 1 for p in preemptions), preemptions
  step = preemptions[0][0]['step']
  assert [(p[0]['step'], p[0]['plan'], p[0]['saved_step']) for p in preemptions] == [(step, 'save', step)] * 2
  assert [e['code'] for h in (0, 1) for e in events_of(job, 'exit', host=h)] == [143, 143]
  assert checkpoint_steps(job)[0][-1] == step
  assert_restorable(job, step)
  # The interleaving happened: host 0 agreed while its thread still held the preservation of the commit before.
  log = process.text_of(host0_log, since)
  agreed = log.find(f'every host agreed on step {step}')
  held = log.rfind(HOLDING, 0, agreed)
  assert 0 <= held < agreed < log.find('[test] preservation after a commit: done', held), log[-4000:]
  assert 'Traceback' not in launcher.log()
  print(f'agreed step {step}, saved and exit 143 on both hosts; '
        f'{len(re.findall("holding", log))} hold(s) in host 0\'s log')
