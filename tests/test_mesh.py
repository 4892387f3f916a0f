"""Process-group slices for multislice meshes on devices without a TPU slice_index (e.g. GPU)."""

import dataclasses

from jax.experimental import mesh_utils
import numpy as np
import pytest

from pax_autockpt.hosts import mesh


@dataclasses.dataclass(frozen=True)
class FakeGpu:
  id: int
  process_index: int


def _devices(num_processes, per_process):
  # Deliberately unordered, as jax.devices() may be.
  devs = [FakeGpu(p * per_process + i, p) for p in range(num_processes) for i in range(per_process)]
  return list(reversed(devs))


def test_two_hosts_one_device_each_are_two_slices():
  grid = mesh.process_group_mesh([1, 1, 1], [2, 1, 1], _devices(2, 1))
  assert grid.shape == (2, 1, 1)
  assert [d.process_index for d in grid.ravel()] == [0, 1]


def test_four_hosts_as_two_slices_keep_each_slice_on_its_own_processes():
  grid = mesh.process_group_mesh([1, 2, 1], [2, 1, 1], _devices(4, 1))
  assert grid.shape == (2, 2, 1)
  assert [[d.process_index for d in row] for row in grid[:, :, 0]] == [[0, 1], [2, 3]]


def test_two_hosts_with_four_gpus_each_2b_multislice_layout():
  grid = mesh.process_group_mesh([1, 4, 1], [2, 1, 1], _devices(2, 4))
  assert grid.shape == (2, 4, 1)
  for s in range(2):
    assert {d.process_index for d in grid[s].ravel()} == {s}


def test_dcn_on_another_axis_tiles_there():
  grid = mesh.process_group_mesh([2, 1, 1], [1, 2, 1], _devices(2, 2))
  assert grid.shape == (2, 2, 1)
  assert [d.process_index for d in grid[:, 0, 0]] == [0, 0]
  assert [d.process_index for d in grid[:, 1, 0]] == [1, 1]


def test_wrong_device_count_is_reported():
  with pytest.raises(ValueError, match='needs 8 devices, found 4'):
    mesh.process_group_mesh([1, 4, 1], [2, 1, 1], _devices(4, 1))


def test_hook_routes_only_devices_without_slice_index(monkeypatch):
  monkeypatch.setattr(mesh_utils, 'create_hybrid_device_mesh', mesh._original)
  mesh.use_process_group_slices()
  grid = mesh_utils.create_hybrid_device_mesh([1, 1, 1], [2, 1, 1], devices=_devices(2, 1))
  assert isinstance(grid, np.ndarray) and grid.shape == (2, 1, 1)
