"""One decision for all hosts: the primary host decides, every host reads it.

A save that only some hosts start deadlocks the next collective, and time- or progress-based
decisions differ between hosts. As orbax-latest does, the primary host (process 0) decides; here
the answer travels through jax.distributed's key-value store (the coordination service).
"""

from typing import Callable

import jax
from jax._src import distributed

_PREFIX = 'autockpt/decision/'
_TIMEOUT_MS = 10 * 60 * 1000  # a peer stuck for 10 minutes is dead: fail rather than hang


class PrimaryDecides:
  """Call once per loop iteration on every host, in the same order."""

  def __init__(self, process_index: int):
    self._client = distributed.global_state.client
    self._primary = process_index == 0
    self._n = 0

  @property
  def needed(self) -> bool:
    """False with one process: nothing to agree on."""
    return self._client is not None and jax.process_count() > 1

  def __call__(self, decide: Callable[[], bool]) -> bool:
    if not self.needed:
      return decide()
    key = f'{_PREFIX}{self._n}'
    if self._primary:
      answer = decide()
      self._client.key_value_set(key, '1' if answer else '0')
      if self._n >= 2:
        # Every host has read n-2: it took part in the step n-1 collectives that followed it.
        try:
          self._client.key_value_delete(f'{_PREFIX}{self._n - 2}')
        except TypeError:
          pass  # jaxlib 0.4.26 deletes, then cannot convert the returned absl::Status

    else:
      answer = self._client.blocking_key_value_get(key, _TIMEOUT_MS) == '1'
    self._n += 1
    return answer


def first_report(key: str, host: int, report: str | None) -> str | None:
  """Every host passes its own finding (or None) and gets the same answer back: the finding of the
  lowest-numbered host that had one, or None. For the main thread before training: it meets the other
  hosts at a barrier of the coordination service."""
  client = distributed.global_state.client
  if client is None or jax.process_count() == 1:
    return report
  client.key_value_set(f'{key}/host/{host}', report or '')
  client.wait_at_barrier(f'{key}/barrier', _TIMEOUT_MS)
  found = sorted((int(k.rsplit('/', 1)[-1]), v) for k, v in client.key_value_dir_get(f'{key}/host/') if v)
  return found[0][1] if found else None
