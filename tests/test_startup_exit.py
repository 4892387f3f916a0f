"""The start-up exit's one decision for every host (pax_autockpt.exit.startup_exit), with a coordination service
stand-in that behaves as jax's does for these calls (a key is written once; a blocking get waits for it)."""

import atexit
import threading
import types

import pytest

from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt.exit import startup_exit
from pax_autockpt.hook import checkpointer as checkpointer_lib
from pax_autockpt.shared import coordination
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import internals
from pax_autockpt.shared import stops
from pax_autockpt.signals import signals
from tests import fakes


class _Service:
  def __init__(self):
    self.values, self.cond = {}, threading.Condition()

  def key_value_set(self, key, value):
    with self.cond:
      if key in self.values:
        raise RuntimeError(f'ALREADY_EXISTS: {key}')
      self.values[key] = value
      self.cond.notify_all()

  def blocking_key_value_get(self, key, timeout_ms):
    with self.cond:
      if not self.cond.wait_for(lambda: key in self.values, timeout_ms / 1000):
        raise RuntimeError('DEADLINE_EXCEEDED')
      return self.values[key]


def _hosts(tmp_path, service, nothing_to_save=lambda: True):
  return [startup_exit.StartupExit(service, h, events_lib.EventLog(tmp_path, h), 143, 300.0, nothing_to_save,
                                   lambda: 400) for h in (0, 1)]


def test_a_signal_on_one_host_ends_every_host_with_one_line_and_its_events(tmp_path, exits):
  codes, cond = exits
  hosts = _hosts(tmp_path, _Service())
  signals._record(15, None)  # pylint: disable=protected-access  (host 1's signal, recorded as the watcher does)
  with cond:
    assert cond.wait_for(lambda: len(codes) == 2, 10)
  assert [c for _, c in codes] == [143, 143]
  for host in (0, 1):
    start, preemption, exit_ = [e for e in events_lib.read(tmp_path, host)]  # no `start` yet: the exit writes it
    assert start['event'] == 'start' and start['before_restore'] and start['restored_step'] == 400
    assert preemption['plan'] == 'nothing_to_save' and preemption['during'] == 'start-up'
    assert preemption['saved_step'] == 400 and exit_['code'] == 143
  del hosts


def test_once_the_first_step_completed_a_signal_takes_the_ordinary_path(tmp_path, exits):
  codes, _ = exits
  service = _Service()
  hosts = _hosts(tmp_path, service)
  hosts[0].first_step_done()
  hosts[1].first_step_done()
  signals._record(15, None)  # pylint: disable=protected-access
  assert service.values[coordination.STARTUP_EXIT] == 'trained' and codes == []


def test_nothing_claimed_where_a_save_is_needed(tmp_path, exits):
  codes, _ = exits
  service = _Service()
  _hosts(tmp_path, service, nothing_to_save=lambda: False)
  signals._record(15, None)  # pylint: disable=protected-access
  assert coordination.STARTUP_EXIT not in service.values and codes == []


def test_a_host_that_finishes_its_first_step_after_another_claimed_the_exit_ends_too(tmp_path, exits):
  codes, cond = exits
  service = _Service()
  service.key_value_set(coordination.STARTUP_EXIT, 'exit|SIGINT|1')  # host 1 got a Ctrl-C during the compile
  host = startup_exit.StartupExit(None, 0, events_lib.EventLog(tmp_path, 0), 143, 300.0, lambda: True, lambda: 400)
  host._client = service  # pylint: disable=protected-access  (no waiting thread: the main thread finds it)
  with pytest.raises(fakes.ProcessExited):
    host.first_step_done()
  assert codes[-1][1] == signals.INTERRUPT_EXIT_CODE
  del cond


def test_the_waiting_thread_and_the_main_thread_finding_the_claim_end_the_process_once(tmp_path, exits):
  """The main thread may finish the first step while the waiting thread writes the exit's events: it finds
  the claim too, and waits for the process to end instead of writing them again."""
  codes, cond = exits
  service = _Service()
  host = startup_exit.StartupExit(service, 0, events_lib.EventLog(tmp_path, 0), 143, 300.0, lambda: True,
                                  lambda: 400)
  host._exiting.acquire()  # pylint: disable=protected-access  (the waiting thread is writing the events)
  main = threading.Thread(target=host.first_step_done, daemon=True)
  service.key_value_set(coordination.STARTUP_EXIT, 'exit|SIGTERM|1')
  main.start()
  main.join(1.0)
  assert main.is_alive() and events_lib.read(tmp_path) == []  # waits for the end; nothing written twice
  atexit.unregister(host._release)  # pylint: disable=protected-access  (its threads wait for an end that is faked)
  del codes, cond


def test_a_main_thread_that_took_the_exit_first_ends_the_process_alone(tmp_path, exits):
  """A signal before the first step, seen by both the main thread at the loop's first iteration (it took the
  exit path: it writes the `preemption` and `exit` events) and this waiting thread: the waiting thread writes
  nothing and does not end the process (two `preemption` events on host 0 broke a 2-host Ctrl-C run)."""
  codes, cond = exits
  service = _Service()
  taken = threading.Event()
  host = startup_exit.StartupExit(service, 0, events_lib.EventLog(tmp_path, 0), 143, 300.0, lambda: True,
                                  lambda: 400, take_over=lambda: not taken.is_set())
  taken.set()  # the main thread's ExitPath.take_over() came first
  signals._record(15, None)  # pylint: disable=protected-access
  waiting = threading.Thread(target=lambda: host._exit('exit|SIGTERM|0'), daemon=True)  # pylint: disable=protected-access
  waiting.start()
  waiting.join(1.0)
  assert waiting.is_alive() and events_lib.read(tmp_path) == [] and codes == []
  atexit.unregister(host._release)  # pylint: disable=protected-access
  del cond


# --- a restored local step the job directory lacks ----------------------------------------------------


def _restored_local_step_20(job, job_dir_steps):
  """A checkpointer around the fake, before its first step, whose restore took local step 20 from the local tier
  while the job directory holds `job_dir_steps` (the restorer's state as its local restore leaves it)."""
  for step in job_dir_steps:
    fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), step))
  fake = fakes.FakePaxCheckpointer(job)
  ckpt = checkpointer_lib.AutockptCheckpointer(
      fake, settings=settings_lib.Settings(notices='off'), events=events_lib.EventLog(job, 0),
      exit_after_ondemand_checkpoint=True, enable_summaries=False)
  restorer = ckpt._restorer  # pylint: disable=protected-access
  restorer._local = types.SimpleNamespace(agreed_newest=max(job_dir_steps))  # pylint: disable=protected-access
  internals.restore_step(fake, 20)
  restorer._local_step, restorer.restored_from = 20, events_lib.LOCAL  # pylint: disable=protected-access
  return ckpt, fake


def test_a_signal_before_the_first_step_saves_a_restored_local_step_the_job_directory_lacks(tmp_path, exits):
  """Local step 20 restored, the job directory's newest is 10: the local disks may go with the VMs, so a SIGTERM
  during the compile must not end the job at once (it would lose steps 11-20); the first iteration saves step 20
  to the job directory, then exits as at any agreed step."""
  codes, _ = exits
  job = tmp_path / 'job'
  ckpt, fake = _restored_local_step_20(job, [10])
  fakes.preempt()  # during the compile: the start-up exit's thread decides
  assert codes == [] and fakes.events(job, 'preemption') == []
  with pytest.raises(stops.Preempted, match='On-demand checkpoint of step 20 committed'):
    ckpt.save_if_needed(20, fakes.STATE)  # the loop's first iteration
  assert fake.orbax.attempts == [20] and layout.committed_steps(layout.checkpoint_dir(job)) == [10, 20]
  preemption, = fakes.events(job, 'preemption')
  assert (preemption['plan'], preemption['saved_step']) == ('save', 20), preemption
  assert codes == []


def test_a_signal_before_the_first_step_saves_nothing_when_the_job_directory_holds_the_restored_local_step(
    tmp_path, exits):
  """The same, with step 20 in the job directory too: nothing is only on local disks, the start-up exit ends the
  job at once (143) and no save starts."""
  codes, _ = exits
  job = tmp_path / 'job'
  ckpt, fake = _restored_local_step_20(job, [10, 20])
  fakes.preempt()  # the process ends (its exit faked: it ends the callback, which the record outlives)
  assert [code for _, code in codes] == [143]
  preemption, = fakes.events(job, 'preemption')
  assert (preemption['plan'], preemption['saved_step'], preemption['during']) == ('nothing_to_save', 20, 'start-up')
  assert fake.orbax.attempts == [] and layout.committed_steps(layout.checkpoint_dir(job)) == [10, 20]
