"""integrity.problems over checkpoint directory layouts written by hand (zarr and OCDBT)."""

import json

from etils import epath
import pytest

from pax_autockpt.restore import integrity


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


def test_an_uncompressed_chunk_cut_short_is_named_with_its_size(tmp_path):
  """A raw (on-demand) save's chunks all have the chunk's full size, edge chunks included: a crash before the
  data reached the disk leaves a shorter file, which tensorstore only reports as a failed read."""
  step = epath.Path(tmp_path)
  array = step / 'state' / 'w'
  array.mkdir(parents=True)
  (array / '.zarray').write_text(json.dumps(dict(shape=[3, 6], chunks=[2, 6], dtype='<f4', compressor=None,
                                                 dimension_separator='.')))
  (array / '0.0').write_bytes(b'\0' * 48)
  (array / '1.0').write_bytes(b'\0' * 48)  # the edge chunk is stored whole
  assert integrity.problems(step) == []
  (array / '1.0').write_bytes(b'\0' * 16)
  assert integrity.problems(step) == ['w/1.0 is 16 bytes, an uncompressed chunk of it 48 (cut short)']
  bf16 = _zarr(step, 'b', shape=[4], chunks=[4], files=())
  (bf16 / '.zarray').write_text(json.dumps(dict(shape=[4], chunks=[4], dtype='bfloat16', compressor=None)))
  (bf16 / '0').write_bytes(b'\0' * 7)
  assert integrity.problems(step)[0] == 'b/0 is 7 bytes, an uncompressed chunk of it 8 (cut short)'
  # Compressed chunks have no fixed size: not judged here.
  (array / '.zarray').write_text(json.dumps(dict(shape=[3, 6], chunks=[2, 6], dtype='<f4',
                                                 compressor={'id': 'zstd'})))
  assert integrity.problems(step) == ['b/0 is 7 bytes, an uncompressed chunk of it 8 (cut short)']
