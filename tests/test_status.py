"""`pax-autockpt status`: two lines from the checkpoint listing and host 0's events."""

import os
import socket
import subprocess
import sys
import threading

import pytest

from pax_autockpt import layout
from pax_autockpt.shared import events as events_lib
from pax_autockpt.startup import startup_times
from pax_autockpt.tools import process
from pax_autockpt.tools import status
from tests import fakes


def _run(job, *events):
  log = events_lib.EventLog(job, 0)
  for kind, fields in events:
    log.write(kind, **fields)
  log.flush()


def test_a_fresh_directory_a_preempted_run_and_one_still_running(tmp_path, capsys):
  job = str(tmp_path / 'job')
  assert status.run(job) == 2 and 'does not exist' in capsys.readouterr().err
  (tmp_path / 'job').mkdir()
  assert status.run(job) == 0
  assert capsys.readouterr().out.splitlines() == [
      'newest committed checkpoint: none (the same command starts fresh)', 'last run: none recorded']
  for step in (0, 500, 731):
    fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), step))
  _run(job, ('start', {'restored_step': None}), ('preemption', {'step': 731, 'signal': 'SIGTERM'}),
       ('exit', {'code': 143, 'step': 731}))
  status.run(job)
  first, second = capsys.readouterr().out.splitlines()
  assert first == ('newest committed checkpoint: step 731, which the same command resumes from (3 committed: 0, '
                   '500, 731)')
  assert ', fresh): preempted (on-demand checkpoint committed) by SIGTERM at step 731, exit 143, ' in second
  _run(job, ('start', {'restored_step': 731, 'pid': os.getpid(), 'process_start_t': startup_times.process_start_t(),
                        'hostname': socket.gethostname()}))
  status.run(job)
  assert f'from step 731): running (process {os.getpid()} on this machine): no step logged yet' in (
      capsys.readouterr().out)


@pytest.mark.parametrize('code,words', [(0, 'finished'), (1, 'failed'), (2, 'stopped on bad configuration'),
                                        (130, 'stopped by Ctrl-C')])
def test_each_exit_code_reads_as_words(tmp_path, code, words):
  job = str(tmp_path / 'job')
  _run(job, ('start', {'restored_step': 5}), ('exit', {'code': code, 'step': 9}))
  assert f': {words} at step 9, exit {code}, ' in status.run_line(events_lib.read(job, 0))


def test_a_job_with_a_local_tier_says_its_newest_local_step_and_whether_a_restart_takes_it(tmp_path, capsys):
  job = str(tmp_path / 'job')
  fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), 0))
  _run(job, ('start', {'restored_step': None}), ('local_committed', {'step': 300, 'duration_s': 0.02}))
  status.run(job)
  lines = capsys.readouterr().out.splitlines()
  assert lines[1].startswith('local tier: step 300 committed on host 0 at ') and lines[1].endswith(
      ", newer than the job directory's newest checkpoint (--local_dir=TEMPLATE says whether a restart takes it)")
  assert 'resumes from it' not in lines[1]  # the log holds no lineage: no promise (issue 57)
  _run(job, ('start', {'restored_step': 300, 'restored_from': 'local'}))
  status.run(job)
  assert 'from step 300 of the local tier): running elsewhere (' in capsys.readouterr().out


def test_a_finished_job_says_a_rerun_trains_nothing(tmp_path, capsys):
  """Exit 0 without a preemption: the job trained to its last step, and the same command would train nothing
  (not 'which the same command resumes from'). An exit code configured to 0 for preemptions is not that."""
  job = str(tmp_path / 'job')
  for step in (0, 500, 1000):
    fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), step))
  _run(job, ('start', {'restored_step': 500}), ('exit', {'code': 0, 'step': 1000}))
  status.run(job)
  first, second = capsys.readouterr().out.splitlines()
  assert first == 'newest committed checkpoint: step 1000 (3 committed: 0, 500, 1000)'
  assert second.endswith('; rerunning the same command trains nothing') and ': finished at step 1000, exit 0' in second
  _run(job, ('start', {'restored_step': 1000}), ('preemption', {'step': 1000, 'signal': 'SIGTERM'}),
       ('exit', {'code': 0, 'step': 1000}))
  status.run(job)
  first, second = capsys.readouterr().out.splitlines()
  assert 'which the same command resumes from' in first and 'trains nothing' not in second


def test_status_reads_host_0s_events_once(tmp_path, capsys, monkeypatch):
  """The three lines come from one read of the event log (a week of events on gs:// is read once, not three
  times)."""
  job = str(tmp_path / 'job')
  _run(job, ('start', {'restored_step': None}), ('local_committed', {'step': 300, 'duration_s': 0.02}),
       ('exit', {'code': 143, 'step': 300}))
  reads = []
  real = events_lib.read
  monkeypatch.setattr(events_lib, 'read', lambda *args, **kwargs: reads.append(args) or real(*args, **kwargs))
  assert status.run(job) == 0
  assert len(capsys.readouterr().out.splitlines()) == 3 and len(reads) == 1


def test_wait_for_checkpoint_returns_once_one_is_committed_or_says_why_not(tmp_path, capsys):
  """The README's "let it train, then preempt it": status waits for a committed checkpoint of the step or
  later (a job directory that does not exist yet is waited for too); a run that ends first, or the
  timeout, is one line and exit 1."""
  job = str(tmp_path / 'job')
  timer = threading.Timer(0.3, lambda: fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), 500)))
  timer.start()
  assert status.run(job, wait_for=400, timeout_secs=30) == 0
  assert capsys.readouterr().out.startswith('newest committed checkpoint: step 500,')
  assert status.run(job, wait_for=1000, timeout_secs=0.2) == 1
  assert capsys.readouterr().err == ('status: error: no checkpoint of step 1000 or later committed within 0.2 s '
                                     '(--timeout_secs)\n')
  threading.Timer(0.3, lambda: _run(job, ('start', {'restored_step': 500}), ('exit', {'code': 1, 'step': 612}))).start()
  assert status.run(job, wait_for=1000, timeout_secs=30) == 1
  assert capsys.readouterr().err == ('status: error: the run ended (exit 1 at step 612) before a checkpoint of step '
                                     '1000 or later was committed\n')


def test_local_saves_failing_since_the_newest_local_commit_are_a_line_until_one_commits_again(tmp_path, capsys):
  """A local tier that stopped (a full disk) is never silent: how many saves failed since the newest local commit,
  from when to when, and the newest reason; a commit after them (or another run) ends the line."""
  job = str(tmp_path / 'job')
  error = 'OSError: [Errno 28] No space left on device'
  _run(job, ('start', {'restored_step': None}), ('local_committed', {'step': 300, 'duration_s': 0.02}),
       ('local_save_failed', {'step': 301, 'error': error, 'failures': 1, 'total': 1}),
       ('local_save_failed', {'step': 361, 'error': error, 'failures': 60, 'total': 61}))
  status.run(job)
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 4 and lines[1].startswith('local tier: step 300 committed on host 0 at ')
  assert lines[2].startswith('local tier: saves failing on host 0: 61 not committed from ')
  assert lines[2].endswith(f', the newest (step 361): {error}')
  _run(job, ('local_save_failed', {'step': 362, 'error': error, 'failures': 1, 'total': 62}),
       ('local_committed', {'step': 363, 'duration_s': 0.02}))
  status.run(job)
  assert 'saves failing' not in capsys.readouterr().out
  _run(job, ('start', {'restored_step': None}), ('local_save_failed', {'step': 5, 'error': error, 'failures': 2}))
  assert status.failing_line(events_lib.read(job, 0)).startswith('local tier: saves failing on host 0: 2 not ')


def test_wait_for_checkpoint_with_the_runs_pid_returns_once_it_is_gone_naming_how_it_ended(tmp_path, capsys):
  """The tutorial's `status --wait_for_checkpoint 200 --pid $!` after a mistyped command: the run exited at once
  (here: an exited child not yet waited for, as a shell's background job is), and status says so at once
  instead of waiting its whole timeout."""
  job = str(tmp_path / 'job')
  child = subprocess.Popen([sys.executable, '-c', 'pass'])
  process.wait_until(lambda: not status.running(child.pid), 'the child to exit', 30)
  assert status.run(job, wait_for=200, timeout_secs=60, pid=child.pid) == 1
  assert capsys.readouterr().err == (
      f'status: error: process {child.pid} is gone (no run in this job directory: it stopped before writing one; '
      '`wait $!` gives its exit code (bad input: 2)) and no checkpoint of step 200 or later was committed\n')
  _run(job, ('start', {'restored_step': None}))  # a run killed without an exit event
  assert status.run(job, wait_for=200, timeout_secs=60, pid=child.pid) == 1
  assert 'its newest run has no exit event: killed' in capsys.readouterr().err
  child.wait()
  assert status.running(os.getpid())


def test_wait_for_checkpoint_without_a_pid_says_what_it_waits_for(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(status, 'PROGRESS_SECS', 0.1)
  job = str(tmp_path / 'job')
  assert status.run(job, wait_for=200, timeout_secs=1.2) == 1
  lines = capsys.readouterr().err.splitlines()
  assert lines[0].startswith('status: waiting ') and lines[0].endswith(
      's for a checkpoint of step 200 or later: no run has started in this job directory yet')
  assert lines[-1].startswith('status: error: no checkpoint of step 200 or later committed within 1.2 s')


def test_the_local_tier_line_reads_the_directory_or_says_how_old_the_logs_figure_is(tmp_path, capsys):
  """During a run the event log holds a local commit a minute: status said `step 300` beside a job directory at
  400 while the tier held 575. With --local_dir it reads host 0's directory; without, it says the figure's age."""
  job, local = str(tmp_path / 'job'), str(tmp_path / 'local-{host}')
  _run(job, ('start', {'restored_step': None}), ('local_committed', {'step': 300, 'duration_s': 0.02}))
  status.run(job)
  line = capsys.readouterr().out.splitlines()[1]
  assert line.startswith('local tier: step 300 committed on host 0 at ')
  assert ' s ago: the event log records at most one local commit a minute, a newer one may exist' in line
  for step in (500, 575):
    (tmp_path / 'local-0' / f'step_{step:08d}').mkdir(parents=True)
    (tmp_path / 'local-0' / f'step_{step:08d}' / layout.LOCAL_INDEX).write_text('{}')
  (tmp_path / 'local-0' / 'step_00000600.partial').mkdir()  # not committed
  status.run(job, local_dir=local)
  assert capsys.readouterr().out.splitlines()[1] == (  # an index that does not read: what the restore says
      f'local tier: step 575 committed on host 0 (in {tmp_path}/local-0), not offered to a restart: damaged '
      f'({tmp_path}/local-0/step_00000575/index.json: format None)')
  _run(job, ('exit', {'code': 137, 'step': 580}))
  status.run(job)
  assert ' s ago' not in capsys.readouterr().out  # the run ended: the log's figure is its last word


def test_wait_for_local_step_reads_host_0s_directory_and_needs_it_named(tmp_path, capsys):
  """The tutorial's "kill -9 once the local tier is past the job directory's 400": status waits for host 0's
  directory to hold a committed local step (its index written) of the step or later; a step without its index is
  not committed; without --local_dir it is one line and exit 2."""
  job, local = str(tmp_path / 'job'), str(tmp_path / 'local-{host}')
  (tmp_path / 'local-0' / f'step_{450:08d}').mkdir(parents=True)  # no index: not committed
  assert status.run(job, timeout_secs=0.3, local_dir=local, wait_for_local=401) == 1
  assert capsys.readouterr().err == ('status: error: no local step 401 or later committed within 0.3 s '
                                     '(--timeout_secs)\n')
  index = tmp_path / 'local-0' / f'step_{450:08d}' / layout.LOCAL_INDEX
  threading.Timer(0.3, lambda: index.write_text('{}')).start()
  _run(job, ('start', {'restored_step': None}))
  assert status.run(job, timeout_secs=30, local_dir=local, wait_for_local=401) == 0
  assert 'local tier: step 450 committed on host 0' in capsys.readouterr().out
  assert status.run(job, wait_for_local=401) == 2
  assert capsys.readouterr().err.startswith('status: error: --wait_for_local_step reads host 0')


def _here(**fields):
  """A `start` event's fields for this very process, as a run on this machine writes them."""
  return {'restored_step': None, 'pid': os.getpid(), 'process_start_t': startup_times.process_start_t(),
          'hostname': socket.gethostname(), **fields}


def _line(job, now):
  return status.run_line(events_lib.read(job, 0), now=now)


def test_a_run_whose_process_is_alive_on_this_machine_is_running_at_its_newest_logged_step(tmp_path):
  """No exit event, and the start event's pid is alive here with the start time it recorded: running, at the step
  of its newest progress (or save) event, however long ago host 0 last logged."""
  job = str(tmp_path / 'job')
  _run(job, ('start', {**_here(), 't': 1000.0}), ('first_step', {'step': 1, 't': 1010.0}),
       ('progress', {'step': 650, 't': 1040.0}))
  assert _line(job, now=1052.0).endswith(f': running (process {os.getpid()} on this machine): step 650, logged 12 s '
                                         'ago')
  assert ': running (process ' in _line(job, now=5000.0)  # alive here: however quiet its log


def test_a_reused_pid_is_not_the_run(tmp_path):
  """The pid lives on, but its process started 100 s after the run's did: another process got the pid after the
  run's died. With this machine's name in the event, the run is killed; without a name (an older log), a process
  started after the event's time is not the run's either, and the log's silence decides."""
  job = str(tmp_path / 'job')
  began = startup_times.process_start_t()
  _run(job, ('start', _here(process_start_t=began - 100)), ('progress', {'step': 650, 't': began + 5}))
  line = _line(job, now=began + 10)
  assert f': killed without a chance to save (SIGKILL, a crash): no exit recorded, process {os.getpid()} is gone ' \
         'from this machine; the last step 650, logged 5 s ago' in line
  _run(job, ('start', {'restored_step': 650, 'pid': os.getpid(), 't': began - 100}),
       ('progress', {'step': 700, 't': began - 30}))
  assert ': running elsewhere (' in _line(job, now=began)  # not the run's process: the fresh log decides
  assert ': killed without a chance to save' in _line(job, now=began + 100)
  assert status.alive_here({'pid': os.getpid(), 't': began + 1}) is True  # started before its event: the run's


def test_a_run_on_another_machine_is_running_while_host_0_logs_within_two_progress_intervals(tmp_path):
  """Its process is not here: host 0's newest event decides, fresher than twice the progress cadence (30 s)."""
  job = str(tmp_path / 'job')
  _run(job, ('start', {**_here(hostname='tpu-vm-7', pid=1), 't': 1000.0}))
  assert _line(job, now=1030.0).endswith(': running elsewhere (no process 1 here; host 0 logged 30 s ago, and logs '
                                         'at least every 30 s while it trains): no step logged yet')
  assert _line(job, now=1100.0).endswith(': no exit recorded and no step logged yet (host 0 has logged nothing for '
                                         '100 s and its process is not on this machine): still starting elsewhere, '
                                         'or killed')
  _run(job, ('progress', {'step': 650, 't': 1200.0}))
  assert _line(job, now=1259.0).endswith(': running elsewhere (no process 1 here; host 0 logged 59 s ago, and logs '
                                         'at least every 30 s while it trains): step 650, logged 59 s ago')
  assert _line(job, now=1500.0).endswith(': killed without a chance to save (SIGKILL, a crash): no exit recorded, '
                                         'host 0 has logged nothing for 5 min and its process is not on this '
                                         'machine; the last step 650, logged 5 min ago')


def test_a_run_of_this_machine_whose_process_is_gone_is_killed_at_once(tmp_path):
  """Named this machine, its pid gone (an exited child): killed, even a second after host 0's last event."""
  job = str(tmp_path / 'job')
  child = subprocess.Popen([sys.executable, '-c', 'pass'])
  child.wait()
  _run(job, ('start', {**_here(pid=child.pid), 't': 1000.0}), ('save_committed', {'step': 200, 't': 1020.0}))
  assert _line(job, now=1021.0).endswith(f': killed without a chance to save (SIGKILL, a crash): no exit recorded, '
                                         f'process {child.pid} is gone from this machine; the last step 200, '
                                         'logged 1 s ago')
