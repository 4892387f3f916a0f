"""When this process started and what its start-up spent, for the `start` event (CONTRACT §6): `report` splits a
restart's downtime with them into the scheduler's part (the previous run's end -> this process's start) and the
process's own (imports, jax's distributed initialisation, the restore, the first step's compile).

Standard library only, and nothing is measured per step: a few marks, once per process.
"""

import os
import socket
import time

_marks: dict[str, float] = {}  # name -> when it was first reached (wall clock)
IMPORTED = 'imported'  # pax_autockpt.main finished importing paxml and jax
JAX_SETUP = 'jax_setup'  # pax_autockpt.main calls paxml's main, whose setup_jax initialises jax.distributed
VALIDATED = 'validated'  # paxml validates the experiment, right after its setup_jax
_began: list[float] = []  # set by a standby when it becomes a host: its start-up begins then, not at its spawn


def mark(name: str) -> None:
  """Notes that the process reached `name` (the first time only: a later call is not the start-up's)."""
  _marks.setdefault(name, time.time())


def started_at(t: float) -> None:
  """A standby process (pax_autockpt.startup.standby) became a host at `t`: its start-up is measured from then (its
  imports, done before, are not this start's)."""
  _began[:] = [t]


def reached(name: str) -> float | None:
  """When the process first reached `name` (unix seconds), None if it has not (e.g. under stock paxml main)."""
  return _marks.get(name)


def process_start_t() -> float | None:
  """This process's start, unix seconds, from Linux's /proc (a standby's: when it became a host); None elsewhere
  or where /proc cannot say.

  /proc/self/stat's starttime counts clock ticks since boot; /proc/stat's btime (the boot, unix seconds) is
  whole seconds and drifts from the wall clock as NTP corrects it, so the boot is placed by /proc/uptime against
  time.time() instead (10 ms resolution), unless the two disagree by more than 2 s (a container whose uptime is
  its own): then btime's.
  """
  if _began:
    return _began[0]
  return proc_start_t('self')


def proc_start_t(pid: int | str) -> float | None:
  """When process `pid` (or 'self') started, unix seconds, from Linux's /proc as process_start_t places it (the
  same clock, so `status` can tell a `start` event's process from a later one given its reused pid)."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      stat = f.read()
    since_boot = int(stat[stat.rindex(')') + 2:].split()[19]) / os.sysconf('SC_CLK_TCK')  # field 22
    with open('/proc/uptime') as f:
      uptime = float(f.read().split()[0])
    with open('/proc/stat') as f:
      btime = next(int(line.split()[1]) for line in f if line.startswith('btime '))
  except (OSError, ValueError, IndexError, StopIteration, AttributeError):
    return None
  now = time.time()
  started = now - (uptime - since_boot)
  if abs(started - (btime + since_boot)) > 2.0:
    started = btime + since_boot
  return started if started <= now else None


def start_fields() -> dict[str, float | str | bool]:
  """The `start` event's start-up fields that are known: `process_start_t`, `imported_s` (process start -> the
  heavy imports done) and `distributed_s` (paxml's setup_jax, jax.distributed.initialize in it; only under
  pax_autockpt.main, which brackets the call); `standby`: true for a standby that became this host; `hostname`:
  this machine's (with `pid` and `process_start_t`, `pax-autockpt status` finds a live run's process). A field
  not measured is absent."""
  fields = {'standby': True} if _began else {}
  fields['hostname'] = socket.gethostname()
  began = process_start_t()
  if began is not None:
    fields['process_start_t'] = round(began, 3)
    if IMPORTED in _marks:
      fields['imported_s'] = round(max(0.0, _marks[IMPORTED] - began), 3)
  if JAX_SETUP in _marks and _marks.get(VALIDATED, -1.0) >= _marks[JAX_SETUP]:
    fields['distributed_s'] = round(_marks[VALIDATED] - _marks[JAX_SETUP], 6)
  return fields
