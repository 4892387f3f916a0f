"""LmCloudSpmd experiments with Autocheckpoint, as in Cloud TPU's Autocheckpoint guide, plus CPU-sized twins.

Run with `python -m pax_autockpt.main --exp=experiments.lm_cloud_autockpt.<Name> --job_log_dir=DIR`
or with stock `paxml/main.py` and the Autocheckpoint guide's two flags. The autocheckpoint settings are the
`AUTOCKPT_*` class attributes of `pax_autockpt.experiment.AutockptMixin`; override them in a subclass.
"""

import os

import jax
from jax import numpy as jnp
from paxml import experiment_registry
from paxml.tasks.lm.params import lm_cloud
from praxis import base_input
from praxis import layers
from praxis import pax_fiddle
from praxis import py_utils

from experiments import synthetic_lm_input
from experiments import tfrecord_lm_input
from pax_autockpt.experiment import AutockptMixin

_SMOKE = ['smoke_test_abstract_init']


class SyntheticLmSpecsProvider(base_input.BaseInputSpecsProvider):
  """The packed-LM batch specs of lm_cloud's synthetic data, without building the input pipeline."""

  batch_size: int = 1
  seq_len: int = 1

  def get_input_specs(self):
    shape = (self.batch_size, self.seq_len)
    ints = jax.ShapeDtypeStruct(shape, jnp.int32)
    floats = jax.ShapeDtypeStruct(shape, jnp.float32)
    return py_utils.NestedMap(ids=ints, labels=ints, segment_ids=ints, segment_pos=ints,
                              paddings=floats, weights=floats)


class _SyntheticSpecs:
  """Model-init specs from the synthetic data's shapes (per process, as Pax expects for pjit)."""

  def get_input_specs_provider_params(self):
    return pax_fiddle.Config(SyntheticLmSpecsProvider, seq_len=self.MAX_SEQ_LEN,
                             batch_size=self.PERCORE_BATCH_SIZE * jax.local_device_count())


@experiment_registry.register
class LmCloudSpmd2BAutockpt(AutockptMixin, _SyntheticSpecs, lm_cloud.LmCloudSpmd):
  """The guide's single-slice model: LmCloudSpmd2B on 8 chips (e.g. v4-8 / v5e-8), ICI [1, 8, 1]."""

  PERCORE_BATCH_SIZE = 8
  NUM_LAYERS = 18
  MODEL_DIMS = 3072
  HIDDEN_DIMS = MODEL_DIMS * 4
  CHECKPOINT_POLICY = layers.AutodiffCheckpointType.SAVE_NOTHING
  ICI_MESH_SHAPE = [1, 8, 1]


@experiment_registry.register
class LmCloudSpmd2BMultisliceAutockpt(LmCloudSpmd2BAutockpt):
  """The guide's multislice model: 2 slices of 4 chips, ICI [1, 4, 1] x DCN [2, 1, 1]."""

  ICI_MESH_SHAPE = [1, 4, 1]
  DCN_MESH_SHAPE = [2, 1, 1]


@experiment_registry.register
class LmCloudSpmd2BMultislice16Autockpt(LmCloudSpmd2BAutockpt):
  """2 slices of 8 chips, ICI [1, 8, 1] x DCN [2, 1, 1]: GKE multislice (examples/gke), whose slices are
  multi-host (e.g. 2 x v5e 2x4, 4 TPU VMs of 4 chips)."""

  DCN_MESH_SHAPE = [2, 1, 1]


@experiment_registry.register
class LmCloudSpmd2BContinuousAutockpt(LmCloudSpmd2BAutockpt):
  """MaxText's continuous checkpointing setting on Pax: continuous checkpointing, keep the latest 10."""

  AUTOCKPT_CONTINUOUS = True
  AUTOCKPT_KEEP_LATEST = 10


class LmCloudSpmdTiny(_SyntheticSpecs, lm_cloud.LmCloudSpmd):
  """The CPU-sized model and schedule (seq 32, vocab 128, 2 layers, dim 64), without the hook."""

  PERCORE_BATCH_SIZE = 4
  MAX_SEQ_LEN = 32
  VOCAB_SIZE = 128
  NUM_LAYERS = 2
  MODEL_DIMS = 64
  HIDDEN_DIMS = MODEL_DIMS * 4
  DIMS_PER_HEAD = 8
  CHECKPOINT_POLICY = layers.AutodiffCheckpointType.SAVE_NOTHING
  ICI_MESH_SHAPE = [1, 1, 1]
  CHECKPOINT_EVERY_N_STEPS = 500
  NUM_TRAIN_STEPS = 2000

  def task(self):
    task_p = super().task()
    task_p.train.num_train_steps = self.NUM_TRAIN_STEPS
    return task_p

  def datasets(self):
    """lm_cloud's synthetic train and eval batches, the same arrays, made with NumPy: its Lingvo input
    builds a TensorFlow graph per input at start-up (~1.6 s) and runs it for every batch (a 600-step
    run: ~3 CPU-seconds more, of ~32; median of 8 paired runs)."""
    batch_size = self.PERCORE_BATCH_SIZE * jax.local_device_count()
    return [pax_fiddle.Config(synthetic_lm_input.SyntheticLmInput, batch_size=batch_size, seq_len=self.MAX_SEQ_LEN,
                              is_training=is_training) for is_training in (True, False)]


@experiment_registry.register(tags=_SMOKE)
class LmCloudSpmdTinyAutockpt(AutockptMixin, LmCloudSpmdTiny):
  """CPU-sized twin of LmCloudSpmd2BAutockpt on one device: 2000 steps, a save every 500."""


@experiment_registry.register(tags=_SMOKE)
class LmCloudSpmdTinyShortAutockpt(LmCloudSpmdTinyAutockpt):
  """The same over 800 steps, a save every 200: the README's ten-minute tutorial, each run 40% as long."""

  NUM_TRAIN_STEPS = 800
  CHECKPOINT_EVERY_N_STEPS = 200


@experiment_registry.register(tags=_SMOKE)
class LmCloudSpmdTinyMultisliceAutockpt(LmCloudSpmdTinyAutockpt):
  """CPU-sized multislice twin: DCN [2, 1, 1] over local hosts (2 hosts, or 4 hosts as 2 slices).

  Each local host is one process with one CPU device, so a slice's ICI axis holds half the devices.
  """

  DCN_MESH_SHAPE = [2, 1, 1]

  @property
  def ICI_MESH_SHAPE(self):  # pylint: disable=invalid-name
    return [1, max(1, jax.device_count() // 2), 1]


@experiment_registry.register(tags=_SMOKE)
class LmCloudSpmdTinyContinuousAutockpt(LmCloudSpmdTinyAutockpt):
  """CPU-sized twin of LmCloudSpmd2BContinuousAutockpt (a save per second at most, keep 3)."""

  AUTOCKPT_CONTINUOUS = True
  AUTOCKPT_MIN_INTERVAL_SECS = 1.0
  AUTOCKPT_KEEP_LATEST = 3
  NUM_TRAIN_STEPS = 100_000


@experiment_registry.register(tags=_SMOKE)
class LmCloudSpmdTinyTFRecordAutockpt(LmCloudSpmdTinyAutockpt):
  """The CPU-sized twin on real data with input checkpointing: every batch differs (a shuffled
  TFRecord file, experiments.tfrecord_lm_input), and each checkpoint holds the input's position, so a
  resumed run draws exactly the batches an uninterrupted one would. The file is $AUTOCKPT_TINY_TFRECORD
  (make one with `python -m experiments.tfrecord_lm_input PATH`). 600 steps, a save every 200."""

  NUM_TRAIN_STEPS = 600
  CHECKPOINT_EVERY_N_STEPS = 200

  def datasets(self):
    train = pax_fiddle.Config(tfrecord_lm_input.TFRecordLmInput, is_training=True, seq_len=self.MAX_SEQ_LEN,
                              file_pattern=os.environ.get('AUTOCKPT_TINY_TFRECORD', ''),
                              batch_size=self.PERCORE_BATCH_SIZE * jax.local_device_count())
    return [train, super().datasets()[1]]

  def task(self):
    task_p = super().task()
    task_p.train.enable_input_checkpointing = True
    return task_p
