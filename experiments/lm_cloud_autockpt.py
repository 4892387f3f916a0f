"""LmCloudSpmd experiments with Autocheckpoint, as in the Cloud TPU guide, plus CPU-sized twins.

Run with `python -m pax_autockpt.main --exp=experiments.lm_cloud_autockpt.<Name> --job_log_dir=DIR`
or with stock `paxml/main.py` and the guide's flags. The autocheckpoint settings are the
`AUTOCKPT_*` class attributes of `pax_autockpt.experiment.AutockptMixin`; override them in a subclass.
"""

import jax
from paxml import experiment_registry
from paxml.tasks.lm.params import lm_cloud
from praxis import layers

from pax_autockpt.experiment import AutockptMixin


@experiment_registry.register
class LmCloudSpmd2BAutockpt(AutockptMixin, lm_cloud.LmCloudSpmd):
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
class LmCloudSpmdTinyAutockpt(AutockptMixin, lm_cloud.LmCloudSpmd):
  """CPU-sized twin of LmCloudSpmd2BAutockpt (seq 32, vocab 128, 2 layers, dim 64) on one device."""

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


@experiment_registry.register
class LmCloudSpmdTinyMultisliceAutockpt(LmCloudSpmdTinyAutockpt):
  """CPU-sized multislice twin: DCN [2, 1, 1] over local hosts (2 hosts, or 4 hosts as 2 slices).

  Each local host is one process with one CPU device, so a slice's ICI axis holds half the devices.
  """

  DCN_MESH_SHAPE = [2, 1, 1]

  @property
  def ICI_MESH_SHAPE(self):  # pylint: disable=invalid-name
    return [1, max(1, jax.device_count() // 2), 1]
