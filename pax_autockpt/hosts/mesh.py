"""Multislice device meshes where devices carry no TPU `slice_index`: slices are process groups.

praxis lays out a DCN x ICI mesh with jax's `create_hybrid_device_mesh`, which groups devices into
slices by TPU `slice_index`; GPU devices have none and it fails. Here consecutive processes form a
slice (hosts_per_slice = process_count / prod(dcn)), which is how `pax-autockpt launch` and the usual
GPU multi-node launchers number hosts. On TPU, and on CPU (praxis reshapes itself), nothing changes.
"""

import functools
import math
from typing import Any, Sequence

from absl import logging
from jax.experimental import mesh_utils
import numpy as np

_original = mesh_utils.create_hybrid_device_mesh


def process_group_mesh(ici_mesh_shape: Sequence[int], dcn_mesh_shape: Sequence[int],
                       devices: Sequence[Any]) -> np.ndarray:
  """ICI meshes of consecutive process groups, tiled over the DCN axes (DCN outer, as jax does)."""
  devices = sorted(devices, key=lambda d: (d.process_index, d.id))
  num_slices = math.prod(dcn_mesh_shape)
  per_slice = math.prod(ici_mesh_shape)
  if num_slices * per_slice != len(devices):
    raise ValueError(f'ICI {list(ici_mesh_shape)} x DCN {list(dcn_mesh_shape)} needs '
                     f'{num_slices * per_slice} devices, found {len(devices)}')
  slices = [np.array(devices[i * per_slice:(i + 1) * per_slice], dtype=object).reshape(ici_mesh_shape)
            for i in range(num_slices)]
  tiles = np.empty(num_slices, dtype=object)
  tiles[:] = slices
  return np.block(tiles.reshape(dcn_mesh_shape).tolist())


@functools.wraps(_original)
def _hybrid_mesh(mesh_shape, dcn_mesh_shape, devices=None, **kwargs):
  if devices is not None and not hasattr(devices[0], 'slice_index'):
    logging.info('[autockpt] multislice mesh %s x %s: slices are process groups (devices have no slice_index)',
                 list(mesh_shape), list(dcn_mesh_shape))
    return process_group_mesh(mesh_shape, dcn_mesh_shape, devices)
  return _original(mesh_shape, dcn_mesh_shape, devices=devices, **kwargs)


def use_process_group_slices() -> None:
  """Makes praxis' multislice mesh fall back to process groups when devices have no slice_index."""
  if mesh_utils.create_hybrid_device_mesh is not _hybrid_mesh:
    mesh_utils.create_hybrid_device_mesh = _hybrid_mesh
