"""The bench's scenarios: each returns Figures from alternating, paired runs (see measure.py)."""

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt.local import format as local_format
from pax_autockpt.shared import events as events_lib
from pax_autockpt.tools import process
from rigs.bench import measure
from rigs.bench.measure import Figure
from rigs.bench.measure import Storage

_B = 'experiments.bench.'
OFF = ('--enable_checkpoint_saving=false',)
CONTINUOUS = ('--autockpt_continuous', '--autockpt_keep_latest=3')
CONTINUOUS_1S = (*CONTINUOUS, '--autockpt_min_interval_secs=1')


def ours(exp: str, *flags: str) -> list[str]:
  return [sys.executable, '-m', 'pax_autockpt.main', f'--exp={_B}{exp}', *flags]


def stock(exp: str, *flags: str) -> list[str]:
  argv = process.stock_argv(f'{_B}{exp}', '', '--jax_fully_async_checkpoint', '--exit_after_ondemand_checkpoint',
                            '--num_hosts=1', '--host_idx=0', *flags)
  return [a for a in argv if a != '--job_log_dir=']


def _port_flag() -> str:
  from pax_autockpt.hosts import hosts  # pylint: disable=g-import-not-at-top
  return f'--server_addr=127.0.0.1:{hosts.free_loopback_port()}'


def _pct(xs, q):
  xs = sorted(xs)
  if not xs:
    return None
  pos = (len(xs) - 1) * q / 100
  lo = int(pos)
  hi = min(lo + 1, len(xs) - 1)
  return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _save_stats(run: measure.Run) -> dict:
  """Per run: loop blocking P50/P90, start -> commit P50, start -> start P50, requests per save. The
  first saves are warm-up (step 0 creates the directories); two are passed over when the run made at
  least five, else one (a slow bucket makes a few saves a minute)."""
  saves = run.saves(skip=2 if len(run.saves()) >= 5 else 1)
  blocking = [e['blocking_s'] * 1e3 for e in saves]
  committed = run.committed()
  durations = [committed[e['step']] * 1e3 for e in saves if e['step'] in committed]
  starts = [e['t'] for e in saves]
  every = run.saves()
  return dict(blocking_p50=_pct(blocking, 50), blocking_p90=_pct(blocking, 90),
              duration_p50=_pct(durations, 50),
              interval_p50=_pct([b - a for a, b in zip(starts, starts[1:])], 50),
              requests=(run.checkpoint_requests / len(every)) if run.checkpoint_requests and every else None)


def _tiny_arms(storage: Storage, pairs: int, secs: float, arms: dict[str, tuple[str, ...]],
               name: str) -> tuple[dict[str, list[float]], dict[str, list[dict]]]:
  """Alternating tiny runs, one per arm per pair: each arm's step time (ms), and the per-save figures
  (`_save_stats`) of every arm but 'off'."""
  step = {a: [] for a in arms}
  stats = {a: [] for a in arms if a != 'off'}
  for i in range(pairs):
    for arm, flags in arms.items():
      label = f'{name}-{storage.name}-{arm.replace(" ", "")}-{i}'
      run = measure.timed_run(storage, ours('TinyAutockpt', *flags), label, train_secs=_tiny_secs(storage, secs),
                              preempt=False)
      step[arm].append(measure.mean_step_secs(run.log) * 1e3)
      if arm in stats:
        stats[arm].append(_save_stats(run))
      storage.clean(run.job_dir)
      measure.say(f'{name} {storage.name} {arm} #{i}: {step[arm][-1]:.2f} ms/step'
                  + (f', {stats[arm][-1]}' if arm in stats else ''))
  return step, stats


def tiny_saves(storage: Storage, pairs: int, secs: float, fmt: tuple[str, ...] = ()) -> list[Figure]:
  """Step time with continuous checkpointing (no minimum, 1 s minimum) against saving off, and the
  save path's per-save figures, on the tiny state."""
  arms = {'off': OFF, 'continuous': CONTINUOUS, 'continuous_1s': CONTINUOUS_1S}
  step, stats = _tiny_arms(storage, pairs, secs, {arm: (*flags, *fmt) for arm, flags in arms.items()}, 'tiny')
  where = f'tiny, {storage.name}'
  figures = [
      Figure(f'step time, continuous (no minimum) vs off, {where}', 'ms', step['continuous'], step['off'], 'off'),
      Figure(f'step time, continuous 1 s minimum vs off, {where}', 'ms', step['continuous_1s'], step['off'],
             'off'),
  ]
  for key, label, unit in (('blocking_p50', 'loop blocked per save P50', 'ms'),
                           ('blocking_p90', 'loop blocked per save P90', 'ms'),
                           ('duration_p50', 'save start -> commit P50', 'ms'),
                           ('interval_p50', 'checkpoint interval P50', 's'),
                           ('requests', 'storage requests per save', 'requests')):
    values = [s[key] for s in stats['continuous']]
    if any(v is not None for v in values):
      figures.append(Figure(f'{label}, continuous (no minimum), {where}', unit, values))
  return figures


def background_nice(storage: Storage, pairs: int, secs: float) -> list[Figure]:
  """Continuous saving (no minimum) with its save threads at the default nice against nice 0 (as
  training), saving off beside them: step time, and each save's start -> commit and interval."""
  nice = f'nice {settings_lib.Settings().background_nice}'
  arms = {'off': OFF, 'nice 0': (*CONTINUOUS, '--autockpt_background_nice=0'), nice: CONTINUOUS}
  step, stats = _tiny_arms(storage, pairs, secs, arms, 'nice')
  where = f'continuous (no minimum), tiny, {storage.name}'
  per = lambda arm, key: [s[key] for s in stats[arm]]
  return [Figure(f'step time, save threads at {nice} vs nice 0, {where}', 'ms', step[nice], step['nice 0'],
                 'nice 0'),
          Figure(f'step time, {nice} vs saving off, {where}', 'ms', step[nice], step['off'], 'off'),
          Figure(f'step time, nice 0 vs saving off, {where}', 'ms', step['nice 0'], step['off'], 'off'),
          Figure(f'save start -> commit P50, {nice} vs nice 0, {where}', 'ms', per(nice, 'duration_p50'),
                 per('nice 0', 'duration_p50'), 'nice 0'),
          Figure(f'checkpoint interval P50, {nice} vs nice 0, {where}', 's', per(nice, 'interval_p50'),
                 per('nice 0', 'interval_p50'), 'nice 0')]


def on_demand_zstd(storage: Storage, size: str, pairs: int) -> list[Figure]:
  """The on-demand save written raw (the default) against the same save with zstd, as orbax 0.5.9 writes
  every array; each with its own baseline beside it."""
  raw, zstd = [], []
  for i in range(pairs):
    raw.append(_on_demand_run(storage, size, i, (), 'raw'))
    zstd.append(_on_demand_run(storage, size, i, ('--autockpt_compression=zstd',), 'zstd'))
  where = f'{size} ({raw[0]["bytes"] / 1e6:.0f} MB raw, {zstd[0]["bytes"] / 1e6:.0f} MB zstd), {storage.name}'
  what = 'single-object upload' if storage.is_gcs else 'raw write + fsync'
  return [Figure(f'on-demand save, raw chunks vs zstd, {where}', 's', [r['save'] for r in raw],
                 [z['save'] for z in zstd], 'zstd'),
          Figure(f'on-demand save, raw chunks, vs {what}, {where}', 's', [r['save'] for r in raw],
                 [r['base'] for r in raw], what),
          Figure(f'on-demand save, zstd, vs {what}, {where}', 's', [z['save'] for z in zstd],
                 [z['base'] for z in zstd], what),
          Figure(f'SIGTERM -> exit 143, raw chunks vs zstd, {where}', 's', [r['exit'] for r in raw],
                 [z['exit'] for z in zstd], 'zstd')]


def _on_demand_run(storage: Storage, size: str, i: int, flags: tuple[str, ...], label: str = '') -> dict:
  """One run SIGTERMed after 3 s of training: its on-demand save, the loop's wait for it, SIGTERM -> exit,
  the run's storage requests, and the storage's own time for the same bytes, measured right after."""
  run = measure.timed_run(storage, ours(f'{size}Autockpt', *flags), f'od{label}-{size}-{storage.name}-{i}',
                          train_secs=3, preempt=True)
  step = [e['step'] for e in run.events if e['event'] == 'preemption'][0]
  started = [e for e in run.saves('preemption') if e['step'] == step]
  got = dict(save=run.committed().get(step), blocked=started[0]['blocking_s'] if started else None,
             exit=run.sigterm_to_exit_s, requests=run.checkpoint_requests, bytes=storage.step_bytes(run.job_dir, step))
  storage.clean(run.job_dir)
  got['base'] = storage.baseline_write_secs(got['bytes'])
  measure.say(f'on-demand {label or "default"} {size} {storage.name} #{i}: exit {run.code}, save {got["save"]} s '
              f'for {got["bytes"] / 1e6:.0f} MB, blocked {got["blocked"]} s, SIGTERM -> exit {got["exit"]:.2f} s, '
              f'baseline {got["base"]:.2f} s')
  return got


def sigterm_in_flight(storage: Storage, size: str, pairs: int,
                      short: tuple[float, float] = (1.0, 10.0)) -> list[Figure]:
  """SIGTERM while a continuous save is in flight, alternating a grace budget that holds the save in flight
  and a new one (300 s: the agreed step is saved) with one that does not (the first run's median save
  duration + 10 s: the save in flight commits and the process exits 143 naming it, inside the budget).
  `short` = (factor, seconds) sets the short budget to factor x that duration + seconds; (2, 5) gives one
  where the plan saves a new step, and that save must fit."""
  exit_s = {'long': [], 'short': []}
  kept, inside, short_budget = [], [], None
  factor, extra = short
  for i in range(pairs):
    for arm in ('long', 'short'):
      budget = 300.0 if arm == 'long' else short_budget
      run = _sigterm_mid_save(storage, size, f'inflight-{arm}-{size}-{storage.name}-{i}', budget)
      exit_s[arm].append(run['exit'])
      if arm == 'long' and short_budget is None:
        short_budget = round(factor * run['save_s'] + extra)
      if arm == 'short':
        kept.append(1.0 if run['plan'] == 'keep_in_flight' and run['committed'] == run['in_flight'] else 0.0)
        inside.append(1.0 if run['code'] == 143 and run['exit'] < budget else 0.0)
      measure.say(f'in flight {arm} (budget {budget:.0f} s) #{i}: {run}')
  where = f'{size}, {storage.name}'
  times = '' if factor == 1 else f'{factor:g} x '
  short = f"budget {short_budget:.0f} s, {times}the first run's save + {extra:g} s"
  return [Figure(f'SIGTERM during a continuous save -> exit, budget 300 s (the agreed step saved), {where}',
                 's', exit_s['long']),
          Figure(f'SIGTERM during a continuous save -> exit, {short}, {where}', 's', exit_s['short']),
          Figure(f'share of runs whose save in flight committed and was the exit step, {short}, {where}', 'share',
                 kept),
          Figure(f'share of runs that exited 143 inside the budget, {short}, {where}', 'share', inside)]


def _sigterm_mid_save(storage: Storage, size: str, name: str, budget: float) -> dict:
  """A continuous run SIGTERMed once one save committed and the next is in flight."""
  job_dir = storage.job_dir(name)
  storage.begin()
  job = process.Job([*ours(f'{size}Autockpt', '--autockpt_continuous', '--autockpt_keep_latest=1',
                          f'--autockpt_grace_secs={budget}'),
                     f'--job_log_dir={job_dir}'], os.path.join(storage.workdir, f'{name}.log'), env=storage.env())
  try:
    def in_flight():
      events = events_lib.read(job_dir)
      done = {e['step'] for e in events if e['event'] == 'save_committed'}
      started = [e['step'] for e in events if e['event'] == 'save_started' and e['reason'] == 'continuous']
      return started and done & set(started) and started[-1] not in done and started[-1]
    step = process.wait_until(in_flight, 'a continuous save in flight after one committed', 900, 0.05, job)
    sent = job.send(signal.SIGTERM)
    code = job.wait(900)
    took = time.time() - sent
  finally:
    job.kill()
  events = events_lib.read(job_dir)
  preemption = ([e for e in events if e['event'] == 'preemption'] or [{'step': None}])[-1]  # none: cut short
  replanned = [e for e in events if e['event'] == 'exit_replanned']
  plan = (replanned or [preemption])[-1]  # once the save in flight finished, the plan may have changed
  committed = {e['step']: e['duration_s'] for e in events if e['event'] == 'save_committed'}
  if preemption['step'] is None:
    measure.say(f'{name}: exit {code}, no preemption event; its last lines: '
                + ' | '.join(x[-200:] for x in job.log().splitlines() if '[autockpt]' in x)[-2000:])
  storage.clean(job_dir)
  saved = plan.get('saved_step')
  return dict(code=code, exit=took, in_flight=step, plan=plan.get('plan'), replanned=bool(replanned),
              agreed=preemption['step'], committed=saved if saved in committed else None,
              save_s=statistics.median(committed.values()))


def on_demand(storage: Storage, size: str, pairs: int, fmt: tuple[str, ...] = ()) -> list[Figure]:
  """The on-demand save after SIGTERM against the storage's own limit for the same bytes."""
  runs = [_on_demand_run(storage, size, i, fmt) for i in range(pairs)]
  save, blocked, exit_s, base, requests = ([r[k] for r in runs] for k in ('save', 'blocked', 'exit', 'base',
                                                                          'requests'))
  nbytes = runs[-1]['bytes']
  what = 'single-object upload' if storage.is_gcs else 'raw write + fsync'
  where = f'{size} ({nbytes / 1e6:.0f} MB), {storage.name}'
  figures = [Figure(f'on-demand save (start -> commit) vs {what}, {where}', 's', save, base, what),
             Figure(f'loop blocked by the on-demand save, {where}', 's', blocked),
             Figure(f'SIGTERM -> exit 143, {where}', 's', exit_s)]
  if storage.is_gcs:
    figures.append(Figure(f'storage requests of the run (restore + saves), {where}', 'requests', requests))
  return figures


def sigterm_vs_stock(storage: Storage, size: str, pairs: int) -> list[Figure]:
  """SIGTERM -> exit with the checkpoint committed: ours against stock paxml with the
  Autocheckpoint guide's two flags."""
  mine, theirs, codes = [], [], set()
  for i in range(pairs):
    a = measure.timed_run(storage, ours(f'{size}Autockpt'), f'vs-ours-{size}-{i}', train_secs=3, preempt=True)
    b = measure.timed_run(storage, stock(f'{size}Stock', _port_flag()), f'vs-stock-{size}-{i}', train_secs=3,
                          preempt=True)
    mine.append(a.sigterm_to_exit_s)
    theirs.append(b.sigterm_to_exit_s)
    codes.add((a.code, b.code))
    storage.clean(a.job_dir)
    storage.clean(b.job_dir)
    measure.say(f'SIGTERM -> exit {size} #{i}: ours {mine[-1]:.2f} s (exit {a.code}), stock {theirs[-1]:.2f} s '
                f'(exit {b.code})')
  return [Figure(f'SIGTERM -> exit, ours vs stock paxml (exit codes ours/stock {sorted(codes)}), {size}, '
                 f'{storage.name}', 's', mine, theirs, 'stock paxml')]


def _first_step_secs(storage: Storage, argv: list[str], name: str, job_dir: str) -> float:
  log = os.path.join(storage.workdir, f'{name}.log')
  job = process.Job([*argv, f'--job_log_dir={job_dir}'], log, env=storage.env())
  try:
    job.wait_for_log(measure.STEP_DONE, timeout=900)
    return time.time() - job.started
  finally:
    job.kill()


def restart(storage: Storage, pairs: int) -> list[Figure]:
  """Process start -> first step: a restart that restores against a fresh start."""
  fresh, again = [], []
  for i in range(pairs):
    job_dir = storage.job_dir(f'restart-{i}')
    fresh.append(_first_step_secs(storage, ours('TinyAutockpt'), f'restart-fresh-{i}', job_dir))
    again.append(_first_step_secs(storage, ours('TinyAutockpt'), f'restart-again-{i}', job_dir))
    storage.clean(job_dir)
    measure.say(f'first step #{i}: fresh {fresh[-1]:.1f} s, restart {again[-1]:.1f} s')
  return [Figure(f'restart -> first step vs fresh start, tiny, {storage.name}', 's', again, fresh, 'fresh start')]


def hook_cost(storage: Storage, pairs: int, secs: float) -> list[Figure]:
  """The hook's per-step cost when nothing is saved: ours against stock paxml, saving off."""
  mine, theirs = [], []
  for i in range(pairs):
    a = measure.timed_run(storage, ours('TinyAutockpt', *OFF), f'hook-ours-{i}', train_secs=secs, preempt=False)
    b = measure.timed_run(storage, stock('TinyStock', _port_flag(), *OFF), f'hook-stock-{i}', train_secs=secs,
                          preempt=False)
    mine.append(measure.mean_step_secs(a.log) * 1e3)
    theirs.append(measure.mean_step_secs(b.log) * 1e3)
    storage.clean(a.job_dir)
    storage.clean(b.job_dir)
    measure.say(f'hook #{i}: ours {mine[-1]:.3f} ms/step, stock {theirs[-1]:.3f} ms/step')
  return [Figure('step time with nothing saved, ours vs stock paxml, tiny', 'ms', mine, theirs, 'stock paxml')]


def _two_hosts_step_ms(storage: Storage, name: str, secs: float, *flags: str) -> float:
  job_dir = storage.job_dir(name)
  argv = [sys.executable, '-m', 'pax_autockpt.tools.cli', 'launch', '--num_hosts=2', '--',
          f'--exp={_B}TinyMultisliceRareSaves', f'--job_log_dir={job_dir}', *flags]
  job = process.Job(argv, os.path.join(storage.workdir, f'{name}.log'), env=storage.env())
  host0 = os.fspath(layout.host_log_path(job_dir, 0))
  try:
    process.wait_until(lambda: 'Step `3` completed' in process.text_of(host0), f'step 3 of {name}', 900, 0.5,
                       job)
    time.sleep(secs)
  finally:
    job.kill()
  step_ms = measure.mean_step_secs(open(host0, errors='replace').read()) * 1e3
  storage.clean(job_dir)
  return step_ms


def decision(storage: Storage, pairs: int, secs: float) -> list[Figure]:
  """Per-step cost of the multi-host save decision (primary decides, key-value store), 2 hosts,
  nothing saved: continuous with an unreachable minimum against Pax's never-due interval."""
  local, agreed = [], []
  for i in range(pairs):
    local.append(_two_hosts_step_ms(storage, f'decision-pax-{i}', secs))
    agreed.append(_two_hosts_step_ms(storage, f'decision-agreed-{i}', secs, '--autockpt_continuous',
                                     '--autockpt_min_interval_secs=1e9'))
    measure.say(f'decision #{i}: Pax interval {local[-1]:.2f} ms/step, primary decides {agreed[-1]:.2f} ms/step')
  return [Figure('step time, 2 hosts, primary-decides save decision vs Pax\'s local interval', 'ms', agreed, local,
                 'Pax interval')]


def _tiny_secs(storage: Storage, secs: float) -> float:
  """Training seconds for a continuous tiny run: on a bucket with added latency a save of the tiny state
  takes seconds (hundreds of requests), so the run is long enough for a few of them."""
  return max(secs, 60.0) if storage.latency_ms else secs


def _tiny_and_medium(storage: Storage, flags: tuple[str, ...], name: str, secs: float) -> tuple[dict, float]:
  """One continuous tiny run (its per-save figures) and one Medium on-demand save (its duration), with
  the same flags: the two runs every save-path comparison makes per arm."""
  run = measure.timed_run(storage, ours('TinyAutockpt', *CONTINUOUS, *flags), f'{name}-tiny',
                          train_secs=_tiny_secs(storage, secs), preempt=False)
  stats = _save_stats(run)
  storage.clean(run.job_dir)
  run = measure.timed_run(storage, ours('MediumAutockpt', *flags), f'{name}-medium', train_secs=3, preempt=True)
  step = [e['step'] for e in run.events if e['event'] == 'preemption'][0]
  saved = run.committed().get(step)
  storage.clean(run.job_dir)
  return stats, saved


def formats(storage: Storage, pairs: int, secs: float) -> list[Figure]:
  """zarr (a directory and files per array) against OCDBT (one key-value database per checkpoint):
  per continuous save of the tiny state (loop blocking, start -> commit, storage requests), and the
  Medium on-demand save."""
  arms = {'zarr': ('--tensorstore_use_ocdbt=false',), 'ocdbt': ('--tensorstore_use_ocdbt',)}
  keys = ('blocking_p50', 'duration_p50', 'requests')
  got = {arm: {k: [] for k in (*keys, 'medium')} for arm in arms}
  for i in range(pairs):
    for arm, flags in arms.items():
      stats, saved = _tiny_and_medium(storage, flags, f'fmt-{arm}-{i}', secs)
      for k in keys:
        got[arm][k].append(stats[k])
      got[arm]['medium'].append(saved)
      measure.say(f'format {arm} {storage.name} #{i}: tiny {stats}, Medium save {saved} s')
  where = storage.name
  figures = [Figure(f'{label}, OCDBT vs zarr, tiny, {where}', unit, got['ocdbt'][k], got['zarr'][k], 'zarr')
             for k, label, unit in (('blocking_p50', 'loop blocked per save P50', 'ms'),
                                    ('duration_p50', 'save start -> commit P50', 'ms'),
                                    ('requests', 'storage requests per save', 'requests'))
             if any(v is not None for v in got['zarr'][k])]
  return figures + [Figure(f'on-demand save, OCDBT vs zarr, Medium, {where}', 's', got['ocdbt']['medium'],
                           got['zarr']['medium'], 'zarr')]


# --- notices, checksums, the adaptive interval -----------------------------------------------------

_STEADY = {'Tiny': r'summary tensor at step=100 ', 'Medium': measure.STEP_DONE}


def notices(storage: Storage, size: str, pairs: int) -> list[Figure]:
  """Maintenance notice -> the notice save committed, while training goes on (fake metadata server)."""
  from pax_autockpt.shared import events as events_lib  # pylint: disable=g-import-not-at-top
  from rigs import fake_metadata  # pylint: disable=g-import-not-at-top
  took = []
  for i in range(pairs):
    with fake_metadata.FakeMetadataServer(os.path.join(storage.workdir, f'metadata-{i}')) as server:
      job_dir = storage.job_dir(f'notice-{size}-{i}')
      env = {**storage.env(), 'GCE_METADATA_HOST': server.host}
      argv = ours(f'{size}Autockpt', '--host_idx=0', '--num_hosts=1', _port_flag(), f'--job_log_dir={job_dir}')
      job = process.Job(argv, os.path.join(storage.workdir, f'notice-{size}-{i}.log'), env=env)
      try:
        job.wait_for_log(r'\[autockpt\] notices: watching', timeout=900)
        job.wait_for_log(_STEADY[size], timeout=900)
        time.sleep(2.0)
        sent = time.time()
        server.set('maintenance-event', 'TERMINATE_ON_HOST_MAINTENANCE')
        deadline = time.time() + 600
        while time.time() < deadline:
          evs = events_lib.read(job_dir)
          notice = next((e for e in evs if e['event'] == 'notice'), None)
          done = notice and next((e for e in evs if e['event'] == 'save_committed' and e['step'] == notice['step']),
                                 None)
          if done:
            took.append(done['t'] - sent)
            break
          time.sleep(0.02)
      finally:
        job.kill()
      storage.clean(job_dir)
    measure.say(f'notice {size} #{i}: committed {took[-1] if took else None} s after the notice')
  return [Figure(f'maintenance notice -> its save committed (training goes on), {size}, {storage.name}', 's',
                 took)]


def notices_startup(storage: Storage, pairs: int) -> list[Figure]:
  """Start -> first step with notices 'auto' where no metadata server answers, against 'off'."""
  auto, off = [], []
  for i in range(pairs):
    for flags, out in ((('--autockpt_notices=auto',), auto), (('--autockpt_notices=off',), off)):
      job_dir = storage.job_dir(f'nstart-{flags[0][-4:]}-{i}')
      out.append(_first_step_secs(storage, ours('TinyAutockpt', *flags), f'nstart-{flags[0][-4:]}-{i}', job_dir))
      storage.clean(job_dir)
    measure.say(f'start -> first step #{i}: notices auto {auto[-1]:.2f} s, off {off[-1]:.2f} s')
  return [Figure('start -> first step, notices auto (no metadata server) vs off, tiny', 's', auto, off, 'off')]


def checksums(storage: Storage, pairs: int, secs: float) -> list[Figure]:
  """The content manifest's cost: per save (tiny, continuous) and for the Medium on-demand save, with
  against without (verification at restore: `verification`)."""
  arms = {'on': (), 'off': ('--autockpt_checksums=false',)}
  blocking, duration, medium = {a: [] for a in arms}, {a: [] for a in arms}, {a: [] for a in arms}
  for i in range(pairs):
    for arm, flags in arms.items():
      stats, medium_s = _tiny_and_medium(storage, flags, f'ck-{arm}-{i}', secs)
      blocking[arm].append(stats['blocking_p50'])
      duration[arm].append(stats['duration_p50'])
      medium[arm].append(medium_s)
    measure.say(f'checksums #{i}: tiny blocked {blocking["on"][-1]} / {blocking["off"][-1]} ms, saved '
                f'{duration["on"][-1]} / {duration["off"][-1]} ms; Medium {medium["on"][-1]} / {medium["off"][-1]} s')
  figures = [Figure(f'loop blocked per save P50, checksums on vs off, tiny, {storage.name}', 'ms', blocking['on'],
                    blocking['off'], 'off'),
             Figure(f'save start -> commit P50, checksums on vs off, tiny, {storage.name}', 'ms', duration['on'],
                    duration['off'], 'off'),
             Figure(f'on-demand save, checksums on vs off, Medium, {storage.name}', 's', medium['on'], medium['off'],
                    'off')]
  return figures


def verification(storage: Storage, pairs: int) -> list[Figure]:
  """Restore + the manifest check against the restore alone, Medium and Large states."""
  return [_verify_vs_restore(storage, size, pairs) for size in ('Medium', 'Large')]


def _verify_vs_restore(storage: Storage, size: str, pairs: int) -> Figure:
  """Restore, then the manifest check, as the restarted process logs them."""
  verify_s, restore_s = [], []
  for i in range(pairs):
    first = measure.timed_run(storage, ours(f'{size}Autockpt'), f'vr-{size}-{i}', train_secs=2, preempt=True)
    again = measure.timed_run(storage, ours(f'{size}Autockpt'), f'vr-{size}-{i}-again', train_secs=0, preempt=True,
                              job_dir=first.job_dir)  # its own log: the first run's lines must not match
    restored = re.search(r'checkpoint \d+ restored in ([0-9.]+) s', again.log)
    checked = re.search(r'checked against the manifest in ([0-9.]+) s', again.log)
    restore_s.append(float(restored.group(1)) if restored else None)
    verify_s.append(float(checked.group(1)) if checked else None)
    storage.clean(first.job_dir)
    measure.say(f'restore {size} #{i}: {restore_s[-1]} s, verification {verify_s[-1]} s')
  return Figure(f'restore + verification vs restore alone, {size}, {storage.name}', 's',
                [r + v if r is not None and v is not None else None for r, v in zip(restore_s, verify_s)],
                restore_s, 'restore alone')


def adaptive(storage: Storage, pairs: int, mtbf_hours: float = 0.2) -> list[Figure]:
  """--autockpt_mtbf_hours on a whole tiny run: the interval it settled on against the Young/Daly optimum
  computed afterwards from the same run's measured save cost."""
  from pax_autockpt.tools import report  # pylint: disable=g-import-not-at-top
  ratio, interval = [], []
  for i in range(pairs):
    job_dir = storage.job_dir(f'adaptive-{i}')
    job = process.Job([*ours('TinyAutockpt', f'--autockpt_mtbf_hours={mtbf_hours}'), f'--job_log_dir={job_dir}'],
                      os.path.join(storage.workdir, f'adaptive-{i}.log'), env=storage.env())
    try:
      job.wait_for_log(measure.STEP_DONE, timeout=900)
      time.sleep(40)
    finally:
      job.kill()
    a = report.young_daly.adaptive(report.load(job_dir))
    ratio.append(a['ratio'])
    interval.append(a['interval_s'])
    storage.clean(job_dir)
    measure.say(f'adaptive #{i}: interval {a["interval_s"]} s, optimum afterwards {a["tau_opt_s"]} s')
  return [Figure(f'adaptive interval / Young-Daly optimum afterwards, MTBF {mtbf_hours} h, tiny, {storage.name}',
                 'x', ratio),
          Figure(f'adaptive interval at the end, MTBF {mtbf_hours} h, tiny, {storage.name}', 's', interval)]
def decision_scale(pairs: int, clients: tuple[int, ...] = (8, 32, 128, 512, 1024)) -> list[Figure]:
  """The primary-decides protocol at many hosts, without a model (rigs.decision_sim): the
  decision latency a step pays and the coordinator's CPU per step, exchanging the decision every step
  (the protocol before) against every `decision_interval(hosts)` steps (now), both above the floor of
  hosts that decide alone (this machine's own thread wake-up jitter, which has nothing to do with the
  protocol). Rounds alternate the arms at each client count."""
  from pax_autockpt.hosts import agreement  # pylint: disable=g-import-not-at-top
  from rigs import decision_sim  # pylint: disable=g-import-not-at-top
  arms = {'floor': 0, 'before': 1, 'now': None}
  got = {(n, a): [] for n in clients for a in arms}
  for i in range(pairs):
    for n in clients:
      for arm, interval in arms.items():
        got[n, arm].append(decision_sim.measure(n, interval=interval))
        r = got[n, arm][-1]
        measure.say(f'decision_scale #{i} {n} hosts {arm} (interval {r.interval}): {r.latency_ms_per_step:.2f} '
                    f'ms/step, coordinator {r.coordinator_cpu_ms_per_step:.2f} ms CPU/step, hosts '
                    f'{r.hosts_cpu_pct:.0f}% CPU')
  figures = []
  for n in clients:
    figures += _decision_figures(n, agreement.decision_interval(n), got)
  return figures + _extrapolated(clients, got)


def _decision_figures(n: int, k: int, got: dict) -> list[Figure]:
  """Per client count: latency above the floor and coordinator CPU, now against before."""
  floor = [r.latency_ms_per_step for r in got[n, 'floor']]
  above = {a: [r.latency_ms_per_step - f for r, f in zip(got[n, a], floor)] for a in ('before', 'now')}
  cpu = {a: [r.coordinator_cpu_ms_per_step for r in got[n, a]] for a in ('before', 'now')}
  every = f'every {k} steps' if k > 1 else 'every step (unchanged)'
  return [
      Figure(f'{n} hosts: decision latency per step above the floor, exchange {every} vs every step', 'ms',
             above['now'], above['before'], 'every step'),
      Figure(f'{n} hosts: coordinator CPU per step, exchange {every} vs every step', 'ms', cpu['now'],
             cpu['before'], 'every step'),
      Figure(f'{n} hosts: latency of a step with an exchange P50, {every}', 'ms',
             [r.latency_ms_exchange_p50 for r in got[n, 'now']]),
      Figure(f'{n} hosts: floor: latency per step with nothing exchanged (hosts decide alone)', 'ms', floor),
      Figure(f'{n} hosts: simulated hosts\' own CPU during the loop (100 = one core), every step', '%',
             [r.hosts_cpu_pct for r in got[n, 'before']]),
  ]


def _extrapolated(clients: tuple[int, ...], got: dict, to: int = 1024) -> list[Figure]:
  """Per round, a least-squares line through the client counts below `to`, evaluated at `to` hosts."""
  from rigs import decision_sim  # pylint: disable=g-import-not-at-top
  fit = [n for n in clients if n < to]
  if len(fit) < 2:
    return []
  figures = []
  for arm, label in (('before', 'every step'), ('now', 'now')):
    rounds = range(len(got[fit[0], arm]))
    for field, name in (('latency_ms_per_step', 'decision latency per step'),
                        ('coordinator_cpu_ms_per_step', 'coordinator CPU per step')):
      values = [decision_sim.extrapolate([got[n, arm][i] for n in fit], field, to) for i in rounds]
      figures.append(Figure(f'{name} at {to} hosts, extrapolated from {fit[0]}-{fit[-1]}, exchange {label}',
                            'ms', values))
  return figures


_RESTORED = r'\[autockpt\] (?:local step|checkpoint) (\d+) restored in ([\d.]+) s'


def _local_flags(storage: Storage, name: str) -> tuple[str, ...]:
  folder = os.path.join(storage.workdir, f'{name}-local-{{host}}')
  return (f'--autockpt_local_dir={folder}', '--autockpt_local_min_interval_secs=1')


def _restorable(run_events: list[dict], job_dir: str, local: str | None) -> tuple[int, float]:
  """What a restart would restore after a kill (the newest committed step in either tier) and when that
  step was trained (its save's capture)."""
  job_dir_step = layout.newest_committed(layout.checkpoint_dir(job_dir))
  local_step = layout.local_committed_steps(local)[-1] if local and layout.local_committed_steps(local) else None
  step = max(s for s in (job_dir_step, local_step) if s is not None)
  if step == local_step:  # the index says when (on gs:// a killed process's last events may never upload)
    return step, local_format.read_index(layout.local_step_dir(local, step))['captured_at']
  captured = [e['t'] for e in run_events if e['event'] == 'save_started' and e['step'] == step]
  if not captured:
    raise RuntimeError(f'no save_started event of step {step} in {job_dir}: the kill came before its upload')
  return step, captured[0]


def _killed_and_restored(storage: Storage, size: str, name: str, secs: float, flags: tuple[str, ...],
                         local: str | None) -> dict:
  """Trains `secs` after the first step, SIGKILL (no signal, no save); the training time lost (the kill ->
  the capture of the step a restart restores), then that restart's restore time."""
  job_dir = storage.job_dir(name)
  storage.begin()
  job = process.Job([*ours(f'{size}Autockpt', *flags), f'--job_log_dir={job_dir}'],
                    os.path.join(storage.workdir, f'{name}.log'), env=storage.env())
  try:
    job.wait_for_log(measure.STEP_DONE, timeout=900)
    time.sleep(secs)
  finally:
    killed = time.time()
    job.kill()
  step, captured = _restorable(events_lib.read(job_dir), job_dir, local)
  again = process.Job([*ours(f'{size}Autockpt', *flags), f'--job_log_dir={job_dir}'],
                      os.path.join(storage.workdir, f'{name}-restart.log'), env=storage.env())
  try:
    restored = again.wait_for_log(_RESTORED, timeout=900)
  finally:
    again.kill()
  assert int(restored.group(1)) == step, (restored.group(0), step)
  storage.clean(job_dir)
  got = dict(lost=killed - captured, restore=float(restored.group(2)), step=step)
  measure.say(f'kill {name}: restorable step {step}, {got["lost"]:.2f} s of training lost, restored in '
              f'{got["restore"]:.3f} s')
  return got


def local_tier_kill(storage: Storage, size: str, pairs: int, secs: float = 30.0) -> list[Figure]:
  """An unplanned kill (SIGKILL, no save) after `secs` of training: the local tier every 1 s (Pax's
  interval saves to the job directory beside it) against continuous saving to the job directory only; then each
  restart's restore (the local tier's step from the local disk, the other's from the job directory). The figures'
  names keep 'bucket' (bench/results.json holds them by name; measured on gcs30, a bucket indeed)."""
  with_local, job_dir_only = [], []
  for i in range(pairs):
    name = f'local-{size}-{storage.name}-{i}'
    flags = _local_flags(storage, name)
    with_local.append(_killed_and_restored(storage, size, name, secs, flags,
                                           os.path.join(storage.workdir, f'{name}-local-0')))
    job_dir_only.append(_killed_and_restored(storage, size, f'jobdir-{size}-{storage.name}-{i}', secs,
                                             CONTINUOUS, None))
    for folder in (f'{name}-local-0',):
      shutil.rmtree(os.path.join(storage.workdir, folder), ignore_errors=True)
  where = f'{size}, {storage.name}'
  return [Figure(f'training lost on an unplanned kill, local tier every 1 s vs bucket-only continuous, {where}', 's',
                 [r['lost'] for r in with_local], [r['lost'] for r in job_dir_only], 'bucket-only continuous'),
          Figure(f'restore after the kill, local tier vs bucket, {where}', 's', [r['restore'] for r in with_local],
                 [r['restore'] for r in job_dir_only], 'bucket')]


_LOCAL_RATE = r'\[autockpt\] local tier: \d+ commit\(s\) in the last [\d.]+ s \(one every ([\d.]+) s\)'


def local_step_time(storage: Storage, pairs: int, secs: float) -> list[Figure]:
  """Step time with the local tier at its default cadence (no --autockpt_local_min_interval_secs: 20x the
  previous local save's duration, at least 1 s) against without (the tiny state; no job directory saves in either),
  and the interval between local commits the default gave (the log's 10 s summaries, median per run)."""
  on, off, every = [], [], []
  for i in range(pairs):
    name = f'localstep-{i}'
    local = (f'--autockpt_local_dir={os.path.join(storage.workdir, f"{name}-local-{{host}}")}',)
    for arm, flags, out in (('on', local, on), ('off', (), off)):
      run = measure.timed_run(storage, ours('TinyRareSavesAutockpt', *flags), f'{name}-{arm}', train_secs=secs,
                              preempt=False)
      out.append(measure.mean_step_secs(run.log) * 1e3)
      if arm == 'on':
        rates = [float(x) for x in re.findall(_LOCAL_RATE, run.log)[1:]]  # the first spans the compilation
        every.append(statistics.median(rates) if rates else float('nan'))
      storage.clean(run.job_dir)
    shutil.rmtree(os.path.join(storage.workdir, f'{name}-local-0'), ignore_errors=True)
    measure.say(f'local tier step time #{i}: default cadence {on[-1]:.3f} ms/step (a commit every {every[-1]:.2f} s), '
                f'off {off[-1]:.3f} ms/step')
  return [Figure(f'step time, local tier at its default cadence vs off, tiny, {storage.name}', 'ms', on, off, 'off'),
          Figure(f'interval between local commits at the default cadence, tiny, {storage.name}', 's', every)]


def orbax_floor(storage: Storage, pairs: int) -> list[Figure]:
  """A save's fixed cost against its floor: the tiny state's on-demand save (training stopped, raw chunks)
  against orbax 0.5.9 saving the same arrays alone in a fresh process (rigs/bench/orbax_floor.py: no
  Pax, no pax-autockpt), alternating. Local disk: the floor reads the arrays' shapes from the zarr step."""
  mine, floor = [], []
  for i in range(pairs):
    run = measure.timed_run(storage, ours('TinyAutockpt'), f'floor-tiny-{i}', train_secs=3, preempt=True)
    step = [e['step'] for e in run.events if e['event'] == 'preemption'][0]
    mine.append(run.committed()[step] * 1e3)
    alone = os.path.join(storage.workdir, f'floor-orbax-{i}')
    got = subprocess.run([sys.executable, '-m', 'rigs.bench.orbax_floor',
                          os.fspath(layout.step_dir(layout.checkpoint_dir(run.job_dir), step)), alone],
                         capture_output=True, text=True, timeout=600, check=True)
    out = json.loads(got.stdout.strip().splitlines()[-1])
    floor.append(out['median_ms'])
    storage.clean(run.job_dir)
    shutil.rmtree(alone, ignore_errors=True)
    measure.say(f'floor #{i}: our on-demand tiny save {mine[-1]:.1f} ms, orbax alone {floor[-1]:.1f} ms '
                f'({out["arrays"]} arrays, {out["bytes"] / 1e6:.1f} MB)')
  return [Figure(f'save start -> commit, tiny on-demand save vs orbax 0.5.9 alone (same arrays, raw chunks), '
                 f'{storage.name}', 'ms', mine, floor, 'orbax alone')]


# Where the signal finds the loop (pax_autockpt.shared.phases): SIGTERM -> exit with the trained step committed.
_ANYWHERE = {  # arm -> (flags, paced input variables, what the log shows before the signal)
    'steps': ((), {'TRAIN_SLEEP_S': 0.03}, r'\[PAX STATUS\]: Step `4` completed'),
    'eval': (('--eval_on_test',), {'TRAIN_SLEEP_S': 0.03, 'EVAL_SLEEP_S': 0.03}, r'Finished eval step 3 for'),
    'input': ((), {'TRAIN_BLOCK_AT': 60}, r'\[paced input\] TRAIN get_next blocks at call 60'),
}


def _sigterm_in(storage: Storage, arm: str, name: str) -> tuple[float, dict]:
  """One run of TinySlowEval (60 s of grace), SIGTERM 1 s after the arm's log line; (SIGTERM -> exit s, the
  preemption event). The exit must be 143 with the agreed step committed."""
  flags, paced, pattern = _ANYWHERE[arm]
  job_dir = storage.job_dir(name)
  env = {**storage.env(), **{f'AUTOCKPT_PACED_{k}': str(v) for k, v in paced.items()}}
  job = process.Job([*ours('TinySlowEval', '--autockpt_grace_secs=60', *flags), f'--job_log_dir={job_dir}'],
                    os.path.join(storage.workdir, f'{name}.log'), env=env)
  try:
    job.wait_for_log(pattern, timeout=600)
    time.sleep(1.0)
    sent = job.send(signal.SIGTERM)
    code = job.wait(120)
    took = time.time() - sent
  finally:
    job.kill()
  preemption = next(e for e in events_lib.read(job_dir) if e['event'] == 'preemption')
  if code != 143 or preemption['saved_step'] not in layout.committed_steps(layout.checkpoint_dir(job_dir)):
    raise RuntimeError(f'{name}: exit {code}, preemption {preemption}')
  storage.clean(job_dir)
  return took, preemption


def sigterm_anywhere(storage: Storage, pairs: int) -> list[Figure]:
  """SIGTERM -> exit (the trained step committed, exit 143) when the signal finds the loop in a 2-minute eval (the
  eval cut at the next batch) or with its train input blocked (the step saved from another thread after
  rescue.RESCUE_AFTER_SECS), each against a signal between training steps, in alternation; the tiny model,
  60 s of grace."""
  secs = {arm: [] for arm in _ANYWHERE}
  for i in range(pairs):
    for arm in _ANYWHERE:
      took, event = _sigterm_in(storage, arm, f'anywhere-{arm}-{i}')
      secs[arm].append(took)
      measure.say(f'SIGTERM during {arm} #{i}: exit {took:.2f} s (agreed {event.get("agreed_during")}, '
                  f'step {event["step"]})')
  return [Figure('SIGTERM -> exit, the signal during a 2-minute eval vs between training steps, tiny, '
                 f'{storage.name}', 's', secs['eval'], secs['steps'], 'between training steps'),
          Figure('SIGTERM -> exit, the train input blocked (saved from another thread) vs between training steps, '
                 f'tiny, {storage.name}', 's', secs['input'], secs['steps'], 'between training steps')]
