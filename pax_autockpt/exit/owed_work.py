"""The eval and decode a preemption cut short at the last step, run by the restart that resumes there.

A preemption agreed at an eval or decode batch ends that program where it is (pax_autockpt.shared.phases) and saves the
trained step. Before the last step that costs one interval's metrics: the next interval's eval runs as usual. At
the last step there is no next interval: paxml's loop, restored at `num_train_steps`, leaves at once, so the final
eval, the final decode and what a tuner reads from them would never come. So the restart that resumes the last
step from such an exit runs them first, as paxml's loop would have after that step: the eval programs (when the
cut came in the eval, or in the eval on the train input), then the decode programs. A restart after one that
finished (its `exit` 0) owes nothing.
"""

from typing import Any

from pax_autockpt.shared import phases as phases_lib

_OWED = {phases_lib.EVAL: (phases_lib.EVAL, phases_lib.DECODE), phases_lib.DECODE: (phases_lib.DECODE,)}


def owed(history: list[dict[str, Any]], restored_step: int | None, num_train_steps: int) -> tuple[str, ...]:
  """The programs (`eval`, `decode`) owed by the previous run's exit, from host 0's event log; () for none."""
  if restored_step is None or restored_step < num_train_steps:
    return ()
  exits = [e for e in history if e.get('event') == 'exit']
  cuts = [e for e in history if e.get('event') == 'preemption']
  if not exits or not cuts or exits[-1].get('code') == 0 or exits[-1].get('step') != restored_step:
    return ()
  cut = cuts[-1]
  if cut.get('step') != restored_step or cut.get('saved_step') != restored_step:
    return ()
  return _OWED.get(cut.get('agreed_during'), ())


def run(executor: Any, programs: tuple[str, ...], step: int, state: Any) -> None:
  """Runs the owed programs on the restored `state` as paxml's loop runs them after a step (paxml's eval_lib,
  each with its own eval train state); `executor` is paxml's DefaultExecutor, whose task and programs they are."""
  from paxml import eval_lib  # pylint: disable=g-import-not-at-top  (paxml-heavy)
  from paxml import programs as programs_lib  # pylint: disable=g-import-not-at-top
  task, train_p = executor._task, executor._task.train  # pylint: disable=protected-access
  evals, decodes = executor._eval_programs, executor._decode_programs  # pylint: disable=protected-access
  if phases_lib.EVAL in programs and evals:
    eval_lib.run_eval_programs(eval_programs=evals, step=step, train_state=programs_lib.get_eval_train_state(
        task, state, task.train.eval_use_ema_states))
  if phases_lib.DECODE in programs and decodes and train_p.decode_interval_steps:
    eval_lib.run_decode_programs(decode_programs=decodes, step=step, train_state=programs_lib.get_eval_train_state(
        task, state, task.train.decode_use_ema_states))
