"""The Python-side SIGTERM record and the single-process preemption watcher (real signals)."""

import os
import signal

import pytest

from pax_autockpt import preemption
from pax_autockpt import signals


@pytest.fixture
def clean_signals():
  saved = signal.getsignal(signal.SIGTERM)
  signals._received.clear()  # pylint: disable=protected-access
  yield
  signals._received.clear()  # pylint: disable=protected-access
  signal.signal(signal.SIGTERM, saved)


def test_sigterm_is_recorded_not_fatal(clean_signals):
  signals.install()
  assert signals.is_installed() and signals.received() is None
  os.kill(os.getpid(), signal.SIGTERM)
  os.kill(os.getpid(), signal.SIGTERM)  # a second one changes nothing
  signum, when = signals.received()
  assert signum == signal.SIGTERM and when > 0 and signals.name(signum) == 'SIGTERM'


def test_single_process_watcher_agrees_on_the_next_step(clean_signals):
  watcher = preemption.PreemptionWatcher()  # no jax.distributed here: Python fallback
  assert signals.is_installed()
  assert [watcher.check(s) for s in (10, 11)] == [False, False]
  os.kill(os.getpid(), signal.SIGTERM)
  assert watcher.check(12) is True
  assert watcher.agreed_step == 12 and watcher.is_agreed(12) and not watcher.is_agreed(13)
  assert watcher.check(13) is False  # decided once
  assert watcher.signal_name == 'SIGTERM'
