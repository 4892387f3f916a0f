"""Reading a checkpoint's content manifest: absence decided only by a listing that succeeded (real local
disk, and the local GCS refusing requests), and a host's file that is gone is damage."""

import json

from etils import epath
import pytest

from pax_autockpt import layout
from pax_autockpt import manifest as manifest_lib


def _write(step, host, hosts=2, arrays=None):
  part = {'format': manifest_lib.FORMAT, 'hash': manifest_lib.HASH, 'host': host, 'hosts': hosts,
          'arrays': arrays or {f'a{host}': {'0:4': 'abcd'}}}
  manifest_lib.write(step, part)


def test_every_hosts_file_is_merged_and_one_that_is_gone_is_damage(tmp_path):
  step = epath.Path(tmp_path) / 'checkpoint_00000010'
  (step / 'state').mkdir(parents=True)
  assert manifest_lib.read(step) is None  # saved before checksums, or by stock paxml
  _write(step, 0)
  _write(step, 1)
  assert manifest_lib.read(step) == {'a0': {'0:4': 'abcd'}, 'a1': {'0:4': 'abcd'}}
  layout.manifest_path(step, 1).unlink()
  with pytest.raises(manifest_lib.ManifestError, match=r'host1.json is missing \(the save had 2 hosts\)'):
    manifest_lib.read(step)
  # A manifest written before files named their number of hosts: what is there is read.
  part = json.loads(layout.manifest_path(step, 0).read_text())
  del part['hosts']
  layout.manifest_path(step, 0).write_text(json.dumps(part))
  assert manifest_lib.read(step) == {'a0': {'0:4': 'abcd'}}


def test_a_storage_that_refuses_to_answer_is_not_a_missing_manifest(gcs):
  step = epath.Path(gcs.url('manifest/checkpoints/checkpoint_00000042'))
  (step / 'state' / 'x').write_text('x')
  _write(step, 0, hosts=1)
  assert manifest_lib.read(step) == {'a0': {'0:4': 'abcd'}}
  gcs.set_faults(fail_fraction=1.0, status=403, path_contains='checkpoint_00000042/')
  try:
    with pytest.raises(Exception) as raised:
      manifest_lib.read(step)
    assert not isinstance(raised.value, manifest_lib.ManifestError), raised.value
    assert not layout.manifest_dir(step).is_dir()  # what the old check asked: "absent", a wrong answer
  finally:
    gcs.set_faults()
  assert manifest_lib.read(step) == {'a0': {'0:4': 'abcd'}}
