"""A signal during the first compile: the compile finishes into the compilation cache when the grace period holds it.

Before the first step nothing is trained, so a SIGTERM then has nothing to save (pax_autockpt.exit.startup_exit), and
the grace period would go unused. But a compile in flight is work too: JAX writes an executable to the persistent
compilation cache only once its compile completes, so a job killed 15 s into a 20 s compile pays the whole compile
again at its next start, and under failures that come faster than a restart a job may never train at all. So when
the signal finds the main thread in the first train step's call (its trace and compile) and the compilation cache
is on, `FirstCompile.decide` projects the rest of the compile from this job's own measured compile (the `first_step`
events of earlier runs that paid one; DEFAULT_COMPILE_S where none did) with grace.MARGIN_FACTOR, and keeps
grace.MARGIN_SECS and the watchdog's lead: where that fits, every host lets its compile finish (JAX writes the entry
before the call returns; only process 0 writes) and exits 143 when its main thread comes back to the loop; else it
exits at once, as before. A Ctrl-C (a person waiting) exits at once unless --autockpt_finish_first_compile says
`sigterm_and_ctrl_c`.

`counts()`: what this process's compiles cost so far, from JAX's own monitoring events (a compile, or a load from
the persistent cache): the `first_step` event records it, so that a restart that still compiles is seen in the
event log, not guessed from its speed.
"""

import dataclasses
import signal
import threading
from typing import Any, Iterable

import jax
from jax._src import dispatch

from pax_autockpt.shared import phases as phases_lib
from pax_autockpt.signals import grace

SIGTERM_ONLY, SIGTERM_AND_CTRL_C, OFF = 'sigterm', 'sigterm_and_ctrl_c', 'off'  # --autockpt_finish_first_compile
CHOICES = (SIGTERM_ONLY, SIGTERM_AND_CTRL_C, OFF)
DEFAULT_COMPILE_S = 120.0  # no compile of this job measured yet: a large model's, so that a short grace exits at once
_CACHE_HIT = '/jax/compilation_cache/cache_hits'

_lock = threading.Lock()
_in_thread = threading.local()  # a cache hit is recorded inside the call whose duration follows, in the same thread
_totals = {'cache_hits': 0, 'compiles': 0, 'compiles_s': 0.0, 'uncached_compile_s': 0.0}
_watching: list[bool] = []


def watch() -> None:
  """Counts compiles from now on (once per process; before the first compile: pax_autockpt.main, before the cache
  is set)."""
  with _lock:
    if _watching:
      return
    _watching.append(True)
  jax.monitoring.register_event_listener(_on_event)
  jax.monitoring.register_event_duration_secs_listener(_on_duration)


def _on_event(event: str, **kwargs) -> None:
  del kwargs
  if event == _CACHE_HIT:
    _in_thread.hit = True


def _on_duration(event: str, secs: float, **kwargs) -> None:
  """JAX's backend compile event closes every compile request: a cache load if a hit came first in this thread, a
  compile the cache keeps if it took JAX's threshold or longer, else one it never keeps (paid at every start)."""
  del kwargs
  if event != dispatch.BACKEND_COMPILE_EVENT:
    return
  hit, _in_thread.hit = getattr(_in_thread, 'hit', False), False
  with _lock:
    if hit:
      _totals['cache_hits'] += 1
    elif secs >= jax.config.jax_persistent_cache_min_compile_time_secs:
      _totals['compiles'] += 1
      _totals['compiles_s'] += secs
    else:
      _totals['uncached_compile_s'] += secs


def counts() -> dict[str, int | float]:
  """For the `first_step` event (CONTRACT §6): `cache_hits` (executables loaded from the persistent cache),
  `compiles` and `compiles_s` (compiles paid that took JAX's cache threshold or longer: the ones a restart could
  load), `uncached_compile_s` (the seconds of the shorter ones, which JAX never caches). Empty when not watched."""
  with _lock:
    if not _watching:
      return {}
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in _totals.items()}


def measured_compile_s(past: Iterable[dict[str, Any]]) -> float | None:
  """The longest first-step compile of this job's earlier runs (their `first_step` events' `compile_s`), counting
  only the runs that paid a compile (`compiles` > 0; an event from before that field was recorded counts); None
  when no run measured one."""
  got = [e['compile_s'] for e in past if e.get('event') == 'first_step' and isinstance(e.get('compile_s'), (int, float))
         and e.get('compiles', 1) > 0]
  return max(got, default=None)


@dataclasses.dataclass(frozen=True)
class Decision:
  finish: bool  # let the compile in flight finish, then exit
  note: str  # why not, for the exit line ('' where no compile was in flight)
  compiling_for_s: float = 0.0


def project(remaining_s: float, compiling_for_s: float, compile_s: float | None) -> Decision:
  """Whether the rest of a compile `compiling_for_s` in fits in `remaining_s`: this job's measured compile (or
  DEFAULT_COMPILE_S) times grace.MARGIN_FACTOR, less what is done, plus the exit's margin and the watchdog's lead."""
  estimate = DEFAULT_COMPILE_S if compile_s is None else compile_s
  left = max(0.0, estimate * grace.MARGIN_FACTOR - compiling_for_s)
  needed = left + grace.MARGIN_SECS + grace.WATCHDOG_LEAD_SECS
  measured = 'this job' if compile_s is not None else 'none measured yet: default'
  if needed <= remaining_s:
    return Decision(True, '', compiling_for_s)
  return Decision(False, f'~{needed:.0f} s more projected (a compile takes ~{estimate:.0f} s, {measured}), '
                  f'{remaining_s:.0f} s of the grace period left', compiling_for_s)


def cache_on() -> bool:
  """Whether JAX's persistent compilation cache is set (pax_autockpt.startup.compilation_cache, or the user's own)."""
  return bool(jax.config.jax_compilation_cache_dir)


class FirstCompile:
  """What the start-up exit asks when a signal comes before the first step: finish the compile in flight?"""

  def __init__(self, phases: phases_lib.LoopPhases, setting: str, past: Iterable[dict[str, Any]]):
    self._phases, self._setting = phases, setting
    self._compile_s = measured_compile_s(past)

  def decide(self, signum: int, arrival: float, grace_secs: float, now: float) -> Decision:
    """In the thread that recorded the signal: no I/O, no wait."""
    place = self._phases.now()
    if place.phase != phases_lib.TRAIN or self._phases.first_train_s is not None:
      return Decision(False, '')  # no compile in flight: the exit at once, as ever
    compiling_for = max(0.0, now - place.since)
    if not cache_on():
      return Decision(False, 'no compilation cache keeps it (--autockpt_compilation_cache)', compiling_for)
    if self._setting == OFF or (signum == signal.SIGINT and self._setting != SIGTERM_AND_CTRL_C):
      flag = 'sigterm_and_ctrl_c' if signum == signal.SIGINT else 'sigterm'
      return Decision(False, f'--autockpt_finish_first_compile={flag} would finish it', compiling_for)
    return project(arrival + grace_secs - now, compiling_for, self._compile_s)
