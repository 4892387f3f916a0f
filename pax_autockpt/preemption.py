"""Decides the step at which every host saves after a preemption signal."""

import signal

from absl import logging
from jax._src import distributed

from pax_autockpt import signals


class PreemptionWatcher:
  """Answers, once per loop iteration, whether this is the step every host agreed to save at.

  With `jax.distributed` initialised, XLA's preemption sync manager catches SIGTERM on any host and
  agrees on a sync point across hosts (its counter's max + 1). It is fed a loop-iteration counter
  starting at 0, not the step: XLA's counter starts at 0, so after a restore at step N a SIGTERM
  that arrives before the loop's first call would set the sync point to 1 and never be reached
  (stock paxml then trains on until the 5-minute grace period ends). Without `jax.distributed`
  (one process) the signal is caught in Python and the next iteration is the agreed step.
  """

  def __init__(self):
    self._sync = distributed.global_state.preemption_sync_manager
    self._iteration = 0
    self.agreed_step: int | None = None
    if self._sync is None:
      if not signals.is_installed():
        signals.install()
    elif signals.received():
      # SIGTERM came before jax.distributed.initialize replaced our handler with XLA's notifier
      # (at the C level: Python's signal.getsignal still reports ours). Hand it over.
      logging.info('[autockpt] Passing an early %s to XLA\'s preemption notifier.',
                   signals.name(signals.received()[0]))
      signals.redeliver()

  @property
  def signal_name(self) -> str:
    got = signals.received()
    return signals.name(got[0]) if got and self._sync is None else signal.SIGTERM.name

  def check(self, step: int) -> bool:
    """Called once per loop iteration, on every host, before the step runs."""
    if self.agreed_step is None:
      if self._sync is not None:
        hit = self._sync.reached_sync_point(self._iteration)
      else:
        hit = signals.received() is not None
      self._iteration += 1
      if hit:
        self.agreed_step = step
    return self.agreed_step == step

  def is_agreed(self, step: int) -> bool:
    """Pure lookup, for Pax's and orbax's own `reached_preemption` calls."""
    return self.agreed_step == step
