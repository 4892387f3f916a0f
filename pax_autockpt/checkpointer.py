"""Wraps Pax's training checkpointer: saves at the agreed preemption step, tracks commits, exits."""

import dataclasses
import re
import sys
import threading
import time
from typing import Any

from absl import logging
from etils import epath
import jax
from praxis import py_utils

from pax_autockpt import agreement
from pax_autockpt import events as events_lib
from pax_autockpt import integrity
from pax_autockpt import policies
from pax_autockpt import preemption
from pax_autockpt import settings as settings_lib
from pax_autockpt import summaries as summaries_lib

_COMPLETE = re.compile(r'^checkpoint_(\d{8})$')  # orbax writes a tmp name and renames on commit


def one_line(error: BaseException) -> str:
  return f'{type(error).__name__}: {error}'.splitlines()[0][:300]


def step_dir(checkpoint_dir: epath.Path, step: int) -> epath.Path:
  """Pax's own layout: checkpoint_%08d."""
  return checkpoint_dir / f'checkpoint_{step:08d}'


def complete_steps(checkpoint_dir: epath.Path) -> list[int]:
  if not checkpoint_dir.exists():
    return []
  return sorted(int(m.group(1)) for m in (_COMPLETE.match(p.name) for p in checkpoint_dir.iterdir())
                if m)


class AutockptCheckpointer:
  """Pax's `TrainingCheckpointer` interface around the one paxml built for this run.

  The paxml loop calls `save_if_needed(step)` once per iteration, before the step runs. Here that
  call asks the preemption watcher first (every host, every iteration), saves on preemption at the
  agreed step even off the save interval, waits until the save is committed, writes the event log
  and exits with the configured code. Otherwise the save-decision policy (Pax's own interval by
  default) decides, and after each commit the primary host applies the preservation policy.
  """

  def __init__(self, inner: Any, *, settings: settings_lib.Settings, events: events_lib.EventLog,
               exit_after_ondemand_checkpoint: bool, enable_summaries: bool = True):
    self._inner = inner
    # --enable_checkpoint_saving=false: Pax's saves are no-ops, so neither start nor log any.
    self._saving = getattr(inner, '_enable_checkpoint_saving', True)
    self._summaries = summaries_lib.SaveSummaries(events.job_log_dir,
                                                  enabled=enable_summaries and events.host == 0)
    self._settings = settings
    self._events = events
    self._exit_after_ondemand = exit_after_ondemand_checkpoint
    self._pax_manager = inner.checkpoint_manager  # paxml's OrbaxCheckpointManager
    self._orbax_manager = self._pax_manager._manager  # pylint: disable=protected-access
    self._preemption = preemption.PreemptionWatcher()
    # orbax's save()/should_save() ask reached_preemption(step) on their own; routed to the decision
    # already taken so that XLA's sync counter is only ever fed by the watcher.
    self._orbax_manager.reached_preemption = self._preemption.is_agreed
    self._save_policy = settings_lib.save_policy(settings)
    self._save_reason = 'continuous' if settings.continuous else 'interval'
    self._preservation = settings_lib.preservation_policy(settings)
    if self._preservation is not None:
      # Pax's max_to_keep would delete behind the policy's back (and without events).
      opts = self._orbax_manager._options  # pylint: disable=protected-access
      self._orbax_manager._options = dataclasses.replace(opts, max_to_keep=None)  # pylint: disable=protected-access
    self._agree = agreement.PrimaryDecides(events.host)
    self._lock = threading.Lock()
    self._in_flight: int | None = None
    self._watchers: list[threading.Thread] = []
    self._times = {e['step']: e['t'] for e in events_lib.read(events.job_log_dir, events.host)
                   if e.get('event') == 'save_started' and isinstance(e.get('step'), int)}
    self._history = [self._info(s) for s in complete_steps(self.checkpoint_dir)]
    self.last_step: int | None = inner.step_to_restore

  def __getattr__(self, name: str) -> Any:
    return getattr(self._inner, name)

  @property
  def checkpoint_dir(self) -> epath.Path:
    return epath.Path(self._pax_manager.directory)

  def reached_preemption(self, step: int) -> bool:
    return self._preemption.is_agreed(step)

  def get_model_states(self, partitioner, metadata, root_prng_key, train_input_pipeline=None):
    """Pax's restore, falling back to the next newest complete checkpoint when one is damaged.

    A checkpoint that looks whole but fails to restore may be damaged (a truncated file) or may not
    fit the model any more (a changed config). The first such failure is passed over; a second one
    in a row stops the run instead of moving every checkpoint aside.
    """
    failed_whole = None
    while True:
      step = self._inner.step_to_restore
      found = integrity.problems(step_dir(self.checkpoint_dir, step)) if step is not None else []
      if found:
        self._skip_unrestorable(step, '; '.join(found))
        continue
      try:
        return self._inner.get_model_states(partitioner, metadata, root_prng_key, train_input_pipeline)
      except Exception as e:  # pylint: disable=broad-except
        if step is None:
          raise
        if failed_whole is not None:
          logging.error('[autockpt] checkpoints %d and %d both fail to restore (%s): the model or its '
                        'config probably changed; stopping, nothing more moved aside.', failed_whole,
                        step, one_line(e))
          raise
        failed_whole = step
        self._skip_unrestorable(step, one_line(e))

  def _skip_unrestorable(self, step: int, error: str) -> None:
    """Moves the checkpoint aside (never deletes it) and points Pax at the next newest one."""
    aside = self._events.job_log_dir / 'autockpt' / 'unrestorable' / step_dir(self.checkpoint_dir, step).name
    logging.error('[autockpt] checkpoint %d cannot be restored (%s); moved to %s, trying the next newest.',
                  step, error, aside)
    self._events.write('restore_skipped', step=step, error=error)
    if self._events.host == 0:
      aside.parent.mkdir(parents=True, exist_ok=True)
      if aside.exists():
        aside = aside.with_name(f'{aside.name}.{int(time.time())}')
      step_dir(self.checkpoint_dir, step).rename(aside)
    py_utils.sync_global_devices(f'autockpt:unrestorable:{step}')
    self._orbax_manager.reload()
    self._inner._step_to_restore = self._pax_manager.latest_step()  # pylint: disable=protected-access
    with self._lock:
      self._history = [c for c in self._history if c.step != step]

  def save_if_needed(self, step_i, partitioned_train_state, train_state_unpadded_shape_dtype_struct=None,
                     train_state_pspecs=None, train_input_pipeline=None):
    self.last_step = step_i
    state = dict(partitioned_train_state=partitioned_train_state,
                 train_state_unpadded_shape_dtype_struct=train_state_unpadded_shape_dtype_struct,
                 train_state_pspecs=train_state_pspecs, train_input_pipeline=train_input_pipeline)
    if self._preemption.check(step_i):
      self._on_preemption(step_i, state)
    elif self._saving and self._wants_save(step_i):
      self._save(step_i, self._save_reason, state)

  def save_final(self, step_i, **state):
    self.last_step = step_i
    if self._saving and (self._latest_step() is None or self._latest_step() < step_i):
      self._save(step_i, 'final', state)

  def wait_until_finished(self):
    for t in self._watchers:
      t.join()
    self._inner.wait_until_finished()

  def _latest_step(self) -> int | None:
    return self._pax_manager.latest_step()

  def _info(self, step: int) -> policies.CheckpointInfo:
    """A checkpoint's save time from the event log, else its directory's modification time."""
    when = self._times.get(step)
    if when is None:
      try:
        when = step_dir(self.checkpoint_dir, step).stat().mtime
      except OSError:
        when = 0.0
    return policies.CheckpointInfo(step, when)

  def _wants_save(self, step: int) -> bool:
    if self._save_policy is None:
      return self._pax_manager.should_save(step)  # Pax's interval: the same on every host
    latest = self._latest_step()
    if latest is not None and step <= latest:
      return False
    context = policies.DecisionContext(now=time.time(), is_saving_in_progress=self._in_flight is not None)

    def decide():
      with self._lock:
        previous = list(self._history)
      return bool(self._save_policy.should_save(step, previous, context=context))

    return self._agree(decide)

  def _save(self, step: int, reason: str, state: dict[str, Any]) -> None:
    """Starts a save now (Pax's forced save); the loop is blocked only until it is under way.

    The state is waited for first: with JAX's async dispatch the last step may still be computing,
    and that wait (`wait_s`) is the step's cost, not the save's (`blocking_s`).
    """
    before = time.time()
    jax.block_until_ready(state['partitioned_train_state'])
    start = time.time()
    waited = start - before
    self._settle()  # a failed previous save must not fail this one (orbax raises it here otherwise)
    with self._lock:
      self._in_flight = step
      self._times[step] = start
      self._history.append(policies.CheckpointInfo(step, start))
    try:
      self._inner.save_final(step, **state)
    except Exception as e:  # pylint: disable=broad-except
      # E.g. no space for the temporary directory: this save is lost, training and the newer saves go on.
      logging.error('[autockpt] %s save of step %d failed to start (%s); the newest committed checkpoint '
                    'is %s.', reason, step, one_line(e), self.newest_committed())
      self._settle()
      with self._lock:
        self._in_flight = None
      return
    blocking = time.time() - start
    self._events.write('save_started', t=start, step=step, reason=reason, blocking_s=round(blocking, 6),
                       wait_s=round(waited, 6))
    self._summaries.started(step, start, blocking)
    logging.info('[autockpt] %s save of step %d started (loop blocked %.3f s).', reason, step, blocking)
    self._watch_commit(step, start)
    self._pax_manager.check_for_errors()

  def _watch_commit(self, step: int, start: float) -> None:
    """Logs save_committed once orbax's finalize thread (the async commit) has finished."""
    finalize = getattr(self._orbax_manager, '_finalize_thread', None)

    def watch():
      if finalize is not None:
        # threading.Thread.join, not orbax's join(): that one raises the commit error and clears it,
        # and orbax must still see it to drop the failed step from its list.
        threading.Thread.join(finalize)
      if step_dir(self.checkpoint_dir, step).exists():
        duration = time.time() - start
        self._events.write('save_committed', step=step, duration_s=round(duration, 6))
        self._summaries.committed(step, duration)
        if self._preservation is not None and self._events.host == 0:
          self._preserve()
      else:
        error = getattr(finalize, 'exception', None)
        logging.error('[autockpt] save of step %d failed to commit (%s); the newest committed '
                      'checkpoint is %s.', step, one_line(error) if error else 'no directory',
                      self.newest_committed())
      with self._lock:
        if self._in_flight == step:
          self._in_flight = None

    watcher = threading.Thread(target=watch, name=f'autockpt-commit-{step}', daemon=True)
    watcher.start()
    self._watchers = [t for t in self._watchers if t.is_alive()] + [watcher]

  def newest_committed(self) -> int | None:
    steps = complete_steps(self.checkpoint_dir)
    return steps[-1] if steps else None

  def _settle(self) -> None:
    """Waits for the save in flight; a failed one is dropped (orbax forgets it, its tmp dir goes)."""
    try:
      self.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      failed = self._last_started()
      # Kept in the decision history: a failed attempt still counts for the minimum interval.
      logging.info('[autockpt] dropping the failed save of step %s: %s', failed, one_line(e))
      if self._events.host == 0 and failed is not None:
        for leftover in self.checkpoint_dir.glob(f'{step_dir(self.checkpoint_dir, failed).name}.*'):
          leftover.rmtree()  # never committed, so nothing is lost; it would only take the space

  def _last_started(self) -> int | None:
    return self._history[-1].step if self._history else None

  def _preserve(self) -> None:
    """Deletes what the preservation policy does not keep (primary host, after a commit)."""
    infos = [self._info(s) for s in complete_steps(self.checkpoint_dir)]
    try:
      doomed = policies.to_delete(self._preservation, infos,
                                  context=policies.PreservationContext(now=time.time()),
                                  protected={self.last_step or -1})
    except Exception as e:  # pylint: disable=broad-except
      logging.error('[autockpt] preservation policy %r failed, nothing deleted: %s', self._preservation, e)
      return
    for step in doomed:
      step_dir(self.checkpoint_dir, step).rmtree()
      with self._lock:
        self._history = [c for c in self._history if c.step != step]
      self._events.write('deleted', step=step, policy=repr(self._preservation))
    if doomed:
      logging.info('[autockpt] preservation deleted steps %s', doomed)

  def _on_preemption(self, step: int, state: dict[str, Any]) -> None:
    self._events.write('preemption', step=step, signal=self._preemption.signal_name)
    logging.info('[autockpt] Preemption: every host agreed on step %d.', step)
    if not self._saving:
      logging.warning('[autockpt] --enable_checkpoint_saving=false: no on-demand checkpoint written.')
    elif self._latest_step() is not None and self._latest_step() >= step:
      logging.info('[autockpt] Step %d is already committed; nothing new to save.', step)
    else:
      self._save(step, 'preemption', state)
    if not self._exit_after_ondemand:
      return
    self._settle()
    if self._saving and not step_dir(self.checkpoint_dir, step).exists():
      logging.error('[autockpt] On-demand checkpoint of step %d failed to commit; the newest committed '
                    'checkpoint is %s; exiting 1.', step, self.newest_committed())
      self._events.write('exit', code=1, step=step)
      sys.exit(1)
    code = self._settings.exit_code
    self._events.write('exit', code=code, step=step)
    logging.info('[autockpt] On-demand checkpoint of step %d committed; exiting %d.', step, code)
    sys.exit(code)
