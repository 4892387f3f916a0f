"""The loop's phases and the agreement points inside eval and decode programs (pax_autockpt.shared.phases), around
stand-ins for paxml's programs and a fake Pax checkpointer: no training process."""

import threading

import pytest

from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt.shared import internals
from pax_autockpt.shared import phases as phases_lib
from pax_autockpt.shared import stops
from tests import fakes
from tests.fakes import STATE

pytestmark = pytest.mark.usefixtures('clean_signals')


class _TrainProgram:
  """paxml's train program as the loop uses it: `run` fetches the input, calls `train_step` through self,
  then the eval step on the train input."""

  def __init__(self, seen):
    self.seen = seen

  def run(self, state, step):
    self.seen.append('get_next')
    new_step, new_state, _ = self.train_step(step, state, None, None, None)
    self._maybe_run_eval_train(new_state, new_step)
    return new_state

  def train_step(self, step, state, *args):
    del args
    return step + 1, state, 'outputs'

  def _maybe_run_eval_train(self, new_state, new_step):
    self.seen.append(('eval_train', new_step, new_state))


class _EvalProgram:

  def __init__(self, batches, step_fn='eval_step'):
    self.batches = batches
    self.ran = 0
    self._step_fn = step_fn
    setattr(self, step_fn, self._step)

  def run(self, state, step):
    del step
    for _ in range(self.batches):
      getattr(self, self._step_fn)(state)
    return 'metrics'

  def _step(self, state):
    del state
    self.ran += 1


def _instrumented(batches=3):
  phases, seen = phases_lib.LoopPhases(), []
  train, evaluation, decode = _TrainProgram(seen), _EvalProgram(batches), _EvalProgram(batches, 'decode_step')
  internals.instrument_programs(train, [evaluation], [decode], phases)
  return phases, train, evaluation, decode


def test_the_phases_follow_the_loop_and_the_newest_trained_state_is_kept_by_reference():
  phases, train, evaluation, _ = _instrumented()
  points = []
  phases.on_point(lambda phase: points.append((phase, phases.now().step, phases.now().batch)))
  assert phases.now().phase == phases_lib.START_UP and phases.now().step is None
  train.run('s0', 0)
  assert phases.now().phase == phases_lib.LOOP and (phases.now().step, phases.now().state) == (1, 's0')
  evaluation.run(phases.now().state, 1)
  assert points == [('eval', 1, 1), ('eval', 1, 1), ('eval', 1, 2), ('eval', 1, 3)]  # eval-train's, then 3
  assert evaluation.ran == 3 and phases.now().phase == phases_lib.LOOP


def test_no_point_before_the_first_trained_step():
  """Before the first step (start-up), pax_autockpt.exit.startup_exit answers a signal: no point is offered."""
  phases, _, evaluation, _ = _instrumented()
  points = []
  phases.on_point(points.append)
  evaluation.run('s0', 0)
  assert points == [] and evaluation.ran == 3


def test_a_preemption_agreed_at_an_eval_batch_saves_the_trained_step_and_ends_the_eval(job_dir):
  """A signal during an eval: the next eval batch is the agreed point, the trained step (not the loop's last
  call, one step earlier) is saved and committed, Preempted ends the eval before its next batch."""
  ckpt, _ = fakes.wrap(job_dir, interval=1000)
  _, train, evaluation, _ = _with_programs(ckpt)
  ckpt.save_if_needed(0, STATE)
  ckpt.wait_until_finished()
  train.run(STATE, 0)  # step 0 -> 1, and the eval step on the train input: a point, nothing agreed yet
  fakes.preempt()
  with pytest.raises(stops.Preempted) as stop:
    evaluation.run(STATE, 1)
  assert stop.value.step == 1 and evaluation.ran == 0
  assert layout.committed_steps(layout.checkpoint_dir(job_dir)) == [0, 1]
  preemption, = fakes.events(job_dir, 'preemption')
  # The signal found the loop between programs; the hosts agreed at the eval's first batch.
  assert (preemption['step'], preemption['during'], preemption['agreed_during'], preemption['batch']) == (
      1, 'loop', 'eval', 1)
  assert ckpt.last_step == 1


def test_a_save_and_exit_notice_ends_a_decode_but_a_save_notice_waits_for_the_loop(job_dir):
  ckpt, _ = fakes.wrap(job_dir, settings_lib.Settings(notices='off', notice_action='save_and_exit'), interval=1000)
  _, train, _, decode = _with_programs(ckpt)
  ckpt.save_if_needed(0, STATE)
  ckpt.wait_until_finished()
  train.run(STATE, 0)
  ckpt._notices.announce('preempted', 'TRUE')  # pylint: disable=protected-access
  with pytest.raises(stops.Preempted) as stop:
    decode.run(STATE, 1)
  assert stop.value.step == 1 and decode.ran <= 1
  assert layout.committed_steps(layout.checkpoint_dir(job_dir)) == [0, 1]

  other = job_dir + '-save'
  ckpt, _ = fakes.wrap(other, settings_lib.Settings(notices='off', notice_action='save'), interval=1000)
  _, train, _, decode = _with_programs(ckpt)
  ckpt.save_if_needed(0, STATE)
  train.run(STATE, 0)
  ckpt._notices.announce('preempted', 'TRUE')  # pylint: disable=protected-access
  decode.run(STATE, 1)  # trains on: the notice's save waits for the loop
  assert decode.ran == 3 and not fakes.events(other, 'notice')
  ckpt.save_if_needed(1, STATE)
  ckpt.wait_until_finished()
  assert [e['step'] for e in fakes.events(other, 'notice')] == [1]


def test_a_closed_gate_holds_the_main_thread_only():
  """Once another thread took the exit, the main thread stops at its next phase change; that thread does not."""
  phases = phases_lib.LoopPhases()
  phases.close()
  done = threading.Event()
  worker = threading.Thread(target=lambda: (phases.enter(phases_lib.EVAL), done.set()))
  worker.start()
  worker.join(5)
  assert done.is_set() and phases.closed


def _with_programs(ckpt):
  seen = []
  train, evaluation, decode = _TrainProgram(seen), _EvalProgram(3), _EvalProgram(3, 'decode_step')
  internals.instrument_programs(train, [evaluation], [decode], ckpt.phases)
  return seen, train, evaluation, decode


def test_the_watchdog_line_names_the_step_a_held_main_thread_loses(job_dir):
  """Several hosts (no rescue): a main thread held in the input when the budget runs out loses its trained step,
  and the watchdog's line says which, where and for how long; nothing is said once a thread took the exit."""
  ckpt, _ = fakes.wrap(job_dir, interval=1000)
  ckpt.phases.trained(300, STATE)
  ckpt.phases.enter(phases_lib.INPUT)
  exit_path = ckpt._exit  # pylint: disable=protected-access
  words = exit_path._what_is_lost(0)  # pylint: disable=protected-access
  assert words.startswith('; step 300 is lost: the main thread has been in input for ')
  assert words.endswith(' s and never came back to an agreement point')
  assert exit_path._what_is_lost(300) == ''  # pylint: disable=protected-access  (committed: nothing lost)
  assert exit_path.take_over()
  assert exit_path._what_is_lost(0) == ''  # pylint: disable=protected-access
