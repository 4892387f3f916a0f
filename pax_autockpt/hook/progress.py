"""A `progress` event on host 0 at most every PROGRESS_SECS: how far a run got, for `report`'s measured badput.

A run killed without warning (SIGKILL, a replaced VM) writes no `exit` event; its newest event is the last the
report knows of it. Saves and local commits are events too, but the job directory's interval is minutes to hours,
so the steps a kill wasted after the last save would read as time between runs, not as wasted progress. One event
every PROGRESS_SECS puts a killed run's end within PROGRESS_SECS of the truth at a bounded cost: 20,160 lines a
week. Host 0 only: the report's timeline is host 0's, and on gs:// every event rewrites an object of the log."""

import time
from typing import Callable

from pax_autockpt.shared import events as events_lib

PROGRESS_SECS = 30.0


class ProgressMarks:
  """Called with the loop's step at every iteration; writes `progress` when PROGRESS_SECS have passed since the
  run's first iteration or its previous mark."""

  def __init__(self, events: events_lib.EventLog, clock: Callable[[], float] = time.monotonic):
    self._events = events if events.host == 0 else None
    self._clock = clock
    self._due: float | None = None  # the first iteration sets it: no mark for start-up, `first_step` covers it

  def step(self, step: int) -> None:
    if self._events is None:
      return
    now = self._clock()
    if self._due is None:
      self._due = now + PROGRESS_SECS
    elif now >= self._due:
      self._due = now + PROGRESS_SECS
      self._events.write('progress', step=step)
