"""`make soak`: chaos cycles of start -> SIGTERM or SIGKILL at a random moment -> restart.

Moments include the middle of a save and the restore. Each cycle checks, from the event log and the
checkpoint directory: a SIGTERM lost 0 steps (the next run restores the agreed step), a SIGKILL lost
at most the save interval (the next run restores the newest committed checkpoint), no incomplete
checkpoint is ever restored, and leftovers never block a later save. Prints the counts.

With `--gcs` the job lives on a local GCS server (rigs.local_gcs) and each cycle may also
get a storage fault on the checkpoints' objects — a window of 503s, a latency spike, or writes failing
at random (uploads cut mid-way) — at a random moment. Then it also counts what restore safety promises:
committed checkpoints lost 0, uncommitted ones restored 0, checkpoints set aside without damage 0 (no
damage is injected), hosts hung 0.
"""

import argparse
import contextlib
import dataclasses
import json
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time

from pax_autockpt import layout
from pax_autockpt.shared import events as events_lib
from pax_autockpt.tools import process

_STEP_DONE = r'\[PAX STATUS\]: Step `\d+` completed'
_RESTORING = r'\[PAX STATUS\]: Starting checkpoint load'
_MOMENTS = ('training', 'save', 'restore')
# Storage faults on the checkpoints' objects only: the event log is what the soak measures with.
_FAULTS = {
    'none': {},
    '503 window': dict(fail_fraction=1.0, status=503, path_contains='/checkpoints/'),
    'latency spike': dict(latency_ms=400.0),
    'writes failing': dict(fail_fraction=0.3, writes_only=True, status=503, path_contains='/checkpoints/'),
}


@dataclasses.dataclass
class Tally:
  cycles: int = 0
  sigterm: int = 0
  sigkill: int = 0
  moments: dict = dataclasses.field(default_factory=lambda: {m: 0 for m in _MOMENTS})
  steps_lost: int = 0
  max_lost: int = 0
  failures: list = dataclasses.field(default_factory=list)
  final_step: int | None = None
  faults: dict = dataclasses.field(default_factory=dict)  # --gcs: storage faults injected, by kind
  committed_lost: int = 0
  uncommitted_restored: int = 0
  set_aside_without_damage: int = 0
  hosts_hung: int = 0
  sigterm_steps_lost: int = 0


def _runs(job_dir, num_hosts):
  """Per host, the events of each process start (a run), oldest first."""
  out = []
  for host in range(num_hosts):
    runs, current = [], None
    for e in events_lib.read(job_dir, host):
      if e['event'] == 'start':
        current = [e]
        runs.append(current)
      elif current is not None:
        current.append(e)
    out.append(runs)
  return out


def _committed(job_dir):
  """What is committed on storage now: a restart must restore the newest of these."""
  return set(layout.committed_steps(layout.checkpoint_dir(job_dir)))


def _count(job_dir, kind):
  return sum(e['event'] == kind for e in events_lib.read(job_dir, 0))


def _start(argv, num_hosts, log):
  if num_hosts == 1:
    return process.Job(argv, log, env=process.users_env())
  return process.Job([sys.executable, '-m', 'pax_autockpt.tools.cli', 'launch', f'--num_hosts={num_hosts}',
                      '--', *argv[3:]], log, env=process.users_env())


def _wait(cond, job, timeout=300):
  deadline = time.time() + timeout
  while not cond():
    if time.time() > deadline or job.proc.poll() is not None:
      return False
    time.sleep(0.005)
  return True


def _hit(job, job_dir, moment, rng, starts):
  """Waits for the moment; False if the run ended (or never got there) first."""
  host0_log = os.fspath(layout.host_log_path(job_dir, 0))
  seen = os.path.getsize(host0_log) if os.path.exists(host0_log) else 0  # earlier cycles' lines

  def launched_log():
    if not os.path.exists(host0_log):
      return ''
    with open(host0_log, errors='replace') as f:
      f.seek(seen)
      return f.read()

  log = (lambda: job.log()) if job.argv[2] == 'pax_autockpt.main' else launched_log
  if moment == 'restore':
    ok = _wait(lambda: re.search(_RESTORING, log()) is not None, job)
    time.sleep(rng.uniform(0.0, 0.5))
    return ok and job.proc.poll() is None
  if not _wait(lambda: _count(job_dir, 'start') > starts, job):
    return False
  if moment == 'training':
    time.sleep(rng.uniform(1.0, 8.0))
    return job.proc.poll() is None
  saves = _count(job_dir, 'save_started')  # 'save': right after one started, its commit in flight
  return _wait(lambda: _count(job_dir, 'save_started') > saves, job, timeout=60)


def _signal(job, num_hosts, signum):
  """SIGTERM as a maintenance event (to the process or the launcher); SIGKILL to every process."""
  if signum == signal.SIGTERM:
    job.send(signal.SIGTERM)
    return
  # The launcher's hosts are its children (their start events may not be written yet).
  for pid in (_children(job.pid) if num_hosts > 1 else []):
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  job.kill()


def _children(pid):
  """Child pids from /proc (Linux)."""
  out = []
  for task in os.listdir(f'/proc/{pid}/task') if os.path.isdir(f'/proc/{pid}/task') else []:
    try:
      with open(f'/proc/{pid}/task/{task}/children') as f:
        out += [int(c) for c in f.read().split()]
    except OSError:
      pass
  return out


def _check(tally, cycle, prev, run, committed_before, interval, faulted=False):
  """A restarted run restored the newest committed step, and lost at most what the signal allows."""
  restored = run[0]['restored_step']
  newest = max(committed_before) if committed_before else None
  if restored != newest:
    tally.failures.append(f'cycle {cycle}: restored {restored}, newest committed was {newest}')
  if restored is not None and restored not in committed_before:
    tally.uncommitted_restored += 1
  reached = max([e['step'] for e in prev if isinstance(e.get('step'), int)] + [0])
  lost = max(0, reached - (restored or 0))
  clean = any(e['event'] == 'exit' and e['code'] == 143 for e in prev)
  if clean and lost:
    tally.failures.append(f'cycle {cycle}: a SIGTERM exit lost {lost} steps')
    tally.sigterm_steps_lost += lost
  if lost > interval and not faulted:  # failed saves under a storage fault may lose more
    tally.failures.append(f'cycle {cycle}: lost {lost} steps > save interval {interval}')
  tally.steps_lost += lost
  tally.max_lost = max(tally.max_lost, lost)
  started = [e['step'] for e in run if e['event'] == 'save_started']
  done = {e['step'] for e in run if e['event'] == 'save_committed'}
  if [s for s in started[:-1] if s not in done] and not faulted:
    tally.failures.append(f'cycle {cycle}: a save was blocked (started, never committed)')


def _safety(tally, cycle, job_dir, num_hosts, committed_before, events_before):
  """What no cycle may do: lose a committed checkpoint (one neither deleted by a policy nor set aside),
  or set one aside (no damage is injected here)."""
  new = [e for host in range(num_hosts) for e in events_lib.read(job_dir, host)[events_before[host]:]]
  deleted = {e['step'] for e in new if e['event'] in ('deleted', 'restore_skipped')}
  aside = {e['step'] for e in new if e['event'] == 'restore_skipped'}
  lost = committed_before - _committed(job_dir) - deleted
  if lost:
    tally.committed_lost += len(lost)
    tally.failures.append(f'cycle {cycle}: committed checkpoints {sorted(lost)} are gone')
  if aside:
    tally.set_aside_without_damage += len(aside)
    tally.failures.append(f'cycle {cycle}: {sorted(aside)} set aside, but no damage was injected')


class _FaultWindow:
  """One storage fault at a random moment of a cycle, for a random time, then normal service."""

  def __init__(self, gcs, rng):
    self.kind = rng.choice(tuple(_FAULTS))
    self._gcs, self._start, self._length = gcs, rng.uniform(0.0, 25.0), rng.uniform(5.0, 40.0)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    if _FAULTS[self.kind]:
      self._thread.start()

  def _run(self):
    if not self._stop.wait(self._start):
      self._gcs.set_faults(**_FAULTS[self.kind])
      self._stop.wait(self._length)
    self._gcs.set_faults()

  def end(self):
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join()


def run(cycles, num_hosts, workdir, seed, exp, target_step, interval=500, gcs=None):
  rng = random.Random(seed)
  job_dir = gcs.url('soak') if gcs is not None else os.path.join(workdir, 'job')
  argv = process.ours_argv(exp, job_dir)
  tally = Tally()
  for cycle in range(cycles + 1):
    final = cycle == cycles
    committed_before, starts = _committed(job_dir), _count(job_dir, 'start')
    events_before = [len(events_lib.read(job_dir, host)) for host in range(num_hosts)]
    job = _start(argv, num_hosts, os.path.join(workdir, f'cycle{cycle}.log'))
    fault = _FaultWindow(gcs, rng) if gcs is not None and not final else None
    signum = moment = None
    if not final:
      signum, moment = rng.choice((signal.SIGTERM, signal.SIGKILL)), rng.choice(_MOMENTS)
      if _hit(job, job_dir, moment, rng, starts):
        _signal(job, num_hosts, signum)
        tally.cycles += 1
        tally.sigterm += signum == signal.SIGTERM
        tally.sigkill += signum == signal.SIGKILL
        tally.moments[moment] += 1
      else:
        signum = None
    try:
      code = job.wait(900 if final else 600)
    except Exception:  # pylint: disable=broad-except
      code = None
      tally.hosts_hung += 1
      tally.failures.append(f'cycle {cycle}: did not exit')
    faulted = fault is not None and fault.kind != 'none'
    if fault is not None:
      fault.end()
      tally.faults[fault.kind] = tally.faults.get(fault.kind, 0) + 1
    runs = _runs(job_dir, num_hosts)[0]
    new = len(runs) > starts  # a run killed during its restore never wrote its start event
    if new and len(runs) >= 2:
      _check(tally, cycle, runs[-2], runs[-1], committed_before, interval, faulted)
    _safety(tally, cycle, job_dir, num_hosts, committed_before, events_before)
    what = 'final' if final else (f'{signal.Signals(signum).name} during {moment}' if signum else '-')
    what += f', storage: {fault.kind}' if fault is not None else ''
    print(f'[soak] cycle {cycle}: {what} -> exit {code}, restored '
          f'{runs[-1][0]["restored_step"] if new else "(killed before restoring)"}', flush=True)
    if final:
      exits = [e for e in runs[-1] if e['event'] == 'exit'] if new else []
      tally.final_step = exits[-1]['step'] if exits else None
      if code != 0 or tally.final_step != target_step:
        tally.failures.append(f'final run: exit {code}, step {tally.final_step}, target {target_step}')
  if tally.cycles < cycles:
    tally.failures.append(f'only {tally.cycles} of {cycles} cycles were signalled: the run ended first')
  return tally


def _host_pids(job_dir, num_hosts, after):
  """Each host's pid from its first `start` event stamped after `after`, or None while one is missing."""
  pids = []
  for host in range(num_hosts):
    starts = [e for e in events_lib.read(job_dir, host) if e['event'] == 'start' and e['t'] >= after]
    if not starts:
      return None
    pids.append(starts[0]['pid'])
  return pids


def _agreed(job_dir, num_hosts, restored):
  """The step every host's newest run preempted at and exited 143 on (a failure line if they did not)."""
  steps, problems = set(), []
  for host, runs in enumerate(_runs(job_dir, num_hosts)):
    run = runs[-1] if runs else [{}]
    preemptions = [e['step'] for e in run if e['event'] == 'preemption']
    exits = [(e['code'], e['step']) for e in run if e['event'] == 'exit']
    if run[0].get('restored_step') != restored or len(preemptions) != 1 or exits != [(143, preemptions[0])]:
      problems.append(f'host {host}: restored {run[0].get("restored_step")}, preemptions {preemptions}, '
                      f'exits {exits}')
    steps.update(preemptions)
  committed = _committed(job_dir)
  if len(steps) != 1 or not steps <= committed:
    problems.append(f'agreed steps {sorted(steps)}, committed {sorted(committed)}')
  return (steps.pop() if len(steps) == 1 else None), problems


def scale(num_hosts, workdir, preempt_host=5, exp='experiments.lm_cloud_autockpt.LmCloudSpmdTinyMultisliceAutockpt'):
  """`make soak`'s many-host case: N local hosts (one CPU device each) in 2 slices; SIGTERM to one host only
  -> every host commits the same step and exits 143; a relaunch restores that step on every host, trains,
  and a SIGTERM to the launcher stops them all at one later step. Returns the figures and any failures."""
  job_dir = os.path.join(workdir, 'job')
  argv = [sys.executable, '-m', 'pax_autockpt.tools.cli', 'launch', f'--num_hosts={num_hosts}', '--num_slices=2',
          '--', f'--exp={exp}', f'--job_log_dir={job_dir}']
  out = {'num_hosts': num_hosts, 'preempt_host': preempt_host, 'failures': []}
  started = time.time()
  job = process.Job(argv, os.path.join(workdir, 'launch1.log'), env=process.users_env())
  try:
    pids = process.wait_until(lambda: _host_pids(job_dir, num_hosts, started), 'every host started', 900,
                              0.5, job)
    log = os.fspath(layout.host_log_path(job_dir, preempt_host))
    process.wait_until(lambda: re.search(r'Step `[1-9]\d*` completed', process.text_of(log)), f'a step in {log}', 900,
                       0.5, job)
    out['start_to_training_s'] = round(time.time() - started, 1)
    sent = time.time()
    os.kill(pids[preempt_host], signal.SIGTERM)  # one host only, as a maintenance event on one VM
    out['launcher_exit'] = job.wait(300)
    out['sigterm_to_all_exited_s'] = round(time.time() - sent, 2)
  finally:
    job.kill()
  step, problems = _agreed(job_dir, num_hosts, restored=None)
  out.update(agreed_step=step)
  out['failures'] += problems + ([] if out['launcher_exit'] == 143 else [f'launcher exit {out["launcher_exit"]}'])
  if step is None:
    return out
  again = time.time()
  job = process.Job(argv, os.path.join(workdir, 'launch2.log'), env=process.users_env())
  try:
    process.wait_until(lambda: _host_pids(job_dir, num_hosts, again), 'every host restarted', 900, 0.5, job)
    out['restart_to_all_restored_s'] = round(time.time() - again, 1)
    process.wait_until(lambda: _last_step(log) >= step + 3, f'step {step + 3} in {log}', 900, 0.5,
                       job)  # trained on from the restored step
    job.send(signal.SIGTERM)  # the launcher forwards it to every host
    out['relaunch_exit'] = job.wait(300)
  finally:
    job.kill()
  later, problems = _agreed(job_dir, num_hosts, restored=step)
  out.update(relaunch_agreed_step=later)
  out['failures'] += problems + ([] if out['relaunch_exit'] == 143 else [f'relaunch exit {out["relaunch_exit"]}'])
  return out


def _last_step(log):
  steps = [int(n) for n in re.findall(r'Step `(\d+)` completed', process.text_of(log))]
  return steps[-1] if steps else -1


@contextlib.contextmanager
def _local_gcs(workdir):
  """A local GCS server for the cycles, its variables in this process's environment (the soak's own
  checks read the bucket) and so in every training process (less the caches: process.users_env); stopped by pid
  at the end."""
  from rigs import local_gcs  # pylint: disable=g-import-not-at-top
  saved = dict(os.environ)
  with local_gcs.LocalGCS(os.path.join(workdir, 'gcs')) as gcs:
    os.environ.update(gcs.env(), GCS_STAT_CACHE_MAX_AGE='0', TF_CPP_MIN_LOG_LEVEL='1')
    try:
      yield gcs
    finally:
      os.environ.clear()
      os.environ.update(saved)


def main(argv=None):
  parser = argparse.ArgumentParser(prog='python -m rigs.soak', description=__doc__)
  parser.add_argument('--cycles', type=int, default=30)
  parser.add_argument('--num_hosts', type=int, default=1)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--workdir', default=None)
  parser.add_argument('--gcs', action='store_true',
                      help='the job on a local GCS server, with storage faults injected in cycles')
  parser.add_argument('--scale', type=int, default=None, metavar='N',
                      help='instead of chaos cycles: N hosts, SIGTERM to host 5 only, relaunch (see scale())')
  args = parser.parse_args(argv)
  if args.scale:
    workdir = args.workdir or tempfile.mkdtemp(prefix='autockpt-scale-')
    os.makedirs(workdir, exist_ok=True)
    start = time.time()
    out = scale(args.scale, workdir, preempt_host=min(5, args.scale - 1))
    print('[soak] ' + json.dumps(out | {'secs': round(time.time() - start)}), flush=True)
    return 0 if not out['failures'] else 1
  # One host trains ~150 steps/s: 30 cycles would pass the tiny model's 2000 steps long before the
  # last signal. Two hosts train ~20 steps/s, so they save more often.
  exp, target, interval = (
      ('experiments.bench.TinySoakAutockpt', 12_000, 500) if args.num_hosts == 1 else
      ('experiments.bench.TinyMultisliceSoakAutockpt', 3000, 100))
  workdir = args.workdir or tempfile.mkdtemp(prefix='autockpt-soak-')
  os.makedirs(workdir, exist_ok=True)
  start = time.time()
  with contextlib.ExitStack() as stack:
    gcs = stack.enter_context(_local_gcs(workdir)) if args.gcs else None
    tally = run(args.cycles, args.num_hosts, workdir, args.seed, exp, target_step=target,
                interval=interval, gcs=gcs)
  summary = dataclasses.asdict(tally) | {'num_hosts': args.num_hosts, 'gcs': args.gcs,
                                         'secs': round(time.time() - start)}
  print('[soak] ' + json.dumps(summary))
  return 0 if not tally.failures else 1


if __name__ == '__main__':
  sys.exit(main())
