"""Wraps Pax's training checkpointer: Pax's interface, and the wiring around the one paxml built for this run.
The preemption watcher, the notices, the exit path and the local tier meet Pax's loop here; the job
directory's saves belong to pax_autockpt.save.saves, the restore to pax_autockpt.restore.restore."""

import time
from typing import Any, Callable

from etils import epath
import jax

from pax_autockpt import settings as settings_lib
from pax_autockpt.exit import compile_on_exit
from pax_autockpt.exit import exit_path
from pax_autockpt.exit import rescue as rescue_lib
from pax_autockpt.exit import startup_exit
from pax_autockpt.hook import progress
from pax_autockpt.local import lineage as lineage_lib
from pax_autockpt.local import tier as local_tier
from pax_autockpt.restore import restore as restore_lib
from pax_autockpt.save import metrics as metrics_lib
from pax_autockpt.save import saves as saves_lib
from pax_autockpt.shared import coordination
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import internals
from pax_autockpt.shared import phases as phases_lib
from pax_autockpt.shared import stops
from pax_autockpt.shared import summaries as summaries_lib
from pax_autockpt.signals import notices
from pax_autockpt.signals import preemption
from pax_autockpt.signals import signals


class AutockptCheckpointer:
  """Pax's `TrainingCheckpointer` interface around the one paxml built for this run.

  The paxml loop calls `save_if_needed(step)` once per iteration, before the step runs. Here that call asks
  the preemption watcher first (every host, every iteration), saves on preemption at the agreed step even off
  the save interval, waits until the save is committed and raises `stops.Preempted` (or `SaveFailed`) for
  the executor to exit. Otherwise the save-decision policy (Pax's own interval by default) decides, and after
  each commit the primary host applies the preservation policy (pax_autockpt.save.saves). After a signal,
  pax_autockpt.exit.exit_path decides inside the grace period (a signal before the first step exits at once, the
  agreed step is saved only if a save fits, a watchdog ends the process before the deadline), and the saves
  object saves. Each committed checkpoint's metrics (`metrics`, fed by the executor) go into its
  `save_committed` event, where a restarted job finds them again.
  """

  def __init__(self, inner: Any, *, settings: settings_lib.Settings, events: events_lib.EventLog,
               exit_after_ondemand_checkpoint: bool, enable_summaries: bool = True,
               metrics: metrics_lib.StepMetrics | None = None, slices: int = 1,
               end: Callable[[stops.StopTraining], None] | None = None):
    """`end(stop)`: how the process ends when the exit was taken outside the main thread (pax_autockpt.exit.rescue);
    without it (tests) there is no rescue."""
    self._inner = inner
    self.restore_s: float | None = None  # this run's restore, for the `start` event (None: nothing restored)
    self.phases = phases_lib.LoopPhases()  # where the main thread is: the executor instruments Pax's programs
    self.phases.on_point(self._point)
    self._loop_items: dict[str, Any] = {}  # what save_if_needed got besides the state (the same every step)
    self._events = events
    self._exit_after_ondemand = exit_after_ondemand_checkpoint
    self._preemption = preemption.PreemptionWatcher()
    internals.route_reached_preemption(internals.orbax_manager(inner), self._preemption.is_agreed)
    self._notices = notices.NoticeAgreement(events.host, coordination.client(), jax.process_count())
    notices.watch(settings.notices, self._notices.announce)
    self.last_step: int | None = inner.step_to_restore
    self._first_iteration = True
    self.before_first_step: Callable[[int, Any], None] | None = None  # owed eval/decode (the executor's)
    self._first_step_due = True  # until the loop's second iteration: this run's first step is done
    self.on_step: Callable[[int], None] | None = None  # each iteration, before its step (goodput recording)
    self._progress = progress.ProgressMarks(events)
    tier = local_tier.wire(settings, events, slices) if settings.local_dir else None
    self._local, self._lineage = (tier.saves, tier.lineage) if tier else (None, None)
    past = events_lib.read(events.job_log_dir, events.host)
    self._saves = saves_lib.JobDirectorySaves(
        inner, settings=settings, events=events, past=past, preemption=self._preemption, step_metrics=metrics,
        summaries=summaries_lib.SaveSummaries(events.job_log_dir, enabled=enable_summaries and events.host == 0),
        last_step=lambda: self.last_step, lineage=self._lineage)
    self._commit_ids = lineage_lib.committed_saves(past)  # step -> the ids of its commits (save_committed events)
    self._restorer = restore_lib.Restorer(inner, events=events, checksums=settings.checksums,
                                          retry_secs=settings.restore_retry_secs,
                                          set_aside=self._saves.forget_unrestorable,
                                          restart_input=settings.input_on_host_change == 'restart',
                                          local=tier and tier.restore, local_job=tier.job if tier else '',
                                          ever_committed=frozenset(self._commit_ids),
                                          saves=self._commit_ids)
    self._exit = exit_path.ExitPath(
        events=events, preemption=self._preemption, saves=self._saves,
        exit_after_ondemand=exit_after_ondemand_checkpoint, grace_secs=settings.grace_secs,
        exit_code=settings.exit_code, notice_action=settings.notice_action,
        restored_step=lambda: self._inner.step_to_restore, last_step=lambda: self.last_step,
        restorer=self._restorer, phases=self.phases)
    signals.on_first_signal(self._exit.signal_arrived)
    self._notice_action = settings.notice_action
    self._startup = self._exits_outside_the_loop(settings, exit_after_ondemand_checkpoint, end, past)

  def _exits_outside_the_loop(self, settings: settings_lib.Settings, exit_after_ondemand: bool,
                              end: Callable[[stops.StopTraining], None] | None, past: list[dict[str, Any]]
                              ) -> startup_exit.StartupExit | None:
    """The exits a signal may take away from the loop's agreement points: pax_autockpt.exit.rescue's (one host, a
    main thread held elsewhere) and pax_autockpt.exit.startup_exit's (before the first step); returns the latter."""
    if end is not None and exit_after_ondemand and jax.process_count() == 1:
      rescue = rescue_lib.Rescue(phases=self.phases, exit_path=self._exit, agree=self._agreed_elsewhere,
                                 state_of=self._items_with, end=end, grace_secs=settings.grace_secs,
                                 first_step=lambda: self._inner.step_to_restore)
      signals.on_first_signal(rescue.signal_arrived)
    if not exit_after_ondemand:
      return None
    return startup_exit.StartupExit(coordination.client(), self._events.host, self._events, settings.exit_code,
                                    settings.grace_secs, self._nothing_to_save_yet, self._newest_known,
                                    take_over=self._exit.take_over, first_compile=compile_on_exit.FirstCompile(
                                        self.phases, settings.finish_first_compile, past))

  def __getattr__(self, name: str) -> Any:
    return getattr(self._inner, name)

  @property
  def checkpoint_dir(self) -> epath.Path:
    return self._saves.checkpoint_dir

  def reached_preemption(self, step: int) -> bool:
    return self._preemption.is_agreed(step)

  @property
  def save_in_flight(self) -> bool:
    """A job directory or local save still writing from a background thread."""
    return self._saves.background.in_flight or (self._local is not None and self._local.in_flight)

  @property
  def committed_this_run(self) -> list[int]:
    """The steps this run's saves committed to the job directory, oldest first."""
    return self._saves.committed_this_run

  def newest_committed(self) -> int | None:
    """For the exit's lines: storage's answer, or during an outage the newest this process knows of."""
    return self._exit.newest_committed()

  # --- restore ---------------------------------------------------------------------------------

  def get_model_states(self, partitioner, metadata, root_prng_key, train_input_pipeline=None):
    """Pax's restore, checked, classified and agreed by every host (pax_autockpt.restore.restore); the local tier
    learns what this run's lineage starts from."""
    began = time.monotonic()
    restored = self._restorer.get_model_states(partitioner, metadata, root_prng_key, train_input_pipeline)
    if self._restorer.restored_from is not None:  # `report` counts it apart from the downtime around it
      self.restore_s = time.monotonic() - began
    if self._lineage is not None:
      step = self._inner.step_to_restore
      if self._restorer.restored_from == events_lib.LOCAL:
        self._lineage.restored(step, self._restorer.local_lineage)
        self._local.restored(step)
      elif self._restorer.restored_from == events_lib.JOB_DIR:
        self._lineage.restored(step, save=self._restorer.restored_save(step))  # the checkpoint's own id, else its log's
      else:
        self._lineage.restored(None)
    return restored

  def _newest_known(self) -> int | None:
    """The newest checkpoint in the job directory as this run knows it, without asking the storage."""
    return max((s for s in (*self.committed_this_run, self._inner.step_to_restore) if s is not None), default=None)

  def _nothing_to_save_yet(self) -> bool:
    """Before the first step completed (input construction, the listing, the restore, the compile): whether
    the run's state is at most the job directory's newest (a signal then ends the job at once,
    pax_autockpt.exit.startup_exit). Not where the local tier holds, or may hold, a step the job directory lacks:
    with a local tier until its restore ended, then while the restored local step is not in the job
    directory (the first iteration saves it)."""
    return not self._restorer.may_hold_unbacked

  @property
  def verified(self) -> dict[str, int]:
    """How many saved shards of the restored checkpoint this host checked, and how many no host did."""
    return self._restorer.verified

  @property
  def restored_from(self) -> str | None:
    """'job_dir' (the job directory), 'local' (the local tier), or None (a fresh start): the `start` event's
    `restored_from` (pax_autockpt.shared.events.JOB_DIR, LOCAL)."""
    return self._restorer.restored_from

  # --- Pax's loop ------------------------------------------------------------------------------

  def save_if_needed(self, step_i, partitioned_train_state, train_state_unpadded_shape_dtype_struct=None,
                     train_state_pspecs=None, train_input_pipeline=None):
    self.phases.enter(phases_lib.CHECKPOINT)
    signals.reconnect()  # the watcher's wakeup fd and handlers back, where a library reset them to nothing
    if self.on_step is not None:
      self.on_step(step_i)
    self._progress.step(step_i)
    self.last_step = step_i
    self._loop_items = dict(train_state_unpadded_shape_dtype_struct=train_state_unpadded_shape_dtype_struct,
                            train_state_pspecs=train_state_pspecs, train_input_pipeline=train_input_pipeline)
    state = self._items_with(partitioned_train_state)
    if self._first_step_due and not self._first_iteration:
      self._first_step_done(step_i)
    if self._first_iteration:
      self._first_iteration = False
      if self._exit_after_ondemand and self._preemption.signalled_before_training(step_i):
        self._exit.before_training(step_i, state)
      if self.before_first_step is not None:  # the eval or decode the previous run's exit cut at the last step
        self.before_first_step(step_i, partitioned_train_state)
    notice = self._notices.due(self._preemption.iteration)
    if self._preemption.check(step_i) and not self._exit.taken:  # (taken: saved at an eval batch, training on)
      self._exit.on_preemption(step_i, state)
    elif notice is not None:
      self._exit.on_notice(step_i, notice, state)
    elif self._saves.enabled and not self._saved_already(step_i) and self._saves.wants_save(step_i):
      self._saves.save(step_i, self._saves.reason, state)
    if self._local is not None:
      self._local.maybe_save(step_i, partitioned_train_state, train_input_pipeline)
    self.phases.enter(phases_lib.LOOP)

  def _saved_already(self, step: int) -> bool:
    """This step's save started already (an eval batch's preemption save with exit_after_ondemand=false, which
    trains on): a second save of it would fail and drop the committed step from the policy's history."""
    latest = self._saves.latest_step()
    return latest is not None and latest >= step

  def _first_step_done(self, step: int) -> None:
    """Once, at the loop's second iteration: from now on a signal takes the agreed-step path; the `first_step`
    event ends the restart's downtime for `report` (its `compile_s`: the first train_step call, which traced and
    compiled the step, or loaded it from the compilation cache)."""
    self._first_step_due = False
    if self._startup is not None:
      self._startup.first_step_done()
    compiled = self.phases.first_train_s
    self._events.write('first_step', step=step, **({} if compiled is None else {'compile_s': round(compiled, 6)}),
                       **compile_on_exit.counts())

  def _agreed_elsewhere(self, step: int) -> None:
    """pax_autockpt.exit.rescue saves `step` from its thread: the step every record of this run names."""
    self.last_step = step
    self._preemption.agree_here(step)

  def _items_with(self, partitioned_train_state: Any) -> dict[str, Any]:
    """The items Pax's loop hands a save, around a trained state."""
    return dict(partitioned_train_state=partitioned_train_state, **self._loop_items)

  def _point(self, phase: str) -> None:
    """An agreement point at an eval or decode batch (pax_autockpt.shared.phases): every host meets XLA's sync point
    here in the same order, so a preemption agreed here ends the program at the same batch on every host and
    saves the newest trained step (the exit path raises: the eval's metrics are never written). A notice whose
    action is `save_and_exit` does the same; one that trains on waits for the loop's next step."""
    place = self.phases.now()
    self.last_step = place.step
    if self._preemption.agreed_step is None and self._preemption.check(place.step):
      self._exit.on_preemption(place.step, self._items_with(place.state), agreed_during=phase, batch=place.batch)
    elif self._notice_action == 'save_and_exit':
      notice = self._notices.due(self._preemption.iteration)
      if notice is not None:
        self._exit.on_notice(place.step, notice, self._items_with(place.state))

  def save_final(self, step_i, **state):
    """After the loop: a phase the rescue never saves beside (a signal now is answered by this save and the
    normal end, never by pax_autockpt.exit.rescue's second save of the same step and exit of its own); entering it
    waits for the end where the rescue closed the gate first."""
    self.phases.enter(phases_lib.FINISHING)
    self.last_step = step_i
    latest = self._saves.latest_step
    if self._saves.enabled and (latest() is None or latest() < step_i):
      self._saves.save(step_i, 'final', state)

  def wait_until_finished(self):
    self.phases.enter(phases_lib.FINISHING)
    self._saves.background.wait()
    if self._local is not None:
      self._local.wait()
    self._inner.wait_until_finished()
