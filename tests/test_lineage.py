"""Which local steps a restart may restore (pax_autockpt.lineage.refusal, pure) and how a run's lineage moves
as its job-directory saves start and commit."""

import pytest

from pax_autockpt import layout
from pax_autockpt import lineage as lineage_lib

Lineage = lineage_lib.Lineage


def _refusal(lineage, step, committed, set_aside=(), job='job-a', ever_committed=frozenset()):
  return lineage_lib.refusal(lineage, step, job=job, committed=list(committed), set_aside=list(set_aside),
                             ever_committed=ever_committed)


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
  # A restored local step carries on the lineage it grew from.
  tracker.restored(623, Lineage('job-a', 'r1', 600, (620,)))
  assert tracker.at(630) == Lineage('job-a', 'r2', 600, (620,))
  assert Lineage.from_json(tracker.at(630).to_json()) == tracker.at(630)


def test_a_job_directory_gets_one_id_and_a_new_directory_a_new_one(tmp_path):
  first, run1 = lineage_lib.identify(tmp_path / 'job', 0)
  again, run2 = lineage_lib.identify(tmp_path / 'job', 0)
  assert first == again and run1 != run2
  layout.job_id_path(tmp_path / 'job').unlink()  # the directory deleted and made again
  assert lineage_lib.identify(tmp_path / 'job', 0)[0] != first
