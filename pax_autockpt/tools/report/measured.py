"""Measured goodput and badput: where this job's wall time went, from its own event log.

The Young/Daly line (`young_daly`) says what an MTBF the user types would cost at the measured save cost; this
module says what the job's time actually went to, so that an operator sees which bucket to work on. Bucket names
follow Google's ml-goodput-measurement where they mean the same thing (docs/report.md maps them).

The timeline is one host's: host 0's runs that trained (else the lowest host's; hosts start and stop together); a
restart that ended before training (its restore failed, or it was killed in it) is in the time between runs, as
idle, and one after the last run that trained extends the wall time, as idle. A run spans
its `start` event, which is written once its restore is done, to its end: its `exit` event, else (killed: no
exit event) its last event, or the end of a save's blocking that event shows, if later. A killed run's real end is
later than that (by less than pax_autockpt.hook.progress's 30 s on host 0, whose `progress` events mark how far it got
between saves), so after a kill wasted progress is *at least* and the time between runs *at most* the figure.
Wall time = the first run's start -> the last run's end; the buckets add up to it exactly:

- `checkpoint_restore`: the restores of the runs after the first, from their `start` events' `restore_s` (the
  first run's restore comes before the wall time starts);
- `idle_between_runs`: a run's end -> the next run's process start (its `start` event's `process_start_t`): the
  scheduler's part, no process of the job alive;
- `start_up`: that process's start -> its `start` event, less its restore: imports, jax's distributed and
  accelerator initialisation, the experiment and the model, the checkpoint listing;
- `between_runs`: both of the above where the `start` records no process start (off Linux, logs written before
  the field): a run's end -> the next run's `start`, less its restore. A `start` without `restore_s` (logs written
  before the field) leaves its restore in these; `restore_unrecorded` counts those runs;
- `training_prep`: a run's `start` -> the end of its first step, estimated as the time to the first logged step
  (the `first_step` event, a save, a local commit, a preemption or the exit) less the steps before it at the job's
  step time: the first step's compilation, the input pipeline's first batch;
- `productive_training`: time training steps that survive into the final lineage: run k's steps up to the
  lowest step any later run restored (the last run: all of them), less the save blocking in that time;
- `wasted_progress`: time training steps that a later run did not restore (trained past the step it restored
  from), less the save blocking in that time;
- `checkpoint_save`: the sum of the saves' `blocking_s` (the loop waiting for a save);
- `other`: the rest: the exit path after the last step (the on-demand or final save's commit, and the wait for
  it) and the estimates' error.

A killed run (or the last run, still running) is taken to have trained until its end, at least as far as the step
the next run restored: its time after its last logged step is training, kept or wasted as above.

The time a run reached a step is interpolated linearly between the (time, step) points its events give; the
step time is the median over consecutive committed saves of one run of (seconds between their starts - the
first save's blocking) / steps between them (the loader's seconds per step includes the blocking, which here is
a bucket of its own). Without a step time, `training_prep` is 0 and the note says so.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from pax_autockpt.tools.report import model
from pax_autockpt.tools.report import values

BUCKETS = ('productive_training', 'wasted_progress', 'training_prep', 'checkpoint_save', 'checkpoint_restore',
           'idle_between_runs', 'start_up', 'between_runs', 'other')


@dataclasses.dataclass
class Measured:
  wall_s: float | None            # the first run's start -> the last run's end (None: not enough events yet)
  seconds: dict[str, float]       # per bucket, in BUCKETS' order; they add up to wall_s
  shares: dict[str, float]        # per bucket, of wall_s
  goodput: float | None           # productive_training / wall_s
  killed_runs: int                # runs without an exit event: their ends are their last events
  last_run_open: bool             # the last run has no exit event (killed, or still running): wall is at least
  step_time_s: float | None       # the step time the estimates use
  restore_unrecorded: int = 0     # restarted runs whose `start` has no restore_s: their restore is in between_runs
  process_start_known: int = 0    # restarted runs whose `start` has process_start_t: split into idle and start-up
  note: str | None = None

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass
class _Split:
  """One run's time: start -> first step, kept training, lost training, its saves' blocking (the time after its
  last step, less the blocking there, is left to `other`)."""
  prep: float = 0.0
  productive: float = 0.0
  wasted: float = 0.0
  blocking: float = 0.0


def _timeline(report: model.Report) -> tuple[list[model.Run], float | None]:
  """Host 0's runs that trained (else the lowest host's) in order: the one timeline the buckets split; and the
  end of the restarts after the last of them that ended before training (None: none did), which the wall time
  reaches."""
  host = 0 if 0 in report.hosts else min(report.hosts)
  runs = sorted((r for r in report.runs if r.host == host), key=lambda r: r.index)
  trained = [r for r in runs if r.trained]
  after = [r.t_last for r in runs if trained and r.index > trained[-1].index]
  return trained, max(after, default=None)


def _saves_of(report: model.Report, run: model.Run) -> list[model.Save]:
  """The saves a run started, with a known start time and blocking."""
  return [s for s in report.saves if s.run == run.index and s.t is not None and s.blocking_s is not None
          and (run.t_start is None or s.t >= run.t_start)]


def _begin(run: model.Run) -> float:
  if run.t_start is not None:
    return run.t_start
  return min((t for t, _ in run.points), default=run.t_last)


def _end(run: model.Run, saves: list[model.Save]) -> float:
  """The exit; after a kill the last event, or the end of a blocking a save's event shows (it is written after)."""
  if run.exited and run.t_exit is not None:
    return run.t_exit
  return max([run.t_last] + [s.t + s.blocking_s for s in saves])


def step_time(report: model.Report) -> float | None:
  """Median seconds per step between consecutive committed saves of one run, less the first one's blocking."""
  done = sorted((s for s in report.saves if s.committed and s.t is not None), key=lambda s: s.t)
  rates = [(b.t - a.t - (a.blocking_s or 0.0)) / (b.step - a.step)
           for a, b in zip(done, done[1:]) if a.run == b.run and b.step > a.step]
  return values.median([r for r in rates if r > 0])


def _ceilings(runs: list[model.Run]) -> list[float]:
  """Per run, the highest of its steps that survives: the lowest step any later run restored (none: 0); the last
  run's all survive."""
  out, lowest = [], math.inf
  for r in reversed(runs):
    out.append(lowest)
    lowest = min(lowest, r.restored_step if r.restored_step is not None else 0)
  return out[::-1]


def _progress(run: model.Run, begin: float) -> list[tuple[float, int]]:
  """(time, step) each time the run's logged step went up, from (begin, the step it started from)."""
  out = [(begin, run.restored_step or 0)]
  for t, step in sorted(run.points):
    if step > out[-1][1] and t >= begin:
      out.append((t, step))
  return out


def _time_at(progress: list[tuple[float, int]], step: float) -> float:
  """When the run reached `step`, interpolated between its points: its first point's time at or below them, its
  last point's beyond them."""
  if step <= progress[0][1]:
    return progress[0][0]
  for (t0, s0), (t1, s1) in zip(progress, progress[1:]):
    if s0 < step <= s1:
      return t0 + (t1 - t0) * (step - s0) / (s1 - s0)
  return progress[-1][0]


def _prep(progress: list[tuple[float, int]], seconds: float | None) -> float:
  """Start -> the first step's end: the time to the first logged step less its steps at the step time."""
  if seconds is None or len(progress) < 2:
    return 0.0
  (t0, s0), (t1, s1) = progress[0], progress[1]
  return min(t1 - t0, max(0.0, t1 - t0 - (s1 - s0) * seconds))


def _split(run: model.Run, saves: list[model.Save], ceiling: float, seconds: float | None) -> _Split:
  """One run's [start, end] cut at the first step, at the last step that survives, and at its last step."""
  begin, end = _begin(run), _end(run, saves)
  progress = _progress(run, begin)
  prep = _prep(progress, seconds)
  progress[0] = (begin + prep, progress[0][1])
  if not run.exited and end > progress[-1][0]:  # killed (or running): it trained until its end, at least as far
    progress.append((end, max(progress[-1][1], ceiling if math.isfinite(ceiling) else 0)))  # as the next restore
  clamp = lambda t: min(max(t, begin), end)
  b1 = clamp(begin + prep)
  b2 = clamp(max(b1, _time_at(progress, ceiling)))
  b3 = clamp(max(b2, progress[-1][0]))
  lanes = {'productive': [b2 - b1, b2], 'wasted': [b3 - b2, b3], 'tail': [end - b3, math.inf]}
  for s in saves:
    lane = next(v for v in lanes.values() if s.t < v[1])
    lane[0] -= s.blocking_s
  return _Split(prep=b1 - begin, productive=max(0.0, lanes['productive'][0]), wasted=max(0.0, lanes['wasted'][0]),
                blocking=sum(s.blocking_s for s in saves))


@dataclasses.dataclass
class _Between:
  """The time between runs: idle (end -> the next process's start), start-up (-> its `start`, less the restore),
  both where the process start is unknown (rest), the restores; runs without restore_s or process_start_t."""
  idle: float = 0.0
  start_up: float = 0.0
  rest: float = 0.0
  restores: float = 0.0
  unrecorded: int = 0
  known: int = 0


def _between(runs: list[model.Run], saves: list[list[model.Save]]) -> _Between:
  """Each gap between runs cut at the new process's start where its `start` records one: what the scheduler
  took apart from what the job's own start-up took, the part an operator can work on."""
  out = _Between()
  for a, b, sa in zip(runs, runs[1:], saves):
    end = _end(a, sa)
    gap = _begin(b) - end
    restore = min(b.restore_s, max(0.0, gap)) if b.restore_s is not None else 0.0
    out.restores += restore
    out.unrecorded += int(b.restore_s is None and b.restored_step is not None)
    if b.process_start_t is None:
      out.rest += gap - restore
      continue
    idle = min(max(0.0, b.process_start_t - end), max(0.0, gap - restore))
    out.idle, out.start_up, out.known = out.idle + idle, out.start_up + gap - restore - idle, out.known + 1
  return out


def measure(report: model.Report) -> Measured:
  """The job's wall time split into BUCKETS (see the module docstring)."""
  runs, failed_end = _timeline(report)
  seconds = step_time(report)
  saves = [_saves_of(report, r) for r in runs]
  last_end = _end(runs[-1], saves[-1]) if runs else 0.0
  tail = max(0.0, failed_end - last_end) if failed_end is not None else 0.0  # restarts that never trained
  wall = last_end + tail - _begin(runs[0]) if runs else 0.0
  killed = sum(1 for r in runs if not r.exited)
  open_end = bool(runs) and not runs[-1].exited and not tail
  if wall <= 0:
    return Measured(None, {}, {}, None, killed, open_end, seconds,
                    note='not enough events yet: it needs a run\'s start and a later event')
  splits = [_split(r, s, c, seconds) for r, s, c in zip(runs, saves, _ceilings(runs))]
  between = _between(runs, saves)
  got = {'productive_training': sum(x.productive for x in splits), 'wasted_progress': sum(x.wasted for x in splits),
         'training_prep': sum(x.prep for x in splits), 'checkpoint_save': sum(x.blocking for x in splits),
         'checkpoint_restore': between.restores, 'idle_between_runs': between.idle + tail,
         'start_up': between.start_up,
         'between_runs': between.rest}
  got['other'] = wall - sum(got.values())
  note = None if seconds is not None else ('no step time measured (< 2 committed saves in one run): the start-up '
                                           'after each `start` counted as training')
  return Measured(wall, got, {k: v / wall for k, v in got.items()}, got['productive_training'] / wall,
                  killed, open_end, seconds, between.unrecorded, between.known, note)
