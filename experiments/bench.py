"""Experiments for `make bench`, `make soak` and the end-to-end tests: stock baselines (no hook), larger CPU
states, and the tiny model with paced (or blocking) inputs and long evals and decodes.

`--exp=experiments.bench.<Name>`. The `*Stock` classes are the same models without
AutockptMixin, for stock paxml/main.py; the others carry the hook.
"""

import os
import sys
import threading
import time

import jax
import numpy as np
from paxml import experiment_registry
from paxml.tasks.lm.params import lm_cloud
from praxis import decoder_hparams
from praxis import pax_fiddle

from experiments import lm_cloud_autockpt as exps
from experiments import synthetic_lm_input
from pax_autockpt.experiment import AutockptMixin


class _Tiny(exps.LmCloudSpmdTiny):
  """LmCloudSpmdTinyAutockpt's model without the hook, on a schedule longer than any bench run, on
  lm_cloud's own (Lingvo) input, as when bench/results.md was measured: the tiny experiments' NumPy
  input makes a step ~3 ms cheaper, so the step-time ratios would not compare with the recorded ones."""

  NUM_TRAIN_STEPS = 1_000_000
  datasets = lm_cloud.SyntheticDataset.datasets


@experiment_registry.register
class TinyStock(_Tiny):
  """Stock baseline of the tiny model."""


@experiment_registry.register
class TinyAutockpt(AutockptMixin, _Tiny):
  """The tiny model with the hook, a long schedule."""


class _Medium(_Tiny):
  """~50M parameters (x3 with Adam's moments): vocab 32000, dim 512, 8 layers."""

  VOCAB_SIZE = 32000
  MODEL_DIMS = 512
  HIDDEN_DIMS = 2048
  NUM_LAYERS = 8
  DIMS_PER_HEAD = 64
  PERCORE_BATCH_SIZE = 1


class _Large(_Medium):
  """~200M parameters: vocab 32000, dim 1024, 15 layers."""

  MODEL_DIMS = 1024
  HIDDEN_DIMS = 4096
  NUM_LAYERS = 15


@experiment_registry.register
class MediumStock(_Medium):
  pass


@experiment_registry.register
class MediumAutockpt(AutockptMixin, _Medium):
  pass


@experiment_registry.register
class LargeStock(_Large):
  pass


@experiment_registry.register
class LargeAutockpt(AutockptMixin, _Large):
  pass


class _TinyTrace(_Tiny):
  """The tiny model checkpointed every 4,000 steps (~60-100 s at the 40-65 steps/s it trains at on 2 CPUs), for
  the bench's `goodputtrace_Tiny`: about a fifth of the trace's mean time between failures (400 s), as a user who
  saves every two hours against a failure every ten; the schedule (10**6 steps) never runs out in a window."""

  CHECKPOINT_EVERY_N_STEPS = 4000


@experiment_registry.register
class TinyTraceStock(_TinyTrace):
  """The trace's model without the hook, for stock paxml/main.py."""


@experiment_registry.register
class TinyTraceAutockpt(AutockptMixin, _TinyTrace):
  """The trace's model with the hook: the same model and Pax interval as TinyTraceStock."""


@experiment_registry.register
class TinyMultisliceRareSaves(exps.LmCloudSpmdTinyMultisliceAutockpt):
  """2 local hosts x 1 device, DCN [2, 1, 1]; Pax's interval never comes (only the initial save). On
  lm_cloud's Lingvo input, as measured for bench/results.md (see _Tiny)."""

  NUM_TRAIN_STEPS = 1_000_000
  CHECKPOINT_EVERY_N_STEPS = 10**9
  datasets = lm_cloud.SyntheticDataset.datasets


@experiment_registry.register
class TinySoakAutockpt(exps.LmCloudSpmdTinyAutockpt):
  """The tiny model with a schedule that 30 chaos cycles do not finish before the last one. Pax keeps
  every checkpoint: the soak counts any committed one that disappears as lost."""

  NUM_TRAIN_STEPS = 12_000
  CHECKPOINT_MAX_TO_KEEP = 1_000_000


@experiment_registry.register
class TinyMultisliceSoakAutockpt(exps.LmCloudSpmdTinyMultisliceAutockpt):
  """2 local hosts train ~20 steps/s: saves every 100 steps so that a cycle can hit one. Pax keeps every
  checkpoint (see TinySoakAutockpt)."""

  CHECKPOINT_EVERY_N_STEPS = 100
  NUM_TRAIN_STEPS = 3000
  CHECKPOINT_MAX_TO_KEEP = 1_000_000


@experiment_registry.register
class TinyModelParallelAutockpt(exps.LmCloudSpmdTinyAutockpt):
  """One slice over all local hosts, ICI [1, N, 1]: each host holds (and writes) its own part of every
  sharded array, so a checkpoint has shards only host 1 wrote."""

  @property
  def ICI_MESH_SHAPE(self):  # pylint: disable=invalid-name
    import jax  # pylint: disable=g-import-not-at-top
    return [1, jax.device_count(), 1]


@experiment_registry.register
class TinyRareSavesAutockpt(TinyAutockpt):
  """The tiny model whose Pax interval never comes: only the first save, and what the hook saves."""

  CHECKPOINT_EVERY_N_STEPS = 10**9


@experiment_registry.register
class MediumModelParallelAutockpt(AutockptMixin, _Medium):
  """The Medium state as one slice over all local hosts, ICI [1, N, 1] (TinyModelParallelAutockpt's layout):
  each host holds its own part of every sharded array and no host a data-parallel replica, so a host that
  lost its disk finds its share only in the buddy copy a peer keeps (bench `buddystep_*`, `buddyrelaunch_*`).
  Pax's interval never comes (only the initial save): after a kill the local tier holds the newest state."""

  CHECKPOINT_EVERY_N_STEPS = 10**9

  @property
  def ICI_MESH_SHAPE(self):  # pylint: disable=invalid-name
    import jax  # pylint: disable=g-import-not-at-top
    return [1, jax.device_count(), 1]


class PacedLmInput(synthetic_lm_input.SyntheticLmInput):
  """The synthetic batches, each after `AUTOCKPT_PACED_<ROLE>_SLEEP_S` seconds (0 when unset); the train input's
  get_next never returns from its `AUTOCKPT_PACED_TRAIN_BLOCK_AT`-th call on (a reader stuck on storage). Read
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
    block_at = int(os.environ.get(f'AUTOCKPT_PACED_{self.role}_BLOCK_AT', '0'))
    if block_at and self._calls >= block_at:
      print(f'[paced input] {self.role} get_next blocks at call {self._calls}', file=sys.stderr, flush=True)
      threading.Event().wait()
    time.sleep(float(os.environ.get(f'AUTOCKPT_PACED_{self.role}_SLEEP_S', '0')))
    return super().get_next()


class _SlowEval:
  """150 steps, a save at 0 only (every other checkpoint is one the test caused), an eval every 100 steps of
  4,000 batches over a paced input (with `--eval_on_test`; `AUTOCKPT_PACED_EVAL_SLEEP_S=0.03`: about two
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
class TinySlowEval(_SlowEval, exps.LmCloudSpmdTinyAutockpt):
  """The tiny model with the hook, a paced input and a 2-minute eval (_SlowEval)."""


@experiment_registry.register
class TinySlowEvalStock(_SlowEval, exps.LmCloudSpmdTiny):
  """TinySlowEval without the hook, for stock paxml/main.py."""


@experiment_registry.register
class TinySlowEvalModelParallel(TinySlowEval):
  """TinySlowEval as one slice over every local host (ICI [1, N, 1]): each eval batch is a collective. Its eval
  comes every 20 steps: each train step is a collective too (~0.35 s over 2 local hosts on 2 shared cores)."""

  @property
  def ICI_MESH_SHAPE(self):  # pylint: disable=invalid-name
    return [1, jax.device_count(), 1]

  def task(self):
    task_p = super().task()
    task_p.train.eval_interval_steps = 20
    return task_p


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
  over a paced input (`AUTOCKPT_PACED_DECODE_SLEEP_S`)."""

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
