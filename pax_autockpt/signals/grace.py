"""The exit path's time budget: what still fits between a preemption signal and the scheduler's SIGKILL.

Cloud TPU waits 300 s after SIGTERM, Spot VMs about 30 s, GKE `terminationGracePeriodSeconds`, Slurm
`--signal=TERM@N` N seconds: then the process is killed wherever it is. A save killed mid-write is not
lost progress (it never committed), but the job exits without the step it was preempted for, and with a
log that stops mid-sentence. So the exit path plans inside the budget, counted from the signal's arrival:
`plan` decides, from this job's own measured save durations, whether a new save of the agreed step still
fits, or only the save already in flight, or nothing; every wait on the way is bounded by what is left;
and a `Watchdog` ends the process with one line just before the deadline if something still hangs.
"""

import dataclasses
import json
import threading
import time
from typing import Callable

MARGIN_FACTOR = 1.5  # a save may take this much longer than this job's mean save so far
MARGIN_SECS = 2.0  # what the exit itself takes after the commit: events, logs, process teardown
WATCHDOG_LEAD_SECS = 1.0  # the watchdog ends the process this long before the deadline

SAVE = 'save'  # save the agreed step (after the save in flight, if any), then exit
KEEP_IN_FLIGHT = 'keep_in_flight'  # no time for a new save: let the one in flight commit, exit naming it
GIVE_UP = 'give_up'  # no save in flight and no time for one: exit 1 at once, naming the newest committed


@dataclasses.dataclass(frozen=True)
class Deadline:
  """When the scheduler kills a host: the signal's arrival plus the grace period (CONTRACT §4). At the agreed
  step every host publishes its own, and every host's exit follows the earliest (`earliest`): a host the
  signal did not reach, or reached later, would otherwise plan a save the signalled host's watchdog cuts off.
  `seen_here`: this host got that signal itself."""

  arrival: float
  grace_secs: float
  seen_here: bool = True

  @property
  def at(self) -> float:
    return self.arrival + self.grace_secs

  def remaining(self, now: float | None = None) -> float:
    return self.at - (time.time() if now is None else now)

  def encode(self) -> str:
    """For the other hosts: when the signal came here (unix time) and this host's grace period."""
    return json.dumps({'arrival': self.arrival, 'grace_secs': self.grace_secs})

  @classmethod
  def decode(cls, text: str, seen_here: bool = False) -> 'Deadline':
    return cls(seen_here=seen_here, **json.loads(text))


def earliest(deadlines: list[Deadline]) -> Deadline | None:
  """The deadline every host's exit keeps to: the first any host's scheduler enforces (None: no host had one)."""
  return min(deadlines, key=lambda d: d.at, default=None)


@dataclasses.dataclass(frozen=True)
class ExitContext:
  """What the exit plan looks at, at the agreed step (on the primary host)."""

  remaining_s: float
  save_duration_s: float | None  # this job's mean start -> commit so far; None before any save committed
  in_flight_step: int | None = None
  in_flight_elapsed_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class ExitPlan:
  """The primary host's decision, which every host follows. `wait_step`: SAVE after the save of that step, in
  flight: every host waits for its commit, then joins the re-plan (`replan`) whatever its own save's state.
  `arrival`, `grace_secs`: the deadline every host keeps to (`earliest` of the hosts' own), None for Ctrl-C."""

  action: str  # SAVE, KEEP_IN_FLIGHT or GIVE_UP
  why: str
  kept_step: int | None = None  # KEEP_IN_FLIGHT: the step of the save in flight
  wait_step: int | None = None
  arrival: float | None = None
  grace_secs: float | None = None

  @property
  def deadline(self) -> Deadline | None:
    return None if self.arrival is None else Deadline(self.arrival, self.grace_secs, seen_here=False)

  def encode(self) -> str:
    """For the other hosts (the coordination service's key-value store holds text)."""
    return json.dumps(dataclasses.asdict(self))

  @classmethod
  def decode(cls, text: str) -> 'ExitPlan':
    return cls(**json.loads(text))


def plan(ctx: ExitContext) -> ExitPlan:
  """SAVE when the save in flight (projected from its elapsed time) and a new save both fit in what is
  left, with the margins; else KEEP_IN_FLIGHT when a save is in flight; else GIVE_UP. With no save measured
  yet there is nothing to project from: SAVE, bounded by the deadline like every wait on the exit path."""
  if ctx.save_duration_s is None:
    return ExitPlan(SAVE, 'no save of this job measured yet', wait_step=ctx.in_flight_step)
  projected = ctx.save_duration_s * MARGIN_FACTOR
  in_flight_left = max(0.0, projected - ctx.in_flight_elapsed_s) if ctx.in_flight_step is not None else 0.0
  needed = in_flight_left + projected + MARGIN_SECS
  budget = f'{ctx.remaining_s:.1f} s left of the grace period, a save takes ~{ctx.save_duration_s:.1f} s'
  if needed <= ctx.remaining_s:
    return ExitPlan(SAVE, budget, wait_step=ctx.in_flight_step)
  if ctx.in_flight_step is not None:
    return ExitPlan(KEEP_IN_FLIGHT, f'{budget}: no time for a new save after the one of step '
                    f'{ctx.in_flight_step} in flight', kept_step=ctx.in_flight_step)
  return ExitPlan(GIVE_UP, f'{budget}: no time for a save')


def replan(ctx: ExitContext, committed_step: int | None, took_s: float | None) -> ExitPlan:
  """After the save in flight finished, when the first plan was SAVE: its own measured duration (`took_s`)
  may say a new save no longer fits what is left (the first plan projected it from earlier saves). Then
  exit naming the step it committed (`committed_step`; None when it failed: GIVE_UP)."""
  measured = [d for d in (ctx.save_duration_s, took_s) if d is not None]
  again = plan(dataclasses.replace(ctx, save_duration_s=max(measured) if measured else None, in_flight_step=None))
  if again.action == SAVE or committed_step is None:
    return again
  return ExitPlan(KEEP_IN_FLIGHT, f'{again.why} after the save of step {committed_step} took {took_s or 0:.1f} s',
                  kept_step=committed_step)


_armed: list['Watchdog'] = []  # a signal is process-wide, and so are the watchdogs it armed


class Watchdog:
  """Calls `expire()` (which must end the process) `WATCHDOG_LEAD_SECS` before the earliest deadline it
  was armed with, unless the process has ended by then. A daemon thread: it never holds the exit up."""

  def __init__(self, expire: Callable[[Deadline], None]):
    self._expire = expire
    self._lock = threading.Lock()
    self.deadline: Deadline | None = None
    self._wake = threading.Event()
    self._cancelled = False

  def arm(self, deadline: Deadline) -> None:
    with self._lock:
      if self._cancelled or (self.deadline is not None and self.deadline.at <= deadline.at):
        return
      first = self.deadline is None
      self.deadline = deadline
      _armed.append(self)
    if first:
      threading.Thread(target=self._run, name='autockpt-grace', daemon=True).start()
    else:
      self._wake.set()

  def cancel(self) -> None:
    """No expiry after all (a process that handles a signal in-process and goes on: tests)."""
    with self._lock:
      self._cancelled = True
    self._wake.set()

  def _run(self) -> None:
    while True:
      with self._lock:
        if self._cancelled:
          return
        deadline = self.deadline
      left = deadline.remaining() - WATCHDOG_LEAD_SECS
      if left <= 0:
        self._expire(deadline)
        return
      if self._wake.wait(left):
        self._wake.clear()


def cancel_all() -> None:
  """Cancels every watchdog armed in this process: what forgetting a recorded signal needs too (tests)."""
  while _armed:
    _armed.pop().cancel()


def time_left(deadline: Deadline | None) -> float | None:
  """How long a wait on the exit path may last: until the margin before the deadline (None: no deadline)."""
  if deadline is None:
    return None
  return max(0.0, deadline.remaining() - MARGIN_SECS)
