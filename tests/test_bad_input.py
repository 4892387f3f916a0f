"""Every row of docs/bad-input.md: exit 2, one error line naming the problem, the job dir untouched, and
paxml not even imported where the row says "before paxml"."""

import os
import re
import shlex
import subprocess
import sys

import pytest

from tests import forkserver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = '--exp=experiments.lm_cloud_autockpt.LmCloudSpmdTinyAutockpt'
COMMANDS = {'main': [sys.executable, '-m', 'pax_autockpt.main'],
            'launch': [sys.executable, '-m', 'pax_autockpt.tools.cli', 'launch']}


def _rows():
  rows = []
  with open(os.path.join(ROOT, 'docs', 'bad-input.md')) as f:
    for line in f:
      cells = [c.strip() for c in line.strip().strip('|').split('|')]
      if len(cells) == 7 and cells[0].isdigit():
        unquote = lambda c: c.strip('`')
        before_paxml = cells[5] == 'yes'
        rows.append(pytest.param(cells[2], unquote(cells[3]), unquote(cells[4]), before_paxml, unquote(cells[6]),
                                 id=f'{cells[0]}-{cells[1].replace(" ", "_")}'))
  return rows


ROWS = _rows()


def test_the_table_has_at_least_40_rows():
  assert len(ROWS) >= 40


def _environ(env: str = '') -> dict[str, str]:
  """This process's environment without a TPU VM's, Slurm's or multislice wiring, plus `env`."""
  environ = {k: v for k, v in os.environ.items() if not re.match(r'(MEGASCALE_|TPU_WORKER_|SLURM_)', k)}
  environ.update(kv.split('=', 1) for kv in shlex.split(env))
  return environ


def _heavy_imports(importtime_stderr: str) -> list[str]:
  """The modules of paxml, jax and TensorFlow that `python -X importtime` reports importing."""
  names = [line.rsplit('|', 1)[1].strip() for line in importtime_stderr.splitlines()
           if line.startswith('import time:')]
  return [n for n in names if n.split('.')[0] in ('paxml', 'jax', 'tensorflow')]


def _run(argv, environ, tmp_path, forked: bool) -> subprocess.CompletedProcess:
  """`argv` (`python -m MODULE ARGS`) in a new interpreter, or forked from one that has paxml loaded."""
  if not forked:
    return subprocess.run(argv, env=environ, cwd=ROOT, capture_output=True, text=True, timeout=180)
  assert argv[:2] == [sys.executable, '-m'], argv
  outputs = str(tmp_path / 'stdout'), str(tmp_path / 'stderr')
  code = forkserver.server_for(environ).run(argv[2], argv[3:], env=environ, cwd=ROOT, stdout=outputs[0],
                                           stderr=outputs[1])
  return subprocess.CompletedProcess(argv, code, *(open(path).read() for path in outputs))


def _tree(path):
  return sorted((os.path.relpath(os.path.join(d, f), path), os.path.getsize(os.path.join(d, f)))
                for d, _, fs in os.walk(path) for f in fs)


@pytest.mark.parametrize('command,args,env,before_paxml,needle', ROWS)
def test_bad_input_exits_2_with_one_line_and_touches_nothing(tmp_path, command, args, env, before_paxml,
                                                             needle):
  job = tmp_path / 'job'
  sentinel = job / 'checkpoints' / 'checkpoint_00000007' / 'state'
  sentinel.mkdir(parents=True)
  (sentinel / 'x').write_text('committed')
  before = _tree(job)
  new_job = tmp_path / 'new-job'
  args = args.replace('{exp}', TINY).replace('{job}', f'--job_log_dir={job}')
  argv = [*COMMANDS[command], *shlex.split(args.replace('{newjob}', f'--job_log_dir={new_job}'))]
  if before_paxml:
    argv[1:1] = ['-X', 'importtime']
  out = _run(argv, _environ(env), tmp_path, forked=not before_paxml)
  lines = [line for line in out.stderr.splitlines() if not line.startswith('import time:')]
  errors = [line for line in lines if line.startswith('error:')]
  shown = '\n'.join(lines)[-3000:]
  assert out.returncode == 2, shown
  assert len(errors) == 1, shown
  assert needle in errors[0]
  assert _tree(job) == before and not new_job.exists()
  assert 'Registered experiment' not in out.stderr, 'paxml registry lines before the error'
  if before_paxml:
    assert not _heavy_imports(out.stderr), _heavy_imports(out.stderr)[:5]
