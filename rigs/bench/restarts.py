"""What a restart costs, from the kill to the restarted run's first trained step (issue 48).

`launchrestart`: 2 local hosts under `pax-autockpt launch --max_restarts 1`, forked from the launcher's standby
process (the default) vs `--no_standby` (a fresh interpreter per host): launch -> host 1's first step; then,
host 1 SIGKILLed once it trains, the launcher restarts both: kill -> host 1's first step after the restart, with
the restarted run's phases (its `start` and `first_step` events).

`restartcache_<size>`: one host; a run trains past its first checkpoint and is SIGKILLed, and the same command
starts at once (as a scheduler restarts it): kill -> its first trained step, ours with the defaults (the
compilation cache under the job directory, filled by the killed run) vs ours with
`--autockpt_compilation_cache=off` vs stock paxml 1.4.0 (its default: no cache). The runs' environment carries
no JAX_COMPILATION_CACHE_DIR of the caller's. On local disk each arm's killed job is made once and every pass
restarts a fresh copy of it (the clock starts when the copy is in place: a SIGKILL takes no time), so that a
pass of the Medium twin costs its three restarts, not three trainings to its first checkpoint.

Each pass runs the arms in turn (A, B, C, A, B, C, ...), so that this shared machine's drift hits all.
"""

import json
import os
import re
import shutil
import signal
import statistics
import sys
import time

from pax_autockpt.shared import events as events_lib
from pax_autockpt.tools import process
from rigs.bench import measure
from rigs.bench import scenarios
from rigs.bench.measure import Figure
from rigs.bench.measure import Storage

_TWO_HOSTS = 'experiments.bench.TinyMultisliceRareSaves'
_STEP = re.compile(measure.STEP_DONE)
_PHASES = ('imported_s', 'distributed_s', 'restore_s', 'compile_s')


def _env() -> dict[str, str]:
  return {k: v for k, v in os.environ.items() if not k.startswith(('JAX_COMPILATION_CACHE', 'JAX_PERSISTENT'))}


def _first_step_after(path: str, offset: int, timeout: float = 900) -> float:
  """When a step-completed line first appears in `path` past byte `offset` (polled every 0.05 s)."""
  process.wait_until(lambda: _STEP.search(process.text_of(path, offset)), f'a step in {path}', timeout, 0.05)
  return time.time()


def _size(path: str) -> int:
  return os.path.getsize(path) if os.path.exists(path) else 0


def _phases(job_dir: str, host: int, after: float) -> dict[str, float]:
  """The restarted run's start-up phases from its events (absent ones left out)."""
  events = [e for e in events_lib.read(job_dir, host) if e['t'] >= after]
  start = next((e for e in events if e['event'] == 'start'), {})
  first = next((e for e in events if e['event'] == 'first_step'), {})
  found = {k: start[k] for k in _PHASES[:3] if isinstance(start.get(k), (int, float))}
  if isinstance(first.get('compile_s'), (int, float)):
    found['compile_s'] = first['compile_s']
  return found


def _launch_restart(storage: Storage, name: str, standby: bool) -> tuple[float, float, dict[str, float]]:
  """One 2-host launch: launch -> host 1's first step, then host 1 SIGKILLed: kill -> its next first step."""
  job_dir = storage.job_dir(name)
  argv = [sys.executable, '-m', 'pax_autockpt.tools.cli', 'launch', '--num_hosts=2', '--max_restarts=1',
          *([] if standby else ['--no_standby']), '--', f'--exp={_TWO_HOSTS}', f'--job_log_dir={job_dir}',
          '--autockpt_notices=off']
  job = process.Job(argv, os.path.join(storage.workdir, f'{name}.log'), env=_env())
  host1 = os.path.join(job_dir, 'autockpt', 'host1.log')
  try:
    first = _first_step_after(host1, 0) - job.started
    pid = [e for e in events_lib.read(job_dir, 1) if e['event'] == 'start'][-1]['pid']
    offset, killed = _size(host1), time.time()
    os.kill(pid, signal.SIGKILL)
    secs = _first_step_after(host1, offset) - killed
    phases = _phases(job_dir, 1, killed)
    job.send(signal.SIGTERM)
    job.wait(300)
    return first, secs, phases
  finally:
    job.kill()
    storage.clean(job_dir)


def launch_restart(storage: Storage, pairs: int) -> list[Figure]:
  """launch -> first step, and kill -> first step after `launch --max_restarts`'s restart: hosts forked from
  the standby process vs fresh interpreters."""
  warm, cold, warm_start, cold_start, phases = [], [], [], [], []
  for i in range(pairs):
    first, secs, split = _launch_restart(storage, f'launchrestart-standby-{i}', True)
    warm_start.append(first)
    warm.append(secs)
    phases.append(split)
    first, secs, _ = _launch_restart(storage, f'launchrestart-fresh-{i}', False)
    cold_start.append(first)
    cold.append(secs)
    measure.say(f'launch #{i}: first step standby {warm_start[-1]:.1f} s, fresh {cold_start[-1]:.1f} s; restart '
                f'standby {warm[-1]:.1f} s, fresh {cold[-1]:.1f} s; standby phases {split}')
  return [Figure('launch -> first step of 2 hosts, forked from the standby vs fresh interpreters, tiny', 's',
                 warm_start, cold_start, 'fresh interpreters'),
          Figure('kill -> first step after launch --max_restarts restarts 2 hosts, standby vs fresh, tiny', 's',
                 warm, cold, 'fresh interpreters'),
          *_phase_figures('launch restart from standby', phases)]


def _phase_figures(label: str, phases: list[dict[str, float]]) -> list[Figure]:
  return [Figure(f'{label}: {k[:-2]}', 's', [p.get(k, float('nan')) for p in phases]) for k in _PHASES]


def _killed_then_restarted(storage: Storage, argv: list[str], name: str,
                           after_step: int) -> tuple[float, dict[str, float]]:
  """A run trains past `after_step` (its checkpoint committed) and is SIGKILLed; the same command starts at
  once: kill -> its first trained step, and the restart's phases (none for stock paxml: no event log)."""
  job_dir = storage.job_dir(name)
  try:
    killed = _killed_past(storage, argv, name, after_step)
    secs = _restarted(argv, job_dir, os.path.join(storage.workdir, f'{name}-again.log'), killed)
    return secs, _phases(job_dir, 0, killed)
  finally:
    storage.clean(job_dir)


def _killed_past(storage: Storage, argv: list[str], name: str, after_step: int) -> float:
  """A run of `argv` in `name`'s job directory trained past `after_step`, then SIGKILLed; returns the kill's time."""
  first = process.Job([*argv, f'--job_log_dir={storage.job_dir(name)}'],
                      os.path.join(storage.workdir, f'{name}-first.log'), env=_env())
  try:
    process.wait_until(lambda: _trained_past(first.log(), after_step), f'step {after_step}', 900, 0.1, first)
    killed = time.time()
    first.kill()
    return killed
  finally:
    first.kill()


def _restarted(argv: list[str], job_dir: str, log: str, since: float) -> float:
  """The same command started again on `job_dir`: `since` -> its first trained step."""
  again = process.Job([*argv, f'--job_log_dir={job_dir}'], log, env=_env())
  try:
    return _first_step_after(log, 0) - since
  finally:
    again.kill()


def _restarted_from_copy(storage: Storage, argv: list[str], killed_job: str,
                         name: str) -> tuple[float, dict[str, float]]:
  """A fresh copy of a killed job's directory, restarted: the copy in place -> its first trained step, and the
  restart's phases."""
  job_dir = storage.job_dir(name)
  try:
    shutil.copytree(killed_job, job_dir)
    since = time.time()
    return _restarted(argv, job_dir, os.path.join(storage.workdir, f'{name}-again.log'), since), \
        _phases(job_dir, 0, since)
  finally:
    storage.clean(job_dir)


def _trained_past(log: str, step: int) -> bool:
  return any(int(s) > step for s in re.findall(r'summary tensor at step=(\d+) ', log))


def restart_cache(storage: Storage, size: str, pairs: int) -> list[Figure]:
  """kill -> first step of the restart: ours (cache on by default) vs ours with the cache off vs stock."""
  arms = {'ours': scenarios.ours(f'{size}Autockpt', '--autockpt_notices=off'),
          'cache off': scenarios.ours(f'{size}Autockpt', '--autockpt_notices=off', '--autockpt_compilation_cache=off'),
          'stock': scenarios.stock(f'{size}Stock', scenarios._port_flag())}  # pylint: disable=protected-access
  got, phases = {arm: [] for arm in arms}, {arm: [] for arm in arms}
  killed_job = {arm: f'restartcache-{size}-{arm.replace(" ", "")}' for arm in arms}  # each arm's, on local disk
  from_copies = not storage.is_gcs
  if from_copies:
    for arm, argv in arms.items():
      _killed_past(storage, argv, killed_job[arm], 100)
  for i in range(pairs):
    for arm, argv in arms.items():
      name = f'{killed_job[arm]}-{i}'
      secs, split = (_restarted_from_copy(storage, argv, storage.job_dir(killed_job[arm]), name) if from_copies
                     else _killed_then_restarted(storage, argv, name, 100))
      got[arm].append(secs)
      phases[arm].append(split)
    measure.say(f'restart {size} #{i}: ' + ', '.join(f'{a} {v[-1]:.1f} s' for a, v in got.items()))
  if from_copies:
    for job in killed_job.values():
      storage.clean(storage.job_dir(job))
  return [Figure(f'kill -> first step of the restart, {size}: cache on (default) vs off', 's', got['ours'],
                 got['cache off'], 'cache off'),
          Figure(f'kill -> first step of the restart, {size}: ours (default) vs stock paxml', 's', got['ours'],
                 got['stock'], 'stock paxml'),
          *_phase_figures(f'restart {size}, cache on', phases['ours']),
          *_phase_figures(f'restart {size}, cache off', phases['cache off'])]


def summary(figures: list[Figure]) -> str:
  """One line per figure (median, min-max): what the bench prints at the end of these scenarios."""
  lines = []
  for f in figures:
    xs = [x for x in f.values if x == x]
    if xs:
      lines.append(f'{f.name}: {statistics.median(xs):.2f} {f.unit} ({min(xs):.2f}-{max(xs):.2f})')
  return json.dumps(lines, indent=1)
