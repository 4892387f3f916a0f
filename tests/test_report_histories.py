"""`report`'s runs and measured goodput against the truth of random histories (tests/report_histories.py).

Each example writes a history's event logs through the product's writer and checks that the report counts the
runs, restores and steps lost as they were, and that every bucket of the measured goodput and the goodput itself
equal the true time within what the log cannot see: a killed run's last PROGRESS_SECS (pax_autockpt.hook.progress).
`make test` runs 200 examples (~4 s on an idle machine); `make soak` (`-m soak`) 3,000 with up to 8 runs,
AUTOCKPT_SOAK_HISTORIES=N for N.
"""

import os
import tempfile

from hypothesis import HealthCheck
from hypothesis import example
from hypothesis import given
from hypothesis import settings
import pytest

from pax_autockpt.tools import report
from pax_autockpt.tools.report import measured
from tests import report_histories

_FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_SOAK = settings(max_examples=int(os.environ.get('AUTOCKPT_SOAK_HISTORIES', '3000')), deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])


def _check(history: report_histories.History) -> None:
  with tempfile.TemporaryDirectory(dir='/dev/shm') as job:
    sim = report_histories.write(history, job)
    truth = report_histories.truth(sim)
    r = report.load(job)
  assert r.restored_steps == truth.restored
  assert [x.trained for x in r.restart_details] == truth.trained[1:]
  lost = [(x.steps_lost, x.lower_bound) for x in r.restart_details if x.trained]
  assert [killed for _, killed in lost] == [killed for _, killed in truth.steps_lost]
  for (got, killed), (want, _) in zip(lost, truth.steps_lost):
    assert got <= want if killed else got == want
  m = measured.measure(r)
  tol = truth.tolerance_s
  assert m.wall_s == pytest.approx(truth.wall_s, abs=tol)
  assert m.seconds == pytest.approx(truth.seconds, abs=tol), f'tolerance {tol:.3f} s'
  assert m.goodput == pytest.approx(truth.seconds['productive_training'] / truth.wall_s, abs=2 * tol / truth.wall_s)


def _set_aside_to_nothing() -> report_histories.History:
  """The soak's first finding (a defect of the generator: a restart that set every checkpoint aside and started
  fresh wrote its `restore_skipped` after its `start`): kept, as each failure the soak finds."""
  run = lambda steps, ending, restore='set_aside': report_histories.Run(
      idle_s=0.0, startup_s=1.0, restore_s=1.0, compile_s=1.0, steps=steps, ending=ending, kill_into_step=0.0,
      local=False, restore=restore, process_start=False, failed_before=[])
  return report_histories.History(
      hosts=1, skew_s=[0.0], step_s=1.0, every=40, blocking_s=1.0, duration_s=1.0, local_every=1, marks=False,
      runs=[run(144, 'kill', 'disk_lost'), run(21, 'kill'), run(1, 'sigterm'), run(1, 'kill'), run(157, 'kill')])


@_FAST
@example(_set_aside_to_nothing())
@given(report_histories.histories())
def test_the_report_tells_each_random_history_as_it_happened(history):
  _check(history)


@pytest.mark.soak
@_SOAK
@given(report_histories.histories(max_runs=8))
def test_soak_the_report_against_many_more_histories(history):
  _check(history)
