"""Reads a job directory into a Report: its event logs and the listing of its checkpoints.

The events come from `pax_autockpt.shared.events.read_job` (the one reader: `json.loads` and nothing else);
which checkpoints are committed is `pax_autockpt.layout`'s rule. The interpretations behind each
figure are in the package docstring; the steps below follow it in order.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from typing import Any, Callable, Iterable

from etils import epath

from pax_autockpt import layout
from pax_autockpt.save import costs
from pax_autockpt.shared import events
from pax_autockpt.tools.report import model
from pax_autockpt.tools.report import values

# Events logged per step by every host that must carry an int step; without one they are malformed.
_STEP_EVENTS = ('save_started', 'save_committed', 'deleted', 'restore_skipped')
# Events whose step says how far their run had trained when they were written: a run's (time, step) points.
_PROGRESS_POINTS = ('save_started', 'local_committed', 'preemption', 'exit', 'first_step', 'progress')
# Events a process writes while it restores, before its `start` event (pax_autockpt.restore.restore).
_BEFORE_START = ('restore_failed', 'restore_skipped', 'local_restore_failed', 'input_restarted')


@dataclasses.dataclass
class _Event:
  host: int
  run: int                        # index of the run on its host (see _read_events)
  t: float
  name: str
  rec: dict[str, Any]


# Host -> that host's event of one kind: the same event as each host logged it.
_Group = dict[int, _Event]


@dataclasses.dataclass
class _EventLogs:
  events: list[_Event]            # host by host, each host's in the order written
  files: list[str]                # names of the event files, host by host
  unparsable: int


def _run_indices(records: list[dict[str, Any]]) -> list[int]:
  """Each record's run: one process, bounded by the process that wrote it, not by its `start` event alone.

  Every event carries its process's mark (`process`): a new mark begins a new run. A log written before the mark
  is cut by what a process writes: its restore's events (_BEFORE_START) before its `start`, which comes once the
  restore is done, and nothing but late writes after its `exit`; so there a `start` or a restore's event begins a
  new run once the current run has a `start` or an `exit`. Either way a restart's failed restore (`restore_failed`,
  `exit` 1) or a damaged checkpoint it set aside belongs to the restart, not to the killed run before it. A process
  that ended before its `start` (its restore failed, or it was killed in it) is a run without one.
  """
  out, run, started, ended, mark = [], -1, False, False, None
  for rec in records:
    name, was, mark = rec['event'], mark, values.string(rec.get('process'))
    new_mark = mark is not None and was is not None and mark != was
    if run < 0 or new_mark or ((name == 'start' or name in _BEFORE_START) and (started or ended)):
      run, started, ended = run + 1, False, False
    started = started or name == 'start'
    ended = ended or name == 'exit'
    out.append(run)
  return out


def _read_events(root: epath.Path) -> _EventLogs:
  """Every host's events, each tagged with its run (_run_indices); ReportError when there is none.

  Events before the first `start` (a log whose beginning was lost) form a run of their own.
  """
  logs = events.read_job(root)
  evs = []
  for log in logs.values():
    for rec, run in zip(log.records, _run_indices(log.records)):
      evs.append(_Event(log.host, run, float(rec['t']), rec['event'], rec))
  files = [name for log in logs.values() for name in log.files]
  unparsable = sum(log.unparsable for log in logs.values())
  if not evs:
    where = f'{layout.autockpt_dir(root)}/events.host<IDX>.jsonl'
    if files:
      raise model.ReportError(f'no events found in {where} ({unparsable} unparsable lines)')
    raise model.ReportError(f'no events found: no {where} files')
  return _EventLogs(evs, files, unparsable)


def _step(e: _Event) -> int | None:
  return values.integer(e.rec.get('step'))


def _merge(evs: list[_Event], name: str, required: bool = True) -> dict[tuple[Any, int], _Group]:
  """Groups one kind of event across hosts: the k-th one for a step on each host is one group.

  Keyed by (step, k), in the order the groups first appear. With `required`, events without an int
  step are left out (they are counted by _malformed).
  """
  seen: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
  groups: dict[tuple[Any, int], _Group] = {}
  for e in evs:
    if e.name != name:
      continue
    step = _step(e)
    if step is None and required:
      continue
    groups.setdefault((step, seen[e.host][step]), {})[e.host] = e
    seen[e.host][step] += 1
  return groups


def _pick(group: _Group) -> _Event:
  """The event that speaks for a group: host 0's, else the lowest host's."""
  return group[0] if 0 in group else group[min(group)]


def _malformed(evs: list[_Event]) -> int:
  return sum(1 for e in evs if e.name in _STEP_EVENTS and _step(e) is None)


def _counts(items: Iterable[Any]) -> dict[Any, int]:
  """How often each item occurs, sorted by item so that the output is stable."""
  return dict(sorted(collections.Counter(items).items()))


# ----------------------------------------------------------------------------------------------
# Runs.


def _by_run(evs: list[_Event]) -> dict[tuple[int, int], list[_Event]]:
  """(host, run index) -> that run's events in order, sorted by host, then run."""
  out: dict[tuple[int, int], list[_Event]] = {}
  for e in evs:
    out.setdefault((e.host, e.run), []).append(e)
  return dict(sorted(out.items()))


def _run(host: int, index: int, rev: list[_Event]) -> model.Run:
  """One run from its events (`rev`: its restore's events, then its `start`; no `start` when the log's beginning
  was lost, or the process ended before training)."""
  start = next((e for e in rev if e.name == 'start'), None)
  start_rec = start.rec if start else {}
  restored = values.integer(start_rec.get('restored_step'))
  exit_ev = next((e for e in rev if e.name == 'exit'), None)
  exit_rec = exit_ev.rec if exit_ev else {}
  points: list[tuple[float, int]] = []
  if start is not None:
    points.append((start.t, restored if restored is not None else 0))
  for e in rev:
    step = _step(e) if e.name in _PROGRESS_POINTS else None
    if step is not None:
      points.append((e.t, step))
  committed = [_step(e) for e in rev if e.name in ('save_committed', 'local_committed')]
  max_step = values.max_known([s for _, s in points] + committed)
  exit_step = values.integer(exit_rec.get('step'))
  points.sort()
  first = next((e for e in rev if e.name == 'first_step'), None)
  return model.Run(
      host=host, index=index, t_start=start.t if start else None,
      pid=values.integer(start_rec.get('pid')),
      num_hosts=values.integer(start_rec.get('num_hosts')),
      restored_step=restored, t_last=max(e.t for e in rev), max_step=max_step,
      exited=exit_ev is not None, exit_code=values.integer(exit_rec.get('code')),
      exit_step=exit_step, t_exit=exit_ev.t if exit_ev else None,
      reached_step=exit_step if exit_step is not None else max_step, points=points,
      restore_s=values.duration(start_rec.get('restore_s')),
      process_start_t=values.number(start_rec.get('process_start_t')),
      imported_s=values.duration(start_rec.get('imported_s')),
      distributed_s=values.duration(start_rec.get('distributed_s')),
      t_first_step=first.t if first else None, compile_s=values.duration(first.rec.get('compile_s')) if first else None,
      restored_from=events.restored_tier(values.string(start_rec.get('restored_from'))) or
      (events.JOB_DIR if restored is not None else None))  # a start logged before the field: the job directory's


def _reached_by_the_next(run_by_key: dict[tuple[int, int], model.Run]) -> None:
  """A killed run trained at least to the step the next run that trained restored: its log lags behind what it
  trained (the local tier's commits are summed up once a minute), and the restored step proves how far it got."""
  nxt: dict[int, model.Run] = {}  # host -> the next run that trained, walking back
  for (host, _), r in reversed(run_by_key.items()):
    after = nxt.get(host)
    if not r.exited and after is not None and after.restored_step is not None:
      r.reached_step = values.max_known([r.reached_step, after.restored_step])
    if r.trained:
      nxt[host] = r


def _restored_steps(runs: list[model.Run]) -> list[int | None]:
  """Per job run (the k-th run of every host): host 0's restored step, else the lowest host's."""
  by_index: dict[int, dict[int, model.Run]] = collections.defaultdict(dict)
  for r in runs:
    by_index[r.index][r.host] = r
  out = []
  for k in range(max(by_index) + 1):
    by_host = by_index[k]
    out.append((by_host[0] if 0 in by_host else by_host[min(by_host)]).restored_step)
  return out


# ----------------------------------------------------------------------------------------------
# Saves.


def _groups_by_step(evs: list[_Event], name: str) -> dict[int, list[_Group]]:
  """Step -> its groups of one kind of save event, the k-th group k-th."""
  out: dict[int, list[_Group]] = collections.defaultdict(list)
  for (step, _), group in sorted(_merge(evs, name).items(), key=lambda kv: kv[0]):
    out[step].append(group)
  return out


def _pair_commits(started: list[_Group],
                  committed: list[_Group]) -> list[tuple[_Group | None, _Group | None]]:
  """Pairs one step's commits with its starts: the k-th commit of a step in a run completes that
  run's start of that step (else the first earlier start); unpaired starts were never committed."""
  pending = list(started)
  pairs: list[tuple[_Group | None, _Group | None]] = []
  for c in committed:
    pc = _pick(c)
    s = next((g for g in pending if _pick(g).run == pc.run), None)
    if s is None:
      s = next((g for g in pending if _pick(g).t <= pc.t), None)
    if s is not None:
      pending.remove(s)
    pairs.append((s, c))
  pairs.extend((g, None) for g in pending)
  return pairs


def _group_time(group: _Group, fallback: Callable[[Iterable[float]], float]) -> float | None:
  """Host 0's time when it logged the event, else `fallback` (min or max) of the hosts' times."""
  if not group:
    return None
  return group[0].t if 0 in group else fallback(e.t for e in group.values())


def _save(step: int, started: _Group | None, committed: _Group | None) -> model.Save:
  """One save merged over hosts: the max cost over hosts, host 0's times when it logged them (else
  the earliest start, the latest commit), host 0's reason."""
  started, committed = started or {}, committed or {}
  reason = values.string(_pick(started).rec.get('reason')) if started else None
  return model.Save(
      step=step, reason=reason or 'unknown', t=_group_time(started, min),
      t_committed=_group_time(committed, max),
      blocking_s=values.max_known(values.duration(e.rec.get('blocking_s'))
                                  for e in started.values()),
      duration_s=values.max_known(values.duration(e.rec.get('duration_s'))
                                  for e in committed.values()),
      committed=bool(committed), hosts=sorted(set(started) | set(committed)),
      run=_pick(started or committed).run)


def _saves(evs: list[_Event]) -> list[model.Save]:
  """Every save once, by start time (commit time when its start was not logged)."""
  started = _groups_by_step(evs, 'save_started')
  committed = _groups_by_step(evs, 'save_committed')
  saves = []
  for step in sorted(set(started) | set(committed)):
    for s, c in _pair_commits(started.get(step, []), committed.get(step, [])):
      saves.append(_save(step, s, c))
  saves.sort(key=lambda x: (x.t if x.t is not None else x.t_committed, x.step))
  return saves


def _cost_stats(started: list[model.Save], committed: list[model.Save],
                reasons: list[str]) -> tuple[dict[str, model.Stats], dict[str, model.Stats]]:
  """Blocking time of started saves and duration of committed ones: 'all', then by reason."""
  blocking = {'all': model.Stats.of(s.blocking_s for s in started)}
  duration = {'all': model.Stats.of(s.duration_s for s in committed)}
  for reason in reasons:
    blocking[reason] = model.Stats.of(s.blocking_s for s in started if s.reason == reason)
    duration[reason] = model.Stats.of(s.duration_s for s in committed if s.reason == reason)
  return blocking, duration


def _intervals(committed: list[model.Save]) -> tuple[model.Stats, model.Stats, float | None]:
  """Steps and seconds between consecutive committed saves of one run, and the median seconds per step
  measured there. A pair across a restart is left out: its seconds would count the downtime, which the
  restart cost R counts (and its steps, a preemption's off-interval step, are no interval either)."""
  isteps, isecs, rates = [], [], []
  for a, b in zip(committed, committed[1:]):
    ds = b.step - a.step
    if ds <= 0 or a.run != b.run:
      continue
    if a.t is not None and b.t is not None:
      dt = b.t - a.t
    else:
      dt = (b.t_committed - a.t_committed
            if a.t_committed is not None and b.t_committed is not None else None)
    isteps.append(ds)
    if dt is not None:
      isecs.append(dt)
      if dt > 0:
        rates.append(dt / ds)
  return model.Stats.of(isteps), model.Stats.of(isecs), values.median(rates)


def _per_commit(mine: list[_Event]) -> tuple[list[tuple[float | None, int]], list[tuple[float | None, int]]]:
  """Each local commit's interval and duration as (value, how many commits it stands for), so that the figures are
  the commits', not the events', in the time and memory of the events (an event's `commits` is a weight, never a
  list's length: one odd event costs one figure).

  An event sums up `commits` commits with their mean `interval_s` and the newest one's `duration_s`
  (pax_autockpt.local.saving.CommitTally): both stand for each of its commits, or a minute of 120 commits
  would weigh as much as the run's first. Logs written before that have one event per commit, and the gaps
  between them are the intervals.
  """
  weights = [_commits(e) for e in mine]
  durations = [(values.duration(e.rec.get('duration_s')), n) for e, n in zip(mine, weights)]
  if not any(values.integer(e.rec.get('commits')) is not None for e in mine):
    return [(b.t - a.t, 1) for a, b in zip(mine, mine[1:]) if a.run == b.run], durations
  return [(values.duration(e.rec.get('interval_s')), n) for e, n in zip(mine, weights)], durations


def _commits(e: _Event) -> int:
  """How many local commits an event stands for (1 where it does not say: one event per commit)."""
  return max(0, values.integer(e.rec.get('commits')) or 1)


def _local_tier(evs: list[_Event], runs: list[model.Run]) -> model.LocalTier | None:
  """The local tier's commits on the lowest host that logged any, and the tier each job run restored."""
  local = [e for e in evs if e.name == 'local_committed' and _step(e) is not None]
  if not local and all(r.restored_from != events.LOCAL for r in runs):
    return None
  host = min((e.host for e in local), default=0)
  mine = [e for e in local if e.host == host]
  gaps, durations = _per_commit(mine)
  by_index = collections.defaultdict(dict)
  for r in runs:
    by_index[r.index][r.host] = r.restored_from
  restored = [hosts.get(0, hosts[min(hosts)]) for _, hosts in sorted(by_index.items())]
  killed = {r.index for r in runs if r.host == host and not r.exited}
  return model.LocalTier(saves_committed=sum(_commits(e) for e in mine),
                         interval_s=model.Stats.of_weighted(gaps), duration_s=model.Stats.of_weighted(durations),
                         restored_from=restored, points=[(e.t, _step(e)) for e in mine],
                         count_lower_bound=any(e.run in killed and 'commits' in e.rec for e in mine))


def _set_aside_points(skipped: list[_Event], saves: list[model.Save]) -> list[tuple[float, int]]:
  """Where each checkpoint a restore set aside was saved: the newest committed save of its step before the event."""
  out = []
  for e in skipped:
    before = [s for s in saves if s.step == _step(e) and s.committed and s.t is not None and s.t <= e.t]
    if before:
      out.append((before[-1].t, before[-1].step))
  return out


def _adaptive(evs: list[_Event]) -> tuple[float | None, float | None]:
  """The adaptive interval and its MTBF recorded with the job's last continuous save (host 0's when
  it logged any, else the lowest host's)."""
  found = [e for e in evs if e.name == 'save_started' and values.duration(e.rec.get('interval_s')) is not None
           and values.duration(e.rec.get('mtbf_hours')) is not None]
  if not found:
    return None, None
  last = max(found, key=lambda e: (-e.host, e.t))
  return values.duration(last.rec['interval_s']), values.duration(last.rec['mtbf_hours'])


def _save_cost(started: list[model.Save]) -> float | None:
  """Goodput's delta: the mean blocking time of the saves a preemption did not force, by training's own rule
  (`pax_autockpt.save.costs`), so that the report's delta is the one the adaptive interval used."""
  save_costs = costs.SaveCosts()
  for s in started:
    save_costs.add_blocking(s.reason, s.blocking_s)
  return save_costs.blocking_s


# ----------------------------------------------------------------------------------------------
# Preemptions.


def _preemption(group: _Group, run_by_key: dict[tuple[int, int], model.Run],
                replanned: dict[tuple[int, int, int | None], _Event]) -> model.Preemption:
  """One preemption merged over hosts, with how long each host took from the signal's arrival (on the
  host it reached first; logs written before arrivals were recorded: from the agreement) to its exit."""
  first = _pick(group)
  plan = replanned.get((first.host, first.run, _step(first)), first)  # the plan changed after the save in flight
  arrivals = [a for a in (values.number(e.rec.get('signal_at')) for e in group.values()) if a is not None]
  signal_at = min(arrivals) if arrivals else None
  reached = [e for e in group.values() if values.number(e.rec.get('signal_at')) == signal_at] or [first]
  agreed_at = min(e.t for e in group.values())
  by_host = {}
  codes = []
  for h, e in group.items():
    r = run_by_key[(h, e.run)]
    since = e.t if signal_at is None else signal_at
    if r.exited and r.t_exit is not None and r.t_exit >= since:
      by_host[h] = r.t_exit - since
      if r.exit_code is not None:
        codes.append(r.exit_code)
  return model.Preemption(
      step=_step(first), signal=values.string(first.rec.get('signal')),
      t=first.t, hosts=sorted(group), exit_after_s=values.max_known(by_host.values()),
      exit_after_s_by_host=dict(sorted(by_host.items())), exit_codes=sorted(set(codes)), signal_at=signal_at,
      agreed_after_s=None if signal_at is None else max(0.0, agreed_at - signal_at),
      plan=values.string(plan.rec.get('plan')), saved_step=values.integer(plan.rec.get('saved_step')),
      during=values.string(reached[0].rec.get('during')), agreed_during=values.string(first.rec.get('agreed_during')))


def _preemptions(evs: list[_Event],
                 run_by_key: dict[tuple[int, int], model.Run]) -> list[model.Preemption]:
  # A preemption may lack an agreed step; it is still a preemption.
  replanned = {(e.host, e.run, _step(e)): e for e in evs if e.name == 'exit_replanned'}
  found = [_preemption(g, run_by_key, replanned) for g in _merge(evs, 'preemption', required=False).values()]
  return sorted(found, key=lambda p: p.t)


def _notices(evs: list[_Event], saves: list[model.Save]) -> list[model.Notice]:
  """Notices, each with its lead over the next preemption of the same run (host 0's view)."""
  committed = {s.step for s in saves if s.committed}
  found = []
  for group in _merge(evs, 'notice', required=False).values():
    first = _pick(group)
    after = next((e for e in evs if e.name == 'preemption' and e.host == first.host and e.run == first.run
                  and e.t >= first.t), None)
    step, later = _step(first), _step(after) if after else None
    found.append(model.Notice(
        step=step, source=values.string(first.rec.get('source')), value=values.string(first.rec.get('value')),
        seen_by=values.integer(first.rec.get('seen_by')), t=first.t, committed=step in committed,
        lead_s=after.t - first.t if after else None,
        steps_after=later - step if later is not None and step is not None else None))
  return sorted(found, key=lambda n: n.t)


# ----------------------------------------------------------------------------------------------
# Restarts.


@dataclasses.dataclass
class _HostRestart:
  """One host's side of a restart; a Restart merges these over hosts."""
  host: int
  reached_step: int               # what the previous run reached (a lower bound without an exit)
  restored_step: int | None
  steps_lost: int
  lower_bound: bool               # the previous run had no exit event
  downtime_s: float | None        # previous run's last event -> this run's start
  startup_s: float | None         # start -> first save, less the steps trained in between
  restored_from: str | None       # 'local', 'job_dir' or None
  previous_exit_code: int | None
  phases: model.RestartPhases | None = None
  previous_index: int | None = None  # the run before it that trained
  trained: bool = True            # False: it ended before training; the figures above are then empty
  exit_code: int | None = None    # its own exit code, when it ended before training

  @property
  def cost_s(self) -> float | None:
    if self.downtime_s is None and self.startup_s is None:
      return None
    return (self.downtime_s or 0.0) + (self.startup_s or 0.0)


def _startup(r: model.Run, rev: list[_Event], restored: int,
             seconds_per_step: float | None) -> float | None:
  """Start -> the run's first save, less the time its steps trained take; None if not measurable."""
  first_save = next((e for e in rev if e.name == 'save_started' and _step(e) is not None), None)
  if first_save is None or seconds_per_step is None or r.t_start is None:
    return None
  trained = max(0, _step(first_save) - restored) * seconds_per_step
  return max(0.0, first_save.t - r.t_start - trained)


def _phases(r: model.Run, prev: model.Run) -> model.RestartPhases | None:
  """Run `r`'s downtime after `prev` phase by phase; None where its `start` records no process start. The
  phases add up exactly: what no field names (flags, the experiment, the model, the listing) is setup_s."""
  if r.process_start_t is None or r.t_start is None:
    return None
  scheduler = r.process_start_t - prev.t_last
  named = sum(x or 0.0 for x in (r.imported_s, r.distributed_s, r.restore_s))
  setup = r.t_start - r.process_start_t - named
  first = None if r.t_first_step is None else r.t_first_step - r.t_start
  return model.RestartPhases(
      scheduler_s=scheduler, imports_s=r.imported_s, distributed_s=r.distributed_s, setup_s=setup,
      restore_s=r.restore_s, first_step_s=first, compile_s=r.compile_s,
      total_s=scheduler + named + setup + (first or 0.0))


def _median_phases(restarts: list[model.Restart]) -> dict[str, float | None] | None:
  """Each phase's median over the restarts that recorded it, and how many restarts had phases ('restarts')."""
  known = [r.phases for r in restarts if r.phases is not None]
  if not known:
    return None
  medians = {f.name: values.median([v for v in (getattr(p, f.name) for p in known) if v is not None])
             for f in dataclasses.fields(model.RestartPhases)}
  return {'restarts': len(known), **medians}


def _host_restart(r: model.Run, prev: model.Run, rev: list[_Event],
                  seconds_per_step: float | None) -> _HostRestart:
  """Run `r` restarting after `prev` on one host: what was lost, and what the restart cost."""
  reached = prev.reached_step
  if reached is None:
    reached = prev.restored_step or 0
  restored = r.restored_step if r.restored_step is not None else 0
  if not r.trained:  # nothing restored, nothing lost yet: the next run that trains says what survived
    return _HostRestart(host=r.host, reached_step=reached, restored_step=None, steps_lost=0, lower_bound=False,
                        downtime_s=None, startup_s=None, restored_from=None, previous_exit_code=prev.exit_code,
                        previous_index=prev.index, trained=False, exit_code=r.exit_code)
  return _HostRestart(
      host=r.host, reached_step=reached, restored_step=r.restored_step,
      steps_lost=max(0, reached - restored), lower_bound=not prev.exited,
      downtime_s=(r.t_start - prev.t_last) if r.t_start is not None else None,
      startup_s=_startup(r, rev, restored, seconds_per_step), restored_from=r.restored_from,
      previous_exit_code=prev.exit_code, phases=_phases(r, prev), previous_index=prev.index)


def _restart(index: int, rows: list[_HostRestart]) -> model.Restart:
  """One restart of the job: the worst host's figures, host 0's restored step, the lowest host's phases that has
  them (one host's: a phase-wise max over hosts would not add up)."""
  first = next((row for row in rows if row.host == 0), rows[0])
  return model.Restart(
      index=index, hosts=sorted(row.host for row in rows),
      reached_step=values.max_known(row.reached_step for row in rows),
      restored_step=first.restored_step, steps_lost=max(row.steps_lost for row in rows),
      lower_bound=any(row.lower_bound for row in rows),
      downtime_s=values.max_known(row.downtime_s for row in rows),
      startup_s=values.max_known(row.startup_s for row in rows),
      cost_s=values.max_known(row.cost_s for row in rows), restored_from=first.restored_from,
      previous_exit_code=first.previous_exit_code,
      phases=next((w.phases for w in sorted(rows, key=lambda w: w.host) if w.phases), None),
      previous_index=first.previous_index, trained=all(row.trained for row in rows), exit_code=first.exit_code)


def _restarts(run_events: dict[tuple[int, int], list[_Event]],
              run_by_key: dict[tuple[int, int], model.Run],
              seconds_per_step: float | None) -> list[model.Restart]:
  """Every restart of the job (run k >= 1), merged over the hosts that restarted. Each is measured against the
  run before it that trained: a restart that ended before training restored nothing and lost nothing itself."""
  rows: dict[int, list[_HostRestart]] = collections.defaultdict(list)
  prev: dict[int, model.Run] = {}  # host -> its latest run that trained
  for r in run_by_key.values():
    if r.index > 0:
      before = prev.get(r.host, run_by_key[(r.host, r.index - 1)])
      rows[r.index].append(_host_restart(r, before, run_events[(r.host, r.index)], seconds_per_step))
    if r.trained:
      prev[r.host] = r
  return [_restart(k, rows[k]) for k in sorted(rows)]


def _restart_cost(restarts: list[model.Restart],
                  seconds_per_step: float | None) -> tuple[float, str]:
  """Goodput's R (mean over the restarts whose cost is known) and a note on how it was measured."""
  known = [r.cost_s for r in restarts if r.cost_s is not None]
  if not known:
    return 0.0, ('no restart yet, counted as 0' if not restarts else 'not measurable, counted as 0')
  note = (f'the mean over {len(known)} restart{"s" if len(known) > 1 else ""}: from the last event of a run to the '
          'next run\'s first save, less the time it spent training before that save')
  if seconds_per_step is None:
    note += '; the start-up after a restart not measurable, counted as 0'
  return sum(known) / len(known), note


# ----------------------------------------------------------------------------------------------
# Checkpoint directory.


def _checkpoints(root: epath.Path) -> tuple[epath.Path, list[int], int]:
  """The checkpoint directory, its committed steps (ascending), and how many entries in it are
  attempts that never committed: orbax's temporary directories, and on object storage a final
  name without its commit marker."""
  ckpt_dir = layout.checkpoint_dir(root)
  if not ckpt_dir.is_dir():
    return ckpt_dir, [], 0
  complete = layout.committed_steps(ckpt_dir)
  committed = set(complete)
  incomplete = 0
  for p in ckpt_dir.iterdir():
    step = layout.step_of(p.name)
    if layout.ORBAX_TMP in p.name or (step is not None and step not in committed):
      incomplete += 1
  return ckpt_dir, complete, incomplete


# ----------------------------------------------------------------------------------------------
# The report.


def load(job_log_dir: str | os.PathLike) -> model.Report:
  """Reads a job's event logs and checkpoint listing; raises ReportError when there are no events."""
  root = epath.Path(job_log_dir)
  logs = _read_events(root)
  evs = logs.events
  run_events = _by_run(evs)
  runs = [_run(host, index, rev) for (host, index), rev in run_events.items()]
  run_by_key = {(r.host, r.index): r for r in runs}
  _reached_by_the_next(run_by_key)
  hosts = sorted({e.host for e in evs})
  start_counts = collections.Counter(r.host for r in runs)  # processes, with or without a `start` event
  starts_per_host = {h: start_counts[h] for h in hosts}
  saves = _saves(evs)
  started = [s for s in saves if s.t is not None]
  committed = [s for s in saves if s.committed]
  blocking, duration = _cost_stats(started, committed, sorted({s.reason for s in saves}))
  interval_steps, interval_s, seconds_per_step = _intervals(committed)
  restarts = _restarts(run_events, run_by_key, seconds_per_step)
  steps_lost = [r.steps_lost for r in restarts]
  restart_cost, restart_cost_note = _restart_cost(restarts, seconds_per_step)
  deleted = [_pick(g) for g in _merge(evs, 'deleted').values()]
  skipped = [_pick(g) for g in _merge(evs, 'restore_skipped').values()]
  ckpt_dir, complete, incomplete = _checkpoints(root)
  adaptive_interval, adaptive_mtbf = _adaptive(evs)
  return model.Report(
      job_log_dir=os.fspath(job_log_dir), event_files=logs.files,
      t0=min(e.t for e in evs), t_end=max(e.t for e in evs), hosts=hosts,
      num_hosts=values.max_known(r.num_hosts for r in runs), starts_per_host=starts_per_host,
      restarts=max(0, max(starts_per_host.values()) - 1), restored_steps=_restored_steps(runs),
      runs=runs, saves=saves, saves_started=len(started), saves_committed=len(committed),
      saves_by_reason=_counts(s.reason for s in started),
      committed_by_reason=_counts(s.reason for s in committed),
      steps_saved=sorted({s.step for s in committed}), blocking_s=blocking, duration_s=duration,
      interval_steps=interval_steps, interval_s=interval_s, seconds_per_step=seconds_per_step,
      preemptions=_preemptions(evs, run_by_key), notices=_notices(evs, saves),
      exit_codes=_counts(r.exit_code for r in runs if r.exited and r.exit_code is not None),
      restart_details=restarts, steps_lost_total=sum(steps_lost),
      steps_lost_max=max(steps_lost, default=0),
      steps_lost_lower_bound=any(r.lower_bound for r in restarts),
      deletions=len(deleted),
      deletions_by_policy=_counts(values.string(e.rec.get('policy')) or 'unknown' for e in deleted),
      restore_skipped=len(skipped), restore_skipped_steps=sorted(_step(e) for e in skipped),
      checkpoint_dir=os.fspath(ckpt_dir), checkpoints_complete=complete,
      checkpoints_incomplete=incomplete, newest_checkpoint=complete[-1] if complete else None,
      unparsable_lines=logs.unparsable, malformed_events=_malformed(evs),
      event_counts=_counts(e.name for e in evs),
      save_cost_s=_save_cost(started), interval_p50_s=interval_s.p50,
      restart_cost_s=restart_cost, restart_cost_note=restart_cost_note,
      adaptive_interval_s=adaptive_interval, adaptive_mtbf_hours=adaptive_mtbf, local=_local_tier(evs, runs),
      restart_phases=_median_phases(restarts), set_aside_points=_set_aside_points(skipped, saves))
