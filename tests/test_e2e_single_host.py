"""End to end, one host: real paxml processes, real SIGTERM, real checkpoint directories."""

import os
import random
import re
import shutil
import signal
import time
import types

import pytest

from pax_autockpt import layout
from pax_autockpt.hosts import hosts
from pax_autockpt.shared import events as events_lib
from pax_autockpt.tools import process
from tests import forkserver
from tests.conftest import assert_restorable
from tests.conftest import checkpoint_steps
from tests.conftest import events_of
from tests.conftest import tb_scalars

pytestmark = pytest.mark.e2e

EXP = process.TINY_EXP
SHORT = 'tests.e2e_experiments.TinyShortSchedule'  # EXP over 600 steps, a save every 200: reruns to the end
WIDER = 'tests.e2e_experiments.TinyWiderModel'  # EXP with MODEL_DIMS 96: a config slip
STEP_DONE = r'\[PAX STATUS\]: Step `\d+` completed'
# Stock paxml needs the wiring flags on a non-TPU host, and both seed flags.
SEED_FLAGS = ('--jax_fully_async_checkpoint', '--exit_after_ondemand_checkpoint', '--num_hosts=1',
              '--host_idx=0')


def _start(jobs, argv, log, fresh=False):
  """Forked from a process that imported paxml (tests/forkserver.py), or a `fresh` interpreter."""
  job = (process.Job if fresh else forkserver.job)(argv, log)
  jobs.append(job)
  return job


def _preempt_mid_training(job) -> tuple[int, float]:
  """SIGTERM at a random moment after the first step completed; returns (exit code, SIGTERM->exit s)."""
  job.wait_for_log(STEP_DONE)
  time.sleep(random.uniform(0.0, 3.0))
  sent = job.send(signal.SIGTERM)
  code = job.wait(120)
  return code, time.time() - sent


def _assert_preempted_run(job_dir, *, restored, exit_code=143) -> int:
  """The newest run: start(restored) ... preemption(N), save of N committed, exit(code, N). Returns N."""
  starts = events_of(job_dir, 'start')
  assert starts[-1]['restored_step'] == restored
  run = [e for e in events_of_run(job_dir)]
  kinds = [e['event'] for e in run]
  preemption = [e for e in run if e['event'] == 'preemption']
  assert len(preemption) == 1, kinds
  step = preemption[0]['step']
  assert preemption[0]['signal'] == 'SIGTERM'
  committed = [e['step'] for e in run if e['event'] == 'save_committed']
  exits = [e for e in run if e['event'] == 'exit']
  assert exits == [exits[-1]] and exits[-1]['code'] == exit_code and exits[-1]['step'] == step
  assert kinds[-1] == 'exit'
  if restored is None or step > restored:
    started = [e for e in run if e['event'] == 'save_started' and e['step'] == step]
    assert [e['reason'] for e in started] == ['preemption']
    assert step in committed
  complete, incomplete = checkpoint_steps(job_dir)
  assert incomplete == []
  assert max(complete) == step
  assert_restorable(job_dir, step)
  return step


def events_of_run(job_dir, host=0):
  """Events of the newest process start on `host`."""
  events = events_lib.read(job_dir, host)
  last_start = max(i for i, e in enumerate(events) if e['event'] == 'start')
  return events[last_start:]


@pytest.fixture(scope='session')
def preempted(tmp_path_factory):
  """One run of ours, SIGTERM at a random moment mid-training; shared by the tests below, which read
  its job directory or work on a copy of it (one process start fewer per test). Session-scoped, so
  that a worker makes it once even when it runs another file's test between two of these."""
  root = tmp_path_factory.mktemp('preempted')
  job = forkserver.job(process.ours_argv(SHORT, str(root / 'job')), str(root / 'run1.log'))
  try:
    code, secs = _preempt_mid_training(job)
  finally:
    job.kill()
  return types.SimpleNamespace(job_dir=str(root / 'job'), log=job.log(), code=code, secs=secs)


def _copy_of(preempted, tmp_path) -> str:
  shutil.copytree(preempted.job_dir, tmp_path / 'job')
  return str(tmp_path / 'job')


def test_sigterm_mid_training_then_a_slipped_config_and_the_fixed_rerun(jobs, preempted, tmp_path):
  """One preempted run (the `preempted` fixture, session-scoped: with pytest 9.2 and pytest-xdist 3.8
  --dist loadgroup does not keep an xdist_group on one worker), then on a copy of its job directory a
  restart with a config slip (exit 2, nothing moved), then the original command, which resumes from the
  on-demand step, trains, and saves again on a SIGTERM."""
  step = _sigterm_mid_training_commits_agreed_step_exits_143(preempted)
  job_dir = _copy_of(preempted, tmp_path)
  _slipped_config_moves_nothing(jobs, job_dir, step, tmp_path)
  _the_fixed_rerun_resumes_and_saves(jobs, job_dir, step, tmp_path)


def _sigterm_mid_training_commits_agreed_step_exits_143(preempted) -> int:
  assert preempted.code == 143, preempted.log[-3000:]
  step = _assert_preempted_run(preempted.job_dir, restored=None)
  assert step > 0
  print(f'SIGTERM -> exit {preempted.secs:.2f} s, on-demand step {step}')
  # notices 'auto' where no metadata server answers: no watcher, no wait at start, at most one line (it comes
  # when the name's lookup fails, in the background: once more than 9 s here, after this run had exited).
  assert len(re.findall(r'\[autockpt\] notices: no metadata server at metadata.google.internal', preempted.log)) <= 1
  assert '[autockpt] notices: watching' not in preempted.log
  # The same saves as TensorBoard scalars in the job's summaries.
  scalars = tb_scalars(preempted.job_dir)
  saved = [e['step'] for e in events_of(preempted.job_dir, 'save_started')]
  assert [s for s, _ in scalars['autockpt/save_blocking_s']] == saved
  assert [s for s, _ in scalars['autockpt/save_duration_s']] == saved
  # Interval saves (every 200) may precede the on-demand one when the SIGTERM comes late.
  assert saved[-1] == step
  assert scalars['autockpt/save_interval_steps'] == [(b, float(b - a)) for a, b in zip(saved, saved[1:])]
  return step


def _slipped_config_moves_nothing(jobs, job_dir, step, tmp_path):
  """A restart with MODEL_DIMS 64 -> 96 (a config slip right after a preemption): exit 2 with one line
  naming the checkpoint and the first differing array, every checkpoint where it was."""
  before = checkpoint_steps(job_dir)
  slipped = _start(jobs, process.ours_argv(WIDER, job_dir), str(tmp_path / 'wider.log'))
  assert slipped.wait(180) == 2, slipped.log()[-3000:]
  line, = [x for x in slipped.log().splitlines() if 'does not fit this run' in x]
  line = line.split('[autockpt] ', 1)[1]
  assert line == (f'checkpoint {step} does not fit this run: mdl_vars.params.lm.final_ln.bias is float32[64] there, '
                  'float32[96] here; nothing was moved: rerun with the config that wrote it, or use a new '
                  '--job_log_dir; exiting 2.'), line
  assert len(line) <= 300 and 'Traceback' not in slipped.log()
  assert checkpoint_steps(job_dir) == before and not layout.unrestorable_dir(job_dir).exists()
  assert events_of(job_dir, 'restore_failed')[-1] == {**events_of(job_dir, 'restore_failed')[-1], 'step': step,
                                                       'kind': 'mismatch'}
  assert events_of(job_dir, 'exit')[-1]['code'] == 2 and not events_of(job_dir, 'restore_skipped')


def _the_fixed_rerun_resumes_and_saves(jobs, job_dir, step, tmp_path):
  """The original command again: restores the on-demand step, trains, and on a SIGTERM saves the agreed step,
  exit 143 (the tutorial's run 3 trains a job to its end). The job directory given relative to the working
  directory: OCDBT refuses relative paths, so every save would fail unless main resolves it."""
  assert job_dir == str(tmp_path / 'job')
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # `tests.` experiments from another cwd
  path = os.pathsep.join(filter(None, (root, os.environ.get('PYTHONPATH'))))
  second = forkserver.job(process.ours_argv(SHORT, 'job'), str(tmp_path / 'run2.log'), cwd=str(tmp_path),
                          env={**os.environ, 'PYTHONPATH': path})
  jobs.append(second)
  second.wait_for_log(STEP_DONE)  # a new log: a step trained past the restored one
  second.send(signal.SIGTERM)
  assert second.wait(180) == 143, second.log()[-3000:]
  assert f'Model initial global_step={step}' in second.log()
  assert _assert_preempted_run(job_dir, restored=step) > step


def _stock_main_preempted(jobs, job_dir, tmp_path) -> tuple[list[str], int]:
  """Stock paxml/main.py with the seed flags (a fresh interpreter: its flags are defined by its import), SIGTERM
  mid-training: the agreed step committed, exit 143. Returns (argv, step)."""
  port = str(hosts.free_loopback_port())
  argv = process.stock_argv(EXP, job_dir, *SEED_FLAGS, f'--server_addr=127.0.0.1:{port}')
  first = _start(jobs, argv, str(tmp_path / 'run1.log'))
  code, _ = _preempt_mid_training(first)
  assert code == 143, first.log()[-3000:]
  return argv, _assert_preempted_run(job_dir, restored=None)


def test_stock_paxml_main_with_seed_flags(jobs, job_dir, tmp_path):
  _stock_main_preempted(jobs, job_dir, tmp_path)


@pytest.mark.soak  # ~25 s of make test, moved 2026-11-27: make test keeps a SIGTERM during the restore in a fresh
# interpreter of our main (tests/test_e2e_gcs.py), the same hook and the same coordination service
def test_stock_paxml_main_sigterm_during_the_restore_exits_143_at_once(jobs, job_dir, tmp_path):
  argv, step = _stock_main_preempted(jobs, job_dir, tmp_path)
  # Again, with the SIGTERM during the restore (stock paxml 1.4.0 alone loses it: XLA's sync point is never
  # reached, and it trains on): with nothing trained since the newest checkpoint, exit 143 at once — the
  # restore need not end (the `start` event then says so) —, before the step compiles, and nothing saved.
  second = _start(jobs, argv, str(tmp_path / 'run2.log'))
  second.wait_for_log(r'\[PAX STATUS\]: Starting checkpoint load')
  sent = second.send(signal.SIGTERM)
  assert second.wait(180) == 143, second.log()[-3000:]
  secs = _assert_nothing_trained_nothing_saved(second, job_dir, restored=step, sent=sent)  # before the compile
  assert f'Nothing trained since checkpoint {step} when the signal came: nothing to save (SIGTERM); exiting 143.' \
      in second.log()
  ended = 'before_restore' not in events_of_run(job_dir)[0]
  assert ended == (f'Model initial global_step={step}' in second.log()), second.log()[-3000:]
  print(f'SIGTERM during the restore of {step} -> exit {secs:.2f} s ({"after" if ended else "before"} it ended)')


def test_sigterm_before_first_step_exits_143_at_once_with_nothing_to_save(jobs, job_dir, tmp_path):
  """SIGTERM while Python is still importing paxml: recorded, and at the loop's first iteration every host
  agrees that nothing was trained: exit 143 before the step compiles, no checkpoint written."""
  job = _start(jobs, process.ours_argv(EXP, job_dir), str(tmp_path / 'run.log'), fresh=True)
  time.sleep(1.0)
  sent = job.send(signal.SIGTERM)
  assert job.wait(180) == 143, job.log()[-3000:]
  _assert_nothing_trained_nothing_saved(job, job_dir, restored=None, sent=sent)
  assert checkpoint_steps(job_dir) == ([], [])
  assert 'Nothing trained yet, and no checkpoint when the signal came: nothing to save (SIGTERM); exiting 143.' in \
      job.log()
  assert not [x for x in job.log().splitlines() if '[autockpt]' in x and 'None' in x]  # words, not Python's None


def _assert_nothing_trained_nothing_saved(job, job_dir, *, restored, sent) -> float:
  """The newest run: start(restored), preemption(restored step, nothing to save, the arrival recorded),
  exit(143) and nothing else: no save, no compilation of the training step. Returns the exit's seconds
  after the signal's arrival."""
  run = events_of_run(job_dir)
  assert [e['event'] for e in run] == ['start', 'preemption', 'exit'], run
  start, preemption, exit_ = run
  step = restored or 0
  assert start['restored_step'] == restored
  assert preemption == {**preemption, 'step': step, 'plan': 'nothing_to_save', 'saved_step': restored,
                        'signal': 'SIGTERM', 'grace_s': 300.0}
  assert sent - 0.05 <= preemption['signal_at'] <= sent + 1.0, (sent, preemption)  # the arrival, not the agreement
  assert exit_ == {**exit_, 'code': 143, 'step': step}
  assert 'Finished XLA compilation of pjit(_wrapped_step_fn)' not in job.log()
  return exit_['t'] - preemption['signal_at']
