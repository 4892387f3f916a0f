"""A damaged newest checkpoint is passed over (and kept aside), never restored, never a crash loop:
missing or truncated chunks, a byte flipped inside the data (the content manifest), a damaged manifest.

One run makes several committed checkpoints (continuous saving), each of the newest gets a different
kind of damage, and one restart has to pass over all of them, newest first, and restore the first whole
one: every kind of damage is exercised with two process starts.
"""

import glob
import os
import shutil
import signal
import subprocess
import sys

import pytest

from pax_autockpt import layout
from pax_autockpt.tools import process
from pax_autockpt.tools import verify
from tests import damage
from tests import forkserver
from tests.conftest import checkpoint_steps
from tests.conftest import events_of

pytestmark = pytest.mark.e2e

EXP = process.TINY_EXP
CLI = [sys.executable, '-m', 'pax_autockpt.tools.cli']
ZARR = '--tensorstore_use_ocdbt=false'  # Pax's default: a directory and chunk files per array
OCDBT = '--tensorstore_use_ocdbt'  # one key-value database per checkpoint


def _run_and_preempt(jobs, job_dir, log, *flags, min_checkpoints=1) -> list[int]:
  """Trains until `min_checkpoints` are committed, SIGTERM; returns the committed steps."""
  job = forkserver.job(process.ours_argv(EXP, job_dir, *flags), log)
  jobs.append(job)
  job.wait_for_log(r'\[PAX STATUS\]: Step `\d+` completed')
  process.wait_until(lambda: len(events_of(job_dir, 'save_committed')) >= min_checkpoints,
                     f'{min_checkpoints} committed saves', 120, 0.2, job)
  job.send(signal.SIGTERM)
  assert job.wait(120) == 143, job.log()[-3000:]
  return checkpoint_steps(job_dir)[0]


def _step_path(job_dir, step):
  return layout.step_dir(layout.checkpoint_dir(job_dir), step)


def _a_chunk(job_dir, step):
  path = os.fspath(_step_path(job_dir, step) / 'state')
  return sorted(glob.glob(os.path.join(path, '*.w', '0.0')))[0]


def _restart(jobs, job_dir, log, *flags) -> int:
  """The same command again, until its restore is done (its `start` event), then SIGTERM: nothing trained
  since the restore, so it exits 143 before the training step compiles. Returns the restored step."""
  starts = len(events_of(job_dir, 'start'))
  job = forkserver.job(process.ours_argv(EXP, job_dir, *flags), log)
  jobs.append(job)
  process.wait_until(lambda: len(events_of(job_dir, 'start')) > starts, 'the restart\'s start event', 300, 0.05, job)
  job.send(signal.SIGTERM)
  assert job.wait(120) == 143, job.log()[-3000:]
  return events_of(job_dir, 'start')[-1]['restored_step']


def test_every_kind_of_damage_is_passed_over_kept_aside_and_found_offline(jobs, job_dir, tmp_path, capsys):
  steps = _run_and_preempt(jobs, job_dir, str(tmp_path / 'run1.log'), ZARR, '--autockpt_continuous',
                           min_checkpoints=6)
  assert len(steps) >= 5, steps
  flipped, bad_manifest, truncated, missing, whole = steps[-1], steps[-2], steps[-3], steps[-4], steps[-5]
  # A byte flipped in the middle of the largest array, written back as a valid chunk: neither the chunk
  # check nor the restore can tell; the content manifest does, offline and before training.
  original = shutil.copytree(_step_path(job_dir, flipped), tmp_path / 'original' / f'checkpoint_{flipped:08d}')
  name, shard = damage.flip_a_byte(_step_path(job_dir, flipped))
  assert verify.run_against(job_dir, str(original), flipped) == 1  # compared with its copy from before the flip
  assert f'step {flipped}: DIFFERENT: {name} shard [{shard}] differs from' in capsys.readouterr().out
  damage.break_manifest(_step_path(job_dir, bad_manifest))  # the manifest itself: so is its checkpoint
  with open(_a_chunk(job_dir, truncated), 'r+b') as f:  # a torn write: the restore itself fails
    f.truncate(3)
  os.remove(_a_chunk(job_dir, missing))  # tensorstore would read zeros for it: must not be restored

  out = subprocess.run([*CLI, 'verify', job_dir], capture_output=True, text=True, timeout=300)
  lines = {int(x.split(':')[0][5:]): x for x in out.stdout.splitlines() if x.startswith('step ')}
  assert out.returncode == 1 and f'DAMAGED: {name} shard [{shard}] does not match' in lines[flipped], out
  assert 'DAMAGED: manifest host0.json is damaged' in lines[bad_manifest]
  assert 'DAMAGED' in lines[truncated] and 'DAMAGED' in lines[missing] and ': ok (' in lines[whole], lines

  restored = _restart(jobs, job_dir, str(tmp_path / 'run2.log'), ZARR)
  assert restored == whole
  skipped = {e['step']: e['error'] for e in events_of(job_dir, 'restore_skipped')}
  assert list(skipped) == [flipped, bad_manifest, truncated, missing]  # newest first
  assert f'host 0: {name} shard [{shard}] does not match the manifest' in skipped[flipped]
  assert 'manifest: host0.json is damaged' in skipped[bad_manifest]
  assert 'is missing' in skipped[missing]
  log = open(tmp_path / 'run2.log').read()
  assert f'checkpoint {flipped} is damaged' in log and f'Model initial global_step={whole}' in log
  kept = sorted(os.listdir(layout.unrestorable_dir(job_dir)))  # moved aside, never deleted
  assert kept == sorted(f'checkpoint_{s:08d}' for s in skipped), kept
  assert all((layout.unrestorable_dir(job_dir) / k / 'state').is_dir() for k in kept)
  assert checkpoint_steps(job_dir)[1] == []


def test_ocdbt_a_flipped_byte_and_a_missing_data_file_are_passed_over(jobs, job_dir, tmp_path, capsys):
  """OCDBT: no silent zeros there (a missing data file makes the restore fail), but a flipped byte
  rewritten inside the database restores silently unless the manifest catches it."""
  steps = _run_and_preempt(jobs, job_dir, str(tmp_path / 'run1.log'), OCDBT, '--autockpt_continuous',
                           min_checkpoints=4)
  flipped, missing, whole = steps[-1], steps[-2], steps[-3]
  copy = shutil.copytree(_step_path(job_dir, whole), tmp_path / 'copy' / f'checkpoint_{whole:08d}')
  assert verify.run_against(job_dir, str(copy), whole) == 0  # OCDBT, byte for byte
  assert capsys.readouterr().out.startswith(f'step {whole}: identical to {copy} (54 arrays, ')
  name, shard = damage.flip_a_byte(_step_path(job_dir, flipped))
  data = glob.glob(os.path.join(os.fspath(_step_path(job_dir, missing)), 'state', '**', 'd', '*'), recursive=True)
  assert data, 'no OCDBT data files'
  os.remove(max(data, key=os.path.getsize))

  assert _restart(jobs, job_dir, str(tmp_path / 'run2.log'), OCDBT) == whole
  skipped = {e['step']: e['error'] for e in events_of(job_dir, 'restore_skipped')}
  assert list(skipped) == [flipped, missing]
  assert f'{name} shard [{shard}] does not match the manifest' in skipped[flipped]
  assert os.path.isdir(layout.unrestorable_dir(job_dir) / f'checkpoint_{missing:08d}')
