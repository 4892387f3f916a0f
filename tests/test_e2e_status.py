"""`pax-autockpt status` on a real run: "running" while its process lives on this machine, "killed" once a SIGKILL
ended it (no exit event either way: only the process tells them apart)."""

import re
import signal

import pytest

from pax_autockpt.tools import process
from pax_autockpt.tools import status
from tests import forkserver
from tests.conftest import events_of

pytestmark = pytest.mark.e2e

EXP = 'experiments.lm_cloud_autockpt.LmCloudSpmdTinyShortAutockpt'  # the README tutorial's


def test_status_says_running_while_the_process_lives_and_killed_after_a_sigkill(tmp_path, capsys):
  job_dir = str(tmp_path / 'job')
  job = forkserver.job(process.ours_argv(EXP, job_dir), str(tmp_path / 'run.log'))
  try:
    process.wait_until(lambda: events_of(job_dir, 'first_step'), 'the first_step event', 300, job=job)
    assert status.run(job_dir) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert re.search(rf', fresh\): running \(process {job.pid} on this machine\): step \d+, logged \d+ s ago$',
                     line), line
    job.send(signal.SIGKILL)
    assert job.wait(60) == -signal.SIGKILL
  finally:
    job.kill()
  assert status.run(job_dir) == 0
  line = capsys.readouterr().out.splitlines()[-1]
  assert re.search(rf': killed without a chance to save \(SIGKILL, a crash\): no exit recorded, process {job.pid} '
                   r'is gone from this machine; the last step \d+, logged \d+ s ago$', line), line
