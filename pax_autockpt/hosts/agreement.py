"""One decision for all hosts: the primary host decides, every host reads it.

A save that only some hosts start deadlocks the next collective, and time- or progress-based
decisions differ between hosts. As orbax-latest does, the primary host (process 0) decides; here
the answer travels through jax.distributed's key-value store (the coordination service, on host 0).

Every host's read is one request the coordinator serves: measured here (bench `decision_scale`), a read
per host per step costs the coordinator ~30 us of CPU per host and the slowest host tens of ms at a
thousand hosts, every step. So the answer is exchanged once every `decision_interval(hosts)` steps: every
step up to 64 hosts (unchanged), then at most ~64 reads per step on average. The primary still asks the
policy every step; a save it asks for between exchanges is kept and taken at the next exchange, on every
host (at most interval - 1 steps later).

The restore's waits (`reports`: the local tier's plan and fill, each phase of the restore's agreement) count
from the last sign of progress, not from the first arrival: a host that reads or transfers for an hour keeps
every other host waiting (`working`, `moved`); one that shows none for STALL_SECS ends the wait on every host
with one agreed line (`Timeout`), never a traceback.
"""

import contextlib
import math
import threading
import time
from typing import Any, Callable

from absl import logging
import jax

from pax_autockpt.shared import coordination

_TIMEOUT_MS = 10 * 60 * 1000  # a peer stuck for 10 minutes is dead: fail rather than hang
READS_PER_STEP = 64  # the coordinator serves at most about this many decision reads per step
STALL_SECS = 10 * 60  # a restore-time wait ends once no host it waits for has shown progress for this long
BEAT_SECS = 5.0  # a working host publishes its progress at most this often (and not at all for shorter work)
_SETTLE_MS = 60 * 1000  # the outcome is set before anyone reads it: this bounds only a lost coordinator
_moves = 0  # signs of progress this process made (`moved`)


def decision_interval(process_count: int) -> int:
  """Steps between exchanges of the decision: 1 up to READS_PER_STEP hosts, then ceil(hosts / 64)."""
  return max(1, math.ceil(process_count / READS_PER_STEP))


class PrimaryDecides:
  """Call once per loop iteration on every host, in the same order; every host gets the same answer."""

  def __init__(self, process_index: int, client=None, process_count: int | None = None,
               interval: int | None = None, prefix: str = coordination.SAVE_DECISIONS):
    """`client` and `process_count` default to jax.distributed's; given, they let a simulation run many
    hosts' decisions in one process (rigs.decision_sim). `interval` defaults to
    `decision_interval(process_count)`: the same on every host. Each question asked every iteration
    (the job directory's save, the local tier's) has its own `prefix`."""
    self._prefix = prefix
    self._client = coordination.client() if client is None else client
    self._count = process_count
    self._interval = interval
    self._primary = process_index == 0
    self._calls = 0
    self._exchanges = 0
    self._wanted = False  # primary: a save the policy asked for since the last exchange

  @property
  def needed(self) -> bool:
    """False with one process: nothing to agree on."""
    return self._client is not None and self.process_count > 1

  @property
  def process_count(self) -> int:
    return jax.process_count() if self._count is None else self._count

  @property
  def interval(self) -> int:
    return self._interval or decision_interval(self.process_count)

  def __call__(self, decide: Callable[[], bool]) -> bool:
    if not self.needed:
      return decide()
    if self._primary:
      self._wanted = bool(decide()) or self._wanted
    exchange = self._calls % self.interval == 0
    self._calls += 1
    return self._exchange() if exchange else False

  def _exchange(self) -> bool:
    """The primary publishes what it kept, every other host waits for it."""
    key = f'{self._prefix}{self._exchanges}'
    if self._primary:
      answer, self._wanted = self._wanted, False
      self._client.key_value_set(key, '1' if answer else '0')
      if self._exchanges >= 2:
        # Every host has read n-2: it took part in the collectives of the steps that followed it.
        coordination.delete(self._client, f'{self._prefix}{self._exchanges - 2}')
    else:
      answer = self._client.blocking_key_value_get(key, _TIMEOUT_MS) == '1'
    self._exchanges += 1
    return answer


class Timeout(Exception):
  """A restore-time wait that some host stopped making progress toward: the same line on every host (the first
  host to give up settles it for all), and `by`, that host."""

  def __init__(self, line: str, by: int):
    super().__init__(line)
    self.by = by


def moved() -> None:
  """A sign of progress (a chunk read, hashed or received) that `working` publishes to the hosts waiting."""
  global _moves
  _moves += 1


def _service() -> tuple[Any, int]:
  """The coordination client and the number of hosts; (None, 1) with one process: nothing to wait for."""
  client = coordination.client()
  return (client, jax.process_count()) if client is not None and jax.process_count() > 1 else (None, 1)


@contextlib.contextmanager
def working(key: str, host: int):
  """While this host works toward `reports(key)` (reads, hashes, transfers), the hosts already waiting there
  see each sign of progress (`moved`), at most every BEAT_SECS: they wait as long as it moves, with no guess
  of a disk's or a network's rate. Work shorter than BEAT_SECS publishes nothing."""
  client, _ = _service()
  if client is None:
    yield
    return
  done = threading.Event()
  beat = threading.Thread(target=_beat, args=(client, f'{key}/progress/{host}/', done), daemon=True)
  beat.start()
  try:
    yield
  finally:
    done.set()
    beat.join()


def _beat(client: Any, prefix: str, done: threading.Event) -> None:
  """Publishes a new key under `prefix` whenever `_moves` changed (a key is set once), deleting the last."""
  seen, n = _moves, 0
  while not done.wait(BEAT_SECS):
    if _moves == seen:
      continue
    seen, n = _moves, n + 1
    try:
      client.key_value_set(f'{prefix}{n}', str(seen))
      if n > 1:
        coordination.delete(client, f'{prefix}{n - 1}')
    except Exception as e:  # pylint: disable=broad-except  (unseen progress: the others may give up sooner)
      logging.warning('[autockpt] could not publish this host\'s progress: %s', e)


def reports(key: str, host: int, report: str | None, within: float | None = None) -> dict[int, str]:
  """Every host passes its own finding (or None) and gets every host's findings back (host -> text),
  the same on every host. For the main thread (before training, or at a step every host saves): it
  meets the other hosts through the coordination service's key-value store, never a device collective. Each
  `key` is used once. The wait lasts while some host not yet there shows progress (`working`); once none
  has for STALL_SECS, every host raises the same `Timeout` (the first to give up settles it), even one that
  arrives later. No host waits longer than the last report takes to arrive. `within` (seconds) bounds the
  wait besides, progress or not: the exit path's waits end before the grace period does."""
  client, hosts = _service()
  if client is None:
    return {host: report} if report else {}
  client.key_value_set(f'{key}/host/{host}', report or '')
  end = None if within is None else time.monotonic() + within
  found, why = _gather(client, key, hosts, end)
  outcome = 'ok||' if why is None else f'timeout|{host}|{why}'
  kind, by, line = _settle(client, key, outcome, end).split('|', 2)
  if kind != 'ok':
    raise Timeout(line, int(by))
  found = _listing(client, key) if found is None else found  # another host saw every report first
  return {h: v for h, v in found.items() if v}


def _gather(client: Any, key: str, hosts: int, end: float | None = None
            ) -> tuple[dict[int, str] | None, str | None]:
  """Every host's report, each awaited in slices while any host shows progress; (None, why) once none has
  for STALL_SECS, or at `end` (time.monotonic()). A report already there costs no wait."""
  found = _listing(client, key)
  progress, still = _progress(client, key), time.monotonic()
  for h in range(hosts):
    while h not in found:
      try:
        found[h] = client.blocking_key_value_get(f'{key}/host/{h}', _slice_ms(end))
      except Exception as e:  # pylint: disable=broad-except
        if 'DEADLINE_EXCEEDED' not in str(e):
          raise
        if end is not None and time.monotonic() >= end and (missing := _missing(client, key, hosts)):
          return None, f'host(s) {missing} did not reach {key} in the time the wait had'
        now = _progress(client, key)
        if now != progress:
          progress, still = now, time.monotonic()
        elif time.monotonic() - still >= STALL_SECS:
          missing = sorted(set(range(hosts)) - _listing(client, key).keys())
          if missing:  # else the last report came meanwhile: the next get returns it
            return None, (f'host(s) {", ".join(map(str, missing))} made no progress for {STALL_SECS:g} s while the '
                          f'others waited at {key}')
  return found, None


def _slice_secs() -> float:
  """How long one wait for a report lasts before the waiting host looks at its peers' progress."""
  return min(2 * BEAT_SECS, STALL_SECS / 4)


def _slice_ms(end: float | None) -> int:
  """One wait's bound in milliseconds: a slice, no later than `end`."""
  left = _slice_secs() if end is None else min(_slice_secs(), end - time.monotonic())
  return max(10, int(left * 1000))


def _missing(client: Any, key: str, hosts: int) -> str:
  """The hosts whose report is not at `key`, as text ('' when none is missing)."""
  return ', '.join(map(str, sorted(set(range(hosts)) - _listing(client, key).keys())))


def _listing(client: Any, key: str) -> dict[int, str]:
  return {int(k.rsplit('/', 1)[-1]): v for k, v in client.key_value_dir_get(f'{key}/host/')}


def _progress(client: Any, key: str) -> frozenset:
  return frozenset(client.key_value_dir_get(f'{key}/progress/'))


def _settle(client: Any, key: str, mine: str, end: float | None = None) -> str:
  """The first outcome any host set at `key` ('ok', or a timeout and its line), the same on every host: a key
  is set once, so a later host's set fails and it reads the first."""
  coordination.claim(client, f'{key}/outcome', mine)  # False: another host settled it first
  bound = _SETTLE_MS if end is None else max(10, min(_SETTLE_MS, int((end - time.monotonic()) * 1000)))
  return client.blocking_key_value_get(f'{key}/outcome', bound)


def first_report(key: str, host: int, report: str | None, within: float | None = None) -> str | None:
  """The finding of the lowest-numbered host that had one, or None, on every host (see `reports`)."""
  found = reports(key, host, report, within)
  return found[min(found)] if found else None
