"""End to end on the tiny model: the adaptive (Young/Daly) interval converges, BestN on Pax's metrics."""

import pytest

from pax_autockpt.tools import process
from pax_autockpt.tools import report
from tests import forkserver
from tests.conftest import checkpoint_steps
from tests.conftest import events_of

pytestmark = pytest.mark.e2e

# The tiny state's saves block the loop ~6 ms: an MTBF of 0.2 h makes the Young/Daly interval ~3 s, so
# the 2000 steps (~45 s) see about 15 continuous saves.
MTBF_HOURS = 0.2


@pytest.mark.soak
def test_adaptive_interval_converges_to_young_daly_and_best_n_keeps_the_lowest_loss(jobs, job_dir, tmp_path):
  """`make soak` (~65 s of the suite, a 2,000-step run: at fewer steps the Young/Daly interval at a small enough
  MTBF falls below a save's duration under load). `make test` keeps continuous saving with keep-latest end to
  end (tests/test_e2e_continuous.py), both policies in the checkpointer with Pax's metrics and the measured
  cost (tests/test_checkpointer.py) and their decisions, fed a context (tests/test_policies.py)."""
  job = forkserver.job(process.ours_argv(process.TINY_EXP, job_dir, f'--autockpt_mtbf_hours={MTBF_HOURS}',
                                      '--autockpt_keep_best=2'), str(tmp_path / 'run.log'))
  jobs.append(job)
  assert job.wait(300) == 0, job.log()[-3000:]

  r = report.load(job_dir)
  a = report.young_daly.adaptive(r)
  continuous = [s for s in r.saves if s.reason == 'continuous']
  print(f'{len(continuous)} continuous saves; mean save cost {r.save_cost_s * 1000:.1f} ms; adaptive interval '
        f'{a["interval_s"]:.2f} s at the end, Young/Daly optimum afterwards {a["tau_opt_s"]:.2f} s '
        f'(ratio {a["ratio"]:.3f}); measured P50 start-to-start {r.interval_p50_s:.2f} s')
  assert len(continuous) >= 8
  # The ±20% figure is measured by the bench on a quiet machine; here a bound that catches a wrong formula
  # or an interval that never adapts, not the noise of a loaded CI machine.
  assert a['mtbf_hours'] == MTBF_HOURS and 0.6 <= a['ratio'] <= 1.6
  assert 'adaptive save interval' in job.log()

  # BestN on train/loss: the lowest two, the newest, and what has no metrics (the step-0 save, made
  # before any train step) remain; every saved step's metrics are in its save_committed event.
  metrics = {e['step']: e.get('metrics') for e in events_of(job_dir, 'save_committed')}
  measured = sorted((m['train/loss'], step) for step, m in metrics.items() if m)
  assert all('train/log_pplx' in metrics[step] for _, step in measured)
  expected = {step for _, step in measured[:2]} | {step for step, m in metrics.items() if not m} | {2000}
  complete, _ = checkpoint_steps(job_dir)
  assert set(complete) == expected, (complete, measured[:4])
  assert {e['step'] for e in events_of(job_dir, 'deleted')} == set(metrics) - expected
