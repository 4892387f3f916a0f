"""The README's `make demo` sample shows the lines the demo prints (no training: the lines are rendered)."""

import os
import re
import shlex
import subprocess

from pax_autockpt.tools import demo
from pax_autockpt.tools import process

README = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'README.md')
# Where the demo prints the job's report (`pax-autockpt report`'s text, tested in test_report.py), the
# README's sample has this one line.
REPORT_PLACEHOLDER = "[... the job's report: `pax-autockpt report` of the demo's job directory ...]"


def _code_blocks(text: str) -> list[list[str]]:
  """The README's fenced code blocks, each as its lines (fences and indentation as written)."""
  blocks, block = [], None
  for line in text.splitlines():
    if line.lstrip().startswith('```'):
      if block is None:
        block = []
      else:
        blocks.append(block)
        block = None
    elif block is not None:
      block.append(line)
  return blocks


def _readme_sample() -> list[str]:
  with open(README) as f:
    blocks = _code_blocks(f.read())
  samples = [b for b in blocks if b and b[0] == 'pax-autockpt demo summary']
  assert len(samples) == 1, f'README: {len(samples)} code blocks start with "pax-autockpt demo summary"'
  return samples[0]


def _shape(line: str) -> str:
  """A line with its figures and the job directory masked: what must match, whatever a run measured."""
  line = re.sub(r'(?:\S*/)?(\.venv/bin/pax-autockpt report) \S+$', r'\1 JOB_LOG_DIR', line)
  return re.sub(r'\d+(\.\d+)?', 'N', line)


def _rendered(ok: bool = True) -> list[str]:
  summary = demo.summary_lines(on_demand=200, sigterm_at_s=25.1, code1=143, exit_secs=0.41, agreed_secs=0.3,
                               resumed=200,
                               code2=0, final=2000, job_log_dir='/tmp/demo_run/20261124-010203/job')
  return [*summary, '', REPORT_PLACEHOLDER, demo.result_line(ok)]


def test_readme_demo_sample_matches_the_demo_lines():
  sample = _readme_sample()
  rendered = _rendered()
  assert [_shape(line) for line in sample] == [_shape(line) for line in rendered], (
      'README.md: the `make demo` sample no longer shows what pax_autockpt/tools/demo.py prints; '
      'update the sample (or the demo)')


def test_readme_demo_sample_is_one_consistent_run():
  """The sample's figures tell one story: the on-demand step is where run 2 resumed, run 1 exited 143."""
  rows = [line.split(' : ', 1) for line in _readme_sample() if ' : ' in line]
  values = {label.strip(): value for label, value in rows}
  step = values['steps trained before SIGTERM']
  assert values['on-demand checkpoint step'].startswith(f'{step} ')
  assert values['run 2 resumed from step'] == step
  assert values['run 1 exit code'].startswith('143 ')
  assert values['run 2 exit code'].startswith('0, ')
  assert values['result'] == 'resumed from the on-demand step'


def test_a_changed_label_is_caught():
  """The comparison is not vacuous: a relabelled line or a missing one differs in shape."""
  rendered = [_shape(line) for line in _rendered()]
  relabelled = [line.replace('run 2 resumed from step', 'run 2 restored step') for line in _rendered()]
  assert [_shape(line) for line in relabelled] != rendered
  assert [_shape(line) for line in _rendered()[:-1]] != rendered
  assert [_shape(line) for line in _rendered(ok=False)] != rendered


def test_the_command_the_demo_prints_runs_when_pasted(tmp_path, monkeypatch):
  """`[demo] run 1: ...` is a whole command: pasted into a shell in the clone it starts this interpreter (the
  venv's python, with paxml), not `-m ...` (bash: -m: command not found). Run here with --help appended (our
  main answers it before importing paxml)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  monkeypatch.chdir(root)
  line = demo.pasteable(process.ours_argv(process.TINY_EXP, os.path.join(root, 'demo_run', 'x y', 'job')))
  words = shlex.split(line)
  assert not os.path.isabs(words[0]) and words[1:3] == ['-m', 'pax_autockpt.main']
  assert "--job_log_dir='demo_run/x y/job'" in line
  done = subprocess.run(['bash', '-c', f'{line} --help'], capture_output=True, text=True, timeout=60, cwd=root)
  assert done.returncode == 0 and '--autockpt_grace_secs' in done.stdout, done.stderr[-2000:]
