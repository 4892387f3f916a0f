"""The eval and decode a preemption cut at the last step: owed to the restart that resumes there, once."""

from pax_autockpt.exit import owed_work
from pax_autockpt.shared import internals
from pax_autockpt.shared import phases as phases_lib


def _history(*, agreed_during='eval', step=300, saved=300, code=143, then=()):
  return [{'event': 'start', 'restored_step': 0},
          {'event': 'preemption', 'step': step, 'saved_step': saved, 'agreed_during': agreed_during},
          {'event': 'exit', 'code': code, 'step': step}, *then]


def test_an_eval_cut_at_the_last_step_owes_the_eval_and_the_decode_after_it():
  assert owed_work.owed(_history(), 300, 300) == ('eval', 'decode')
  assert owed_work.owed(_history(agreed_during='decode'), 300, 300) == ('decode',)


def test_nothing_is_owed_before_the_last_step_after_a_finished_run_or_for_a_cut_elsewhere():
  assert owed_work.owed(_history(step=200, saved=200), 200, 300) == ()  # the next interval's eval runs as usual
  finished = _history(then=({'event': 'start', 'restored_step': 300}, {'event': 'exit', 'code': 0, 'step': 300}))
  assert owed_work.owed(finished, 300, 300) == ()  # the restart that ran them exited 0
  assert owed_work.owed(_history(agreed_during='checkpoint'), 300, 300) == ()
  assert owed_work.owed(_history(agreed_during='rescue'), 300, 300) == ()
  assert owed_work.owed(_history(saved=200), 300, 300) == ()  # the step restored is not the one cut
  assert owed_work.owed([], 300, 300) == () and owed_work.owed(_history(), None, 300) == ()


def test_a_restart_killed_during_the_owed_eval_still_owes_it():
  killed = _history(then=({'event': 'start', 'restored_step': 300},))  # no exit: SIGKILLed in the eval
  assert owed_work.owed(killed, 300, 300) == ('eval', 'decode')


class _RunOnlyProgram:
  """A custom eval program as stock paxml accepts it: `run` only, no `eval_step`."""

  def __init__(self):
    self.ran = 0

  def run(self, state, step):
    del state, step
    self.ran += 1


class _Train:
  def run(self, state, step):
    del state, step

  def train_step(self, *args):
    return args

  def _maybe_run_eval_train(self, *args):
    del args


def test_an_eval_program_without_eval_step_is_instrumented_by_its_run():
  """Seen failing on the previous main: an AttributeError at set-up (every program was assumed to have eval_step)."""
  phases, program = phases_lib.LoopPhases(), _RunOnlyProgram()
  internals.instrument_programs(_Train(), [program], [], phases)
  program.run(None, 1)
  assert program.ran == 1 and phases.now().phase == phases_lib.LOOP
