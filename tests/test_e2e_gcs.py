"""End to end on gs://: real paxml processes against a local GCS server (TF's built-in client and
tensorstore, as on Cloud TPU), real signals, and the bucket's objects checked directly."""

import json
import os
import re
import signal
import sys
import time

import pytest

from pax_autockpt import layout
from pax_autockpt.hosts import hosts
from pax_autockpt.shared import events as events_lib
from pax_autockpt.tools import process
from pax_autockpt.tools import report
from pax_autockpt.tools import verify
from tests import damage
from tests import forkserver
from tests.conftest import assert_restorable
from tests.conftest import checkpoint_steps
from tests.conftest import events_of
from tests.test_e2e_multihost import _alive

pytestmark = pytest.mark.e2e

CONTINUOUS = 'experiments.lm_cloud_autockpt.LmCloudSpmdTinyContinuousAutockpt'  # min 1 s
MULTISLICE = 'experiments.lm_cloud_autockpt.LmCloudSpmdTinyMultisliceAutockpt'
STEP_DONE = r'\[PAX STATUS\]: Step `\d+` completed'


def _name(step: int) -> str:
  return f'checkpoint_{step:08d}'


def _run(jobs, argv, log, env=None) -> process.Job:
  job = forkserver.job(argv, log, env=env)
  jobs.append(job)
  return job


def _without_suite_cache() -> dict[str, str]:
  """A user's environment (the local GCS's settings included, set by its fixture): no compilation cache of the
  suite's own, so the product's default (under the job directory, here on the bucket) is the one used."""
  return {k: v for k, v in os.environ.items() if not k.startswith(('JAX_COMPILATION_CACHE', 'JAX_PERSISTENT_CACHE'))}
_CACHE_WRITE = r'Writing pjit__wrapped_step_fn to persistent compilation cache with key (\S+)\.'


def _assert_loaded_from_the_buckets_cache(gcs, job_name, first, second) -> None:
  """The compilation cache is on by default under the job directory, on gs:// too: the first run wrote its
  train step there, the second (a restore: its state copied into memory XLA owns first) loaded it. A miss
  would write the same key again."""
  keys = re.findall(_CACHE_WRITE, first.log())
  assert keys and not set(keys) & set(re.findall(_CACHE_WRITE, second.log())), keys
  assert 'copied into memory XLA owns' in second.log()
  assert any(name.endswith(keys[0]) for name in gcs.objects(f'{job_name}/autockpt/compilation_cache/')), keys


def _preempt(job, code=143) -> None:
  """SIGTERM once training runs."""
  job.wait_for_log(STEP_DONE, timeout=300)
  job.send(signal.SIGTERM)
  assert job.wait(180) == code, job.log()[-4000:]


def _wait_past(job, step: int) -> None:
  """Until the loop has trained past `step`: Pax logs only the first steps, but a summary entry every
  100 steps (lm_cloud's interval), after that step ran."""
  def past():
    return any(int(n) > step for n in re.findall(r'Wrote summary entry at step `(\d+)`', job.log()))
  process.wait_until(past, f'a summary entry past step {step}', 300, 0.2, job=job)


def _last_run(job, kind, finished=False):
  """The newest process start's events of one kind (host 0). With `finished`, the run has exited:
  its log is read until its `exit` event shows. (Once, in a long session, this test process's TF
  client returned an event part's earlier content right after the writer exited; a fresh process never
  did. The bound keeps a real loss a failure.)"""
  deadline = time.time() + 30
  while True:
    evs = events_lib.read(job)
    last = max(i for i, e in enumerate(evs) if e['event'] == 'start')
    if not finished or any(e['event'] == 'exit' for e in evs[last:]) or time.time() > deadline:
      return [e for e in evs[last:] if e['event'] == kind]
    time.sleep(1.0)


def _objects_of(gcs, job_name, step):
  return {k: v for k, v in gcs.objects(f'{job_name}/checkpoints/{_name(step)}/').items()}


@pytest.mark.soak
def test_preempt_resume_keep_latest_half_written_and_damaged_steps_on_gcs(jobs, gcs, tmp_path, capsys):
  """`make soak` (~170 s of the suite; `make test` keeps on gs:// a half-written step and damage passed over
  in the slow-restore test, continuous saves with keep-latest and the report on the bucket in the grace test,
  a delete that takes the commit marker first in tests/test_layout.py, stock paxml/main.py on local disk).
  Here besides: keep-latest's deletions gone from the bucket, a refused read (403) ends in one line, exit 1,
  stock paxml/main.py on the bucket with its checkpoint writes refused exits 1 naming the newest one, and the
  compilation cache on the bucket (runs 1 and 2 without the suite's own): run 2's train step loaded from it."""
  job_name = 'single'
  job = gcs.url(job_name)
  argv = process.ours_argv(CONTINUOUS, job, '--autockpt_keep_latest=2', '--tensorstore_use_ocdbt=false')

  # Run 1: continuous saves on the bucket, keep the latest 2; SIGTERM -> the agreed step committed. It
  # comes once the 3rd save's commit deleted the 1st. The exit runs the policy once after its commit: the
  # newest 2 are left (3 where that preservation did not finish inside the grace period).
  run1 = _run(jobs, argv, str(tmp_path / 'run1.log'), env=_without_suite_cache())
  run1.wait_for_log(r'\[autockpt\] preservation deleted steps', timeout=300)  # its event uploads later
  _preempt(run1)
  step = events_of(job, 'preemption')[-1]['step']
  deleted = [e['step'] for e in events_of(job, 'deleted')]
  committed, others = checkpoint_steps(job)
  assert committed[-1] == step and 2 <= len(committed) <= 3, (committed, others)
  assert deleted and not set(deleted) & set(committed)
  for gone in deleted:  # deleted means gone from the bucket, marker first
    assert not _objects_of(gcs, job_name, gone), gone
  assert_restorable(job, step)
  assert f'{job_name}/checkpoints/{_name(step)}/{layout.COMMIT_MARKER}' in gcs.objects(job_name)
  print(f'run 1: on-demand step {step}, kept {committed}, deleted {deleted}')

  # A half-written newer step (every object but the commit marker) is not a checkpoint ...
  half = step + 1000
  for name in _objects_of(gcs, job_name, step):
    if not name.endswith(layout.COMMIT_MARKER):
      gcs.write(name.replace(_name(step), _name(half)), gcs.read(name))
  assert checkpoint_steps(job)[0] == committed
  loaded = report.load(job)
  assert (loaded.newest_checkpoint, loaded.checkpoints_incomplete) == (step, 1)
  # ... and a byte flips inside the newest committed one's largest array (rewritten as a valid chunk:
  # only its content manifest can tell), which `pax-autockpt verify` finds on the bucket too.
  name, shard = damage.flip_a_byte(layout.step_dir(layout.checkpoint_dir(job), step))
  damaged = _objects_of(gcs, job_name, step)
  assert verify.run(job, step) == 1  # in this process: the CLI's own path is tested on local disk
  assert f'step {step}: DAMAGED: {name} shard [{shard}]' in capsys.readouterr().out

  # Run 2: the same command restores the previous committed step, marks the damaged one in place.
  # Run 2 must not save at the damaged step's number, or it moves it aside to save there: continuous
  # saving off (its next save would be the step after the restored one, which is the damaged step when
  # run 1 saved two steps in a row: seen once here), and the SIGTERM only once the loop is past that step
  # (the hosts agree on a later step than the signal's, in one run 23 steps later: the damaged step's
  # number). Run 3, which restores run 2's step, then trains past it too.
  run2 = _run(jobs, [*argv, '--autockpt_continuous=false', '--autockpt_min_interval_secs=0'],
              str(tmp_path / 'run2.log'), env=_without_suite_cache())
  _wait_past(run2, step)
  _preempt(run2)
  _assert_loaded_from_the_buckets_cache(gcs, job_name, run1, run2)
  assert [e['step'] for e in events_of(job, 'restore_skipped')] == [step]
  assert 'does not match the manifest' in events_of(job, 'restore_skipped')[0]['error']
  assert _last_run(job, 'start')[0]['restored_step'] == committed[-2]
  step2 = _last_run(job, 'preemption', finished=True)[0]['step']
  marked = _objects_of(gcs, job_name, step)
  assert f'{job_name}/checkpoints/{_name(step)}/{layout.UNRESTORABLE_MARKER}' in marked
  assert set(damaged) - set(marked) == {f'{job_name}/checkpoints/{_name(step)}/{layout.COMMIT_MARKER}'}
  assert step not in checkpoint_steps(job)[0] and half not in checkpoint_steps(job)[0]
  assert_restorable(job, step2)

  # Run 2b: the bucket refuses every read of that checkpoint's arrays (HTTP 403: not damage, not a
  # storage hiccup the clients retry): exit 1 with one line naming it; nothing moved, marked or deleted.
  kept = _objects_of(gcs, job_name, step2)
  gcs.set_faults(fail_fraction=1.0, status=403, path_contains=f'checkpoints/{_name(step2)}/state')
  refused = _run(jobs, argv, str(tmp_path / 'run2b.log'))
  assert refused.wait(180) == 1, refused.log()[-4000:]
  gcs.set_faults()
  line, = [x for x in refused.log().splitlines() if f'checkpoint {step2} failed to restore' in x]
  assert 'not recognised as damage, so nothing was moved; exiting 1.' in line and len(line.split('] ', 1)[1]) < 400
  assert _objects_of(gcs, job_name, step2) == kept and checkpoint_steps(job)[0][-1] == step2
  assert events_of(job, 'restore_failed')[-1]['step'] == step2

  # Run 3, stock paxml/main.py with the Autocheckpoint guide's two flags: restores run 2's step (never the damaged one,
  # which survives orbax's start-up clean-up); storage then refuses checkpoint writes and a SIGTERM
  # comes: exit 1 with one line naming the newest committed step, never 143.
  stock = _run(jobs, process.stock_argv(CONTINUOUS, job, '--jax_fully_async_checkpoint',
                                        '--exit_after_ondemand_checkpoint', '--num_hosts=1',
                                        '--host_idx=0', f'--server_addr=127.0.0.1:{hosts.free_loopback_port()}'),
               str(tmp_path / 'run3.log'))
  stock.wait_for_log(STEP_DONE, timeout=300)
  assert _last_run(job, 'start')[0]['restored_step'] == step2
  assert _objects_of(gcs, job_name, step) == marked
  gcs.set_faults(fail_fraction=1.0, writes_only=True, path_contains='/checkpoints/', status=403)
  stock.send(signal.SIGTERM)
  assert stock.wait(180) == 1, stock.log()[-4000:]
  gcs.set_faults()
  preemptions = _last_run(job, 'preemption', finished=True)
  parts = {n: gcs.read(n).count(b'\n') for n in gcs.objects(f'{job_name}/autockpt/') if n.endswith('.jsonl')}
  if not preemptions:
    print('parts:', parts)
    for name in sorted(parts):
      print(name, gcs.read(name).decode())
    print(stock.log()[-3000:])
  assert preemptions
  agreed = preemptions[0]['step']
  lines = [x for x in stock.log().splitlines() if f'On-demand checkpoint of step {agreed} failed' in x]
  assert len(lines) == 1 and f'the newest committed checkpoint is {step2}' in lines[0], (
      lines, [x for x in stock.log().splitlines() if '[autockpt]' in x][-15:], stock.log()[-3000:])
  assert _last_run(job, 'exit')[0]['code'] == 1
  assert checkpoint_steps(job)[0][-1] == step2 and agreed not in checkpoint_steps(job)[0]

  # The report reads the bucket: text, JSON and the plot (in this process: the CLI is tested on local disk).
  png = tmp_path / 'timeline.png'
  assert report.run(job, plot_path=str(png)) == 0
  assert f'restore skipped: 1 (steps {step})' in capsys.readouterr().out and png.read_bytes()[:4] == b'\x89PNG'
  assert report.run(job, as_json=True) == 0
  as_json = json.loads(capsys.readouterr().out)
  assert as_json['newest_checkpoint'] == step2 and as_json['exit_codes'] == {'143': 2, '1': 1}


def _launch_two(jobs, job, log, ready) -> process.Job:
  """2 local hosts on one bucket; returns once both have logged `ready`."""
  launcher = _run(jobs, [sys.executable, '-m', 'pax_autockpt.tools.cli', 'launch', '--num_hosts=2',
                         '--', f'--exp={MULTISLICE}', f'--job_log_dir={job}'], log)
  for host in (0, 1):
    launcher.wait_for_log(rf'\[host {host}\].*\[autockpt\] {ready}', timeout=300)
  return launcher


@pytest.mark.soak
def test_two_hosts_on_one_bucket_sigterm_to_host_1_only_ocdbt_by_default_and_resumed(jobs, gcs, tmp_path):
  """`make soak` (~70 s of the suite: `make test` keeps OCDBT on gs:// in the grace test, a signal to host 1 only
  on local disk in tests/test_e2e_multihost.py). No format flag: gs:// gets OCDBT; SIGTERM to host 1 only ->
  one step everywhere, then resumed, and the relaunch's launcher SIGKILLed: its hosts exit 143 and none
  outlives it."""
  job = gcs.url('two-hosts')
  host1_log = os.fspath(layout.host_log_path(job, 1))  # outside the test's folder: appended to by every run
  since = os.path.getsize(host1_log) if os.path.exists(host1_log) else 0
  launcher = _launch_two(jobs, job, str(tmp_path / 'launch1.log'), ready='interval save of step')  # in the loop
  assert '[autockpt] gs:// job directory: OCDBT checkpoints' in launcher.log()
  process.wait_until(lambda: 'Step `3` completed' in process.text_of(host1_log, since), 'training on host 1', 300,
                     0.2, launcher)  # past the first step: a SIGTERM before it ends the job with nothing to save
  os.kill(events_of(job, 'start', host=1)[0]['pid'], signal.SIGTERM)
  assert launcher.wait(180) == 143, launcher.log()[-3000:]
  steps = {events_of(job, 'preemption', host=h)[0]['step'] for h in (0, 1)}
  assert len(steps) == 1, f'hosts disagree: {steps} ({layout.host_log_path(job, 1)})'
  step = steps.pop()
  assert [e['code'] for h in (0, 1) for e in events_of(job, 'exit', host=h)] == [143, 143]
  assert checkpoint_steps(job)[0][-1] == step
  assert_restorable(job, step)
  path = layout.step_dir(layout.checkpoint_dir(job), step)
  assert (path / 'state' / 'manifest.ocdbt').exists(), sorted(gcs.objects(f'two-hosts/checkpoints/{_name(step)}/'))
  # Resumed: both hosts restore the step (not 500 more steps to the next interval save: ~60 s here). This
  # time the launcher itself is SIGKILLed (no chance to forward anything): no orphans, its hosts get
  # SIGTERM and exit 143 at the step they restored.
  relaunch = _launch_two(jobs, job, str(tmp_path / 'launch2.log'), ready=f'checkpoint {step}: .* checked')
  process.wait_until(lambda: {events_of(job, 'start', host=h)[-1]['restored_step'] for h in (0, 1)} == {step},
                     f'both hosts restored step {step}', 60, 1.0, relaunch)  # start events upload in the background
  pids = [events_of(job, 'start', host=h)[-1]['pid'] for h in (0, 1)]
  relaunch.send(signal.SIGKILL)  # the launcher only, not its hosts
  relaunch.wait(30)
  for host, pid in enumerate(pids):  # gone (or a zombie waiting for init to reap it)
    process.wait_until(lambda pid=pid: not _alive(pid), f'host {host} (pid {pid}) to outlive no launcher', 60, 0.2)
  # The relaunch's own preemption events, read until both hosts' show (one read once returned host 1's
  # part as it was before the signal: {1, 2}, while both hosts' logs said step 2).
  again = process.wait_until(lambda: _relaunch_preemptions(job, step), 'both hosts\' preemption events of the relaunch',
                             30, 0.5)
  assert len(again) == 1 and again.pop() >= step, again
  process.wait_until(lambda: [e['code'] for h in (0, 1) for e in events_of(job, 'exit', host=h)] == [143] * 4,
                     "both hosts' exit events of the relaunch", 30, 0.5)


def _relaunch_preemptions(job, restored: int) -> set[int] | None:
  """The steps of the preemption events of the run that restored `restored`, on both hosts; None until
  both are there."""
  steps = set()
  for host in (0, 1):
    evs = events_lib.read(job, host)
    newest = max(i for i, e in enumerate(evs) if e['event'] == 'start')
    mine = [e['step'] for e in evs[newest:] if e['event'] == 'preemption']
    if evs[newest].get('restored_step') != restored:
      return None
    if not mine:
      return None
    steps.add(mine[-1])
  return steps


def _in_flight(job) -> bool:
  """A continuous save started and not yet committed (its start is logged in the save thread)."""
  log = job.log()
  trained = re.search(r'Step `\d+` completed', log)  # any step: a restored run starts at its checkpoint's
  return trained and log.count('started (loop blocked') > log.count('committed in') >= 1


def _mean_save_s(job) -> float:
  """This job's mean save (start -> commit) so far, from its events: what the exit plan projects from."""
  took = [e['duration_s'] for e in events_lib.read(job) if e['event'] == 'save_committed' and e.get('duration_s')]
  return sum(took) / len(took)


@pytest.mark.soak  # 1.5-2 min of three runs; the plan's rules keep their unit tests in make test (test_grace)
def test_grace_period_keeps_the_save_in_flight_or_exits_1_before_the_deadline(jobs, gcs, tmp_path, capsys):
  """Checkpoint writes at 150 ms a request (a save ~2-6 s here, with the machine's speed). Run 0 (forked)
  measures this job's save time D (two continuous saves), then is SIGKILLed. Run 1, a grace period of 2D + 2 s:
  SIGTERM just after a continuous save started; the in-flight save and a new one do not both fit (the plan
  projects 1.5 D each and 2 s of margin), so the in-flight step commits and the process exits 143 naming it,
  inside the grace period: whatever this machine's speed, as the grace follows it. Run 2 restores that step;
  with 3 s, nothing fits: exit 1 with one line naming the newest committed step, before the deadline, and the
  step it was writing is not counted. Run 1 is a fresh interpreter."""
  job = gcs.url('grace')
  gcs.set_faults(latency_ms=150, writes_only=True, path_contains='checkpoints/checkpoint_')
  argv = process.ours_argv(CONTINUOUS, job, '--autockpt_min_interval_secs=0', '--autockpt_keep_latest=2')
  measure = _run(jobs, argv, str(tmp_path / 'run0.log'))
  process.wait_until(lambda: sum(e['event'] == 'save_committed' for e in events_lib.read(job)) >= 2,
                     'two continuous saves committed and logged', 300, 0.2, measure)
  measure.kill()
  grace = 2 * _mean_save_s(job) + 2
  # A fresh interpreter, as users start it (the watchdog, the exit and the interpreter's finalization as a job
  # runs them); run 2 is forked (tests/forkserver.py).
  first = process.Job([*argv, f'--autockpt_grace_secs={grace:.1f}'], str(tmp_path / 'run1.log'),
                      env=forkserver.users_env())
  jobs.append(first)
  process.wait_until(lambda: _in_flight(first), 'a continuous save in flight after one committed', 300, 0.02, first)
  first.send(signal.SIGTERM)
  assert first.wait(60) == 143, first.log()[-4000:]
  preemption, = _last_run(job, 'preemption', finished=True)
  exit_, = _last_run(job, 'exit')
  kept, agreed = preemption['saved_step'], preemption['step']
  assert preemption['plan'] == 'keep_in_flight' and kept < agreed, (grace, preemption)
  assert f'no time for a new save after the one of step {kept} in flight' in preemption['why']
  assert exit_['code'] == 143 and exit_['step'] == agreed
  assert exit_['t'] - preemption['signal_at'] < grace, (exit_, preemption)
  assert f'Checkpoint of step {kept} committed (no time to save step {agreed} as well) (SIGTERM); exiting 143.' in \
      first.log()
  assert agreed not in [e['step'] for e in _last_run(job, 'save_started')]
  committed, _ = checkpoint_steps(job)
  assert committed[-1] == kept
  assert '[autockpt] gs:// job directory: OCDBT checkpoints' in first.log()  # no format flag: OCDBT on gs://
  assert (layout.step_dir(layout.checkpoint_dir(job), kept) / 'state' / 'manifest.ocdbt').exists()
  print(f'grace {grace:.1f} s: kept the save of step {kept} in flight at step {agreed}; exit '
        f'{exit_["t"] - preemption["signal_at"]:.2f} s after the SIGTERM')

  second = _run(jobs, [*argv, '--autockpt_grace_secs=3'], str(tmp_path / 'run2.log'))
  process.wait_until(lambda: _in_flight(second), 'a continuous save in flight', 300, 0.05, second)
  before, _ = checkpoint_steps(job)
  second.send(signal.SIGTERM)
  assert second.wait(60) == 1, second.log()[-4000:]
  assert _last_run(job, 'start')[0]['restored_step'] == kept
  preemption, = _last_run(job, 'preemption', finished=True)
  exit_, = _last_run(job, 'exit')
  assert preemption['plan'] in ('keep_in_flight', 'give_up'), preemption
  assert exit_['code'] == 1 and exit_['t'] - preemption['signal_at'] < 3, (exit_, preemption)
  newest = max(before)
  line, = [x for x in second.log().splitlines() if 'exiting 1.' in x]
  assert f'the newest committed checkpoint is {newest}' in line and 'Traceback' not in second.log(), line
  committed, others = checkpoint_steps(job)
  assert committed[-1] == newest, (committed, others)  # what was being written is not a checkpoint
  print(f'grace 3 s: {preemption["plan"]}, exit 1 {exit_["t"] - preemption["signal_at"]:.2f} s after the SIGTERM; '
        f'uncommitted left: {others}')
  # The report reads the bucket: text and the plot (in this process: the CLI is tested on local disk).
  png = tmp_path / 'timeline.png'
  assert report.run(job, plot_path=str(png)) == 0 and png.read_bytes()[:4] == b'\x89PNG'
  assert 'exit codes: ' in capsys.readouterr().out


def _largest_chunk(gcs, job_name, step) -> str:
  """The largest array chunk object of a zarr checkpoint on the bucket."""
  chunks = {n: size for n, size in _objects_of(gcs, job_name, step).items()
            if '/state/' in n and not n.rsplit('/', 1)[-1].startswith('.')}
  return max(chunks, key=chunks.get)


def test_sigterm_during_a_slow_restore_ends_at_once_then_damage_on_the_bucket_is_passed_over(jobs, gcs, tmp_path):
  """A SIGTERM while the restore reads a large checkpoint (here: every read of it 300 ms slow) ends the job
  within a second: nothing trained since that checkpoint, so nothing to save, and the restore need not end
  (the run's `start` event is written by the exit: `before_restore`). A fresh interpreter, as users start it.
  Then damage on the bucket, decided by evidence: the on-demand checkpoint (raw) loses its largest chunk, the
  interval one before it (zstd) has its largest chunk cut to a third: the next run passes over both (set
  aside, never deleted) and restores the one before them, or starts fresh where there is none."""
  job_name = 'slow-restore'
  job = gcs.url(job_name)
  argv = process.ours_argv(process.TINY_EXP, job, '--autockpt_notices=off', '--tensorstore_use_ocdbt=false')
  _preempt(_run(jobs, argv, str(tmp_path / 'run1.log')))
  step = events_of(job, 'preemption')[-1]['step']
  gcs.set_faults(latency_ms=300, path_contains=f'checkpoints/{_name(step)}/')
  second = process.Job(argv, str(tmp_path / 'run2.log'), env=forkserver.users_env())
  jobs.append(second)
  second.wait_for_log(r'\[PAX STATUS\]: Starting checkpoint load', timeout=300)
  second.send(signal.SIGTERM)
  assert second.wait(60) == 143, second.log()[-3000:]
  gcs.set_faults()
  start, preemption, exit_ = _last_run(job, 'start') + _last_run(job, 'preemption') + _last_run(job, 'exit')
  assert start['before_restore'] and start['restored_step'] == step, start
  assert preemption['during'] == 'start-up' and preemption['plan'] == 'nothing_to_save', preemption
  assert exit_['code'] == 143, (preemption, exit_)  # at once: before the restore ended (`before_restore`)
  committed = checkpoint_steps(job)[0]  # [0, step], and 1 where step 0's save was still in flight at step 1
  assert 'restored in' not in second.log() and committed[-1] == step and committed[0] == 0, committed
  print(f'SIGTERM during the restore of {step}: exit {exit_["t"] - preemption["signal_at"]:.2f} s after it')

  # A half-written newer step (every object of `step` but the commit marker) is not a checkpoint: not
  # counted, never restored.
  half = step + 1000
  for name in _objects_of(gcs, job_name, step):
    if not name.endswith(layout.COMMIT_MARKER):
      gcs.write(name.replace(_name(step), _name(half)), gcs.read(name))
  assert half not in checkpoint_steps(job)[0] and report.load(job).checkpoints_incomplete == 1
  older = committed[-2]  # an interval save: zstd chunks
  missing, cut = _largest_chunk(gcs, job_name, step), _largest_chunk(gcs, job_name, older)
  gcs.delete(missing)
  gcs.write(cut, gcs.read(cut)[:len(gcs.read(cut)) // 3])
  third = _run(jobs, argv, str(tmp_path / 'run3.log'))
  process.wait_until(lambda: len(events_of(job, 'start')) == 3, 'the third start event', 300, 0.2, third)
  third.send(signal.SIGTERM)  # nothing trained since what it restored: ends at once
  assert third.wait(120) == 143, third.log()[-3000:]
  assert _last_run(job, 'start')[0]['restored_step'] == (committed[-3] if len(committed) > 2 else None)
  skipped = {e['step']: e['error'] for e in events_of(job, 'restore_skipped')}  # logged before the run's start
  assert list(skipped) == [step, older], skipped
  for damaged in (step, older):
    assert f'{job_name}/checkpoints/{_name(damaged)}/{layout.UNRESTORABLE_MARKER}' in gcs.objects(job_name)


@pytest.mark.soak
def test_a_storage_outage_at_start_up_ends_in_one_line_and_moves_nothing(jobs, gcs, tmp_path):
  """Every request under the job's checkpoints answered 503 from the start: TensorFlow retries for ~200 s,
  then the start-up (orbax's clean-up, the listing) fails: exit 1 in one line naming the storage, no
  traceback, every checkpoint object where it was. (make soak: the retries alone take 200 s.)"""
  job_name = 'outage'
  job = gcs.url(job_name)
  argv = process.ours_argv(process.TINY_EXP, job, '--autockpt_notices=off')
  _preempt(_run(jobs, argv, str(tmp_path / 'run1.log')))
  before = gcs.objects(f'{job_name}/checkpoints/')
  gcs.set_faults(fail_fraction=1.0, status=503, path_contains=f'{job_name}/checkpoints')
  second = process.Job(argv, str(tmp_path / 'run2.log'), env=forkserver.users_env())
  jobs.append(second)
  assert second.wait(900) == 1, second.log()[-3000:]
  gcs.set_faults()
  log = second.log()
  lines = [x for x in log.splitlines() if "storage did not answer" in x]
  assert len(lines) == 1 and 'Traceback' not in log, log[-3000:]
  assert lines[0].startswith('error: ') and 'nothing was moved or marked' in lines[0], lines
  assert gcs.objects(f'{job_name}/checkpoints/') == before
