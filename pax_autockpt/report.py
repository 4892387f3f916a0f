"""`pax-autockpt report JOB_LOG_DIR`: checkpoint timeline and figures from the event log (CONTRACT §6).

Reads only `JOB_LOG_DIR/autockpt/events.host<IDX>.jsonl` and the listing of
`JOB_LOG_DIR/checkpoints`. Each line is parsed with `json.loads` and nothing else: no pickle, no
eval, nothing from the job directory is ever executed or imported.

How the figures are derived (the interpretations the contract leaves open):
- Lines that are not a JSON object with a string "event" and a finite numeric "t" are skipped and
  counted in `unparsable_lines`. A killed writer can leave a torn line with the next process's first
  record appended to it; the trailing record is salvaged (still with `json.loads`), the torn part counted.
- A *run* is one process start on one host: a `start` event and every later event in that host's file
  up to the next `start`. Run `k` of every host is the job's k-th run (hosts restart together).
- Saves, preemptions, deletions and skipped restores are logged by every host. The k-th event of one
  kind for step S on a host is matched with the k-th one for step S on every other host and counted
  once (so a step saved again after a restart is a second save). A merged save takes the max
  `blocking_s` / `duration_s` over hosts, host 0's timestamps when host 0 logged it (else the earliest
  start / latest commit), and host 0's reason.
- Checkpoint interval: committed saves sorted by save start time (commit time when the start was not
  logged), across restarts; consecutive pairs with a positive step difference; seconds between their
  start times. Percentiles interpolate linearly (numpy's default).
- Steps lost by restart k on a host = (run k-1's exit step, else the highest step in any of its
  `start`/`save_started`/`save_committed`/`preemption` events) - run k's `restored_step` (0 when null),
  floored at 0; a lower bound when run k-1 has no `exit` event. Per job: the max over hosts per restart;
  total = sum over restarts.
- Goodput for an MTBF of M seconds: delta = mean `blocking_s` of non-preemption saves, tau = P50
  interval seconds, R = restart cost: per restart, downtime (previous run's last event -> next `start`)
  plus startup (`start` -> the run's first `save_started`, minus the time the steps trained in between
  take at the median seconds/step measured within runs; 0 when not measurable), max over hosts, mean
  over restarts; 0 when there was no restart.
  goodput = max(0, 1 - delta/tau - (tau/2 + R)/M); Young/Daly optimum tau_opt = sqrt(2 delta M).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import re
import sys
from typing import Any, Iterable, TextIO

from etils import epath

REASONS = ('interval', 'continuous', 'preemption', 'final')
_FILE_RE = re.compile(r'events\.host(\d+)\.jsonl')
_CKPT_RE = re.compile(r'checkpoint_(\d+)')
_TMP_MARK = '.orbax-checkpoint-tmp-'
# Where a record starts when a torn line has the next record appended (EventLog writes "t" first).
_RECORD_START = re.compile(r'\{\s*"t"\s*:')


class ReportError(ValueError):
  """Bad input (no events, bad --mtbf_hours); its message is one line."""


# ----------------------------------------------------------------------------------------------
# Data classes.


@dataclasses.dataclass
class Stats:
  n: int = 0
  mean: float | None = None
  p50: float | None = None
  p90: float | None = None
  max: float | None = None

  @classmethod
  def of(cls, values: Iterable[float]) -> Stats:
    vals = sorted(v for v in values if v is not None)
    if not vals:
      return cls()
    return cls(n=len(vals), mean=sum(vals) / len(vals), p50=_percentile(vals, 50),
               p90=_percentile(vals, 90), max=vals[-1])


@dataclasses.dataclass
class Run:
  """One process start on one host."""
  host: int
  index: int                      # 0 for the first start on this host, 1 after one restart, ...
  t_start: float | None           # None when the file does not begin with a `start` event
  pid: int | None
  num_hosts: int | None
  restored_step: int | None
  t_last: float                   # time of its last event
  max_step: int | None            # highest step in its start/save/preemption/exit events
  exited: bool                    # False: no `exit` event (killed, e.g. by SIGKILL)
  exit_code: int | None
  exit_step: int | None
  t_exit: float | None
  reached_step: int | None        # exit step, else max_step
  points: list[tuple[float, int]] = dataclasses.field(default_factory=list, repr=False)


@dataclasses.dataclass
class Save:
  step: int
  reason: str                     # 'unknown' when only its commit was logged
  t: float | None                 # save_started time
  t_committed: float | None
  blocking_s: float | None        # max over hosts
  duration_s: float | None        # max over hosts
  committed: bool
  hosts: list[int]
  run: int | None


@dataclasses.dataclass
class Preemption:
  step: int | None                # the agreed step
  signal: str | None
  t: float
  hosts: list[int]
  exit_after_s: float | None      # preemption event -> that host's exit, max over hosts
  exit_after_s_by_host: dict[int, float]
  exit_codes: list[int]


@dataclasses.dataclass
class Restart:
  index: int                      # the new run's index (>= 1)
  hosts: list[int]
  reached_step: int | None        # highest step the previous run is known to have reached
  restored_step: int | None
  steps_lost: int
  lower_bound: bool               # the previous run had no exit event
  downtime_s: float | None
  startup_s: float | None
  cost_s: float | None


@dataclasses.dataclass
class Report:
  job_log_dir: str
  event_files: list[str]
  t0: float                       # first event
  t_end: float                    # last event
  hosts: list[int]
  num_hosts: int | None           # declared in `start` events (max)
  starts_per_host: dict[int, int]
  restarts: int                   # max over hosts of starts - 1
  restored_steps: list[int | None]  # per job run (host 0's, else the lowest host's)
  runs: list[Run]
  saves: list[Save]
  saves_started: int
  saves_committed: int
  saves_by_reason: dict[str, int]
  committed_by_reason: dict[str, int]
  steps_saved: list[int]          # committed steps, unique, ascending
  blocking_s: dict[str, Stats]    # 'all' and per reason
  duration_s: dict[str, Stats]    # committed saves: 'all' and per reason
  interval_steps: Stats
  interval_s: Stats
  seconds_per_step: float | None  # median over save pairs within one run
  preemptions: list[Preemption]
  exit_codes: dict[int, int]      # code -> number of (host, run) exits
  restart_details: list[Restart]
  steps_lost_total: int
  steps_lost_max: int
  steps_lost_lower_bound: bool
  deletions: int
  deletions_by_policy: dict[str, int]
  restore_skipped: int
  restore_skipped_steps: list[int]
  checkpoint_dir: str
  checkpoints_complete: list[int]
  checkpoints_incomplete: int
  newest_checkpoint: int | None
  unparsable_lines: int
  malformed_events: int           # valid JSON records missing a required field (e.g. an int step)
  event_counts: dict[str, int]
  save_cost_s: float | None       # goodput delta
  interval_p50_s: float | None    # goodput tau
  restart_cost_s: float           # goodput R
  restart_cost_note: str

  def goodput(self, mtbf_hours: float) -> dict[str, Any]:
    return goodput(self, mtbf_hours)

  def to_dict(self, mtbf_hours: float | None = None) -> dict[str, Any]:
    """JSON-native: string keys, lists, finite floats; `json.loads(json.dumps(d)) == d`."""
    d = dataclasses.asdict(self)
    for r in d['runs']:
      r.pop('points', None)
    if mtbf_hours is not None:
      d['goodput'] = goodput(self, mtbf_hours)
    return _jsonable(d)


def _jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


# ----------------------------------------------------------------------------------------------
# Small helpers.


def _percentile(sorted_vals: list[float], q: float) -> float:
  """Linear interpolation between closest ranks (numpy.percentile's default)."""
  pos = (len(sorted_vals) - 1) * q / 100.0
  lo = math.floor(pos)
  hi = min(lo + 1, len(sorted_vals) - 1)
  return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def _num(v: Any) -> float | None:
  if isinstance(v, bool) or not isinstance(v, (int, float)):
    return None
  v = float(v)
  return v if math.isfinite(v) else None


def _int(v: Any) -> int | None:
  if isinstance(v, bool):
    return None
  if isinstance(v, int):
    return v
  if isinstance(v, float) and math.isfinite(v) and v.is_integer():
    return int(v)
  return None


def _str(v: Any) -> str | None:
  return v if isinstance(v, str) else None


def _max(values: Iterable[Any]) -> Any:
  vals = [v for v in values if v is not None]
  return max(vals) if vals else None


def _median(values: list[float]) -> float | None:
  return _percentile(sorted(values), 50) if values else None


@dataclasses.dataclass
class _Ev:
  host: int
  run: int
  t: float
  name: str
  rec: dict[str, Any]


def _parse_record(text: str) -> dict[str, Any] | None:
  try:
    rec = json.loads(text)
  except (ValueError, RecursionError):
    return None
  if not isinstance(rec, dict) or not isinstance(rec.get('event'), str) or _num(rec.get('t')) is None:
    return None
  return rec


def _read_lines(data: bytes) -> tuple[list[dict[str, Any]], int]:
  """Returns the valid records of one file, in file order, and the number of unparsable lines."""
  records, bad = [], 0
  for raw in data.split(b'\n'):
    line = raw.decode('utf-8', errors='replace').strip()
    if not line:
      continue
    rec = _parse_record(line)
    if rec is not None:
      records.append(rec)
      continue
    bad += 1
    # A torn line from a killed writer, with the next process's first record appended to it.
    for m in _RECORD_START.finditer(line, 1):
      rec = _parse_record(line[m.start():])
      if rec is not None:
        records.append(rec)
        break
  return records, bad


def _fmt_s(seconds: float | None) -> str:
  if seconds is None:
    return 'n/a'
  if abs(seconds) < 60:
    return f'{seconds:.2g} s' if abs(seconds) < 1 else f'{seconds:.1f} s'
  if abs(seconds) < 7200:
    return f'{seconds / 60:.1f} min'
  return f'{seconds / 3600:.1f} h'


def _fmt_num(v: float | None, digits: int = 2) -> str:
  if v is None:
    return 'n/a'
  if float(v).is_integer() and abs(v) >= 1:
    return str(int(v))
  return f'{v:.{digits}f}'


def _fmt_steps(steps: list[int], limit: int = 8) -> str:
  if not steps:
    return 'none'
  if len(steps) <= limit:
    return ', '.join(map(str, steps))
  return ', '.join(map(str, steps[:3])) + ', ..., ' + ', '.join(map(str, steps[-3:]))


# ----------------------------------------------------------------------------------------------
# Loading.


def _merge(evs: list[_Ev], name: str, key_field: str = 'step', required: bool = True,
           counters: collections.Counter | None = None) -> dict[tuple[Any, int], dict[int, _Ev]]:
  """Groups one kind of event across hosts: the k-th one for a step on each host is one group."""
  seen: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
  groups: dict[tuple[Any, int], dict[int, _Ev]] = {}
  for e in evs:
    if e.name != name:
      continue
    key = _int(e.rec.get(key_field))
    if key is None and required:
      if counters is not None:
        counters['malformed'] += 1
      continue
    k = (key, seen[e.host][key])
    seen[e.host][key] += 1
    group = groups.setdefault(k, {})
    group[e.host] = e
  return groups


def _pick(group: dict[int, _Ev]) -> _Ev:
  return group[0] if 0 in group else group[min(group)]


def load(job_log_dir: str | os.PathLike) -> Report:
  """Reads a job's event logs and checkpoint listing; raises ReportError when there are no events."""
  root = epath.Path(job_log_dir)
  ev_dir = root / 'autockpt'
  files = []
  if ev_dir.is_dir():
    files = sorted((p for p in ev_dir.iterdir() if _FILE_RE.fullmatch(p.name)),
                   key=lambda p: int(_FILE_RE.fullmatch(p.name).group(1)))
  unparsable = 0
  counters: collections.Counter = collections.Counter()
  evs: list[_Ev] = []
  runs: list[Run] = []
  run_events: dict[tuple[int, int], list[_Ev]] = {}
  for path in files:
    host = int(_FILE_RE.fullmatch(path.name).group(1))
    records, bad = _read_lines(path.read_bytes())
    unparsable += bad
    run_idx = -1
    for rec in records:
      name = rec['event']
      if name == 'start' or run_idx < 0:
        run_idx += 1
        run_events[(host, run_idx)] = []
      e = _Ev(host, run_idx, float(rec['t']), name, rec)
      evs.append(e)
      run_events[(host, run_idx)].append(e)
  if not evs:
    where = f'{ev_dir}/events.host<IDX>.jsonl'
    if files:
      raise ReportError(f'no events found in {where} ({unparsable} unparsable lines)')
    raise ReportError(f'no events found: no {where} files')

  event_counts = collections.Counter(e.name for e in evs)
  hosts = sorted({e.host for e in evs})
  t0 = min(e.t for e in evs)
  t_end = max(e.t for e in evs)

  # --- Runs.
  for (host, idx), rev in sorted(run_events.items()):
    start = rev[0] if rev[0].name == 'start' else None
    restored = _int(start.rec.get('restored_step')) if start else None
    exit_ev = next((e for e in rev if e.name == 'exit'), None)
    points: list[tuple[float, int]] = []
    if start is not None:
      points.append((start.t, restored if restored is not None else 0))
    for e in rev:
      if e.name in ('save_started', 'preemption', 'exit'):
        s = _int(e.rec.get('step'))
        if s is not None:
          points.append((e.t, s))
    steps = [s for _, s in points]
    committed = [_int(e.rec.get('step')) for e in rev if e.name == 'save_committed']
    max_step = _max(steps + committed)
    exit_step = _int(exit_ev.rec.get('step')) if exit_ev else None
    points.sort()
    runs.append(Run(
        host=host, index=idx, t_start=start.t if start else None,
        pid=_int(start.rec.get('pid')) if start else None,
        num_hosts=_int(start.rec.get('num_hosts')) if start else None,
        restored_step=restored, t_last=max(e.t for e in rev), max_step=max_step,
        exited=exit_ev is not None, exit_code=_int(exit_ev.rec.get('code')) if exit_ev else None,
        exit_step=exit_step, t_exit=exit_ev.t if exit_ev else None,
        reached_step=exit_step if exit_step is not None else max_step, points=points))
  run_by_key = {(r.host, r.index): r for r in runs}
  start_counts = collections.Counter(e.host for e in evs if e.name == 'start')
  starts_per_host = {h: start_counts[h] for h in hosts}
  restarts = max(0, max(starts_per_host.values()) - 1)
  num_runs = max(r.index for r in runs) + 1
  restored_steps = []
  for k in range(num_runs):
    rs = {r.host: r for r in runs if r.index == k}
    restored_steps.append(rs[0].restored_step if 0 in rs else rs[min(rs)].restored_step)
  num_hosts = _max(r.num_hosts for r in runs)

  # --- Saves: the k-th commit of a step in a run completes that run's start of that step.
  by_step_started: dict[int, list[dict[int, _Ev]]] = collections.defaultdict(list)
  for (step, _), g in sorted(_merge(evs, 'save_started', counters=counters).items(),
                            key=lambda kv: kv[0]):
    by_step_started[step].append(g)
  by_step_committed: dict[int, list[dict[int, _Ev]]] = collections.defaultdict(list)
  for (step, _), g in sorted(_merge(evs, 'save_committed', counters=counters).items(),
                            key=lambda kv: kv[0]):
    by_step_committed[step].append(g)
  saves: list[Save] = []
  for step in sorted(set(by_step_started) | set(by_step_committed)):
    pending = list(by_step_started.get(step, []))
    pairs: list[tuple[dict[int, _Ev] | None, dict[int, _Ev] | None]] = []
    for c in by_step_committed.get(step, []):
      pc = _pick(c)
      s = next((g for g in pending if _pick(g).run == pc.run), None)
      if s is None:
        s = next((g for g in pending if _pick(g).t <= pc.t), None)
      if s is not None:
        pending.remove(s)
      pairs.append((s, c))
    pairs.extend((g, None) for g in pending)
    for s, c in pairs:
      reason = (_str(_pick(s).rec.get('reason')) or 'unknown') if s else 'unknown'
      t = (s[0].t if 0 in s else min(e.t for e in s.values())) if s else None
      tc = (c[0].t if 0 in c else max(e.t for e in c.values())) if c else None
      saves.append(Save(
          step=step, reason=reason, t=t, t_committed=tc,
          blocking_s=_max(_num(e.rec.get('blocking_s')) for e in s.values()) if s else None,
          duration_s=_max(_num(e.rec.get('duration_s')) for e in c.values()) if c else None,
          committed=c is not None, hosts=sorted(set(s or {}) | set(c or {})),
          run=_pick(s or c).run))
  saves.sort(key=lambda x: (x.t if x.t is not None else x.t_committed, x.step))
  started_saves = [s for s in saves if s.t is not None]
  committed_saves = [s for s in saves if s.committed]
  saves_by_reason = dict(sorted(collections.Counter(s.reason for s in started_saves).items()))
  committed_by_reason = dict(sorted(collections.Counter(s.reason for s in committed_saves).items()))
  reasons = sorted({s.reason for s in saves})
  blocking = {'all': Stats.of(s.blocking_s for s in started_saves)}
  duration = {'all': Stats.of(s.duration_s for s in committed_saves)}
  for reason in reasons:
    blocking[reason] = Stats.of(s.blocking_s for s in started_saves if s.reason == reason)
    duration[reason] = Stats.of(s.duration_s for s in committed_saves if s.reason == reason)

  # --- Checkpoint interval (committed saves, by time, across restarts).
  isteps, isecs, rates = [], [], []
  for a, b in zip(committed_saves, committed_saves[1:]):
    ds = b.step - a.step
    if ds <= 0:
      continue
    if a.t is not None and b.t is not None:
      dt = b.t - a.t
    else:
      dt = (b.t_committed - a.t_committed
            if a.t_committed is not None and b.t_committed is not None else None)
    isteps.append(ds)
    if dt is not None:
      isecs.append(dt)
      if a.run == b.run and dt > 0:
        rates.append(dt / ds)
  interval_steps, interval_s = Stats.of(isteps), Stats.of(isecs)
  seconds_per_step = _median(rates)

  # --- Preemptions and exits.
  preemptions = []
  for g in _merge(evs, 'preemption', required=False).values():
    first = _pick(g)
    by_host = {}
    codes = []
    for h, e in g.items():
      r = run_by_key[(h, e.run)]
      if r.exited and r.t_exit is not None and r.t_exit >= e.t:
        by_host[h] = r.t_exit - e.t
        if r.exit_code is not None:
          codes.append(r.exit_code)
    preemptions.append(Preemption(
        step=_int(first.rec.get('step')), signal=_str(first.rec.get('signal')),
        t=first.t, hosts=sorted(g), exit_after_s=_max(by_host.values()),
        exit_after_s_by_host=dict(sorted(by_host.items())), exit_codes=sorted(set(codes))))
  preemptions.sort(key=lambda p: p.t)
  exit_codes = dict(sorted(collections.Counter(
      r.exit_code for r in runs if r.exited and r.exit_code is not None).items()))

  # --- Restarts: steps lost and restart cost.
  per_restart: dict[int, list[tuple[int, int | None, int | None, int, bool, float | None,
                                    float | None]]] = collections.defaultdict(list)
  for r in runs:
    if r.index == 0:
      continue
    prev = run_by_key[(r.host, r.index - 1)]
    reached = prev.reached_step
    if reached is None:
      reached = prev.restored_step or 0
    restored = r.restored_step if r.restored_step is not None else 0
    lost = max(0, reached - restored)
    downtime = (r.t_start - prev.t_last) if r.t_start is not None else None
    startup = None
    first_save = next((e for e in run_events[(r.host, r.index)]
                       if e.name == 'save_started' and _int(e.rec.get('step')) is not None), None)
    if first_save is not None and seconds_per_step is not None and r.t_start is not None:
      trained = max(0, _int(first_save.rec['step']) - restored) * seconds_per_step
      startup = max(0.0, first_save.t - r.t_start - trained)
    per_restart[r.index].append(
        (r.host, reached, r.restored_step, lost, not prev.exited, downtime, startup))
  restart_details = []
  for k in sorted(per_restart):
    rows = per_restart[k]
    row0 = next((row for row in rows if row[0] == 0), rows[0])
    downtime = _max(row[5] for row in rows)
    startup = _max(row[6] for row in rows)
    costs = [(row[5] or 0.0) + (row[6] or 0.0) for row in rows
             if row[5] is not None or row[6] is not None]
    restart_details.append(Restart(
        index=k, hosts=sorted(row[0] for row in rows), reached_step=_max(row[1] for row in rows),
        restored_step=row0[2], steps_lost=max(row[3] for row in rows),
        lower_bound=any(row[4] for row in rows), downtime_s=downtime, startup_s=startup,
        cost_s=_max(costs)))
  steps_lost = [r.steps_lost for r in restart_details]
  known_costs = [r.cost_s for r in restart_details if r.cost_s is not None]
  if known_costs:
    restart_cost = sum(known_costs) / len(known_costs)
    note = (f'mean over {len(known_costs)} restart(s) of downtime (last event -> next start) + '
            'startup (start -> first save, less the steps trained at the median s/step)')
    if seconds_per_step is None:
      note += '; startup not measurable, counted as 0'
  else:
    restart_cost = 0.0
    note = 'no restart observed: R = 0' if not restart_details else 'restart cost unknown: R = 0'

  # --- Deletions, skipped restores.
  deleted = list(_merge(evs, 'deleted', counters=counters).values())
  deletions_by_policy = dict(sorted(collections.Counter(
      _str(_pick(g).rec.get('policy')) or 'unknown' for g in deleted).items()))
  skipped = list(_merge(evs, 'restore_skipped', counters=counters).values())
  skipped_steps = sorted(_int(_pick(g).rec.get('step')) for g in skipped)

  # --- Checkpoint directory listing.
  ckpt_dir = root / 'checkpoints'
  complete, incomplete = [], 0
  if ckpt_dir.is_dir():
    for p in ckpt_dir.iterdir():
      if _TMP_MARK in p.name:
        incomplete += 1
        continue
      m = _CKPT_RE.fullmatch(p.name)
      if m and p.is_dir():
        complete.append(int(m.group(1)))
  complete.sort()

  # --- Goodput inputs.
  non_preempt = [s.blocking_s for s in started_saves
                 if s.reason != 'preemption' and s.blocking_s is not None]
  save_cost = sum(non_preempt) / len(non_preempt) if non_preempt else None

  return Report(
      job_log_dir=os.fspath(job_log_dir), event_files=[p.name for p in files], t0=t0, t_end=t_end,
      hosts=hosts, num_hosts=num_hosts, starts_per_host=starts_per_host, restarts=restarts,
      restored_steps=restored_steps, runs=runs, saves=saves, saves_started=len(started_saves),
      saves_committed=len(committed_saves), saves_by_reason=saves_by_reason,
      committed_by_reason=committed_by_reason,
      steps_saved=sorted({s.step for s in committed_saves}), blocking_s=blocking,
      duration_s=duration, interval_steps=interval_steps, interval_s=interval_s,
      seconds_per_step=seconds_per_step, preemptions=preemptions, exit_codes=exit_codes,
      restart_details=restart_details, steps_lost_total=sum(steps_lost),
      steps_lost_max=max(steps_lost, default=0),
      steps_lost_lower_bound=any(r.lower_bound for r in restart_details),
      deletions=len(deleted), deletions_by_policy=deletions_by_policy,
      restore_skipped=len(skipped), restore_skipped_steps=skipped_steps,
      checkpoint_dir=os.fspath(ckpt_dir), checkpoints_complete=complete,
      checkpoints_incomplete=incomplete, newest_checkpoint=complete[-1] if complete else None,
      unparsable_lines=unparsable, malformed_events=counters['malformed'],
      event_counts=dict(sorted(event_counts.items())), save_cost_s=save_cost,
      interval_p50_s=interval_s.p50, restart_cost_s=restart_cost, restart_cost_note=note)


# ----------------------------------------------------------------------------------------------
# Goodput.


def _goodput_at(delta: float, tau: float, r: float, m: float) -> float:
  if tau <= 0:
    return max(0.0, 1.0 - r / m) if delta == 0 else 0.0
  return max(0.0, 1.0 - delta / tau - (tau / 2.0 + r) / m)


def goodput(report: Report, mtbf_hours: float) -> dict[str, Any]:
  """goodput ≈ max(0, 1 - delta/tau - (tau/2 + R)/M), and the same at tau_opt = sqrt(2 delta M)."""
  m_h = _num(mtbf_hours)
  if m_h is None or m_h <= 0:
    raise ReportError(f'--mtbf_hours must be a positive number of hours, got {mtbf_hours!r}')
  m = m_h * 3600.0
  delta, tau, r = report.save_cost_s, report.interval_p50_s, report.restart_cost_s
  out: dict[str, Any] = {
      'mtbf_hours': m_h, 'mtbf_s': m, 'save_cost_s': delta, 'interval_s': tau,
      'restart_cost_s': r, 'goodput': None, 'tau_opt_s': None, 'goodput_opt': None, 'note': None}
  if delta is None:
    out['note'] = 'not computable: no non-preemption save with blocking_s was logged'
    return out
  tau_opt = math.sqrt(2.0 * delta * m)
  out['tau_opt_s'] = tau_opt
  out['goodput_opt'] = _goodput_at(delta, tau_opt, r, m)
  if tau is None or tau <= 0:
    out['note'] = 'goodput not computable: no checkpoint interval measured (< 2 committed saves)'
  else:
    out['goodput'] = _goodput_at(delta, tau, r, m)
  return out


# ----------------------------------------------------------------------------------------------
# Text.


def _stats_line(label: str, stats: dict[str, Stats]) -> str:
  parts = []
  for key, s in stats.items():
    if s.n:
      parts.append(f'{key} {s.mean:.2f}/{s.p50:.2f}/{s.p90:.2f}/{s.max:.2f}')
  return f'{label} mean/p50/p90/max: ' + ('; '.join(parts) if parts else 'n/a')


def format_text(report: Report, mtbf_hours: float | None = None) -> str:
  r = report
  lines = [f'job: {r.job_log_dir}']
  per_host = ', '.join(f'{h}:{n}' for h, n in r.starts_per_host.items())
  declared = f', {r.num_hosts} declared' if r.num_hosts is not None else ''
  lines.append(f'hosts: {len(r.hosts)}{declared} (starts per host {per_host})')
  restored = ', '.join('none' if s is None else str(s) for s in r.restored_steps)
  lines.append(f'restarts: {r.restarts} (restored steps: {restored})')
  by_reason = ', '.join(f'{k} {v}' for k, v in r.saves_by_reason.items())
  lines.append(f'saves: {r.saves_started}' + (f' ({by_reason})' if by_reason else '')
               + f', committed {r.saves_committed}')
  lines.append(f'steps saved: {_fmt_steps(r.steps_saved)}')
  lines.append(_stats_line('save blocking s', r.blocking_s))
  lines.append(_stats_line('save duration s', r.duration_s))
  if r.interval_steps.n:
    secs = ('n/a' if r.interval_s.p50 is None
            else f'{r.interval_s.p50:.1f}/{r.interval_s.p90:.1f} s')
    lines.append(f'interval P50/P90: {r.interval_steps.p50:.0f}/{r.interval_steps.p90:.0f} steps, '
                 f'{secs}')
  else:
    lines.append('interval P50/P90: n/a (fewer than two committed saves)')
  if r.preemptions:
    steps = ', '.join('?' if p.step is None else str(p.step) for p in r.preemptions)
    details = ', '.join(
        f'{p.signal or "?"} -> ' + ('no exit' if p.exit_after_s is None
                                     else f'exit {p.exit_after_s:.2f} s')
        for p in r.preemptions)
    lines.append(f'preemptions: {len(r.preemptions)} at step{"s" if len(r.preemptions) > 1 else ""}'
                 f' {steps} ({details})')
  else:
    lines.append('preemptions: 0')
  codes = ', '.join(f'{c} x{n}' for c, n in r.exit_codes.items())
  killed = sum(1 for run in r.runs if not run.exited)
  lines.append(f'exit codes: {codes or "none"}'
               + (f'; {killed} run(s) without an exit event' if killed else ''))
  ge = '>= ' if r.steps_lost_lower_bound else ''
  lost = f'steps lost: {ge}{r.steps_lost_total} total, max {ge}{r.steps_lost_max}'
  if r.steps_lost_lower_bound:
    lost += ' (lower bound: a run ended without an exit event)'
  lines.append(lost)
  policies = ', '.join(f'{k} {v}' for k, v in r.deletions_by_policy.items())
  lines.append(f'deletions: {r.deletions}' + (f' ({policies})' if policies else ''))
  lines.append(f'restore skipped: {r.restore_skipped}'
               + (f' (steps {_fmt_steps(r.restore_skipped_steps)})' if r.restore_skipped else ''))
  newest = f', newest {r.newest_checkpoint}' if r.newest_checkpoint is not None else ''
  lines.append(f'checkpoints: {len(r.checkpoints_complete)} complete{newest}, '
               f'{r.checkpoints_incomplete} incomplete')
  lines.append(f'unparsable lines: {r.unparsable_lines}')
  lines.append(f'restart cost R: {_fmt_s(r.restart_cost_s)} ({r.restart_cost_note})')
  if mtbf_hours is None:
    lines.append(f'goodput: pass --mtbf_hours H (save cost {_fmt_s(r.save_cost_s)}, '
                 f'interval {_fmt_s(r.interval_p50_s)})')
  else:
    g = goodput(r, mtbf_hours)
    head = f'goodput @ MTBF {_fmt_num(g["mtbf_hours"], 1)} h: '
    if g['tau_opt_s'] is None:
      lines.append(head + g['note'])
    else:
      now = 'n/a' if g['goodput'] is None else f'{100 * g["goodput"]:.1f}%'
      lines.append(head + f'{now} (Young/Daly optimum {_fmt_s(g["tau_opt_s"])} -> '
                   f'{100 * g["goodput_opt"]:.1f}%)' + (f'; {g["note"]}' if g['note'] else ''))
  return '\n'.join(lines)


# ----------------------------------------------------------------------------------------------
# Plot.

_REASON_COLOURS = {'interval': 'tab:blue', 'continuous': 'tab:cyan', 'preemption': 'tab:red',
                   'final': 'tab:green'}
_RUN_COLOURS = ('tab:purple', 'tab:orange', 'tab:brown', 'tab:pink', 'tab:olive', 'black',
                'darkgoldenrod', 'slateblue')
_HOST_STYLES = ('-', '--', ':', '-.')


def plot(report: Report, path: str) -> None:
  """Writes a PNG timeline: step against seconds since the first event, one line per run."""
  # The object-oriented API with an explicit Agg canvas: no pyplot, no global backend change.
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

  r = report
  fig = Figure(figsize=(10, 5.5), dpi=100)
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  t0 = r.t0
  labelled: set[str] = set()

  def label(text: str) -> str | None:
    if text in labelled:
      return None
    labelled.add(text)
    return text

  multi_host = len(r.hosts) > 1
  for run in r.runs:
    if not run.points:
      continue
    colour = _RUN_COLOURS[run.index % len(_RUN_COLOURS)]
    style = _HOST_STYLES[r.hosts.index(run.host) % len(_HOST_STYLES)] if multi_host else '-'
    xs = [t - t0 for t, _ in run.points]
    ys = [s for _, s in run.points]
    restored = 'none' if run.restored_step is None else run.restored_step
    ax.plot(xs, ys, color=colour, linestyle=style, linewidth=1.5, alpha=0.8,
            label=label(f'run {run.index} (restored {restored})'))
    if not run.exited:
      ax.scatter([xs[-1]], [ys[-1]], marker='x', color='grey', s=60, zorder=4,
                 label=label('run ended without exit (killed)'))
  for reason in sorted({s.reason for s in r.saves}):
    colour = _REASON_COLOURS.get(reason, 'tab:gray')
    for committed in (True, False):
      pts = [((s.t if s.t is not None else s.t_committed) - t0, s.step)
             for s in r.saves if s.reason == reason and s.committed == committed]
      if not pts:
        continue
      ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker='o', s=28, zorder=6,
                 edgecolors=colour, facecolors=colour if committed else 'none',
                 label=label(f'save: {reason}' + ('' if committed else ' (not committed)')))
  for p in r.preemptions:
    ax.axvline(p.t - t0, color='tab:red', linestyle='--', linewidth=1,
               label=label(f'preemption ({p.signal or "?"})'))
  exits = [(run.t_exit - t0, run.exit_step if run.exit_step is not None else (run.max_step or 0))
           for run in r.runs if run.exited and run.t_exit is not None]
  if exits:
    ax.scatter([x for x, _ in exits], [y for _, y in exits], marker='X', color='black', s=80,
               zorder=5, label=label('exit'))
  name = os.path.basename(os.fspath(r.job_log_dir).rstrip('/')) or r.job_log_dir
  ax.set_title(f'Checkpoint timeline: {name} ({len(r.hosts)} host{"s" if multi_host else ""}, '
               f'{r.restarts} restart{"" if r.restarts == 1 else "s"})'
               + ('; line style = host' if multi_host else ''))
  ax.set_xlabel('wall time since first event (s)')
  ax.set_ylabel('step')
  ax.grid(True, alpha=0.3)
  if labelled:
    ax.legend(loc='best', fontsize='small')
  fig.tight_layout()
  with epath.Path(path).open('wb') as f:
    fig.savefig(f, format='png')


# ----------------------------------------------------------------------------------------------
# Command line.


def _error(msg: str) -> None:
  print('report: error: ' + ' '.join(str(msg).split()), file=sys.stderr)


def run(job_log_dir: str, *, mtbf_hours: float | None = None, plot_path: str | None = None,
        as_json: bool = False, out: TextIO | None = None) -> int:
  """Prints the report (text, or JSON with `as_json`) to `out` (sys.stdout when None).

  Returns 0, or 2 after one line on stderr when the input is bad (no events, bad MTBF, unwritable plot).
  """
  out = sys.stdout if out is None else out
  try:
    if mtbf_hours is not None:
      m = _num(mtbf_hours)
      if m is None or m <= 0:
        raise ReportError(f'--mtbf_hours must be a positive number of hours, got {mtbf_hours!r}')
    report = load(job_log_dir)
    if plot_path:
      plot(report, plot_path)
  except (ReportError, OSError) as e:
    _error(e)
    return 2
  if as_json:
    out.write(json.dumps(report.to_dict(mtbf_hours), indent=2, sort_keys=True, allow_nan=False)
              + '\n')
  else:
    out.write(format_text(report, mtbf_hours) + '\n')
    if plot_path:
      out.write(f'plot: {plot_path}\n')
  return 0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='pax-autockpt report',
                                   description='Checkpoint timeline and figures of a job.')
  parser.add_argument('job_log_dir')
  parser.add_argument('--mtbf_hours', type=float, default=None)
  parser.add_argument('--plot', default=None, metavar='FILE.png')
  parser.add_argument('--json', action='store_true')
  args = parser.parse_args(argv)
  return run(args.job_log_dir, mtbf_hours=args.mtbf_hours, plot_path=args.plot, as_json=args.json)


if __name__ == '__main__':
  sys.exit(main())
