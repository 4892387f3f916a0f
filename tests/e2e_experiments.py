"""Experiments that only end-to-end tests need (registered like any other, given with --exp=tests...)."""

from paxml import experiment_registry

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
