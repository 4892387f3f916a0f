"""End to end: a preemption wherever the loop is (an eval, a decode program, a train input that blocks) saves the
trained step inside the grace period; real paxml processes, real SIGTERM, real checkpoint directories. Each eval
or decode program is 4,000 batches over a paced input (~2 minutes: what a real test set takes), so that only an
exit that cuts it short fits the 60 s budget. Two hosts cut mid-eval (each eval batch a collective): the first
launch of tests/test_e2e_multihost.py's restore-decisions test."""

import os
import re
import signal
import time

import pytest

from pax_autockpt.exit import rescue
from pax_autockpt.shared import events as events_lib
from pax_autockpt.tools import process
from tests import forkserver
from tests.conftest import assert_restorable
from tests.conftest import checkpoint_steps

pytestmark = pytest.mark.e2e

_B = 'experiments.bench.'
EVAL, DECODE = f'{_B}TinySlowEval', f'{_B}TinySlowDecode'
GRACE = '--autockpt_grace_secs=60'
PACED = 0.03  # seconds per eval or decode batch: 4,000 batches take ~2 minutes


def _env(**variables) -> dict[str, str]:
  """This environment with experiments.bench.PacedLmInput's variables set."""
  return {**os.environ, **{f'AUTOCKPT_PACED_{k}': str(v) for k, v in variables.items()}}


def _job(jobs, argv, log, **paced) -> process.Job:
  job = forkserver.job(argv, str(log), env=_env(**paced))
  jobs.append(job)
  return job


def _run_events(job_dir, host=0) -> list[dict]:
  events = events_lib.read(job_dir, host)
  return events[max(i for i, e in enumerate(events) if e['event'] == 'start'):]


def _preempted_during(job_dir, *, step, during, agreed_during, host=0) -> dict:
  """The newest run on `host`: one preemption at `step` (the signal found `during`, the hosts agreed in
  `agreed_during`), its save committed, exit 143 at that step; returns the preemption event."""
  run = _run_events(job_dir, host)
  preemptions = [e for e in run if e['event'] == 'preemption']
  assert len(preemptions) == 1, run
  found = preemptions[0]
  assert (found['step'], found['saved_step'], found['plan']) == (step, step, 'save'), found
  assert (found['during'], found['agreed_during']) == (during, agreed_during), found
  assert step in [e['step'] for e in run if e['event'] == 'save_committed']
  assert [(e['code'], e['step']) for e in run if e['event'] == 'exit'] == [(143, step)]
  complete, incomplete = checkpoint_steps(job_dir)
  assert max(complete) == step and incomplete == []
  assert_restorable(job_dir, step)
  return found


def _sigterm_after(job, pattern: str) -> float:
  """SIGTERM once `pattern` is in the log and a second more has passed; returns when it was sent."""
  job.wait_for_log(pattern, timeout=240)
  time.sleep(1.0)
  return job.send(signal.SIGTERM)


def _exits_143_inside_the_budget(job, sent: float) -> float:
  code = job.wait(120)
  took = time.time() - sent
  assert code == 143, job.log()[-3000:]
  assert took < 60, f'SIGTERM -> exit {took:.1f} s: the grace period was 60 s'
  return took


def _cut_short(jobs, exp: str, job_dir: str, flag: str, log, phase: str, pattern: str, step: int, **paced):
  """A run of `exp` with `flag` SIGTERMed a few batches into its 2-minute `phase` program at `step`: it exits
  143 inside the budget with `step` saved, the program stopped before a batch past the third; (the job,
  SIGTERM -> exit s, the preemption event)."""
  job = _job(jobs, process.ours_argv(exp, job_dir, flag, GRACE), log, **paced)
  took = _exits_143_inside_the_budget(job, _sigterm_after(job, pattern))
  found = _preempted_during(job_dir, step=step, during=phase, agreed_during=phase)
  assert found['batch'] > 3, found
  return job, took, found


def test_sigterm_mid_eval_then_with_the_input_blocked_then_mid_decode(jobs, tmp_path):
  """Three runs of one job, each resuming from the step the one before saved:
  1. A SIGTERM a few batches into a 2-minute eval (step 100, `--eval_on_test`), 60 s of grace: the eval ends at
     the next batch, its metrics unwritten, step 100 commits and the job exits 143 well inside the budget
     (today's main evaluated on and the watchdog exited 1, step 100 lost).
  2. The same command without the eval resumes from 100; its train input's get_next never returns from its 20th
     call on (a reader stuck on storage): the main thread reaches no agreement point, so the step it trained
     last (119) is saved from another thread after `rescue.wait_before_rescue` (5 s of a 20 s grace period),
     exit 143.
  3. The same model with a decode program (`--decode_during_train`, 4,000 paced batches at the last step, 150),
     input unstuck: it trains on from 119 (the eval owed at 100 is not run again); a SIGTERM a few batches into
     the decode ends it at the next batch, no decoder outputs are written for step 150, 150 commits, exit 143.
  4. The same command resumes at the last step and runs the decode the exit cut, then exits 0."""
  job_dir = str(tmp_path / 'job')
  first, took, found = _cut_short(jobs, EVAL, job_dir, '--eval_on_test', tmp_path / 'run1.log', 'eval',
                                  r'Finished eval step 3 for', 100, EVAL_SLEEP_S=PACED)
  assert found['phase_s'] < 10, found
  assert 'Finished eval on' not in first.log()  # the cut eval wrote no result as if it had completed
  assert 'at an eval batch: the eval ends there' in first.log()
  print(f'SIGTERM mid-eval -> exit {took:.2f} s, stopped before eval batch {found["batch"]}')

  stuck = _job(jobs, process.ours_argv(EVAL, job_dir, '--autockpt_grace_secs=20'), tmp_path / 'run2.log',
               TRAIN_BLOCK_AT=20)
  sent = _sigterm_after(stuck, r'\[paced input\] TRAIN get_next blocks at call 20')
  took = _exits_143_inside_the_budget(stuck, sent)
  assert took >= rescue.wait_before_rescue(20), f'the rescue waits for the main thread first, not {took:.1f} s'
  assert _run_events(job_dir)[0]['restored_step'] == 100
  found = _preempted_during(job_dir, step=119, during='input', agreed_during='rescue')
  assert re.search(r'The main thread has been in input for [\d.]+ s and reached no agreement point', stuck.log())
  print(f'SIGTERM with the train input blocked -> exit {took:.2f} s (step 119 saved from another thread)')

  _, took, found = _cut_short(jobs, DECODE, job_dir, '--decode_during_train', tmp_path / 'run3.log', 'decode',
                              r'Finished decoding input batch 3 for', 150, DECODE_SLEEP_S=PACED)
  start = _run_events(job_dir)[0]
  assert (start['restored_step'], start['restored_from']) == (119, 'job_dir')
  assert not list((tmp_path / 'job' / 'decoder_out').glob('*/decoder_out_150*'))
  print(f'SIGTERM mid-decode -> exit {took:.2f} s, stopped before decode batch {found["batch"]}')

  # 4. The same command again: 150 is the last step, so no later interval would ever run the decode the exit cut;
  # the restart runs it (unpaced), then exits 0 (the previous main exited 0 at once, no decoder outputs for 150).
  owed = _job(jobs, process.ours_argv(DECODE, job_dir, '--decode_during_train'), tmp_path / 'run4.log')
  assert owed.wait(300) == 0, owed.log()[-3000:]
  assert 'stopped in the decode at step 150, the last: running decode first' in owed.log()
  assert list((tmp_path / 'job' / 'decoder_out').glob('*/decoder_out_150*'))
