"""Deliberately misconfigured experiments for the bad-input table (docs/bad-input.md)."""

from paxml import experiment_registry

from experiments import lm_cloud_autockpt
from pax_autockpt import policies


@experiment_registry.register
class ConflictingPolicies(lm_cloud_autockpt.LmCloudSpmdTinyAutockpt):
  AUTOCKPT_PRESERVATION_POLICY = policies.LatestN(3)
  AUTOCKPT_KEEP_LATEST = 5


@experiment_registry.register
class NotAPolicy(lm_cloud_autockpt.LmCloudSpmdTinyAutockpt):
  AUTOCKPT_SAVE_POLICY = 'every 100 steps'


@experiment_registry.register
class InvalidPolicyParameter(lm_cloud_autockpt.LmCloudSpmdTinyAutockpt):
  AUTOCKPT_PRESERVATION_POLICY = policies.AnyPreservationPolicy([policies.LatestN(3), policies.EveryNSteps(0)])


@experiment_registry.register
class UnwritableLocalDir(lm_cloud_autockpt.LmCloudSpmdTinyAutockpt):
  AUTOCKPT_LOCAL_DIR = '/proc/autockpt-local-{host}'
