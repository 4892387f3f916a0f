"""End to end, the local tier (--autockpt_local_dir): an unplanned kill loses seconds, not a job directory interval.

Real input (a shuffled TFRecord file, input checkpointing on); the job directory's checkpoints come only
at steps 0 and 600 (the job directory tier, rare on purpose), the local tier saves back to back at most every
0.5 s. A SIGKILL mid-training, no signal, no save: the restart must restore the newest complete local
step (never a half-written or damaged one), not the job directory's step 0, and the run's end must be
identical, array by array and input position, to an uninterrupted run's. `make soak`: one host; two hosts
on the local GCS, one host's local disk replaced (empty) and filled by its replica, then every local disk
empty (the job directory's step).
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from experiments import tfrecord_lm_input
from pax_autockpt import layout
from pax_autockpt.local import format as local_format
from pax_autockpt.shared import events as events_lib
from pax_autockpt.tools import process
from tests import forkserver
from tests.conftest import checkpoint_steps

pytestmark = pytest.mark.e2e

EXP = 'tests.e2e_experiments.TinyTFRecordRareSaves'
TWO_HOSTS = 'tests.e2e_experiments.TinyTFRecordRareSavesTwoHosts'
MODEL_PARALLEL = 'tests.e2e_experiments.TinyModelParallelRareSaves'
MEDIUM_REPLICAS = 'tests.e2e_experiments.MediumTwoReplicas'
FINAL = 600


def _local_flags(tmp_path):
  return (f'--autockpt_local_dir={tmp_path}/local-{{host}}', '--autockpt_local_min_interval_secs=0.5')


def _local_steps(folder, at_least):
  """The committed local steps in `folder`, once one reached `at_least` (else None). The event log sums
  local commits up once a minute: the directory is what shows them at once."""
  steps = layout.local_committed_steps(folder)
  return steps if steps and steps[-1] >= at_least else None


def _verify_against(job_dir, other):
  out = subprocess.run([sys.executable, '-m', 'pax_autockpt.tools.cli', 'verify', job_dir, '--against', other],
                       capture_output=True, text=True, check=False)
  return out.returncode, out.stdout + out.stderr


def _damaged_copy(folder, step, new_step):
  """A committed local step `new_step` whose bytes differ from its digests (a bad disk block)."""
  target = layout.local_step_dir(folder, new_step)
  shutil.copytree(layout.local_step_dir(folder, step), target)
  shards = target / layout.LOCAL_SHARDS
  data = bytearray(shards.read_bytes())
  data[len(data) // 2] ^= 0xFF
  shards.write_bytes(bytes(data))


@pytest.mark.soak  # make test: the README tutorial (kill -9, the local step, identical) and the lineage test (broken
# newer local steps passed over, in a fresh interpreter)
def test_sigkill_one_host_resumes_from_the_newest_local_step_identical_to_an_uninterrupted_run(
    jobs, tmp_path, uninterrupted_tfrecord_run):
  env = {**os.environ, 'AUTOCKPT_TINY_TFRECORD': uninterrupted_tfrecord_run.corpus}
  job_dir = str(tmp_path / 'resumed')
  local = tmp_path / 'local-0'

  def start(name, job, *flags):
    started = forkserver.job(process.ours_argv(EXP, job, '--autockpt_notices=off', *flags),
                             str(tmp_path / f'{name}.log'), env=env)
    jobs.append(started)
    return started

  run = start('run1', job_dir, *_local_flags(tmp_path))
  process.wait_until(lambda: _local_steps(local, 300), 'local saves past step 300', 300, 0.05, run)
  run.kill()  # no signal, no save
  newest = layout.local_committed_steps(local)[-1]
  assert checkpoint_steps(job_dir)[0] == [0] and newest >= 300  # the job directory holds only step 0
  # Beside it, newer: a half-written local step (killed mid-save) and a committed one with a flipped byte.
  layout.local_partial_dir(local, newest + 40).mkdir()
  (layout.local_partial_dir(local, newest + 40) / layout.LOCAL_SHARDS).write_bytes(b'\0' * 100)
  _damaged_copy(local, newest, newest + 20)

  run = start('run2', job_dir, *_local_flags(tmp_path))
  assert run.wait(300) == 0, run.log()[-3000:]
  first = [e for e in events_lib.read(job_dir) if e['event'] == 'start'][-1]
  assert (first['restored_step'], first['restored_from']) == (newest, 'local'), first
  assert f'local step {newest + 20} is not offered for the restore: damaged (' in run.log()
  assert re.search(rf'local tier: this host offers steps \[.*{newest}\]; the job directory\'s newest checkpoint is 0; '
                   rf'restoring local step {newest}\.', run.log())
  assert re.search(rf'run summary: trained steps {newest} to {FINAL}, ', run.log())
  assert layout.local_step_dir(local, newest + 20).exists() is False  # pruned by the new run's commits (keep 2)

  uninterrupted_tfrecord_run.wait()
  code, out = _verify_against(job_dir, uninterrupted_tfrecord_run.job_dir)
  assert code == 0 and re.fullmatch(rf'step {FINAL}: identical to \S+ \(54 arrays, 54 shards, 1 input states, '
                                    r'[\d.]+ s\)\n', out), out


def _launch(jobs, tmp_path, name, job_dir, *flags, exp=TWO_HOSTS):
  job = forkserver.job([sys.executable, '-m', 'pax_autockpt.tools.cli', 'launch', '--num_hosts=2', '--',
                        f'--exp={exp}', f'--job_log_dir={job_dir}', '--autockpt_notices=off', *flags],
                       str(tmp_path / f'{name}.log'))
  jobs.append(job)
  return job


def _kill_hosts(job_dir, order):
  """SIGKILL each host in `order` (a failed host ends the job; the scheduler restarts all), by pid: a
  launcher that dies has its hosts save and exit 143, which is not the failure tested here."""
  for host in order:
    pid = [e for e in events_lib.read(job_dir, host) if e['event'] == 'start'][-1]['pid']
    with contextlib.suppress(ProcessLookupError):  # a host's peer dies within 0.2 s of it
      os.kill(pid, signal.SIGKILL)


def _run_starts(job_dir, host):
  return [(e['restored_step'], e.get('restored_from')) for e in events_lib.read(job_dir, host)
          if e['event'] == 'start']


@pytest.mark.soak
def test_two_hosts_a_replaced_host_is_filled_by_its_replica_and_without_local_copies_the_job_dir_restores(
    jobs, gcs, tmp_path):
  """`make soak`: 2 hosts as 2 data-parallel replicas, bucket on the local GCS. SIGKILL host 1; its local
  disk replaced (empty): both restore the newest local step, host 1 from host 0's copy, and the run ends
  identical to an uninterrupted one. Then SIGKILL again with every local disk empty: the job directory's step."""
  os.environ['AUTOCKPT_TINY_TFRECORD'] = tfrecord_lm_input.write_corpus(str(tmp_path / 'data.tfrecord'))
  job_dir, reference_dir = gcs.url('local/resumed'), gcs.url('local/uninterrupted')
  local = [tmp_path / f'local-{h}' for h in (0, 1)]
  reference = _launch(jobs, tmp_path, 'uninterrupted', reference_dir)
  run = _launch(jobs, tmp_path, 'run1', job_dir, *_local_flags(tmp_path))
  process.wait_until(lambda: _local_steps(local[1], 300), 'local saves past step 300', 600, 0.2, run)
  _kill_hosts(job_dir, (1, 0))
  run.wait(120)
  newest = layout.local_committed_steps(local[0])[-1]
  shutil.rmtree(local[1])  # a replaced VM

  run = _launch(jobs, tmp_path, 'run2', job_dir, *_local_flags(tmp_path))
  assert run.wait(600) == 0, run.log()[-3000:]
  assert re.search(rf'\[host 1\].*local step {newest} received from host 0', run.log()), run.log()[-3000:]
  for host in (0, 1):
    process.wait_until(lambda h=host: len(_run_starts(job_dir, h)) == 2, f'host {host}\'s start event', 30, 1.0)
    assert _run_starts(job_dir, host)[-1] == (newest, 'local')
  assert reference.wait(600) == 0, reference.log()[-3000:]
  code, out = _verify_against(job_dir, reference_dir)
  assert code == 0 and '2 input states' in out, out
  # The filled copy is a committed local step of host 1 now, as its own would be.
  assert newest in layout.local_committed_steps(local[1]) or layout.local_committed_steps(local[1])[0] > newest
  assert local_format.read_index(layout.local_step_dir(local[1], layout.local_committed_steps(local[1])[-1]))

  # Every local disk empty: the job directory's newest committed step (the final one here) restores.
  for folder in local:
    shutil.rmtree(folder)
  run = _launch(jobs, tmp_path, 'run3', job_dir, *_local_flags(tmp_path))
  assert run.wait(600) == 0, run.log()[-3000:]
  for host in (0, 1):
    process.wait_until(lambda h=host: len(_run_starts(job_dir, h)) == 3, f'host {host}\'s start event', 30, 1.0)
    assert _run_starts(job_dir, host)[-1] == (FINAL, 'job_dir')


@pytest.mark.soak
def test_four_hosts_in_two_slices_a_replaced_host_is_filled_by_the_same_host_of_the_other_slice(jobs, tmp_path):
  """`make soak`: 4 hosts as 2 slices of 2 (DCN [2, 1, 1], the model split over a slice's 2 hosts), job
  directory on local disk. SIGKILL; host 1's local directory removed: host 1 holds the other half of the model
  than host 0, so its copy comes from host 3 (the same half in slice 1), and every host restores the newest
  local step. With buddy copies on, each host keeps the same host's of the other slice."""
  os.environ['AUTOCKPT_TINY_TFRECORD'] = tfrecord_lm_input.write_corpus(str(tmp_path / 'data.tfrecord'))
  job_dir = str(tmp_path / 'job')
  argv = [sys.executable, '-m', 'pax_autockpt.tools.cli', 'launch', '--num_hosts=4', '--num_slices=2', '--',
          f'--exp={TWO_HOSTS}', f'--job_log_dir={job_dir}', '--autockpt_notices=off', *_local_flags(tmp_path),
          '--autockpt_local_buddy']
  run = forkserver.job(argv, str(tmp_path / 'run1.log'))
  jobs.append(run)
  process.wait_until(lambda: _local_steps(tmp_path / 'local-3', 200), 'local saves past step 200', 600, 0.2, run)
  _kill_hosts(job_dir, (1, 0, 2, 3))
  run.wait(120)
  assert checkpoint_steps(job_dir)[0] == [0]
  for host in range(4):  # buddy copies: each host keeps the same host's of the other slice
    kept = layout.local_buddy_dir(tmp_path / f'local-{host}')
    assert local_format.read_index(layout.local_step_dir(kept, layout.local_committed_steps(kept)[-1]))['host'] == (
        (host + 2) % 4), host
  held = {h: set(layout.local_committed_steps(tmp_path / f'local-{h}')) for h in (0, 2, 3)}
  newest = max(held[3] & (held[0] | held[2]))  # half B only on host 3 now; half A on host 0 or 2
  shutil.rmtree(tmp_path / 'local-1')
  run = forkserver.job(argv, str(tmp_path / 'run2.log'))
  jobs.append(run)
  assert run.wait(900) == 0, run.log()[-3000:]
  assert re.search(rf'\[host 1\].*local step {newest} received from host 3', run.log()), run.log()[-3000:]
  for host in range(4):
    assert _run_starts(job_dir, host)[-1] == (newest, 'local'), host


@pytest.mark.soak
def test_two_hosts_without_a_replica_a_replaced_host_restores_the_buddy_copy_identical_to_an_uninterrupted_run(
    jobs, tmp_path):
  """`make soak`: one slice over 2 hosts (the model split between them: no replica), the local tier with buddy
  copies: host 0 keeps host 1's newest local step and host 1 host 0's. SIGKILL both; host 1's disk replaced
  (empty: its own steps and the copy it kept for host 0, gone). Both hosts restore the newest local step,
  host 1's share streamed from the buddy copy host 0 keeps, and the run ends identical to an uninterrupted
  2-host run. (`make test` runs the same plan and transfer in two real processes: tests/test_local_tier.py.)"""
  job_dir, reference_dir = str(tmp_path / 'job'), str(tmp_path / 'uninterrupted')
  local = [tmp_path / f'local-{h}' for h in (0, 1)]
  kept = layout.local_buddy_dir(local[0])  # host 1's copy, on host 0's disk
  flags = (*_local_flags(tmp_path), '--autockpt_local_buddy')
  reference = _launch(jobs, tmp_path, 'uninterrupted', reference_dir, exp=MODEL_PARALLEL)
  run = _launch(jobs, tmp_path, 'run1', job_dir, *flags, exp=MODEL_PARALLEL)
  process.wait_until(lambda: _local_steps(kept, 300), 'a buddy copy past step 300', 600, 0.2, run)
  _kill_hosts(job_dir, (1, 0))
  run.wait(120)
  newest = layout.local_committed_steps(kept)[-1]
  assert newest in layout.local_committed_steps(local[0]), (newest, layout.local_committed_steps(local[0]))
  assert local_format.read_index(layout.local_step_dir(kept, newest))['fingerprint'] != local_format.read_index(
      layout.local_step_dir(local[0], newest))['fingerprint']  # host 1's half, not a replica of host 0's
  first_copy = r'\[host 0\].*buddy copies: 1 of host 1\'s local steps copied, newest \d+'
  assert re.search(first_copy, run.log()), run.log()[-3000:]
  shutil.rmtree(local[1])  # a replaced VM

  run = _launch(jobs, tmp_path, 'run2', job_dir, *flags, exp=MODEL_PARALLEL)
  assert run.wait(600) == 0, run.log()[-3000:]
  assert re.search(rf'\[host 1\].*local step {newest} received from host 0 \(the buddy copy it keeps for this host\)',
                   run.log()), run.log()[-3000:]
  for host in (0, 1):
    process.wait_until(lambda h=host: len(_run_starts(job_dir, h)) == 2, f'host {host}\'s start event', 30, 1.0)
    assert _run_starts(job_dir, host)[-1] == (newest, 'local')
  assert reference.wait(600) == 0, reference.log()[-3000:]
  code, out = _verify_against(job_dir, reference_dir)
  assert code == 0 and 'identical' in out, out


@pytest.mark.soak
def test_two_replicas_of_the_medium_state_a_replaced_host_streams_its_share_from_its_peer(jobs, tmp_path):
  """`make soak`: the Medium state (~600 MB with Adam's moments) over 2 hosts as 2 data-parallel replicas, the
  local tier every 10 s. SIGKILL both; host 1's disk replaced (empty). Both hosts restore the newest local
  step, host 1's whole share streamed from host 0 over the peer path (digests checked as it arrives), and
  training goes on from there. What it costs against a raw copy of the same bytes: `make bench`
  (peertransfer_Medium)."""
  job_dir = str(tmp_path / 'job')
  local = [tmp_path / f'local-{h}' for h in (0, 1)]
  flags = (f'--autockpt_local_dir={tmp_path}/local-{{host}}', '--autockpt_local_min_interval_secs=10')
  run = _launch(jobs, tmp_path, 'run1', job_dir, *flags, exp=MEDIUM_REPLICAS)
  both = lambda: [layout.local_committed_steps(f) for f in local]
  process.wait_until(lambda: all(s and s[-1] > 0 for s in both()) and len(set(s[-1] for s in both())) == 1,
                     'a local step past 0 committed on both hosts', 900, 0.5, run)
  _kill_hosts(job_dir, (1, 0))
  run.wait(120)
  newest = layout.local_committed_steps(local[0])[-1]
  assert newest > 0 and newest in layout.local_committed_steps(local[1])
  shutil.rmtree(local[1])  # a replaced VM

  host_log = os.fspath(layout.host_log_path(job_dir, 1))
  since = os.path.getsize(host_log)  # host logs are appended to: the relaunch's part only
  run = _launch(jobs, tmp_path, 'run2', job_dir, *flags, exp=MEDIUM_REPLICAS)
  for host in (0, 1):
    process.wait_until(lambda h=host: len(_run_starts(job_dir, h)) == 2, f'host {host}\'s start event', 900, 0.5,
                       run)
  received = re.search(rf'\[host 1\].*local step {newest} received from host 0 in ([\d.]+) s \(([\d.]+) MB',
                       run.log())
  assert received and float(received.group(2)) > 400, run.log()[-3000:]  # the whole replica, not a part
  assert [_run_starts(job_dir, h)[-1] for h in (0, 1)] == [(newest, 'local')] * 2
  print(f'host 1\'s {received.group(2)} MB share streamed from host 0 in {received.group(1)} s')
  process.wait_until(lambda: re.search(r'Step `\d+` completed', process.text_of(host_log, since)),
                     'host 1 training again', 300, 0.5, run)
  _kill_hosts(job_dir, (1, 0))
  run.wait(120)
  assert layout.local_committed_steps(local[1])[0] >= newest  # the streamed step, a committed one of host 1's
