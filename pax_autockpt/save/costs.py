"""What this job's saves have cost so far: the save cost delta of the Young/Daly interval.

delta is the mean loop-blocking time (`save_started.blocking_s`) of the saves a preemption did not
force, the figure `pax-autockpt report` uses for goodput; the mean time from a save's start to its
commit bounds the interval from below. Both include this host's earlier runs of the job (its event
log), and are re-estimated each time a save commits.

The rule for delta lives here only: `pax-autockpt report` computes its goodput delta with `SaveCosts` too,
so the report and the interval training chose agree by construction.
"""

import dataclasses
import threading
from typing import Any


@dataclasses.dataclass
class _Mean:
  total: float = 0.0
  n: int = 0

  def add(self, value: float) -> None:
    self.total += value
    self.n += 1

  @property
  def value(self) -> float | None:
    return self.total / self.n if self.n else None


class SaveCosts:
  """Running means; updated from the save thread, read from the training loop."""

  def __init__(self):
    self._lock = threading.Lock()
    self._blocking = _Mean()
    self._duration = _Mean()
    self.last_duration_s: float | None = None  # the newest save's start -> commit

  def add(self, reason: str, blocking_s: float | None, duration_s: float | None) -> None:
    self.add_blocking(reason, blocking_s)
    with self._lock:
      if duration_s is not None:
        self._duration.add(duration_s)
        self.last_duration_s = duration_s

  def add_blocking(self, reason: str | None, blocking_s: float | None) -> None:
    """One save's share of delta: none for a save a preemption forced (it is not the interval's cost: it
    happens whatever the interval), nor for one whose blocking time is unknown."""
    with self._lock:
      if reason != 'preemption' and blocking_s is not None:
        self._blocking.add(blocking_s)

  @property
  def blocking_s(self) -> float | None:
    with self._lock:
      return self._blocking.value

  @property
  def duration_s(self) -> float | None:
    with self._lock:
      return self._duration.value

  @classmethod
  def of_committed(cls, records: list[dict[str, Any]]) -> 'SaveCosts':
    """From an event log: each committed save's start (reason, blocking time) and its duration."""
    costs, started = cls(), {}
    for e in records:
      if e['event'] == 'save_started':
        started[e.get('step')] = e
      elif e['event'] == 'save_committed' and e.get('step') in started:
        start = started.pop(e['step'])
        costs.add(str(start.get('reason')), _number(start.get('blocking_s')), _number(e.get('duration_s')))
    return costs


def _number(v: Any) -> float | None:
  return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
