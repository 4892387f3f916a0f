"""`pax-autockpt status JOB_LOG_DIR`: where a job stands, in two lines — the newest committed checkpoint
(what the same command would resume from) and how the last run ended, or that it is running and at which step
(its process alive on this machine, or host 0 logging within two progress intervals for a run elsewhere) — and
a third between them where the job uses a local tier (host 0's newest local step; and another while its local
saves are failing). Local disk or gs://; reads only the checkpoint listing and host 0's event log (and, for a
run of this machine, /proc), so it answers while the job runs.

`--wait_for_checkpoint STEP` first waits until a checkpoint of STEP or later is committed (a script's
"let it train a while, then preempt it"): exit 1 with one line when the job's run ends first, or on timeout.
Never in silence: with `--pid` (the run's process, `$!` in a shell) it returns as soon as that process is gone,
naming how it ended; without, it says every 30 s what it waits for and what it sees. `--wait_for_local_step
STEP` (with `--local_dir`) then waits the same way for host 0's local directory to hold a committed local step
of STEP or later (a script's "kill it once the local tier is past the job directory").
"""

import datetime
import os
import socket
import sys
import time

from etils import epath

from pax_autockpt import layout
from pax_autockpt.hook import progress
from pax_autockpt.shared import events as events_lib
from pax_autockpt.startup import startup_times

DEFAULT_WAIT_SECS = 300.0  # --timeout_secs: the tutorial's checkpoints come within a minute
PROGRESS_SECS = 30.0  # without --pid, a line this often while waiting
LIVE_SECS = 2 * progress.PROGRESS_SECS  # host 0 logs `progress` this often at least while it trains
START_SLACK_SECS = 2.0  # /proc's start time against the event's process_start_t (a standby's fork: ms apart)
_STEP_EVENTS = ('first_step', 'progress', 'save_started', 'save_committed', 'local_committed', 'preemption')
_ENDINGS = {0: 'finished', 1: 'failed', 2: 'stopped on bad configuration', 130: 'stopped by Ctrl-C'}


def _when(t: float) -> str:
  return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')


def checkpoint_line(steps: list[int], finished: bool = False) -> str:
  """The job directory's committed `steps` (oldest first): the newest, and whether the same command resumes
  from it."""
  if not steps:
    return 'newest committed checkpoint: none (the same command starts fresh)'
  resumes = '' if finished else ', which the same command resumes from'
  return (f'newest committed checkpoint: step {steps[-1]}{resumes} ({len(steps)} committed: '
          f'{layout.newest_steps_text(steps, 5)})')


def last_run(evs: list[dict]) -> list[dict]:
  """Host 0's newest run in its events `evs`: its `start` event and every later one (empty: no run recorded)."""
  starts = [i for i, e in enumerate(evs) if e['event'] == 'start']
  return evs[starts[-1]:] if starts else []


def finished(run: list[dict]) -> bool:
  """The run trained to its last step: exit 0 without a preemption (an exit code configured to 0 for
  preemptions is not a finished job)."""
  kinds = [e['event'] for e in run]
  return bool(run) and 'preemption' not in kinds and any(e['event'] == 'exit' and e['code'] == 0 for e in run)


def run_line(evs: list[dict], now: float | None = None) -> str:
  """How host 0's newest run ended, from its `start` and `exit` events; without an exit, whether it runs."""
  run = last_run(evs)
  if not run:
    return 'last run: none recorded'
  restored = run[0].get('restored_step')
  tier = ' of the local tier' if run[0].get('restored_from') == events_lib.LOCAL else ''
  began = f'last run (started {_when(run[0]["t"])}, {"fresh" if restored is None else f"from step {restored}{tier}"})'
  ended = next((e for e in reversed(run) if e['event'] == 'exit'), None)
  if ended is None:
    return f'{began}: {liveness(run, time.time() if now is None else now)}'
  code = ended['code']
  how = _ENDINGS.get(code, 'preempted (on-demand checkpoint committed)' if code >= 128 else 'ended')
  preemption = next((e for e in reversed(run) if e['event'] == 'preemption'), None)
  signal = f' by {preemption["signal"]}' if preemption and preemption.get('signal') and code >= 128 else ''
  done = '; rerunning the same command trains nothing' if finished(run) else ''
  return f'{began}: {how}{signal} at step {ended.get("step")}, exit {code}, {_when(ended["t"])}{done}'


def liveness(run: list[dict], now: float) -> str:
  """A run without an exit event: running (its process is alive on this machine, or host 0 logged within two
  progress intervals, for a run elsewhere) with its newest logged step; else killed without a chance to save."""
  start, newest = run[0], _newest_step(run)
  step = f'step {newest["step"]}, logged {_ago(now - newest["t"])} ago' if newest else 'no step logged yet'
  here = alive_here(start)
  if here:
    return f'running (process {start["pid"]} on this machine): {step}'
  quiet = now - run[-1]['t']
  if here is None and quiet <= LIVE_SECS:
    return (f'running elsewhere (no process {start.get("pid")} here; host 0 logged {_ago(quiet)} ago, and logs at '
            f'least every {progress.PROGRESS_SECS:g} s while it trains): {step}')
  gone = (f'process {start.get("pid")} is gone from this machine' if here is False else
          f'host 0 has logged nothing for {_ago(quiet)} and its process is not on this machine')
  if here is None and newest is None:
    return f'no exit recorded and no step logged yet ({gone}): still starting elsewhere, or killed'
  return f'killed without a chance to save (SIGKILL, a crash): no exit recorded, {gone}; the last {step}'


def alive_here(start: dict) -> bool | None:
  """Whether the process of a `start` event runs on this machine: True, False (the event names this machine and
  the process is gone, or another process holds its pid now), or None (the run was on another machine, or the
  event does not say which and no live process matches). The process's start time (/proc) must be the event's
  `process_start_t` (else: before the event's time): a pid reused by a later process is not the run's."""
  pid, ours = start.get('pid'), start.get('hostname') in (None, socket.gethostname())
  if not ours or pid is None or not running(pid):
    return False if ours and 'hostname' in start else None
  began = startup_times.proc_start_t(pid)
  expected = start.get('process_start_t')
  if began is None:  # no /proc: the pid is alive, nothing tells whether it is the run's
    same = True
  else:
    same = abs(began - expected) <= START_SLACK_SECS if expected is not None else began <= start['t']
  return True if same else (False if 'hostname' in start else None)


def _newest_step(run: list[dict]) -> dict | None:
  """The run's newest event that names the step its loop stood at."""
  return next((e for e in reversed(run) if e['event'] in _STEP_EVENTS and e.get('step') is not None), None)


def _ago(secs: float) -> str:
  secs = max(0.0, secs)
  if secs < 120:
    return f'{secs:.0f} s'
  return f'{secs / 60:.0f} min' if secs < 7200 else f'{secs / 3600:.1f} h'


def local_line(evs: list[dict], newest: int | None, local_dir: str | None = None,
               job_log_dir: str | None = None) -> str | None:
  """Where the job uses a local tier: host 0's newest local commit, and whether a restart would take it over
  the job directory's `newest` committed step. Read from host 0's local directory where `local_dir` (the run's
  --autockpt_local_dir) names one on this machine, judged by the restore's own decision (`_restore_takes`);
  else from the event log, which records a running job's commits at most once a minute (then the line says
  how old its figure is) and nothing of a step's lineage: it promises no resume."""
  local = [e for e in evs if e['event'] == 'local_committed']
  held = layout.local_committed_steps(layout.local_dir(local_dir, 0)) if local_dir else []
  if not local and not held:
    return None
  step = held[-1] if held else local[-1]['step']
  if held:
    newer = _restore_takes(job_log_dir, local_dir, step) if newest is None or step > newest else ''
    return f'local tier: step {step} committed on host 0 (in {layout.local_dir(local_dir, 0)}){newer}'
  newer = (', newer than the job directory\'s newest checkpoint (--local_dir=TEMPLATE says whether a restart '
           'takes it)' if newest is None or step > newest else '')
  age = '' if finished(last_run(evs)) or _ended(evs) else (
      f' ({time.time() - local[-1]["t"]:.0f} s ago: the event log records at most one local commit a minute, a '
      'newer one may exist; --local_dir reads the directory)')
  return f'local tier: step {step} committed on host 0 at {_when(local[-1]["t"])}{age}{newer}'


def _restore_takes(job_log_dir: str | None, local_dir: str, step: int) -> str:
  """Whether a restart takes host 0's local `step`, asked of the restore's own decision
  (pax_autockpt.local.restoring.verdict: lineage, identity, digests, every host's copy) over the hosts' local
  directories on this machine (host 0's alone where the others are elsewhere)."""
  from pax_autockpt.local import format as local_format  # pylint: disable=g-import-not-at-top  (jax: only here)
  from pax_autockpt.local import restoring  # pylint: disable=g-import-not-at-top
  try:
    hosts = local_format.read_index(layout.local_step_dir(layout.local_dir(local_dir, 0), step)).get('hosts')
  except (local_format.LocalDamage, OSError) as e:
    return f', not offered to a restart: damaged ({e})'
  hosts = hosts if isinstance(hosts, int) and hosts > 0 else 1
  folders = {h: layout.local_dir(local_dir, h) for h in range(hosts)}
  here = {h: f for h, f in folders.items() if h == 0 or ('{host}' in local_dir and f.exists())}
  why = restoring.verdict(job_log_dir, here, hosts, step)
  if why is not None:
    return f', not offered to a restart: {why}'
  if len(here) == hosts:
    return ', newer: the same command resumes from it'
  return ', newer: the same command resumes from it where every host still holds its copy, or a replica does'


def _ended(evs: list[dict]) -> bool:
  return any(e['event'] == 'exit' for e in last_run(evs))


def failing_line(evs: list[dict]) -> str | None:
  """Where host 0's newest run has local saves failing since its newest local commit: how many, since when,
  and the newest reason (the tier has stopped: a restart loses more than the local interval)."""
  run = last_run(evs)
  commits = [i for i, e in enumerate(run) if e['event'] == 'local_committed']
  failed = [e for e in run[commits[-1] + 1 if commits else 0:] if e['event'] == 'local_save_failed']
  if not failed:
    return None
  count, newest = sum(e.get('failures', 1) for e in failed), failed[-1]
  return (f'local tier: saves failing on host 0: {count} not committed from {_when(failed[0]["t"])} to '
          f'{_when(newest["t"])}, the newest (step {newest.get("step")}): {newest.get("error")}')


def wait_for_checkpoint(job_log_dir: str, step: int, timeout_secs: float, poll_secs: float = 0.5,
                        pid: int | None = None) -> str | None:
  """Returns once a checkpoint of `step` or later is committed (None), or why it will not be: the run ended,
  process `pid` is gone, or the timeout."""
  return _wait(job_log_dir, step, 'checkpoint of step', lambda: _newest_checkpoint(job_log_dir), timeout_secs,
               poll_secs, pid)


def wait_for_local_step(job_log_dir: str, local_dir: str, step: int, timeout_secs: float, poll_secs: float = 0.5,
                        pid: int | None = None) -> str | None:
  """Returns once host 0's local directory (`local_dir`, the run's --autockpt_local_dir) holds a committed local
  step of `step` or later (None), or why it will not: the directory is the truth a restart reads, the event log
  records local commits at most once a minute."""
  def newest() -> int | None:
    held = layout.local_committed_steps(layout.local_dir(local_dir, 0))
    return held[-1] if held else None
  return _wait(job_log_dir, step, 'local step', newest, timeout_secs, poll_secs, pid)


def _wait(job_log_dir: str, step: int, noun: str, newest_step, timeout_secs: float, poll_secs: float,
          pid: int | None) -> str | None:
  """Polls `newest_step()` until it reaches `step`; never in silence (see the module's docstring)."""
  began = said = time.time()
  while True:
    newest = newest_step()
    if newest is not None and newest >= step:
      return None
    evs = events_lib.read(job_log_dir, 0) if epath.Path(job_log_dir).exists() else []
    ended = [e for e in last_run(evs) if e['event'] == 'exit' and e['t'] >= began]
    if ended:
      return (f'the run ended (exit {ended[-1]["code"]} at step {ended[-1].get("step")}) before a {noun} '
              f'{step} or later was committed')
    if pid is not None and not running(pid):
      return f'process {pid} is gone ({_ending(evs)}) and no {noun} {step} or later was committed'
    if time.time() - began > timeout_secs:
      return f'no {noun} {step} or later committed within {timeout_secs:g} s (--timeout_secs)'
    if pid is None and time.time() - said >= PROGRESS_SECS:
      said = time.time()
      print(f'status: waiting {said - began:.0f} s for a {noun} {step} or later: {_seen(newest, evs, noun)}',
            file=sys.stderr, flush=True)
    time.sleep(poll_secs)


def _newest_checkpoint(job_log_dir: str) -> int | None:
  """The job directory's newest committed checkpoint (None: none, or no job directory yet)."""
  if not epath.Path(job_log_dir).exists():
    return None
  return layout.newest_committed(layout.checkpoint_dir(job_log_dir))


def running(pid: int) -> bool:
  """Whether process `pid` still runs (a zombie, exited but not yet waited for by its shell, does not)."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rpartition(')')[2].split()[0] not in ('Z', 'X')
  except FileNotFoundError:
    return False
  except OSError:  # no /proc: whether the pid exists at all
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return False
    return True


def _ending(evs: list[dict]) -> str:
  """How the newest run in the event log ended, in a few words."""
  run = last_run(evs)
  exits = [e for e in run if e['event'] == 'exit']
  if exits:
    return f'its newest run exited {exits[-1]["code"]} at step {exits[-1].get("step")}'
  if run:
    return 'its newest run has no exit event: killed (a SIGKILL, an OOM) or still ending'
  return 'no run in this job directory: it stopped before writing one; `wait $!` gives its exit code (bad input: 2)'


def _seen(newest: int | None, evs: list[dict], noun: str = 'checkpoint of step') -> str:
  if not evs and newest is None:
    return 'no run has started in this job directory yet'
  return f'newest committed {noun.removesuffix(" of step")} {layout.step_text(newest)}'


def run(job_log_dir: str, wait_for: int | None = None, timeout_secs: float = DEFAULT_WAIT_SECS,
        pid: int | None = None, local_dir: str | None = None, wait_for_local: int | None = None) -> int:
  if wait_for_local is not None and not local_dir:
    print('status: error: --wait_for_local_step reads host 0\'s local directory: add --local_dir=TEMPLATE (the '
          "run's --autockpt_local_dir)", file=sys.stderr)
    return 2
  waits = ((wait_for, lambda: wait_for_checkpoint(job_log_dir, wait_for, timeout_secs, pid=pid)),
           (wait_for_local, lambda: wait_for_local_step(job_log_dir, local_dir, wait_for_local, timeout_secs, pid=pid)))
  for step, wait in waits:
    why = wait() if step is not None else None
    if why:
      print(f'status: error: {why}', file=sys.stderr)
      return 1
  if not epath.Path(job_log_dir).exists():
    print(f'status: error: {job_log_dir} does not exist', file=sys.stderr)
    return 2
  # Host 0's events and the job directory's listing, each read once (on gs:// a week-long log is many objects).
  evs, steps = events_lib.read(job_log_dir, 0), layout.committed_steps(layout.checkpoint_dir(job_log_dir))
  print(checkpoint_line(steps, finished(last_run(evs))))
  local = local_line(evs, steps[-1] if steps else None, local_dir, job_log_dir)
  for line in (local, failing_line(evs)):
    if line:
      print(line)
  print(run_line(evs))
  return 0
