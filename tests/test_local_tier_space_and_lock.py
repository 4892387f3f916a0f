"""The local tier cannot wedge or be shared (issue 46, Why 5 and 6): a disk sized for `local_keep + 1` steps
survives a SIGKILL mid-save (a real tmpfs, a real SIGKILL), the first save says when that room is missing, saves
that keep failing are one line and one event a minute, and a second live job on a local directory exits 2 in one
line naming the holder while a SIGKILLed one never blocks its restart (real processes)."""

import errno
import logging
import os
import shutil
import socket
import subprocess
import sys
import types

import jax.numpy as jnp
import pytest

from pax_autockpt import executor as executor_lib
from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt.local import lineage as lineage_lib
from pax_autockpt.local import lock
from pax_autockpt.local import saving
from pax_autockpt.shared import events as events_lib
from pax_autockpt.startup import experiment_names
from pax_autockpt.startup import precheck
from tests import fakes

SHARE = 256 * 1024  # bytes of one step's shards: 64 pages of a tmpfs
PAGE = 4096


def _saves(folder, job, run='run-1', keep=2):
  return saving.LocalSaves(folder, min_interval_secs=0, keep=keep, events=events_lib.EventLog(job, 0),
                           lineage=lineage_lib.Tracker('job-a', run))


def _save_all(saves, steps, state):
  for step in steps:
    saves.maybe_save(step, state)
    saves._thread.join()  # pylint: disable=protected-access


@pytest.fixture
def tmpfs(tmp_path):
  """mount(bytes) -> a real tmpfs of that size, unmounted after the test (root only, else skipped)."""
  mounts = []

  def mount(size):
    if os.geteuid() != 0:
      pytest.skip('mounting a tmpfs needs root')
    path = tmp_path / f'tmpfs-{len(mounts)}'
    path.mkdir()
    done = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size},mode=0700', 'tmpfs', str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
      pytest.skip(f'cannot mount a tmpfs: {done.stderr.strip()}')
    mounts.append(path)
    return path

  try:
    yield mount
  finally:
    for path in mounts:
      subprocess.run(['umount', '-l', str(path)], check=False)


_KILLED_MID_SAVE = f'''
import os, signal, sys
import jax.numpy as jnp
from pax_autockpt.shared import events as events_lib
from pax_autockpt.local import format as local_format, lineage as lineage_lib, saving
saves = saving.LocalSaves(sys.argv[1], min_interval_secs=0, keep=2, events=events_lib.EventLog(sys.argv[2], 0),
                               lineage=lineage_lib.Tracker('job-a', 'run-1'))
state = {{'w': jnp.arange({SHARE // 4}, dtype=jnp.float32)}}
for step in (10, 20):
  saves.maybe_save(step, state)
  saves._thread.join()
local_format.commit = lambda *args: os.kill(os.getpid(), signal.SIGKILL)  # step 30's part written, then killed
saves.maybe_save(30, state)
saves._thread.join()
'''


def test_a_tmpfs_sized_for_keep_plus_one_steps_survives_a_sigkill_mid_save(tmp_path, tmpfs):
  """What docs/local-tier.md tells users to provide: room for `local_keep + 1` steps (and a few pages). A run
  SIGKILLed mid-save leaves `local_keep` steps and a `.partial`, the disk full; the restart (which the dead run's
  lock does not block) frees the leftovers' room before its first save, and every save commits."""
  folder = tmpfs(3 * (SHARE + PAGE) + 3 * PAGE)  # 3 steps (shards + index), the lock file, 2 pages to spare
  killed = subprocess.run([sys.executable, '-c', _KILLED_MID_SAVE, str(folder), str(tmp_path / 'job')],
                          capture_output=True, text=True, timeout=120, check=False)
  assert killed.returncode == -9, killed.stderr[-2000:]
  assert layout.local_committed_steps(folder) == [10, 20] and [s for s, _ in layout.local_partials(folder)] == [30]
  assert shutil.disk_usage(folder).free < SHARE  # the next step cannot be written beside the leftovers
  saves = _saves(folder, tmp_path / 'job', run='run-2')
  saves.restored(20)  # the restart restored the newest local step
  _save_all(saves, (40, 50, 60), {'w': jnp.arange(SHARE // 4, dtype=jnp.float32)})
  saves.wait()
  assert layout.local_committed_steps(folder) == [50, 60] and layout.local_partials(folder) == []
  assert fakes.events(tmp_path / 'job', 'local_save_failed') == []


def test_the_first_local_save_says_in_one_line_when_keep_plus_one_steps_cannot_fit(tmp_path, monkeypatch):
  """One line with the figures and the fix, at the first save only; none where the room is there."""
  lines, free = [], [240_000]
  monkeypatch.setattr(saving.logging, 'warning', lambda fmt, *args: lines.append(fmt % args))
  monkeypatch.setattr(shutil, 'disk_usage', lambda path: types.SimpleNamespace(free=free[0]))
  state = {'w': jnp.zeros(25_000, dtype=jnp.float32)}  # a 0.1 MB share
  _save_all(_saves(tmp_path / 'small', tmp_path / 'job'), (1, 2, 3), state)
  assert lines == [f'[autockpt] the local tier {tmp_path / "small"} has room for 0.2 MB (0.2 MB free + 0.0 MB of '
                   'steps it keeps), less than --autockpt_local_keep + 1 = 3 steps of this host\'s 0.1 MB share '
                   '(0.3 MB): local saves will fail once it fills; give it 0.3 MB or more (a larger tmpfs or /dev/shm, '
                   'a local SSD) or set --autockpt_local_keep=1.']
  free[0] = 10_000_000
  _save_all(_saves(tmp_path / 'large', tmp_path / 'job'), (1, 2, 3), state)
  assert len(lines) == 1
  assert saving.room_line(tmp_path, 100_000, 2, 150_000, 0).endswith(' or turn the local tier off.')


def test_local_saves_that_keep_failing_are_one_line_and_one_event_a_minute_with_a_count(tmp_path, monkeypatch):
  """Three minutes of saves a second that fail (a full disk): one line and one `local_save_failed` event a
  minute, with the reason and how many failed, never silence and never a line per failure; the commit that
  follows says the tier works again, and its `local_committed` event comes at once."""
  clock, lines = [0.0], []
  monkeypatch.setattr(saving.time, 'monotonic', lambda: clock[0])
  monkeypatch.setattr(saving.logging, 'warning', lambda fmt, *args: lines.append(fmt % args))
  saves, state = _saves(tmp_path / 'local', tmp_path / 'job'), {'w': jnp.zeros(4, dtype=jnp.float32)}
  _save_all(saves, (1, 2), state)  # the run's first commits...
  full = OSError(errno.ENOSPC, 'No space left on device')
  monkeypatch.setattr(saving.local_format, 'write_part', fakes.raises(full))
  for second in range(180):  # ...then three minutes of failures
    clock[0] = 100.0 + second
    _save_all(saves, [3 + second], state)
  monkeypatch.undo()
  clock[0] = 300.0
  monkeypatch.setattr(saving.time, 'monotonic', lambda: clock[0])
  monkeypatch.setattr(saving.logging, 'warning', lambda fmt, *args: lines.append(fmt % args))
  _save_all(saves, [500], state)
  events = [e for e in fakes.events(tmp_path / 'job') if e['event'].startswith('local_')]
  failed = [e for e in events if e['event'] == 'local_save_failed']
  assert [(e['step'], e['failures'], e['total']) for e in failed] == [(3, 1, 1), (63, 60, 61), (123, 60, 121),
                                                                      (182, 59, 180)]
  assert failed[0]['error'] == ("OSError: [Errno 28] No space left on device (the tier needs room for "
                                "--autockpt_local_keep + 1 steps of this host's 0.0 MB share)")
  assert events[-1]['event'] == 'local_committed' and events[-1]['step'] == 500
  assert len(lines) == 4 and lines[0] == (f'[autockpt] local save of step 3 not committed: {failed[0]["error"]}; 1 '
                                          'failed since the previous line, 1 in this run (one line a minute while '
                                          'local saves fail).')
  assert lines[-1].startswith('[autockpt] local tier: step 500 committed after 59 more failed save(s) (180 in this')


_HOLDER = '''
import sys, time
from pax_autockpt.local import lock
lock.hold(sys.argv[1], sys.argv[2], 0)
print('held', flush=True)
time.sleep(600)
'''


@pytest.fixture
def holder():
  """hold(folder, job) -> the pid of a live process of another job holding `folder`, killed after the test."""
  procs = []

  def hold(folder, job):
    proc = subprocess.Popen([sys.executable, '-c', _HOLDER, str(folder), str(job)], stdout=subprocess.PIPE, text=True)
    procs.append(proc)
    assert proc.stdout.readline().strip() == 'held'
    return proc

  yield hold
  for proc in procs:
    proc.kill()
    proc.wait()


def test_a_second_live_job_on_a_local_directory_is_refused_and_a_sigkilled_one_never_blocks(tmp_path, holder):
  """A live process of another job holds the directory: this one is refused before it touches anything, in one
  line naming the holder and the fix. Once the holder is SIGKILLed the kernel has released its lock."""
  folder = tmp_path / 'local'
  other = holder(folder, '/jobs/other')
  leftover = layout.local_partial_dir(folder, 100)
  leftover.mkdir()  # what the first save would remove as a leftover, were this job to take the directory
  with pytest.raises(lock.InUse) as refused:
    _saves(folder, tmp_path / 'job')
  assert str(refused.value).startswith(f'--autockpt_local_dir {folder} is held by a live process (pid {other.pid} on '
                                       f'{socket.gethostname()}, job directory /jobs/other, host 0, since ')
  assert str(refused.value).endswith('); one local directory serves one job at a time: give this job its own '
                                     '--autockpt_local_dir, or stop the other')
  assert '\n' not in str(refused.value) and leftover.exists()
  other.kill()
  other.wait()
  _saves(folder, tmp_path / 'job')  # the dead holder's lock went with it
  assert f'"pid": {os.getpid()}' in (folder / lock.LOCK_FILE).read_text()


def test_a_run_on_a_held_local_directory_is_refused_at_start_up_before_paxml_and_the_job_directory(tmp_path, holder):
  """precheck takes the lock ~1 s into the run: a second job costs no paxml start-up and writes nothing."""
  other = holder(tmp_path / 'local-0', '/jobs/other')
  with pytest.raises(lock.InUse) as refused:
    precheck.run(['main', f'--exp={experiment_names.EXAMPLE}', f'--job_log_dir={tmp_path}/job',
                  f'--autockpt_local_dir={tmp_path}/local-{{host}}'])
  assert f'(pid {other.pid} on ' in str(refused.value) and not (tmp_path / 'job').exists()


def test_the_holder_named_as_another_host_of_this_job_means_host_is_missing_from_the_path():
  line = lock.busy_line('/dev/shm/ac', {'pid': 7, 'machine': 'vm', 'job_log_dir': '/j', 'host': 1}, '/j', 0)
  assert line == ('--autockpt_local_dir /dev/shm/ac is held by a live process (pid 7 on vm, job directory /j, host 1)'
                  '; put {host} in --autockpt_local_dir so that each host of this job has its own directory')


@pytest.mark.usefixtures('clean_signals')
def test_a_training_process_on_a_held_local_directory_exits_2_in_one_line(tmp_path, holder, caplog):
  """Through the executor, as a run starts: exit 2, one error line naming the holder, an `exit` event."""
  folder, job = tmp_path / 'local', tmp_path / 'job'
  other = holder(folder, '/jobs/other')
  executor = executor_lib.AutockptExecutor(settings_lib.Settings(local_dir=str(folder), notices='off'))
  task = types.SimpleNamespace(model=types.SimpleNamespace())
  with pytest.raises(SystemExit) as exited:
    executor.setup(task, job, fakes.FakePaxCheckpointer(job), exit_after_ondemand_checkpoint=True)
  assert exited.value.code == 2
  errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
  assert len(errors) == 1 and errors[0].startswith(f'[autockpt] --autockpt_local_dir {folder} is held by a live '
                                                   f'process (pid {other.pid} ') and errors[0].endswith('; exiting 2.')
  assert [(e['code'], e['step']) for e in fakes.events(job, 'exit')] == [(2, None)]


# --- issue 57: another job's steps are its progress; the room buddy copies need ------------------------------

_JOB_A_KILLED = f'''
import os, signal, sys
import jax.numpy as jnp
from pax_autockpt.shared import events as events_lib
from pax_autockpt.local import lineage as lineage_lib, saving
saves = saving.LocalSaves(sys.argv[1], min_interval_secs=0, keep=2, events=events_lib.EventLog(sys.argv[2], 0),
                          lineage=lineage_lib.Tracker('job-a', 'run-1'))
for step in (285, 300):
  saves.maybe_save(step, {{'w': jnp.full({SHARE // 4}, step, dtype=jnp.float32)}})
  saves._thread.join()
os.kill(os.getpid(), signal.SIGKILL)  # its newest progress is in the local tier only
'''


def _job_a_killed(folder, job):
  """Job A, a real process, saves local steps 285 and 300 and is SIGKILLed; their bytes, by step."""
  killed = subprocess.run([sys.executable, '-c', _JOB_A_KILLED, str(folder), str(job)], capture_output=True, text=True,
                          timeout=300, check=False)
  assert killed.returncode == -9, killed.stderr[-2000:]
  return {s: (layout.local_step_dir(folder, s) / layout.LOCAL_SHARDS).read_bytes() for s in (285, 300)}


def _saves_of(folder, job_dir, job, run, **kwargs):
  return saving.LocalSaves(folder, min_interval_secs=0, keep=2, events=events_lib.EventLog(job_dir, 0),
                           lineage=lineage_lib.Tracker(job, run), **kwargs)


def test_a_copy_of_a_job_on_the_same_local_directory_prunes_only_its_own_steps(tmp_path):
  """The issue's case: job A SIGKILLed with steps 285 and 300 in the local tier only; a copy of its job directory
  (job B, as a forked experiment's copied command) runs on the same local directory. B's saves used to delete A's
  steps as leftovers: A's rerun then restored 0. Now they stay, byte for byte, through B's saves (its save of
  step 300 fails rather than replace A's), and A's rerun leaves B's alone in turn."""
  folder = tmp_path / 'local'
  theirs = _job_a_killed(folder, tmp_path / 'job-a')
  b = _saves_of(folder, tmp_path / 'job-b', 'job-b', 'run-1')
  _save_all(b, (100, 200, 300, 310, 320), {'w': jnp.zeros(SHARE // 4, dtype=jnp.float32)})
  b.wait()
  assert layout.local_committed_steps(folder) == [285, 300, 310, 320]
  assert {s: (layout.local_step_dir(folder, s) / layout.LOCAL_SHARDS).read_bytes() for s in (285, 300)} == theirs
  failed = fakes.events(tmp_path / 'job-b', 'local_save_failed')
  assert [e['step'] for e in failed] == [300]
  assert failed[0]['error'] == (f'StepInTheWay: step_00000300 here is job job-a\'s (job directory {tmp_path}/job-a), '
                                'which this job leaves in place: give this job its own --autockpt_local_dir')
  a = _saves_of(folder, tmp_path / 'job-a', 'job-a', 'run-2')  # A's rerun (B's process is gone: another lock)
  a.restored(300)
  _save_all(a, (330, 340, 350), {'w': jnp.ones(SHARE // 4, dtype=jnp.float32)})
  assert layout.local_committed_steps(folder) == [310, 320, 340, 350]


def test_another_jobs_steps_that_leave_no_room_are_named_in_one_line_and_count_as_taken(tmp_path, tmpfs, caplog):
  """A real tmpfs with room for `local_keep` + 1 steps: A's two steps take two of them. B's first save says in one
  line whose steps they are (they are not room it can free), and the ENOSPC its saves meet names that job too."""
  folder = tmpfs(3 * (SHARE + PAGE) + 3 * PAGE)
  _job_a_killed(folder, tmp_path / 'job-a')
  b = _saves_of(folder, tmp_path / 'job-b', 'job-b', 'run-1')
  _save_all(b, (10, 20), {'w': jnp.zeros(SHARE // 4, dtype=jnp.float32)})
  b.wait()
  lines = [r.getMessage() for r in caplog.records if 'has room for' in r.getMessage()]
  assert len(lines) == 1, lines
  assert (f'0.5 MB are job job-a\'s (job directory {tmp_path}/job-a) local steps '
          f'({folder}/step_00000285, {folder}/step_00000300), another job\'s progress, which this job leaves in '
          'place: remove them if that job is done with them, or give it ') in lines[0]
  assert '(0.0 MB free + 0.0 MB of steps it keeps)' not in lines[0]  # A's bytes are not counted as B's room
  failed = fakes.events(tmp_path / 'job-b', 'local_save_failed')
  assert failed and 'No space left on device' in failed[0]['error'] and "job job-a's" in failed[0]['error']
  assert {285, 300} <= set(layout.local_committed_steps(folder))


def _step_bytes(folder):
  return sum(os.path.getsize(p) for d in folder.iterdir() if d.name.startswith('step_') for p in d.iterdir())


def test_with_buddy_copies_the_first_room_check_counts_keep_plus_4_shares_and_buddy_dir(tmp_path, monkeypatch):
  """The worst case: `keep` own commits, one own step beside a lagging buddy copy, the one being written, and two of
  the neighbour's (the newest copy and one in flight): keep + 4 shares, not the keep + 2 documented before. The
  check counts what `buddy/` holds as room the copies reuse (it ignored `buddy/`: a /dev/shm sized from the docs,
  which is RAM, filled)."""
  lines = []
  monkeypatch.setattr(saving.logging, 'warning', lambda fmt, *args: lines.append(fmt % args))
  state = {'w': jnp.zeros(25_000, dtype=jnp.float32)}  # a 0.1 MB share
  for name in ('local', 'local2'):
    in_flight = layout.local_partial_dir(layout.local_buddy_dir(tmp_path / name), 1)
    in_flight.mkdir(parents=True)
    (in_flight / layout.LOCAL_SHARDS).write_bytes(bytes(200_000))  # a copy in flight
  free = [360_000]  # room for keep + 1 steps beside buddy/'s 0.2 MB (all the old check asked for): not keep + 4
  monkeypatch.setattr(shutil, 'disk_usage', lambda path: types.SimpleNamespace(free=free[0]))
  _save_all(_saves_of(tmp_path / 'local', tmp_path / 'job', 'job-a', 'run-1', buddy=True), (1,), state)
  assert len(lines) == 1 and ('has room for 0.6 MB (0.4 MB free + 0.2 MB of steps it keeps), less than '
                              '--autockpt_local_keep + 4 = 6 shares (with buddy copies: 4 steps of this host\'s 0.1 MB '
                              'share, 2 of its neighbour\'s) (0.6 MB): local saves will fail') in lines[0], lines
  free[0] = 450_000  # keep + 4 shares with buddy/'s 0.2 MB counted as room: fits
  _save_all(_saves_of(tmp_path / 'local2', tmp_path / 'job', 'job-a', 'run-1', buddy=True), (1,), state)
  assert len(lines) == 1
  assert saving.room_line(tmp_path, 100_000, 2, 450_000, 0) is None  # without buddy copies keep + 1 is enough


def test_an_own_step_is_kept_beside_one_lagging_buddy_copy_only(tmp_path):
  """Two committed buddy copies at once (the new one committed, the old not pruned yet), both behind this host's
  newest `keep`: only the newest pair's own step is kept beyond `keep`, so own steps stay within keep + 2 while the
  next one is written."""
  folder = tmp_path / 'local'
  saves = _saves_of(folder, tmp_path / 'job', 'job-a', 'run-1', buddy=True)
  state = {'w': jnp.zeros(1000, dtype=jnp.float32)}
  _save_all(saves, (10, 20), state)
  buddy_dir = layout.local_buddy_dir(folder)
  for step in (10, 20):  # the neighbour's copies of this run's steps 10 and 20 (the same save: the same token)
    shutil.copytree(layout.local_step_dir(folder, step), layout.local_step_dir(buddy_dir, step))
  _save_all(saves, (30, 40, 50), state)
  assert layout.local_committed_steps(folder) == [20, 40, 50]
