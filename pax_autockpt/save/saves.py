"""The job directory's saves: start, commit or failure, preservation, and what they leave behind.

One object owns everything a save to the job directory changes or reads back, so that the loop
(pax_autockpt.hook.checkpointer) and the exit path (pax_autockpt.exit.exit_path) ask the same owner rather than share
lists and callables: starting a save (waiting for the one in flight, freeing a name a damaged checkpoint holds,
the background thread's events), its commit (`save_committed` with its metrics, the measured costs, the
preservation policy's deletes) or its failure (one line, the leftovers removed), the history the save and
preservation policies see, the steps committed this run, and the step directories.
"""

import dataclasses
import itertools
import threading
import time
from typing import Any, Callable

from absl import logging
from etils import epath
import jax

from pax_autockpt import layout
from pax_autockpt import policies
from pax_autockpt import settings as settings_lib
from pax_autockpt.hosts import agreement
from pax_autockpt.local import lineage as lineage_lib
from pax_autockpt.save import background_save
from pax_autockpt.save import costs as costs_lib
from pax_autockpt.save import metrics as metrics_lib
from pax_autockpt.shared import coordination
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import failures
from pax_autockpt.shared import internals
from pax_autockpt.shared import manifest as manifest_lib
from pax_autockpt.shared import priority
from pax_autockpt.shared import summaries as summaries_lib
from pax_autockpt.signals import grace
from pax_autockpt.signals import preemption as preemption_lib
from pax_autockpt.signals import signals

ROUTINE = ('continuous', 'interval')  # save reasons that compete with training: at `background_nice`


class JobDirectorySaves:
  """One host's saves to the job directory around paxml's checkpointer `inner` (see the module docstring).

  The save policy (Pax's own interval by default) says when a routine save is due (`wants_save`), `save`
  starts one and the background thread commits it; after each commit the primary host applies the
  preservation policy. `past` is this host's event log as the run found it: earlier saves' times,
  metrics and costs.
  """

  def __init__(self, inner: Any, *, settings: settings_lib.Settings, events: events_lib.EventLog,
               past: list[dict[str, Any]], preemption: preemption_lib.PreemptionWatcher,
               summaries: summaries_lib.SaveSummaries, step_metrics: metrics_lib.StepMetrics | None,
               last_step: Callable[[], int | None], lineage: lineage_lib.Tracker | None = None):
    """`last_step()`: the loop's newest step, which preservation never deletes; `lineage`: the local tier's
    tracker (None without a local tier), told of each save's start, commit and failure."""
    self._inner, self._events, self._preemption, self._summaries = inner, events, preemption, summaries
    self._step_metrics, self._last_step, self._lineage = step_metrics, last_step, lineage
    self.enabled = internals.saving_enabled(inner)  # --enable_checkpoint_saving=false: Pax's saves are no-ops
    self._pax_manager, orbax = inner.checkpoint_manager, internals.orbax_manager(inner)  # paxml's, orbax's managers
    self._save_policy = settings_lib.save_policy(settings)
    self._adaptive = policies.find(self._save_policy, policies.YoungDalyPolicy)
    continuous = policies.find(self._save_policy, (policies.ContinuousCheckpointingPolicy, policies.YoungDalyPolicy))
    self.reason = 'continuous' if settings_lib.continuous(settings) or continuous else 'interval'  # a routine save's
    self._preservation = settings_lib.preservation_policy(settings)
    if self._preservation is not None:
      internals.turn_off_max_to_keep(orbax)
    else:  # Pax's max_to_keep deletes: the commit first, as ours (a kill mid-delete leaves nothing committed)
      internals.delete_commit_first(orbax, primary=events.host == 0, deleted=self.forget)
    # "now" for the policies (unix seconds), looked up at each call: tests set it, or patch time.time.
    self.clock: Callable[[], float] = lambda: time.time()
    self._agree = agreement.PrimaryDecides(events.host)
    self._checksums, self._compression, self._nice = settings.checksums, settings.compression, settings.background_nice
    self._use_ocdbt = internals.uses_ocdbt(inner)
    self.background = background_save.BackgroundSaves(
        orbax, before_commit=self._write_manifest if settings.checksums else None)
    self._lock = threading.Lock()
    self._times = {e['step']: e['t'] for e in past if e['event'] == 'save_started' and isinstance(e.get('step'), int)}
    self.costs = costs_lib.SaveCosts.of_committed(past)
    self._logged_interval: float | None = None
    if events.host == 0:
      self._log_interval_change()  # what this job's earlier saves measured
    known = metrics_lib.of_committed(past)
    self._history = [policies.CheckpointInfo.at(s, self._time_of(s), known.get(s))
                     for s in layout.committed_steps(self.checkpoint_dir)]
    # Object storage: steps whose name a damaged checkpoint still holds (marked in place).
    self._unrestorable = set(layout.marked_unrestorable_steps(self.checkpoint_dir))
    self._free_tries = itertools.count()  # a fresh agreement key for each try at freeing a name
    self.committed_this_run: list[int] = []

  # --- the job directory -----------------------------------------------------------------------

  @property
  def checkpoint_dir(self) -> epath.Path:
    return epath.Path(self._pax_manager.directory)

  def step_dir(self, step: int) -> epath.Path:
    return layout.step_dir(self.checkpoint_dir, step)

  def newest_committed(self) -> int | None:
    return layout.newest_committed(self.checkpoint_dir)

  def latest_step(self) -> int | None:
    return self._pax_manager.latest_step()

  @property
  def applies_preservation(self) -> bool:
    """The primary host, with a preservation policy: the one that deletes what the policy does not keep."""
    return self._preservation is not None and self._events.host == 0

  # --- the history the policies see -----------------------------------------------------------

  def _time_of(self, step: int) -> float | None:
    """A checkpoint's save start from the event log, else its commit's time on storage, else None
    (unknown): a time-based policy then keeps it, never dates it "now" or 1970 without evidence."""
    when = self._times.get(step)
    return when if when is not None else storage_time(self.step_dir(step))

  def info(self, step: int) -> policies.CheckpointInfo:
    """A checkpoint's save time and the metrics recorded at its commit, as the policies see them."""
    with self._lock:
      known = next((c for c in self._history if c.step == step), None)
    return policies.CheckpointInfo.at(step, self._time_of(step), known.metrics if known else None)

  def forget_unrestorable(self, step: int) -> None:
    """After the restore set a damaged checkpoint aside: out of the policies' history; on gs:// its
    name stays taken (marked in place) until a save is due there."""
    if layout.uses_commit_marker(self.checkpoint_dir):
      self._unrestorable.add(step)
    self.forget(step)

  def forget(self, step: int) -> None:
    """A step that is not (or no longer) a checkpoint leaves the policies' history: a failed save
    counted there would make InitialSavePolicy never save again, and intervals count from it."""
    with self._lock:
      self._history = [c for c in self._history if c.step != step]
      self._times.pop(step, None)

  def wants_save(self, step: int) -> bool:
    """Whether the save policy asks for a save of `step`: the same answer on every host."""
    if self._save_policy is None:
      return self._pax_manager.should_save(step)  # Pax's interval: the same on every host
    # As orbax's should_save: only after the latest step, the one in flight included (Pax's manager
    # lists it only once the background thread has handed it to orbax).
    latest = max((s for s in (self.latest_step(), self.background.saving_step) if s is not None), default=None)
    if latest is not None and step <= latest:
      return False

    def decide():  # on the primary host only (agreement.PrimaryDecides)
      if signals.received() is not None:
        return False  # the agreement on the on-demand step is coming: no save may compete with it for the grace period
      context = policies.DecisionContext(
          is_saving_in_progress=self.background.in_flight, reached_preemption=self._preemption.is_agreed(step),
          save_cost_secs=self.costs.blocking_s, save_duration_secs=self.costs.duration_s)
      with self._lock:
        previous = list(self._history)
      try:
        return policies.ask_save(self._save_policy, step, now=self.clock(), previous=previous, context=context)
      except Exception as e:  # pylint: disable=broad-except
        logging.log_every_n_seconds(logging.WARNING, '[autockpt] save policy %r failed at step %d, no save: %s', 60,
                                    self._save_policy, step, failures.one_line(e))
        return False  # a policy's bug costs this decision, never the run (it must not reach Pax's loop)

    return self._agree(decide)

  def adaptive_interval(self) -> float | None:
    """The Young/Daly minimum interval for the costs measured so far (None: not adaptive, not yet)."""
    if self._adaptive is None:
      return None
    return self._adaptive.interval_secs(self.costs.blocking_s, self.costs.duration_s)

  def _log_interval_change(self) -> None:
    """One line when the adaptive interval is first known or moves by more than 10%."""
    interval, before = self.adaptive_interval(), self._logged_interval
    if interval is None or (before is not None and abs(interval - before) <= 0.1 * before):
      return
    self._logged_interval = interval
    logging.info('[autockpt] adaptive save interval %.3f s (Young/Daly for a save cost of %.4f s and an MTBF of '
                 '%g h%s).', interval, self.costs.blocking_s, self._adaptive.mtbf_hours,
                 '' if before is None else f'; was {before:.3f} s')

  # --- a save ----------------------------------------------------------------------------------

  def save(self, step: int, reason: str, state: dict[str, Any], last: bool = False,
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
    if not self.background.wait(grace.time_left(deadline)):  # one save at a time (an on-demand save waits here)
      logging.error('[autockpt] %s save of step %d not started: the save in flight did not commit within the '
                    'grace period.', reason, step)
      return
    start = time.time()
    with self._lock:
      self._times[step] = start
      self._history.append(policies.CheckpointInfo.at(step, start))
    metrics = self._step_metrics.capture(step) if self._step_metrics is not None else None  # by reference
    if not self._begin(step, reason, state, last):
      return
    blocking, nbytes = time.time() - start, self.background.captured_bytes
    save = None  # this save's id (in its events and in local steps' lineage): with the local tier, which needs it
    if self._lineage is not None:
      save = self._lineage.save_id(step)
      self._lineage.save_started(step, save)
    self.background.launch(
        started=lambda s: self._started(s, reason, start, blocking, start - before, save),
        done=lambda s, error: self._done(s, start, error, dict(reason=reason, blocking=blocking, metrics=metrics,
                                                                 nbytes=nbytes, save=save)))

  def _begin(self, step: int, reason: str, state: dict[str, Any], last: bool) -> bool:
    """In the loop's thread: Pax builds its items and orbax's save() takes the snapshot. A save that fails
    to start costs one line and its place in the history; training goes on (False)."""
    try:
      self._free_name(step)
      self.background.last_save = last
      self.background.uncompressed = self._compression == 'none' or (self._compression == 'auto' and last)
      self.background.nice = self._nice if reason in ROUTINE else 0  # an on-demand save competes with nothing
      self._inner.save_final(step, **state)  # Pax builds its items; orbax's save() takes the snapshot
    except Exception as e:  # pylint: disable=broad-except
      logging.error('[autockpt] %s save of step %d failed to start (%s); the newest committed checkpoint '
                    'is %s.', reason, step, failures.one_line(e), layout.step_text(self.newest_committed()))
      self.forget(step)
      return False
    return True

  def _write_manifest(self, step: int, directory: epath.Path, items: dict[str, Any]) -> None:
    """In the background save, before the commit: this host's digests of what it writes, and the save's id
    with a local tier (the checkpoint's own record of which save it is: pax_autockpt.local.lineage)."""
    manifest_lib.write(directory, manifest_lib.build(
        items['state'], use_ocdbt=self._use_ocdbt, host=self._events.host,
        save=self._lineage.save_id(step) if self._lineage is not None else None))

  def _started(self, step: int, reason: str, start: float, blocking: float, waited: float,
               save: str | None = None) -> None:
    """In the background thread, first: the event and scalar that say a save began (with the adaptive
    interval that let a continuous save start, for `report`, and the save's id and the earlier runs whose line
    it carries on, `handed`, and its base's save id, `base`: a rollback of it discards the local steps of that
    whole line, pax_autockpt.local.lineage)."""
    grew = self._lineage.at(step) if self._lineage is not None and save else None
    line = {'handed': [list(h) for h in grew.handed], 'base': grew.base_id} if grew is not None else {}
    adaptive = {}
    interval = self.adaptive_interval() if reason == 'continuous' else None
    if interval is not None:
      adaptive = dict(interval_s=round(interval, 6), mtbf_hours=self._adaptive.mtbf_hours)
    self._events.write('save_started', t=start, step=step, reason=reason, blocking_s=round(blocking, 6),
                       wait_s=round(waited, 6), nice=priority.thread_nice(), **adaptive,
                       **({'id': save} if save else {}), **{k: v for k, v in line.items() if v})
    self._summaries.started(step, start, blocking)
    logging.info('[autockpt] %s save of step %d started (loop blocked %.3f s).', reason, step, blocking)

  def _done(self, step: int, start: float, error: BaseException | None, save: dict[str, Any]) -> None:
    """In the background thread, last: committed (event, scalar, costs, preservation), or failed (one
    line, leftovers removed; training goes on and the next save retries)."""
    if error is None and layout.is_committed(self.step_dir(step)):
      self._committed(step, start, **save)
      return
    logging.error('[autockpt] save of step %d failed to commit (%s); the newest committed checkpoint is %s.', step,
                  failures.one_line(error) if error else 'not committed', layout.step_text(self.newest_committed()))
    self.forget(step)
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
        aside = layout.move_aside(self._events.job_log_dir, self.step_dir(step))
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
                       **({'metrics': metrics_lib.for_event(values)} if values else {}),
                       **({'manifest': True} if self._checksums else {}),
                       **({'id': save} if save else {}))
    self.committed_this_run.append(step)
    if self._lineage is not None:
      self._lineage.save_committed(step)
    logging.info('[autockpt] %s save of step %d committed in %.2f s (%.1f MB written by this host).', reason, step,
                 duration, nbytes / 1e6)
    self._summaries.committed(step, duration)
    self.costs.add(reason, blocking, duration)
    if self._events.host == 0:
      self._log_interval_change()
      if self._preservation is not None and signals.received() is None and self._preemption.agreed_step is None:
        self.preserve()  # not after a signal: deletes would only spend the grace period (the next run does them)

  def _read_metrics(self, step: int, captured: Any) -> dict[str, float] | None:
    """The saved step's metrics as floats; a failure to read them only costs BestN its ranking."""
    try:
      values = metrics_lib.floats(captured)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('[autockpt] could not read the metrics of step %d: %s', step, failures.one_line(e))
      return None
    if values:
      with self._lock:  # the entry made at the save's start now carries them, for both kinds of policy
        self._history = [dataclasses.replace(c, metrics=values) if c.step == step else c for c in self._history]
    return values

  def _remove_leftovers(self, step: int) -> None:
    """Never committed, so nothing is lost; left, they would only take the space (and on object
    storage orbax removes them at the next start anyway, so a failure here is only logged)."""
    try:
      for leftover in layout.leftovers(self.checkpoint_dir, step):
        leftover.rmtree()
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('[autockpt] could not remove what the failed save of step %d left: %s', step,
                      failures.one_line(e))

  # --- preservation ----------------------------------------------------------------------------

  def preserve(self) -> None:
    """Deletes what the preservation policy does not keep (primary host, after a commit)."""
    infos = [self.info(s) for s in layout.committed_steps(self.checkpoint_dir)]
    try:
      doomed = policies.to_delete(self._preservation, infos,
                                  context=policies.PreservationContext(now=policies.utc(self.clock())),
                                  protected={self._last_step() or -1})
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('[autockpt] preservation policy %r failed, nothing deleted: %s', self._preservation,
                      failures.one_line(e))
      return
    for step in doomed:
      save = manifest_lib.save_id(self.step_dir(step)) or ''  # which save it was: '' for none known (a tool's)
      try:
        layout.uncommit_and_delete(self.step_dir(step))
      except Exception as e:  # pylint: disable=broad-except
        logging.warning('[autockpt] could not delete step %d (the next commit retries): %s', step, failures.one_line(e))
        continue
      self.forget(step)
      self._events.write('deleted', step=step, policy=repr(self._preservation), id=save)
    if doomed:
      logging.info('[autockpt] preservation deleted steps %s', doomed)


def storage_time(path: epath.Path) -> float | None:
  """When storage says a committed checkpoint was made, else None. On gs:// a checkpoint is a name prefix
  with no time of its own (mtime 0), so its commit marker object's time is read; elsewhere the directory's."""
  target = path / layout.COMMIT_MARKER if layout.uses_commit_marker(path) else path
  try:
    when = target.stat().mtime
  except Exception:  # pylint: disable=broad-except
    return None  # an outage or a vanished step: unknown, so kept
  return when if when and when > 0 else None
