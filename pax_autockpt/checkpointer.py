"""Wraps Pax's training checkpointer: saves at the agreed preemption step, tracks commits, applies
the save and preservation policies, and hands the restore to pax_autockpt.restore."""

import itertools
import threading
import time
from typing import Any, Callable

from absl import logging
from etils import epath
import jax

from pax_autockpt import agreement
from pax_autockpt import background_save
from pax_autockpt import buddy
from pax_autockpt import coordination
from pax_autockpt import costs as costs_lib
from pax_autockpt import events as events_lib
from pax_autockpt import exit_path
from pax_autockpt import failures
from pax_autockpt import grace
from pax_autockpt import internals
from pax_autockpt import layout
from pax_autockpt import lineage as lineage_lib
from pax_autockpt import local_restore
from pax_autockpt import local_saves
from pax_autockpt import manifest as manifest_lib
from pax_autockpt import metrics as metrics_lib
from pax_autockpt import notices
from pax_autockpt import outcomes
from pax_autockpt import phases as phases_lib
from pax_autockpt import policies
from pax_autockpt import preemption
from pax_autockpt import rescue as rescue_lib
from pax_autockpt import restore as restore_lib
from pax_autockpt import settings as settings_lib
from pax_autockpt import signals
from pax_autockpt import startup_exit
from pax_autockpt import summaries as summaries_lib

ROUTINE = ('continuous', 'interval')  # save reasons that compete with training: at `background_nice`


class AutockptCheckpointer:
  """Pax's `TrainingCheckpointer` interface around the one paxml built for this run.

  The paxml loop calls `save_if_needed(step)` once per iteration, before the step runs. Here that
  call asks the preemption watcher first (every host, every iteration), saves on preemption at the
  agreed step even off the save interval, waits until the save is committed and raises
  `outcomes.Preempted` (or `SaveFailed`) for the executor to exit. Otherwise the save-decision policy
  (Pax's own interval by default) decides, and after each commit the primary host applies the
  preservation policy. After a signal, pax_autockpt.exit_path decides inside the grace period (a signal
  before the first step exits at once, the agreed step is saved only if a save fits, a watchdog ends the
  process before the deadline), and this class saves. Each committed checkpoint's metrics (`metrics`, fed by
  the executor) go into its `save_committed` event, where a restarted job finds them again.
  """

  def __init__(self, inner: Any, *, settings: settings_lib.Settings, events: events_lib.EventLog,
               exit_after_ondemand_checkpoint: bool, enable_summaries: bool = True,
               metrics: metrics_lib.StepMetrics | None = None, slices: int = 1,
               end: Callable[[outcomes.StopTraining], None] | None = None):
    """`end(stop)`: how the process ends when the exit was taken outside the main thread (pax_autockpt.rescue);
    without it (tests) there is no rescue."""
    self._inner = inner
    self.restore_s: float | None = None  # this run's restore, for the `start` event (None: nothing restored)
    self.phases = phases_lib.LoopPhases()  # where the main thread is: the executor instruments Pax's programs
    self.phases.on_point(self._point)
    self._loop_items: dict[str, Any] = {}  # what save_if_needed got besides the state (the same every step)
    self._saving = internals.saving_enabled(inner)  # --enable_checkpoint_saving=false: Pax's saves are no-ops
    self._summaries = summaries_lib.SaveSummaries(events.job_log_dir,
                                                  enabled=enable_summaries and events.host == 0)
    self._events = events
    self._exit_after_ondemand = exit_after_ondemand_checkpoint
    self._pax_manager = inner.checkpoint_manager  # paxml's OrbaxCheckpointManager
    self._orbax_manager = internals.orbax_manager(inner)
    self._preemption = preemption.PreemptionWatcher()
    internals.route_reached_preemption(self._orbax_manager, self._preemption.is_agreed)
    self._save_policy = settings_lib.save_policy(settings)
    self._adaptive = policies.find(self._save_policy, policies.YoungDalyPolicy)
    continuous = policies.find(self._save_policy, (policies.ContinuousCheckpointingPolicy, policies.YoungDalyPolicy))
    self._save_reason = 'continuous' if settings_lib.continuous(settings) or continuous else 'interval'
    self._step_metrics = metrics
    self._preservation = settings_lib.preservation_policy(settings)
    if self._preservation is not None:
      internals.turn_off_max_to_keep(self._orbax_manager)
    self._agree = agreement.PrimaryDecides(events.host)
    self._notices = notices.NoticeAgreement(events.host, coordination.client(), jax.process_count())
    notices.watch(settings.notices, self._notices.announce)
    self._checksums = settings.checksums
    self._compression = settings.compression
    self._nice = settings.background_nice
    self._use_ocdbt = internals.uses_ocdbt(inner)
    self._background = background_save.BackgroundSaves(
        self._orbax_manager, before_commit=self._write_manifest if settings.checksums else None)
    self._lock = threading.Lock()
    past = events_lib.read(events.job_log_dir, events.host)
    self._times = {e['step']: e['t'] for e in past if e['event'] == 'save_started' and isinstance(e.get('step'), int)}
    self._metrics = metrics_lib.of_committed(past)
    self._costs = costs_lib.SaveCosts.of_committed(past)
    self._logged_interval: float | None = None
    if events.host == 0:
      self._log_interval_change()  # what this job's earlier saves measured
    self._history = [self._info(s) for s in layout.committed_steps(self.checkpoint_dir)]
    self._metrics = {c.step: c.metrics for c in self._history if c.metrics}  # only what preservation may see
    # Object storage: steps whose name a damaged checkpoint still holds (marked in place).
    self._unrestorable = set(layout.marked_unrestorable_steps(self.checkpoint_dir))
    self._free_tries = itertools.count()  # a fresh agreement key for each try at freeing a name
    self.last_step: int | None = inner.step_to_restore
    self.committed_this_run: list[int] = []
    self._first_iteration = True
    self._first_step_due = True  # until the loop's second iteration: this run's first step is done
    self.on_step: Callable[[int], None] | None = None  # each iteration, before its step (goodput recording)
    self._local, local, self._lineage, job = None, None, None, ''
    if settings.local_dir:
      job, local = self._local_tier(settings, events, slices)
    self._saves = lineage_lib.committed_saves(past)  # step -> the ids of its commits (save_committed events)
    self._restorer = restore_lib.Restorer(inner, events=events, checksums=settings.checksums,
                                          retry_secs=settings.restore_retry_secs,
                                          set_aside=self._forget_unrestorable,
                                          restart_input=settings.input_on_host_change == 'restart', local=local,
                                          local_job=job, ever_committed=frozenset(self._saves), saves=self._saves)
    self._exit = exit_path.ExitPath(
        events=events, preemption=self._preemption, background=self._background, costs=self._costs,
        saving=self._saving, exit_after_ondemand=exit_after_ondemand_checkpoint, grace_secs=settings.grace_secs,
        exit_code=settings.exit_code, notice_action=settings.notice_action, save=self._save, step_dir=self._step_dir,
        latest_step=self._latest_step, newest_committed=self.newest_committed,
        committed_this_run=self.committed_this_run, restored_step=lambda: self._inner.step_to_restore,
        last_step=lambda: self.last_step, restorer=self._restorer, phases=self.phases,
        preserve=self._preserve if self._preservation is not None and events.host == 0 else None)
    signals.on_first_signal(self._exit.signal_arrived)
    self._notice_action = settings.notice_action
    if end is not None and exit_after_ondemand_checkpoint and jax.process_count() == 1:
      rescue = rescue_lib.Rescue(phases=self.phases, exit_path=self._exit, agree=self._agreed_elsewhere,
                                 state_of=self._items_with, end=end, grace_secs=settings.grace_secs,
                                 first_step=lambda: self._inner.step_to_restore)
      signals.on_first_signal(rescue.signal_arrived)
    self._startup = None
    if exit_after_ondemand_checkpoint:
      self._startup = startup_exit.StartupExit(coordination.client(), events.host, events,
                                               settings.exit_code, settings.grace_secs, self._nothing_to_save_yet,
                                               self._newest_known, take_over=self._exit.take_over)

  def __getattr__(self, name: str) -> Any:
    return getattr(self._inner, name)

  @property
  def checkpoint_dir(self) -> epath.Path:
    return epath.Path(self._pax_manager.directory)

  def _step_dir(self, step: int) -> epath.Path:
    return layout.step_dir(self.checkpoint_dir, step)

  def reached_preemption(self, step: int) -> bool:
    return self._preemption.is_agreed(step)

  @property
  def save_in_flight(self) -> bool:
    """A bucket or local save still writing from a background thread."""
    return self._background.in_flight or (self._local is not None and self._local.in_flight)

  def newest_committed(self) -> int | None:
    return layout.newest_committed(self.checkpoint_dir)

  # --- restore ---------------------------------------------------------------------------------

  def get_model_states(self, partitioner, metadata, root_prng_key, train_input_pipeline=None):
    """Pax's restore, checked, classified and agreed by every host (pax_autockpt.restore); the local tier
    learns what this run's lineage starts from."""
    began = time.monotonic()
    restored = self._restorer.get_model_states(partitioner, metadata, root_prng_key, train_input_pipeline)
    if self._restorer.restored_from is not None:  # `report` counts it apart from the downtime around it
      self.restore_s = time.monotonic() - began
    if self._lineage is not None:
      step = self._inner.step_to_restore
      if self._restorer.restored_from == 'local':
        self._lineage.restored(step, self._restorer.local_lineage)
        self._local.restored(step)
      elif self._restorer.restored_from == 'bucket':
        self._lineage.restored(step, save=self._saves.get(step, (None,))[-1])  # the save its commit event names
      else:
        self._lineage.restored(None)
    return restored

  def _newest_known(self) -> int | None:
    """The newest checkpoint in the job directory as this run knows it, without asking the storage."""
    return max((s for s in (*self.committed_this_run, self._inner.step_to_restore) if s is not None), default=None)

  def _nothing_to_save_yet(self) -> bool:
    """Before the first step completed (input construction, the listing, the restore, the compile): whether
    the run's state is at most the job directory's newest (a signal then ends the job at once,
    pax_autockpt.startup_exit). Not where the local tier holds, or may hold, a step the job directory lacks:
    with a local tier until its restore ended, then while the restored local step is not in the job
    directory (the first iteration saves it)."""
    return not self._restorer.may_hold_unbacked

  @property
  def verified(self) -> dict[str, int]:
    """How many saved shards of the restored checkpoint this host checked, and how many no host did."""
    return self._restorer.verified

  @property
  def restored_from(self) -> str | None:
    """'bucket' (the job directory), 'local' (the local tier), or None (a fresh start)."""
    return self._restorer.restored_from

  def _write_manifest(self, step: int, directory: epath.Path, items: dict[str, Any]) -> None:
    """In the background save, before the commit: this host's digests of what it writes."""
    del step
    manifest_lib.write(directory, manifest_lib.build(items['state'], use_ocdbt=self._use_ocdbt,
                                                     host=self._events.host))

  def _forget_unrestorable(self, step: int) -> None:
    """After the restore set a damaged checkpoint aside: out of the policies' history; on gs:// its
    name stays taken (marked in place) until a save is due there."""
    if layout.uses_commit_marker(self.checkpoint_dir):
      self._unrestorable.add(step)
    self._forget(step)

  def _forget(self, step: int) -> None:
    """A step that is not (or no longer) a checkpoint leaves the policies' history: a failed save
    counted there would make InitialSavePolicy never save again, and intervals count from it."""
    with self._lock:
      self._history = [c for c in self._history if c.step != step]
      self._times.pop(step, None)

  # --- Pax's loop ------------------------------------------------------------------------------

  def save_if_needed(self, step_i, partitioned_train_state, train_state_unpadded_shape_dtype_struct=None,
                     train_state_pspecs=None, train_input_pipeline=None):
    self.phases.enter(phases_lib.CHECKPOINT)
    if self.on_step is not None:
      self.on_step(step_i)
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
    notice = self._notices.due(self._preemption.iteration)
    if self._preemption.check(step_i) and not self._exit.taken:  # (taken: saved at an eval batch, training on)
      self._exit.on_preemption(step_i, state)
    elif notice is not None:
      self._exit.on_notice(step_i, notice, state)
    elif self._saving and self._wants_save(step_i):
      self._save(step_i, self._save_reason, state)
    if self._local is not None:
      self._local.maybe_save(step_i, partitioned_train_state, train_input_pipeline)
    self.phases.enter(phases_lib.LOOP)

  def _first_step_done(self, step: int) -> None:
    """Once, at the loop's second iteration: from now on a signal takes the agreed-step path; the `first_step`
    event ends the restart's downtime for `report` (its `compile_s`: the first train_step call, which traced and
    compiled the step, or loaded it from the compilation cache)."""
    self._first_step_due = False
    if self._startup is not None:
      self._startup.first_step_done()
    compiled = self.phases.first_train_s
    self._events.write('first_step', step=step, **({} if compiled is None else {'compile_s': round(compiled, 6)}))

  def _agreed_elsewhere(self, step: int) -> None:
    """pax_autockpt.rescue saves `step` from its thread: the step every record of this run names."""
    self.last_step = step
    self._preemption.agree_here(step)

  def _items_with(self, partitioned_train_state: Any) -> dict[str, Any]:
    """The items Pax's loop hands a save, around a trained state."""
    return dict(partitioned_train_state=partitioned_train_state, **self._loop_items)

  def _point(self, phase: str) -> None:
    """An agreement point at an eval or decode batch (pax_autockpt.phases): every host meets XLA's sync point
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
    self.last_step = step_i
    if self._saving and (self._latest_step() is None or self._latest_step() < step_i):
      self._save(step_i, 'final', state)

  def _local_tier(self, settings: settings_lib.Settings, events: events_lib.EventLog,
                  slices: int) -> tuple[str, local_restore.LocalRestore]:
    """The local tier's saves (with buddy copies where asked for and there is another host) and restore;
    returns the job's identity and the restore."""
    folder = layout.local_dir(settings.local_dir, events.host)
    job, run = lineage_lib.identify(events.job_log_dir, events.host)
    self._lineage = lineage_lib.Tracker(job, run)
    hosts, copies = jax.process_count(), None
    if settings.local_buddy and hosts > 1:
      copies = buddy.BuddyCopies(folder, host=events.host, hosts=hosts, slices=slices,
                                 mb_per_sec=settings.local_buddy_mb_per_sec, nice=settings.background_nice,
                                 address=local_restore.own_address(), port=settings.local_peer_port)
    elif settings.local_buddy:
      logging.warning('[autockpt] buddy copies: one host, no other disk to keep a copy on; none made.')
    self._local = local_saves.LocalSaves(folder, min_interval_secs=settings.local_min_interval_secs,
                                         keep=settings.local_keep, events=events, lineage=self._lineage,
                                         on_commit=copies and copies.committed)
    return job, local_restore.LocalRestore(folder, host=events.host, hosts=hosts, peer_port=settings.local_peer_port)

  def wait_until_finished(self):
    self._background.wait()
    if self._local is not None:
      self._local.wait()
    self._inner.wait_until_finished()

  def _latest_step(self) -> int | None:
    return self._pax_manager.latest_step()

  def _info(self, step: int) -> policies.CheckpointInfo:
    """A checkpoint's save time from the event log, else its directory's modification time, and the
    metrics recorded at its commit. Object stores may give no time (0 for a prefix): such a checkpoint
    counts as saved now, so that no time-based policy deletes it as old without evidence."""
    when = self._times.get(step)
    if when is None:
      try:
        when = self._step_dir(step).stat().mtime
      except OSError:
        when = 0.0
      when = when if when and when > 0 else time.time()
    return policies.CheckpointInfo.at(step, when, self._metrics.get(step))

  def _wants_save(self, step: int) -> bool:
    if self._save_policy is None:
      return self._pax_manager.should_save(step)  # Pax's interval: the same on every host
    latest = self._latest_step()
    if latest is not None and step <= latest:
      return False

    def decide():  # on the primary host only (agreement.PrimaryDecides)
      if signals.received() is not None:
        return False  # the agreement on the on-demand step is coming: no save may compete with it for the grace period
      context = policies.DecisionContext(
          is_saving_in_progress=self._background.in_flight, reached_preemption=self.reached_preemption(step),
          save_cost_secs=self._costs.blocking_s, save_duration_secs=self._costs.duration_s)
      with self._lock:
        previous = list(self._history)
      return policies.ask_save(self._save_policy, step, now=time.time(), previous=previous, context=context)

    return self._agree(decide)

  def _adaptive_interval(self) -> float | None:
    """The Young/Daly minimum interval for the costs measured so far (None: not adaptive, not yet)."""
    if self._adaptive is None:
      return None
    return self._adaptive.interval_secs(self._costs.blocking_s, self._costs.duration_s)

  # --- saving ----------------------------------------------------------------------------------

  def _save(self, step: int, reason: str, state: dict[str, Any], last: bool = False,
            deadline: grace.Deadline | None = None) -> None:
    """Starts a save; the loop waits only for this step's state to be copied to host memory
    (`blocking_s`), everything else runs in the background.

    First it waits for the state (with JAX's async dispatch the last step may still be computing: the
    step's cost, not the save's) and for a save still in flight (an on-demand save can come during one,
    waited for no longer than the grace period's `deadline` allows); both are `wait_s`. A `last` save
    (no step runs after it) saves the state without copying it.
    """
    before = time.time()
    jax.block_until_ready(state['partitioned_train_state'])
    if not self._background.wait(grace.time_left(deadline)):  # one save at a time (an on-demand save waits here)
      logging.error('[autockpt] %s save of step %d not started: the save in flight did not commit within the '
                    'grace period.', reason, step)
      return
    start = time.time()
    with self._lock:
      self._times[step] = start
      self._history.append(policies.CheckpointInfo.at(step, start))
    metrics = self._step_metrics.capture(step) if self._step_metrics is not None else None  # by reference
    try:
      self._free_name(step)
      self._background.last_save = last
      self._background.uncompressed = self._compression == 'none' or (self._compression == 'auto' and last)
      self._background.nice = self._nice if reason in ROUTINE else 0  # an on-demand save competes with nothing
      self._inner.save_final(step, **state)  # Pax builds its items; orbax's save() takes the snapshot
    except Exception as e:  # pylint: disable=broad-except
      logging.error('[autockpt] %s save of step %d failed to start (%s); the newest committed checkpoint '
                    'is %s.', reason, step, failures.one_line(e), layout.step_text(self.newest_committed()))
      self._forget(step)
      return
    blocking, nbytes = time.time() - start, self._background.captured_bytes
    save = None  # this save's id (in its events and in local steps' lineage): with the local tier, which needs it
    if self._lineage is not None:
      save = self._lineage.save_id(step)
      self._lineage.save_started(step, save)
    self._background.launch(
        started=lambda s: self._started(s, reason, start, blocking, start - before, save),
        done=lambda s, error: self._done(s, start, error, dict(reason=reason, blocking=blocking, metrics=metrics,
                                                                 nbytes=nbytes, save=save)))

  def _started(self, step: int, reason: str, start: float, blocking: float, waited: float,
               save: str | None = None) -> None:
    """In the background thread, first: the event and scalar that say a save began (with the adaptive
    interval that let a continuous save start, for `report`, and the save's id)."""
    adaptive = {}
    interval = self._adaptive_interval() if reason == 'continuous' else None
    if interval is not None:
      adaptive = dict(interval_s=round(interval, 6), mtbf_hours=self._adaptive.mtbf_hours)
    self._events.write('save_started', t=start, step=step, reason=reason, blocking_s=round(blocking, 6),
                       wait_s=round(waited, 6), nice=background_save.thread_nice(), **adaptive,
                       **({'id': save} if save else {}))
    self._summaries.started(step, start, blocking)
    logging.info('[autockpt] %s save of step %d started (loop blocked %.3f s).', reason, step, blocking)

  def _done(self, step: int, start: float, error: BaseException | None, save: dict[str, Any]) -> None:
    """In the background thread, last: committed (event, scalar, costs, preservation), or failed (one
    line, leftovers removed; training goes on and the next save retries)."""
    if error is None and layout.is_committed(self._step_dir(step)):
      self._committed(step, start, **save)
      return
    logging.error('[autockpt] save of step %d failed to commit (%s); the newest committed checkpoint is %s.', step,
                  failures.one_line(error) if error else 'not committed', layout.step_text(self.newest_committed()))
    self._forget(step)
    if self._lineage is not None:
      self._lineage.save_failed(step)
    if self._events.host == 0:
      self._remove_leftovers(step)

  def _free_name(self, step: int) -> None:
    """Object storage: a damaged checkpoint marked in place still holds this step's name, and orbax
    would delete it to save there. It moves aside now (a copy: the one case that pays it). Where host 0
    cannot move it (storage refusing writes), every host raises: this save does not start, and the
    damaged checkpoint stays where it is."""
    if step not in self._unrestorable:
      return
    error = None
    if self._events.host == 0:
      try:
        aside = layout.move_aside(self._events.job_log_dir, self._step_dir(step))
        logging.warning('[autockpt] step %d is due again: its damaged checkpoint moved to %s.', step, aside)
      except Exception as e:  # pylint: disable=broad-except
        error = f'its damaged checkpoint could not be moved aside: {failures.one_line(e)}'
    error = agreement.first_report(f'{coordination.FREE_NAME}{step}/{next(self._free_tries)}', self._events.host,
                                   error)
    if error is not None:
      raise OSError(error)
    self._unrestorable.discard(step)

  def _committed(self, step: int, start: float, reason: str, blocking: float, metrics: Any, nbytes: int,
                 save: str | None = None) -> None:
    duration = time.time() - start
    values = self._read_metrics(step, metrics)
    self._events.write('save_committed', step=step, duration_s=round(duration, 6), bytes=nbytes,
                       **({'metrics': values} if values else {}), **({'manifest': True} if self._checksums else {}),
                       **({'id': save} if save else {}))
    self.committed_this_run.append(step)
    if self._lineage is not None:
      self._lineage.save_committed(step)
    logging.info('[autockpt] %s save of step %d committed in %.2f s (%.1f MB written by this host).', reason, step,
                 duration, nbytes / 1e6)
    self._summaries.committed(step, duration)
    self._costs.add(reason, blocking, duration)
    if self._events.host == 0:
      self._log_interval_change()
      if self._preservation is not None and signals.received() is None and self._preemption.agreed_step is None:
        self._preserve()  # not after a signal: deletes would only spend the grace period (the next run does them)

  def _read_metrics(self, step: int, captured: Any) -> dict[str, float] | None:
    """The saved step's metrics as floats; a failure to read them only costs BestN its ranking."""
    try:
      values = metrics_lib.floats(captured)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('[autockpt] could not read the metrics of step %d: %s', step, failures.one_line(e))
      return None
    if values and self._preservation is not None:
      self._metrics[step] = values
    return values

  def _log_interval_change(self) -> None:
    """One line when the adaptive interval is first known or moves by more than 10%."""
    interval, before = self._adaptive_interval(), self._logged_interval
    if interval is None or (before is not None and abs(interval - before) <= 0.1 * before):
      return
    self._logged_interval = interval
    logging.info('[autockpt] adaptive save interval %.3f s (Young/Daly for a save cost of %.4f s and an MTBF of '
                 '%g h%s).', interval, self._costs.blocking_s, self._adaptive.mtbf_hours,
                 '' if before is None else f'; was {before:.3f} s')

  def _remove_leftovers(self, step: int) -> None:
    """Never committed, so nothing is lost; left, they would only take the space (and on object
    storage orbax removes them at the next start anyway, so a failure here is only logged)."""
    try:
      for leftover in layout.leftovers(self.checkpoint_dir, step):
        leftover.rmtree()
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('[autockpt] could not remove what the failed save of step %d left: %s', step,
                      failures.one_line(e))

  def _preserve(self) -> None:
    """Deletes what the preservation policy does not keep (primary host, after a commit)."""
    infos = [self._info(s) for s in layout.committed_steps(self.checkpoint_dir)]
    try:
      doomed = policies.to_delete(self._preservation, infos,
                                  context=policies.PreservationContext(now=time.time()),
                                  protected={self.last_step or -1})
    except Exception as e:  # pylint: disable=broad-except
      logging.error('[autockpt] preservation policy %r failed, nothing deleted: %s', self._preservation, e)
      return
    for step in doomed:
      layout.uncommit_and_delete(self._step_dir(step))
      self._forget(step)
      self._metrics.pop(step, None)
      self._events.write('deleted', step=step, policy=repr(self._preservation))
    if doomed:
      logging.info('[autockpt] preservation deleted steps %s', doomed)
