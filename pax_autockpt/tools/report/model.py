"""What a report holds: plain dataclasses, so that the text, the plot and `--json` show the same
figures, and `to_dict` is all the JSON output needs."""

from __future__ import annotations

import dataclasses
from typing import Iterable

from pax_autockpt.tools.report import values

REASONS = ('interval', 'continuous', 'preemption', 'final')


class ReportError(ValueError):
  """Bad input (no events, bad --mtbf_hours); its message is one line."""


@dataclasses.dataclass
class Stats:
  n: int = 0
  mean: float | None = None
  p50: float | None = None
  p90: float | None = None
  max: float | None = None

  @classmethod
  def of(cls, items: Iterable[float | None]) -> Stats:
    """The statistics of the known values (None is skipped); all None when there is none."""
    vals = sorted(v for v in items if v is not None)
    if not vals:
      return cls()
    return cls(n=len(vals), mean=sum(vals) / len(vals), p50=values.percentile(vals, 50),
               p90=values.percentile(vals, 90), max=vals[-1])

  @classmethod
  def of_weighted(cls, items: Iterable[tuple[float | None, int]]) -> Stats:
    """The statistics of each known value counted `weight` times (weights < 1 are left out), in the time and
    memory of the pairs: one odd event costs one figure."""
    pairs = sorted((v, w) for v, w in items if v is not None and w >= 1)
    if not pairs:
      return cls()
    total = sum(w for _, w in pairs)
    return cls(n=total, mean=sum(v * (w / total) for v, w in pairs), p50=values.weighted_percentile(pairs, 50),
               p90=values.weighted_percentile(pairs, 90), max=pairs[-1][0])


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
  reached_step: int | None        # exit step, else max_step (after a kill: at least the next run's restored step)
  # (time, step) for the plot; left out of the JSON output.
  points: list[tuple[float, int]] = dataclasses.field(default_factory=list, repr=False)
  restored_from: str | None = None  # 'local', 'job_dir' or None (fresh, or not recorded)
  restore_s: float | None = None  # how long its restore took (None: nothing restored, or a log before the field)
  process_start_t: float | None = None  # its process's start (None: not recorded: off Linux, or an older log)
  imported_s: float | None = None  # process start -> pax_autockpt.main's imports done
  distributed_s: float | None = None  # paxml's setup_jax: jax.distributed's initialize (pax_autockpt.main only)
  t_first_step: float | None = None  # its `first_step` event: the first step done (None: none logged)
  compile_s: float | None = None  # its first train_step call: the step's trace and compile

  @property
  def trained(self) -> bool:
    """It reached its `start` (its restore done): a restart without one ended before training (its restore failed,
    or it was killed in it). The first run without one is a log whose beginning was lost."""
    return self.t_start is not None or self.index == 0


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
  exit_after_s: float | None      # the signal's arrival (else the agreement) -> that host's exit, max over hosts
  exit_after_s_by_host: dict[int, float]
  exit_codes: list[int]
  signal_at: float | None = None  # the earliest arrival of the signal on any host (None: not recorded)
  agreed_after_s: float | None = None  # the signal's arrival -> the first host's agreement on the step
  plan: str | None = None         # save, keep_in_flight, give_up, nothing_to_save (None: not recorded)
  saved_step: int | None = None   # the step the exit waited for (an earlier one for keep_in_flight)
  during: str | None = None       # the loop's phase the signal found (pax_autockpt.shared.phases; None: not recorded)
  agreed_during: str | None = None  # where the hosts agreed: checkpoint (the loop's call), eval, decode, rescue


@dataclasses.dataclass
class Notice:
  """A maintenance or preemption notice (CONTRACT §8), merged over hosts."""
  step: int | None                # the step every host saved for it
  source: str | None              # maintenance-event, preempted, upcoming-maintenance
  value: str | None
  seen_by: int | None             # the host whose metadata server gave it
  t: float
  committed: bool                 # its save committed
  lead_s: float | None            # notice -> the next preemption signal in the same run
  steps_after: int | None         # steps trained after the notice save, up to that preemption


@dataclasses.dataclass
class RestartPhases:
  """One restart's downtime phase by phase, on one host (host 0's, else the lowest host's): scheduler_s through
  restore_s add up to the restart's downtime (the previous run's last event -> this run's `start`), first_step_s
  takes it on to the first step's end; total_s is the sum (an unknown phase counts 0, its time in setup_s)."""
  scheduler_s: float              # the previous run's last event -> this process's start: the scheduler's part
  imports_s: float | None         # process start -> pax_autockpt.main's imports (paxml, jax) done
  distributed_s: float | None     # paxml's setup_jax: jax.distributed.initialize and the backend's start
  setup_s: float                  # the rest before the `start` event: flags, experiment, model, checkpoint listing
  restore_s: float | None
  first_step_s: float | None      # `start` -> the first step done: its compile, its input, the step
  compile_s: float | None         # within first_step_s: the first train_step call (trace and compile)
  total_s: float


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
  restored_from: str | None = None  # the tier the new run restored from: 'local', 'job_dir' or None
  previous_exit_code: int | None = None  # how the previous run ended (None: killed, or not recorded)
  phases: RestartPhases | None = None  # None: the `start` records no process start (off Linux, an older log)
  previous_index: int | None = None  # the run before it that trained (a restart that ended before training skipped)
  trained: bool = True            # False: this restart ended before training (restore failed, or killed in it)
  exit_code: int | None = None    # how this restart ended, when it ended before training (None: killed)


@dataclasses.dataclass
class LocalTier:
  """The local tier (--autockpt_local_dir): its commits, merged over hosts, and what restarts used."""
  saves_committed: int            # local steps committed (on the lowest host that logged any)
  interval_s: Stats               # between consecutive local commits of one run (per summary: its mean)
  duration_s: Stats               # a local save's start -> its commit
  restored_from: list[str | None]  # per job run: 'local', 'job_dir' or None (fresh, or not recorded)
  count_lower_bound: bool = False  # a run that summed up its commits was killed: its last summary's are unlogged
  # (time, newest step) of each local_committed event, for the plot; left out of the JSON output.
  points: list[tuple[float, int]] = dataclasses.field(default_factory=list, repr=False)


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
  notices: list[Notice]
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
  checkpoints_complete: list[int]   # committed (pax_autockpt.layout's rule), ascending
  checkpoints_incomplete: int       # attempts not committed: orbax temporaries, unmarked gs:// ones
  newest_checkpoint: int | None
  unparsable_lines: int
  malformed_events: int           # valid JSON records missing a required field (e.g. an int step)
  event_counts: dict[str, int]
  save_cost_s: float | None       # goodput delta
  interval_p50_s: float | None    # goodput tau
  restart_cost_s: float           # goodput R
  restart_cost_note: str
  local: LocalTier | None = None  # the local tier's saves and restores (None: the job never used one)
  adaptive_interval_s: float | None = None   # the Young/Daly interval at the last continuous save
  adaptive_mtbf_hours: float | None = None   # the MTBF it was computed for (--autockpt_mtbf_hours)
  restart_phases: dict[str, float | None] | None = None  # per RestartPhases field, its median over the restarts
  # (save start, step) of each checkpoint a restore set aside, for the plot; left out of the JSON output.
  set_aside_points: list[tuple[float, int]] = dataclasses.field(default_factory=list, repr=False)
