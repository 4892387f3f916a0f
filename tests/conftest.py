"""Shared fixtures and checks for the pax-autockpt tests."""

import os
import re

import pytest

from pax_autockpt import process

COMPLETE = re.compile(r'^checkpoint_(\d{8})$')


def checkpoint_steps(job_log_dir) -> tuple[list[int], list[str]]:
  """(complete steps, incomplete entries) in Pax's checkpoint directory."""
  ckpt_dir = os.path.join(job_log_dir, 'checkpoints')
  names = sorted(os.listdir(ckpt_dir)) if os.path.isdir(ckpt_dir) else []
  complete = [int(m.group(1)) for m in map(COMPLETE.match, names) if m]
  return complete, [n for n in names if not COMPLETE.match(n)]


def assert_restorable(job_log_dir, step: int) -> None:
  """A committed Pax checkpoint: final name, state and metadata written."""
  path = os.path.join(job_log_dir, 'checkpoints', f'checkpoint_{step:08d}')
  assert os.path.isdir(os.path.join(path, 'state')), f'{path} has no state/'
  assert os.path.isfile(os.path.join(path, 'metadata', 'metadata')), f'{path} has no metadata'


def events_of(job_log_dir, kind: str, host: int = 0) -> list[dict]:
  return [e for e in process.read_events(job_log_dir, host) if e['event'] == kind]


def tb_scalars(job_log_dir) -> dict[str, list[tuple[int, float]]]:
  """The autockpt TensorBoard scalars: tag -> [(step, value)], read with TensorBoard's own reader."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  acc = event_accumulator.EventAccumulator(os.path.join(job_log_dir, 'summaries', 'autockpt'),
                                           size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  out = {}
  for tag in acc.Tags()['tensors']:
    out[tag] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                for e in acc.Tensors(tag)]
  return out


@pytest.fixture
def job_dir(tmp_path):
  return str(tmp_path / 'job')


@pytest.fixture
def jobs():
  """Jobs started by a test; any still running at its end are killed."""
  started = []
  yield started
  for job in started:
    job.kill()
