"""examples/gke: the JobSet manifests parse, validate, wire every pod, and restart on 143 only uncounted.

Each pod's environment is built the way JobSet and GKE build it (JobSet's pod annotations, the Job's
completion index, the headless-service hostnames GKE's TPU webhook puts in TPU_WORKER_HOSTNAMES) and run
through `hosts.resolve`; the failure policy is evaluated the way the Job and JobSet controllers do.
"""

import math
import pathlib
import re

import kubernetes_validate
import pytest
import yaml

from pax_autockpt import settings as settings_lib
from pax_autockpt.hosts import hosts

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / 'examples' / 'gke'
MANIFESTS = ['jobset-multislice.yaml', 'jobset-single-slice.yaml']
K8S_VERSIONS = ['1.31.0', '1.33.0']  # podFailurePolicy is GA from 1.31
_FIELD = re.compile(r"metadata\.(annotations|labels)\['([^']+)'\]")


@pytest.fixture(autouse=True)
def _no_tpu_devices(monkeypatch):
  monkeypatch.setattr(hosts, '_TPU_DEVICES', ('/nonexistent/accel0',))


def _load(name):
  docs = list(yaml.safe_load_all((EXAMPLES / name).read_text()))
  assert len(docs) == 1 and docs[0]['kind'] == 'JobSet', name
  return docs[0]


def _job(jobset):
  replicated, = jobset['spec']['replicatedJobs']
  return replicated, replicated['template']['spec']


def _container(job_spec):
  container, = job_spec['template']['spec']['containers']
  return container


def _flag(container, name):
  values = [a.split('=', 1)[1] for a in container['command'] if a.startswith(f'--{name}=')]
  return values[0] if values else None


# --- what JobSet, the Job controller and GKE's TPU webhook give each pod --------------------------------


def _pods(jobset):
  """(slice, worker, env) for every pod of the JobSet."""
  replicated, job_spec = _job(jobset)
  name, rjob = jobset['metadata']['name'], replicated['name']
  subdomain = jobset['spec'].get('network', {}).get('subdomain', name)
  workers = job_spec['completions']
  for job_index in range(replicated.get('replicas', 1)):
    job_name = f'{name}-{rjob}-{job_index}'  # JobSet's child Job name
    annotations = {'jobset.sigs.k8s.io/jobset-name': name, 'jobset.sigs.k8s.io/replicatedjob-name': rjob,
                   'jobset.sigs.k8s.io/job-index': str(job_index),
                   'jobset.sigs.k8s.io/replicatedjob-replicas': str(replicated.get('replicas', 1))}
    for worker in range(workers):
      pod_annotations = {**annotations, 'batch.kubernetes.io/job-completion-index': str(worker)}
      injected = {'JOB_COMPLETION_INDEX': str(worker), 'TPU_WORKER_ID': str(worker),
                  'TPU_WORKER_HOSTNAMES': ','.join(f'{job_name}-{k}.{subdomain}' for k in range(workers))}
      yield job_index, worker, {**injected, **_container_env(_container(job_spec), pod_annotations)}


def _container_env(container, annotations):
  """The container's env list as the kubelet resolves it: fieldRefs, then $(VAR) of earlier entries."""
  env = {}
  for entry in container.get('env', []):
    if 'value' in entry:
      env[entry['name']] = re.sub(r'\$\((\w+)\)', lambda m: env.get(m.group(1), m.group(0)), entry['value'])
      continue
    kind, key = _FIELD.fullmatch(entry['valueFrom']['fieldRef']['fieldPath']).groups()
    assert kind == 'annotations', 'the example reads JobSet annotations only'
    env[entry['name']] = annotations[key]
  return env


# --- what the Job and JobSet controllers do with a pod's exit -------------------------------------------


def _job_failure_reason(job_spec, container_name, exit_code, disrupted=False):
  """Job controller: the first podFailurePolicy rule that matches, else the backoff limit."""
  for rule in job_spec.get('podFailurePolicy', {}).get('rules', []):
    codes = rule.get('onExitCodes')
    conditions = rule.get('onPodConditions', [])
    matched = (codes is not None and codes.get('containerName', container_name) == container_name and
               (exit_code in codes['values']) == (codes['operator'] == 'In')) or (
                   disrupted and any(c['type'] == 'DisruptionTarget' for c in conditions))
    if matched:
      return {'FailJob': 'PodFailurePolicy', 'Ignore': None}.get(rule['action'], 'BackoffLimitExceeded')
  return 'BackoffLimitExceeded' if job_spec.get('backoffLimit', 6) == 0 else None


def _jobset_action(jobset, exit_code, disrupted=False):
  """JobSet controller: what a pod exiting with `exit_code` leads to."""
  if exit_code == 0 and not disrupted:
    return 'Completed'
  replicated, job_spec = _job(jobset)
  reason = _job_failure_reason(job_spec, _container(job_spec)['name'], exit_code, disrupted)
  if reason is None:
    return 'pod replaced, nothing counted'
  for rule in jobset['spec']['failurePolicy'].get('rules', []):
    if (not rule.get('onJobFailureReasons') or reason in rule['onJobFailureReasons']) and (
        not rule.get('targetReplicatedJobs') or replicated['name'] in rule['targetReplicatedJobs']):
      return rule['action']
  return 'RestartJobSet'


# --- tests ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize('name', MANIFESTS)
def test_job_template_validates_against_kubernetes_schemas(name):
  """The Job each replicatedJob stamps out (pod spec, podFailurePolicy, env, resources) against
  Kubernetes' own OpenAPI schemas, strict: no unknown fields. JobSet's CRD schema is not packaged, so its
  own fields are checked below by name."""
  _, job_spec = _job(_load(name))
  job = {'apiVersion': 'batch/v1', 'kind': 'Job', 'metadata': {'name': 'slice'}, 'spec': job_spec}
  for version in K8S_VERSIONS:
    kubernetes_validate.validate(job, version, strict=True)


def test_the_validator_catches_a_misspelt_field():
  _, job_spec = _job(_load(MANIFESTS[0]))
  job_spec['template']['spec']['terminationGracePeriod'] = 300
  job = {'apiVersion': 'batch/v1', 'kind': 'Job', 'metadata': {'name': 'slice'}, 'spec': job_spec}
  with pytest.raises(kubernetes_validate.ValidationError):
    kubernetes_validate.validate(job, K8S_VERSIONS[0], strict=True)


@pytest.mark.parametrize('name', MANIFESTS)
def test_jobset_fields(name):
  jobset = _load(name)
  assert jobset['apiVersion'] == 'jobset.x-k8s.io/v1alpha2'
  assert set(jobset['spec']) <= {'replicatedJobs', 'network', 'failurePolicy', 'successPolicy', 'suspend'}
  policy = jobset['spec']['failurePolicy']
  assert set(policy) == {'maxRestarts', 'rules'} and policy['maxRestarts'] >= 1
  for rule in policy['rules']:
    assert set(rule) <= {'name', 'action', 'onJobFailureReasons', 'targetReplicatedJobs'}
    assert re.fullmatch(r'[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?', rule['name'])
    assert rule['action'] in ('FailJobSet', 'RestartJobSet', 'RestartJobSetAndIgnoreMaxRestarts')
  replicated, job_spec = _job(jobset)
  assert set(replicated) == {'name', 'replicas', 'template'}
  assert job_spec['completionMode'] == 'Indexed' and job_spec['parallelism'] == job_spec['completions']


@pytest.mark.parametrize('name, slices, per_slice, source', [
    ('jobset-multislice.yaml', 2, 2, 'tpu-multislice'), ('jobset-single-slice.yaml', 1, 2, 'tpu')])
def test_every_pod_resolves_to_its_own_host_and_one_coordinator(name, slices, per_slice, source):
  jobset = _load(name)
  coordinator = f'{jobset["metadata"]["name"]}-slice-0-0.{jobset["metadata"]["name"]}:{hosts.DEFAULT_PORT}'
  seen = []
  for slice_id, worker, env in _pods(jobset):
    wiring = hosts.resolve(env=env)
    assert wiring == hosts.Wiring(slice_id * per_slice + worker, slices * per_slice, coordinator, source), env
    seen.append(wiring.host_idx)
  assert sorted(seen) == list(range(slices * per_slice))


def test_multislice_env_agrees_with_the_jobset():
  jobset = _load('jobset-multislice.yaml')
  replicated, job_spec = _job(jobset)
  env = {e['name']: e.get('value') for e in _container(job_spec)['env']}
  assert env['MEGASCALE_NUM_SLICES'] == str(replicated['replicas'])


@pytest.mark.parametrize('name', MANIFESTS)
def test_the_experiment_fits_the_slices(name):
  """The experiment the pods run has a mesh for exactly these chips: hosts x google.com/tpu per pod."""
  import importlib  # pylint: disable=g-import-not-at-top
  jobset = _load(name)
  replicated, job_spec = _job(jobset)
  container = _container(job_spec)
  module, cls = _flag(container, 'exp').rsplit('.', 1)
  model = getattr(importlib.import_module(module), cls)().task().model
  num_hosts = replicated['replicas'] * job_spec['completions']
  chips = int(container['resources']['limits']['google.com/tpu'])
  hosts.check_mesh(num_hosts=num_hosts, devices_per_host=chips, ici_mesh_shape=model.ici_mesh_shape,
                   dcn_mesh_shape=model.dcn_mesh_shape)
  assert math.prod(model.dcn_mesh_shape) == replicated['replicas']


@pytest.mark.parametrize('name', MANIFESTS)
def test_failure_policy_restarts_on_the_exit_code_without_counting_and_counts_real_failures(name):
  jobset = _load(name)
  _, job_spec = _job(jobset)
  container = _container(job_spec)
  code = int(_flag(container, 'autockpt_exit_code') or settings_lib.DEFAULT_EXIT_CODE)
  exit_rules = [r for r in job_spec['podFailurePolicy']['rules'] if 'onExitCodes' in r]
  assert [r['onExitCodes']['values'] for r in exit_rules] == [[code]]  # names the configured code
  assert exit_rules[0]['onExitCodes']['containerName'] == container['name']
  assert job_spec['template']['spec']['restartPolicy'] == 'Never' and job_spec['backoffLimit'] == 0
  assert job_spec['template']['spec']['terminationGracePeriodSeconds'] >= 120  # room for the save
  # The exit path plans inside the pod's grace period: the same number.
  assert float(_flag(container, 'autockpt_grace_secs')) == job_spec['template']['spec']['terminationGracePeriodSeconds']
  assert _jobset_action(jobset, code) == 'RestartJobSetAndIgnoreMaxRestarts'
  assert _jobset_action(jobset, 137, disrupted=True) == 'RestartJobSetAndIgnoreMaxRestarts'  # node gone
  for failure in (1, 2, 134, 137, 139, 130):
    assert _jobset_action(jobset, failure) == 'RestartJobSet', failure  # counts against maxRestarts
  assert _jobset_action(jobset, 0) == 'Completed'


def test_the_policy_check_can_fail():
  """A manifest whose rule names another exit code would restart real failures for ever: caught."""
  jobset = _load(MANIFESTS[0])
  _, job_spec = _job(jobset)
  job_spec['podFailurePolicy']['rules'][0]['onExitCodes']['values'] = [1]
  assert _jobset_action(jobset, 1) == 'RestartJobSetAndIgnoreMaxRestarts'
  assert _jobset_action(jobset, 143) == 'RestartJobSet'
