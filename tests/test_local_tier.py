"""The local tier: its on-disk form (real files, real jax arrays on this machine's CPU devices), the plan
every host reaches from the hosts' reports (pure), and the listing a restart offers."""

import json
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt.hosts import agreement
from pax_autockpt.hosts import hosts
from pax_autockpt.local import format as local_format
from pax_autockpt.local import lineage as lineage_lib
from pax_autockpt.local import restoring
from pax_autockpt.local import saving
from pax_autockpt.restore import restore as restore_lib
from pax_autockpt.shared import events as events_lib
from tests import fakes

HostReport, Plan = restoring.HostReport, restoring.Plan
JOB = restoring.JobState('job-a', committed=[], set_aside=[])  # a job directory with no checkpoint yet
LINEAGE = lineage_lib.Lineage('job-a', 'run-1', base=None)
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


def _save(folder, step, state, pipeline=None, hosts=1, lineage=LINEAGE):
  snap = local_format.capture(state, pipeline)
  partial, arrays = local_format.write_part(folder, step, snap)
  return local_format.commit(partial, local_format.index(step, 0, hosts, local_format.fingerprint_of(snap), arrays,
                                                         {0: snap.input_state}, None, lineage))


def test_a_saved_step_reads_back_bit_exact_on_the_same_mesh_with_its_input_position(tmp_path):
  mesh, state, specs = _state()
  _save(tmp_path, 12, state, _Input(12))
  shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  restore = restoring.LocalRestore(tmp_path, host=0, hosts=1)
  back, position = restore.load(12, shapes, mesh, specs)
  for name, x in state.items():
    assert back[name].dtype == x.dtype and back[name].sharding == x.sharding
    assert np.asarray(back[name]).tobytes() == np.asarray(x).tobytes(), name  # -0.0 stays -0.0
  assert json.loads(position) == 12  # set by the restore once every host read its part
  # What a restart on this mesh needs is what this host saved: the fingerprints match.
  saved = local_format.read_index(layout.local_step_dir(tmp_path, 12))['fingerprint']
  assert local_format.fingerprint_for(shapes, mesh, specs) == saved


def test_a_flipped_byte_or_a_lost_index_is_damage_and_the_step_is_not_offered(tmp_path):
  _, state, _ = _state()
  for step in (10, 20, 30):
    _save(tmp_path, step, state)
  shards = layout.local_step_dir(tmp_path, 30) / layout.LOCAL_SHARDS
  data = bytearray(shards.read_bytes())
  data[3] ^= 1
  shards.write_bytes(bytes(data))
  (layout.local_step_dir(tmp_path, 20) / layout.LOCAL_INDEX).write_text('{"format": 1, "ha')
  with pytest.raises(local_format.LocalDamage, match='does not match its digest'):
    path = layout.local_step_dir(tmp_path, 30)
    local_format.read_shards(path, local_format.read_index(path))
  assert list(restoring.LocalRestore(tmp_path, host=0, hosts=1).usable_steps(needs_input=False, job=JOB)) == [10]
  assert layout.local_step_dir(tmp_path, 30).exists()  # left where it is: never deleted on a restart


def test_a_step_copied_under_another_steps_name_is_not_that_step(tmp_path, caplog):
  """A copy of step_00000100 named step_00000200 holds step 100's state (its index says so): offered as 200,
  the run would resume step 100's weights counted as step 200."""
  mesh, state, specs = _state()
  _save(tmp_path, 100, state)
  shutil.copytree(layout.local_step_dir(tmp_path, 100), layout.local_step_dir(tmp_path, 200))
  restore = restoring.LocalRestore(tmp_path, host=0, hosts=1)
  assert list(restore.usable_steps(needs_input=False, job=JOB)) == [100]
  refused = [r.getMessage() for r in caplog.records if 'local step 200 is not offered' in r.getMessage()]
  assert len(refused) == 1, refused
  assert "step_00000200: its index is step 100's (a copy under another step's name)" in refused[0]
  shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  with pytest.raises(local_format.LocalDamage, match="its index is step 100's"):
    restore.load(200, shapes, mesh, specs)
  assert layout.local_step_dir(tmp_path, 200).exists()  # left where it is


def test_a_half_written_step_is_never_listed_and_the_next_commit_removes_older_leftovers(tmp_path):
  _, state, _ = _state()
  _save(tmp_path, 10, state)
  snap = local_format.capture(state)
  local_format.write_part(tmp_path, 40, snap)  # killed before the commit
  assert layout.local_committed_steps(tmp_path) == [10]
  assert [(s, p.name) for s, p in layout.local_partials(tmp_path)] == [(40, 'step_00000040.partial')]
  assert list(restoring.LocalRestore(tmp_path, host=0, hosts=1).usable_steps(needs_input=False, job=JOB)) == [10]
  # Continuous local saves (one host), keep 2: the newest two stay, the older leftover goes with them.
  saves = saving.LocalSaves(tmp_path, min_interval_secs=0, keep=2, events=events_lib.EventLog(tmp_path / 'job', 0),
                            lineage=lineage_lib.Tracker('job-a', 'run-2'))
  for step in (50, 60, 70):
    saves.maybe_save(step, state, _Input(step))
    saves._thread.join()  # pylint: disable=protected-access
  saves.wait()  # the end of training: the commits since the run's first are summed up
  assert layout.local_committed_steps(tmp_path) == [60, 70] and layout.local_partials(tmp_path) == []
  events = [e for e in events_lib.read(tmp_path / 'job') if e['event'] == 'local_committed']
  assert [(e['step'], e['commits']) for e in events] == [(50, 1), (70, 2)]
  index = local_format.read_index(layout.local_step_dir(tmp_path, 70))
  assert local_format.input_state(index, 0) == b'70' and index['hosts'] == 1


def test_steps_without_every_hosts_input_position_or_for_another_number_of_hosts_are_not_offered(tmp_path):
  _, state, _ = _state()
  _save(tmp_path, 10, state)  # no input position
  _save(tmp_path, 20, state, _Input(20), hosts=2)
  listing = restoring.LocalRestore(tmp_path, host=0, hosts=1)
  assert list(listing.usable_steps(needs_input=False, job=JOB)) == [10]
  assert list(listing.usable_steps(needs_input=True, job=JOB)) == []


def test_the_plan_takes_the_newest_step_every_host_can_restore_from_its_own_copy_or_a_replicas():
  reports = {0: HostReport('A', {100: ('A', 'j/r'), 200: ('A', 'j/r')}), 1: HostReport('A', {100: ('A', 'j/r')})}
  from_0 = Plan(200, {0: 0, 1: 0}, {1: ((0, False),)})  # host 1 from host 0
  assert restoring.choose(reports, 2, job_dir_step=50) == from_0
  assert restoring.choose(reports, 2, job_dir_step=None) == from_0
  # A replaced VM (empty disk) is filled by a replica; a host holding other shards cannot fill it.
  replaced = {0: HostReport('A', {200: ('A', 'j/r')}), 1: HostReport('A', {})}
  assert restoring.choose(replaced, 2, None).filled == {1: 0}
  sharded = {0: HostReport('A', {200: ('A', 'j/r')}), 1: HostReport('B', {})}
  assert restoring.choose(sharded, 2, None) is None
  # 2 slices of 2: hosts 0/2 and 1/3 are replicas; each missing host takes its own replica's copy.
  slices = {0: HostReport('A', {300: ('A', 'j/r')}), 1: HostReport('B', {}), 2: HostReport('A', {}),
            3: HostReport('B', {300: ('B', 'j/r')})}
  assert restoring.choose(slices, 4, 100) == Plan(300, {0: 0, 1: 3, 2: 0, 3: 3},
                                                  {1: ((3, False),), 2: ((0, False),)})


def test_a_host_without_a_replica_restores_the_buddy_copy_a_peer_keeps_for_it_after_any_replicas():
  # One slice, no replica: host 1's disk was replaced; host 0 keeps host 1's newest step (buddy copies).
  reports = {0: HostReport('A', {300: ('A', 'j/r')}, buddy={300: ('B', 'j/r')}), 1: HostReport('B', {})}
  plan = restoring.choose(reports, 2, 200)
  assert plan == Plan(300, {0: 0, 1: 0}, {1: ((0, True),)}) and plan.from_buddy == {1}
  # A buddy copy of another save (another lineage), or of other shards, is no source.
  other = {0: HostReport('A', {300: ('A', 'j/r')}, buddy={300: ('B', 'j/other')}), 1: HostReport('B', {})}
  assert restoring.choose(other, 2, None) is None
  # 2 slices of 2 with replicas and buddies: a replica's own copy first, then a buddy copy; a host never its own
  # buddy. Both are listed, so that a donor that dies mid-transfer sends the receiver to the next.
  both = {0: HostReport('A', {300: ('A', 'j/r')}, buddy={300: ('B', 'j/r')}), 1: HostReport('B', {}),
          2: HostReport('A', {300: ('A', 'j/r')}), 3: HostReport('B', {300: ('B', 'j/r')}, buddy={300: ('A', 'j/r')})}
  plan = restoring.choose(both, 4, None)
  assert plan.sources == {1: ((3, False), (0, True))} and plan.from_buddy == set()
  # A host that holds both a replica's copy and a buddy copy of the same shards is listed once.
  both[3] = HostReport('B', {300: ('B', 'j/r')}, buddy={300: ('B', 'j/r')})
  assert restoring.choose(both, 4, None).sources == {1: ((3, False), (0, True))}
  # A step only some buddy copies hold is still a candidate when every host can be served.
  lost = {0: HostReport('A', {}, buddy={300: ('B', 'j/r')}), 1: HostReport('B', {300: ('B', 'j/r')},
                                                                          buddy={300: ('A', 'j/r')})}
  assert restoring.choose(lost, 2, None) == Plan(300, {0: 1, 1: 1}, {0: ((1, True),)})


def test_the_job_directory_wins_when_it_is_newer_or_a_host_did_not_report():
  reports = {0: HostReport('A', {100: ('A', 'j/r')}), 1: HostReport('A', {100: ('A', 'j/r')})}
  assert restoring.choose(reports, 2, job_dir_step=150) is None
  assert restoring.choose(reports, 2, job_dir_step=100) == Plan(100, {0: 0, 1: 1})  # as new: the faster read
  assert restoring.choose({0: reports[0]}, 2, job_dir_step=None) is None
  # A config slip changes what every host needs: no local step fits, the job directory's restore judges the run.
  slipped = HostReport('C', {100: ('A', 'j/r')})
  assert restoring.choose({0: slipped, 1: slipped}, 2, None) is None


def test_reports_travel_as_text():
  report = HostReport('A', {100: ('A', 'j/r'), 7: ('B', 'j/r')}, 5, buddy={100: ('C', 'j/r')})
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


def test_every_byte_of_the_index_is_checked_a_changed_input_position_or_field_is_damage_not_a_crash(tmp_path):
  _, state, _ = _state()
  for step in (10, 20, 30):
    _save(tmp_path, step, state, _Input(step * 1000))
  index_of = {s: layout.local_step_dir(tmp_path, s) / layout.LOCAL_INDEX for s in (20, 30)}
  found = json.loads(index_of[30].read_text())
  found['inputs']['0'] = found['inputs']['0'].replace('M', 'N', 1)  # a flipped bit in the input position
  index_of[30].write_text(json.dumps(found))
  found = json.loads(index_of[20].read_text())
  del found['arrays'][next(iter(found['arrays']))]['shards']  # a missing field, digest made to match
  body = {k: v for k, v in found.items() if k != 'digest'}
  index_of[20].write_text(json.dumps({**body, 'digest': local_format._digest(body)}))  # pylint: disable=protected-access
  with pytest.raises(local_format.LocalDamage, match='does not match its digest'):
    local_format.read_index(layout.local_step_dir(tmp_path, 30))
  with pytest.raises(local_format.LocalDamage, match='KeyError'):
    path = layout.local_step_dir(tmp_path, 20)
    local_format.read_shards(path, local_format.read_index(path))
  assert list(restoring.LocalRestore(tmp_path, host=0, hosts=1).usable_steps(needs_input=True, job=JOB)) == [10]


def test_steps_of_another_job_or_a_rolled_back_lineage_are_named_and_left_where_they_are(tmp_path, caplog):
  _, state, _ = _state()
  _save(tmp_path, 500, state, lineage=lineage_lib.Lineage('job-a', 'r1', base=300))
  _save(tmp_path, 623, state, lineage=lineage_lib.Lineage('job-a', 'r1', base=600))
  _save(tmp_path, 700, state, lineage=lineage_lib.Lineage('job-b', 'r9', base=None))
  job = restoring.JobState('job-a', committed=[0, 300], set_aside=[])
  assert list(restoring.LocalRestore(tmp_path, host=0, hosts=1).usable_steps(False, job)) == [500]
  assert 'local step 700 is not offered for the restore: written by another job' in caplog.text
  assert 'local step 623 is not offered for the restore: it grew from checkpoint 600' in caplog.text
  assert layout.local_committed_steps(tmp_path) == [500, 623, 700]


def test_a_step_is_restored_only_from_copies_of_one_save():
  # The model split over 2 hosts; host 1's half of 200 is another run's (a commit a kill cut short): the
  # halves do not make one state, so 200 is not planned, 100 is.
  reports = {0: HostReport('A', {100: ('A', 'j/r1'), 200: ('A', 'j/r2')}),
             1: HostReport('B', {100: ('B', 'j/r1'), 200: ('B', 'j/r1')})}
  assert restoring.choose(reports, 2, None) == Plan(100, {0: 0, 1: 1})
  # Replicas: either save's copies make a whole state; the first token's serves every host.
  reports = {0: HostReport('A', {200: ('A', 'j/r2')}), 1: HostReport('A', {200: ('A', 'j/r1')})}
  assert restoring.choose(reports, 2, None) == Plan(200, {0: 1, 1: 1}, {0: ((1, False),)})


def _hosts_plan(restores, jobs, needs):
  """Each host's plan from its own job state, the hosts' reports exchanged as the coordination service would
  (threads as hosts, `agreement.reports` met at a barrier)."""
  barrier, found, plans = threading.Barrier(len(restores)), {}, {}

  def reports(key, host, report):
    del key
    found[host] = report
    barrier.wait(30)
    return dict(found)

  def run(host):
    plans[host] = restores[host].plan(needs, jobs[host], needs_input=False)

  with mock.patch.object(restoring.agreement, 'reports', reports):
    threads = [threading.Thread(target=run, args=(h,)) for h in range(len(restores))]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join(60)
  return plans


def test_a_step_refused_on_one_host_is_refused_on_every_host(tmp_path, caplog):
  """Why 4: two data-parallel replicas hold local step 2400, grown from 1000 while the save of 2000 was in
  flight. Host 0's event log records that 2000 committed (it was then deleted: a rollback); host 1's lost the
  event. Host 0 refuses 2400: no host restores it (not host 0 filled from host 1's copy)."""
  _, state, _ = _state()
  grown = lineage_lib.Lineage('job-a', 'run-1', base=1000, started=(2000,))
  for host in (0, 1):
    step_dir = _save(tmp_path / f'local-{host}', 2400, state, hosts=2, lineage=grown)
  needs = local_format.read_index(step_dir)['fingerprint']
  restores = [restoring.LocalRestore(tmp_path / f'local-{h}', host=h, hosts=2) for h in (0, 1)]
  jobs = [restoring.JobState('job-a', [1000], [], ever_committed=frozenset(seen)) for seen in ({1000, 2000},
                                                                                               {1000})]
  assert _hosts_plan(restores, jobs, needs) == {0: None, 1: None}
  assert 'local step 2400 is not offered for the restore: host 0 refused it' in caplog.text
  # Neither host refusing, host 0's copy gone: host 0 restores 2400 from host 1's.
  shutil.rmtree(tmp_path / 'local-0')
  plans = _hosts_plan(restores, [jobs[1], jobs[1]], needs)
  assert plans[0] == plans[1] == Plan(2400, {0: 1, 1: 1}, {0: ((1, False),)})
  report = HostReport('A', {}, refused=((2400, 'job-a/run-1'),))
  assert HostReport.decode(report.encode()) == report


def test_a_retrained_checkpoint_number_neither_keeps_nor_restores_the_rolled_back_local_step(tmp_path):
  """Why 1: run 1 (buddy copies on) left local step 2400 grown from checkpoint 2000 and the neighbour's 2400
  in buddy/; 2000 was deleted and run 2 (no buddy copies) retrained it. Run 2's first local commit removes
  its own 2400 (the buddy copy is another run's), and a restart refuses 2400 even where it is left."""
  _, state, _ = _state()
  grown = lineage_lib.Lineage('job-a', 'run-1', base=2000, base_id='run-1-2000')
  _save(tmp_path / 'left', 2400, state, lineage=grown)
  _save(tmp_path, 2400, state, lineage=grown)
  _save(layout.local_buddy_dir(tmp_path), 2400, state, lineage=grown)
  saves = saving.LocalSaves(tmp_path, min_interval_secs=0, keep=1, events=events_lib.EventLog(tmp_path / 'job', 0),
                            lineage=lineage_lib.Tracker('job-a', 'run-2'))
  saves.maybe_save(2100, state)
  saves._thread.join()  # pylint: disable=protected-access
  assert layout.local_committed_steps(tmp_path) == [2100]
  job = restoring.JobState('job-a', [1000, 2000], [], frozenset({1000, 2000}),
                           {1000: ('run-0-1000',), 2000: ('run-1-2000', 'run-2-2000')})
  assert restoring.LocalRestore(tmp_path / 'left', host=0, hosts=1).usable_steps(False, job) == {}


def test_local_saves_keep_this_runs_newest_and_remove_every_other_step(tmp_path):
  _, state, _ = _state()
  _save(tmp_path, 900, state, lineage=lineage_lib.Lineage('job-b', 'r9', base=None))  # another job's, newer
  saves = saving.LocalSaves(tmp_path, min_interval_secs=0, keep=2, events=events_lib.EventLog(tmp_path / 'job', 0),
                            lineage=lineage_lib.Tracker('job-a', 'r2'))
  for step in (50, 60, 70):
    saves.maybe_save(step, state)
    saves._thread.join()  # pylint: disable=protected-access
    assert 900 in layout.local_committed_steps(tmp_path)  # another job's progress: never this job's to delete
  assert layout.local_committed_steps(tmp_path) == [60, 70, 900]
  assert local_format.lineage_of(local_format.read_index(layout.local_step_dir(tmp_path, 70))).token == 'job-a/r2'
  # A buddy copy of the neighbour's step 70 (of this run) that lags behind: this host's own step 70 stays with it
  # (the two halves of one state), beyond the newest 2.
  _save(layout.local_buddy_dir(tmp_path), 70, state, lineage=lineage_lib.Lineage('job-a', 'r2', base=None))
  for step in (80, 90):
    saves.maybe_save(step, state)
    saves._thread.join()  # pylint: disable=protected-access
  assert layout.local_committed_steps(tmp_path) == [70, 80, 90, 900]


def test_one_prune_rule_for_own_steps_and_buddy_copies_and_a_copy_in_flight_stays(tmp_path):
  """local.format.prune: every step entry but the kept ones goes (a host's own steps); with `partials_from`
  (the buddy copy) a `.partial` of that step or newer is a copy in flight, which its next fetch resumes."""
  folders = ['step_00000010', 'step_00000020', 'step_00000005.partial', 'step_00000030.partial',
             'step_00000020.replaced.partial', 'buddy']
  left = {}
  for partials_from in (None, 20):
    folder = tmp_path / str(partials_from)
    for name in folders:
      (folder / name).mkdir(parents=True)
    for name in ('autockpt.lock', 'step_junk'):
      (folder / name).write_text('')
    local_format.prune(folder, {20}, partials_from=partials_from)
    left[partials_from] = sorted(p.name for p in folder.iterdir())
  assert left[None] == ['autockpt.lock', 'buddy', 'step_00000020']
  assert left[20] == ['autockpt.lock', 'buddy', 'step_00000020', 'step_00000020.replaced.partial',
                      'step_00000030.partial']


def test_an_unset_interval_sets_itself_from_the_last_save_and_a_set_one_wins(tmp_path, caplog):
  """Unset, a local save waits 20x the previous one's cost (at least 1 s): ~5% of the run's time, not back to
  back; the first save is the measurement. The cadence is one log line per run; docs/settings.md says the same."""
  caplog.set_level('INFO')
  assert (saving.auto_interval(0.01), saving.auto_interval(0.5)) == (1.0, 10.0)
  doc = settings_lib.FIELDS['local_min_interval_secs'].metadata['doc']
  assert f'{saving.AUTO_FACTOR:.0f}x' in doc and f'at least {saving.AUTO_FLOOR_SECS:.0f} s' in doc
  _, state, _ = _state()
  saves = saving.LocalSaves(tmp_path, min_interval_secs=None, keep=2,
                            events=events_lib.EventLog(tmp_path / 'job', 0),
                            lineage=lineage_lib.Tracker('job-a', 'r'))
  assert saves._due(50)  # pylint: disable=protected-access
  saves.maybe_save(50, state)
  saves._thread.join()  # pylint: disable=protected-access
  assert 0 < saves._cost and not saves._due(60)  # pylint: disable=protected-access
  saves._cost = 0.2  # pylint: disable=protected-access
  for ago, due in ((3.9, False), (4.1, True)):
    saves._last_start = time.monotonic() - ago  # pylint: disable=protected-access
    assert saves._due(60) is due  # pylint: disable=protected-access
  lines = [r.getMessage() for r in caplog.records if 'a local save at most every' in r.getMessage()]
  assert len(lines) == 1 and "20x the last save's duration, at least 1 s" in lines[0], lines
  back_to_back = saving.LocalSaves(tmp_path / 'b', min_interval_secs=0, keep=2,
                                   events=events_lib.EventLog(tmp_path / 'job', 0),
                                   lineage=lineage_lib.Tracker('job-a', 'r'))
  back_to_back._cost, back_to_back._last_start = 5.0, time.monotonic()  # pylint: disable=protected-access
  assert back_to_back._due(60)  # pylint: disable=protected-access


def test_a_published_copy_is_released_from_the_coordination_service(tmp_path):
  """A real coordination service (its own process: jax.distributed is once per process): the donor's keys
  go, every key under its folder, and nothing else."""
  port = hosts.free_loopback_port()
  code = textwrap.dedent(f'''
      import jax
      from pax_autockpt.shared import coordination
      from pax_autockpt.local import restoring
      jax.distributed.initialize('127.0.0.1:{port}', num_processes=1, process_id=0)
      client = coordination.client()
      for key in ('fill/1/7/0/chunk/0', 'fill/1/7/0/chunk/1', 'fill/1/7/0/index', 'fill/1/7/1/index'):
        client.key_value_set(key, 'x')
      restoring._release(client, 'fill/1/7/0')
      print(sorted(k for k, _ in client.key_value_dir_get('fill/')))
  ''')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120, check=False)
  assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "['fill/1/7/1/index']", out.stderr[-2000:]


def test_a_week_of_commits_a_second_is_a_bounded_event_log(tmp_path, monkeypatch):
  """604,800 commits (one a second for a week) on a fake clock: one event for the run's first, then one a
  minute, and their counts add up to every commit."""
  clock = [0.0]
  monkeypatch.setattr(saving.time, 'monotonic', lambda: clock[0])
  monkeypatch.setattr(saving, '_log_line', lambda window: None)  # the log's cadence: the next test
  monkeypatch.setattr(events_lib.os, 'fsync', lambda fd: None)  # 10,081 fsyncs took 27 s; not what is tested
  summary = saving.CommitTally(events_lib.EventLog(tmp_path, 0))
  for step in range(7 * 24 * 3600):
    clock[0] = float(step)
    summary.add(step, 0.01, 100)
  summary.write()
  events = events_lib.read(tmp_path)
  assert len(events) == 1 + 7 * 24 * 60 and sum(e['commits'] for e in events) == 7 * 24 * 3600
  assert {e['interval_s'] for e in events[1:]} == {1.0} and events[-1]['step'] == 7 * 24 * 3600 - 1


def test_the_log_sums_up_local_commits_every_ten_seconds(tmp_path, monkeypatch):
  """A reader of the log sees the tier working: the run's first commit, then one line per 10 s with the
  commits, their rate and the newest step (not one line a minute, which reads as a stopped tier)."""
  clock, lines = [0.0], []
  monkeypatch.setattr(saving.time, 'monotonic', lambda: clock[0])
  monkeypatch.setattr(saving.logging, 'info', lambda fmt, *args: lines.append(fmt % args))
  summary = saving.CommitTally(events_lib.EventLog(tmp_path, 0))
  for step in range(0, 60, 2):  # a commit every 2 s for a minute
    clock[0] = float(step)
    summary.add(step, 0.01, 2_000_000)
  summary.write()
  assert len(lines) == 1 + 6 and 'local save of step 0 committed' in lines[0], lines
  assert lines[1] == ('[autockpt] local tier: 5 commit(s) in the last 10 s (one every 2.00 s), newest step 10, '
                      'committed in 0.010 s (2.0 MB).'), lines[1]
  assert 'newest step 58' in lines[-1] and len(events_lib.read(tmp_path)) == 2


_FILL = '''
import json, logging, sys, time
import jax
logging.basicConfig(level=logging.INFO)  # absl's lines through Python's root logger, on stderr
from pax_autockpt.shared import coordination
from pax_autockpt.local import restoring
host, port, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize('127.0.0.1:' + port, num_processes=2, process_id=host)
restore = restoring.LocalRestore(folder, host=host, hosts=2)
ok = restore.fill(restoring.Plan(step=12, donors={0: 0, 1: 0}, sources={1: ((0, False),)}))
def listed():
  return sorted(k for k, _ in coordination.client().key_value_dir_get(coordination.LOCAL_RESTORE + 'fill/'))
deadline = time.time() + 30  # the donor deletes its address and secret once its transfer is done
while any('/peer' in k for k in listed()) and time.time() < deadline:
  time.sleep(0.05)
print(json.dumps({'ok': ok, 'keys': listed()}), flush=True)
'''


def test_a_replaced_host_streams_its_copy_from_the_donor_and_the_service_keeps_only_the_verdicts(tmp_path):
  """Two real processes of one job (a real coordination service): host 1's disk is empty, host 0 holds local
  step 12; host 1 streams it over the peer path and ends with the same files, and the coordination service
  keeps no trace of the transfer's address or secret once it is done."""
  _, state, _ = _state()
  donor = _save(tmp_path / 'local-0', 12, state, _Input(12), hosts=2)
  port = str(hosts.free_loopback_port())
  procs = [subprocess.Popen([sys.executable, '-c', _FILL, str(h), port, str(tmp_path / f'local-{h}')],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for h in (0, 1)]
  outs = [p.communicate(timeout=120) for p in procs]
  results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
  assert [r['ok'] for r in results] == [True, True], [err[-2000:] for _, err in outs]
  received = layout.local_step_dir(tmp_path / 'local-1', 12)
  for name in (layout.LOCAL_INDEX, layout.LOCAL_SHARDS):
    assert (received / name).read_bytes() == (donor / name).read_bytes()
  assert results[1]['keys'] and not [k for k in results[1]['keys'] if '/peer' in k], results[1]['keys']
  assert 'local step 12 received from host 0 in ' in outs[1][1]


_BUDDY = '''
import json, logging, shutil, sys, time
import jax
logging.basicConfig(level=logging.INFO)  # absl's lines through Python's root logger, on stderr
from pax_autockpt.shared import coordination
from pax_autockpt import layout
from pax_autockpt.local import buddy, restoring
host, port, folder, needs = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
jax.distributed.initialize('127.0.0.1:' + port, num_processes=2, process_id=host)
client = coordination.client()
copies = buddy.BuddyCopies(folder, host=host, hosts=2, slices=1, mb_per_sec=50, nice=10, address='127.0.0.1')
copies.committed(12)  # as LocalSaves calls it once every host committed step 12
deadline = time.time() + 60
while not layout.local_step_dir(copies.kept, 12).exists() and time.time() < deadline:
  time.sleep(0.05)
client.key_value_set(f'test/copied/{host}', 'x')
for h in (0, 1):
  client.blocking_key_value_get(f'test/copied/{h}', 60000)
if host == 1:
  shutil.rmtree(folder)  # the VM replaced: its disk, and the buddy copy it kept, gone
restore = restoring.LocalRestore(folder, host=host, hosts=2)
plan = restore.plan(needs, restoring.JobState('job-a', committed=[], set_aside=[]), needs_input=False)
ok = plan is not None and restore.fill(plan)
sources = plan and {str(h): s for h, s in plan.sources.items()}
print(json.dumps({'ok': ok, 'step': plan and plan.step, 'sources': sources}), flush=True)
'''


def test_buddy_copies_let_a_host_without_a_replica_that_lost_its_disk_restore_the_newest_local_step(tmp_path):
  """Two real processes of one job, the model split between them (each host's shards differ: no replica).
  With buddy copies each host keeps the other's newest local step; host 1's disk then goes (a replaced VM):
  the plan restores local step 12 on both, host 1's share streamed from the buddy copy host 0 keeps, byte for
  byte what host 1 had written."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ('data', 'mdl'))
  written = {}
  for host in (0, 1):  # host 1's half of the model has another shape: another fingerprint
    state = {'w': jax.device_put(jnp.full((3, 4 + 4 * host), host + 1.5), jax.sharding.NamedSharding(mesh, P()))}
    step_dir = _save(tmp_path / f'local-{host}', 12, state, _Input(12), hosts=2)
    written[host] = {n: (step_dir / n).read_bytes() for n in (layout.LOCAL_INDEX, layout.LOCAL_SHARDS)}
  needs = [json.loads(written[h][layout.LOCAL_INDEX])['fingerprint'] for h in (0, 1)]
  assert needs[0] != needs[1]
  port = str(hosts.free_loopback_port())
  procs = [subprocess.Popen([sys.executable, '-c', _BUDDY, str(h), port, str(tmp_path / f'local-{h}'), needs[h]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for h in (0, 1)]
  outs = [p.communicate(timeout=180) for p in procs]
  results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
  assert results == [{'ok': True, 'step': 12, 'sources': {'1': [[0, True]]}}] * 2, [err[-3000:] for _, err in outs]
  assert 'buddy copies: 1 of host 1\'s local steps copied, newest 12' in outs[0][1]
  assert 'restoring local step 12, hosts [1] from the buddy copy a peer keeps for them' in outs[1][1]
  assert 'local step 12 received from host 0 (the buddy copy it keeps for this host)' in outs[1][1]
  for host in (0, 1):
    restored = layout.local_step_dir(tmp_path / f'local-{host}', 12)
    assert {n: (restored / n).read_bytes() for n in written[host]} == written[host]
  kept = layout.local_step_dir(layout.local_buddy_dir(tmp_path / 'local-0'), 12)
  assert (kept / layout.LOCAL_SHARDS).read_bytes() == written[1][layout.LOCAL_SHARDS]


@pytest.mark.parametrize('hosts_, slices, keepers', [
    (1, 1, [None]), (2, 1, [1, 0]), (3, 1, [1, 2, 0]), (4, 2, [2, 3, 0, 1]), (4, 4, [1, 2, 3, 0]),
    (6, 4, [1, 2, 3, 4, 5, 0])])
def test_a_hosts_keeper_is_the_same_host_of_the_next_slice_else_the_next_host(hosts_, slices, keepers):
  from pax_autockpt.local import buddy  # pylint: disable=g-import-not-at-top
  assert [buddy.keeper(h, hosts_, slices) for h in range(hosts_)] == keepers
  if hosts_ > 1:
    assert [buddy.owner(k, hosts_, slices) for k in keepers] == list(range(hosts_))


_KILLED = '''
import json, logging, sys, time
import jax
logging.basicConfig(level=logging.INFO)
from pax_autockpt.local import peer, restoring
host, port, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if host == 2:  # the buddy copy's keeper serves slowly: the test SIGKILLs it mid-part
  stream = peer._Handler._stream
  def slow(self, f, length):
    while length > 0:
      n = min(length, peer.BUFFER_BYTES)
      stream(self, f, n)
      length -= n
      time.sleep(0.05)
  peer._Handler._stream = slow
jax.distributed.initialize('127.0.0.1:' + port, num_processes=3, process_id=host)
jax.devices()  # the backend up on every host (its topology exchange waits for all 3), as in training
restore = restoring.LocalRestore(folder, host=host, hosts=3)
plan = restoring.Plan(step=12, donors={0: 0, 1: 0, 2: 2}, sources={1: ((0, False), (2, True))})
if host == 1:  # both donors serving before it asks: the parallel path, not the first donor alone
  from pax_autockpt.shared import coordination
  coordination.client().blocking_key_value_get('autockpt/local-restore/fill/0/12/2/1/peer', 60000)
print(json.dumps({'ok': restore.fill(plan)}), flush=True)
'''


@pytest.mark.soak
def test_a_donor_sigkilled_mid_transfer_hands_its_part_on_and_the_job_ends_within_the_bound(tmp_path):
  """`make soak` (~2 minutes: the coordination service's heartbeat bound). Three real processes of one job:
  host 1's disk is empty; host 0 holds a replica of its shards, host 2 a buddy copy. Both stream a part at
  once; host 2 is SIGKILLed mid-part: host 1 gets that part from host 0, from the byte it reached, and
  commits the whole step. A host that died ends the job: the others exit within the bound (the scheduler
  restarts the job, and host 1 then holds its own copy)."""
  _, state, _ = _state()
  big = {**state, **{f'big_{x}': jax.device_put(jnp.arange(4 << 20, dtype=jnp.float32), state['step'].sharding)
                     for x in 'ab'}}  # two 16 MB arrays: one for each donor's part
  donor = _save(tmp_path / 'local-0', 12, big, _Input(12), hosts=3)
  _save(layout.local_buddy_dir(tmp_path / 'local-2'), 12, big, _Input(12), hosts=3)
  port = str(hosts.free_loopback_port())
  procs = [subprocess.Popen([sys.executable, '-c', _KILLED, str(h), port, str(tmp_path / f'local-{h}')],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for h in range(3)]
  partial = layout.local_partial_dir(tmp_path / 'local-1', 12) / layout.LOCAL_SHARDS
  deadline = time.time() + 120
  while not partial.exists() and time.time() < deadline:
    time.sleep(0.01)
  time.sleep(0.5)  # host 2's part under way (~1.6 s at its pace)
  procs[2].kill()
  began = time.time()
  outs = [p.communicate(timeout=400) for p in procs[:2]] + [procs[2].communicate()]
  ended = time.time() - began
  received = layout.local_step_dir(tmp_path / 'local-1', 12) / layout.LOCAL_SHARDS
  if not received.exists() or received.read_bytes() != (donor / layout.LOCAL_SHARDS).read_bytes():
    for h, (out, err) in enumerate(outs):  # why host 1 has no (or a different) step 12: each host's own account
      print(f'--- host {h}: exit {procs[h].returncode}\n{out}{err[-6000:]}')
    pytest.fail('host 1 did not commit local step 12 as host 0 holds it (the hosts\' stderr above)')
  lines = [x for x in outs[1][1].splitlines() if '[autockpt]' in x]
  assert 'the next donor goes on from there' in outs[1][1], lines
  assert 'local step 12 received from hosts 0, 2 (a buddy copy) in parallel' in outs[1][1], lines
  print(f'host 2 SIGKILLed mid-part: host 1 committed the step; hosts 0 and 1 ended {ended:.0f} s later')


# --- Why 9: the restore's waits count from the last sign of progress, not the first arrival -------------------

STALL = 0.5  # agreement.STALL_SECS, scaled down: every host's wait here outlasts it many times


def _bounds(monkeypatch, stall=STALL, beat=0.05):
  """Small bounds for the restore's waits (the old fixed barrier timeout scaled down the same)."""
  monkeypatch.setattr(agreement, 'STALL_SECS', stall, raising=False)
  monkeypatch.setattr(agreement, 'BEAT_SECS', beat, raising=False)
  monkeypatch.setattr(agreement, '_TIMEOUT_MS', int(stall * 1000))


def _hashing(monkeypatch, host, pause=None, stall=None):
  """Host `host`'s shard digests take `pause` s each (a large share on a slow disk), or wait for `stall`."""
  real = local_format.xxhash.xxh3_64

  def digest(data):
    if threading.current_thread().name == f'host-{host}':
      if stall is not None:
        stall.wait(60)
      time.sleep(pause or 0)
    return real(data)

  monkeypatch.setattr(local_format.xxhash, 'xxh3_64', digest)


def _many_arrays(tmp_path, hosts_):
  """Local step 12 of 40 arrays on each host in `hosts_`; the fingerprint every host needs."""
  mesh, _, _ = _state()
  state = {f'a{i:02d}': jax.device_put(jnp.full((4,), i, jnp.float32), jax.sharding.NamedSharding(mesh, P()))
           for i in range(40)}
  for host in hosts_:
    step_dir = _save(tmp_path / f'local-{host}', 12, state, hosts=3)
  return local_format.read_index(step_dir)['fingerprint']


def test_a_host_that_reads_slowly_but_keeps_moving_keeps_the_others_at_the_plan(tmp_path, monkeypatch):
  """Why 9: host 0 reads and hashes its share slowly (40 shards, 0.05 s each: 4x the bound), host 2 (a replaced
  VM, empty disk) is at the plan at once. The others wait as long as host 0 moves: every host gets one plan."""
  _bounds(monkeypatch)
  needs = _many_arrays(tmp_path, (0, 1))
  _hashing(monkeypatch, 0, pause=STALL / 10)
  restores = [restoring.LocalRestore(tmp_path / f'local-{h}', host=h, hosts=3) for h in range(3)]
  plans, _ = fakes.as_hosts(monkeypatch, 3, lambda h: restores[h].plan(needs, JOB, needs_input=False))
  assert plans[0] == plans[1] == plans[2] == Plan(12, {0: 0, 1: 1, 2: 0}, {2: ((0, False), (1, False))}), plans


def test_a_host_that_stops_moving_sends_every_host_to_the_job_directory_with_one_agreed_line(tmp_path, monkeypatch,
                                                                                              caplog):
  """Why 9: host 2 stops in the middle of hashing its share. Hosts 0 and 1 end their wait once it has not moved
  for the bound, while it is still stuck; when it comes back it gets the same outcome. Every host restores from
  the job directory (empty: a fresh start) with the same line and a `local_restore_failed` event of kind
  "timeout": nothing escapes."""
  _bounds(monkeypatch)
  needs = _many_arrays(tmp_path, (0, 1, 2))
  stuck = threading.Event()
  _hashing(monkeypatch, 2, stall=stuck)
  monkeypatch.setattr(local_format, 'fingerprint_for', lambda *args: needs)

  def restore(h):
    local = restoring.LocalRestore(tmp_path / f'local-{h}', host=h, hosts=3)
    restorer = restore_lib.Restorer(fakes.FakePaxCheckpointer(tmp_path / f'job-{h}'),
                                    events=events_lib.EventLog(tmp_path / f'job-{h}', h), checksums=False,
                                    retry_secs=0, set_aside=lambda step: None, local=local, local_job='job-a')
    done = restorer.get_model_states(mock.Mock(), mock.Mock(), None)
    assert not stuck.is_set() or h == 2  # hosts 0 and 1 ended while host 2 was still stuck
    return done

  results, _ = fakes.as_hosts(monkeypatch, 3, restore, release=stuck)
  assert all(isinstance(results[h], tuple) for h in range(3)), results
  failed = [[e for e in events_lib.read(tmp_path / f'job-{h}', h) if e['event'] == 'local_restore_failed']
            for h in range(3)]
  assert [[(e['kind'], e['seen_by']) for e in f] for f in failed] == [[('timeout', failed[0][0]['seen_by'])]] * 3
  assert {f[0]['error'] for f in failed} == {'host(s) 2 made no progress for 0.5 s while the others waited at '
                                             'autockpt/local-restore/plan/1'}
  lines = [r.getMessage() for r in caplog.records if 'local tier not used for this restore' in r.getMessage()]
  assert len(lines) == 3 and len(set(lines)) == 1, lines
