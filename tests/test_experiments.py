"""Registry-based tests: every experiment is found by its --exp name and passes paxml's own checks."""

import math

import jax
import numpy as np
from paxml import experiment_imports_test_helper
from paxml import experiment_registry
from praxis import base_hyperparams
from praxis import base_layer
from praxis import py_utils
import pytest

import experiments.bench  # registers the bench, soak and end-to-end models  # pylint: disable=unused-import
import experiments.lm_cloud_autockpt  # registers the experiments  # pylint: disable=unused-import
from pax_autockpt import executor as executor_lib
from pax_autockpt.experiment import AutockptMixin
from pax_autockpt.shared import coordination
from pax_autockpt.startup import experiment_names

PREFIX = 'experiments.lm_cloud_autockpt.'
NAMES = ['LmCloudSpmd2BAutockpt', 'LmCloudSpmd2BMultisliceAutockpt', 'LmCloudSpmd2BMultislice16Autockpt',
         'LmCloudSpmd2BContinuousAutockpt', 'LmCloudSpmdTinyAutockpt', 'LmCloudSpmdTinyShortAutockpt',
         'LmCloudSpmdTinyMultisliceAutockpt', 'LmCloudSpmdTinyContinuousAutockpt', 'LmCloudSpmdTinyTFRecordAutockpt']


class ExperimentImportsTest(experiment_imports_test_helper.ExperimentImportsTestHelper):
  """paxml's helper: task instantiates, datasets exist, tagged ones abstract-init."""


NUM_CREATED = ExperimentImportsTest.create_test_methods_for_all_registered_experiments(
    experiment_registry, task_regexes=[r'^experiments\.'])


def test_helper_covers_every_experiment_in_the_package():
  found = [k for k in experiment_registry.get_all() if k.startswith(PREFIX)]
  assert sorted(found) == sorted(PREFIX + n for n in NAMES)
  # Every module of the package is imported above: a new one left out would go unchecked by paxml's helper.
  in_package = experiment_names.registered_in_sources('experiments')
  assert sorted(k for k in experiment_registry.get_all() if k.startswith('experiments.')) == sorted(in_package)
  assert NUM_CREATED == len(in_package)


@pytest.mark.parametrize('name', NAMES)
def test_found_by_exp_name_and_hooked(name):
  cls = experiment_registry.get(PREFIX + name)
  assert cls is getattr(experiments.lm_cloud_autockpt, name)
  assert issubclass(cls, AutockptMixin)
  assert isinstance(cls().executor(), executor_lib.AutockptExecutor)


def test_cpu_twins_are_tagged_for_abstract_init():
  for name in NAMES:
    tags = experiment_registry.get_registry_tags(PREFIX + name)
    assert ('smoke_test_abstract_init' in tags) == ('Tiny' in name), name


@pytest.mark.parametrize('name,ici,dcn', [
    ('LmCloudSpmd2BAutockpt', [1, 8, 1], [1, 1, 1]),
    ('LmCloudSpmd2BMultisliceAutockpt', [1, 4, 1], [2, 1, 1]),
    ('LmCloudSpmd2BMultislice16Autockpt', [1, 8, 1], [2, 1, 1]),
    ('LmCloudSpmdTinyAutockpt', [1, 1, 1], [1, 1, 1]),
])
def test_mesh_shapes(name, ici, dcn):
  model = getattr(experiments.lm_cloud_autockpt, name)().task().model
  assert list(model.ici_mesh_shape) == ici
  assert list(model.dcn_mesh_shape) == dcn


def test_tiny_multislice_mesh_follows_local_hosts(monkeypatch):
  exp = experiments.lm_cloud_autockpt.LmCloudSpmdTinyMultisliceAutockpt()
  for devices, ici in [(2, [1, 1, 1]), (4, [1, 2, 1])]:
    monkeypatch.setattr(jax, 'device_count', lambda d=devices: d)
    model = exp.task().model
    assert list(model.ici_mesh_shape) == ici and list(model.dcn_mesh_shape) == [2, 1, 1]
    assert math.prod(model.ici_mesh_shape) * math.prod(model.dcn_mesh_shape) == devices


def test_2b_multislice_fits_two_v4_8_slices():
  """2 slices x v4-8 (4 chips each, 1 host per slice): ICI x DCN covers all 8 devices."""
  model = experiments.lm_cloud_autockpt.LmCloudSpmd2BMultisliceAutockpt().task().model
  assert math.prod(model.ici_mesh_shape) == 4 and math.prod(model.dcn_mesh_shape) == 2


def _num_params(name):
  exp = getattr(experiments.lm_cloud_autockpt, name)()
  model = base_hyperparams.instantiate(exp.task()).model
  specs = base_hyperparams.instantiate(exp.get_input_specs_provider_params()).get_input_specs()
  specs = jax.tree.map(py_utils.get_global_input_shape_dtype, specs)
  weights = model.abstract_init_with_metadata(specs)['params']  # shapes only, nothing allocated
  leaves = jax.tree.leaves(weights, is_leaf=lambda x: isinstance(x, base_layer.WeightHParams))
  return sum(int(np.prod(w.shape)) * int(np.prod(w.repeat_prefix or [1])) for w in leaves)


def test_2b_parameter_count_exact():
  # 18 x (4 * 3072^2 attention + 2 * 3072 * 12288 FFN + biases/norms) + 32000 x 3072 embedding.
  assert _num_params('LmCloudSpmd2BAutockpt') == 2_137_273_856


def test_tiny_parameter_count_exact():
  assert _num_params('LmCloudSpmdTinyAutockpt') == 107_920


@pytest.mark.parametrize('name,keep,min_interval', [
    ('LmCloudSpmd2BContinuousAutockpt', 10, 0.0),
    ('LmCloudSpmdTinyContinuousAutockpt', 3, 1.0),
])
def test_continuous_experiments_settings(name, keep, min_interval):
  s = getattr(experiments.lm_cloud_autockpt, name)().autockpt_settings()
  assert s.continuous and s.keep_latest == keep and s.min_interval_secs == min_interval


def test_several_processes_without_a_coordination_service_exit_2_at_validate(monkeypatch, capsys):
  """orbax's barriers and broadcasts would silently do nothing: hosts would commit unsynchronised."""
  exp = experiment_registry.get(PREFIX + 'LmCloudSpmdTinyAutockpt')()
  monkeypatch.setattr(jax, 'process_count', lambda: 2)
  monkeypatch.setattr(coordination, 'client', lambda: None)
  with pytest.raises(SystemExit) as e:
    exp._check_processes()  # pylint: disable=protected-access
  assert e.value.code == 2
  err, = capsys.readouterr().err.strip().splitlines()
  assert err.startswith('error: 2 processes but no jax.distributed coordination service: pass '
                        '--jax_fully_async_checkpoint=true')
  monkeypatch.setattr(jax, 'process_count', lambda: 1)
  exp._check_processes()  # one process: nothing to synchronise  # pylint: disable=protected-access


def test_the_tiny_experiments_numpy_input_yields_lm_cloud_s_synthetic_batches():
  """The tiny experiments train on what lm_cloud's Lingvo input (paxml's SyntheticLmData) yields, array
  for array (dtype and value), made without TensorFlow."""
  from paxml.tasks.lm.params import lm_cloud  # pylint: disable=g-import-not-at-top
  lm_cloud_autockpt = experiments.lm_cloud_autockpt
  ours, lingvo = (base_hyperparams.instantiate(datasets(lm_cloud_autockpt.LmCloudSpmdTinyAutockpt())[0])
                  for datasets in (lm_cloud_autockpt.LmCloudSpmdTiny.datasets, lm_cloud.SyntheticDataset.datasets))
  for _ in range(2):
    mine, theirs = ours.get_next_padded(), lingvo.get_next_padded()  # what Pax trains on
    assert sorted(mine) == sorted(theirs)
    for key in theirs:
      assert mine[key].dtype == theirs[key].dtype and np.array_equal(mine[key], theirs[key]), key
