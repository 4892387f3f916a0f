"""The README's "Try it on a CPU in ten minutes", run as written: its fenced bash blocks in one shell, in the
clone, with the environment a user's shell has (no test settings), only the scratch directory moved into
the test's own. What is checked is what the README says happens: SIGTERM -> 143 and a resume from the
agreed step (its train step loaded from the job directory's compilation cache, on by default), kill -9 -> 137
and a restore of the newest local step past the job directory's 400, a finished
job, a report with its plot, every checkpoint verified, and the end identical to an uninterrupted run."""

import os
import re
import subprocess

import pytest

from pax_autockpt.tools import process
from tests.conftest import events_of

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = '## Try it on a CPU in ten minutes'
SCRATCH = 'TRY=/tmp/autockpt-try;'


def tutorial_script() -> str:
  """The section's bash blocks, in order, as one script."""
  with open(os.path.join(ROOT, 'README.md')) as f:
    text = f.read()
  section = text.split(SECTION, 1)[1].split('\n## ', 1)[0]
  blocks = re.findall(r'^```bash\n(.*?)^```$', section, flags=re.S | re.M)
  assert len(blocks) >= 4 and SCRATCH in blocks[0], 'README: the CPU section lost its bash blocks or its TRY= line'
  return '\n'.join(blocks)


def user_env() -> dict[str, str]:
  """This process's environment less what the test suite sets for itself (TensorFlow's gs:// caches off, the
  shared compilation cache,
  pytest's own variables): a user's shell has TensorFlow's defaults."""
  return {k: v for k, v in process.users_env().items()
          if not k.startswith(('GCS_', 'PYTEST_', 'JAX_COMPILATION_CACHE', 'JAX_PERSISTENT_CACHE'))}


def test_the_readme_cpu_tutorial_runs_as_written(tmp_path):
  script = tutorial_script().replace(SCRATCH, f'TRY={tmp_path};')
  out = subprocess.run(['bash', '-c', script], cwd=ROOT, env=user_env(), capture_output=True, text=True,
                       timeout=900, check=False)
  text = out.stdout + out.stderr
  job = str(tmp_path / 'job')
  starts = events_of(job, 'start')
  assert [line for line in text.splitlines() if line.startswith('run ')] == [
      'run 1: exit 143', 'run 2: exit 137', 'run 3: exit 0'], text[-3000:]
  on_demand = events_of(job, 'preemption')[0]['step']
  assert 200 <= on_demand < 400 and starts[1]['restored_step'] == on_demand, starts
  assert starts[2]['restored_from'] == 'local' and 400 < starts[2]['restored_step'] < 800, starts
  assert re.search(r'\[autockpt\] local step [4-7]\d\d restored in ', text), text[-3000:]
  assert 'finished at step 800, exit 0' in text and 'rerunning the same command trains nothing' in text
  restarts = r'^restarts: 2 \(restored: step \d+ from the job directory, local step [4-7]\d\d\)$'
  lost = r'; run 2 was killed at step ~\d+, run 3 restored local step [4-7]\d\d: \d+ lost\)$'
  assert re.search(restarts, text, re.M) and re.search(lost, text, re.M), text[-3000:]
  assert (tmp_path / 'timeline.png').stat().st_size > 0
  assert re.search(r'^step 800: ok \(', text, re.M) and 'DAMAGED' not in text, text[-3000:]
  assert re.search(r'^step 800: identical to .*uninterrupted', text, re.M), text[-3000:]
  assert_run_2_loaded_its_train_step_from_the_cache(tmp_path)


def assert_run_2_loaded_its_train_step_from_the_cache(tmp_path):
  """The compilation cache is on by default, in the job directory: run 1 wrote its train step there, run 2
  (a restore: its state copied into memory XLA owns first) loaded it, and so did the uninterrupted run given
  that cache. A miss would write the same key again."""
  written = r'Writing pjit__wrapped_step_fn to persistent compilation cache with key (\S+)\.'
  run1, run2 = ((tmp_path / f'run{i}.log').read_text() for i in (1, 2))
  keys = re.findall(written, run1)
  assert keys and not set(keys) & set(re.findall(written, run2)), (keys, re.findall(written, run2))
  assert os.listdir(tmp_path / 'job' / 'autockpt' / 'compilation_cache')
  assert 'copied into memory XLA owns' in run2
  # The uninterrupted run, pointed at the job's cache, compiles no train step of its own either.
  assert not re.findall(written, (tmp_path / 'uninterrupted.log').read_text())


def test_a_mistyped_tutorial_command_is_not_waited_for_in_silence(tmp_path):
  """The tutorial's first two lines with a typo in a flag: the run exits 2 at once, and the `status` line after
  it returns within seconds (its --pid is gone), exit 1, naming the process, instead of waiting its timeout."""
  first = [line for line in tutorial_script().splitlines() if line.startswith('python -m pax_autockpt.main')][0]
  wait = [line for line in tutorial_script().splitlines() if '--wait_for_checkpoint 200' in line][0]
  mistyped = first.replace('--job_log_dir=', '--autockpt_grace_sec=30 --job_log_dir=', 1)
  script = (f'source .venv/bin/activate; EXP={process.TINY_EXP}; TRY={tmp_path}\n{mistyped}\n{wait.split("#")[0]}\n'
            'echo "status: exit $?"; wait $!; echo "run: exit $?"')
  out = subprocess.run(['bash', '-c', script], cwd=ROOT, env=user_env(), capture_output=True, text=True, timeout=120,
                       check=False)
  assert out.stdout.splitlines()[-2:] == ['status: exit 1', 'run: exit 2'], out.stdout + out.stderr
  assert re.search(r'status: error: process \d+ is gone \(no run in this job directory', out.stderr), out.stderr
