"""`goodputtrace_harsh`: goodput when failures come faster than a restart finishes compiling (issue 58).

trace.py's gentle trace strikes once per ~18 restart times and never inside a start-up. Spot capacity and large
slices meet harsher regimes, where the next failure comes before the restarted job has finished compiling. Here
the failures come every 1.5-2x the restart R measured at the start of each pass (`measured_restart`: ours, kill ->
first step with the compilation cache filled, the machine as loaded as it is then), and strike wherever the job
is (no guard): a run may never reach its first step. First a SIGTERM during the job's very first compile, which no
cache holds yet (COMPILE_INTO_S after the first run's 'Compiling _wrapped_step_fn' line), then, each a seeded gap
after the previous one: a SIGKILL, a SIGKILL with the host's local directory gone, a SIGKILL, a SIGTERM, and again.
The gaps are the same for every arm of a pass. A SIGTERM leaves the run GRACE_S (Cloud TPU's 300 s; ours keep
their default --autockpt_grace_secs=300) unless the next failure comes first; a run that exits is restarted at once.
At W = max(WINDOW_S, WINDOW_RESTARTS x R) the job gets SIGTERM, 30 s, SIGKILL; then we count.

Arms (trace.py's experiments, Pax's interval every 4,000 steps): `stock` (paxml's main.py with the guide's two
flags), `ours_jobdir` (pax_autockpt.main), `ours_local` (+ the local tier at its default cadence), `undisturbed`
(stock, no failure: the denominator). Per arm: goodput (lineage steps / W against undisturbed's), runs, runs that
trained a step, and the train step's compiles per window, read from each run's log (every arm runs with
--jax_log_compiles and JAX's compiler debug log): `paid` (completed compiles: finished, not a cache hit),
`dropped` (begun, never finished: the run was killed, or exited, during it).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import shutil
import signal
import time

from rigs.bench import measure
from rigs.bench import scenarios
from rigs.bench import trace
from rigs.bench.measure import Figure
from rigs.bench.measure import Storage

WINDOW_S = 180.0
WINDOW_RESTARTS = 7.0
GAP = (1.5, 2.0)  # a failure every GAP x RESTART_S
GRACE_S = 300.0
COMPILE_INTO_S = 5.0
COMPILE_SIGTERM = 'SIGTERM in the first compile'
KINDS = (COMPILE_SIGTERM, 'crash', 'replaced VM', 'crash', 'preemption')
ARMS = ('stock', 'ours_jobdir', 'ours_local')
LOG_FLAGS = ('--jax_log_compiles', '--jax_debug_log_modules=jax._src.compiler')
_BEGUN = re.compile(r'Compiling _wrapped_step_fn ')
_FINISHED = re.compile(r'Finished XLA compilation of pjit\(_wrapped_step_fn\)')
_HIT = re.compile(r"Persistent compilation cache hit for 'pjit__wrapped_step_fn'")
_HIT_DEBUG = re.compile(r"^DEBUG:.*Persistent compilation cache hit for 'pjit__wrapped_step_fn'", re.M)


def harsh_trace(window_s: float, restart_s: float, seed: int = 0) -> list[trace.Failure]:
  """First a SIGTERM into the job's first compile (`t` 0: it waits for the compile), then failures of the other
  KINDS in their order, each `t` seconds after the previous one (uniform in GAP x restart_s), enough to fill
  window_s."""
  rng, total, out = random.Random(seed), 0.0, [trace.Failure(0.0, COMPILE_SIGTERM)]
  while total < window_s:
    gap = round(rng.uniform(*GAP) * restart_s, 3)
    total += gap
    out.append(trace.Failure(gap, KINDS[1:][(len(out) - 1) % (len(KINDS) - 1)]))
  return out


def measured_restart(storage: Storage, name: str) -> float:
  """Ours' restart as the trace's arms meet it: a fresh job to its first step (which fills the compilation
  cache), SIGKILL, the same command again: kill -> its first step (seconds)."""
  job = trace._Job(storage, _argv('ours_jobdir', ''), name, None)  # pylint: disable=protected-access
  job.start()
  job.first_step(float('inf'))
  time.sleep(2.0)
  job.job.kill()
  killed = time.time()
  job.start()
  job.first_step(float('inf'))
  job.job.kill()
  storage.clean(job.job_dir)
  return time.time() - killed


def compiles(log_text: str) -> dict[str, int]:
  """The train step's compiles in one run's log: `paid` (finished, not loaded from the cache), `dropped` (begun,
  never finished). The eval step on the train input shares the train step's name: both count. A hit is logged
  twice, by absl's handler and by the handler JAX's debug flag adds ('DEBUG:...'): counted once."""
  begun, finished, every_hit, debug_hits = (len(r.findall(log_text)) for r in (_BEGUN, _FINISHED, _HIT, _HIT_DEBUG))
  hits = max(debug_hits, every_hit - debug_hits)
  return dict(paid=max(0, finished - hits), dropped=max(0, begun - finished))


@dataclasses.dataclass
class _Harsh:
  """One arm's job under the harsh trace: SIGTERMs do not block the replay (the next failure may come first)."""

  job: trace._Job  # pylint: disable=protected-access
  kill_at: float | None = None  # a SIGTERM's grace ends: SIGKILL

  def tick(self, until: float) -> None:
    """Until `until` (seconds into the window): a run that exited restarts at once; a grace that ran out kills."""
    while self.job.now() < until:
      if self.job.job.proc.poll() is not None:
        self.job._ended('exited', self.job.job.proc.returncode)  # pylint: disable=protected-access
        self.kill_at = None
        self.job.start()
      elif self.kill_at is not None and self.job.now() >= self.kill_at:
        self.kill('grace over')
      time.sleep(0.1)

  def kill(self, how: str) -> None:
    self.job.job.kill()
    self.job._ended(how, self.job.job.proc.returncode)  # pylint: disable=protected-access
    self.kill_at = None
    self.job.start()

  def compile_began(self, window_s: float) -> float:
    """When the current run began compiling its train step (JAX's 'Compiling _wrapped_step_fn'); waits for it
    (restarts included), at most until the window's end."""
    while not _BEGUN.search(self.job.job.log()) and self.job.now() < window_s:
      self.tick(self.job.now() + 0.2)
    return self.job.now()

  def strike(self, kind: str) -> None:
    if kind in (COMPILE_SIGTERM, 'preemption'):
      self.job.job.send(signal.SIGTERM)
      self.kill_at = self.job.now() + GRACE_S
      self.job.segments[-1].how = kind
      return
    if kind == 'replaced VM' and self.job.local:
      self.job.job.kill()
      shutil.rmtree(self.job.local, ignore_errors=True)
    self.kill(kind)


def replay(arm: _Harsh, failures: list[trace.Failure], window_s: float) -> list[tuple[float, str]]:
  """Strikes each failure its gap after the previous one (the first: in the first compile)."""
  struck, previous = [], 0.0
  arm.job.start()
  for failure in failures:
    at = previous + failure.t
    if failure.kind == COMPILE_SIGTERM:
      at = arm.compile_began(window_s) + COMPILE_INTO_S
    arm.tick(min(at, window_s))
    if at >= window_s:
      break
    arm.strike(failure.kind)
    previous = at
    struck.append((round(arm.job.now(), 1), failure.kind))
  arm.tick(window_s)
  arm.job.strike('end')
  return struck


def _argv(arm: str, local: str):
  """trace.py's commands, but ours keep the default grace period (300 s, as the trace's SIGTERMs give)."""
  stock_exp, ours_exp = trace.EXPERIMENTS['Tiny']
  if arm in ('stock', 'undisturbed'):
    return lambda: scenarios.stock(stock_exp, scenarios._port_flag())  # pylint: disable=protected-access
  flags = (f'--autockpt_local_dir={local}-{{host}}',) if arm == 'ours_local' else ()
  return lambda: scenarios.ours(ours_exp, *flags)


def run_arm(storage: Storage, arm: str, failures: list[trace.Failure], window_s: float, name: str) -> dict:
  local = os.path.join(storage.workdir, f'{name}-local')
  argv = _argv(arm, local)
  job = trace._Job(storage, lambda: [*argv(), *LOG_FLAGS], name, f'{local}-0' if arm == 'ours_local' else None)  # pylint: disable=protected-access
  struck = replay(_Harsh(job), failures, window_s)
  final = job.restorable()
  logs = [os.path.join(storage.workdir, f'{name}-{i}.log') for i in range(len(job.segments))]
  counted = [compiles(open(p, errors='replace').read()) for p in logs if os.path.exists(p)]
  storage.clean(job.job_dir)
  shutil.rmtree(f'{local}-0', ignore_errors=True)
  return dict(final=final, rate=final / window_s, struck=struck, runs=len(job.segments),
              trained=sum(s.first_step is not None or s.last_step > s.restored for s in job.segments),
              paid=sum(c['paid'] for c in counted), dropped=sum(c['dropped'] for c in counted),
              codes=[s.code for s in job.segments])


def goodput_harsh(storage: Storage, pairs: int) -> list[Figure]:
  """`pairs` passes: undisturbed once, then the arms (reversed on odd passes) over the same failures."""
  got = {arm: [] for arm in (*ARMS, 'undisturbed', 'restart')}
  for i in range(pairs):
    restart_s = measured_restart(storage, f'harsh-restart-{i}')
    window_s = max(WINDOW_S, WINDOW_RESTARTS * restart_s)
    failures = harsh_trace(window_s, restart_s, seed=i)
    measure.say(f'harsh #{i}: restart {restart_s:.1f} s, W {window_s:.0f} s: ' + ', '.join(
        f'{f.kind} {f.t:.1f} s after the previous' for f in failures))
    got['restart'].append(dict(restart=restart_s, window=window_s, n=len(failures)))
    base = run_arm(storage, 'undisturbed', [], window_s, f'harsh-undisturbed-{i}')
    got['undisturbed'].append(base)
    for arm in (ARMS if i % 2 == 0 else ARMS[::-1]):
      r = run_arm(storage, arm, failures, window_s, f'harsh-{arm}-{i}')
      got[arm].append(r)
      measure.say(f'harsh {arm} #{i}: lineage {r["final"]} steps (undisturbed {base["final"]}), goodput '
                  f'{r["rate"] / base["rate"] if base["rate"] else 0:.3f}, {r["runs"]} runs ({r["trained"]} trained), '
                  f'train-step compiles paid {r["paid"]}, dropped {r["dropped"]}, struck {r["struck"]}, '
                  f'codes {r["codes"]}')
  return _figures(got, storage.name)


def _figures(got: dict, where: str) -> list[Figure]:
  label = (f'harsh trace (a failure every {GAP[0]:g}-{GAP[1]:g}x the measured restart, first a SIGTERM in the first '
           f'compile; W = max({WINDOW_S:.0f} s, {WINDOW_RESTARTS:g} restarts)), Tiny, {where}')
  per = lambda arm, key: [r[key] for r in got[arm]]
  figures = [Figure(f'restart measured for the trace (kill -> first step, ours, cache filled), {label}', 's',
                    per('restart', 'restart')),
             Figure(f'window W, {label}', 's', per('restart', 'window'))]
  figures += [Figure(f'goodput: lineage steps / W, {arm} vs undisturbed stock, {label}', 'steps/s', per(arm, 'rate'),
                     per('undisturbed', 'rate'), 'undisturbed stock') for arm in ARMS]
  for arm in ARMS:
    figures += [Figure(f'train-step compiles paid (finished, not from the cache) per window, {arm}, {label}',
                       'compiles', per(arm, 'paid')),
                Figure(f'train-step compiles begun and dropped per window, {arm}, {label}', 'compiles',
                       per(arm, 'dropped')),
                Figure(f'runs that trained a step / runs, {arm}, {label}', 'runs', per(arm, 'trained'),
                       per(arm, 'runs'), 'runs')]
  return figures
