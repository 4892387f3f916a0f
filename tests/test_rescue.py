"""pax_autockpt.exit.rescue's decisions with a stand-in exit path: when it saves from its thread, and when it must
not."""

import signal
import threading
import time

import pytest

from pax_autockpt.exit import rescue as rescue_lib
from pax_autockpt.shared import phases as phases_lib
from pax_autockpt.shared import stops
from pax_autockpt.signals import grace


class _ExitPath:
  """The exit path's side the rescue uses: the first thread to take it owns it."""

  def __init__(self):
    self.owner = None
    self.saved = []

  def take_over(self):
    if self.owner is None:
      self.owner = threading.get_ident()
    return self.owner == threading.get_ident()

  @property
  def taken(self):
    return self.owner is not None

  def on_preemption(self, step, state, agreed_during):
    self.saved.append((step, state, agreed_during))
    raise stops.Preempted(step, f'On-demand checkpoint of step {step} committed')


@pytest.fixture
def fast(monkeypatch):
  monkeypatch.setattr(rescue_lib, 'RESCUE_AFTER_SECS', 0.3)


def _rescue(phases, exit_path, grace_secs=60.0, first_step=0):
  ended, agreed = [], []
  rescue = rescue_lib.Rescue(phases=phases, exit_path=exit_path, agree=agreed.append,
                             state_of=lambda state: {'partitioned_train_state': state}, end=ended.append,
                             grace_secs=grace_secs, first_step=lambda: first_step)
  return rescue, ended, agreed


def _held_in(phase, step=7):
  phases = phases_lib.LoopPhases()
  phases.trained(step, 'state')
  phases.enter(phase)
  return phases


def test_a_main_thread_held_in_the_input_is_rescued_after_the_wait(fast):
  del fast
  phases, exit_path = _held_in(phases_lib.INPUT), _ExitPath()
  rescue, ended, agreed = _rescue(phases, exit_path)
  arrival = time.time()
  rescue.signal_arrived(signal.SIGTERM, arrival)
  _wait(lambda: ended)
  assert time.time() - arrival >= 0.3
  assert exit_path.saved == [(7, {'partitioned_train_state': 'state'}, 'rescue')] and agreed == [7]
  assert isinstance(ended[0], stops.Preempted) and ended[0].step == 7
  assert phases.closed  # the main thread stops at its next phase change


def test_a_main_thread_that_takes_the_exit_first_is_left_to_it(fast):
  del fast
  phases, exit_path = _held_in(phases_lib.EVAL), _ExitPath()
  rescue, ended, _ = _rescue(phases, exit_path)
  rescue.signal_arrived(signal.SIGTERM, time.time())
  assert exit_path.take_over()  # the main thread, at an eval batch
  time.sleep(0.8)
  assert exit_path.saved == [] and ended == [] and not phases.closed


def test_no_rescue_inside_the_train_step_until_it_returns(fast):
  """The train step's dispatch donates the state's buffers: the rescue waits for the step's new state."""
  del fast
  phases, exit_path = _held_in(phases_lib.TRAIN), _ExitPath()
  rescue, ended, _ = _rescue(phases, exit_path)
  rescue.signal_arrived(signal.SIGTERM, time.time())
  time.sleep(0.8)
  assert ended == []
  phases.trained(8, 'new state')
  _wait(lambda: ended)
  assert exit_path.saved[0][:2] == (8, {'partitioned_train_state': 'new state'})


@pytest.mark.parametrize('phase', [phases_lib.CHECKPOINT, phases_lib.START_UP])
def test_never_beside_the_checkpointer_or_before_the_first_step(fast, phase):
  del fast
  phases, exit_path = _held_in(phase), _ExitPath()
  rescue, ended, _ = _rescue(phases, exit_path, grace_secs=4.0)
  rescue.signal_arrived(signal.SIGTERM, time.time())
  time.sleep(1.5)
  assert ended == [] and not exit_path.taken


def test_nothing_trained_since_the_restore_is_not_saved(fast):
  del fast
  phases, exit_path = _held_in(phases_lib.INPUT, step=100), _ExitPath()
  rescue, ended, _ = _rescue(phases, exit_path, grace_secs=4.0, first_step=100)
  rescue.signal_arrived(signal.SIGTERM, time.time())
  time.sleep(1.0)
  assert ended == [] and not exit_path.taken


def test_no_rescue_once_the_budget_cannot_hold_a_save():
  """Less than the watchdog's lead and the exit's margin left: the watchdog's line, not a save cut short."""
  phases, exit_path = _held_in(phases_lib.INPUT), _ExitPath()
  rescue, ended, _ = _rescue(phases, exit_path, grace_secs=60.0)
  late = time.time() - 60.0 + grace.WATCHDOG_LEAD_SECS + grace.MARGIN_SECS - 0.5
  rescue.signal_arrived(signal.SIGTERM, late)
  time.sleep(0.5)
  assert ended == [] and not exit_path.taken


def test_the_wait_is_ten_seconds_or_a_quarter_of_a_short_budget():
  assert rescue_lib.wait_before_rescue(300) == rescue_lib.RESCUE_AFTER_SECS == 10.0
  assert rescue_lib.wait_before_rescue(20) == 5.0
  assert rescue_lib.wait_before_rescue(None) == 10.0  # Ctrl-C: no deadline


def _wait(condition, timeout=5.0):
  end = time.time() + timeout
  while not condition():
    assert time.time() < end, 'timed out'
    time.sleep(0.02)
