"""Where the main thread is in Pax's loop, and the newest state it trained: for a preemption that comes anywhere.

paxml calls the checkpointer only between training steps. A signal during an eval (which runs every
`eval_interval_steps` and may take minutes), a decode program, the eval step's first compile, a summary write
or an input whose `get_next` does not return would otherwise wait for the loop to come back, and the grace
period runs out first: everything since the last checkpoint lost although the trained state sat in memory.

So the loop's programs are instrumented (pax_autockpt.shared.internals.instrument_programs): each eval and decode
batch is an agreement point (`LoopPhases.point`, the checkpointer's, where every host meets XLA's sync point
in the same order: the batches are collectives, every host runs the same ones), and every phase is recorded
here with the newest trained step and its state (a reference: nothing is copied). Where the main thread
reaches no point (a blocked input, a compile), pax_autockpt.exit.rescue reads this record to decide whether the
state may be saved from another thread.
"""

import dataclasses
import threading
import time
from typing import Any, Callable

START_UP = 'start-up'  # before the first step completed (pax_autockpt.exit.startup_exit)
INPUT = 'input'  # the train input's get_next and what follows it up to the train step
TRAIN = 'train'  # the train step's dispatch (and its compile): the previous state's buffers are donated to it
AFTER_STEP = 'after-step'  # summaries, metrics, the eval step on the train input
EVAL = 'eval'
DECODE = 'decode'
CHECKPOINT = 'checkpoint'  # the checkpointer's own call (a save starting: the checkpointer is busy)
LOOP = 'loop'  # between Pax's programs
FINISHING = 'finishing'  # after the loop: the final save and the wait for it; the main thread owns the exit
# Where a save of the newest trained state from another thread reads nothing the main thread is changing.
SAFE_TO_SAVE_ELSEWHERE = frozenset({INPUT, AFTER_STEP, EVAL, DECODE, LOOP})


@dataclasses.dataclass(frozen=True)
class Place:
  """A snapshot of the record: the phase, since when, and the newest trained step (None before the first)."""

  phase: str
  since: float
  step: int | None
  state: Any = None
  batch: int = 0  # in an eval or decode program: the batches begun (the one about to run included)


class LoopPhases:
  """The record (main thread writes, any thread reads) and the gate a thread that took over the exit closes:
  once closed, the main thread stops at its next phase change or point and waits for the process to end."""

  def __init__(self):
    self._lock = threading.Lock()
    self._place = Place(START_UP, time.time(), None)
    self._closed = threading.Event()
    self._point: Callable[[str], None] | None = None
    self.first_train_s: float | None = None  # this run's first train_step call: its trace and compile (`first_step`)

  def on_point(self, point: Callable[[str], None]) -> None:
    """`point(phase)` at each eval or decode batch (the checkpointer's agreement point)."""
    self._point = point

  def enter(self, phase: str) -> None:
    """The main thread enters `phase`, unless the gate is closed: the check and the change are one step under
    the lock `close_if` takes, so no phase is entered after a close that saw the previous one."""
    with self._lock:
      closed = self._closed_here()
      if not closed:
        self._place = dataclasses.replace(self._place, phase=phase, since=time.time(), batch=0)
    if closed:
      _wait_for_the_end()

  def trained(self, step: int, state: Any) -> None:
    """After each train step's dispatch: the state the next save would save (still computing: a save waits)."""
    with self._lock:
      now = time.time()
      if self.first_train_s is None:  # since enter(TRAIN): the call compiled the step (JAX runs it asynchronously)
        self.first_train_s = now - self._place.since
      self._place = Place(AFTER_STEP, now, int(step), state)

  def point(self, phase: str) -> None:
    """At each eval or decode batch, before it runs."""
    with self._lock:
      closed = self._closed_here()
      if not closed:
        if phase != self._place.phase:
          self._place = dataclasses.replace(self._place, phase=phase, since=time.time(), batch=0)
        self._place = dataclasses.replace(self._place, batch=self._place.batch + 1)
    if closed:
      _wait_for_the_end()
    if self._point is not None and self._place.step is not None:
      self._point(phase)

  def now(self) -> Place:
    with self._lock:
      return self._place

  def close(self) -> None:
    """Another thread saves the state and ends the process: the main thread must not train on (the next
    train step would donate the buffers being saved) nor start a save of its own."""
    with self._lock:
      self._closed.set()

  def close_if(self, may_save: Callable[[Place], bool]) -> Place | None:
    """Closes the gate if `may_save(place)` holds for where the main thread is now, in one step with the check
    (the main thread cannot change phase in between): the place to save from, or None (nothing closed)."""
    with self._lock:
      if not may_save(self._place):
        return None
      self._closed.set()
      return self._place

  @property
  def closed(self) -> bool:
    return self._closed.is_set()

  def _closed_here(self) -> bool:
    return self._closed.is_set() and threading.current_thread() is threading.main_thread()


def _wait_for_the_end() -> None:
  threading.Event().wait()  # the thread that closed the gate ends the process
