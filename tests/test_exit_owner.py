"""One owner of the exit: the rescue's gate closes in one step with its phase check, the main thread owns the exit
after Pax's loop, and the watchdog ends the process whatever its line's write does. Interleavings are forced with
the stand-ins' hooks, not with sleeps."""

import io
import threading
import time

import pytest

from pax_autockpt import settings as settings_lib
from pax_autockpt.exit import exit_path as exit_path_lib
from pax_autockpt.exit import rescue as rescue_lib
from pax_autockpt.hook import checkpointer as checkpointer_lib
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import phases as phases_lib
from pax_autockpt.signals import grace
from tests import fakes
from tests import test_rescue
from tests.fakes import STATE

pytestmark = pytest.mark.usefixtures('clean_signals')


class _ExitPathThatLetsTheMainThreadMove(test_rescue._ExitPath):  # pylint: disable=protected-access
  """The first take_over runs `meanwhile` first: the main thread changes phase between the rescue's look and
  its close, the interleaving a real main thread hits once in a while."""

  def __init__(self, meanwhile):
    super().__init__()
    self._meanwhile = meanwhile

  def take_over(self):
    if self._meanwhile is not None:
      self._meanwhile, meanwhile = None, self._meanwhile
      meanwhile()
    return super().take_over()

  def release(self):
    if self.owner == threading.get_ident():
      self.owner = None


def test_a_train_step_entered_between_the_rescues_look_and_its_close_is_never_saved_beside(monkeypatch):
  """Seen failing before the gate's check and close were one step: the rescue closed the gate and saved step 7
  while the main thread was in the train step that donates step 7's buffers."""
  monkeypatch.setattr(rescue_lib, 'RESCUE_AFTER_SECS', 0.2)
  phases = phases_lib.LoopPhases()
  phases.trained(7, 'state-7')
  phases.enter(phases_lib.INPUT)
  exit_path = _ExitPathThatLetsTheMainThreadMove(lambda: phases.enter(phases_lib.TRAIN))
  rescue, ended, _ = test_rescue._rescue(phases, exit_path)  # pylint: disable=protected-access
  rescue.signal_arrived(15, time.time())
  time.sleep(1.0)  # the rescue looked (input), the main thread moved into the train step, the rescue backed off
  assert exit_path.saved == [] and not phases.closed and exit_path.owner is None
  phases.trained(8, 'state-8')  # the train step returned: a safe place again
  test_rescue._wait(lambda: ended)  # pylint: disable=protected-access
  assert [(s, state['partitioned_train_state']) for s, state, _ in exit_path.saved] == [(8, 'state-8')]


def _with_rescue(job, **settings):
  """A checkpointer around the fake, with the rescue wired (one process) and `end` recorded."""
  ended = []
  fake = fakes.FakePaxCheckpointer(job, interval=1000)
  ckpt = checkpointer_lib.AutockptCheckpointer(
      fake, settings=settings_lib.Settings(**settings), events=events_lib.EventLog(job, 0),
      exit_after_ondemand_checkpoint=True, enable_summaries=False, end=ended.append)
  ckpt._startup.first_step_done()  # pylint: disable=protected-access
  return ckpt, fake, ended


def test_a_signal_during_the_final_save_is_answered_by_it_not_by_a_second_save(tmp_path, monkeypatch):
  """Seen failing before save_final took the exit: the rescue found the main thread in `loop` during a slow final
  save, saved step 5 a second time and ended the process with 143 beside the main thread's exit 0."""
  monkeypatch.setattr(rescue_lib, 'RESCUE_AFTER_SECS', 0.2)
  ckpt, fake, ended = _with_rescue(tmp_path / 'job')
  for step in (1, 2, 3, 4):
    ckpt.save_if_needed(step, STATE)
  ckpt.phases.trained(5, STATE)
  fake.orbax.gate.clear()  # the final save commits only when the test says
  ckpt.save_final(5, **dict(partitioned_train_state=STATE))
  fakes.preempt()
  threading.Timer(1.5, fake.orbax.gate.set).start()  # long after the rescue's wait
  ckpt.wait_until_finished()
  time.sleep(0.5)
  assert fake.orbax.attempts == [5] and ended == []
  assert [e['event'] for e in fakes.events(tmp_path / 'job')].count('save_started') == 1


def test_with_exit_after_ondemand_off_an_eval_batch_preemption_saves_the_step_once(tmp_path, caplog):
  """Seen failing without `_saved_already`: the loop's checkpointer call at the same step saved it again (orbax's
  error, and the policy history lost the committed step)."""
  job = tmp_path / 'job'
  fake = fakes.FakePaxCheckpointer(job, interval=10)
  ckpt = checkpointer_lib.AutockptCheckpointer(
      fake, settings=settings_lib.Settings(), events=events_lib.EventLog(job, 0),
      exit_after_ondemand_checkpoint=False, enable_summaries=False)
  for step in range(1, 10):
    ckpt.save_if_needed(step, STATE)
  ckpt.phases.trained(10, STATE)
  fakes.preempt()
  ckpt.phases.point(phases_lib.EVAL)  # the eval after step 10: the hosts agree here, the step is saved
  ckpt.save_if_needed(10, STATE)  # then the loop's own call at step 10, on Pax's interval
  ckpt.wait_until_finished()
  assert fake.orbax.attempts.count(10) == 1 and fake.orbax.attempts[-1] == 10
  assert not [r for r in caplog.records if r.levelname == 'ERROR']


class _Exited(Exception):
  pass


class _Blocks(io.StringIO):
  """stderr as a pipe nobody drains: a write never returns."""

  def write(self, text):
    threading.Event().wait()


class _Broken(io.StringIO):
  """stderr as a pipe whose reader died (tee after Ctrl-C)."""

  def write(self, text):
    raise BrokenPipeError(32, 'Broken pipe')


@pytest.mark.parametrize('stderr', [_Blocks, _Broken])
def test_the_watchdog_ends_the_process_whatever_its_line_s_write_does(tmp_path, monkeypatch, stderr):
  """Seen failing with the line printed before os._exit: a broken stderr raised out of the watchdog's thread and a
  blocked one held it, and the process was never ended."""
  codes = []

  def fake_exit(code):
    codes.append(code)
    raise _Exited()

  monkeypatch.setattr(exit_path_lib.os, '_exit', fake_exit)
  monkeypatch.setattr(exit_path_lib.sys, 'stderr', stderr())
  ckpt, _ = fakes.wrap(tmp_path / 'job', interval=1000)
  watchdog = threading.Thread(target=_quietly(ckpt._exit._out_of_time, grace.Deadline(time.time(), 2.0)),  # pylint: disable=protected-access
                              daemon=True)
  watchdog.start()
  watchdog.join(grace.WATCHDOG_LEAD_SECS + 5)
  assert codes == [1]


def _quietly(function, *args):
  def run():
    try:
      function(*args)
    except _Exited:
      pass
  return run



def test_a_ctrl_c_is_bounded_by_the_grace_period_too_and_its_committed_exit_is_130(tmp_path, monkeypatch):
  """A Ctrl-C while a peer is stuck waited ~10 minutes, then ended in a Timeout traceback (read on the previous
  main: no watchdog was armed for SIGINT). Now the watchdog holds it to the grace period, one line, and a committed
  exit step still exits 130."""
  ckpt, _ = fakes.wrap(tmp_path / 'job', interval=1000)
  exit_path = ckpt._exit  # pylint: disable=protected-access
  arrival = time.time()
  exit_path.signal_arrived(2, arrival)
  assert exit_path._watchdog.deadline.at == pytest.approx(arrival + settings_lib.Settings().grace_secs)  # pylint: disable=protected-access
  fakes.preempt(2)
  assert exit_path._signal_code() == 130  # pylint: disable=protected-access
  exit_path._watchdog.cancel()  # pylint: disable=protected-access
