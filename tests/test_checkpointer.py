"""AutockptCheckpointer around a fake Pax checkpointer (tests/fakes.py): no training process."""

import datetime
import errno
import json
import logging
import threading
import time
from unittest import mock

from jax import numpy as jnp
import pytest

from pax_autockpt import layout
from pax_autockpt import policies
from pax_autockpt import settings as settings_lib
from pax_autockpt.save import metrics as metrics_lib
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import stops
from tests import fakes
from tests import test_policies
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
  with pytest.raises(stops.Preempted) as stop:
    ckpt.save_if_needed(3, STATE)
  assert committed(job) == [3]  # at the moment Preempted was raised
  assert stop.value.step == 3
  assert fake.orbax.attempts == [3]
  assert kinds(job) == ['first_step', 'preemption', 'save_started', 'save_committed']  # first_step: at 2
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
  with pytest.raises(stops.SaveFailed) as stop:
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


@pytest.mark.parametrize('failure', ['commit', 'start'])
def test_a_failed_save_leaves_the_policies_history(job, failure):
  """InitialSavePolicy saves while no checkpoint exists: a first save that failed must not count as
  one, or the job would never save again."""
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(save_policy=policies.InitialSavePolicy()), interval=1000)
  setattr(fake.orbax, f'fail_{failure}', OSError('disk write failed'))
  ckpt.save_if_needed(1, STATE)
  ckpt.wait_until_finished()
  setattr(fake.orbax, f'fail_{failure}', None)
  ckpt.save_if_needed(2, STATE)
  ckpt.wait_until_finished()
  assert fake.orbax.attempts == [1, 2] and committed(job) == [2]


def test_a_checkpoint_without_a_time_has_an_unknown_time(job, monkeypatch):
  """Object stores may report a prefix's modification time as 0: unknown (kept by the time-based policies,
  tests/test_policies_product.py), never dated "now" or 1970."""
  fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), 10))
  ckpt, _ = fakes.wrap(job)
  monkeypatch.setattr(type(layout.checkpoint_dir(job)), 'stat', lambda self: mock.Mock(mtime=0))
  assert ckpt._saves.info(10).time is None  # pylint: disable=protected-access


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


def test_the_exit_leaves_the_job_directory_as_the_preservation_policy_allows(job):
  """keep_latest=2 and a signal during a routine save (its commit skips the deletes, as every commit after a
  signal does): the exit's on-demand commit is followed by the policy once more, so the job directory the exit
  leaves holds the newest two, not three."""
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(keep_latest=2), interval=10)
  for step in range(10, 31):
    ckpt.save_if_needed(step, STATE)
  ckpt.wait_until_finished()
  fake.orbax.gate.clear()  # the save of 40 is in flight when the signal comes
  for step in range(31, 41):
    ckpt.save_if_needed(step, STATE)
  fakes.preempt()
  fake.orbax.gate.set()
  with pytest.raises(stops.Preempted):
    ckpt.save_if_needed(41, STATE)
  assert committed(job) == [40, 41]
  assert [e['step'] for e in fakes.events(job, 'deleted')] == [10, 20, 30]


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
  assert ckpt.get_model_states(None, None, None)[2] == 10
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
  with pytest.raises(stops.Preempted) as stop:
    ckpt.save_if_needed(11, STATE)
  assert stop.value.step == 11
  assert fake.orbax.attempts == []
  assert kinds(job) == ['first_step', 'preemption']
  assert list(layout.checkpoint_dir(job).iterdir()) == []


def test_continuous_starts_a_save_only_after_the_previous_committed(job):
  """continuous=True, one process: a save at every call once the previous one committed, none while
  one is in flight."""
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(continuous=True), interval=1000)
  assert not ckpt._saves._agree.needed  # pylint: disable=protected-access
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
  assert [r for r in caplog.records if r.levelno == logging.WARNING and 'policy bug' in r.getMessage()]


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
  assert seen[-1] == [policies.CheckpointInfo.at(10, starts[10]), policies.CheckpointInfo.at(20, starts[20])]


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
  with pytest.raises(stops.Preempted):
    ckpt.save_if_needed(3, STATE)
  assert committed(job) == [0, 1, 3]


def test_notice_action_save_and_exit_exits_once_the_notice_save_commits(job):
  ckpt, _ = fakes.wrap(job, settings_lib.Settings(notices='off', notice_action='save_and_exit'), interval=1000)
  ckpt.save_if_needed(0, STATE)
  ckpt.save_if_needed(1, STATE)
  ckpt.wait_until_finished()
  ckpt._notices.announce('preempted', 'TRUE')  # pylint: disable=protected-access
  with pytest.raises(stops.Preempted) as stop:
    ckpt.save_if_needed(2, STATE)
  assert stop.value.step == 2 and committed(job) == [0, 2]
  assert kinds(job)[-3:] == ['notice', 'save_started', 'save_committed']


def test_first_step_is_logged_once_per_run_with_the_first_train_step_s_compile(job):
  """At the loop's second iteration (report's end of a restart's downtime), once per run: `compile_s` is the first
  train_step call's (pax_autockpt.shared.phases), which later steps do not change."""
  for run in range(2):  # a restart: a new checkpointer, its own first step
    ckpt, _ = fakes.wrap(job, interval=1000)
    for step in range(10 * run, 10 * run + 4):
      ckpt.save_if_needed(step, STATE)
      ckpt.phases.enter('train')  # as the instrumented train_step: its call compiles the step the first time
      time.sleep(0.05 if step == 10 * run else 0.0)
      ckpt.phases.trained(step + 1, STATE)
    ckpt.wait_until_finished()
    firsts = fakes.events(job, 'first_step')
    assert [e['step'] for e in firsts] == [1, 11][:run + 1]
    assert 0.05 <= firsts[-1]['compile_s'] < 1.0


def train_with_losses(ckpt, step_metrics, losses):
  """Pax's loop as the checkpointer sees it: each step's train output (the loss as a device array, a
  weighted scalar) recorded for that step, then save_if_needed."""
  for step, loss in losses.items():
    step_metrics.train_output(step, jnp.float32(loss), {'log_pplx': (jnp.float32(loss / 2), jnp.float32(1.0))})
    ckpt.save_if_needed(step, STATE)
  ckpt.wait_until_finished()


def test_best_n_keeps_the_lowest_loss_and_a_restart_still_knows_the_metrics(job):
  """keep_best=2 by train/loss: the metrics of each saved step go into its save_committed event; after a
  restart (a new checkpointer, no metrics in memory) BestN still ranks the old checkpoints by them."""
  settings = settings_lib.Settings(keep_best=2)
  step_metrics = metrics_lib.StepMetrics()
  ckpt, _ = fakes.wrap(job, settings, metrics=step_metrics, interval=10)
  train_with_losses(ckpt, step_metrics, {10: 3.0, 20: 1.0, 30: 2.0, 40: 0.5, 50: 4.0})
  assert committed(job) == [20, 40, 50]  # the best two, and the newest (never deleted)
  recorded = {e['step']: e['metrics'] for e in fakes.events(job, 'save_committed')}
  assert recorded[20] == {'train/loss': 1.0, 'train/log_pplx': 0.5}
  assert [e['step'] for e in fakes.events(job, 'deleted')] == [10, 30]
  assert 'BestN' in fakes.events(job, 'deleted')[0]['policy']

  restarted, _ = fakes.wrap(job, settings, metrics=metrics_lib.StepMetrics(), interval=10)
  restarted.save_if_needed(50, STATE)  # the restored step: not saved again
  restarted.save_if_needed(60, STATE)  # no train output recorded for it: a checkpoint without metrics
  restarted.wait_until_finished()
  assert committed(job) == [20, 40, 60]  # 50's loss (4.0) known from the log; 60 kept: no metrics
  assert 'metrics' not in fakes.events(job, 'save_committed')[-1]
  step_metrics = metrics_lib.StepMetrics()
  again, _ = fakes.wrap(job, settings, metrics=step_metrics, interval=10)
  train_with_losses(again, step_metrics, {70: 0.7})
  assert committed(job) == [40, 60, 70]  # 20's loss (1.0) ranked from the log


def test_orbax_written_policies_run_unchanged_through_the_checkpointer(job):
  """The orbax-shaped policies of tests/test_policies.py, as AUTOCKPT_*_POLICY objects."""
  settings = settings_lib.Settings(
      save_policy=test_policies.SaveEveryDurationUnlessPreempted(minimum_interval=datetime.timedelta(0)),
      preservation_policy=test_policies.CustomizedPreservationPolicy())
  assert settings_lib.validate(settings, {}) is None
  step_metrics = metrics_lib.StepMetrics()
  ckpt, fake = fakes.wrap(job, settings, metrics=step_metrics, interval=1000)
  for step, loss in {100: 2.0, 150: 1.0, 170: 3.0, 200: 5.0, 230: 4.0}.items():
    step_metrics.train_output(step, jnp.float32(loss), {})
    ckpt.save_if_needed(step, STATE)
    ckpt.wait_until_finished()  # not in progress at the next step: it saves each time
  assert fake.orbax.attempts == [100, 150, 170, 200, 230]
  # Kept: multiples of 200, a loss below 1.5, the newest; orbax's CheckpointInfo.metrics is a dict.
  assert committed(job) == [150, 200, 230]


def test_preemption_policy_is_accepted_and_the_agreed_step_is_saved(job):
  """PreemptionCheckpointingPolicy in an orbax-style AnySavePolicy: the preemption saves the agreed step
  off the interval (here that happens whatever the policy says), and the other member still decides."""
  policy = policies.AnySavePolicy([policies.FixedIntervalPolicy(10), policies.PreemptionCheckpointingPolicy()])
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(save_policy=policy), interval=1000)
  for step in range(10, 13):
    ckpt.save_if_needed(step, STATE)
  fakes.preempt()
  with pytest.raises(stops.Preempted):
    ckpt.save_if_needed(13, STATE)
  assert fake.orbax.attempts == [10, 13]
  assert [e['reason'] for e in fakes.events(job, 'save_started')] == ['interval', 'preemption']


def earlier_run(job, saves, now):
  """A previous run's committed checkpoints and their events: (step, seconds before now, blocking_s,
  duration_s)."""
  log = events_lib.EventLog(job, 0)
  for step, ago, blocking, duration in saves:
    fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), step))
    log.write('save_started', t=now - ago, step=step, reason='continuous', blocking_s=blocking, wait_s=0.0)
    log.write('save_committed', t=now - ago + duration, step=step, duration_s=duration)


def test_adaptive_interval_is_young_daly_for_the_cost_measured_so_far(job, caplog):
  """mtbf_hours=1 after saves that blocked 0.5 s: the interval is sqrt(2 * 0.5 * 3600) = 60 s. The
  decision context carries the measured costs; save_started records the interval; one log line."""
  caplog.set_level(logging.INFO)
  now = time.time()
  earlier_run(job, [(10, 200.0, 0.4, 1.0), (20, 45.0, 0.6, 2.0)], now)
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(mtbf_hours=1.0), interval=1000)
  assert ckpt._saves.adaptive_interval() == pytest.approx(60.0)  # pylint: disable=protected-access
  ckpt.save_if_needed(21, STATE)  # 45 s after the last save started: too early
  assert fake.orbax.attempts == []
  with mock.patch.object(time, 'time', return_value=now + 15.1):
    ckpt.save_if_needed(22, STATE)  # 60.1 s after it
  ckpt.wait_until_finished()
  assert fake.orbax.attempts == [22]
  started = fakes.events(job, 'save_started')[-1]
  assert (started['reason'], started['interval_s'], started['mtbf_hours']) == ('continuous', 60.0, 1.0)
  lines = [r.getMessage() for r in caplog.records if 'adaptive save interval' in r.getMessage()]
  # At start, from the earlier run; then the fast save (~1 ms) brought the mean cost from 0.5 to ~0.33 s.
  assert len(lines) == 2 and 'MTBF of 1 h' in lines[0] and 'was 60.000 s' in lines[1], lines
  assert ckpt._saves.adaptive_interval() == pytest.approx(49.0, rel=0.01)  # pylint: disable=protected-access


def test_adaptive_interval_change_over_10_percent_is_logged_again(job, caplog):
  caplog.set_level(logging.INFO)
  earlier_run(job, [(10, 100.0, 0.5, 1.0)], time.time())
  ckpt, _ = fakes.wrap(job, settings_lib.Settings(mtbf_hours=1.0), interval=1000)
  for step in (11, 12, 13):  # each fake save blocks ~1 ms: the mean cost drops to 1/2, 1/3, 1/4
    with mock.patch.object(time, 'time', return_value=time.time() + 1000.0 * step):
      ckpt.save_if_needed(step, STATE)
    ckpt.wait_until_finished()
  lines = [r.getMessage() for r in caplog.records if 'adaptive save interval' in r.getMessage()]
  # 60 s at start, then ~42, ~35, ~30 s: each more than 10% from the last one logged.
  assert len(lines) == 4 and 'was 60.000 s' in lines[1], lines


def _saved(job, steps, settings=None):
  """A job with these steps saved through the wrapper (manifests included), then a fresh wrapper."""
  ckpt, _ = fakes.wrap(job, settings or settings_lib.Settings(notices='off'), interval=10)
  for step in steps:
    ckpt.save_if_needed(step, STATE)
  ckpt.wait_until_finished()
  return fakes.wrap(job, settings or settings_lib.Settings(notices='off'), interval=10)


def test_a_restore_matching_its_manifest_is_used(job, caplog):
  caplog.set_level('INFO')
  ckpt, fake = _saved(job, (10, 20))
  manifest = json.loads(layout.manifest_path(layout.step_dir(layout.checkpoint_dir(job), 20), 0).read_text())
  assert set(manifest['arrays']) == {'step', 'mdl_vars.w', 'opt_states_0.m'}  # Pax's on-disk names
  assert ckpt.get_model_states(None, None, None)[2] == 20 and fake.restored == [20]
  assert '3 shards of 3 arrays checked against the manifest' in caplog.text


def test_a_restored_array_that_differs_from_its_manifest_is_skipped(job):
  """One flipped value in the newest checkpoint's arrays: restore_skipped naming the array and shard,
  set aside, the next newest restored."""
  ckpt, fake = _saved(job, (10, 20))
  fake.restored_states[20] = STATE.replace(mdl_vars={'w': STATE.mdl_vars['w'].at[2].set(7.0)})
  assert ckpt.get_model_states(None, None, None)[2] == 10 and fake.restored == [20, 10]
  skipped, = fakes.events(job, 'restore_skipped')
  assert skipped['step'] == 20 and 'mdl_vars.w shard [0:4] does not match the manifest' in skipped['error']
  assert (layout.unrestorable_dir(job) / 'checkpoint_00000020' / 'state').is_dir()


def test_a_damaged_manifest_makes_its_checkpoint_damaged(job):
  ckpt, fake = _saved(job, (10, 20))
  layout.manifest_path(layout.step_dir(layout.checkpoint_dir(job), 20), 0).write_text('{"format": 1, "ha')
  assert ckpt.get_model_states(None, None, None)[2] == 10 and fake.restored == [20, 10]
  assert 'manifest: host0.json is damaged' in fakes.events(job, 'restore_skipped')[0]['error']


def test_a_checkpoint_without_manifest_restores_unverified_with_one_line(job, caplog):
  caplog.set_level('INFO')
  ckpt, fake = _saved(job, (10,), settings_lib.Settings(notices='off', checksums=False))
  assert not layout.manifest_dir(layout.step_dir(layout.checkpoint_dir(job), 10)).exists()
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(notices='off'), interval=10)
  assert ckpt.get_model_states(None, None, None)[2] == 10 and fake.restored == [10]
  assert caplog.text.count('has no content manifest') == 1


def test_a_damaged_name_that_cannot_be_moved_aside_fails_the_save_and_stays(job, caplog):
  """Object storage: the agreed step's name is held by a damaged checkpoint marked in place, and the
  storage refuses the copy that frees it. The on-demand save does not start (orbax would write over
  it): SaveFailed naming the newest committed step, not a traceback; the damaged one is untouched."""
  ckpt, fake = fakes.wrap(job, interval=10)
  ckpt.save_if_needed(10, STATE)
  ckpt.wait_until_finished()
  damaged = fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), 13).with_name('x'))
  ckpt._saves._unrestorable.add(13)  # pylint: disable=protected-access  (as marked_unrestorable_steps finds it)
  fakes.preempt()
  with mock.patch.object(layout, 'move_aside', side_effect=OSError('HTTP 403 injected')) as move:
    with pytest.raises(stops.SaveFailed) as stop:
      ckpt.save_if_needed(13, STATE)
  move.assert_called_once()
  assert 'step 13' in str(stop.value) and 'the newest committed checkpoint is 10' in str(stop.value)
  assert errors(caplog, 'preemption save of step 13 failed to start (OSError: its damaged checkpoint could '
                'not be moved aside: OSError: HTTP 403 injected)')
  assert fake.orbax.attempts == [10] and committed(job) == [10] and damaged.exists()
