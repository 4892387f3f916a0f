"""Every row of docs/bad-input.md: exit 2, one error line naming the problem, the job dir untouched."""

import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = '--exp=experiments.lm_cloud_autockpt.LmCloudSpmdTinyAutockpt'
COMMANDS = {'main': [sys.executable, '-m', 'pax_autockpt.main'],
            'launch': [sys.executable, '-m', 'pax_autockpt.tools.cli', 'launch']}


def _rows():
  rows = []
  with open(os.path.join(ROOT, 'docs', 'bad-input.md')) as f:
    for line in f:
      cells = [c.strip() for c in line.strip().strip('|').split('|')]
      if len(cells) == 6 and cells[0].isdigit():
        unquote = lambda c: c.strip('`')
        rows.append(pytest.param(cells[2], unquote(cells[3]), unquote(cells[4]), unquote(cells[5]),
                                 id=f'{cells[0]}-{cells[1].replace(" ", "_")}'))
  return rows


ROWS = _rows()


def test_the_table_has_at_least_20_rows():
  assert len(ROWS) >= 20


def _tree(path):
  return sorted((os.path.relpath(os.path.join(d, f), path), os.path.getsize(os.path.join(d, f)))
                for d, _, fs in os.walk(path) for f in fs)


@pytest.mark.parametrize('command,args,env,needle', ROWS)
def test_bad_input_exits_2_with_one_line_and_touches_nothing(tmp_path, command, args, env, needle):
  job = tmp_path / 'job'
  sentinel = job / 'checkpoints' / 'checkpoint_00000007' / 'state'
  sentinel.mkdir(parents=True)
  (sentinel / 'x').write_text('committed')
  before = _tree(job)
  argv = [*COMMANDS[command],
          *shlex.split(args.replace('{exp}', TINY).replace('{job}', f'--job_log_dir={job}'))]
  environ = {k: v for k, v in os.environ.items()
             if not re.match(r'(MEGASCALE_|TPU_WORKER_|SLURM_)', k)}
  environ.update(kv.split('=', 1) for kv in shlex.split(env))
  out = subprocess.run(argv, env=environ, cwd=ROOT, capture_output=True, text=True, timeout=180)
  errors = [line for line in out.stderr.splitlines() if line.startswith('error:')]
  assert out.returncode == 2, out.stderr[-3000:]
  assert len(errors) == 1, out.stderr[-3000:]
  assert needle in errors[0]
  assert _tree(job) == before
