"""Bench scenarios `buddystep_<size>`, `buddyrelaunch_<size>`, `buddyflood_<size>`: buddy copies on a real 2-host
job (issues 39, 46).

Both train experiments.bench.<size>ModelParallelAutockpt under `pax-autockpt launch --num_hosts=2`: the model
split over both hosts (one slice, no data-parallel replica: the case buddy copies are for), the local tier on
this machine's disk every 10 s, Pax's interval never due.

- `buddystep_<size>`: the mean step time with `--autockpt_local_buddy` (each host also streams its neighbour's
  newest local step into its own local tier after every commit) against the same job without it, alternating;
  from the local tier's captures on host 0 (`mean_step_secs`: Medium takes ~3 s a step on these 2 cores),
  and both hosts' CPU per step.
- `buddyrelaunch_<size>`: one job with buddy copies trains until host 0's buddy copy holds the local step both
  hosts committed last, then SIGKILL both hosts. Its job directory and both local directories are copied aside
  once; before each relaunch they are put back, (a) without host 1's local directory (a replaced VM: host 1's
  share is streamed from the buddy copy host 0 keeps) or (b) all of them, alternating; each relaunch is timed
  from the launcher's start to host 0's first training step, and must restore the local step expected.

- `buddyflood_<size>`: the same job with buddy copies, each run's window of FLOOD_SECS (the local tier every
  1 s) with a stranger's flood against host 0's buddy server (rigs.bench.flood, a process of its
  own: silent, trickling and huge-headed connections and GETs without the secret) or undisturbed, alternating;
  host 0's step time (between the local commits seen in the window), its RSS growth over the window's start,
  the local commits it made and host 1's copies of them in the window (issue 46).

Hosts are SIGKILLed by pid before their launcher: a launcher that dies first has its hosts SIGTERMed (they save
and exit 143), and a host still saving would slow the next run.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

from pax_autockpt import layout
from pax_autockpt.shared import events as events_lib
from pax_autockpt.tools import process
from rigs.bench import measure
from rigs.bench.measure import Figure
from rigs.bench.measure import Storage

_B = 'experiments.bench.'
HOSTS = 2
STEP_SECS = 100.0  # training per step-time run: ~8 local commits (and buddy copies) at one per 10 s or more
TARGET_STEP = 1.1  # buddy copies on vs off, step time
TARGET_RELAUNCH = 1.3  # relaunch -> first step, host 1's disk gone vs every disk intact
_COPIED = r'buddy copies: \d+ of host \d+\'s local steps copied'
_COMMITS = re.compile(r'^I\d{4} (\d\d):(\d\d):(\d\d\.\d+) .*\[autockpt\] local (?:save of step (\d+) committed|tier: '
                      r'.*newest step (\d+), committed) in ([\d.]+) s', re.M)
_RESTORED = re.compile(r'\[autockpt\] local step (\d+) restored in ([\d.]+) s')
_RECEIVED = re.compile(r'\[autockpt\] local step (\d+) received from host 0 \(the buddy copy it keeps for this host\) '
                       r'in ([\d.]+) s \(([\d.]+) MB')


# --- processes ---------------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
  """The processes whose parent is `pid` (a launcher's hosts), from /proc."""
  found = []
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat') as f:
        stat = f.read()
    except OSError:
      continue  # gone meanwhile
    if int(stat.rsplit(')', 1)[1].split()[1]) == pid:
      found.append(int(entry))
  return found


def _alive(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except OSError:
    return False


def _kill(job: process.Job) -> None:
  """SIGKILL every host (no signal, no save), then the launcher, and wait until the hosts are gone."""
  hosts = _children(job.pid)
  for pid in hosts:
    with contextlib.suppress(ProcessLookupError):
      os.kill(pid, signal.SIGKILL)
  job.kill()
  process.wait_until(lambda: not any(_alive(p) for p in hosts), 'the killed hosts gone', 60, 0.1)


def _local_dirs(storage: Storage, base: str) -> list[str]:
  return [os.path.join(storage.workdir, f'{base}-local-{h}') for h in range(HOSTS)]


def _launch(storage: Storage, size: str, name: str, job_dir: str, base: str, buddy: bool,
            *flags: str, interval: float = 10) -> process.Job:
  """The 2-host job, its local tier every `interval` s in `base`'s folders, with or without buddy copies."""
  local = os.path.join(storage.workdir, f'{base}-local-{{host}}')
  argv = [sys.executable, '-m', 'pax_autockpt.tools.cli', 'launch', f'--num_hosts={HOSTS}', '--',
          f'--exp={_B}{size}ModelParallelAutockpt', f'--job_log_dir={job_dir}', '--autockpt_notices=off',
          f'--autockpt_local_dir={local}', f'--autockpt_local_min_interval_secs={interval:g}',
          *(('--autockpt_local_buddy',) if buddy else ()), *flags]
  return process.Job(argv, os.path.join(storage.workdir, f'{name}.log'), env=storage.env())


def _host_logs(job_dir: str) -> list[str]:
  return [os.fspath(layout.host_log_path(job_dir, h)) for h in range(HOSTS)]


# --- buddystep ---------------------------------------------------------------------------------------


def mean_step_secs(log: str, first: int = 3) -> float:
  """Mean step time between the local tier's captures from step `first` on, in a host's log: a commit line's
  time less the commit's duration is when its step was captured (between two steps). Pax's step lines stop
  after step 4, and its steps/sec lines come once per 10 steps, a few per run at seconds a step."""
  found = [(int(m.group(4) or m.group(5)),
            3600 * int(m.group(1)) + 60 * int(m.group(2)) + float(m.group(3)) - float(m.group(6)))
           for m in _COMMITS.finditer(log)]
  found = [(step, t) for step, t in found if step >= first]
  if len(found) < 2:
    return float('nan')
  span = sum((b - a) % 86400 for (_, a), (_, b) in zip(found, found[1:]))  # a line past midnight: a day on
  return span / (found[-1][0] - found[0][0])


def _cpu_secs(pids: list[int]) -> float:
  """The user + system CPU seconds these processes used so far (/proc, every thread)."""
  total = 0
  for pid in pids:
    with open(f'/proc/{pid}/stat') as f:
      fields = f.read().rsplit(')', 1)[1].split()
    total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
  return total / os.sysconf('SC_CLK_TCK')


def _step_ms(storage: Storage, size: str, name: str, secs: float, flags: tuple[str, ...]) -> dict[str, float]:
  """One run: `secs` of training after step 3, killed; host 0's mean step time over them, and both hosts' CPU
  per step (what the copies cost where 2 hosts share 2 cores)."""
  job_dir = storage.job_dir(name)
  job = _launch(storage, size, name, job_dir, name, False, *flags)
  host0 = _host_logs(job_dir)[0]
  try:
    process.wait_until(lambda: 'Step `3` completed' in process.text_of(host0), f'step 3 of {name}', 900, 0.5, job)
    hosts = _children(job.pid)
    cpu = -_cpu_secs(hosts)
    time.sleep(secs)
    cpu += _cpu_secs(hosts)
  finally:
    _kill(job)
  log = process.text_of(host0)
  storage.clean(job_dir)
  for folder in _local_dirs(storage, name):
    shutil.rmtree(folder, ignore_errors=True)
  if flags and not re.search(_COPIED, log):
    raise RuntimeError(f'{name}: no buddy copy in {secs:.0f} s of training; host 0 ends:\n{log[-3000:]}')
  step = mean_step_secs(log)
  return dict(step=step * 1e3, cpu=cpu * step / secs * 1e3)  # CPU over the window, per step in it


def buddy_step_time(storage: Storage, size: str, pairs: int, secs: float = STEP_SECS,
                    mb_per_sec: float | None = None) -> list[Figure]:
  """Mean step time with buddy copies (at most `mb_per_sec`, else the default cap) against without, the local
  tier every 10 s in both, alternating; and both hosts' CPU per step."""
  cap = f'at most {mb_per_sec:g} MB/s' if mb_per_sec else f'the default cap, {_default_cap():g} MB/s'
  flags = ('--autockpt_local_buddy', *((f'--autockpt_local_buddy_mb_per_sec={mb_per_sec:g}',) if mb_per_sec else ()))
  got = {'on': [], 'off': []}
  for i in range(pairs):
    for arm, arm_flags in (('on', flags), ('off', ())):
      got[arm].append(_step_ms(storage, size, f'buddystep-{size}-{arm}-{i}', secs, arm_flags))
    measure.say(f'buddystep {size} ({cap}) #{i}: buddy copies {got["on"][-1]}, without {got["off"][-1]} (ms)')
  where = f'{size} split over 2 local hosts (no replica), local tier every 10 s, {storage.name}'
  per = lambda arm, key: [r[key] for r in got[arm]]
  return [Figure(f'step time, buddy copies on ({cap}) vs off, {where} (target <= x{TARGET_STEP:g})', 'ms',
                 per('on', 'step'), per('off', 'step'), 'buddy copies off'),
          Figure(f'CPU of both hosts per step, buddy copies on ({cap}) vs off, {where}', 'ms', per('on', 'cpu'),
                 per('off', 'cpu'), 'buddy copies off')]


def _default_cap() -> float:
  from pax_autockpt import settings as settings_lib  # pylint: disable=g-import-not-at-top
  return settings_lib.Settings().local_buddy_mb_per_sec


# --- buddyrelaunch -----------------------------------------------------------------------------------


def expected_steps(own0: list[int], own1: list[int], kept0: list[int], kept1: list[int]) -> dict[str, int | None]:
  """The local step a relaunch must restore, from each host's committed local steps (`own*`) and the buddy
  copies it keeps for the other (`kept*`): with every directory intact, the newest step both hosts' shares are
  held at (own or kept); with host 1's directory gone, the newest host 0 holds beside its copy of host 1's."""
  intact = (set(own0) | set(kept1)) & (set(own1) | set(kept0))
  return {'intact': max(intact, default=None), 'replaced': max(set(own0) & set(kept0), default=None)}


def _caught_up(local: list[str]) -> int | None:
  """The newest local step once both hosts hold two (as in steady state, `--autockpt_local_keep=2`) and host
  0's buddy copy of host 1's share is of the newest (else None): when the job is killed."""
  own = [layout.local_committed_steps(f) for f in local]
  kept = layout.local_committed_steps(layout.local_buddy_dir(local[0]))
  return kept[-1] if kept and all(len(o) >= 2 and o[-1] == kept[-1] for o in own) else None


def _killed_state(storage: Storage, size: str, base: str, job_dir: str) -> dict[str, int | None]:
  """Trains with buddy copies until host 0's copy of host 1's newest share is committed, SIGKILL both hosts;
  the steps each arm's relaunch must restore."""
  local = _local_dirs(storage, base)
  job = _launch(storage, size, f'{base}-first', job_dir, base, buddy=True)
  try:
    step = process.wait_until(lambda: _caught_up(local), 'a buddy copy of the newest local step', 900, 0.2, job)
  finally:
    _kill(job)
  found = [layout.local_committed_steps(f) for f in local]
  want = expected_steps(*found, *(layout.local_committed_steps(layout.local_buddy_dir(f)) for f in local))
  measure.say(f'{base}: killed at local step {step}; local steps {found}; relaunches restore {want}')
  if want['replaced'] is None:
    raise RuntimeError(f'{base}: no local step restorable without host 1\'s directory: {found}')
  return want


def restored_from(log0: str, log1: str) -> dict:
  """From a relaunch's host logs: the local step host 0 restored and its read's seconds, and the step, seconds
  and MB of host 1's share received from host 0's buddy copy (None where it restored its own)."""
  restored, received = _RESTORED.search(log0), _RECEIVED.search(log1)
  return dict(step=int(restored.group(1)) if restored else None,
              restore=float(restored.group(2)) if restored else None,
              fill_step=int(received.group(1)) if received else None,
              fill=float(received.group(2)) if received else None,
              fill_mb=float(received.group(3)) if received else None)


def _relaunch(storage: Storage, size: str, name: str, job_dir: str, base: str, want: int, replaced: bool) -> dict:
  """Launch -> host 0's first training step, then SIGKILL; checks the local step restored is `want`, and with
  host 1's directory gone that host 1 received it from host 0's buddy copy."""
  logs = _host_logs(job_dir)
  since = [os.path.getsize(p) if os.path.exists(p) else 0 for p in logs]  # the killed run's lines came back
  job = _launch(storage, size, name, job_dir, base, buddy=True)
  try:
    process.wait_until(lambda: re.search(measure.STEP_DONE, process.text_of(logs[0], since[0])),
                       f'the first step of {name}', 900, 0.1, job)
    took = time.time() - job.started
  finally:
    _kill(job)
  got = dict(first_step=took, **restored_from(*(process.text_of(p, s) for p, s in zip(logs, since))))
  if got['step'] != want or (got['fill_step'] != want if replaced else got['fill'] is not None):
    raise RuntimeError(f'{name}: restored {got}, expected local step {want}'
                       + (' with host 1\'s share from host 0\'s buddy copy' if replaced else ' from own copies'))
  return got


def _put_back(paths: list[str], aside: str, without: tuple[str, ...] = ()) -> None:
  """Each of `paths` as it was set aside (the killed state), but those `without` (gone, as on a new VM)."""
  for path in paths:
    shutil.rmtree(path, ignore_errors=True)
    if path not in without:
      shutil.copytree(os.path.join(aside, os.path.basename(path)), path, symlinks=True)


def buddy_relaunch(storage: Storage, size: str, pairs: int) -> list[Figure]:
  """Relaunch -> first step with host 1's local directory gone (its share from host 0's buddy copy) against
  every local directory intact, alternating, each from the same killed state."""
  if storage.is_gcs:
    raise ValueError('buddyrelaunch runs on local disk (its directories are copied aside and put back)')
  base = f'buddyrelaunch-{size}'
  job_dir, aside = storage.job_dir(base), os.path.join(storage.workdir, f'{base}-aside')
  paths = [job_dir, *_local_dirs(storage, base)]
  got = {'replaced': [], 'intact': []}
  try:
    want = _killed_state(storage, size, base, job_dir)
    for path in paths:
      shutil.copytree(path, os.path.join(aside, os.path.basename(path)), symlinks=True)
    for i in range(pairs):
      for arm, runs in got.items():
        _put_back(paths, aside, without=(paths[2],) if arm == 'replaced' else ())
        runs.append(_relaunch(storage, size, f'{base}-{arm}-{i}', job_dir, base, want[arm], arm == 'replaced'))
      measure.say(f'{base} #{i}: host 1\'s directory gone {got["replaced"][-1]}, intact {got["intact"][-1]}')
  finally:
    for path in (*paths, aside):
      shutil.rmtree(path, ignore_errors=True)
  return _relaunch_figures(size, got)


def _relaunch_figures(size: str, got: dict[str, list[dict]]) -> list[Figure]:
  gone, intact = got['replaced'], got['intact']
  per = lambda runs, key: [r[key] for r in runs]
  where = f'{size} split over 2 local hosts (no replica), host 1\'s share {gone[0]["fill_mb"]:.0f} MB, local'
  return [
      Figure(f'relaunch -> first training step, host 1\'s local directory gone (its share from the buddy copy host 0 '
             f'keeps) vs every local directory intact, {where} (target <= x{TARGET_RELAUNCH:g})', 's',
             per(gone, 'first_step'), per(intact, 'first_step'), 'every local directory intact'),
      Figure(f'host 1\'s share streamed from host 0\'s buddy copy (fetch -> commit), {where}', 's', per(gone, 'fill')),
      Figure(f'local step restored (read back, placed on the mesh), host 1\'s directory gone vs intact, {where}', 's',
             per(gone, 'restore'), per(intact, 'restore'), 'every local directory intact'),
  ]


# --- buddyflood --------------------------------------------------------------------------------------

FLOOD_SECS = 20.0  # the measured window: 12-18 local commits on Tiny here (at most one a second)
_SERVING = re.compile(r'buddy copies: this host keeps host \d+\'s newest local step in .*; serving on (\S+):(\d+)\.')


def _newest(folder: str) -> int | None:
  steps = layout.local_committed_steps(folder)
  return steps[-1] if steps else None


def _rss_mb(pid: int) -> float:
  with open(f'/proc/{pid}/status') as f:
    return int(next(line for line in f if line.startswith('VmRSS:')).split()[1]) / 1024


def window(pid: int, local: list[str], secs: float, every: float = 0.1) -> dict[str, float]:
  """Host 0 sampled every `every` s for `secs`: its step time between the first and the last local commit
  first seen in the window (a commit's directory appears a constant time after its capture), its RSS growth
  over the window's start (MB), the local commits seen and host 1's copies of them."""
  start_rss, peak, seen, copies = _rss_mb(pid), 0.0, {}, set()
  before, kept_before = _newest(local[0]), _newest(layout.local_buddy_dir(local[1]))
  end = time.monotonic() + secs
  while time.monotonic() < end:
    peak = max(peak, _rss_mb(pid))
    step, kept = _newest(local[0]), _newest(layout.local_buddy_dir(local[1]))
    if step not in (None, before):
      seen.setdefault(step, time.monotonic())
    copies |= {kept} - {None, kept_before}
    time.sleep(every)
  steps = sorted(seen)
  span = (seen[steps[-1]] - seen[steps[0]]) / (steps[-1] - steps[0]) if len(steps) > 1 else float('nan')
  return dict(step=span * 1e3, rss=peak - start_rss, commits=len(steps), copies=len(copies))


@contextlib.contextmanager
def _flood(address: tuple[str, str] | None, secs: float, counts: dict):
  """The stranger's flood against `address` for `secs` (None: none) in a process of its own; its counts
  into `counts` after."""
  if address is None:
    yield
    return
  argv = [sys.executable, '-m', 'rigs.bench.flood', *address, f'{secs:g}']
  flood = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
  try:
    yield
    out, _ = flood.communicate(timeout=secs + 60)
    counts.update(json.loads(out.strip().splitlines()[-1]))
  finally:
    flood.kill()
    flood.wait()


def _host0_pid(job_dir: str) -> int | None:
  starts = [e for e in events_lib.read(job_dir, 0) if e['event'] == 'start']
  return starts[-1]['pid'] if starts else None


def _flood_run(storage: Storage, size: str, name: str, secs: float, flooded: bool) -> dict[str, float]:
  """One run with buddy copies, the local tier every 1 s: once host 1 holds a copy of host 0's step (host
  0's server works), a window of `secs`, flooded or not; SIGKILLed after."""
  job_dir, local = storage.job_dir(name), _local_dirs(storage, name)
  job = _launch(storage, size, name, job_dir, name, True, interval=1)
  host0, counts = _host_logs(job_dir)[0], {}
  try:
    found = process.wait_until(lambda: _SERVING.search(process.text_of(host0)), f'host 0 serving, {name}', 900, 0.5,
                               job)
    process.wait_until(lambda: _newest(layout.local_buddy_dir(local[1])), f'a buddy copy, {name}', 900, 0.2, job)
    pid = process.wait_until(lambda: _host0_pid(job_dir), f'host 0\'s start event, {name}', 60, 0.2, job)
    with _flood(found.group(1, 2) if flooded else None, secs, counts):
      got = window(pid, local, secs)
  finally:
    _kill(job)
  storage.clean(job_dir)
  for folder in local:
    shutil.rmtree(folder, ignore_errors=True)
  if flooded:
    measure.say(f'{name}: the flood\'s counts {counts}')
  return got


def buddy_flood(storage: Storage, size: str, pairs: int, secs: float = FLOOD_SECS) -> list[Figure]:
  """Host 0's step time, RSS growth and local commits in a window with a stranger's flood against its buddy
  server vs undisturbed, alternating."""
  got = {'flooded': [], 'undisturbed': []}
  for i in range(pairs):
    for arm in got:
      got[arm].append(_flood_run(storage, size, f'buddyflood-{size}-{arm}-{i}', secs, arm == 'flooded'))
    measure.say(f'buddyflood {size} #{i}: flooded {got["flooded"][-1]}, undisturbed {got["undisturbed"][-1]}')
  where = f'{size} split over 2 local hosts, buddy copies, local tier every 1 s, a {secs:.0f} s window, {storage.name}'
  per = lambda arm, key: [r[key] for r in got[arm]]
  pair = lambda key: (per('flooded', key), per('undisturbed', key), 'undisturbed')
  return [Figure(f'host 0 step time, a stranger\'s flood on its buddy server vs undisturbed, {where}', 'ms',
                 *pair('step')),
          Figure(f'host 0 RSS growth over the window, flooded vs undisturbed, {where}', 'MB', *pair('rss')),
          Figure(f'host 0 local commits in the window, flooded vs undisturbed, {where}', 'commits', *pair('commits')),
          Figure(f'host 1\'s buddy copies of host 0\'s steps (from the flooded server) in the window, flooded vs '
                 f'undisturbed, {where}', 'copies', *pair('copies'))]
