"""examples/slurm/pax_autockpt.sbatch: requeue on 143 only, run for real by bash with fake `srun` and
`scontrol` on PATH (the fake srun stands in for the tasks: it exits 143 when it gets SIGTERM)."""

import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from pax_autockpt.hosts import hosts

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / 'examples' / 'slurm' / 'pax_autockpt.sbatch'

_FAKE_SRUN = '''#!/bin/bash
echo "srun $*" >> "$FAKE_LOG"
case "$FAKE_SRUN" in
  exit:*) exit "${FAKE_SRUN#exit:}" ;;
  term)
    trap 'echo "tasks got TERM" >> "$FAKE_LOG"; exit 143' TERM
    echo "ready $$" >> "$FAKE_LOG"
    while :; do sleep 0.05; done ;;
esac
'''
_FAKE_SCONTROL = '''#!/bin/bash
echo "scontrol $*" >> "$FAKE_LOG"
'''


@pytest.fixture
def sbatch(tmp_path):
  """sbatch(srun_behaviour, **env) -> the running script; its log lines via .lines()."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  for name, text in (('srun', _FAKE_SRUN), ('scontrol', _FAKE_SCONTROL)):
    (bin_dir / name).write_text(text)
    (bin_dir / name).chmod(0o755)
  log = tmp_path / 'fake.log'
  log.touch()
  started = []

  def run(behaviour, **env):
    full = dict(os.environ, PATH=f'{bin_dir}:{os.environ["PATH"]}', FAKE_LOG=str(log), FAKE_SRUN=behaviour,
                SLURM_JOB_ID='4242', SLURM_JOB_NAME='pax-autockpt', HOME=str(tmp_path), **env)
    proc = subprocess.Popen(['bash', str(SCRIPT), '--autockpt_keep_latest=3'], env=full, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    proc.lines = lambda: log.read_text().splitlines()
    started.append(proc)
    return proc

  yield run
  for proc in started:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()


def _directives():
  return dict(re.findall(r'^#SBATCH --([\w-]+)(?:=(\S+))?', SCRIPT.read_text(), re.M))


def _tasks_pid(proc, timeout=10):
  deadline = time.time() + timeout
  while time.time() < deadline:
    ready = [line for line in proc.lines() if line.startswith('ready ')]
    if ready:
      return int(ready[0].split()[1])
    time.sleep(0.02)
  raise TimeoutError(f'the fake srun did not start: {proc.lines()}')


def test_directives_signal_before_the_time_limit_and_allow_requeue():
  d = _directives()
  sig = re.fullmatch(r'(?:(B|R):)?TERM@(\d+)', d['signal'])
  assert sig and sig.group(1) is None, 'SIGTERM must reach the tasks, not only the batch shell'
  assert int(sig.group(2)) >= 120  # time for the on-demand save before Slurm's SIGKILL
  assert 'requeue' in d and d['ntasks-per-node'] == '1'


@pytest.mark.parametrize('code', [143])
def test_exit_143_requeues_the_job(sbatch, code):
  proc = sbatch(f'exit:{code}')
  assert proc.wait(30) == code
  lines = proc.lines()
  assert lines.count('scontrol requeue 4242') == 1, lines
  srun, = [line for line in lines if line.startswith('srun ')]
  assert '--kill-on-bad-exit=0' in srun and ' -m pax_autockpt.main ' in srun
  assert f'--autockpt_exit_code={code}' in srun and srun.endswith('--autockpt_keep_latest=3')
  grace = re.fullmatch(r'(?:(B|R):)?TERM@(\d+)', _directives()['signal']).group(2)
  assert f'--autockpt_grace_secs={grace}' in srun  # the exit path plans inside Slurm's warning time


@pytest.mark.parametrize('code', [0, 1, 2, 130, 134, 137])
def test_any_other_exit_is_final(sbatch, code):
  proc = sbatch(f'exit:{code}')
  assert proc.wait(30) == code
  assert not any(line.startswith('scontrol') for line in proc.lines())
  assert 'not requeued' in proc.stderr.read()


def test_sigterm_to_the_tasks_before_the_time_limit_requeues(sbatch):
  """What --signal=TERM@300 does: the tasks get SIGTERM, this shell does not; they save and exit 143."""
  proc = sbatch('term')
  os.kill(_tasks_pid(proc), signal.SIGTERM)
  assert proc.wait(30) == 143
  assert 'tasks got TERM' in proc.lines() and proc.lines().count('scontrol requeue 4242') == 1


def test_scancel_saves_but_never_requeues(sbatch):
  """scancel: Slurm sends SIGTERM to this shell and the tasks. The shell waits for them (their exit, not
  its own trapped 143) and does not requeue: a cancelled job stays cancelled."""
  proc = sbatch('term')
  tasks = _tasks_pid(proc)
  os.kill(proc.pid, signal.SIGTERM)
  time.sleep(0.3)
  assert proc.poll() is None, 'the shell must wait for the tasks to save'
  os.kill(tasks, signal.SIGTERM)
  assert proc.wait(30) == 143
  assert not any(line.startswith('scontrol') for line in proc.lines())
  assert 'cancelled=1' in proc.stderr.read()


def test_requeues_stop_at_the_maximum(sbatch):
  proc = sbatch('exit:143', SLURM_RESTART_COUNT='100')
  assert proc.wait(30) == 143
  assert not any(line.startswith('scontrol') for line in proc.lines())
  assert 'MAX_REQUEUES=100): not requeued' in proc.stderr.read()


def test_every_task_resolves_to_its_own_host_on_the_first_node():
  """The tasks' Slurm environment, for the script's node count, through the wiring code."""
  nodes = int(_directives()['nodes'])
  seen = []
  for task in range(nodes):
    env = {'SLURM_PROCID': str(task), 'SLURM_NTASKS': str(nodes), 'SLURM_JOB_NODELIST': f'gpu[07-{6 + nodes:02d}]'}
    wiring = hosts.resolve(env=env)
    assert wiring == hosts.Wiring(task, nodes, f'gpu07:{hosts.DEFAULT_PORT}', 'slurm')
    seen.append(wiring.host_idx)
  assert seen == list(range(nodes))
