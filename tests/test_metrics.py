"""StepMetrics: Pax's programs tapped for each step's metrics, read only for a saved step."""

import json
import math
import types

from jax import numpy as jnp
import numpy as np

from pax_autockpt.save import metrics as metrics_lib


class TrainProgram:
  """What StepMetrics touches of Pax's train program: run() and its TrainProgramOutput."""

  def run(self, state, step):
    return types.SimpleNamespace(
        state=state, new_train_step=step + 1, loss=jnp.float32(2.5),
        weighted_scalars={'log_pplx': (jnp.float32(1.5), jnp.float32(2.0)), 'bad': 'text'},
        eval_train_metrics={'log_pplx': 1.25} if (step + 1) % 10 == 0 else None)


class EvalProgram:
  eval_input = types.SimpleNamespace(name='test')

  def run(self, state, step):
    del state
    return types.SimpleNamespace(eval_metrics={'log_pplx': 1.75, 'nan': float('nan')},
                                 eval_scoring_metrics=None, step=step)


def test_tap_keeps_the_outputs_of_the_step_they_produced_and_passes_them_on():
  train, evaluate = TrainProgram(), EvalProgram()
  step_metrics = metrics_lib.StepMetrics()
  step_metrics.tap(train, [evaluate])
  out = train.run('state', 8)
  assert out.state == 'state' and out.new_train_step == 9
  assert step_metrics.capture(8) is None  # the output of the step that *produced* step 9's state
  assert metrics_lib.floats(step_metrics.capture(9)) == {'train/loss': 2.5, 'train/log_pplx': 1.5}

  train.run('state', 9)  # produces step 10, an eval step: eval_train, then the eval programs
  assert evaluate.run('state', 10).step == 10
  read = metrics_lib.floats(step_metrics.capture(10))
  assert math.isnan(read.pop('eval_test_test/metrics/nan'))  # NaN kept: BestN ranks it worst
  assert read == {'train/loss': 2.5, 'train/log_pplx': 1.5, 'eval_train/metrics/log_pplx': 1.25,
                  'eval_test_test/metrics/log_pplx': 1.75}  # 'bad' left out
  evaluate.run('state', 20)  # an eval alone (no train step for it): a new step's metrics
  assert metrics_lib.floats(step_metrics.capture(20)).keys() == {'eval_test_test/metrics/log_pplx',
                                                                 'eval_test_test/metrics/nan'}


def test_floats_reads_replicated_and_weighted_values():
  values = {'a': jnp.array([1.0, 3.0]), 'w': [(np.float32(1.0), np.float32(1.0)), (np.float32(4.0), np.float32(3.0))],
            'inf': jnp.float32(np.inf), 'none': None}
  assert metrics_lib.floats(values) == {'a': 2.0, 'w': 3.25, 'inf': float('inf')}
  assert metrics_lib.floats(None) is None and metrics_lib.floats({'text': 'x'}) is None


def test_of_committed_reads_the_newest_metrics_of_each_step():
  records = [{'event': 'save_committed', 'step': 10, 'metrics': {'train/loss': 3.0}},
             {'event': 'save_committed', 'step': 20},
             {'event': 'save_committed', 'step': 10, 'metrics': {'train/loss': 2.0, 'flag': True, 'x': 'y'}},
             {'event': 'save_started', 'step': 30, 'metrics': {'train/loss': 1.0}}]
  assert metrics_lib.of_committed(records) == {10: {'train/loss': 2.0}}


def test_non_finite_metrics_go_through_the_event_log_as_strict_json():
  """A diverged loss reaches BestN after a restart too: 'nan', 'inf', '-inf' in the event, floats back."""
  values = {'nan': float('nan'), 'inf': float('inf'), 'ninf': -float('inf'), 'x': 1.5}
  written = json.loads(json.dumps(metrics_lib.for_event(values), allow_nan=False))
  assert written == {'nan': 'nan', 'inf': 'inf', 'ninf': '-inf', 'x': 1.5}
  read = metrics_lib.of_committed([{'event': 'save_committed', 'step': 1, 'metrics': written}])[1]
  assert math.isnan(read.pop('nan')) and read == {'inf': float('inf'), 'ninf': -float('inf'), 'x': 1.5}
