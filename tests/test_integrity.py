"""integrity.problems over checkpoint directory layouts written by hand (zarr and OCDBT)."""

import json

from etils import epath
import pytest

from pax_autockpt import integrity


def _zarr(step, name='w', shape=(4, 6), chunks=(2, 6), files=('0.0', '1.0')):
  array = step / 'state' / name
  array.mkdir(parents=True)
  (array / '.zarray').write_text(json.dumps(dict(shape=shape, chunks=chunks, dimension_separator='.')))
  for f in files:
    (array / f).write_bytes(b'x')
  return array


def _ocdbt(step, db=''):
  root = step / 'state' / db if db else step / 'state'
  (root / 'd').mkdir(parents=True, exist_ok=True)
  (root / 'manifest.ocdbt').write_bytes(b'm')
  (root / 'd' / 'abc').write_bytes(b'data')
  return root


def test_whole_zarr_and_ocdbt_checkpoints_have_no_problems(tmp_path):
  step = epath.Path(tmp_path)
  _zarr(step)
  _ocdbt(step)
  _ocdbt(step, 'ocdbt.process_0')
  assert integrity.problems(step) == []


def test_missing_state_and_missing_or_empty_zarr_chunks(tmp_path):
  step = epath.Path(tmp_path)
  assert integrity.problems(step) == [f'{step / "state"} is missing']
  array = _zarr(step, files=('0.0',))
  assert integrity.problems(step) == ['w/1.0 is missing']
  (array / '1.0').write_bytes(b'')
  assert integrity.problems(step) == ['w/1.0 is empty']
  (array / '.zarray').write_text('{not json')
  assert integrity.problems(step) == ['w/.zarray is damaged (JSONDecodeError)']


def test_ocdbt_missing_manifest_or_empty_data_file(tmp_path):
  step = epath.Path(tmp_path)
  db = _ocdbt(step, 'ocdbt.process_0')
  (db / 'manifest.ocdbt').unlink()
  (db / 'd' / 'abc').write_bytes(b'')
  assert integrity.problems(step) == ['ocdbt.process_0/manifest.ocdbt is missing or empty',
                                      'ocdbt.process_0/d/abc is empty']


def test_only_a_listing_that_succeeded_is_evidence(tmp_path, monkeypatch):
  """On gs://, is_dir()/exists() say False when the bucket refuses the request (403, 503): that must not
  read as "state is missing" (it set a good checkpoint aside); a failing listing raises instead."""
  step = epath.Path(tmp_path)
  _zarr(step)
  path_type = type(step)
  monkeypatch.setattr(path_type, 'is_dir', lambda self: False)  # what TF's gfile answers on any error
  assert integrity.problems(step) == []
  def refused(self):
    raise PermissionError(13, 'HTTP 403')
  monkeypatch.setattr(path_type, 'iterdir', refused)
  with pytest.raises(PermissionError):
    integrity.problems(step)


def test_a_committed_json_file_that_does_not_parse_is_named_with_its_size(tmp_path):
  step = tmp_path / 'checkpoint_00000004'
  (step / 'state').mkdir(parents=True)
  (step / 'metadata').mkdir()
  (step / 'state' / '_sharding').write_text('')  # an empty object where orbax wrote JSON
  (step / 'metadata' / 'metadata').write_text('{"version": 1.1}')
  assert integrity.problems(epath.Path(step)) == [
      'state/_sharding is not JSON (JSONDecodeError: Expecting value: line 1 column 1 (char 0), 0 bytes)']
  (step / 'state' / '_sharding').write_text('{}')
  (step / 'metadata' / 'metadata').write_text('{"vers')
  assert integrity.problems(epath.Path(step))[0].startswith('metadata/metadata is not JSON (JSONDecodeError: ')


def test_arrays_checked_side_by_side_report_in_name_order_up_to_the_limit(tmp_path, monkeypatch):
  """The arrays are read concurrently (storage round trips overlap), yet the reasons come in the
  arrays' name order, at most `limit`, and a listing refused inside one array still raises."""
  step = epath.Path(tmp_path)
  for name in ('z', 'x', 'v', 'y', 'w'):
    _zarr(step, name=name, files=('0.0',))
  assert integrity.problems(step) == ['v/1.0 is missing', 'w/1.0 is missing', 'x/1.0 is missing']
  assert len(integrity.problems(step, limit=10)) == 5
  listing = type(step).iterdir
  def refused_in_y(self):
    if self.name == 'y':
      raise PermissionError(13, 'HTTP 403')
    return listing(self)
  monkeypatch.setattr(type(step), 'iterdir', refused_in_y)
  with pytest.raises(PermissionError):
    integrity.problems(step, limit=10)
