"""Experiments that only end-to-end tests need (registered like any other, given with --exp=tests...)."""

import os
import time

import jax
from paxml import experiment_registry

from experiments import bench
from experiments import lm_cloud_autockpt


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
class TinyModelParallelHost1Wider(bench.TinyModelParallelAutockpt):
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
class TinyIntervalFromEnv(lm_cloud_autockpt.LmCloudSpmdTinyAutockpt):
  """The tiny experiment with no end in sight and Pax's interval read at start-up from
  AUTOCKPT_TEST_CHECKPOINT_EVERY (200 unset): a test sets the scene with frequent saves, then runs on with
  none, so no interval save or end of training can race its signal, however fast the machine runs."""

  NUM_TRAIN_STEPS = 10**6

  @property
  def CHECKPOINT_EVERY_N_STEPS(self):  # pylint: disable=invalid-name
    return int(os.environ.get('AUTOCKPT_TEST_CHECKPOINT_EVERY', '200'))


@experiment_registry.register
class TinyModelParallelRareSaves(bench.TinyModelParallelAutockpt):
  """One slice over every local host (ICI [1, N, 1]: each host holds its own half of every sharded array, so
  no host has a data-parallel replica), 600 steps, Pax's interval saves only at 0 and 600: after a kill the
  local tier holds the newest state, and a host that lost its disk has no peer with its shards but its buddy."""

  NUM_TRAIN_STEPS = 600
  CHECKPOINT_EVERY_N_STEPS = 600


@experiment_registry.register
class MediumTwoReplicas(bench.MediumAutockpt):
  """The Medium state (~50M parameters, ~600 MB with Adam's moments) over 2 local hosts as 2 data-parallel
  slices (DCN [2, 1, 1]): each host holds a whole replica, so a replaced host's share comes from its peer.
  Pax's interval never comes (only the initial save): after a kill the local tier holds the newest state."""

  DCN_MESH_SHAPE = [2, 1, 1]
  CHECKPOINT_EVERY_N_STEPS = 10**9

  @property
  def ICI_MESH_SHAPE(self):  # pylint: disable=invalid-name
    return [1, max(1, jax.device_count() // 2), 1]



class HoldingLatestN:
  """LatestN(2) whose every call before a signal first holds its thread HOLD_SECS (host 0's background thread
  runs it after each commit), with a line at either end: a SIGTERM sent at the first line comes while host 0
  still preserves after a commit, which the second line's place in host 0's log proves."""

  HOLD_SECS = 12.0

  def should_preserve(self, checkpoints, *, context):
    from absl import logging  # pylint: disable=g-import-not-at-top

    from pax_autockpt import policies  # pylint: disable=g-import-not-at-top
    from pax_autockpt.signals import signals  # pylint: disable=g-import-not-at-top
    if signals.received() is None:
      logging.warning('[test] preservation after a commit: holding %g s', self.HOLD_SECS)
      time.sleep(self.HOLD_SECS)
      logging.warning('[test] preservation after a commit: done holding')
    return policies.LatestN(2).should_preserve(checkpoints, context=context)


@experiment_registry.register
class TwoHostsContinuousHeldPreservation(lm_cloud_autockpt.LmCloudSpmdTinyMultisliceAutockpt):
  """The 2-host multislice twin saving continuously (at most a save a second) with a preservation policy that
  holds host 0's background thread after each commit (HoldingLatestN), 60 s of grace."""

  AUTOCKPT_CONTINUOUS = True
  AUTOCKPT_MIN_INTERVAL_SECS = 1.0
  AUTOCKPT_PRESERVATION_POLICY = HoldingLatestN()
  AUTOCKPT_GRACE_SECS = 60.0
  NUM_TRAIN_STEPS = 100_000
