"""Random job histories with a known timeline, their event logs as the product writes them, and the truth.

A history is a sequence of runs on one or more hosts: a fresh first run, then restarts that restore from the job
directory or the local tier, set a damaged checkpoint aside, fall back from a local step that failed to read, start
the input over, or fail before training (a restore that fails: `restore_failed` and exit 1; a process killed in its
restore). Runs end on SIGTERM (an on-demand save, exit 143), by a kill (no exit event), or finished (exit 0). Hosts
other than 0 may run on a skewed clock. `write` replays it through `pax_autockpt.shared.events.EventLog`, one writer per
process and host, with each event's time and fields as the product writes them; `truth` is the true time in every
bucket of `pax_autockpt.tools.report.measured`, computed from the timeline, not from the log.

The timeline is exact where the product's is: a step takes `step_s`; an interval save every `every` steps blocks
the loop `blocking_s` after its step and commits `duration_s` after its start; host 0 writes `progress` at most
every PROGRESS_SECS from the run's first iteration; a local commit follows its step by LOCAL_COMMIT_S and is logged
once, then at most once per LOCAL_SUMMARY_SECS (pax_autockpt.local.saving's CommitTally).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from etils import epath
from hypothesis import strategies as st

from pax_autockpt.hook.progress import PROGRESS_SECS
from pax_autockpt.shared import events as events_lib

LOCAL_SUMMARY_SECS = 60.0  # pax_autockpt.local.saving.SUMMARY_SECS (test_report_histories checks it)
LOCAL_COMMIT_S = 0.03
EXIT_S = 0.01  # the last save's commit -> the exit event
ENDINGS = ('sigterm', 'kill')
RESTORES = ('normal', 'set_aside', 'local_failed', 'input_restarted', 'disk_lost')


@dataclasses.dataclass
class Failed:
  """A restart that ended before training: its restore failed (exit 1), or it was killed in it."""
  kind: str                       # 'restore_failed' or 'killed'
  idle_s: float                   # the previous process's end -> its start
  life_s: float                   # its start -> its end


@dataclasses.dataclass
class Run:
  idle_s: float                   # the previous process's end -> this process's start
  startup_s: float                # its start -> its `start` event, less the restore
  restore_s: float
  compile_s: float                # `start` -> the first step's start
  steps: int                      # steps trained (sigterm: up to the agreed step)
  ending: str                     # 'sigterm', 'kill', 'finish'
  kill_into_step: float           # kill: how far into the next step, as a share of it
  local: bool                     # the local tier on
  restore: str                    # one of RESTORES (what a restart's restore did)
  process_start: bool             # its `start` records process_start_t
  failed_before: list[Failed]


@dataclasses.dataclass
class History:
  hosts: int
  skew_s: list[float]             # per host, its clock's offset (host 0: 0)
  step_s: float
  every: int
  blocking_s: float
  duration_s: float
  local_every: int
  runs: list[Run]
  marks: bool = True              # events carry their process's mark (False: a log written before it)


@dataclasses.dataclass
class Truth:
  seconds: dict[str, float]       # measured.BUCKETS' keys; between_runs holds both parts where no process start
  wall_s: float
  tolerance_s: float              # what a kill hides: the log ends up to one PROGRESS_SECS before it
  restored: list[int | None]      # per run (those that ended before training: None)
  trained: list[bool]             # per run: it reached its `start`
  steps_lost: list[tuple[int, bool]]  # per restart that trained: (steps lost, the run before it was killed)


@st.composite
def histories(draw, max_runs: int = 5) -> History:
  """A history: the first run fresh and long enough for a step time (three interval saves), the last maybe
  finished; a restart may be preceded by restarts that ended before training."""
  step_s = draw(st.floats(0.05, 1.0))
  every = draw(st.integers(20, 400))
  blocking = draw(st.floats(0.001, min(2.0, every * step_s / 2)))
  hosts = draw(st.integers(1, 3))
  n = draw(st.integers(1, max_runs))
  marks = draw(st.booleans())
  runs = [draw(_runs(i, n, every, marks)) for i in range(n)]
  return History(hosts=hosts, skew_s=[0.0] + [draw(st.floats(-20.0, 20.0)) for _ in range(hosts - 1)],
                 step_s=step_s, every=every, blocking_s=blocking,
                 duration_s=draw(st.floats(blocking, max(blocking, min(every * step_s, blocking + 30.0)))),
                 local_every=draw(st.integers(1, 50)), runs=runs, marks=marks)


@st.composite
def _runs(draw, i: int, n: int, every: int, marks: bool) -> Run:
  """Without the processes' marks, a restart killed in its restore leaves events that read as the next one's: it
  needs them."""
  last = i == n - 1
  kinds = ('restore_failed', 'killed') if marks else ('restore_failed',)
  failed = [] if i == 0 else draw(st.lists(st.builds(
      Failed, st.sampled_from(kinds), st.floats(0.0, 600.0), st.floats(1.0, 120.0)), max_size=2))
  restore_s = draw(st.floats(0.05, 30.0))
  return Run(idle_s=draw(st.floats(0.0, 7000.0)), startup_s=draw(st.floats(1.0, 60.0)), restore_s=restore_s,
             compile_s=draw(st.floats(0.1, 40.0)),
             steps=draw(st.integers(3 * every + 1, 6 * every) if i == 0 else st.integers(1, 4 * every)),
             ending=draw(st.sampled_from(ENDINGS + (('finish',) if last else ()))),
             kill_into_step=draw(st.floats(0.0, 0.99)), local=draw(st.booleans()),
             restore=draw(st.sampled_from(RESTORES)), process_start=draw(st.booleans()), failed_before=failed)


@dataclasses.dataclass
class _Event:
  t: float                        # when it is written (true time)
  name: str
  fields: dict[str, Any]
  stamp: float | None = None      # its `t` when not the time written (a save_started: its start)
  host0_only: bool = False


@dataclasses.dataclass
class _Process:
  events: list[_Event] = dataclasses.field(default_factory=list)

  def add(self, t: float, name: str, stamp: float | None = None, host0_only: bool = False, **fields: Any) -> None:
    self.events.append(_Event(t, name, fields, stamp, host0_only))


@dataclasses.dataclass
class _Trained:
  """One trained run's true timeline: what `truth` splits."""
  process_start: float
  start: float
  first_step_start: float
  train_end: float                # its last step's end (sigterm, finish) or the kill
  end: float                      # its exit, or the kill
  restored: int | None
  restore_s: float | None
  step_done: dict[int, float]     # step -> when it completed
  blockings: list[tuple[float, float]]  # (save start, blocking) of each save it started
  reached: int
  killed: bool
  records_process_start: bool


class _Sim:
  """Plays a history forward on host 0's (true) clock: processes' events, and each trained run's timeline."""

  def __init__(self, h: History):
    self.h = h
    self.processes: list[_Process] = []
    self.trained: list[_Trained] = []
    self.restored: list[int | None] = []
    self.committed: set[int] = set()   # the job directory's checkpoints now
    self.local_newest: int | None = None  # the local tier's newest step (after the last run that used it)
    self.now = 0.0

  def play(self) -> None:
    for i, run in enumerate(self.h.runs):
      for f in run.failed_before:
        self._failed(f)
      self._run(i, run)

  def _failed(self, f: Failed) -> None:
    p = _Process()
    begin = self.now + f.idle_s
    self.now = begin + f.life_s
    newest = max(self.committed, default=None)
    if f.kind == 'restore_failed':
      p.add(self.now - 0.001, 'restore_failed', step=newest, kind='transient', error='storage unreachable',
            seen_by=0)
      p.add(self.now, 'exit', code=1, step=newest)
    else:
      p.add(begin + f.life_s / 2, 'local_restore_failed', step=None, kind='timeout', error='no progress', seen_by=0)
    self.processes.append(p)
    self.restored.append(None)

  def _restore(self, i: int, run: Run, p: _Process, t: float) -> tuple[int | None, str | None]:
    """The step this run restores, and from where; the restore's events at `t`."""
    if i == 0:
      return None, None
    prev = self.h.runs[i - 1]
    newest = max(self.committed, default=None)
    if run.restore == 'set_aside' and newest is not None:
      self.committed.discard(newest)
      p.add(t, 'restore_skipped', step=newest, error='a shard does not match its digest')
      newest = max(self.committed, default=None)
    elif run.restore == 'input_restarted' and newest is not None:
      p.add(t, 'input_restarted', step=newest, reason='written by 2 hosts, restored on 1')
    local = self.local_newest if prev.ending == 'kill' and prev.local and run.local else None
    if local is not None and (newest is None or local > newest):
      if run.restore == 'local_failed':
        p.add(t, 'local_restore_failed', step=local, kind='unreadable', error='a part is missing', seen_by=0)
      elif run.restore not in ('disk_lost', 'set_aside'):
        return local, events_lib.LOCAL
    return newest, None if newest is None else events_lib.JOB_DIR

  def _run(self, i: int, run: Run) -> None:
    h, p = self.h, _Process()
    began = self.now + run.idle_s
    start = began + run.startup_s + (run.restore_s if i else 0.0)
    restored, tier = self._restore(i, run, p, start - 0.5 * run.restore_s)
    restore_s = run.restore_s if i and restored is not None else None  # absent when nothing was restored: its
    # time (setting checkpoints aside) is then start-up
    p.add(start, 'start', num_hosts=h.hosts, pid=1000 + i, restored_step=restored, restored_from=tier,
          **({'restore_s': restore_s} if restore_s is not None else {}),
          **({'process_start_t': began} if run.process_start else {}))
    tr = self._train(run, p, start, restored)
    tr.process_start, tr.restore_s, tr.records_process_start = began, restore_s, run.process_start
    self.processes.append(p)
    self.trained.append(tr)
    self.restored.append(restored)
    self.now = tr.end

  def _train(self, run: Run, p: _Process, start: float, restored: int | None) -> _Trained:
    """The run's steps, saves, progress marks, local commits and its ending."""
    h, base = self.h, restored or 0
    t = start + run.compile_s
    tr = _Trained(0.0, start, t, 0.0, 0.0, restored, None, {}, [], base, run.ending == 'kill', False)
    marks = _Marks(p, t)
    tally = _Tally(p) if run.local else None
    last = base + run.steps
    for step in range(base + 1, last + 1):
      t += h.step_s
      tr.step_done[step] = t
      if step == base + 1:
        p.add(t, 'first_step', step=step, compile_s=run.compile_s)
      if step % h.every == 0 and not (step == last and run.ending != 'kill'):
        t = self._save(p, tr, step, t, 'interval')
      if tally is not None and step % h.local_every == 0:
        tally.commit(step, t + LOCAL_COMMIT_S)
      marks.iteration(step, t)
    tr.reached = last
    if run.ending == 'kill':
      self._kill(p, tr, t + run.kill_into_step * h.step_s, tally)
    else:
      self._exit(p, tr, run, t, last, tally)
    return tr

  def _save(self, p: _Process, tr: _Trained, step: int, t: float, reason: str) -> float:
    h = self.h
    p.add(t + h.blocking_s, 'save_started', stamp=t, step=step, reason=reason, blocking_s=h.blocking_s)
    p.add(t + h.duration_s, 'save_committed', step=step, duration_s=h.duration_s)
    tr.blockings.append((t, h.blocking_s))
    self.committed.add(step)  # a kill before its commit takes it back (_kill)
    return t + h.blocking_s

  def _kill(self, p: _Process, tr: _Trained, at: float, tally: _Tally | None) -> None:
    """Everything written after `at` never was; a save not committed by then is no checkpoint."""
    tr.train_end = tr.end = at
    for e in p.events:
      if e.name == 'save_committed' and e.t > at:
        self.committed.discard(e.fields['step'])
    p.events = [e for e in p.events if e.t <= at]
    if tally is not None:
      self.local_newest = tally.newest_before(at)

  def _exit(self, p: _Process, tr: _Trained, run: Run, t: float, last: int, tally: _Tally | None) -> None:
    h = self.h
    tr.train_end = t
    if run.ending == 'sigterm':
      p.add(t, 'preemption', step=last, signal='SIGTERM', signal_at=t - h.step_s / 2, saved_step=last, plan='save')
    self._save(p, tr, last, t, 'preemption' if run.ending == 'sigterm' else 'final')
    tr.end = t + h.duration_s + EXIT_S
    if tally is not None:
      tally.flush(tr.end - EXIT_S / 2)
      self.local_newest = tally.newest_before(tr.end)
    p.add(tr.end, 'exit', code=143 if run.ending == 'sigterm' else 0, step=last)


class _Marks:
  """pax_autockpt.hook.progress.ProgressMarks on host 0: the first iteration sets the due time, then one mark per
  PROGRESS_SECS."""

  def __init__(self, p: _Process, first_iteration: float):
    self.p, self.due = p, first_iteration + PROGRESS_SECS

  def iteration(self, step: int, t: float) -> None:
    if t >= self.due:
      self.due = t + PROGRESS_SECS
      self.p.add(t, 'progress', host0_only=True, step=step)


class _Tally:
  """The local tier's CommitTally: the run's first commit at once, then a summary per LOCAL_SUMMARY_SECS."""

  def __init__(self, p: _Process):
    self.p = p
    self.commits: list[tuple[int, float]] = []  # (step, committed at)
    self.pending: list[tuple[int, float]] = []
    self.last_event: float | None = None

  def commit(self, step: int, t: float) -> None:
    self.commits.append((step, t))
    self.pending.append((step, t))
    if self.last_event is None or t - self.last_event >= LOCAL_SUMMARY_SECS:
      self.flush(t)

  def flush(self, t: float) -> None:
    if not self.pending:
      return
    span = self.pending[-1][1] - (self.pending[0][1] if self.last_event is None else self.prev_commit)
    gaps = len(self.pending) - (1 if self.last_event is None else 0)
    self.p.add(t, 'local_committed', step=self.pending[-1][0], duration_s=LOCAL_COMMIT_S, bytes=1000,
               commits=len(self.pending), **({'interval_s': span / gaps} if gaps else {}))
    self.prev_commit, self.last_event, self.pending = self.pending[-1][1], t, []

  def newest_before(self, t: float) -> int | None:
    return max((s for s, at in self.commits if at <= t), default=None)


def write(h: History, job_dir) -> _Sim:
  """The history's event logs in `job_dir`, through the product's writer: one EventLog per process and host."""
  sim = _Sim(h)
  sim.play()
  for p in sim.processes:
    for host in range(h.hosts):
      log = events_lib.EventLog(job_dir, host)
      for e in sorted(p.events, key=lambda e: e.t):
        if host == 0 or not e.host0_only:
          stamp = e.t if e.stamp is None else e.stamp
          log.write(e.name, t=stamp + h.skew_s[host] + 0.001 * host, **e.fields)
  if not h.marks:
    _unmark(job_dir)
  return sim


def _unmark(job_dir) -> None:
  """The logs as a writer before the processes' marks wrote them."""
  for path in (epath.Path(job_dir) / 'autockpt').glob('events.host*.jsonl'):
    records = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text(''.join(json.dumps({k: v for k, v in r.items() if k != 'process'}) + '\n' for r in records))


def truth(sim: _Sim) -> Truth:
  """The true seconds in every bucket, from the timeline (host 0's clock)."""
  runs, h = sim.trained, sim.h
  got = dict.fromkeys(('productive_training', 'wasted_progress', 'training_prep', 'checkpoint_save',
                       'checkpoint_restore', 'idle_between_runs', 'start_up', 'between_runs', 'other'), 0.0)
  for r, ceiling in zip(runs, _ceilings(runs)):
    _split_run(r, ceiling, got)
  for a, b in zip(runs, runs[1:]):
    _split_between(a, b, got)
  wall_end = max(runs[-1].end, sim.now)  # restarts after the last run that trained
  got['idle_between_runs'] += wall_end - runs[-1].end
  killed = sum(r.killed for r in runs)
  return Truth(seconds=got, wall_s=wall_end - runs[0].start,
               tolerance_s=killed * (PROGRESS_SECS + 2 * h.step_s + 2 * h.blocking_s + 0.1)
               + len(runs) * 2 * h.blocking_s + 1e-6 * (wall_end - runs[0].start),
               restored=sim.restored, trained=[any(e.name == 'start' for e in p.events) for p in sim.processes],
               steps_lost=[(max(0, a.reached - (b.restored or 0)), a.killed) for a, b in zip(runs, runs[1:])])


def _ceilings(runs: list[_Trained]) -> list[float]:
  """Per run, the highest of its steps that survives: the lowest step a later run restored (the last: all)."""
  out, lowest = [], math.inf
  for r in reversed(runs):
    out.append(lowest)
    lowest = min(lowest, r.restored or 0)
  return out[::-1]


def _split_run(r: _Trained, ceiling: float, got: dict[str, float]) -> None:
  """A run's start -> its first step's start (start-up), its training kept and lost, its saves, its exit path."""
  got['training_prep'] += r.first_step_start - r.start
  cut = r.first_step_start if ceiling <= (r.restored or 0) else r.step_done.get(ceiling, r.train_end)
  cut = min(cut, r.train_end)
  blocked = lambda lo, hi: sum(b for t, b in r.blockings if lo <= t < hi)
  got['productive_training'] += cut - r.first_step_start - blocked(-math.inf, cut)
  got['wasted_progress'] += r.train_end - cut - blocked(cut, r.train_end)
  got['checkpoint_save'] += sum(b for _, b in r.blockings)
  got['other'] += r.end - r.train_end - blocked(r.train_end, math.inf)


def _split_between(a: _Trained, b: _Trained, got: dict[str, float]) -> None:
  """A run's end -> the next one's `start`: idle (restarts that ended before training in it), its start-up, its
  restore; the first two as one where its `start` records no process start."""
  restore = b.restore_s or 0.0
  got['checkpoint_restore'] += restore
  if b.records_process_start:
    got['idle_between_runs'] += b.process_start - a.end
    got['start_up'] += b.start - restore - b.process_start
  else:
    got['between_runs'] += b.start - restore - a.end
