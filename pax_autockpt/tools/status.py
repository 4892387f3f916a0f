"""`pax-autockpt status JOB_LOG_DIR`: where a job stands, in two lines — the newest committed checkpoint
(what the same command would resume from) and how the last run ended — and a third between them where
the job uses a local tier (host 0's newest local step). Local disk or gs://; reads only
the checkpoint listing and host 0's event log, so it answers while the job runs.
"""

import datetime
import sys

from etils import epath

from pax_autockpt import events as events_lib
from pax_autockpt import layout

_ENDINGS = {0: 'finished', 1: 'failed', 2: 'stopped on bad configuration', 130: 'stopped by Ctrl-C'}


def _when(t: float) -> str:
  return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')


def checkpoint_line(job_log_dir: str) -> str:
  steps = layout.committed_steps(layout.checkpoint_dir(job_log_dir))
  if not steps:
    return 'newest committed checkpoint: none (the same command starts fresh)'
  return (f'newest committed checkpoint: step {steps[-1]}, which the same command resumes from ({len(steps)} '
          f'committed: {layout.newest_steps_text(steps, 5)})')


def run_line(job_log_dir: str) -> str:
  """How host 0's newest run ended, from its `start` and `exit` events."""
  evs = events_lib.read(job_log_dir, 0)
  starts = [i for i, e in enumerate(evs) if e['event'] == 'start']
  if not starts:
    return 'last run: none recorded'
  run = evs[starts[-1]:]
  restored = run[0].get('restored_step')
  tier = ' of the local tier' if run[0].get('restored_from') == 'local' else ''
  began = f'last run (started {_when(run[0]["t"])}, {"fresh" if restored is None else f"from step {restored}{tier}"})'
  ended = next((e for e in reversed(run) if e['event'] == 'exit'), None)
  if ended is None:
    return f'{began}: no exit recorded: still running, or killed without a chance to save (SIGKILL, a crash)'
  code = ended['code']
  how = _ENDINGS.get(code, 'preempted (on-demand checkpoint committed)' if code >= 128 else 'ended')
  preemption = next((e for e in reversed(run) if e['event'] == 'preemption'), None)
  signal = f' by {preemption["signal"]}' if preemption and preemption.get('signal') and code >= 128 else ''
  return f'{began}: {how}{signal} at step {ended.get("step")}, exit {code}, {_when(ended["t"])}'


def local_line(job_log_dir: str) -> str | None:
  """Where the job uses a local tier: host 0's newest local commit, and whether a restart would take it."""
  local = [e for e in events_lib.read(job_log_dir, 0) if e['event'] == 'local_committed']
  if not local:
    return None
  step, newest = local[-1]['step'], layout.newest_committed(layout.checkpoint_dir(job_log_dir))
  newer = (', newer: the same command resumes from it where every host still holds its copy, or a replica does'
           if newest is None or step > newest else '')
  return f'local tier: step {step} committed on host 0 at {_when(local[-1]["t"])}{newer}'


def run(job_log_dir: str) -> int:
  if not epath.Path(job_log_dir).exists():
    print(f'status: error: {job_log_dir} does not exist', file=sys.stderr)
    return 2
  print(checkpoint_line(job_log_dir))
  local = local_line(job_log_dir)
  if local:
    print(local)
  print(run_line(job_log_dir))
  return 0
