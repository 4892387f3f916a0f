"""End to end, as users run it (fresh `python -m pax_autockpt.main` processes for the runs that restore, save
and exit, forked ones for the runs that only set the scene; real signals, local disk): a
local-tier step restores only into its own job and lineage, the freshest copy is decided again when a
checkpoint is set aside, and a restored local step the job directory lacks is never stranded.

One job, five process starts and two short ones, each a case of issue 38 or 46 that main once got wrong
(Pax's interval is 400 steps in run 1 and none after, so no interval save or end of training races a signal,
however fast the machine runs):
1. train with the local tier past the job directory's checkpoint 400; SIGKILL; then a fork of the job (its
   directory copied, as `cp -r` copies it) on the same local directory is another job for the local tier: it
   restores its own copy of checkpoint 400, not the original's local steps grown from that same checkpoint;
   and while it runs, a second live job on that local directory exits 2 in one line naming the holder;
2. the user rolls back (deletes checkpoint 400): the restart restores 0, not the local step grown from 400;
   it trains on past 450 with local steps only, SIGTERM: an on-demand checkpoint S;
3. S's largest chunk is cut to a third (a crash before the data reached the disk; S is a raw on-demand save),
   and beside the newest local step lie a newer half-written one and a newer one with a flipped byte: the
   restart finds the evidence, sets S aside, passes the broken local steps over and restores the newest whole
   local step (newer than 400), not 0; a SIGTERM during that restore saves the local step to the job
   directory before exiting 143;
4. the VM is replaced (local directory gone): the rerun resumes from that step; a SIGTERM during its first
   compile (no compilation cache) exits 143 at once, nothing trained.
"""

import glob
import json
import os
import re
import shutil
import signal
import time

import pytest

from pax_autockpt import layout
from pax_autockpt.shared import events as events_lib
from pax_autockpt.tools import process
from tests import forkserver
from tests.conftest import checkpoint_steps

pytestmark = pytest.mark.e2e

EXP = 'tests.e2e_experiments.TinyIntervalFromEnv'  # no end; Pax's interval from AUTOCKPT_TEST_CHECKPOINT_EVERY
EVERY_400 = {'AUTOCKPT_TEST_CHECKPOINT_EVERY': '400'}
NO_INTERVAL = {'AUTOCKPT_TEST_CHECKPOINT_EVERY': str(10**9)}


def _events_of_run(job_dir, runs_before):
  """Host 0's events of the run that started after `runs_before` starts (its first event onwards)."""
  events = events_lib.read(job_dir, 0)
  starts = [i for i, e in enumerate(events) if e['event'] == 'start']
  return events[starts[runs_before]:] if len(starts) > runs_before else []


def _logged_commit(job_dir, step):
  """Whether host 0 logged the commit of `step`: the evidence a restart reads (a kill between orbax's rename and
  that event leaves a checkpoint whose deletion no restart can tell from a save that never committed)."""
  return any(e['event'] == 'save_committed' and e.get('step') == step for e in events_lib.read(job_dir, 0))


def _newest_local(folder, without=None):
  """The newest committed local step in `folder` (the event log sums commits up once a minute), once
  `without` is gone from it (a leftover the run's first commit removes); else 0."""
  steps = layout.local_committed_steps(folder)
  return steps[-1] if steps and without not in steps else 0


def _start(jobs, tmp_path, name, job_dir, every, *flags, fresh=True, env=None):
  """A fresh interpreter, as users start it; or (`fresh=False`, for the runs that only set the scene) forked
  from a server that imported paxml (tests/forkserver.py): ~10 CPU-s less."""
  argv = process.ours_argv(EXP, job_dir, '--autockpt_notices=off', f'--autockpt_local_dir={tmp_path}/local-{{host}}',
                           '--autockpt_local_min_interval_secs=0.2', *flags)
  log, env = str(tmp_path / f'{name}.log'), {**(os.environ if env is None else env), **every}
  job = process.Job(argv, log, env=forkserver.users_env(env)) if fresh else forkserver.job(argv, log, env=env)
  jobs.append(job)
  return job


def _started(job_dir, runs_before, job):
  """The `start` event of the run after `runs_before` starts, once written."""
  return process.wait_until(lambda: next(iter(_events_of_run(job_dir, runs_before)), None), 'the start event', 180,
                            0.1, job)


def _holder(folder):
  """What the live holder of a local directory wrote into its lock file ({} until written)."""
  try:
    with open(os.path.join(folder, 'autockpt.lock')) as f:
      return json.loads(f.read() or '{}')
  except (OSError, ValueError):
    return {}


def _fork_is_another_job(jobs, tmp_path, job_dir, local, grown_from_400):
  """The job directory copied to `fork` and run on the same local directory (the original's local steps set
  aside and put back after): it restores its own checkpoint 400 and names the original's steps as another job's.
  While it holds the directory, a second job started on it exits 2 in one line, before writing anything."""
  fork, aside, intruder_dir = str(tmp_path / 'fork'), tmp_path / 'local-aside', str(tmp_path / 'intruder')
  shutil.copytree(job_dir, fork)
  shutil.copytree(local, aside)
  run = _start(jobs, tmp_path, 'fork', fork, NO_INTERVAL, fresh=False)
  process.wait_until(lambda: _holder(local).get('job_log_dir') == fork, 'the fork holding the local directory',
                     120, 0.05, run)
  intruder = _start(jobs, tmp_path, 'intruder', intruder_dir, NO_INTERVAL, fresh=False)
  assert intruder.wait(60) == 2, intruder.log()[-3000:]
  assert [line for line in intruder.log().splitlines() if line.strip()] == [
      f'error: --autockpt_local_dir {local} is held by a live process (pid {run.pid} on {_holder(local)["machine"]}, '
      f'job directory {fork}, host 0, since {_since(_holder(local))}); one local directory serves one job at a '
      'time: give this job its own --autockpt_local_dir, or stop the other'], intruder.log()
  assert not os.path.exists(intruder_dir)
  start = _started(fork, 1, run)  # the original's first start came along with the copy
  assert (start['restored_step'], start['restored_from']) == (400, 'job_dir'), run.log()[-3000:]
  assert f'local step {grown_from_400} is not offered for the restore: written by another job' in run.log()
  run.send(signal.SIGTERM)
  assert run.wait(120) in (0, 143), run.log()[-3000:]
  shutil.rmtree(local)
  shutil.move(aside, local)


def _since(holder):
  return time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(holder['since']))


def _newer_but_broken_local_steps(local, newest):
  """Beside the newest local step, newer ones no restart may take: a half-written one (a SIGKILL mid-save,
  newest + 40) and a committed one with a flipped byte (a bad disk block, newest + 20)."""
  layout.local_partial_dir(local, newest + 40).mkdir()
  (layout.local_partial_dir(local, newest + 40) / layout.LOCAL_SHARDS).write_bytes(b'\0' * 100)
  target = layout.local_step_dir(local, newest + 20)
  shutil.copytree(layout.local_step_dir(local, newest), target)
  data = bytearray((target / layout.LOCAL_SHARDS).read_bytes())
  data[len(data) // 2] ^= 0xFF
  (target / layout.LOCAL_SHARDS).write_bytes(bytes(data))


def _truncate_largest_chunk(step_path):
  """Cuts the checkpoint's largest array chunk to a third; returns it as `array/chunk`."""
  chunks = [p for p in glob.glob(os.path.join(step_path, 'state', '*', '*')) if not os.path.basename(p).startswith('.')]
  largest = max(chunks, key=os.path.getsize)
  with open(largest, 'r+b') as f:
    f.truncate(os.path.getsize(largest) // 3)
  return os.path.relpath(largest, os.path.join(step_path, 'state'))


def test_a_local_step_restores_only_into_its_job_and_lineage_and_is_never_stranded(jobs, tmp_path):
  job_dir, local = str(tmp_path / 'job'), tmp_path / 'local-0'
  ckpt = layout.checkpoint_dir(job_dir)

  # 1. Local steps past checkpoint 400, then an unplanned kill.
  run = _start(jobs, tmp_path, 'run1', job_dir, EVERY_400, fresh=False)
  process.wait_until(lambda: _newest_local(local) >= 430 and _logged_commit(job_dir, 400),
                     'local steps past 430 and the commit of checkpoint 400 logged', 300, 0.05, run)
  run.kill()
  grown_from_400 = layout.local_committed_steps(local)[-1]
  assert checkpoint_steps(job_dir)[0] == [0, 400] and grown_from_400 > 400
  _fork_is_another_job(jobs, tmp_path, job_dir, local, grown_from_400)

  # 2. A rollback: checkpoint 400 deleted. The restart restores 0 and names the local step it passes over.
  shutil.rmtree(layout.step_dir(ckpt, 400))
  run = _start(jobs, tmp_path, 'run2', job_dir, NO_INTERVAL, fresh=False)
  assert (_started(job_dir, 1, run)['restored_step'], _started(job_dir, 1, run)['restored_from']) == (0, 'job_dir')
  assert (f'local step {grown_from_400} is not offered for the restore: it grew from checkpoint 400, which is no '
          'longer in the job directory (rolled back)') in run.log()
  process.wait_until(lambda: _newest_local(local, grown_from_400) >= 450, 'the new lineage past 450', 300, 0.05,
                     run)
  run.send(signal.SIGTERM)
  assert run.wait(120) == 143, run.log()[-3000:]
  ondemand = checkpoint_steps(job_dir)[0][-1]
  newest_local = layout.local_committed_steps(local)[-1]
  assert 400 < newest_local < ondemand, (newest_local, ondemand)

  # 3. The on-demand checkpoint damaged: set aside, and the freshest copy is the newest local step (not 400).
  # A SIGTERM during that restore: the local step is saved to the job directory, then exit 143.
  chunk = _truncate_largest_chunk(layout.step_dir(ckpt, ondemand))
  _newer_but_broken_local_steps(local, newest_local)
  run = _start(jobs, tmp_path, 'run3', job_dir, NO_INTERVAL)
  run.wait_for_log(r'local tier: this host offers steps')  # the first offer: before S is found damaged
  run.send(signal.SIGTERM)
  assert run.wait(180) == 143, run.log()[-3000:]
  assert f'local step {newest_local + 20} is not offered for the restore: damaged (' in run.log()  # 2nd offer
  start = _started(job_dir, 2, run)
  assert (start['restored_step'], start['restored_from']) == (newest_local, 'local'), run.log()[-3000:]
  skipped, = [e for e in events_lib.read(job_dir, 0) if e['event'] == 'restore_skipped']  # before its start event
  assert skipped['step'] == ondemand and f'{chunk} is ' in skipped['error'] and '(cut short)' in skipped['error']
  assert re.search(rf'The restored local step {newest_local} is not in the job directory \(newest there: 0\): '
                   'saving it there before exiting', run.log())
  preemption, = [e for e in _events_of_run(job_dir, 2) if e['event'] == 'preemption']
  assert (preemption['step'], preemption['saved_step'], preemption['plan']) == (newest_local, newest_local, 'save')
  assert checkpoint_steps(job_dir)[0][-1] == newest_local

  # 4. The VM replaced: no local directory. The job directory holds the step. A SIGTERM during the first
  # step's compile (no compilation cache, as a user's first run): nothing trained since that checkpoint, so
  # nothing is saved; the compile the grace period holds is let finish into the job's compilation cache, then
  # exit 143 (issue 58; a grace too short for it exits at once: tests/test_e2e_first_compile.py). (A job trained
  # to its end after its restores: the README tutorial's run 3.)
  shutil.rmtree(local)
  uncached = {k: v for k, v in os.environ.items() if not k.startswith(('JAX_COMPILATION_CACHE', 'JAX_PERSISTENT'))}
  run = _start(jobs, tmp_path, 'run4a', job_dir, NO_INTERVAL, '--jax_log_compiles', env=uncached)
  run.wait_for_log(r'Compiling _wrapped_step_fn')  # the train step's compile began (~7 s here without the cache)
  sent = run.send(signal.SIGTERM)
  assert run.wait(120) == 143, run.log()[-3000:]
  events = [e for e in _events_of_run(job_dir, 3) if e['event'] != 'local_committed']  # a local copy of the step
  assert [e['event'] for e in events] == ['start', 'preemption', 'exit'], events
  assert (events[0]['restored_step'], events[0]['restored_from']) == (newest_local, 'job_dir')  # the VM's disk went
  assert events[1]['during'] == 'start-up' and events[1]['saved_step'] == newest_local
  assert events[1]['first_compile'] == 'finished', events[1]  # paid once: the next run loads it
  assert checkpoint_steps(job_dir)[0][-1] == newest_local
  print(f'SIGTERM during the first compile -> exit {events[2]["t"] - sent:.2f} s after it was sent')

