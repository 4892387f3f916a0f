"""The local tier: its on-disk form (real files, real jax arrays on this machine's CPU devices), the plan
every host reaches from the hosts' reports (pure), and the listing a restart offers."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_autockpt import events as events_lib
from pax_autockpt import layout
from pax_autockpt import local_restore
from pax_autockpt import local_saves
from pax_autockpt import local_tier
from pax_autockpt import settings as settings_lib

HostReport, Plan = local_restore.HostReport, local_restore.Plan
P = jax.sharding.PartitionSpec


def _state():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ('data', 'mdl'))
  specs = {'w': P(None, 'mdl'), 'step': P(), 'neg_zero': P()}
  values = {'w': jnp.arange(12, dtype=jnp.bfloat16).reshape(3, 4), 'step': jnp.array(7, dtype=jnp.int32),
            'neg_zero': jnp.array([-0.0, 1.5], dtype=jnp.float32)}
  state = {k: jax.device_put(v, jax.sharding.NamedSharding(mesh, specs[k])) for k, v in values.items()}
  return mesh, state, specs


class _Input:
  def __init__(self, position):
    self.position = position

  def get_state(self):
    return json.dumps(self.position).encode()

  def set_state(self, state):
    self.position = json.loads(state)


def _save(folder, step, state, pipeline=None, hosts=1):
  snap = local_tier.capture(state, pipeline)
  partial, arrays = local_tier.write_part(folder, step, snap)
  return local_tier.commit(partial, local_tier.index(step, 0, hosts, local_tier.fingerprint_of(snap), arrays,
                                                     {0: snap.input_state}))


def test_a_saved_step_reads_back_bit_exact_on_the_same_mesh_with_its_input_position(tmp_path):
  mesh, state, specs = _state()
  _save(tmp_path, 12, state, _Input(12))
  shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  restore = local_restore.LocalRestore(tmp_path, host=0, hosts=1)
  pipeline = _Input(0)
  back = restore.load(12, shapes, mesh, specs, pipeline)
  for name, x in state.items():
    assert back[name].dtype == x.dtype and back[name].sharding == x.sharding
    assert np.asarray(back[name]).tobytes() == np.asarray(x).tobytes(), name  # -0.0 stays -0.0
  assert pipeline.position == 12
  # What a restart on this mesh needs is what this host saved: the fingerprints match.
  assert local_tier.fingerprint_for(shapes, mesh, specs) == local_tier.read_index(layout.local_step_dir(tmp_path, 12))[
      'fingerprint']


def test_a_flipped_byte_or_a_lost_index_is_damage_and_the_step_is_not_offered(tmp_path):
  _, state, _ = _state()
  for step in (10, 20, 30):
    _save(tmp_path, step, state)
  shards = layout.local_step_dir(tmp_path, 30) / layout.LOCAL_SHARDS
  data = bytearray(shards.read_bytes())
  data[3] ^= 1
  shards.write_bytes(bytes(data))
  (layout.local_step_dir(tmp_path, 20) / layout.LOCAL_INDEX).write_text('{"format": 1, "ha')
  with pytest.raises(local_tier.LocalDamage, match='does not match its digest'):
    path = layout.local_step_dir(tmp_path, 30)
    local_tier.read_shards(path, local_tier.read_index(path))
  assert list(local_restore.LocalRestore(tmp_path, host=0, hosts=1).usable_steps(needs_input=False)) == [10]
  assert layout.local_step_dir(tmp_path, 30).exists()  # left where it is: never deleted on a restart


def test_a_half_written_step_is_never_listed_and_the_next_commit_removes_older_leftovers(tmp_path):
  _, state, _ = _state()
  _save(tmp_path, 10, state)
  snap = local_tier.capture(state)
  local_tier.write_part(tmp_path, 40, snap)  # killed before the commit
  assert layout.local_committed_steps(tmp_path) == [10]
  assert [(s, p.name) for s, p in layout.local_partials(tmp_path)] == [(40, 'step_00000040.partial')]
  assert list(local_restore.LocalRestore(tmp_path, host=0, hosts=1).usable_steps(needs_input=False)) == [10]
  # Continuous local saves (one host), keep 2: the newest two stay, the older leftover goes with them.
  saves = local_saves.LocalSaves(tmp_path, min_interval_secs=0, keep=2, events=events_lib.EventLog(tmp_path / 'job', 0))
  for step in (50, 60, 70):
    saves.maybe_save(step, state, _Input(step))
    saves._thread.join()  # pylint: disable=protected-access
  assert layout.local_committed_steps(tmp_path) == [60, 70] and layout.local_partials(tmp_path) == []
  assert [e['step'] for e in events_lib.read(tmp_path / 'job') if e['event'] == 'local_committed'] == [50, 60, 70]
  index = local_tier.read_index(layout.local_step_dir(tmp_path, 70))
  assert local_tier.input_state(index, 0) == b'70' and index['hosts'] == 1


def test_steps_without_every_hosts_input_position_or_for_another_number_of_hosts_are_not_offered(tmp_path):
  _, state, _ = _state()
  _save(tmp_path, 10, state)  # no input position
  _save(tmp_path, 20, state, _Input(20), hosts=2)
  listing = local_restore.LocalRestore(tmp_path, host=0, hosts=1)
  assert list(listing.usable_steps(needs_input=False)) == [10]
  assert list(listing.usable_steps(needs_input=True)) == []


def test_the_plan_takes_the_newest_step_every_host_can_restore_from_its_own_copy_or_a_replicas():
  reports = {0: HostReport('A', {100: 'A', 200: 'A'}), 1: HostReport('A', {100: 'A'})}
  assert local_restore.choose(reports, 2, bucket_step=50) == Plan(200, {0: 0, 1: 0})  # host 1 from host 0
  assert local_restore.choose(reports, 2, bucket_step=None) == Plan(200, {0: 0, 1: 0})
  # A replaced VM (empty disk) is filled by a replica; a host holding other shards cannot fill it.
  replaced = {0: HostReport('A', {200: 'A'}), 1: HostReport('A', {})}
  assert local_restore.choose(replaced, 2, None).filled == {1: 0}
  sharded = {0: HostReport('A', {200: 'A'}), 1: HostReport('B', {})}
  assert local_restore.choose(sharded, 2, None) is None
  # 2 slices of 2: hosts 0/2 and 1/3 are replicas; each missing host takes its own replica's copy.
  slices = {0: HostReport('A', {300: 'A'}), 1: HostReport('B', {}), 2: HostReport('A', {}),
            3: HostReport('B', {300: 'B'})}
  assert local_restore.choose(slices, 4, 100) == Plan(300, {0: 0, 1: 3, 2: 0, 3: 3})


def test_the_bucket_wins_when_it_is_newer_or_a_host_did_not_report():
  reports = {0: HostReport('A', {100: 'A'}), 1: HostReport('A', {100: 'A'})}
  assert local_restore.choose(reports, 2, bucket_step=150) is None
  assert local_restore.choose(reports, 2, bucket_step=100) == Plan(100, {0: 0, 1: 1})  # as new: the faster read
  assert local_restore.choose({0: reports[0]}, 2, bucket_step=None) is None
  # A config slip changes what every host needs: no local step fits, the bucket's restore judges the run.
  assert local_restore.choose({0: HostReport('C', {100: 'A'}), 1: HostReport('C', {100: 'A'})}, 2, None) is None


def test_reports_travel_as_text():
  report = HostReport('A', {100: 'A', 7: 'B'})
  assert HostReport.decode(report.encode()) == report


@pytest.mark.parametrize('value, fix', [
    ('gs://bucket/local', "use a path on the host's own disk"),
    (3, "use a path on the host's own disk"),
])
def test_local_dir_must_be_a_local_path(value, fix):
  assert fix in settings_lib.FIELDS['local_dir'].metadata['rule'](value)
  assert settings_lib.FIELDS['local_dir'].metadata['rule']('/dev/shm/autockpt-{host}') is None
  assert settings_lib.FIELDS['local_keep'].metadata['rule'](0) == 'use an integer N >= 1'
  assert layout.local_dir('/dev/shm/a-{host}', 3) == layout.local_dir('/dev/shm/a-3', 0)
