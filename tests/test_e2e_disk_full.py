"""A full disk (a real size-limited tmpfs): failed saves are reported in one line, committed
checkpoints stay intact, training goes on and recovers; a failed on-demand save exits 1."""

import os
import signal
import subprocess
import time

import pytest

from pax_autockpt.tools import process
from tests import forkserver
from tests.conftest import assert_restorable
from tests.conftest import checkpoint_steps
from tests.conftest import events_of

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EXP = 'tests.e2e_experiments.TinyContinuousRareSummaries'  # a save per second, keep 3


@pytest.fixture
def small_disk(tmp_path):
  path = str(tmp_path / 'disk')
  os.makedirs(path)
  mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=32m', 'tmpfs', path],
                           capture_output=True, text=True)
  if mounted.returncode:
    pytest.skip(f'cannot mount a size-limited tmpfs here: {mounted.stderr.strip()}')
  yield path
  subprocess.run(['umount', '-l', path], check=False)


def _fill(disk, spare=256 * 1024):
  """Leaves about `spare` bytes free: room for log lines, not for a 1.8 MB checkpoint."""
  path = os.path.join(disk, 'filler')
  with open(path, 'ab') as f:
    try:
      while True:
        st = os.statvfs(disk)
        left = st.f_bavail * st.f_frsize - spare
        if left <= 0:
          break
        f.write(b'\0' * min(left, 1 << 20))
        f.flush()
    except OSError:  # the training process wrote meanwhile: give the spare back
      f.truncate(max(0, os.path.getsize(path) - spare))


def test_disk_full_saves_fail_cleanly_training_recovers_on_demand_exits_1(jobs, small_disk, tmp_path):
  job_dir = os.path.join(small_disk, 'job')
  job = forkserver.job(process.ours_argv(EXP, job_dir), str(tmp_path / 'run.log'), cwd=ROOT)
  jobs.append(job)
  process.wait_until(lambda: len(events_of(job_dir, 'save_committed')) >= 2, '2 commits', 120, 0.2, job)

  _fill(small_disk)
  process.wait_until(lambda: job.log().count('failed to commit') + job.log().count('failed to start') >= 2,
                     '2 failed saves', 120, 0.2, job)
  steps_before = checkpoint_steps(job_dir)[0]
  for step in steps_before:
    assert_restorable(job_dir, step)  # nothing committed was touched
  started = len(events_of(job_dir, 'save_started'))

  os.remove(os.path.join(small_disk, 'filler'))  # space is back: the next saves commit again
  process.wait_until(lambda: any(e['step'] > max(steps_before) for e in events_of(job_dir, 'save_committed')),
                     'a commit after the disk had space again', 120, 0.2, job)
  # That commit may be of a save that began while the disk was full; saves go on starting after it.
  process.wait_until(lambda: len(events_of(job_dir, 'save_started')) > started, 'a save started after', 30, 0.2, job)
  leftovers = [n for n in checkpoint_steps(job_dir)[1] if '.orbax-checkpoint-tmp-' in n]
  assert len(leftovers) <= 1, leftovers  # failed saves' tmp dirs are gone; at most one in flight

  newest = max(checkpoint_steps(job_dir)[0])
  _fill(small_disk)
  time.sleep(1.5)
  job.send(signal.SIGTERM)
  code = job.wait(120)
  log = job.log()
  assert code == 1, log[-3000:]
  # Either the on-demand save failed, or before the SIGTERM a summary write hit the full disk: one
  # line each time, naming the checkpoint a restart resumes from.
  lines = [line for line in log.splitlines()
           if 'On-demand checkpoint of step' in line or 'the disk is full' in line]
  assert len(lines) == 1 and 'exiting 1' in lines[0] and 'newest committed checkpoint is' in lines[0], lines
  assert ('failed to commit' in lines[0]) != ('training stopped' in lines[0])
  assert 'Traceback' not in log
  complete, _ = checkpoint_steps(job_dir)
  assert newest in complete or max(complete) > newest
  for step in complete:
    assert_restorable(job_dir, step)
