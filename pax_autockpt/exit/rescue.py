"""A signal that finds the main thread where it cannot come back: the trained state saved from another thread.

The exit path runs in the main thread at an agreement point: the loop's checkpointer call, or an eval or decode
batch (pax_autockpt.shared.phases). A main thread held elsewhere (an input whose `get_next` does not return, an eval
step's compile, a summary write to storage that hangs) reaches none, and the grace period would end with the
trained steps lost. So, after a signal, this thread waits `RESCUE_AFTER_SECS` (less where the budget is short)
for the main thread to take the exit; if it has not, and the place it is held in reads nothing the save needs
(pax_autockpt.shared.phases.SAFE_TO_SAVE_ELSEWHERE: not the train step, whose dispatch donates the state's buffers,
nor the checkpointer's own call), this thread takes the exit: it closes the gate (the main thread stops at its
next phase change), saves the newest trained step through the same exit path and ends the process.

One process only: with several, each host's save would run collectives from a thread the other hosts'
main threads do not meet. There, a main thread that does not come back costs the steps since the last
checkpoint, and the grace watchdog's line names the step, the phase and how long it held.
"""

import signal
import threading
import time
from typing import Any, Callable

from absl import logging

from pax_autockpt.shared import phases as phases_lib
from pax_autockpt.shared import stops
from pax_autockpt.signals import grace

RESCUE_AFTER_SECS = 10.0  # a main thread not at an agreement point this long after a signal is held
_BUDGET_SHARE = 0.25  # and never later than this share of the grace period (a save must still fit)
_POLL_SECS = 0.1


def wait_before_rescue(grace_secs: float | None) -> float:
  """Seconds from the signal to the rescue: RESCUE_AFTER_SECS, at most a quarter of the grace period."""
  return RESCUE_AFTER_SECS if grace_secs is None else min(RESCUE_AFTER_SECS, _BUDGET_SHARE * grace_secs)


class Rescue:
  """One process's rescue (see the module docstring). `exit_path`: pax_autockpt.exit.exit_path.ExitPath (its
  `take_over`, `taken` and `on_preemption`); `agree(step)`: records `step` as the agreed one (the preemption
  watcher's); `state_of(state)`: the save's items around a trained state; `end(stop)`: how the process ends
  for a StopTraining raised here (the executor's, from a thread)."""

  def __init__(self, *, phases: phases_lib.LoopPhases, exit_path: Any, agree: Callable[[int], None],
               state_of: Callable[[Any], dict[str, Any]], end: Callable[[stops.StopTraining], None],
               grace_secs: float, first_step: Callable[[], int | None]):
    self._phases, self._exit, self._agree, self._state_of, self._end = phases, exit_path, agree, state_of, end
    self._grace_secs, self._first_step = grace_secs, first_step

  def signal_arrived(self, signum: int, arrival: float) -> None:
    """In the thread that recorded the signal: the rescue thread starts (it only waits, unless needed)."""
    grace_secs = self._grace_secs if signum == signal.SIGTERM else None
    threading.Thread(target=self._run, args=(arrival, grace_secs), name='autockpt-rescue', daemon=True).start()

  def _run(self, arrival: float, grace_secs: float | None) -> None:
    place = self._take_the_exit(arrival + wait_before_rescue(grace_secs),
                                None if grace_secs is None else grace.Deadline(arrival, grace_secs))
    if place is None:
      return
    logging.warning('[autockpt] The main thread has been in %s for %.1f s and reached no agreement point since the '
                    'signal: saving step %d from another thread.', place.phase, time.time() - place.since, place.step)
    self._agree(place.step)
    try:
      self._exit.on_preemption(place.step, self._state_of(place.state), agreed_during='rescue')
    except stops.StopTraining as stop:
      self._end(stop)
    except Exception as e:  # pylint: disable=broad-except
      self._end(stops.SaveFailed(place.step, f'the save of step {place.step} from another thread failed: {e}'))

  def _take_the_exit(self, rescue_at: float, deadline: grace.Deadline | None) -> phases_lib.Place | None:
    """The place to save from, with the exit owned and the gate closed; None when the main thread keeps it. The
    phase is checked again as the gate closes (one step): a main thread that entered the train step after the
    first look keeps it (its dispatch donates the buffers), and this waits for the next safe place."""
    while True:
      place = self._held(rescue_at, deadline)
      if place is None or not self._exit.take_over():
        return None
      closed = self._phases.close_if(self._may_save)
      if closed is not None:
        return closed
      self._exit.release()

  def _may_save(self, place: phases_lib.Place) -> bool:
    return place.phase in phases_lib.SAFE_TO_SAVE_ELSEWHERE and self._trained(place)

  def _held(self, rescue_at: float, deadline: grace.Deadline | None) -> phases_lib.Place | None:
    """Waits until `rescue_at` and then while the main thread is in a phase unsafe to save beside; the place to
    save from, or None (the main thread took the exit, nothing new was trained, or the budget ran out)."""
    while not self._exit.taken:
      place = self._phases.now()
      if deadline is not None and deadline.remaining() < grace.WATCHDOG_LEAD_SECS + grace.MARGIN_SECS:
        return None
      if time.time() >= rescue_at and self._may_save(place):
        return place
      time.sleep(_POLL_SECS)
    return None

  def _trained(self, place: phases_lib.Place) -> bool:
    """A step trained by this run (before it, pax_autockpt.exit.startup_exit answers the signal)."""
    first = self._first_step()
    return place.step is not None and (first is None or place.step > first)
