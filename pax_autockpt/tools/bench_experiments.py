"""Experiments for `make bench` and `make soak` only: stock baselines (no hook) and larger CPU states.

`--exp=pax_autockpt.tools.bench_experiments.<Name>`. The `*Stock` classes are the same models without
AutockptMixin, for stock paxml/main.py; the others carry the hook.
"""

from paxml import experiment_registry
from paxml.tasks.lm.params import lm_cloud

from experiments import lm_cloud_autockpt as exps
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
