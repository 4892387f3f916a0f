"""Reading a checkpoint's content manifest: absence decided only by a listing that succeeded (real local
disk, and the local GCS refusing requests), and a host's file that is gone is damage."""

import json

from etils import epath
from jax import numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt.shared import manifest as manifest_lib
from tests import fakes


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
    # TF's listing raises NotFoundError when its request fails (403 here): the storage's error, not a ManifestError
    with pytest.raises(tf.errors.NotFoundError):
      manifest_lib.read(step)
    assert not layout.manifest_dir(step).is_dir()  # what the old check asked: "absent", a wrong answer
  finally:
    gcs.set_faults()
  assert manifest_lib.read(step) == {'a0': {'0:4': 'abcd'}}


def test_a_manifest_that_lists_no_array_is_damage_not_verified(tmp_path):
  """An emptied `autockpt_manifest/`, or host files whose `arrays` are all `{}`, prove nothing: a save lists
  every array it wrote, so such a manifest lost its content after the commit (as a missing host file)."""
  step = epath.Path(tmp_path) / 'checkpoint_00000010'
  layout.manifest_dir(step).mkdir(parents=True)
  with pytest.raises(manifest_lib.ManifestError, match=r'lists no array shard \(\d host files\)'):
    manifest_lib.read(step)
  _write(step, 0, hosts=2, arrays={'a': {}})
  layout.manifest_path(step, 1).write_text(layout.manifest_path(step, 0).read_text().replace('"host": 0', '"host": 1'))
  with pytest.raises(manifest_lib.ManifestError, match=r'lists no array shard \(\d host files\)'):
    manifest_lib.read(step)
  _write(step, 1, hosts=2)  # one host wrote every array, the other none (all its shards were replicas): fine
  assert manifest_lib.read(step) == {'a': {}, 'a1': {'0:4': 'abcd'}}


def test_a_restored_array_the_manifest_does_not_list_is_a_problem():
  """The restored checkpoint's arrays must all be in its manifest, else a shard was never checked."""
  array = jnp.arange(4, dtype=jnp.float32)
  expected = {'w': {'0:4': manifest_lib.digest(np.asarray(array))}}
  assert manifest_lib.compare([('w', array)], expected) == ([], 1)
  problems, checked = manifest_lib.compare([('w', array), ('m', array)], expected)
  assert checked == 1 and problems == ['m is not in the manifest (a save lists every array it wrote)']


@pytest.mark.usefixtures('clean_signals')
@pytest.mark.parametrize('emptied', ['folder', 'arrays'])
def test_a_checkpoint_whose_manifest_lists_nothing_is_set_aside_not_verified(tmp_path, caplog, emptied):
  caplog.set_level('INFO')
  job = tmp_path / 'job'
  ckpt, _ = fakes.wrap(job, settings_lib.Settings(notices='off'), interval=10)
  for step in (10, 20):
    ckpt.save_if_needed(step, fakes.STATE)
  ckpt.wait_until_finished()
  newest = layout.manifest_path(layout.step_dir(layout.checkpoint_dir(job), 20), 0)
  if emptied == 'folder':
    newest.unlink()
  else:
    newest.write_text(json.dumps({**json.loads(newest.read_text()), 'arrays': {}}))
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(notices='off'), interval=10)
  assert ckpt.get_model_states(None, None, None)[2] == 10 and fake.restored == [20, 10]
  skipped, = fakes.events(job, 'restore_skipped')
  assert skipped['step'] == 20 and 'manifest: autockpt_manifest/ lists no array shard' in skipped['error'], skipped
  assert '0 shards of 3 arrays checked' not in caplog.text
