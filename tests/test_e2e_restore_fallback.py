"""A damaged newest checkpoint is passed over (and kept aside), never restored, never a crash loop:
missing or truncated chunks, a byte flipped inside the data (the content manifest), a damaged manifest."""

import glob
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from pax_autockpt import layout
from pax_autockpt.tools import process
from tests import damage
from tests.conftest import checkpoint_steps
from tests.conftest import events_of

pytestmark = pytest.mark.e2e

EXP = process.TINY_EXP
CLI = [sys.executable, '-m', 'pax_autockpt.tools.cli']


ZARR = '--tensorstore_use_ocdbt=false'  # Pax's default: a directory and chunk files per array
OCDBT = '--tensorstore_use_ocdbt'  # one key-value database per checkpoint


def _run_and_preempt(jobs, job_dir, log, *flags) -> int:
  job = process.Job(process.ours_argv(EXP, job_dir, *flags), log)
  jobs.append(job)
  job.wait_for_log(r'\[PAX STATUS\]: Step `\d+` completed')
  time.sleep(random.uniform(0.5, 2.0))
  job.send(signal.SIGTERM)
  assert job.wait(120) == 143, job.log()[-3000:]
  return events_of(job_dir, 'preemption')[-1]['step']


def _step_path(job_dir, step):
  return layout.step_dir(layout.checkpoint_dir(job_dir), step)


def _a_chunk(job_dir, step):
  path = os.path.join(job_dir, 'checkpoints', f'checkpoint_{step:08d}', 'state')
  return sorted(glob.glob(os.path.join(path, '*.w', '0.0')))[0]


def test_missing_then_truncated_array_files_are_skipped_and_kept_aside(jobs, job_dir, tmp_path):
  first = _run_and_preempt(jobs, job_dir, str(tmp_path / 'run1.log'), ZARR)
  os.remove(_a_chunk(job_dir, first))  # tensorstore would read zeros for it: must not be restored

  second = _run_and_preempt(jobs, job_dir, str(tmp_path / 'run2.log'), ZARR)
  skipped = events_of(job_dir, 'restore_skipped')
  assert [e['step'] for e in skipped] == [first] and 'is missing' in skipped[0]['error']
  restored = events_of(job_dir, 'start')[-1]['restored_step']
  assert restored is not None and restored < first
  aside = os.path.join(job_dir, 'autockpt', 'unrestorable', f'checkpoint_{first:08d}')
  assert os.path.isdir(os.path.join(aside, 'state'))  # kept, not deleted
  assert checkpoint_steps(job_dir)[1] == []
  log = open(tmp_path / 'run2.log').read()
  assert f'checkpoint {first} cannot be restored' in log and f'Model initial global_step={restored}' in log

  with open(_a_chunk(job_dir, second), 'r+b') as f:  # a torn write: the restore itself fails
    f.truncate(3)
  third = _run_and_preempt(jobs, job_dir, str(tmp_path / 'run3.log'), ZARR)
  skipped = events_of(job_dir, 'restore_skipped')
  assert [e['step'] for e in skipped] == [first, second]
  assert events_of(job_dir, 'start')[-1]['restored_step'] < second
  kept = sorted(os.listdir(os.path.join(job_dir, 'autockpt', 'unrestorable')))
  assert len(kept) == 2 and all(k.startswith(('checkpoint_%08d' % first, 'checkpoint_%08d' % second))
                                for k in kept), kept

  # One byte flipped in the middle of the largest array, written back as a valid chunk: neither the
  # chunk check nor the restore can tell; the content manifest does, offline and before training.
  name, shard = damage.flip_a_byte(_step_path(job_dir, third))
  out = subprocess.run([*CLI, 'verify', job_dir], capture_output=True, text=True, timeout=300)
  lines = [x for x in out.stdout.splitlines() if x.startswith('step ')]
  assert out.returncode == 1 and f'step {third}: DAMAGED: {name} shard [{shard}] does not match' in out.stdout
  assert all(': ok (' in x for x in lines if not x.startswith(f'step {third}:')), lines
  fourth = _run_and_preempt(jobs, job_dir, str(tmp_path / 'run4.log'), ZARR)
  skipped = events_of(job_dir, 'restore_skipped')[-1]
  assert skipped['step'] == third and f'host 0: {name} shard [{shard}] does not match the manifest' in skipped['error']
  assert events_of(job_dir, 'start')[-1]['restored_step'] < third

  damage.break_manifest(_step_path(job_dir, fourth))  # the manifest itself damaged: so is its checkpoint
  _run_and_preempt(jobs, job_dir, str(tmp_path / 'run5.log'), ZARR)
  skipped = events_of(job_dir, 'restore_skipped')[-1]
  assert skipped['step'] == fourth and 'manifest: host0.json is damaged' in skipped['error']
  assert events_of(job_dir, 'start')[-1]['restored_step'] < fourth


def test_ocdbt_checkpoint_missing_a_data_file_is_skipped(jobs, job_dir, tmp_path):
  """OCDBT: no silent zeros there, the restore itself fails on the missing file."""
  first = _run_and_preempt(jobs, job_dir, str(tmp_path / 'run1.log'), OCDBT)
  data = glob.glob(os.path.join(job_dir, 'checkpoints', f'checkpoint_{first:08d}', 'state', '**', 'd', '*'),
                   recursive=True)
  assert data, 'no OCDBT data files'
  os.remove(max(data, key=os.path.getsize))

  second = _run_and_preempt(jobs, job_dir, str(tmp_path / 'run2.log'), OCDBT)
  assert [e['step'] for e in events_of(job_dir, 'restore_skipped')] == [first]
  restored = events_of(job_dir, 'start')[-1]['restored_step']
  assert restored is not None and restored < first
  assert os.path.isdir(os.path.join(job_dir, 'autockpt', 'unrestorable', f'checkpoint_{first:08d}'))

  name, shard = damage.flip_a_byte(_step_path(job_dir, second))  # rewritten inside the OCDBT database
  _run_and_preempt(jobs, job_dir, str(tmp_path / 'run3.log'), OCDBT)
  skipped = events_of(job_dir, 'restore_skipped')[-1]
  assert skipped['step'] == second and f'{name} shard [{shard}] does not match the manifest' in skipped['error']
  assert events_of(job_dir, 'start')[-1]['restored_step'] < second
