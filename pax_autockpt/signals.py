"""Preemption signals caught in Python, for the stretches XLA's preemption notifier does not cover.

XLA installs its own SIGTERM notifier when `jax.distributed` is initialised. Before that (imports,
flag parsing) and in jobs without `jax.distributed`, a SIGTERM would kill the process outright;
this module records it instead. A signal is process-wide, so the record is too.
"""

import os
import signal
import time

_received: list[tuple[int, float]] = []  # (signum, unix time) of the first preemption signal


def _record(signum, frame):
  del frame
  if not _received:
    _received.append((signum, time.time()))


def install() -> None:
  """From now on a SIGTERM is recorded, not fatal (main thread only; until XLA installs its own)."""
  signal.signal(signal.SIGTERM, _record)


def is_installed() -> bool:
  """Whether Python's table has our handler (blind to XLA's C-level notifier)."""
  return signal.getsignal(signal.SIGTERM) is _record


def received() -> tuple[int, float] | None:
  """(signum, time) of the first SIGTERM recorded here, or None."""
  return _received[0] if _received else None


def redeliver() -> None:
  """Sends the recorded signal again, to whoever handles SIGTERM now (XLA's notifier)."""
  os.kill(os.getpid(), _received[0][0])


def name(signum: int) -> str:
  return signal.Signals(signum).name
