"""End to end, one host: a SIGTERM during the first step's compile (issue 58). With a grace period that holds the
compile, it finishes into the job's compilation cache and the job exits 143; the next run's first step loads it and
compiles nothing (its `first_step` event's counts, not its speed). With a grace period too short, the job exits at
once, as before, and nothing is cached."""

import os
import signal

import pytest

from pax_autockpt.shared import events as events_lib
from pax_autockpt.tools import process
from tests import forkserver

pytestmark = pytest.mark.e2e

COMPILING = r'Compiling _wrapped_step_fn'  # --jax_log_compiles: the train step's compile began (no cache entry)


def _run(jobs, tmp_path, name: str, job_dir: str, cache: str, *flags: str) -> process.Job:
  argv = process.ours_argv(process.TINY_EXP, job_dir, f'--autockpt_compilation_cache={cache}', '--jax_log_compiles',
                           *flags)
  job = forkserver.job(argv, str(tmp_path / f'{name}.log'))
  jobs.append(job)
  return job


def _train_step_entries(cache: str) -> list[str]:
  return [n for n in os.listdir(cache) if n.startswith('pjit__wrapped_step_fn')] if os.path.isdir(cache) else []


def _ending(job_dir: str) -> list[dict]:
  """The run's `preemption` and `exit` events (a fresh job saved step 0 before its compile: Pax's interval)."""
  return [e for e in events_lib.read(job_dir, 0) if e['event'] in ('preemption', 'exit')]


def _sigterm_in_the_compile(job: process.Job) -> float:
  job.wait_for_log(COMPILING, timeout=240)
  return job.send(signal.SIGTERM)


def test_a_sigterm_during_the_first_compile_finishes_and_caches_it_when_the_grace_period_holds_it(jobs, tmp_path):
  job_dir, cache = str(tmp_path / 'job'), str(tmp_path / 'cache')
  first = _run(jobs, tmp_path, 'run1', job_dir, cache)  # grace 300 s: holds the default projection (120 s x 1.5)
  sent = _sigterm_in_the_compile(first)
  assert first.wait(240) == 143, first.log()[-3000:]
  preemption, exit_ = _ending(job_dir)
  assert (preemption['plan'], preemption['first_compile'], exit_['code']) == ('nothing_to_save', 'finished', 143)
  assert 'Finished XLA compilation of pjit(_wrapped_step_fn)' in first.log()
  assert _train_step_entries(cache), os.listdir(cache)
  assert 'the first compile, in flight at the signal, was let finish (' in first.log()
  print(f'SIGTERM during the first compile -> compile finished and cached, exit {exit_["t"] - sent:.1f} s later')

  cached = set(os.listdir(cache))
  second = _run(jobs, tmp_path, 'run2', job_dir, cache)
  second.wait_for_log(r'\[PAX STATUS\]: Step `1` completed', timeout=240)
  second.send(signal.SIGTERM)
  assert second.wait(240) == 143, second.log()[-3000:]
  first_step, = [e for e in events_lib.read(job_dir, 0) if e['event'] == 'first_step']
  # Before its first step this run compiled (the cache then keeps everything: the tests' threshold is 0) only what
  # the first run never ran: the restore's copy of the state into memory XLA owns (compilation_cache.owned_by_xla).
  paid = sorted(n for n in set(os.listdir(cache)) - cached
                if os.path.getmtime(os.path.join(cache, n)) <= first_step['t'])
  assert [n.split('-')[0] for n in paid] == ['jit__lambda_'], paid
  assert first_step['compiles'] == len(paid) and first_step['cache_hits'] >= 2, first_step  # train step, init
  print(f'the next run: first step compile_s {first_step["compile_s"]:.2f} s, {first_step["cache_hits"]} cache hits, '
        f'compiled only {paid}')


def test_a_grace_period_too_short_for_the_compile_exits_at_once(jobs, tmp_path):
  job_dir, cache = str(tmp_path / 'job'), str(tmp_path / 'cache')
  job = _run(jobs, tmp_path, 'run1', job_dir, cache, '--autockpt_grace_secs=20')
  sent = _sigterm_in_the_compile(job)
  assert job.wait(120) == 143, job.log()[-3000:]
  preemption, exit_ = _ending(job_dir)
  assert (preemption['first_compile'], exit_['code']) == ('dropped', 143), preemption
  assert 'the first compile in flight (' in job.log() and 'is dropped: ~' in job.log()
  assert 'Finished XLA compilation of pjit(_wrapped_step_fn)' not in job.log()
  assert not _train_step_entries(cache)
  print(f'SIGTERM during the first compile, grace 20 s -> exit {exit_["t"] - sent:.1f} s later')
