"""Decides the step at which every host saves after a preemption signal (SIGTERM, or Ctrl-C)."""

import signal

from absl import logging

from pax_autockpt.hosts import agreement
from pax_autockpt.shared import coordination
from pax_autockpt.signals import signals


class PreemptionWatcher:
  """Answers, once per loop iteration, whether this is the step every host agreed to save at.

  With `jax.distributed` initialised, XLA's preemption sync manager catches SIGTERM on any host and
  agrees on a sync point across hosts (its counter's max + 1). It is fed a loop-iteration counter
  starting at 0, not the step: XLA's counter starts at 0, so after a restore at step N a SIGTERM
  that arrives before the loop's first call would set the sync point to 1 and never be reached
  (stock paxml then trains on until the 5-minute grace period ends). A Ctrl-C is published in the
  key-value store and re-raised as a SIGTERM to XLA (`signals.hand_over`). Without `jax.distributed`
  (one process) the signal is caught in Python and the next iteration is the agreed step.
  """

  def __init__(self):
    self._sync = coordination.preemption_sync_manager()
    self._client = coordination.client()
    self._iteration = 0
    self.agreed_step: int | None = None
    self.signal_name = signal.SIGTERM.name  # which signal the agreed step answers, once agreed
    signals.install_interrupt()  # also under stock paxml main
    if self._sync is None:
      if not signals.is_installed():
        signals.install()
      return
    got = signals.received()
    if got:
      # Came before jax.distributed.initialize replaced our SIGTERM handler with XLA's notifier (at the
      # C level: Python's signal.getsignal still reports ours). Hand it over.
      logging.info('[autockpt] Passing an early %s to XLA\'s preemption notifier.', signals.name(got[0]))
    signals.hand_over(self._publish_interrupt)

  def _publish_interrupt(self) -> None:
    """Runs in the Ctrl-C watcher thread, before the SIGTERM that starts the agreement. One key per host that
    got a Ctrl-C: at the agreed step every host reads them all, so that all of them exit 130 (not 143) even
    when only one was interrupted."""
    try:
      self._client.key_value_set(f'{coordination.CTRL_C_HOSTS}{coordination.process_id()}', 'SIGINT')
    except Exception as e:  # pylint: disable=broad-except  (the save matters more than the exit code)
      logging.warning('[autockpt] could not tell the other hosts about Ctrl-C: %s', e)

  def _agreed_signal(self) -> str:
    """SIGINT if any host got a Ctrl-C (published before its SIGTERM reached XLA), else SIGTERM."""
    if self._sync is None:
      got = signals.received()
      return signals.name(got[0]) if got else signal.SIGTERM.name
    if signals.interrupted():
      return signal.SIGINT.name
    try:
      published = self._client.key_value_dir_get(coordination.CTRL_C_HOSTS)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('[autockpt] could not read the hosts\' Ctrl-C flags: %s', e)
      published = []
    return signal.SIGINT.name if published else signal.SIGTERM.name

  @property
  def iteration(self) -> int:
    """How many agreement points this host has passed: the same on every host at the same point."""
    return self._iteration

  def check(self, step: int) -> bool:
    """Called once per loop iteration, on every host, before the step runs; and at each eval or decode batch
    (pax_autockpt.shared.phases) with the newest trained step: every host passes the same points in the same order."""
    if self.agreed_step is None:
      if self._sync is not None:
        hit = self._sync.reached_sync_point(self._iteration)
      else:
        hit = signals.received() is not None
      self._iteration += 1
      if hit:
        self.agreed_step = step
        self.signal_name = self._agreed_signal()
    return self.agreed_step == step

  def signalled_before_training(self, step: int) -> bool:
    """At the loop's first iteration, before its step compiles: whether any host got a SIGTERM or Ctrl-C
    during start-up or the restore, the same answer on every host (a coordination-service barrier, no
    device collective). XLA's notifier would agree on the iteration after this one, after a compilation
    and a step that gains nothing over the checkpoint just restored. When True, `step` is the agreed step
    (and Ctrl-C on any host wins, as at any step)."""
    got = signals.received()
    found = agreement.reports(coordination.SIGNAL_BEFORE_TRAINING, coordination.process_id() or 0,
                              signals.name(got[0]) if got else None)
    if not found:
      return False
    self.agreed_step = step
    self.signal_name = signal.SIGINT.name if signal.SIGINT.name in found.values() else signal.SIGTERM.name
    return True

  def agree_here(self, step: int) -> None:
    """One process whose main thread is held (pax_autockpt.exit.rescue): `step` is the agreed step, by the
    signal this process recorded."""
    got = signals.received()
    self.agreed_step = step
    self.signal_name = signals.name(got[0]) if got else signal.SIGTERM.name

  def is_agreed(self, step: int) -> bool:
    """Pure lookup, for Pax's and orbax's own `reached_preemption` calls."""
    return self.agreed_step == step
