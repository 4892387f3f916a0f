"""AutockptCheckpointer around a fake Pax checkpointer (tests/fakes.py): no training process."""

import errno
import logging
import threading

import pytest

from pax_autockpt import layout
from pax_autockpt import outcomes
from pax_autockpt import policies
from pax_autockpt import settings as settings_lib
from tests import fakes
from tests.fakes import STATE

pytestmark = pytest.mark.usefixtures('clean_signals')


@pytest.fixture
def job(tmp_path):
  return tmp_path / 'job'


def committed(job):
  return layout.committed_steps(layout.checkpoint_dir(job))


def kinds(job):
  return [e['event'] for e in fakes.events(job)]


def errors(caplog, text):
  return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and text in r.getMessage()]


class KeepNothing:
  """A preservation policy that keeps no checkpoint."""

  def should_preserve(self, checkpoints, *, context):
    del context
    return [False] * len(checkpoints)


def test_preemption_saves_off_interval_waits_for_commit_then_raises(job):
  """At the agreed step: a 'preemption' save off Pax's interval, committed before Preempted is raised."""
  ckpt, fake = fakes.wrap(job, interval=10)
  for step in (1, 2):
    ckpt.save_if_needed(step, STATE)
  fakes.preempt()
  fake.orbax.gate.clear()
  threading.Timer(0.3, fake.orbax.gate.set).start()  # the commit comes a little later
  with pytest.raises(outcomes.Preempted) as stop:
    ckpt.save_if_needed(3, STATE)
  assert committed(job) == [3]  # at the moment Preempted was raised
  assert stop.value.step == 3
  assert fake.orbax.attempts == [3]
  assert kinds(job) == ['preemption', 'save_started', 'save_committed']
  started, = fakes.events(job, 'save_started')
  assert started['step'] == 3 and started['reason'] == 'preemption'
  assert fakes.events(job, 'preemption')[0]['signal'] == 'SIGTERM'
  assert fake.orbax.reached_preemption(3) and not fake.orbax.reached_preemption(2)  # routed to ours


def test_failed_on_demand_commit_raises_save_failed_and_removes_leftovers(job, caplog):
  """A commit that fails at preemption: SaveFailed naming the step and the newest committed one;
  the failed save's temporary directory is gone."""
  ckpt, fake = fakes.wrap(job, interval=10)
  ckpt.save_if_needed(10, STATE)
  ckpt.wait_until_finished()
  fake.orbax.fail_commit = OSError('disk write failed')
  fakes.preempt()
  with pytest.raises(outcomes.SaveFailed) as stop:
    ckpt.save_if_needed(13, STATE)
  assert stop.value.step == 13
  assert 'step 13' in str(stop.value)
  assert 'the newest committed checkpoint is 10' in str(stop.value)
  tmp = fake.orbax.tmp_dirs[-1]
  assert tmp.name.startswith('checkpoint_00000013' + layout.ORBAX_TMP) and not tmp.exists()
  assert layout.leftovers(layout.checkpoint_dir(job), 13) == []
  assert committed(job) == [10]
  assert 13 not in [e['step'] for e in fakes.events(job, 'save_committed')]
  assert errors(caplog, 'save of step 13 failed to commit')


def test_failed_save_start_is_logged_and_training_goes_on(job, caplog):
  """ENOSPC as orbax starts an interval save (in the background thread, past the host copy): logged as
  a failed save, no exception in the loop, nothing committed or left over; the next save works."""
  ckpt, fake = fakes.wrap(job, interval=10)
  fake.orbax.fail_start = OSError(errno.ENOSPC, 'No space left on device')
  ckpt.save_if_needed(10, STATE)
  ckpt.wait_until_finished()
  assert fake.orbax.attempts == [10]
  assert [e['step'] for e in fakes.events(job, 'save_started')] == [10]
  assert committed(job) == [] and layout.leftovers(layout.checkpoint_dir(job), 10) == []
  assert errors(caplog, 'save of step 10 failed to commit (OSError: [Errno 28] No space left on device)')
  fake.orbax.fail_start = None
  ckpt.save_if_needed(20, STATE)
  ckpt.wait_until_finished()
  assert committed(job) == [20]
  assert [e['step'] for e in fakes.events(job, 'save_committed')] == [20]


def test_failed_interval_commit_is_dropped_and_the_next_save_commits(job, caplog):
  """A failed interval commit: logged, its temporary directory removed before the next save, which
  starts and commits (orbax would raise the old error at that save otherwise)."""
  ckpt, fake = fakes.wrap(job, interval=10)
  fake.orbax.fail_commit = OSError('disk write failed')
  ckpt.save_if_needed(10, STATE)
  ckpt.wait_until_finished()  # orbax's save runs in the background: let it meet the failure first
  fake.orbax.fail_commit = None
  ckpt.save_if_needed(20, STATE)
  ckpt.wait_until_finished()
  assert committed(job) == [20]
  assert [e['step'] for e in fakes.events(job, 'save_started')] == [10, 20]
  assert [e['step'] for e in fakes.events(job, 'save_committed')] == [20]
  assert not fake.orbax.tmp_dirs[0].exists()
  assert errors(caplog, 'save of step 10 failed to commit (OSError: disk write failed)')


def test_keep_latest_deletes_older_with_events_and_replaces_max_to_keep(job):
  """keep_latest=2: the newest two committed stay, a `deleted` event for each other one; Pax's own
  max_to_keep (1 here) no longer deletes."""
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(keep_latest=2), interval=10, max_to_keep=1)
  assert fake.orbax._options.max_to_keep is None  # pylint: disable=protected-access
  for step in range(10, 41):
    ckpt.save_if_needed(step, STATE)
  ckpt.wait_until_finished()
  assert committed(job) == [30, 40]
  deleted = fakes.events(job, 'deleted')
  assert [e['step'] for e in deleted] == [10, 20]
  assert all('LatestN(n=2)' in e['policy'] for e in deleted)


def test_newest_committed_is_never_deleted(job):
  """A policy that keeps nothing still leaves the newest committed checkpoint, even when the loop has
  moved past it (so it is not protected as the current step)."""
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(preservation_policy=KeepNothing()), interval=10)
  ckpt.save_if_needed(10, STATE)
  ckpt.wait_until_finished()
  fake.orbax.gate.clear()
  for step in range(20, 26):
    ckpt.save_if_needed(step, STATE)
  fake.orbax.gate.set()  # 20 commits while the loop is at step 25
  ckpt.wait_until_finished()
  assert committed(job) == [20]
  assert [e['step'] for e in fakes.events(job, 'deleted')] == [10]


def test_damaged_newest_is_set_aside_and_the_next_newest_restored(job):
  """Restore: the newest committed checkpoint without state/ gets restore_skipped, moves to
  autockpt/unrestorable/ (kept), and Pax restores the next newest."""
  for step in (10, 20):
    fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), step))
  (layout.step_dir(layout.checkpoint_dir(job), 20) / 'state').rmtree()
  ckpt, fake = fakes.wrap(job)
  assert ckpt.step_to_restore == 20
  assert ckpt.get_model_states(None, None, None) == 'model states of step 10'
  assert fake.restored == [10]
  assert fake.step_to_restore == 10 and ckpt.step_to_restore == 10
  skipped, = fakes.events(job, 'restore_skipped')
  assert skipped['step'] == 20 and 'state' in skipped['error']
  aside = layout.unrestorable_dir(job) / 'checkpoint_00000020'
  assert (aside / 'metadata' / 'metadata').exists()
  assert committed(job) == [10]


def test_saving_disabled_preemption_raises_without_saving(job):
  """--enable_checkpoint_saving=false: no interval save, and Preempted at once without a save."""
  ckpt, fake = fakes.wrap(job, interval=10, enable_checkpoint_saving=False)
  ckpt.save_if_needed(10, STATE)
  fakes.preempt()
  with pytest.raises(outcomes.Preempted) as stop:
    ckpt.save_if_needed(11, STATE)
  assert stop.value.step == 11
  assert fake.orbax.attempts == []
  assert kinds(job) == ['preemption']
  assert list(layout.checkpoint_dir(job).iterdir()) == []


def test_continuous_starts_a_save_only_after_the_previous_committed(job):
  """continuous=True, one process: a save at every call once the previous one committed, none while
  one is in flight."""
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(continuous=True), interval=1000)
  assert not ckpt._agree.needed  # pylint: disable=protected-access
  fake.orbax.gate.clear()
  ckpt.save_if_needed(1, STATE)
  ckpt.save_if_needed(2, STATE)  # 1 in flight: no save
  fake.orbax.gate.set()
  ckpt.wait_until_finished()
  fake.orbax.gate.clear()
  ckpt.save_if_needed(3, STATE)
  ckpt.save_if_needed(4, STATE)  # 3 in flight: no save
  fake.orbax.gate.set()
  ckpt.wait_until_finished()
  ckpt.save_if_needed(5, STATE)
  ckpt.wait_until_finished()
  assert fake.orbax.attempts == [1, 3, 5]
  assert [e['reason'] for e in fakes.events(job, 'save_started')] == ['continuous'] * 3
  assert committed(job) == [1, 3, 5]


def test_preservation_policy_failure_deletes_nothing(job, caplog):
  """A preservation policy that raises: logged, nothing deleted, saving goes on."""

  class Broken:

    def should_preserve(self, checkpoints, *, context):
      raise RuntimeError('policy bug')

  ckpt, _ = fakes.wrap(job, settings_lib.Settings(preservation_policy=Broken()), interval=10)
  for step in (10, 20):
    ckpt.save_if_needed(step, STATE)
  ckpt.wait_until_finished()
  assert committed(job) == [10, 20]
  assert fakes.events(job, 'deleted') == []
  assert errors(caplog, 'policy bug')


def test_policy_infos_are_oldest_first(job):
  """The preservation policy sees CheckpointInfo oldest first, with the save start times."""
  seen = []

  class Spy:

    def should_preserve(self, checkpoints, *, context):
      del context
      seen.append(list(checkpoints))
      return [True] * len(checkpoints)

  ckpt, _ = fakes.wrap(job, settings_lib.Settings(preservation_policy=Spy()), interval=10)
  for step in (10, 20):
    ckpt.save_if_needed(step, STATE)
  ckpt.wait_until_finished()
  starts = {e['step']: e['t'] for e in fakes.events(job, 'save_started')}
  assert seen[-1] == [policies.CheckpointInfo(10, starts[10]), policies.CheckpointInfo(20, starts[20])]


def test_a_notice_saves_the_next_step_and_training_goes_on(job):
  """A notice (any host's) -> the next step is saved with reason 'notice' and a `notice` event; no
  exit; a SIGTERM later saves only what was trained since."""
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(notices='off'), interval=1000)
  ckpt.save_if_needed(0, STATE)  # Pax's first save
  ckpt._notices.announce('maintenance-event', 'MIGRATE_ON_HOST_MAINTENANCE')  # pylint: disable=protected-access
  ckpt.save_if_needed(1, STATE)
  ckpt.save_if_needed(2, STATE)
  ckpt.wait_until_finished()
  assert committed(job) == [0, 1]
  notice, = fakes.events(job, 'notice')
  assert (notice['step'], notice['source'], notice['value']) == (1, 'maintenance-event', 'MIGRATE_ON_HOST_MAINTENANCE')
  assert [(e['step'], e['reason']) for e in fakes.events(job, 'save_started')][-1] == (1, 'notice')
  fakes.preempt()
  with pytest.raises(outcomes.Preempted):
    ckpt.save_if_needed(3, STATE)
  assert committed(job) == [0, 1, 3]


def test_notice_action_save_and_exit_exits_once_the_notice_save_commits(job):
  ckpt, _ = fakes.wrap(job, settings_lib.Settings(notices='off', notice_action='save_and_exit'), interval=1000)
  ckpt.save_if_needed(0, STATE)
  ckpt.save_if_needed(1, STATE)
  ckpt.wait_until_finished()
  ckpt._notices.announce('preempted', 'TRUE')  # pylint: disable=protected-access
  with pytest.raises(outcomes.Preempted) as stop:
    ckpt.save_if_needed(2, STATE)
  assert stop.value.step == 2 and committed(job) == [0, 2]
  assert kinds(job)[-3:] == ['notice', 'save_started', 'save_committed']
