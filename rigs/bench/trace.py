"""`goodputtrace_<size>`: goodput under one seeded failure trace, stock paxml and pax-autockpt side by side.

Every figure elsewhere in the bench isolates one mechanism; this one asks what a user gets: the same failures,
at the same moments, hit a stock job and ours, and we count the steps each one ends with.

The trace. Over a wall-clock window W (default 400 s; `AUTOCKPT_BENCH_TRACE_WINDOW_S`) with a mean time between
failures M (default 400 s; `AUTOCKPT_BENCH_TRACE_MTBF_S`), round(W / M) failures (at least one) come at uniform
random times, where a Poisson process of rate 1/M puts its failures once their count is given, each of a kind the
seeded RNG picks: 'preemption' (SIGTERM, then 30 s of grace before SIGKILL), 'crash' (SIGKILL), 'replaced VM'
(SIGKILL and the host's local directory gone; on the arms without a local tier the same as a crash). The trace
(times and kinds) is made once per seed (0 and 1; `AUTOCKPT_BENCH_TRACE_SEEDS=0` for one) and replayed
identically on every arm. A failure never strikes before the current run's first trained step + 5 s (GUARD_S): a
failure inside a start-up is rare when failures are hours apart; a failure whose time has passed waits for that
moment. After each failure the same command starts again at once, as a scheduler would (stock gets a new
coordinator port each time). At W the job gets SIGTERM, 30 s to exit, then SIGKILL; then we count.

The ratios are a TPU job's, scaled down: M is ~18x our restart (failure -> first step ~22 s with the compilation
cache) and ~11x stock's (33-41 s), below a TPU job's 20-50x, and Pax's interval (4,000 steps, ~60-100 s) is ~M/5, as
a job that saves every two hours against a failure every ten. A window of one MTBF holds one failure per seed: two
seeds and two passes give each arm four windows, ~2 h for the whole bench on this machine. Each figure is therefore
one failure's cost, paired across arms (the same failure at the same moment), not an average over many failures.

Arms, each on the tiny model with Pax's interval every 4,000 steps (~60-100 s here;
experiments.bench.TinyTraceStock / TinyTraceAutockpt):
- `stock`: stock paxml 1.4.0 main.py with the Autocheckpoint guide's two flags (`--jax_fully_async_checkpoint
  --exit_after_ondemand_checkpoint`), the interval saves;
- `ours_jobdir`: `python -m pax_autockpt.main`: the interval saves and the on-demand save on SIGTERM;
- `ours_continuous`: + `--autockpt_continuous --autockpt_keep_latest=3`;
- `ours_local`: ours_jobdir + `--autockpt_local_dir=<dir>/local-{host}` at its default cadence;
- `undisturbed`: stock with no failure over the same window: the denominator.
Our arms get `--autockpt_grace_secs=30`, the grace the trace gives.

The figure per arm: the steps in the lineage the job ends with (the newest committed step a restart would restore:
the job directory's, or the local tier's if newer; the final on-demand save of our arms is committed at exit) /
W, against the undisturbed run's (its newest committed step / W) of the same pass: the ratio is the goodput.
Per arm too: steps lost (trained, then not in the lineage: per run, its last trained step from Pax's log less
the step the next run restored) and restart time (each failure's end -> the restarted run's first step), our arms
against stock; and for our arms the measured badput from the event log (pax_autockpt.tools.report.measured):
restarts (start-up + restore + first-step preparation), wasted progress, save blocking. And the failures each
arm was struck by inside W: one that waits for a slow start-up can fall past W, so the count can differ.

A pass runs undisturbed once, then per seed stock, ours_jobdir, ours_continuous, ours_local (reversed on odd
passes); `--pairs` passes. About 9 x (W + ~15 s) per pass: ~1 h at W = 400 s. A short check (one seed, W 150 s,
~10 minutes; W must exceed a start-up, which on a loaded 2-CPU machine can take 60-90 s):

  AUTOCKPT_BENCH_TRACE_WINDOW_S=150 AUTOCKPT_BENCH_TRACE_MTBF_S=150 AUTOCKPT_BENCH_TRACE_SEEDS=0 \
    python -m rigs.bench --only goodputtrace_Tiny --pairs 1 --out /tmp/tracebench
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import shutil
import signal
import subprocess
import time
from typing import Callable

from pax_autockpt import layout
from pax_autockpt.tools import process
from rigs.bench import measure
from rigs.bench import scenarios
from rigs.bench.measure import Figure
from rigs.bench.measure import Storage

WINDOW_S = 400.0
MTBF_S = 400.0
GUARD_S = 5.0
GRACE_S = 30.0
SEEDS = (0, 1)
KINDS = ('preemption', 'crash', 'replaced VM')
ARMS = ('stock', 'ours_jobdir', 'ours_continuous', 'ours_local', 'undisturbed')
TRACED = ARMS[:-1]  # the arms the trace strikes; 'undisturbed' runs once per pass, the denominator
EXPERIMENTS = {'Tiny': ('TinyTraceStock', 'TinyTraceAutockpt')}
RATE_EVERY = 10  # Pax logs 'steps/sec' at every step divisible by 10

_FIRST = re.compile(r'\[PAX STATUS\]: Step `(\d+)` completed')
_EXACT = re.compile(r'\[PAX STATUS\]: Step `(\d+)` completed|Metrics values at step (\d+):'
                    r'|Saving checkpoint at step (\d+) due to preemption')
_RATE = re.compile(r'steps/sec: [0-9.]+')


@dataclasses.dataclass(frozen=True)
class Failure:
  t: float   # seconds into the window
  kind: str  # one of KINDS


def failure_trace(seed: int, window_s: float = WINDOW_S, mtbf_s: float = MTBF_S) -> list[Failure]:
  """The seed's failures in [0, window_s): round(window_s / mtbf_s) of them (at least one) at uniform random
  times, where a Poisson process of mean gap mtbf_s puts its failures once their count is given, a kind each; the
  same for every arm. The count is fixed so that a window a few MTBFs long is never empty by chance (an
  exponential draw leaves a one-MTBF window empty 37% of the time)."""
  rng = random.Random(seed)
  count = max(1, round(window_s / mtbf_s))
  times = sorted(rng.uniform(0.0, window_s) for _ in range(count))
  return [Failure(round(t, 3), rng.choice(KINDS)) for t in times]


def due(failure_t: float, first_step_t: float, guard_s: float = GUARD_S) -> float:
  """When a failure strikes: at its time in the trace, but not before the current run's first step + guard_s
  (see the module docstring)."""
  return max(failure_t, first_step_t + guard_s)


def restored_step(log_text: str) -> int | None:
  """The step a run started from: Pax's first 'Step `N` completed' names it (0 for a fresh start)."""
  m = _FIRST.search(log_text)
  return int(m.group(1)) if m else None


def last_step(log_text: str) -> int | None:
  """The last step a run trained, from Pax's log: the newest line that names a step exactly (its first 5 steps,
  the summaries every 100 steps, a save on preemption), then one more multiple of RATE_EVERY per 'steps/sec'
  line after it. Stock paxml writes no event log; this reads both kinds of run the same way."""
  anchors = list(_EXACT.finditer(log_text))
  if not anchors:
    return None
  m = anchors[-1]
  step = int(m.group(1)) + 1 if m.group(1) is not None else int(m.group(2) or m.group(3))
  rates = len(_RATE.findall(log_text, m.end()))
  return (step // RATE_EVERY + rates) * RATE_EVERY if rates else step


@dataclasses.dataclass
class Segment:
  """One process of an arm's job, times in seconds into the window."""

  started: float
  restored: int = 0                 # the step it started from
  first_step: float | None = None   # its first step's log line (None: it never got there)
  ended: float | None = None        # the failure (or the window's end) that ended it, once it had gone
  last_step: int = 0                # the last step it trained
  how: str = ''                     # the failure kind, 'exited' (by itself) or 'end'
  code: int | None = None


def lost_steps(segments: list[Segment], final_step: int) -> int:
  """Steps trained but not in the lineage the job ends with: per run, its last trained step less the step the
  next run restored (the last run: less the final step), never below 0."""
  nexts = [s.restored for s in segments[1:]] + [final_step]
  return sum(max(0, s.last_step - n) for s, n in zip(segments, nexts))


def restart_secs(segments: list[Segment]) -> float:
  """Per restart, the previous process's end -> this one's first step (or its end, if it never got there)."""
  return sum((b.first_step if b.first_step is not None else b.ended) - a.ended
             for a, b in zip(segments, segments[1:]))


def badput(measured) -> dict[str, float] | None:
  """Our arms' split from the event log (report.measured.Measured): restarts (the time between runs, the restores,
  the first step's preparation), wasted progress, save blocking; None without a measurement."""
  if measured is None or not measured.seconds:
    return None
  s = measured.seconds
  restarts = sum(s[k] for k in ('start_up', 'checkpoint_restore', 'idle_between_runs', 'between_runs',
                                'training_prep'))
  return dict(restarts=restarts, lost=s['wasted_progress'], save=s['checkpoint_save'], goodput=measured.goodput)


class _Job:
  """One arm's job over the window: started, struck, restarted and ended as the trace says."""

  def __init__(self, storage: Storage, argv: Callable[[], list[str]], name: str, local: str | None):
    self.storage, self.argv, self.name, self.local = storage, argv, name, local
    self.job_dir = storage.job_dir(name)
    self.segments: list[Segment] = []
    self.job: process.Job | None = None
    self.t0: float | None = None

  def now(self) -> float:
    return time.time() - self.t0

  def restorable(self) -> int:
    """The newest committed step a restart restores: the job directory's, or the local tier's if newer."""
    steps = [layout.newest_committed(layout.checkpoint_dir(self.job_dir))]
    if self.local and layout.local_committed_steps(self.local):
      steps.append(layout.local_committed_steps(self.local)[-1])
    return max((s for s in steps if s is not None), default=0)

  def start(self) -> None:
    if self.t0 is None:
      self.t0 = time.time()
    log = os.path.join(self.storage.workdir, f'{self.name}-{len(self.segments)}.log')
    restored = self.restorable()
    self.job = process.Job([*self.argv(), f'--job_log_dir={self.job_dir}'], log, env=self.storage.env())
    self.segments.append(Segment(started=self.now(), restored=restored))

  def first_step(self, window_s: float) -> float | None:
    """Waits for the current run's first step (seconds into the window); None once the window is over. A run
    that exits by itself is restarted at once, as a scheduler would."""
    seg = self.segments[-1]
    while seg.first_step is None:
      if _FIRST.search(self.job.log()):
        seg.first_step = self.now()
      elif self.job.proc.poll() is not None:
        self._ended('exited', self.job.proc.returncode)
        self.start()
        seg = self.segments[-1]
      elif self.now() >= window_s:
        return None
      else:
        time.sleep(0.1)
    return seg.first_step

  def strike(self, kind: str) -> None:
    """SIGTERM and GRACE_S to exit ('preemption' and the window's end), else SIGKILL at once; a replaced VM
    loses the host's local directory. The window's end ends the run at the SIGTERM: its grace is past W."""
    code, sent = None, self.now()
    if kind in ('preemption', 'end'):
      self.job.send(signal.SIGTERM)
      try:
        code = self.job.proc.wait(GRACE_S)
      except subprocess.TimeoutExpired:
        pass
    self.job.kill()
    if kind == 'replaced VM' and self.local:
      shutil.rmtree(self.local, ignore_errors=True)
    self._ended(kind, code if code is not None else self.job.proc.returncode, sent if kind == 'end' else None)

  def _ended(self, how: str, code: int | None, at: float | None = None) -> None:
    seg, text = self.segments[-1], self.job.log()
    seg.ended, seg.how, seg.code = self.now() if at is None else at, how, code
    got = restored_step(text)
    seg.restored = got if got is not None else seg.restored
    seg.last_step = max(seg.restored, last_step(text) or 0)


def replay(job: _Job, trace: list[Failure], window_s: float) -> list[tuple[float, str]]:
  """Runs the job over the window, striking it as the trace says; returns the failures struck (time, kind)."""
  struck = []
  job.start()
  for failure in trace:
    first = job.first_step(window_s)
    if first is None:
      break
    at = due(failure.t, first)
    if at >= window_s:
      break
    time.sleep(max(0.0, at - job.now()))
    job.strike(failure.kind)
    struck.append((round(job.now(), 1), failure.kind))
    job.start()
  job.first_step(window_s)  # the last restart's first step too (else its restart would count until W)
  time.sleep(max(0.0, window_s - job.now()))
  job.strike('end')
  return struck


def _argv(arm: str, size: str, local: str) -> Callable[[], list[str]]:
  """The arm's command; stock's names a new coordinator port at each start."""
  stock_exp, ours_exp = EXPERIMENTS[size]
  ours = ('--autockpt_grace_secs=30',)
  flags = {'ours_jobdir': ours, 'ours_continuous': (*ours, *scenarios.CONTINUOUS),
           'ours_local': (*ours, f'--autockpt_local_dir={local}-{{host}}')}
  if arm in ('stock', 'undisturbed'):
    return lambda: scenarios.stock(stock_exp, scenarios._port_flag())  # pylint: disable=protected-access
  return lambda: scenarios.ours(ours_exp, *flags[arm])


def run_arm(storage: Storage, arm: str, size: str, trace: list[Failure], window_s: float, name: str) -> dict:
  """One arm over the window: the lineage it ends with, steps lost, restart time, our event log's badput."""
  from pax_autockpt.tools import report  # pylint: disable=g-import-not-at-top
  from pax_autockpt.tools.report import measured  # pylint: disable=g-import-not-at-top
  local = os.path.join(storage.workdir, f'{name}-local')
  job = _Job(storage, _argv(arm, size, local), name, f'{local}-0' if arm == 'ours_local' else None)
  struck = replay(job, [] if arm == 'undisturbed' else trace, window_s)
  final = job.restorable()
  split = None
  if arm.startswith('ours'):
    try:
      split = badput(measured.measure(report.load(job.job_dir)))
    except report.ReportError as e:
      measure.say(f'{name}: no measured badput: {e}')
  storage.clean(job.job_dir)
  shutil.rmtree(f'{local}-0', ignore_errors=True)
  return dict(final=final, rate=final / window_s, struck=struck, n_struck=len(struck),
              lost=lost_steps(job.segments, final), restarts=restart_secs(job.segments), runs=len(job.segments),
              split=split, codes=[s.code for s in job.segments])


def _setting(name: str, default: float) -> float:
  return float(os.environ.get(f'AUTOCKPT_BENCH_TRACE_{name}', default))


def goodput_trace(storage: Storage, size: str, pairs: int, window_s: float | None = None,
                  mtbf_s: float | None = None) -> list[Figure]:
  """`pairs` passes; per pass the undisturbed window once, then per seed every arm over the same trace, the arms
  in reverse order on odd passes so that a drift of the machine's speed does not favour one (see the module
  docstring)."""
  if size not in EXPERIMENTS:
    raise SystemExit(f'error: goodputtrace_{size}: sizes {sorted(EXPERIMENTS)}')
  window_s = window_s or _setting('WINDOW_S', WINDOW_S)
  mtbf_s = mtbf_s or _setting('MTBF_S', MTBF_S)
  seeds = [int(x) for x in os.environ.get('AUTOCKPT_BENCH_TRACE_SEEDS', ','.join(map(str, SEEDS))).split(',')]
  traces = {seed: failure_trace(seed, window_s, mtbf_s) for seed in seeds}
  got = {(seed, arm): [] for seed in seeds for arm in ARMS}
  for i in range(pairs):
    base = run_arm(storage, 'undisturbed', size, [], window_s, f'trace-undisturbed-{i}')
    measure.say(f'trace undisturbed #{i}: {base["final"]} steps ({base["rate"]:.1f} steps/s), codes {base["codes"]}')
    for seed, trace in traces.items():
      got[seed, 'undisturbed'].append(base)
      measure.say(f'trace seed {seed}: ' + ', '.join(f'{f.kind} at {f.t:.1f} s' for f in trace))
      for arm in (TRACED if i % 2 == 0 else TRACED[::-1]):
        r = run_arm(storage, arm, size, trace, window_s, f'trace-{seed}-{arm}-{i}')
        got[seed, arm].append(r)
        measure.say(f'trace seed {seed} {arm} #{i}: lineage {r["final"]} steps ({r["rate"]:.1f} steps/s), '
                    f'{r["runs"]} runs, struck {r["struck"]}, lost {r["lost"]} steps, restarts {r["restarts"]:.1f} s, '
                    f'exit codes {r["codes"]}, measured {r["split"]}')
      measure.say(f'trace seed {seed} #{i}: goodput ' + ', '.join(
          f'{a} {got[seed, a][-1]["rate"] / base["rate"]:.2f}' if base['rate'] else f'{a} -' for a in TRACED))
  where = f'{size}, W {window_s:.0f} s, MTBF {mtbf_s:.0f} s, {storage.name}'
  return [f for seed in seeds for f in _figures(got, seed, traces[seed], where)]


def _figures(got: dict, seed: int, trace: list[Failure], where: str) -> list[Figure]:
  """Per arm: its lineage rate against undisturbed stock's (the ratio is the goodput), steps lost and restart
  time against stock's, and our arms' measured badput."""
  kinds = ', '.join(f'{sum(f.kind == k for f in trace)} {k}' for k in KINDS)
  label = f'trace seed {seed} ({len(trace)} failures: {kinds}), {where}'
  per = lambda arm, key: [r[key] for r in got[seed, arm]]
  split = lambda arm, key: [r['split'][key] if r['split'] else None for r in got[seed, arm]]
  base = per('undisturbed', 'rate')
  figures = [Figure(f'goodput: lineage steps / W, {arm} vs undisturbed stock, {label}', 'steps/s', per(arm, 'rate'),
                    base, 'undisturbed stock') for arm in TRACED]
  figures += [Figure(f'failures struck inside W (one waits for its run\'s first step + {GUARD_S:g} s), {arm}, '
                     f'{label}', 'failures', per(arm, 'n_struck')) for arm in TRACED]
  for arm in TRACED[1:]:
    figures += [Figure(f'steps lost (trained, not in the final lineage), {arm} vs stock, {label}', 'steps',
                       per(arm, 'lost'), per('stock', 'lost'), 'stock'),
                Figure(f'restarts (failure -> first step), {arm} vs stock, {label}', 's', per(arm, 'restarts'),
                       per('stock', 'restarts'), 'stock')]
    figures += [Figure(f'measured {what} (event log), {arm}, {label}', 's', split(arm, key))
                for key, what in (('restarts', 'restarts: start-up + restore + first step'),
                                  ('lost', 'wasted progress'), ('save', 'save blocking'))]
  return figures
