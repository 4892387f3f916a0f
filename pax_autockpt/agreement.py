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
"""

import math
from typing import Callable

import jax
from jax._src import distributed

_PREFIX = 'autockpt/decision/'
_TIMEOUT_MS = 10 * 60 * 1000  # a peer stuck for 10 minutes is dead: fail rather than hang
READS_PER_STEP = 64  # the coordinator serves at most about this many decision reads per step


def decision_interval(process_count: int) -> int:
  """Steps between exchanges of the decision: 1 up to READS_PER_STEP hosts, then ceil(hosts / 64)."""
  return max(1, math.ceil(process_count / READS_PER_STEP))


class PrimaryDecides:
  """Call once per loop iteration on every host, in the same order; every host gets the same answer."""

  def __init__(self, process_index: int, client=None, process_count: int | None = None,
               interval: int | None = None, prefix: str = _PREFIX):
    """`client` and `process_count` default to jax.distributed's; given, they let a simulation run many
    hosts' decisions in one process (pax_autockpt.tools.decision_sim). `interval` defaults to
    `decision_interval(process_count)`: the same on every host. Each question asked every iteration
    (the bucket's save, the local tier's) has its own `prefix`."""
    self._prefix = prefix
    self._client = distributed.global_state.client if client is None else client
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
        try:
          self._client.key_value_delete(f'{self._prefix}{self._exchanges - 2}')
        except TypeError:
          pass  # jaxlib 0.4.26 deletes, then cannot convert the returned absl::Status
    else:
      answer = self._client.blocking_key_value_get(key, _TIMEOUT_MS) == '1'
    self._exchanges += 1
    return answer


def reports(key: str, host: int, report: str | None) -> dict[int, str]:
  """Every host passes its own finding (or None) and gets every host's findings back (host -> text),
  the same on every host. For the main thread (before training, or at a step every host saves): it
  meets the other hosts at a barrier of the coordination service, never a device collective. Each
  `key` is used once."""
  client = distributed.global_state.client
  if client is None or jax.process_count() == 1:
    return {host: report} if report else {}
  client.key_value_set(f'{key}/host/{host}', report or '')
  client.wait_at_barrier(f'{key}/barrier', _TIMEOUT_MS)
  return {int(k.rsplit('/', 1)[-1]): v for k, v in client.key_value_dir_get(f'{key}/host/') if v}


def first_report(key: str, host: int, report: str | None) -> str | None:
  """The finding of the lowest-numbered host that had one, or None, on every host (see `reports`)."""
  found = reports(key, host, report)
  return found[min(found)] if found else None
