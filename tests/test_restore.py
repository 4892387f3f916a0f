"""The restore's decisions around a fake Pax checkpointer (tests/fakes.py), and its fit check against
paxml's own metadata: only damage moves a checkpoint; a mismatch, a transient failure that outlasts the
retries and an unknown failure stop the run with one line and leave every checkpoint in place."""

import json
import threading
import time
import types

import jax
from jax import numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import utils as orbax_utils
from paxml import checkpoint_metadata
from paxml import train_states
import pytest

from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt.restore import restore
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import failures
from pax_autockpt.shared import internals
from pax_autockpt.shared import manifest as manifest_lib
from pax_autockpt.shared import stops
from tests import damage
from tests import fakes
from tests import test_failures

pytestmark = pytest.mark.usefixtures('clean_signals')
Kind = failures.Kind


@pytest.fixture
def job(tmp_path):
  return tmp_path / 'job'


@pytest.fixture
def no_sleep(monkeypatch):
  """The restore's pauses (this thread's: `time.sleep` is the module's, and a daemon thread an earlier test left,
  e.g. a buddy copy retrying its donor, sleeps too), without waiting."""
  pauses, real, mine = [], time.sleep, threading.current_thread()
  monkeypatch.setattr(restore.time, 'sleep',
                      lambda secs: pauses.append(secs) if threading.current_thread() is mine else real(secs))
  return pauses


def _two_checkpoints(job, retry_secs=300.0):
  for step in (10, 20):
    fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), step))
  return fakes.wrap(job, settings_lib.Settings(notices='off', checksums=False, restore_retry_secs=retry_secs))


def _listing(job):
  ckpt = layout.checkpoint_dir(job)
  aside = layout.unrestorable_dir(job)
  return sorted(p.name for p in ckpt.iterdir()), (sorted(p.name for p in aside.iterdir()) if aside.exists() else [])


def test_a_mismatch_stops_with_exit_2_s_one_line_and_moves_nothing(job):
  ckpt, fake = _two_checkpoints(job)
  before = _listing(job)
  fake.fail_restore = ValueError(test_failures.PAX_MISMATCH)
  with pytest.raises(stops.RestoreMismatch) as stop:
    ckpt.get_model_states(None, None, None)
  line = str(stop.value)
  assert line.startswith('checkpoint 20 does not fit this run: ValueError: PaxMetadata is not compatible')
  assert 'nothing was moved' in line and len(line) <= 300 and '\n' not in line
  assert _listing(job) == before and fake.restored == []
  failed, = fakes.events(job, 'restore_failed')
  assert (failed['step'], failed['kind']) == (20, 'mismatch') and not fakes.events(job, 'restore_skipped')


def test_a_transient_failure_is_retried_on_the_same_step(job, no_sleep):
  ckpt, fake = _two_checkpoints(job)
  fake.fail_restore = [ValueError(test_failures.GCS_503), ValueError(test_failures.GCS_503), None]
  assert ckpt.get_model_states(None, None, None)[2] == 20 and fake.restored == [20]
  assert no_sleep == [1.0, 2.0] and not fakes.events(job, 'restore_skipped')


def test_a_transient_failure_that_outlasts_the_retries_exits_1_and_moves_nothing(job, no_sleep):
  ckpt, fake = _two_checkpoints(job, retry_secs=10)
  before = _listing(job)
  fake.fail_restore = ValueError(test_failures.GCS_503)
  with pytest.raises(stops.RestoreFailed) as stop:
    ckpt.get_model_states(None, None, None)
  assert no_sleep == failures.backoff(10) == [1.0, 2.0, 4.0, 3.0]
  assert str(stop.value).startswith('checkpoint 20 could not be read for 10 s (ValueError: UNAVAILABLE')
  assert 'nothing was moved' in str(stop.value) and _listing(job) == before
  assert fakes.events(job, 'restore_failed')[0]['kind'] == 'transient'


def test_an_unknown_failure_exits_1_at_once_and_moves_nothing(job, no_sleep):
  ckpt, fake = _two_checkpoints(job)
  before = _listing(job)
  fake.fail_restore = RuntimeError('something nobody has seen')
  with pytest.raises(stops.RestoreFailed, match='not recognised as damage, so nothing was moved'):
    ckpt.get_model_states(None, None, None)
  assert no_sleep == [] and _listing(job) == before


def test_a_chunk_that_does_not_decode_is_damage_set_aside_and_the_next_newest_restored(job):
  ckpt, fake = _two_checkpoints(job)
  fake.fail_restore = [ValueError(test_failures.TRUNCATED_ZARR), None]
  assert ckpt.get_model_states(None, None, None)[2] == 10 and fake.restored == [10]
  assert _listing(job) == (['checkpoint_00000010'], ['checkpoint_00000020'])
  assert 'Truncated Zstd-compressed stream' in fakes.events(job, 'restore_skipped')[0]['error']


def test_damage_that_cannot_be_set_aside_stops_instead_of_restoring_it_again(job, monkeypatch):
  ckpt, fake = _two_checkpoints(job)
  (layout.step_dir(layout.checkpoint_dir(job), 20) / 'state').rmtree()
  monkeypatch.setattr(layout, 'set_aside_damaged', fakes.raises(PermissionError(13, 'Permission denied')))
  with pytest.raises(stops.RestoreFailed, match=r'checkpoint 20 is damaged \(.*state is missing\) and could not '
                     r'be set aside \(PermissionError: .*Permission denied\); nothing was deleted'):
    ckpt.get_model_states(None, None, None)
  assert fake.restored == []


@pytest.mark.parametrize('found, kind, host', [
    ({}, None, None),
    ({1: 'transient|503'}, Kind.TRANSIENT, 1),
    ({0: 'transient|503', 1: 'damage|chunk'}, Kind.DAMAGE, 1),
    ({0: 'damage|chunk', 1: 'mismatch|shape'}, Kind.MISMATCH, 1),
    ({0: 'unknown|?', 1: 'transient|503'}, Kind.UNKNOWN, 0),
    ({2: 'damage|b', 1: 'damage|a'}, Kind.DAMAGE, 1),
])
def test_the_most_conservative_finding_wins_then_the_lowest_host(found, kind, host):
  decided = restore.decide(found)
  assert (decided.kind, decided.host) == (kind, host) if kind else decided is None


# --- fit: the checkpoint's own metadata against this run's --------------------------------------------


def _metadata(w_shape, dtype=jnp.float32):
  """paxml's TrainStateMetadata for a one-variable model (ShapeDtypeStructs, as Pax builds it)."""
  shapes = train_states.TrainState(step=jax.ShapeDtypeStruct((), jnp.int32),
                                   mdl_vars={'w': jax.ShapeDtypeStruct(w_shape, dtype)},
                                   opt_states=[{'m': jax.ShapeDtypeStruct(w_shape, dtype)}])
  return types.SimpleNamespace(padded_global_shapes=shapes, unpadded_global_shapes=shapes)


def _saved_by(tmp_path, metadata):
  """A checkpoint's metadata item as paxml writes it."""
  path = tmp_path / 'checkpoint_00000010'
  (path / 'metadata').mkdir(parents=True)
  pax = checkpoint_metadata.PaxMetadata.from_padded_and_unpadded(
      metadata.padded_global_shapes, metadata.unpadded_global_shapes, version=1.1)
  (path / 'metadata' / 'metadata').write_text(json.dumps(pax.to_dict(), default=list))
  return layout.step_dir(tmp_path, 10)


def _fit(path, metadata, **kw):
  return restore.fit_problem(path, metadata, **{'input_state': False, 'host': 0, 'hosts': 1, **kw})


def test_fit_names_the_first_differing_array_with_both_shapes(tmp_path):
  path = _saved_by(tmp_path, _metadata((64,)))
  assert _fit(path, _metadata((64,))) is None
  assert _fit(path, _metadata((96,))) == 'mdl_vars.w is float32[64] there, float32[96] here'
  assert _fit(path, _metadata((64,), jnp.bfloat16)) == 'mdl_vars.w is float32[64] there, bfloat16[64] here'


def test_fit_names_an_array_that_one_side_lacks():
  assert restore.array_mismatch({'a': {'dtype': 'float32', 'unpadded_shape': [2]}}, {}) == (
      'a is float32[2] there, absent here')


def test_fit_input_state_written_by_another_number_of_hosts(tmp_path):
  path = _saved_by(tmp_path, _metadata((4,)))
  for host in (0, 1):
    (path / 'train_input' / f'process_{host}-of-2').mkdir(parents=True)
  assert _fit(path, _metadata((4,)), input_state=True, host=1, hosts=2) is None
  assert _fit(path, _metadata((4,)), input_state=False, hosts=1) is None  # this run reads no input state
  assert _fit(path, _metadata((4,)), input_state=True, hosts=1) == (
      'its input state was written by 2 hosts, this run has 1 '
      '(--autockpt_input_on_host_change=restart restores the weights and starts the input over)')


@pytest.mark.parametrize('setting', ['exit', 'restart'])
def test_input_state_of_another_number_of_hosts_exits_2_or_restarts_the_input(job, setting):
  for step in (10, 20):
    path = fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), step))
    for host in (0, 1):
      (path / 'train_input' / f'process_{host}-of-2').parent.mkdir(parents=True, exist_ok=True)
      (path / 'train_input' / f'process_{host}-of-2').write_bytes(b'{}')
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(notices='off', checksums=False, input_on_host_change=setting))
  before = _listing(job)
  if setting == 'exit':
    with pytest.raises(stops.RestoreMismatch, match='input state was written by 2 hosts.*this run has 1'):
      ckpt.get_model_states(None, None, None, train_input_pipeline=object())
    assert fake.restored == [] and not fakes.events(job, 'input_restarted')
  else:
    assert ckpt.get_model_states(None, None, None, train_input_pipeline=object())[2] == 20
    assert fake.restored == [20] and not fake.input_restored  # the weights, not the input
    restarted, = fakes.events(job, 'input_restarted')
    assert restarted['step'] == 20 and 'written by 2 hosts' in restarted['reason']
  assert _listing(job) == before


def test_unparseable_metadata_is_damage(job):
  ckpt, fake = _two_checkpoints(job)
  (layout.step_dir(layout.checkpoint_dir(job), 20) / 'metadata' / 'metadata').write_text('{"version": 1.')
  assert ckpt.get_model_states(None, _metadata((4,)), None)[2] == 10 and fake.restored == [10]
  assert "metadata/metadata is not JSON (JSONDecodeError: Expecting ',' delimiter: line 1 column 14 (char 13), " \
      "14 bytes)" in fakes.events(job, 'restore_skipped')[0]['error']


# --- verification on any topology -------------------------------------------------------------------


def test_saved_shards_no_restored_shard_coincides_with_are_read_back():
  """Saved by 2 hosts in halves, restored whole on one (and the reverse): no restored shard is a saved
  one, so those are read back from storage; where they coincide, none is."""
  w = jnp.arange(4, dtype=jnp.float32)
  assert manifest_lib.uncovered([('w', w)], {'w': {'0:2': 'a', '2:4': 'b'}}) == [('w', '0:2'), ('w', '2:4')]
  assert manifest_lib.uncovered([('w', w)], {'w': {'0:4': 'a'}, 'gone': {'0:1': 'c'}}) == [('gone', '0:1')]
  assert manifest_lib.uncovered([('w', w)], {'w': {'0:4': 'a'}}) == []


def _saved_by_two_hosts_in_halves(step_path, ocdbt):
  """A real checkpoint of fakes.STATE (orbax, tensorstore) as 2 hosts save it with `w` split between them: host 0
  wrote `w[0:2]`, `m` and `step`, host 1 only `w[2:4]`; each host's manifest lists what it wrote."""
  arrays = {n: np.asarray(x) for n, x in internals.array_names(fakes.STATE, use_ocdbt=ocdbt)}
  ocp.PyTreeCheckpointer(use_ocdbt=ocdbt).save(step_path / 'state', {n: jnp.asarray(x) for n, x in arrays.items()})
  whole = lambda x: manifest_lib.shard_key(tuple(slice(None) for _ in x.shape), x.shape)
  w = arrays.pop('mdl_vars.w')
  mine = {0: {'mdl_vars.w': {'0:2': manifest_lib.digest(w[0:2])},
              **{n: {whole(x): manifest_lib.digest(x)} for n, x in arrays.items()}},
          1: {'mdl_vars.w': {'2:4': manifest_lib.digest(w[2:4])}}}
  for host, listed in mine.items():
    manifest_lib.write(step_path, {'format': manifest_lib.FORMAT, 'hash': manifest_lib.HASH, 'host': host,
                                   'hosts': 2, 'arrays': listed})


def _restored_whole(step_path, ocdbt):
  """What a 1-host run restores: each array whole on its one device, read from the checkpoint."""
  names = [n for n, _ in internals.array_names(fakes.STATE, use_ocdbt=ocdbt)]
  leaves = [jnp.asarray(manifest_lib.open_saved(step_path, n, ocdbt).read().result()) for n in names]
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(fakes.STATE), leaves)


@pytest.mark.parametrize('ocdbt', [False, True], ids=['zarr', 'ocdbt'])
def test_shards_saved_on_another_topology_are_read_back_and_a_flipped_byte_only_the_other_host_wrote_is_found(
    job, caplog, ocdbt):
  """Saved by 2 hosts with `w` in halves, restored by 1 holding it whole: no restored shard of `w` is a saved one,
  so the check reads both halves back from storage (the others are checked in memory), and every saved shard is
  checked. A byte flipped in the half only host 1 wrote is damage, though nothing in memory can show it."""
  caplog.set_level('INFO')
  restorer = restore.Restorer(fakes.FakePaxCheckpointer(job), events=events_lib.EventLog(job, 0), checksums=True,
                              retry_secs=1.0, set_aside=lambda step: None)
  step_path = layout.step_dir(layout.checkpoint_dir(job), 20)
  _saved_by_two_hosts_in_halves(step_path, ocdbt)
  assert restorer._verify(20, _restored_whole(step_path, ocdbt)) is None  # pylint: disable=protected-access
  assert restorer.verified == {'shards_checked': 4, 'shards_unchecked': 0}
  assert '4 shards of 3 arrays checked against the manifest (2 in memory, 2 read back from storage), 0 of 4 saved ' \
      'shards unchecked' in caplog.text
  assert damage.flip_a_byte(step_path, host=1) == ('mdl_vars.w', '2:4')
  found = restorer._verify(20, _restored_whole(step_path, ocdbt))  # pylint: disable=protected-access
  assert found is not None and found.kind is Kind.DAMAGE, found
  assert found.reason.startswith('host 0: mdl_vars.w shard [2:4] does not match the manifest'), found.reason


def test_a_lost_manifest_of_a_save_that_wrote_one_is_damage(job):
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(notices='off'), interval=10)
  for step in (10, 20):
    ckpt.save_if_needed(step, fakes.STATE)
  ckpt.wait_until_finished()
  assert all(e.get('manifest') for e in fakes.events(job, 'save_committed'))
  layout.manifest_dir(layout.step_dir(layout.checkpoint_dir(job), 20)).rmtree()
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(notices='off'), interval=10)
  assert ckpt.get_model_states(None, None, None)[2] == 10 and fake.restored == [20, 10]
  assert 'its save wrote a content manifest' in fakes.events(job, 'restore_skipped')[0]['error']
  assert ckpt.verified == {'shards_checked': 3, 'shards_unchecked': 0}


def test_listing_the_checkpoints_retries_storage_errors_then_ends_in_one_line(monkeypatch):
  """orbax lists the checkpoints before any restore code runs: a 503 there is retried; an outage that
  outlasts the budget is RestoreFailed (main: one line, exit 1), not a traceback."""
  monkeypatch.setattr(failures.time, 'sleep', lambda s: None)
  monkeypatch.setattr(orbax_utils, 'checkpoint_steps', orbax_utils.checkpoint_steps)  # undone after the test
  answers = [ValueError(test_failures.GCS_503), ValueError(test_failures.GCS_503), [100, 200]]

  def listing(directory, *args, **kwargs):
    answer = answers.pop(0)
    if isinstance(answer, Exception):
      raise answer
    return answer

  monkeypatch.setattr(internals, '_original_checkpoint_steps', listing)
  internals.retry_listing(10)
  assert orbax_utils.checkpoint_steps('gs://b/job/checkpoints') == [100, 200] and not answers
  answers[:] = [ValueError(test_failures.GCS_503)] * 5
  with pytest.raises(stops.RestoreFailed, match=r'the checkpoints in gs://b/job/checkpoints could not be listed '
                     r'for 10 s \(ValueError: UNAVAILABLE.*\); nothing was moved'):
    orbax_utils.checkpoint_steps('gs://b/job/checkpoints')
