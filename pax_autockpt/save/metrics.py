"""The metrics Pax computed for the state at a step, for BestN: kept by reference, read only at a save.

Pax's loop runs `save_if_needed(step)` on the state the previous iteration produced; that iteration's
train program returned the step's loss and weighted scalars (the values Pax's TensorBoard shows at this
step), and when eval ran at this step, the eval programs returned theirs. `StepMetrics` taps the
programs' `run` and keeps the newest step's outputs. The train outputs are device arrays: holding them
costs nothing per step, and they are copied to the host (a few scalars) only for a step that is saved,
in the background save thread. The names are Pax's own tuning names:

- `train/loss`, and `train/<name>` for each weighted scalar of the train step (e.g. `train/log_pplx`);
- `eval_train/metrics/<name>` at eval steps (eval on a training batch, unless `eval_skip_train`);
- `eval_test_<input>/metrics/<name>` and `eval_test_<input>/scoring_eval/<name>` at eval steps.
"""

import math
import threading
from typing import Any, Mapping

import numpy as np
from paxml import metric_utils
from praxis import py_utils


def _prefixed(prefix: str, values: Mapping[str, Any] | None) -> dict[str, Any]:
  return {f'{prefix}/{k}': v for k, v in (values or {}).items()}


class StepMetrics:
  """The newest step's metrics as Pax's programs returned them; safe to read from the save thread."""

  def __init__(self):
    self._lock = threading.Lock()
    self._step: int | None = None
    self._values: dict[str, Any] = {}

  def tap(self, train_program: Any, eval_programs: Any) -> None:
    """Wraps each program's `run` to keep what it returns (its output is passed on unchanged; a custom
    program whose output lacks Pax's fields just yields no metrics)."""
    run_train = train_program.run

    def train(state, step):
      out = run_train(state, step)
      new_step = getattr(out, 'new_train_step', None)
      if new_step is not None:
        self.train_output(new_step, getattr(out, 'loss', None), getattr(out, 'weighted_scalars', None),
                          getattr(out, 'eval_train_metrics', None))
      return out

    train_program.run = train
    for program in eval_programs:
      self._tap_eval(program)

  def _tap_eval(self, program: Any) -> None:
    run_eval = program.run

    def evaluate(state, step):
      out = run_eval(state, step)
      self.eval_output(program.eval_input.name, step, getattr(out, 'eval_metrics', None),
                       getattr(out, 'eval_scoring_metrics', None))
      return out

    program.run = evaluate

  def train_output(self, step: int, loss: Any, weighted_scalars: Any, eval_train: Any = None) -> None:
    """A train step that produced the state of `step`: its loss and weighted scalars, by reference."""
    values = {**({'train/loss': loss} if loss is not None else {}), **_prefixed('train', weighted_scalars)}
    values.update(_prefixed('eval_train/metrics', eval_train))
    with self._lock:
      self._step, self._values = step, values

  def eval_output(self, name: str, step: int, metrics: Any, scoring: Any = None) -> None:
    """An eval of the state of `step` (host floats already)."""
    with self._lock:
      if step != self._step:
        self._step, self._values = step, {}
      self._values.update(_prefixed(f'eval_test_{name}/metrics', metrics))
      self._values.update(_prefixed(f'eval_test_{name}/scoring_eval', scoring))

  def capture(self, step: int) -> dict[str, Any] | None:
    """The metrics of `step`, still unread (None when no program ran for it, e.g. right after a restore)."""
    with self._lock:
      return dict(self._values) if step == self._step and self._values else None


def floats(values: Mapping[str, Any] | None) -> dict[str, float] | None:
  """Captured metrics as floats (a device->host copy of a few scalars); None when none are.

  Pax's own conversion: the first replica of replicated values, weighted scalars averaged by weight.
  A value that cannot be read as one number is left out; NaN and inf stay (a diverged loss, which BestN
  ranks worst: left out, the checkpoint would count as one without metrics and be kept).
  """
  out = {}
  for name, value in (values or {}).items():
    try:
      value = py_utils.maybe_unreplicate_for_fully_replicated(value)
      number = (metric_utils.as_float(value) if metric_utils.is_float_convertible(value)
                else float(np.mean(np.asarray(value))))
    except (TypeError, ValueError):
      continue
    out[name] = float(number)
  return out or None


_NON_FINITE = {'nan': math.nan, 'inf': math.inf, '-inf': -math.inf}


def for_event(values: Mapping[str, float]) -> dict[str, float | str]:
  """Metrics for a `save_committed` event, strict JSON: a NaN or infinite value as 'nan', 'inf', '-inf'."""
  return {k: v if math.isfinite(v) else repr(float(v)) for k, v in values.items()}


def _from_event(v: Any) -> float | None:
  if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
    return float(v)
  return _NON_FINITE.get(v) if isinstance(v, str) else None


def of_committed(records: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
  """Step -> metrics from the `save_committed` events of a log (the newest record of a step wins), so
  that a restarted job still knows its checkpoints' metrics."""
  out = {}
  for e in records:
    metrics = e.get('metrics')
    if e['event'] == 'save_committed' and isinstance(e.get('step'), int) and isinstance(metrics, dict):
      read = {k: _from_event(v) for k, v in metrics.items()}
      out[e['step']] = {k: v for k, v in read.items() if v is not None}
  return out
