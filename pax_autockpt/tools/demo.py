"""`pax-autockpt demo`: train, SIGTERM, on-demand checkpoint, exit, restart, resume; then a summary."""

import os
import shlex
import signal
import sys
import time

from pax_autockpt.shared import events as events_lib
from pax_autockpt.startup import environment
from pax_autockpt.tools import process

_STEP_DONE = r'\[PAX STATUS\]: Step `\d+` completed'


def _say(msg: str) -> None:
  print(f'[demo] {msg}', flush=True)


def _events(job_log_dir: str, kind: str) -> list[dict]:
  return [e for e in events_lib.read(job_log_dir) if e['event'] == kind]


def _row(label: str, value: str) -> str:
  return f'  {label:<28} : {value}'


def summary_lines(*, on_demand: int | None, sigterm_at_s: float, code1: int, exit_secs: float, agreed_secs: float,
                  resumed: int | None, code2: int, final: int | None, job_log_dir: str) -> list[str]:
  """The summary the demo prints before the job's report. The README shows it (`make demo`), and
  tests/test_demo.py fails when these lines and the README's sample part ways."""
  return [
      'pax-autockpt demo summary',
      _row('steps trained before SIGTERM', f'{on_demand}'),
      _row('SIGTERM sent at', f'{sigterm_at_s:.1f} s after start'),
      _row('on-demand checkpoint step', f'{on_demand} (save interval 500, so off-interval)'),
      _row('run 1 exit code', f'{code1} (143 = committed on-demand checkpoint)'),
      _row('SIGTERM -> exit', f'{exit_secs:.2f} s from its arrival, agreed after {agreed_secs:.2f} s (Cloud TPU '
           'allows 300 s)'),
      _row('run 2 resumed from step', f'{resumed}'),
      _row('run 2 exit code', f'{code2}, trained to step {final}'),
      _row('report', f'{environment.command("pax-autockpt")} report {environment.shell_path(job_log_dir)}'),
  ]


def pasteable(argv: list[str]) -> str:
  """A training command as a shell runs it when pasted in the current directory: this interpreter (the venv's
  `python`, which has paxml) and paths in their shortest pasteable form, quoted where needed."""
  words = [environment.command(os.path.basename(argv[0]))]
  for word in argv[1:]:
    flag, eq, value = word.partition('=')
    words.append(f'{flag}={shlex.quote(environment.shell_path(value))}' if eq and os.path.isabs(value)
                 else shlex.quote(word))
  return ' '.join(words)


def result_line(ok: bool) -> str:
  """The demo's last line, after the job's report."""
  return _row('result', 'resumed from the on-demand step' if ok else 'FAILED')


def run(workdir: str | None = None, *, train_secs: float = 3.0) -> int:
  """Returns 0 when the resumed run restored the on-demand step and finished."""
  workdir = os.path.abspath(workdir or os.path.join('demo_run', time.strftime('%Y%m%d-%H%M%S')))
  job_log_dir = os.path.join(workdir, 'job')
  os.makedirs(workdir, exist_ok=True)
  argv = process.ours_argv(process.TINY_EXP, job_log_dir)
  _say(f'job dir {job_log_dir}; logs in {workdir}/run*.log')
  _say(f'run 1: {pasteable(argv)}')

  first = process.Job(argv, os.path.join(workdir, 'run1.log'))
  try:
    first.wait_for_log(_STEP_DONE)
    _say(f'training after {time.time() - first.started:.1f} s of start-up; SIGTERM in {train_secs:.0f} s')
    time.sleep(train_secs)
    sent = first.send(signal.SIGTERM)
    code1 = first.wait(300)
  finally:
    first.kill()
  exit_secs = time.time() - sent
  preemption = _events(job_log_dir, 'preemption')
  on_demand = preemption[-1]['step'] if preemption else None
  agreed_secs = 0.0
  if preemption and preemption[-1].get('signal_at'):  # the process's own record of the arrival
    arrival = preemption[-1]['signal_at']
    exit_secs = _events(job_log_dir, 'exit')[-1]['t'] - arrival
    agreed_secs = preemption[-1]['t'] - arrival
  _say(f'run 1 got SIGTERM {sent - first.started:.1f} s after start; agreed step {on_demand}; '
       f'exit code {code1} after {exit_secs:.2f} s')

  _say('run 2: the same command again')
  second = process.Job(argv, os.path.join(workdir, 'run2.log'))
  try:
    code2 = second.wait(600)
  finally:
    second.kill()
  resumed = _events(job_log_dir, 'start')[-1]['restored_step']
  final = _events(job_log_dir, 'exit')[-1]['step']

  ok = code1 == 143 and on_demand is not None and resumed == on_demand and code2 == 0
  print()
  print('\n'.join(summary_lines(on_demand=on_demand, sigterm_at_s=sent - first.started, code1=code1,
                                exit_secs=exit_secs, agreed_secs=agreed_secs, resumed=resumed, code2=code2, final=final,
                                job_log_dir=job_log_dir)))
  print()
  from pax_autockpt.tools import report  # pylint: disable=g-import-not-at-top  (matplotlib)
  print(report.format_text(report.load(job_log_dir)))
  print(result_line(ok))
  return 0 if ok else 1


if __name__ == '__main__':
  sys.exit(run(sys.argv[1] if len(sys.argv) > 1 else None))
