"""The exit path after a preemption signal or a notice: plan, save, wait for the commit, exit.

A SIGTERM starts the grace budget (`--autockpt_grace_secs`, from the signal's arrival): a watchdog ends the
process before it runs out. At the agreed step the primary host plans (pax_autockpt.signals.grace: save this step,
keep the save in flight, or give up), every host follows, the save commits within the budget, and
`stops.Preempted` (or `SaveFailed`) goes to the executor, which decides the exit code. A signal before the
first step exits with nothing to save, unless the restored state is a local step the job directory lacks:
then it is saved first. Notices save (and, with `save_and_exit`, exit) the same way.

pax_autockpt.save.saves owns the job directory's saves; this class owns the decisions around them and asks that
object for the saves it decides on, and for what committed.
"""

import dataclasses
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

from absl import logging

from pax_autockpt import layout
from pax_autockpt.hosts import agreement
from pax_autockpt.save import saves as saves_lib
from pax_autockpt.shared import coordination
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import failures
from pax_autockpt.shared import phases as phases_lib
from pax_autockpt.shared import stops
from pax_autockpt.signals import console
from pax_autockpt.signals import grace
from pax_autockpt.signals import notices
from pax_autockpt.signals import preemption as preemption_lib
from pax_autockpt.signals import signals


class ExitPath:
  """One host's exit decisions (see the module docstring)."""

  def __init__(self, *, events: events_lib.EventLog, preemption: preemption_lib.PreemptionWatcher,
               saves: saves_lib.JobDirectorySaves, exit_after_ondemand: bool, grace_secs: float, exit_code: int,
               notice_action: str, restored_step: Callable[[], int | None], last_step: Callable[[], int | None],
               restorer: Any, phases: phases_lib.LoopPhases | None = None):
    """`saves`: the job directory's (it starts the exit's save, knows what committed this run, and, on the
    primary host with a preservation policy, runs the policy's deletes once more before the exit); `restorer`
    tells whether the restored state is a local step the job directory lacks (`unbacked_step`,
    `local_agreed_newest`); `phases`, where the loop's main thread is (pax_autockpt.shared.phases): the phase a signal
    found goes into the `preemption` event."""
    self._events, self._preemption, self._saves = events, preemption, saves
    self._background, self._costs = saves.background, saves.costs
    self._exit_after_ondemand = exit_after_ondemand
    self._grace_secs, self._exit_code, self._notice_action = grace_secs, exit_code, notice_action
    self._restored_step, self._last_step = restored_step, last_step
    self._restorer = restorer
    self._watchdog = grace.Watchdog(self._out_of_time)
    self._exit_step: int | None = None  # the step whose commit the exit path waits for
    self._phases = phases or phases_lib.LoopPhases()
    self._found: phases_lib.Place | None = None  # where the signal found the main thread, on this host
    self._arrival: tuple[int, float] | None = None  # the signal this host got, and when
    self._owner_lock = threading.Lock()
    self._owner: int | None = None  # the thread that took the exit (the main thread's, or pax_autockpt.exit.rescue's)

  def signal_arrived(self, signum: int, arrival: float) -> None:
    """A SIGTERM or Ctrl-C came to this host (any thread): from now on the process ends before the grace period
    does. A Ctrl-C has no scheduler behind it, so its save is not planned against a deadline (`_deadline`), but a
    person waiting is not kept longer either: a peer that never comes back ends in the watchdog's one line."""
    self._found = self._phases.now()
    self._arrival = (signum, arrival)
    self._watchdog.arm(grace.Deadline(arrival, self._grace_secs))

  def _received(self) -> tuple[int, float] | None:
    return self._arrival or signals.received()

  def _deadline(self) -> grace.Deadline | None:
    """At the agreed step, this host's own view of the grace period's end (armed): from its own SIGTERM, else
    from now, a bound (every host's deadline is at most a grace period after it learned of the signal); None
    for Ctrl-C. The exit plan then keeps every host to the earliest of the hosts' (`_agreed_exit_plan`)."""
    if self._preemption.signal_name != signal.SIGTERM.name:
      return None
    got = self._received()
    if got is not None and got[0] == signal.SIGTERM:
      deadline = grace.Deadline(got[1], self._grace_secs)
    else:
      deadline = grace.Deadline(time.time(), self._grace_secs, seen_here=False)
    self._watchdog.arm(deadline)
    return deadline

  def _signal_fields(self, deadline: grace.Deadline | None, agreed_during: str = phases_lib.CHECKPOINT
                     ) -> dict[str, Any]:
    """For the `preemption` event: when the signal came to this host (None: it did not), the grace, the phase
    the signal found here (`during`; where it did not come here, the phase the hosts agreed in), where they
    agreed (`agreed_during`: the loop's checkpointer call, an eval or decode batch, or `rescue`) and how long
    the phase held the exit up (`phase_s`, from the signal to the agreement)."""
    got = self._received()
    found = self._found if got else None
    fields = {'signal_at': round(got[1], 6) if got else None,
              'during': found.phase if found else agreed_during, 'agreed_during': agreed_during}
    if got:
      fields['phase_s'] = round(max(0.0, time.time() - got[1]), 6)
    if deadline is not None:
      fields['grace_s'] = self._grace_secs
    return fields

  def take_over(self) -> bool:
    """The first thread to take the exit owns it (the main thread at an agreement point, or
    pax_autockpt.exit.rescue's): True for it, False for any other."""
    with self._owner_lock:
      if self._owner is None:
        self._owner = threading.get_ident()
      return self._owner == threading.get_ident()

  def release(self) -> None:
    """The owner gives the exit back (pax_autockpt.exit.rescue, when the main thread moved on before the gate
    closed)."""
    with self._owner_lock:
      if self._owner == threading.get_ident():
        self._owner = None

  @property
  def taken(self) -> bool:
    return self._owner is not None

  def take_over_or_wait(self) -> None:
    """Another thread took the exit (its save is running): this one waits for it to end the process."""
    if not self.take_over():
      threading.Event().wait()

  def before_training(self, step: int, state: dict[str, Any]) -> None:
    """A signal during start-up or the restore: nothing trained since the checkpoint just restored (or
    nothing at all), so nothing to save; every host exits now, before the first step compiles. Unless the
    state restored is a local step the job directory lacks: it is saved there first (the local disks may
    go with the VMs), as at any agreed step."""
    self.take_over_or_wait()
    unbacked = self._restorer.unbacked_step
    if unbacked is not None:
      logging.info('[autockpt] The restored local step %d is not in the job directory (newest there: %s): saving '
                   'it there before exiting.', unbacked, layout.step_text(self._restorer.local_agreed_newest))
      self.on_preemption(step, state)
    deadline = self._deadline()
    newest = self._exit_step = self.newest_committed()
    self._events.write('preemption', step=step, signal=self._preemption.signal_name, saved_step=newest,
                       plan='nothing_to_save', **self._signal_fields(deadline, phases_lib.START_UP))
    raise stops.Preempted(step, nothing_trained(newest),
                             signal=self._preemption.signal_name)

  def on_preemption(self, step: int, state: dict[str, Any], agreed_during: str = phases_lib.CHECKPOINT,
                    batch: int | None = None) -> None:
    """At the agreed step (`agreed_during`: where the hosts agreed; `batch`: which batch of an eval or decode
    program they stopped before): plan, save, wait for the commit, raise."""
    self.take_over_or_wait()
    if not self._exit_after_ondemand:  # Pax trains on after the save; the watchdog exits 143 once it committed
      self._deadline()
      self._events.write('preemption', step=step, signal=self._preemption.signal_name,
                         **self._signal_fields(None, agreed_during))
      logging.info('[autockpt] Preemption: every host agreed on step %d.', step)
      self._save_unless_committed(step, 'preemption', state)
      self._exit_step = step
      return
    exit_plan = self._agreed_exit_plan(step)
    deadline = exit_plan.deadline
    saved = exit_plan.kept_step if exit_plan.action == grace.KEEP_IN_FLIGHT else step
    self._events.write('preemption', step=step, signal=self._preemption.signal_name, saved_step=saved,
                       plan=exit_plan.action, why=exit_plan.why, **self._signal_fields(deadline, agreed_during),
                       **({'batch': batch} if batch else {}))
    where = '' if agreed_during == phases_lib.CHECKPOINT else f' ({_PHASE_WORDS.get(agreed_during, agreed_during)})'
    logging.info('[autockpt] Preemption: every host agreed on step %d%s; %s (%s).', step, where,
                 _PLAN_WORDS[exit_plan.action], exit_plan.why)
    if exit_plan.action == grace.SAVE and deadline is not None and exit_plan.wait_step is not None:
      exit_plan = self._replanned(step, exit_plan.wait_step, deadline)
      if exit_plan.action != grace.SAVE:
        saved = exit_plan.kept_step
        self._events.write('exit_replanned', step=step, plan=exit_plan.action, saved_step=saved, why=exit_plan.why)
        logging.info('[autockpt] Step %d: %s (%s).', step, _PLAN_WORDS[exit_plan.action], exit_plan.why)
    if exit_plan.action == grace.GIVE_UP:
      raise stops.SaveFailed(step, f'No time left to save step {step} ({exit_plan.why}); the newest committed '
                                f'checkpoint is {layout.step_text(self.newest_committed())}')
    if exit_plan.action == grace.SAVE:
      self._save_unless_committed(step, 'preemption', state, last=True, deadline=deadline)
    self._exit_once_committed(saved, deadline, agreed=step)

  def _agreed_exit_plan(self, step: int) -> grace.ExitPlan:
    """The primary host's plan, on every host, against the earliest deadline any host published: it carries that
    deadline, which every host then keeps to (its watchdog too). Its `wait_step` is a save in flight until its
    commit (not while host 0's thread runs the preservation after it), decided on host 0 alone."""
    local = self._deadline()
    published = self._published_deadlines(step, local)
    mine = None
    if self._events.host == 0:
      deadline = grace.earliest(published) or local
      mine = self._plan(step, deadline)
      if deadline is not None:
        mine = dataclasses.replace(mine, arrival=deadline.arrival, grace_secs=deadline.grace_secs)
      mine = mine.encode()
    exit_plan = grace.ExitPlan.decode(self._first(step, f'{coordination.EXIT_PLAN}{step}', mine, local))
    if exit_plan.deadline is not None:
      self._watchdog.arm(exit_plan.deadline)
    return exit_plan

  def _published_deadlines(self, step: int, local: grace.Deadline | None) -> list[grace.Deadline]:
    """Every host's own deadline (a host the SIGTERM reached publishes its arrival; one it did not, nothing).
    None for Ctrl-C (the agreed signal, the same on every host): no deadline, no exchange."""
    if local is None:
      return []
    mine = local.encode() if local.seen_here else None
    found = self._exchange(step, f'{coordination.EXIT_PLAN}{step}/deadline', mine, local)
    return [grace.Deadline.decode(text) for text in found.values()]

  def _plan(self, step: int, deadline: grace.Deadline | None) -> grace.ExitPlan:
    """Host 0: what fits before `deadline` (pax_autockpt.signals.grace.plan)."""
    latest = self._saves.latest_step()
    if deadline is None or not self._saves.enabled or (latest is not None and latest >= step):
      return grace.ExitPlan(grace.SAVE, 'no grace period' if deadline is None else 'nothing new to save')
    return grace.plan(grace.ExitContext(
        remaining_s=deadline.remaining(), save_duration_s=self._costs.duration_s,
        in_flight_step=self._background.uncommitted_step, in_flight_elapsed_s=self._background.uncommitted_for()))

  def _replanned(self, step: int, in_flight: int, deadline: grace.Deadline) -> grace.ExitPlan:
    """The plan was to save after the save of `in_flight`: every host waits for its commit (within the budget,
    whatever its own save's state), then the primary plans again with its measured duration, and every host
    follows."""
    self._background.wait_until_settled(grace.time_left(deadline))
    mine = None
    if self._events.host == 0:
      committed = in_flight if self._is_committed(in_flight) else None
      mine = grace.replan(grace.ExitContext(remaining_s=deadline.remaining(), save_duration_s=self._costs.duration_s),
                          committed, self._background.took(in_flight) or self._costs.last_duration_s).encode()
    return grace.ExitPlan.decode(self._first(step, f'{coordination.EXIT_REPLAN}{step}', mine, deadline))

  def _first(self, step: int, key: str, mine: str | None, deadline: grace.Deadline | None) -> str:
    """The primary host's report at `key` (`_exchange`)."""
    found = self._exchange(step, key, mine, deadline)
    if 0 not in found:
      raise stops.SaveFailed(step, f'Host 0 sent no exit plan at step {step}; the newest committed checkpoint is '
                                   f'{layout.step_text(self.newest_committed())}')
    return found[0]

  def _exchange(self, step: int, key: str, mine: str | None, deadline: grace.Deadline | None) -> dict[int, str]:
    """One exchange of the exit's agreement (pax_autockpt.hosts.agreement.reports), no longer than the grace period
    allows: a host that does not come in time, or a coordination service that fails, ends the exit in one
    line and exit 1 (never a traceback, never a wait past the deadline)."""
    try:
      return agreement.reports(key, self._events.host, mine, within=grace.time_left(deadline))
    except Exception as e:  # pylint: disable=broad-except  (agreement.Timeout: the same line on every host)
      raise stops.SaveFailed(step, f'The hosts did not agree on the exit at step {step} ({failures.one_line(e)}); '
                                   f'the newest committed checkpoint is {layout.step_text(self.newest_committed())}'
                             ) from e

  def on_notice(self, step: int, notice: notices.Notice, state: dict[str, Any]) -> None:
    """A maintenance or preemption notice (any host's): every host saves this step; training goes on
    unless the action is 'save_and_exit'."""
    self._events.write('notice', step=step, source=notice.source, value=notice.value, seen_by=notice.host)
    logging.info('[autockpt] %s notice (%s) seen by host %d: every host saves step %d.', notice.source,
                 notice.value[:100], notice.host, step)
    notices.warn_if_window_is_too_close(notice, self._durations())
    exiting = self._notice_action == 'save_and_exit'
    if exiting:
      self.take_over_or_wait()
    self._save_unless_committed(step, 'notice', state, last=exiting)
    if exiting:
      self._exit_once_committed(step)

  def _durations(self) -> list[float]:
    return [e['duration_s'] for e in events_lib.read(self._events.job_log_dir, self._events.host)
            if e['event'] == 'save_committed' and isinstance(e.get('duration_s'), (int, float))]

  def _save_unless_committed(self, step: int, reason: str, state: dict[str, Any], last: bool = False,
                             deadline: grace.Deadline | None = None) -> None:
    if not self._saves.enabled:
      logging.warning('[autockpt] --enable_checkpoint_saving=false: no %s checkpoint written.', reason)
    elif self._saves.latest_step() is not None and self._saves.latest_step() >= step:
      logging.info('[autockpt] Step %d is already saved; nothing new to save.', step)
    else:
      self._saves.save(step, reason, state, last, deadline)

  def _exit_once_committed(self, step: int, deadline: grace.Deadline | None = None,
                           agreed: int | None = None) -> None:
    """Waits for the step's save (no longer than the grace period allows), then raises for the executor:
    Preempted, or SaveFailed. `agreed` is the step training stopped at, when the save is an earlier one."""
    self._exit_step = step
    finished = self._background.wait(grace.time_left(deadline))
    agreed = step if agreed is None else agreed
    if self._saves.enabled and not self._is_committed(step):
      why = 'did not commit within the grace period' if not finished else 'failed to commit'
      raise stops.SaveFailed(agreed, f'On-demand checkpoint of step {step} {why}; the newest committed '
                                f'checkpoint is {layout.step_text(self.newest_committed())}')
    self._preserve_before_exit(deadline)
    what = (f'On-demand checkpoint of step {step} committed' if step == agreed else
            f'Checkpoint of step {step} committed (no time to save step {agreed} as well)')
    raise stops.Preempted(agreed, what, signal=self._preemption.signal_name)

  def _is_committed(self, step: int) -> bool:
    """Whether `step` is committed on storage; when storage does not answer (an outage: on gs:// `exists()`
    raises on anything but NotFound), the commit's own record in this process (orbax said it committed)."""
    try:
      return layout.is_committed(self._saves.step_dir(step))
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('[autockpt] Storage did not say whether step %d is committed (%s): this process\'s record of '
                      'its commit answers instead.', step, failures.one_line(e))
      return step in self._background.committed_steps

  def _known_committed(self) -> list[int]:
    """The committed steps this process knows of without asking storage: its own commits, and the step it
    restored (not a local step the job directory lacks)."""
    restored = self._restored_step() if self._restorer.unbacked_step is None else None
    return sorted({s for s in (*self._saves.committed_this_run, *self._background.committed_steps, restored)
                   if s is not None})

  def newest_committed(self) -> int | None:
    """The job directory's newest committed step for the exit's lines; when storage does not answer, the
    newest this process knows of (`_known_committed`), so that an outage still ends in one line."""
    try:
      return self._saves.newest_committed()
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('[autockpt] Storage did not list the job directory (%s): naming the newest checkpoint this '
                      'process knows of.', failures.one_line(e))
      return max(self._known_committed(), default=None)

  def _preserve_before_exit(self, deadline: grace.Deadline | None) -> None:
    """The preservation policy once more, after the exit's commit: after the signal every commit skipped it, so
    the job directory the exit leaves would hold more than the policy allows. Bounded by the grace period (else
    PRESERVE_SECS): when it does not finish, one line says so and the next run's first commit does it."""
    if not self._saves.applies_preservation:
      return
    left = grace.time_left(deadline)
    if not console.bounded(self._preserve, PRESERVE_SECS if left is None else left, 'autockpt-exit-preservation'):
      logging.warning('[autockpt] The preservation policy\'s deletes did not finish before the exit (%s): the job '
                      'directory may hold more checkpoints than it allows until the next run\'s first commit.',
                      'no time left in the grace period' if left is not None else f'{PRESERVE_SECS:g} s')

  def _preserve(self) -> None:
    try:
      self._saves.preserve()
    except Exception as e:  # pylint: disable=broad-except  (storage failing: one line, the next run's commit retries)
      logging.warning('[autockpt] The preservation policy did not run before the exit: %s', failures.one_line(e))

  def _out_of_time(self, deadline: grace.Deadline) -> None:
    """The watchdog, `grace.WATCHDOG_LEAD_SECS` before the deadline, with the process still alive (a wait
    or a teardown that hangs): one line and exit now, 143 if the step the exit waited for is committed.
    The line and the event get half the lead time in another thread (storage or a pipe may be what hangs, a
    write may fail): the process ends whatever they do."""
    code = 1
    try:
      known = self._known_committed()  # no storage call
      code = self._signal_code() if self._exit_step is not None and self._exit_step in known else 1
      message = (f'[autockpt] The grace period of {deadline.grace_secs:g} s ends in {grace.WATCHDOG_LEAD_SECS:g} s: '
                 f'exiting {code} now; the newest committed checkpoint is {max(known, default=None)}'
                 f'{self._what_is_lost(max(known, default=None))}.')
      console.bounded(lambda: self._record_expiry(message, code), grace.WATCHDOG_LEAD_SECS / 2, 'autockpt-grace-exit')
    finally:
      os._exit(code)  # pylint: disable=protected-access

  def _signal_code(self) -> int:
    """The exit code of a stop whose save committed: 130 after a Ctrl-C (any host's, once agreed), else 143."""
    name = self._preemption.signal_name if self._preemption.agreed_step is not None else None
    got = signals.received()
    interrupted = name == signal.SIGINT.name or (name is None and got is not None and got[0] == signal.SIGINT)
    return signals.INTERRUPT_EXIT_CODE if interrupted else self._exit_code

  def _record_expiry(self, message: str, code: int) -> None:
    console.write(sys.stderr, 'stderr', message + '\n')
    logging.error(message)
    if 'exit' not in self._events.kinds_written:  # else the exit was decided already and its teardown hangs
      self._events.write('exit', code=code, step=self._last_step(), grace_expired=True, **console.lost_fields())
      self._events.flush()
    logging.flush()
    console.settle()

  def _what_is_lost(self, newest: int | None) -> str:
    """For the watchdog's line: the trained steps no save kept, and where the main thread was held."""
    place = self._phases.now()
    if place.step is None or (newest is not None and place.step <= newest) or self.taken:
      return ''
    return (f'; step {place.step} is lost: the main thread has been in {place.phase} for '
            f'{time.time() - place.since:.0f} s and never came back to an agreement point')


PRESERVE_SECS = 60.0  # the preservation before an exit without a grace period (Ctrl-C, a notice)
_PHASE_WORDS = {phases_lib.EVAL: 'at an eval batch: the eval ends there, its metrics unwritten',
                phases_lib.DECODE: 'at a decode batch: the decode ends there, its outputs unwritten',
                'rescue': 'saved from another thread: the main thread was held elsewhere'}
_PLAN_WORDS = {grace.SAVE: 'saving it', grace.KEEP_IN_FLIGHT: 'keeping the save in flight',
               grace.GIVE_UP: 'no save fits'}


def nothing_trained(newest: int | None) -> str:
  """The words of an exit before the first step, whichever path takes it (here, or pax_autockpt.exit.startup_exit)."""
  what = f'since checkpoint {newest}' if newest is not None else 'yet, and no checkpoint'
  return f'Nothing trained {what} when the signal came: nothing to save'
