"""Array chunks written with or without zstd (the `compression` setting), and read back alike."""

import json

from etils import epath
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from pax_autockpt.shared import internals


def _state():
  rng = np.random.default_rng(0)
  return {'w': jax.device_put(rng.standard_normal((64, 32)).astype(np.float32)),
          'b': jax.device_put(np.zeros((32,), np.float32))}


def _save(path: epath.Path, state, *, uncompressed: bool, ocdbt: bool = False):
  with internals.uncompressed_chunks(uncompressed):
    ocp.PyTreeCheckpointer(use_ocdbt=ocdbt).save(path, state)


def test_uncompressed_chunks_change_only_the_compressor_and_only_within():
  from orbax.checkpoint import type_handlers  # pylint: disable=g-import-not-at-top
  build = lambda zarr3: type_handlers._build_ts_zarr_shard_and_chunk_metadata(  # pylint: disable=protected-access
      (8,), (8,), zarr3, np.dtype('float32'))
  with internals.uncompressed_chunks():
    raw2, raw3 = build(False), build(True)
  assert build(False)['compressor'] == {'id': 'zstd'} and raw2['compressor'] is None
  codecs = lambda m: [c['name'] for c in m['codecs'][0]['configuration']['codecs']]
  assert codecs(build(True)) == ['bytes', 'zstd'] and codecs(raw3) == ['bytes']


@pytest.mark.parametrize('ocdbt', [False, True], ids=['zarr', 'ocdbt'])
def test_either_kind_restores_to_the_same_arrays(tmp_path, ocdbt):
  state = _state()
  for uncompressed in (False, True):
    path = epath.Path(tmp_path / f'raw{uncompressed}')
    _save(path, state, uncompressed=uncompressed, ocdbt=ocdbt)
    restored = ocp.PyTreeCheckpointer().restore(path)
    for name, array in state.items():
      np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(array))
    if not ocdbt:  # zarr: each array's .zarray says how its chunks were written
      compressor = json.loads((path / 'w' / '.zarray').read_text())['compressor']
      assert compressor == (None if uncompressed else {'id': 'zstd', 'level': 1})


def test_a_raw_float_chunk_is_its_bytes(tmp_path):
  """zstd gains little on float weights: the raw chunk is exactly the array's bytes."""
  state = _state()
  _save(epath.Path(tmp_path / 'raw'), state, uncompressed=True)
  _save(epath.Path(tmp_path / 'zstd'), state, uncompressed=False)
  raw = (tmp_path / 'raw' / 'w' / '0.0').read_bytes()
  assert raw == np.asarray(state['w']).tobytes()
  assert 0.85 * len(raw) < len((tmp_path / 'zstd' / 'w' / '0.0').read_bytes()) < len(raw)
