"""Which local steps a restart may restore (pax_autockpt.local.lineage.refusal, pure) and how a run's lineage moves
as its job-directory saves start and commit."""

import shutil

import pytest

from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt.local import lineage as lineage_lib
from tests import fakes

Lineage = lineage_lib.Lineage


def _refusal(lineage, step, committed, set_aside=(), job='job-a', ever_committed=frozenset(), saves=None):
  return lineage_lib.refusal(lineage, step, job=job, committed=list(committed), set_aside=list(set_aside),
                             ever_committed=ever_committed, saves=saves)


def test_a_step_of_this_job_that_grew_from_the_newest_checkpoint_is_offered():
  assert _refusal(Lineage('job-a', 'r1', base=600), 623, committed=[0, 300, 600]) is None
  assert _refusal(Lineage('job-a', 'r1', base=None), 40, committed=[]) is None  # a fresh job, nothing saved yet
  # The save of 600 was in flight when 610 was captured, and committed later: 610 grew from it too.
  assert _refusal(Lineage('job-a', 'r1', base=400, started=(600,)), 610, committed=[0, 400, 600]) is None
  # ... or never committed (a kill mid-save): the step grew from 400, still there.
  assert _refusal(Lineage('job-a', 'r1', base=400, started=(600,)), 610, committed=[0, 400]) is None
  # Older checkpoints pruned by max_to_keep or a preservation policy change nothing.
  assert _refusal(Lineage('job-a', 'r1', base=600), 623, committed=[600]) is None


def test_another_jobs_step_is_refused():
  assert _refusal(Lineage('job-b', 'r1', base=None), 100, committed=[]).startswith('written by another job')


def test_a_rollback_is_honoured():
  why = _refusal(Lineage('job-a', 'r1', base=600), 623, committed=[0, 300])
  assert why.startswith('it grew from checkpoint 600, which is no longer in the job directory')
  # Every checkpoint deleted (the directory emptied, its job id kept): nothing it grew from is left.
  assert _refusal(Lineage('job-a', 'r1', base=0), 30, committed=[]) is not None


def test_a_rollback_of_a_save_in_flight_at_the_capture_is_seen_in_the_event_log():
  """Local step 432 was captured while the save of 400 was still writing (its base is 200). 400 then
  committed (its save_committed event) and the user deleted it: a rollback. Had 400 never committed (a kill
  mid-save), 432 grew from 200 and is offered."""
  grown = Lineage('job-a', 'r1', base=200, started=(400,))
  why = _refusal(grown, 432, committed=[0, 200], ever_committed=frozenset({0, 200, 400}))
  assert why.startswith('it grew from checkpoint 400, which is no longer in the job directory')
  assert _refusal(grown, 432, committed=[0, 200], ever_committed=frozenset({0, 200})) is None


def test_a_base_set_aside_as_damaged_still_counts_and_the_step_is_offered_over_the_older_checkpoint():
  assert _refusal(Lineage('job-a', 'r1', base=600), 623, committed=[0, 300], set_aside=[600]) is None
  assert _refusal(Lineage('job-a', 'r1', base=300), 404, committed=[0, 300], set_aside=[508]) is None


def test_a_newer_checkpoint_it_did_not_grow_from_refuses_it():
  why = _refusal(Lineage('job-a', 'r1', base=300), 450, committed=[0, 300, 400])
  assert why == "the job directory's checkpoint 400 is not one it grew from"
  why = _refusal(Lineage('job-a', 'r1', base=None), 450, committed=[400])
  assert why == "the job directory's checkpoint 400 is not one it grew from"


@pytest.mark.parametrize('text', [None, 'x', {'job': 'a'}, {'job': 'a', 'run': 'r', 'base': '1', 'started': []},
                                  {'job': 'a', 'run': 'r', 'base': 1, 'started': ['2']}])
def test_anything_but_a_written_lineage_is_a_value_error(text):
  with pytest.raises(ValueError):
    Lineage.from_json(text)


def test_the_tracker_follows_saves_as_they_start_commit_and_fail():
  tracker = lineage_lib.Tracker('job-a', 'r2')
  tracker.restored(300)
  assert tracker.at(350) == Lineage('job-a', 'r2', 300, ())
  tracker.save_started(400)
  assert tracker.at(399) == Lineage('job-a', 'r2', 300, ()) and tracker.at(410).started == (400,)
  tracker.save_committed(400)
  assert tracker.at(450) == Lineage('job-a', 'r2', 400, ())
  tracker.save_started(500)
  tracker.save_failed(500)
  assert tracker.at(550) == Lineage('job-a', 'r2', 400, ())
  # A restored local step carries on the lineage it grew from, and the line of the run that wrote it.
  tracker.restored(623, Lineage('job-a', 'r1', 600, (620,)))
  assert tracker.at(630) == Lineage('job-a', 'r2', 600, (620,), handed=(('r1', 623),))
  assert Lineage.from_json(tracker.at(630).to_json()) == tracker.at(630)
  tracker.save_started(700)
  tracker.save_committed(700)
  assert tracker.at(710).handed == ()  # the line before the new base is the base's


def test_a_job_directory_gets_one_id_and_a_new_directory_a_new_one(tmp_path):
  first, run1 = lineage_lib.identify(tmp_path / 'job', 0)
  again, run2 = lineage_lib.identify(tmp_path / 'job', 0)
  assert first == again and run1 != run2
  layout.job_id_path(tmp_path / 'job').unlink()  # the directory deleted and made again
  assert lineage_lib.identify(tmp_path / 'job', 0)[0] != first


def test_a_checkpoint_retrained_to_the_same_number_is_another_save_and_its_local_steps_are_refused():
  """Why 1: local step 2400 grew from checkpoint 2000 (save r1-2000); 2000 was rolled back and retrained to the
  same number (save r3-2000, the newest commit of 2000 in the event log): restoring 2400 would undo it."""
  grown = Lineage('job-a', 'r1', base=2000, base_id='r1-2000')
  saves = {1000: ('r0-1000',), 2000: ('r1-2000', 'r3-2000')}
  assert _refusal(grown, 2400, committed=[1000, 2000], saves=saves) == (
      "it grew from checkpoint 2000 of another save (id r1-2000), the job directory's 2000 is a later save: "
      'restoring it would undo the rollback')
  assert _refusal(grown, 2400, committed=[1000, 2000], saves={2000: ('r1-2000',)}) is None  # the same save
  # A save it saw start (r1-3000) never committed; another save of 3000 (r3-3000) did: not one it grew from.
  seen = Lineage('job-a', 'r1', base=2000, started=(3000,), base_id='r1-2000', started_ids=('r1-3000',))
  why = _refusal(seen, 3100, committed=[2000, 3000], saves={2000: ('r1-2000',), 3000: ('r3-3000',)})
  assert why == "the job directory's checkpoint 3000 is not one it grew from"


def test_a_save_id_is_one_per_run_and_step_and_every_commit_of_a_step_is_listed_oldest_first():
  run1, run2 = 'a' * 32, 'b' * 32  # the same on every host of a run, another for a retrain
  assert lineage_lib.save_id(run1, 2000) == lineage_lib.save_id(run1, 2000) != lineage_lib.save_id(run2, 2000)
  log = [{'event': 'save_committed', 'step': 2000}, {'event': 'save_started', 'step': 2000, 'id': 'x'},
         {'event': 'save_committed', 'step': 2000, 'id': 'y'}, {'event': 'save_committed', 'step': 'z'}]
  assert lineage_lib.committed_saves(log) == {2000: (None, 'y')}


def test_a_copied_or_moved_job_directory_is_a_new_job_for_the_local_tier(tmp_path):
  """Why 2: `cp -r` carries autockpt/job_id along; the fork and the original are two jobs all the same."""
  original, _ = lineage_lib.identify(tmp_path / 'job', 0)
  shutil.copytree(tmp_path / 'job', tmp_path / 'fork')
  assert layout.job_id_path(tmp_path / 'fork').read_text() == layout.job_id_path(tmp_path / 'job').read_text()
  fork, _ = lineage_lib.identify(tmp_path / 'fork', 0)
  assert fork != original and lineage_lib.identify(tmp_path / 'job', 0)[0] == original
  (tmp_path / 'job').rename(tmp_path / 'moved')
  assert lineage_lib.identify(tmp_path / 'moved', 0)[0] not in (original, fork)
  assert _refusal(Lineage(original, 'r1', base=None), 40, committed=[], job=fork).startswith('written by another job')
  bucket = lineage_lib.job_identity('abc', 'gs://b/job')
  assert bucket == lineage_lib.job_identity('abc', 'gs://b/job/') != lineage_lib.job_identity('abc', 'gs://b/fork')


def test_a_base_removed_by_preservation_after_a_save_it_saw_start_committed_is_not_a_rollback():
  """Why 3: local step 2050 grew from 1000 and saw the save of 2000 start; 2000 committed and
  --autockpt_keep_latest=1 deleted 1000. 2050 is offered; a rollback or a retrain of 2000 still refuses it."""
  tracker = lineage_lib.Tracker('job-a', 'r1')
  tracker.restored(1000, save='r0-1000')
  tracker.save_started(2000, 'r1-2000')
  grown = tracker.at(2050)
  assert grown == Lineage('job-a', 'r1', 1000, (2000,), 'r0-1000', ('r1-2000',))
  saves = {1000: ('r0-1000',), 2000: ('r1-2000',)}
  assert _refusal(grown, 2050, committed=[2000], saves=saves) is None
  assert _refusal(grown, 2050, committed=[], saves=saves).startswith('it grew from checkpoint 2000, which is no longer')
  assert 'of another save' in _refusal(grown, 2050, committed=[2000], saves={**saves, 2000: ('r1-2000', 'r3-2000')})
  assert _refusal(grown, 2050, committed=[], saves={1000: ('r0-1000',)}).startswith(  # 2000 never committed
      'it grew from checkpoint 1000, which is no longer')
  tracker.save_committed(2000)
  assert tracker.at(2100) == Lineage('job-a', 'r1', 2000, (), 'r1-2000')


def test_an_index_written_before_save_ids_is_judged_by_step_numbers():
  old = Lineage.from_json({'job': 'job-a', 'run': 'r1', 'base': 2000, 'started': [2400]})
  assert old == Lineage('job-a', 'r1', 2000, (2400,)) and old.base_id is None and old.started_ids == ()
  saves = {2000: ('r3-2000',), 2400: ('r3-2400',)}  # saves with ids it knows nothing of
  assert _refusal(old, 2450, committed=[1000, 2000, 2400], saves=saves) is None
  assert _refusal(old, 2450, committed=[1000], saves=saves).startswith('it grew from checkpoint 2400, which is no')
  assert Lineage.from_json(old.to_json()) == old
  with pytest.raises(ValueError):
    Lineage.from_json({**old.to_json(), 'started_ids': ['a', 'b']})  # more ids than saves


@pytest.mark.usefixtures('clean_signals')
def test_each_job_directory_save_has_an_id_and_a_restart_grows_its_local_steps_from_it(tmp_path):
  job, settings = tmp_path / 'job', settings_lib.Settings(local_dir=str(tmp_path / 'local'))
  ckpt, _ = fakes.wrap(job, settings)
  ckpt.save_if_needed(10, fakes.STATE)
  ckpt.wait_until_finished()
  started, = fakes.events(job, 'save_started')
  committed, = fakes.events(job, 'save_committed')
  assert started['id'] == committed['id'] and committed['id'].endswith('-10')
  assert ckpt._lineage.at(15).base_id == committed['id']  # pylint: disable=protected-access
  again, fake = fakes.wrap(job, settings)
  again.get_model_states(None, None, None)
  assert fake.restored == [10]
  assert again._lineage.at(15).base_id == committed['id']  # pylint: disable=protected-access  (from the log)


def test_only_the_checkpoints_preservation_deleted_after_a_rollback_showed_count_as_there_at_it():
  """kept_later: 4 (save a-4) is rolled back. Preservation's delete of 2 came before any sign of that (so 2 may
  have been gone already at the rollback: not counted); a restart then resumed 3, older than 4 (the rollback
  had happened); preservation's later delete of 3 counts. A set-aside of 4 before such a start proves nothing."""
  log = [{'event': 'save_committed', 'step': s, 'id': f'a-{s}'} for s in (2, 3, 4)]
  log += [{'event': 'deleted', 'step': 2}, {'event': 'start', 'restored_step': 3},
          {'event': 'deleted', 'step': 3}]
  assert lineage_lib.kept_later(log, ((4, 'a-4'),)) == {'a-4': {3: 'a-3'}}
  aside = log[:4] + [{'event': 'restore_skipped', 'step': 4}] + log[4:]
  assert lineage_lib.kept_later(aside, ((4, 'a-4'),)) == {}
  assert lineage_lib.kept_later(log[:4] + [{'event': 'start', 'restored_step': None}] + log[5:],
                                ((4, 'a-4'),)) == {'a-4': {3: 'a-3'}}
