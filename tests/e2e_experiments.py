"""Experiments that only end-to-end tests need (registered like any other, given with --exp=tests...)."""

import os
import sys
import threading
import time

import jax
import numpy as np
from paxml import experiment_registry
from praxis import decoder_hparams
from praxis import pax_fiddle

from experiments import lm_cloud_autockpt
from experiments import synthetic_lm_input
from pax_autockpt.tools import bench_experiments


@experiment_registry.register
class TinyContinuousRareSummaries(lm_cloud_autockpt.LmCloudSpmdTinyContinuousAutockpt):
  """A save per second, keep 3, and Pax's own summaries only at step 0: while a test keeps the disk
  full, only checkpoint saves write there (Pax's summary writer failing stops training, exit 1)."""

  def task(self):
    task_p = super().task()
    task_p.train.summary_interval_steps = 1_000_000
    return task_p


@experiment_registry.register
class TinyWiderModel(lm_cloud_autockpt.LmCloudSpmdTinyAutockpt):
  """The tiny model with MODEL_DIMS 96 instead of 64: a typical config slip between a preemption and
  its restart. Its checkpoints do not fit the tiny model, nor the tiny model's checkpoints it."""

  MODEL_DIMS = 96
  HIDDEN_DIMS = MODEL_DIMS * 4


@experiment_registry.register
class TinyModelParallelHost1Wider(bench_experiments.TinyModelParallelAutockpt):
  """TinyModelParallelAutockpt on host 0, MODEL_DIMS 96 on host 1: a config slip one host alone sees
  (e.g. one host's image holding another version of the experiment)."""

  @property
  def MODEL_DIMS(self):  # pylint: disable=invalid-name
    import jax  # pylint: disable=g-import-not-at-top
    return 96 if jax.process_index() == 1 else 64

  @property
  def HIDDEN_DIMS(self):  # pylint: disable=invalid-name
    return self.MODEL_DIMS * 4


@experiment_registry.register
class TinyTFRecordRareSaves(lm_cloud_autockpt.LmCloudSpmdTinyTFRecordAutockpt):
  """The real-input twin, 600 steps and Pax's interval saves only at 0 and 600: every other
  checkpoint of a run is one the test caused (continuous, SIGTERM, Ctrl-C, notice)."""

  NUM_TRAIN_STEPS = 600
  CHECKPOINT_EVERY_N_STEPS = 600


@experiment_registry.register
class TinyTFRecordRareSavesTwoHosts(TinyTFRecordRareSaves):
  """The same over 2 local hosts as 2 data-parallel slices (DCN [2, 1, 1]): each host reads its own
  shard of the file and saves its own input position (`process_<i>-of-2`)."""

  DCN_MESH_SHAPE = [2, 1, 1]

  @property
  def ICI_MESH_SHAPE(self):  # pylint: disable=invalid-name
    return [1, max(1, jax.device_count() // 2), 1]


@experiment_registry.register
class TinyShortSchedule(lm_cloud_autockpt.LmCloudSpmdTinyAutockpt):
  """The tiny experiment over 600 steps with a save every 200: the CI soak cycle's final run trains to the
  end in a third of the time."""

  NUM_TRAIN_STEPS = 600
  CHECKPOINT_EVERY_N_STEPS = 200


@experiment_registry.register
class TinyModelParallelRareSaves(bench_experiments.TinyModelParallelAutockpt):
  """One slice over every local host (ICI [1, N, 1]: each host holds its own half of every sharded array, so
  no host has a data-parallel replica), 600 steps, Pax's interval saves only at 0 and 600: after a kill the
  local tier holds the newest state, and a host that lost its disk has no peer with its shards but its buddy."""

  NUM_TRAIN_STEPS = 600
  CHECKPOINT_EVERY_N_STEPS = 600


@experiment_registry.register
class MediumTwoReplicas(bench_experiments.MediumAutockpt):
  """The Medium state (~50M parameters, ~600 MB with Adam's moments) over 2 local hosts as 2 data-parallel
  slices (DCN [2, 1, 1]): each host holds a whole replica, so a replaced host's share comes from its peer.
  Pax's interval never comes (only the initial save): after a kill the local tier holds the newest state."""

  DCN_MESH_SHAPE = [2, 1, 1]
  CHECKPOINT_EVERY_N_STEPS = 10**9

  @property
  def ICI_MESH_SHAPE(self):  # pylint: disable=invalid-name
    return [1, max(1, jax.device_count() // 2), 1]


class PacedLmInput(synthetic_lm_input.SyntheticLmInput):
  """The synthetic batches, each after `AUTOCKPT_TEST_<ROLE>_SLEEP_S` seconds (0 when unset); the train input's
  get_next never returns from its `AUTOCKPT_TEST_TRAIN_BLOCK_AT`-th call on (a reader stuck on storage). Read
  from the environment, so that a rerun of the same experiment can go at full speed.

  Attributes:
    role: 'TRAIN', 'EVAL' or 'DECODE': which variables pace it.
  """

  role: str = 'TRAIN'

  def __post_init__(self):
    super().__post_init__()
    self._calls = 0

  def get_next(self):
    self._calls += 1
    block_at = int(os.environ.get(f'AUTOCKPT_TEST_{self.role}_BLOCK_AT', '0'))
    if block_at and self._calls >= block_at:
      print(f'[test input] {self.role} get_next blocks at call {self._calls}', file=sys.stderr, flush=True)
      threading.Event().wait()
    time.sleep(float(os.environ.get(f'AUTOCKPT_TEST_{self.role}_SLEEP_S', '0')))
    return super().get_next()


@experiment_registry.register
class TinySlowEval(lm_cloud_autockpt.LmCloudSpmdTinyAutockpt):
  """150 steps, a save at 0 only (every other checkpoint is one the test caused), an eval every 100 steps of
  4,000 batches over a paced input (with `--eval_on_test`; `AUTOCKPT_TEST_EVAL_SLEEP_S=0.03`: about two
  minutes, as a real test set takes), and a paced (or blocking) train input."""

  NUM_TRAIN_STEPS = 150
  CHECKPOINT_EVERY_N_STEPS = 10**9
  EVAL_BATCHES = 4000

  def task(self):
    task_p = super().task()
    task_p.train.eval_interval_steps = 100
    return task_p

  def datasets(self):
    train, evaluation = super().datasets()
    return [pax_fiddle.Config(PacedLmInput, **_fields(train), role='TRAIN'),
            pax_fiddle.Config(PacedLmInput, **_fields(evaluation), role='EVAL',
                              eval_loop_num_batches=self.EVAL_BATCHES)]


@experiment_registry.register
class TinySlowEvalModelParallel(TinySlowEval):
  """TinySlowEval as one slice over every local host (ICI [1, N, 1]): each eval batch is a collective."""

  @property
  def ICI_MESH_SHAPE(self):  # pylint: disable=invalid-name
    return [1, jax.device_count(), 1]


def _fields(config) -> dict:
  return {name: getattr(config, name) for name in ('batch_size', 'seq_len', 'is_training')}


class PacedDecodeInput(PacedLmInput):
  """PacedLmInput for a decode program: each example's prefix length, and the strings Pax writes its decode
  outputs with.

  Attributes:
    prefix_len: prefix tokens per example (the rest are decoded).
  """

  prefix_len: int = 4

  def get_next(self):
    batch = super().get_next()
    batch.prefix_lengths = np.full([self.batch_size], self.prefix_len, np.int32)
    return batch

  def ids_to_strings(self, ids, lengths, key=None):
    del key
    return [' '.join(str(int(t)) for t in row[:int(n)]) for row, n in zip(ids, lengths)]


@experiment_registry.register
class TinySlowDecode(TinySlowEval):
  """TinySlowEval with a greedy decode program every 100 steps (with `--decode_during_train`) of 4,000 batches
  over a paced input (`AUTOCKPT_TEST_DECODE_SLEEP_S`)."""

  def task(self):
    task_p = super().task()
    task_p.train.decode_interval_steps = 100
    task_p.train.decode_start_after_n_steps = 0
    task_p.model.decoder_tpl = decoder_hparams.GreedyDecoderHParams(seqlen=8, eos_id=-1)  # never ends early
    return task_p

  def decoder_datasets(self):
    return [pax_fiddle.Config(PacedDecodeInput, name='paced_decode', role='DECODE', seq_len=8,
                              batch_size=self.PERCORE_BATCH_SIZE * jax.local_device_count(), is_training=False,
                              reset_for_eval=False, eval_loop_num_batches=self.EVAL_BATCHES)]
