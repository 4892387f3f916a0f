"""AutockptExecutor.start: how a training process ends, with Pax's loop replaced by a fake one."""

import errno
import logging
import signal

from paxml import executors
import pytest

from pax_autockpt import executor as executor_lib
from pax_autockpt import settings as settings_lib
from pax_autockpt.shared import stops
from tests import fakes
from tests.fakes import STATE

pytestmark = pytest.mark.usefixtures('clean_signals')


@pytest.fixture
def job(tmp_path):
  return tmp_path / 'job'


@pytest.fixture
def run(job, monkeypatch):
  """run(loop, settings) -> the executor after start(); `loop(checkpointer)` stands in for Pax's
  training loop, over an AutockptCheckpointer around the fake (set directly, not by setup())."""

  def run(loop, settings=None):
    settings = settings or settings_lib.Settings()
    ckpt, _ = fakes.wrap(job, settings, interval=10)
    executor = executor_lib.AutockptExecutor(settings)
    executor._checkpointer = ckpt  # pylint: disable=protected-access
    executor._events = ckpt._events  # pylint: disable=protected-access
    monkeypatch.setattr(executors.DefaultExecutor, 'start', lambda self: loop(self._checkpointer))
    executor.start()
    return executor

  return run


def autockpt_errors(caplog):
  return [r.getMessage() for r in caplog.records
          if r.levelno >= logging.ERROR and r.getMessage().startswith('[autockpt]')]


def train(ckpt, steps, preempt_at=None, signum=signal.SIGTERM):
  """Pax's loop as far as the checkpointer sees it: save_if_needed before each step."""
  for step in steps:
    if step == preempt_at:
      fakes.preempt(signum)
    ckpt.save_if_needed(step, STATE)


@pytest.mark.parametrize('settings, code', [(settings_lib.Settings(), 143),
                                            (settings_lib.Settings(exit_code=99), 99)])
def test_preempted_exits_with_the_configured_code_and_exit_event_last(run, job, settings, code):
  """Preempted from the checkpointer -> SystemExit(exit_code) and an `exit` event {code, step}, last."""
  with pytest.raises(SystemExit) as exited:
    run(lambda ckpt: train(ckpt, range(1, 100), preempt_at=7), settings)
  assert exited.value.code == code
  assert [e['event'] for e in fakes.events(job)] == ['first_step', 'preemption', 'save_started', 'save_committed',
                                                   'exit']
  last = fakes.events(job)[-1]
  assert (last['code'], last['step']) == (code, 7)


@pytest.mark.parametrize('settings', [settings_lib.Settings(), settings_lib.Settings(exit_code=99)])
def test_ctrl_c_exits_130_whatever_the_preemption_code(run, job, settings):
  """A Ctrl-C is saved like a preemption but exits 130: a person stopped the run, no scheduler should
  restart it as preempted."""
  with pytest.raises(SystemExit) as exited:
    run(lambda ckpt: train(ckpt, range(1, 100), preempt_at=7, signum=signal.SIGINT), settings)
  assert exited.value.code == 130
  assert fakes.events(job, 'preemption')[0]['signal'] == 'SIGINT'
  assert [e['event'] for e in fakes.events(job)] == ['first_step', 'preemption', 'save_started', 'save_committed',
                                                   'exit']
  assert (fakes.events(job)[-1]['code'], fakes.events(job)[-1]['step']) == (130, 7)


def test_save_failed_exits_1_with_one_error_line(run, job, caplog):
  """SaveFailed -> SystemExit(1), `exit` event code 1 at its step, one error line with its message."""
  message = 'On-demand checkpoint of step 13 failed to commit; the newest committed checkpoint is 10'

  def loop(ckpt):
    del ckpt
    raise stops.SaveFailed(13, message)

  with pytest.raises(SystemExit) as exited:
    run(loop)
  assert exited.value.code == 1
  exits = fakes.events(job, 'exit')
  assert [(e['code'], e['step']) for e in exits] == [(1, 13)]
  assert fakes.events(job)[-1]['event'] == 'exit'
  assert autockpt_errors(caplog) == [f'[autockpt] {message}; exiting 1.']


@pytest.mark.parametrize('error', [RuntimeError('summary writer: No space left on device'),
                                   OSError(errno.ENOSPC, 'disk full')])
def test_disk_full_outside_a_save_exits_1_naming_the_newest_committed(run, job, caplog, error):
  """ENOSPC from the loop (by message or errno) -> SystemExit(1), one line naming the step and the
  newest committed checkpoint."""

  def loop(ckpt):
    train(ckpt, range(10, 13))
    ckpt.wait_until_finished()  # 10 committed
    raise error

  with pytest.raises(SystemExit) as exited:
    run(loop)
  assert exited.value.code == 1
  assert [(e['code'], e['step']) for e in fakes.events(job, 'exit')] == [(1, 12)]
  line, = autockpt_errors(caplog)
  assert 'the newest committed checkpoint is 10' in line
  assert 'training stopped at step 12' in line and '\n' not in line


def test_other_exceptions_propagate_unchanged(run, job):
  """Any other exception: raised as it was, no `exit` event (it is not a clean end)."""
  error = ValueError('a bug in the model')

  def loop(ckpt):
    train(ckpt, range(1, 5))
    raise error

  with pytest.raises(ValueError) as raised:
    run(loop)
  assert raised.value is error
  assert fakes.events(job, 'exit') == []


def test_normal_end_writes_exit_0(run, job):
  """The loop returns: an `exit` event with code 0 and the last step, and no SystemExit."""

  def loop(ckpt):
    train(ckpt, range(1, 21))
    ckpt.wait_until_finished()

  run(loop)
  assert [(e['code'], e['step']) for e in fakes.events(job, 'exit')] == [(0, 20)]
  assert fakes.events(job)[-1]['event'] == 'exit'
