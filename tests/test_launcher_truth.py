"""`pax-autockpt launch` reports the truth whatever else fails (issue 56): a stop reaches every host when the console
cannot be written, every host's output is drained when its log cannot be, the job's code is the first failing
host's own, restarts back off (and `report` shows it), a forwarded stop ends in SIGKILL after the grace period.

The launcher runs as a real process (`pax-autockpt launch`'s own code, `launch_fake_host.DRIVER`) with real
signals and pipes; its hosts are `tests.launch_fake_host` (a fraction of a second to start) except in the one case
that needs paxml's own bad-input exit on one host."""

import dataclasses
import io
import json
import os
import signal
import subprocess
import sys

import pytest

from pax_autockpt.tools import launcher
from pax_autockpt.tools import process
from pax_autockpt.tools import report
from tests import launch_fake_host

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def launches():
  """Launchers a test started, and their fake hosts (found by the job directory on their command line: they run
  in sessions of their own, and one that ignores SIGTERM outlives its launcher); any still running are killed."""
  started: list[tuple[subprocess.Popen, str]] = []
  yield started
  for proc, job in started:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
    for pid in _fake_hosts_of(job):
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass


def _fake_hosts_of(job: str) -> list[int]:
  """The pids of fake hosts still running for `job` (their command line names it)."""
  found = []
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      with open(f'/proc/{pid}/cmdline', 'rb') as f:
        argv = f.read().split(b'\0')
    except OSError:
      continue
    if b'tests.launch_fake_host' in argv and f'--job_log_dir={job}'.encode() in argv:
      found.append(int(pid))
  return found


def _launch(launches, tmp_path, *flags, hosts=(), num_hosts=2, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL) -> subprocess.Popen:
  """`pax-autockpt launch --num_hosts=N --no_standby FLAGS -- --job_log_dir=JOB HOSTS` with fake hosts."""
  job = str(tmp_path / 'job')
  argv = [sys.executable, '-c', launch_fake_host.DRIVER, 'launch', f'--num_hosts={num_hosts}', '--no_standby',
          *flags, '--', f'--job_log_dir={job}', *hosts]
  proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                          start_new_session=True)
  launches.append((proc, job))
  return proc


def _fake(tmp_path, name: str) -> bool:
  return (tmp_path / 'job' / 'fake' / name).exists()


def _wait_ready(tmp_path, proc, num_hosts=2) -> None:
  process.wait_until(lambda: all(_fake(tmp_path, f'ready.host{i}') for i in range(num_hosts)) or proc.poll(),
                     'every fake host waiting', timeout=120)
  assert proc.poll() is None, f'the launcher exited {proc.returncode} before its hosts were up'


@pytest.mark.parametrize('signum, one_pipe', [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_a_stop_reaches_every_host_when_the_consoles_reader_died(launches, tmp_path, signum, one_pipe):
  """`pax-autockpt launch ... 2>&1 | tee` after tee died (a terminal's Ctrl-C kills tee too): the launcher's line
  about the stop fails with EPIPE. Every host still gets that very signal, the launcher exits with the hosts' code,
  and, where stderr still works, says once that its console is gone, with no traceback."""
  read, write = os.pipe()
  with open(tmp_path / 'stderr', 'wb') as err:
    proc = _launch(launches, tmp_path, stdout=write, stderr=write if one_pipe else err)
  os.close(write)
  _wait_ready(tmp_path, proc)
  os.close(read)  # tee is gone
  proc.send_signal(signum)
  assert proc.wait(60) == 128 + signum
  name = signal.Signals(signum).name
  assert [_fake(tmp_path, f'got.host{i}.{name}') for i in (0, 1)] == [True, True]
  if not one_pipe:
    said = (tmp_path / 'stderr').read_text()
    assert 'Traceback' not in said and said.count('[launch] the console (stdout) cannot be written') == 1, said


def test_a_host_log_on_a_full_disk_is_said_once_and_the_host_is_drained_to_its_end(launches, tmp_path):
  """Host 1's log is /dev/full (every write: ENOSPC). The launcher says so once on stderr and goes on reading that
  host's pipe: 1 MiB of output (16 times a pipe's 64 KiB) reaches its end, its plugin lines still reach the
  console, and the job exits 0 as its hosts did, instead of host 1 blocking in a write forever."""
  logs = tmp_path / 'job' / 'autockpt'
  logs.mkdir(parents=True)
  (logs / 'host1.log').symlink_to('/dev/full')
  with open(tmp_path / 'stdout', 'wb') as out, open(tmp_path / 'stderr', 'wb') as err:
    proc = _launch(launches, tmp_path, hosts=('--fake_host0=exit:0', '--fake_host1=print:1024,exit:0'), stdout=out,
                   stderr=err)
  assert proc.wait(120) == 0
  said = (tmp_path / 'stderr').read_text()
  assert said.count("[launch] host 1's log") == 1 and 'No space left on device' in said, said
  assert 'Traceback' not in said, said
  assert '[host 1] [autockpt] line 00016320' in (tmp_path / 'stdout').read_text()  # its last plugin line
  assert (logs / 'host0.log').read_text().startswith('[autockpt] fake host 0 started')


def test_restarts_back_off_and_are_recorded_and_a_stop_in_the_backoff_ends_the_job(launches, tmp_path):
  """A host that fails at once, `--max_restarts=3`: the first restart waits 2 s, the second 4 s, each recorded in
  JOB_LOG_DIR/autockpt/launch.jsonl as it begins; a SIGTERM during the second wait starts no host again and the
  launcher exits 143."""
  with open(tmp_path / 'stdout', 'wb') as out:
    proc = _launch(launches, tmp_path, '--max_restarts=3', hosts=('--fake_host0=exit:1',), num_hosts=1, stdout=out)
  log = tmp_path / 'job' / 'autockpt' / 'launch.jsonl'
  process.wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 2 or proc.poll() is not None,
                     'the second restart recorded', timeout=120)
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(60) == 143
  records = [json.loads(line) for line in log.read_text().splitlines()]
  assert [(r['event'], r['restart'], r['backoff_s'], r['reason']) for r in records] == [
      ('restart', 1, 2.0, 'host 0 ended with exit 1'), ('restart', 2, 4.0, 'host 0 ended with exit 1')]
  out = (tmp_path / 'stdout').read_text()
  assert out.count('[host 0] [autockpt] fake host 0 started') == 2, out  # no third start
  assert out.splitlines()[-1] == '[launch] SIGTERM before any host started: nothing to save; exit 143', out


def test_a_forwarded_stop_ends_in_sigkill_after_the_hosts_grace_period(launches, tmp_path):
  """Host 0 ignores SIGTERM (a hang in its exit path): `launch` SIGKILLs it once the hosts' --autockpt_grace_secs
  and a margin have passed since it forwarded the stop, and exits 137 (its SIGKILL, said in one line) instead of
  waiting forever; host 1 had exited 143 as asked."""
  with open(tmp_path / 'stdout', 'wb') as out:
    proc = _launch(launches, tmp_path, hosts=('--fake_host0=ignore', '--autockpt_grace_secs=1'), stdout=out)
  _wait_ready(tmp_path, proc)
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(90) == 137
  said = (tmp_path / 'stdout').read_text()
  assert '[launch] host 0 still running 11 s after the SIGTERM it was forwarded (--autockpt_grace_secs=1 + 10 s): ' \
         'SIGKILL' in said, said
  assert '[launch] host 1 exit code 143' in said and '[launch] host 0 exit code 137' in said, said
  assert _fake(tmp_path, 'got.host0.SIGTERM') and _fake(tmp_path, 'got.host1.SIGTERM')


@dataclasses.dataclass
class _Scripted:
  """A host's process whose `poll` answers from a script (None: running), one answer per call; SIGKILL ends it."""
  answers: list

  def __post_init__(self):
    self.returncode = None
    self.signals = []

  def poll(self):
    if self.returncode is None and self.answers:
      self.returncode = self.answers.pop(0)
    return self.returncode

  def send_signal(self, signum):
    self.signals.append(signum)
    if signum == signal.SIGKILL:
      self.returncode = -signal.SIGKILL


class _FakeHost(launcher._Host):  # pylint: disable=protected-access
  def __init__(self, idx, answers):  # pylint: disable=super-init-not-called  (no pump: no pipe)
    self.idx, self.proc = idx, _Scripted(answers)


@pytest.mark.parametrize('host0, host1, expected', [
    ([None, None, -6], [None, 1], 1),  # host 1 fails, host 0 aborts later on its own: host 1's code
    ([None, None, None], [None, 2], 2),  # host 1's bad input, host 0 SIGKILLed by the launcher: 2, not 137
    ([None, 143], [None, None, 1], 1),  # a clean exit first (a preempted host) is no failure
])
def test_the_jobs_code_is_the_first_failing_hosts_own_never_the_launchers_sigkill(host0, host1, expected):
  """Pure code selection over scripted exits (the real-process case is the next test's)."""
  children = [_FakeHost(0, host0), _FakeHost(1, host1)]
  ended = launcher._watch(children, peer_exit_secs=0.0, clean=(0, 143, 130),  # pylint: disable=protected-access
                          stopped=launcher._Signalled(), grace=300.0)  # pylint: disable=protected-access
  assert launcher.job_code(ended) == expected


@pytest.mark.e2e
def test_bad_input_on_host_1_only_is_the_jobs_exit_not_host_0s_sigkill(launches, tmp_path):
  """Real hosts (paxml's main, forked from the standby): host 1's local tier cannot be written, so host 1 exits 2
  (bad input) at once while host 0 waits for it at jax.distributed's start; the launcher SIGKILLs host 0 after
  --peer_exit_secs and exits 2, host 1's own code, not host 0's 137."""
  job = str(tmp_path / 'job')
  (tmp_path / 'local1').write_text('a file where host 1 wants a directory')
  argv = [sys.executable, '-m', 'pax_autockpt.tools.cli', 'launch', '--num_hosts=2', '--peer_exit_secs=3', '--',
          f'--exp={process.TINY_EXP}', f'--job_log_dir={job}', f'--autockpt_local_dir={tmp_path}/local{{host}}']
  with open(tmp_path / 'launch.log', 'wb') as out:
    proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
  launches.append((proc, job))
  assert proc.wait(300) == 2, (tmp_path / 'launch.log').read_text()[-3000:]
  said = (tmp_path / 'launch.log').read_text()
  assert '[launch] host 1 exit code 2' in said and '[launch] host 0 exit code 137' in said, said[-3000:]


def test_report_shows_the_launchers_restarts_and_their_backoff(tmp_path):
  """A hand-made job: two runs of host 0 and the launcher's record of the restart between them."""
  logs = tmp_path / 'autockpt'
  logs.mkdir()
  runs = [{'t': 100.0, 'host': 0, 'event': 'start', 'num_hosts': 1, 'pid': 1, 'restored_step': None},
          {'t': 110.0, 'host': 0, 'event': 'exit', 'code': 1, 'step': 5},
          {'t': 114.0, 'host': 0, 'event': 'start', 'num_hosts': 1, 'pid': 2, 'restored_step': None},
          {'t': 130.0, 'host': 0, 'event': 'exit', 'code': 0, 'step': 20}]
  (logs / 'events.host0.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in runs))
  (logs / 'launch.jsonl').write_text(json.dumps({
      't': 110.5, 'event': 'restart', 'restart': 1, 'max_restarts': 3, 'reason': 'host 0 ended with exit 1',
      'codes': [1], 'backoff_s': 2.0, 'run_s': 10.4}) + '\n')
  out = io.StringIO()
  assert report.run(str(tmp_path), out=out) == 0
  text = out.getvalue()
  lines = text.splitlines()
  assert lines[lines.index('restarts: 1 (restored: no checkpoint)') + 1] == (
      'launch restarts: 1 of at most 3, backoff 2.0 s in all; the last after host 0 ended with exit 1'), text
  out = io.StringIO()
  assert report.run(str(tmp_path), as_json=True, out=out) == 0
  assert json.loads(out.getvalue())['launch_restarts'] == [
      {'restart': 1, 'max_restarts': 3, 'reason': 'host 0 ended with exit 1', 'backoff_s': 2.0, 't': 110.5}]
