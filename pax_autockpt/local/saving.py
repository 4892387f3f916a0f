"""Continuous saves to the local tier, beside the job directory's checkpoints.

Every host, every iteration, asks one agreed question (the primary host decides, as for the job directory's
saves): is a local save due (the previous one finished, the minimum interval passed, no signal)? The
interval is `local_min_interval_secs` when set, else it sets itself from the previous local save's cost
(`auto_interval`), so that the tier's default costs training little.
If so each host copies the shards it holds and its input position on the training thread, and one
background thread writes them (pax_autockpt.local.format). A local step is committed on a host only once
every host wrote its part: each host publishes "done, with my input position" through the coordination
service, waits (bounded) for all the others, writes every host's input position into its index (so
that a peer can restore a replaced host's position too) and renames. A host killed mid-save leaves its
peers' parts uncommitted after the bound, never a step some host lacks a part of. No device collective
runs in the background. Each step records its lineage (pax_autockpt.local.lineage), taken with the state. After a
commit the newest `local_keep` steps this run committed stay; every other committed step in the directory
(older ones, another job's, a rolled-back lineage's) goes.

A tier that cannot wedge or be shared: the directory is held by this process (pax_autockpt.local.lock) before
anything in it is read or deleted; leftovers (`.partial`s a kill left, steps this run will not keep) go before
each save needs their room, not only after a commit, so a directory sized for `local_keep + 1` steps never
fills after a SIGKILL; the first save says in one line when `local_keep + 1` steps of this host's share cannot
fit; saves that keep failing are one line and one `local_save_failed` event a minute (FailureSummary).

A directory may hold another job's steps (a copy of the job directory run with the same `--autockpt_local_dir`:
issue 57). Those are that job's progress, not leftovers: this job never deletes or overwrites them (its save of a
step number another job holds here fails instead), counts them as taken at the room check, and names that job
when they leave no room. With buddy copies the tier needs `local_keep + 4` shares at worst: `local_keep` own
commits, one own step kept beside a lagging buddy copy, the one being written, and two of the neighbour's (its
newest copy and the copy in flight); the first save's room check counts `buddy/` too.
"""

import base64
import errno
import os
import shutil
import threading
import time
from typing import Any, Callable

from absl import logging
from etils import epath
import jax

from pax_autockpt import layout
from pax_autockpt.hosts import agreement
from pax_autockpt.local import format as local_format
from pax_autockpt.local import lineage as lineage_lib
from pax_autockpt.local import lock
from pax_autockpt.shared import coordination
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import failures
from pax_autockpt.signals import signals

PEER_WAIT_SECS = 60.0  # a peer that has not written its part by then is gone: this step is not committed
SUMMARY_SECS = 60.0  # at most one `local_committed` event per this long (after the run's first)
AUTO_FACTOR = 20.0  # unset interval: a save's wall time is at most ~1/20 (5%) of the run's
AUTO_FLOOR_SECS = 1.0  # unset interval: never closer than this, however cheap the save
LOG_SECS = 10.0  # at most one log line on the local commits per this long (after the run's first)
FAILURE_SECS = 60.0  # while local saves keep failing, one line and one `local_save_failed` event per this long


class LocalSaves:
  """The local tier's saves for one host (see the module docstring)."""

  def __init__(self, folder: epath.PathLike, *, min_interval_secs: float | None, keep: int, events: events_lib.EventLog,
               lineage: lineage_lib.Tracker, on_commit: Callable[[int], None] | None = None, buddy: bool = False):
    self.folder = epath.Path(folder)
    lock.hold(self.folder, events.job_log_dir, events.host)  # made, and this job's, before anything here goes
    self._host, self._hosts = events.host, jax.process_count()
    self._client = coordination.client() if self._hosts > 1 else None
    self._min_interval = min_interval_secs  # None: set from the measured cost (auto_interval)
    self._cost: float | None = None  # the previous local save's wall time, capture to commit (or failure)
    self._told = False  # whether the cadence in effect was logged (once per run)
    self._keep = keep
    self._events = events
    self._lineage = lineage
    self._decide = agreement.PrimaryDecides(self._host, prefix=coordination.LOCAL_SAVE_DECISIONS)
    self._thread: threading.Thread | None = None
    self._last_start = -float('inf')
    self._published: list[int] = []  # steps whose coordination keys this host set
    self._newest = -1  # the newest step saved (or restored from here): leftovers of other runs do not count
    self._mine: list[int] = []  # the steps this run committed, oldest first
    self._restored: int | None = None  # the local step this run restored from: kept until its first commit
    self._lines = {lineage.token}  # the saves whose own step stays while its buddy copy does: this run's (+ restored)
    self._job = lineage.at(0).job  # this job's identity: the only job whose local steps this run deletes
    self._buddy = buddy  # this host keeps a neighbour's copies in buddy/ (room for two more shares)
    self._lineages: dict[tuple[str, int, int], lineage_lib.Lineage | None] = {}  # by (path, inode, mtime): read once
    self._room_checked = False  # whether the first save checked the free space yet
    self._tally = CommitTally(events)
    self._failures = FailureSummary(events)
    self._on_commit = on_commit  # after every host committed a step (buddy copies)

  def restored(self, step: int) -> None:
    """The run restored local step `step`: it is not saved again, and stays until this run's first commit."""
    self._newest = self._restored = step
    self._lines |= {self._token(layout.local_step_dir(self.folder, step))} - {None}

  def maybe_save(self, step: int, train_state: Any, pipeline: Any = None) -> None:
    """Once per loop iteration on every host, in the same order."""
    if not self._decide(lambda: self._due(step)):
      return
    if self._thread is not None:
      self._thread.join(PEER_WAIT_SECS)  # the primary's finished; a peer's is at most finishing its rename
      if self._thread.is_alive():
        logging.warning('[autockpt] local save of step %d skipped on this host: the previous one is still '
                        'writing after %.0f s.', step, PEER_WAIT_SECS)
        return
    self._last_start, self._newest = time.monotonic(), step
    jax.block_until_ready(train_state)
    captured = time.monotonic()  # the save's cost counts from here, not the wait for the step it saves
    snapshot = local_format.capture(train_state, pipeline)
    began = (time.time(), captured)
    self._thread = threading.Thread(target=self._finish, args=(step, snapshot, began, self._lineage.at(step)),
                                    name=f'autockpt-local-{step}', daemon=True)
    self._thread.start()

  def wait(self, timeout: float | None = PEER_WAIT_SECS) -> None:
    """At the end of training: the local save in flight ends before the process does (bounded), and the
    commits since the last summary are recorded."""
    if self._thread is not None:
      self._thread.join(timeout)
    self._tally.write()
    self._failures.report()

  @property
  def in_flight(self) -> bool:
    return self._thread is not None and self._thread.is_alive()

  def _due(self, step: int) -> bool:
    """On the primary: a step not saved locally yet, the previous local save done, the interval passed, and
    no signal (the grace period is the job-directory save's)."""
    idle = not self.in_flight and time.monotonic() - self._last_start >= self._interval()
    return idle and step > self._newest and signals.received() is None

  def _interval(self) -> float:
    """The minimum interval between local save starts in effect; the rule that sets it is logged once."""
    if self._min_interval is not None:
      interval, why = self._min_interval, 'set by --autockpt_local_min_interval_secs'
    elif self._cost is None:
      return 0.0  # nothing measured yet: the first save is the measurement
    else:
      interval = auto_interval(self._cost)
      why = (f"{AUTO_FACTOR:.0f}x the last save's duration, at least {AUTO_FLOOR_SECS:.0f} s; the first took "
             f'{self._cost:.3f} s; --autockpt_local_min_interval_secs sets a fixed interval')
    if not self._told:
      self._told = True
      logging.info('[autockpt] local tier: a local save at most every %.2f s now (%s).', interval, why)
    return interval

  def _finish(self, step: int, snapshot: local_format.Snapshot, began: tuple[float, float],
              lineage: lineage_lib.Lineage) -> None:
    """In the background: this host's part, every host's input positions, the commit, the pruning.
    `began`: the capture's wall-clock time (for the index) and monotonic time (for the duration)."""
    partial = None
    try:
      self._make_room(snapshot.nbytes)
      self._check_not_others(step)
      partial, arrays = local_format.write_part(self.folder, step, snapshot)
      inputs = self._exchange(step, snapshot.input_state)
      fp = local_format.fingerprint_of(snapshot)
      local_format.commit(partial, local_format.index(step, self._host, self._hosts, fp, arrays, inputs, began[0],
                                                      lineage, job_log_dir=str(self._events.job_log_dir)))
    except Exception as e:  # pylint: disable=broad-except
      self._cost = time.monotonic() - began[1]
      others = self._others() if getattr(e, 'errno', None) == errno.ENOSPC else []
      self._failures.failed(step, e, snapshot.nbytes, self._buddy, others)
      if partial is not None and partial.exists():
        partial.rmtree()
      return
    self._cost = time.monotonic() - began[1]
    self._mine.append(step)
    recovered = self._failures.report(committed=step)
    self._tally.add(step, self._cost, snapshot.nbytes)
    if recovered:
      self._tally.write(log=False)  # at once: the event log (and `status`) reads the tier as working again
    self._prune()
    if self._on_commit is not None:
      self._on_commit(step)

  def _exchange(self, step: int, mine: bytes | None) -> dict[int, bytes | None]:
    """Every host's input position at `step`, once every host has written its part (one host: its own)."""
    if self._client is None:
      return {self._host: mine}
    encoded = '-' if mine is None else base64.b64encode(mine).decode()
    self._client.key_value_set(f'{coordination.LOCAL_INPUT_POSITIONS}{step}/{self._host}', encoded)
    self._published.append(step)
    inputs = {}
    deadline = time.monotonic() + PEER_WAIT_SECS
    for host in range(self._hosts):
      wait_ms = max(1, int((deadline - time.monotonic()) * 1000))
      got = self._client.blocking_key_value_get(f'{coordination.LOCAL_INPUT_POSITIONS}{step}/{host}', wait_ms)
      inputs[host] = None if got == '-' else base64.b64decode(got)
    self._forget_keys(step)
    return inputs

  def _forget_keys(self, step: int) -> None:
    """This host's keys of steps before the previous one: every peer that committed them read them."""
    for old in [s for s in self._published if s < step][:-1]:
      self._published.remove(old)
      coordination.delete(self._client, f'{coordination.LOCAL_INPUT_POSITIONS}{old}/{self._host}')

  def _keeps(self) -> set[int]:
    """The steps this run keeps: its newest `keep` commits (before the first, the local step it restored), and
    the own step paired with the newest buddy copy this host keeps of the same save (its own half of that state,
    pax_autockpt.local.buddy): this run's, or the one it restored. Not a pair another run left (a rerun without
    buddy copies, whose `buddy/` nothing renews), nor an own step that only shares the copy's number; one pair at
    most, so that the room the docs give (`local_keep + 4` shares with buddy copies) holds."""
    kept = set(self._mine[-self._keep:]) or {s for s in [self._restored] if s is not None}
    paired = [s for s in layout.local_committed_steps(layout.local_buddy_dir(self.folder)) if self._paired(s)]
    return kept | set(paired[-1:])

  def _paired(self, step: int) -> bool:
    tokens = {self._token(layout.local_step_dir(f, step)) for f in (self.folder, layout.local_buddy_dir(self.folder))}
    return len(tokens) == 1 and tokens <= self._lines

  def _token(self, step_dir: epath.Path) -> str | None:
    """The lineage token of a committed local step (None: unreadable, damaged, absent)."""
    found = self._lineage_of(step_dir)
    return None if found is None else found.token

  def _lineage_of(self, step_dir: epath.Path) -> lineage_lib.Lineage | None:
    """A committed local step's lineage (None: unreadable, damaged, absent), read once per directory (by its
    inode and mtime: a step committed again under the same name is read again)."""
    try:
      found = os.stat(step_dir)
    except OSError:
      return None
    key = (str(step_dir), found.st_ino, found.st_mtime_ns)
    if key not in self._lineages:
      try:
        lineage = local_format.lineage_of(local_format.read_index(step_dir))
      except (local_format.LocalDamage, OSError):
        return None
      if len(self._lineages) > 1000:
        self._lineages.clear()
      self._lineages[key] = lineage
    return self._lineages[key]

  def _another_jobs(self, entry: epath.Path) -> bool:
    """Whether `entry` is a committed step of another job: its progress, never this job's to delete."""
    found = self._lineage_of(entry)
    return found is not None and found.job != self._job

  def _others(self) -> list[tuple[epath.Path, tuple[str, str | None], int]]:
    """(step directory, (job, its job directory), bytes) of the other jobs' committed steps here and in buddy/."""
    folders = (self.folder, layout.local_buddy_dir(self.folder))
    entries = [e for f in folders if f.is_dir() for e in sorted(f.iterdir()) if e.name.startswith('step_')]
    return [(e, local_format.job_of(e) or ('?', None), _bytes_in(e)) for e in entries if self._another_jobs(e)]

  def _check_not_others(self, step: int) -> None:
    """A save of a step number another job holds here would replace that job's step at the commit: it fails."""
    final = layout.local_step_dir(self.folder, step)
    if self._another_jobs(final):
      raise StepInTheWay(f'{final.name} here is {_whose(local_format.job_of(final))}, which this job leaves in '
                         'place: give this job its own --autockpt_local_dir')

  def _clear_leftovers(self) -> None:
    """Every step entry this run does not keep goes (the directory is this run's): `.partial`s a kill left,
    older steps, another job's or lineage's, damaged ones. Before each save as well as after each commit, so
    that a directory with room for `keep + 1` steps always has room for the next one."""
    kept = self._keeps()
    try:
      local_format.prune(self.folder, kept, spare=self._another_jobs)
    except OSError as e:
      logging.warning('[autockpt] could not prune the local tier %s: %s', self.folder, failures.one_line(e))

  def _prune(self) -> None:
    """After a commit: the newest `keep` steps this run committed (and those paired with a buddy copy) stay."""
    del self._mine[:-self._keep]
    self._clear_leftovers()

  def _make_room(self, share: int) -> None:
    """Before this host's part of a step is written: the leftovers' room is freed; at the first save, one line
    when the tier's shares of this host's `share` bytes (`room_line`) cannot fit (saves would fail once the tier fills):
    the steps this job keeps count as room (with buddy copies, `buddy/`'s too), another job's as taken."""
    self._clear_leftovers()
    if self._room_checked:
      return
    self._room_checked = True
    others = self._others()
    theirs = {str(e) for e, _, _ in others}
    folders = [self.folder] + ([layout.local_buddy_dir(self.folder)] if self._buddy else [])
    held = sum(_bytes_in(e) for f in folders if f.is_dir() for e in f.iterdir()
               if e.name.startswith('step_') and str(e) not in theirs)
    line = room_line(self.folder, share, self._keep, shutil.disk_usage(self.folder).free, held,
                     buddy=self._buddy, others=others)
    if line:
      logging.warning('[autockpt] %s', line)


class StepInTheWay(Exception):
  """A local step of the number being saved is another job's: this save fails rather than replace it."""


def _whose(found: tuple[str, str | None] | None) -> str:
  job, job_log_dir = found or ('?', None)
  return f'job {job}\'s' + (f' (job directory {job_log_dir})' if job_log_dir else '')


def auto_interval(cost_secs: float) -> float:
  """The minimum interval between local save starts when none is set, from the previous save's wall time (capture
  to commit): `AUTO_FACTOR` times it keeps the save's share of the run's wall time (the capture on the training
  thread, the write competing for its cores) near 1/AUTO_FACTOR, whatever the state's size and the disk's speed;
  the floor keeps a tiny state from saving many times a second for nothing (back to back, a tiny model on 2 cores
  trained at ~0.57 of its speed). A crash loses about this interval plus one save."""
  return max(AUTO_FLOOR_SECS, AUTO_FACTOR * cost_secs)


def _bytes_in(step_dir: epath.Path) -> int:
  return sum(os.path.getsize(p) for p in step_dir.iterdir()) if step_dir.is_dir() else 0


def _mb(nbytes: float) -> str:
  return f'{nbytes / 1e6:.1f} MB'


def room_line(folder: epath.Path, share: int, keep: int, free: int, held: int, buddy: bool = False,
              others: list[tuple[epath.Path, tuple[str, str | None], int]] = ()) -> str | None:
  """Why `folder` cannot hold the tier's shares of this host's `share` bytes (`keep` + 1: the kept steps and the one
  being written; with `buddy` copies `keep` + 4: one own step beside a lagging copy, and the neighbour's newest
  copy and the one in flight), with the figures and the fix; None when it can. `held`: bytes of this job's
  steps there, counted as room; `others`: another job's steps, which take room this job does not free."""
  extra = 4 if buddy else 1
  room, need = free + held, (keep + extra) * share
  if room >= need:
    return None
  fits = room // share - extra if share else keep
  fix = f'give it {_mb(need)} or more (a larger tmpfs or /dev/shm, a local SSD)'
  fix += f' or set --autockpt_local_keep={fits}' if fits >= 1 else ' or turn the local tier off'
  what = (f'--autockpt_local_keep + 4 = {keep + 4} shares (with buddy copies: {keep + 2} steps of this host\'s '
          f'{_mb(share)} share, 2 of its neighbour\'s)' if buddy else
          f'--autockpt_local_keep + 1 = {keep + 1} steps of this host\'s {_mb(share)} share')
  return (f'the local tier {folder} has room for {_mb(room)} ({_mb(free)} free + {_mb(held)} of steps it keeps), '
          f'less than {what} ({_mb(need)}): local saves will fail once it fills; {_others_clause(others)}{fix}.')


def _others_clause(others: list[tuple[epath.Path, tuple[str, str | None], int]]) -> str:
  """The other jobs whose steps take the room, each named once (with its steps and bytes), and what to do."""
  if not others:
    return ''
  jobs: dict[tuple[str, str | None], list[tuple[epath.Path, int]]] = {}
  for entry, job, nbytes in others:
    jobs.setdefault(job, []).append((entry, nbytes))
  named = '; '.join(f'{_mb(sum(n for _, n in found))} are {_whose(job)} local steps '
                    f'({", ".join(str(e) for e, _ in found)})' for job, found in jobs.items())
  return (f'{named}, another job\'s progress, which this job leaves in place: remove them if that job is done '
          'with them, or ')


class FailureSummary:
  """Local saves that fail, never silent and never a flood: the run's first failure at once, then while saves keep
  failing one log line and one `local_save_failed` event per `FAILURE_SECS` (the newest step and reason, how many
  failed since the previous report); the next commit, or the end of training, reports what is left, so that the
  event log (and `pax-autockpt status`) shows when the tier stopped and when it worked again."""

  def __init__(self, events: events_lib.EventLog):
    self._events = events
    self._lock = threading.Lock()
    self._count, self._total = 0, 0  # failures since the previous report, and in this run
    self._newest: tuple[int, str] = (-1, '')  # the newest failure's step and reason
    self._last: float | None = None  # when the previous report was (monotonic); None: never

  def failed(self, step: int, error: BaseException, share: int, buddy: bool = False,
             others: list[tuple[epath.Path, tuple[str, str | None], int]] = ()) -> None:
    """`buddy`: the tier keeps buddy copies too (room for 3 more shares); `others`: another job's steps in the
    way, named where the disk is full."""
    reason = failures.one_line(error)
    if getattr(error, 'errno', None) == errno.ENOSPC:
      needs = '--autockpt_local_keep + 4 shares (buddy copies included)' if buddy else '--autockpt_local_keep + 1 steps'
      reason += f' (the tier needs room for {needs} of this host\'s {_mb(share)} share)'
      if others:
        reason += f'; {_others_clause(others).removesuffix(", or ")}'
    now = time.monotonic()
    with self._lock:
      self._count, self._total, self._newest = self._count + 1, self._total + 1, (step, reason)
      due = self._last is None or now - self._last >= FAILURE_SECS
    if due:
      self.report()

  def report(self, committed: int | None = None) -> bool:
    """The failures since the previous report, if any (True then); `committed`: the step the tier works from again."""
    with self._lock:
      count, self._count = self._count, 0
      if count:
        self._last = time.monotonic()
      (step, reason), total = self._newest, self._total
    if not count:
      return False
    self._events.write('local_save_failed', step=step, error=reason, failures=count, total=total)
    if committed is None:
      logging.warning('[autockpt] local save of step %d not committed: %s; %d failed since the previous line, %d in '
                      'this run (one line a minute while local saves fail).', step, reason, count, total)
    else:
      logging.warning('[autockpt] local tier: step %d committed after %d more failed save(s) (%d in this run; the '
                      'newest, of step %d: %s).', committed, count, total, step, reason)
    return True


class _Window:
  """The commits since a sink last wrote (one per `every` seconds at most): (step, duration, bytes, monotonic
  time) each, and the previous window's last commit, from which this window's first interval counts."""

  def __init__(self, every: float):
    self.every = every
    self.batch: list[tuple[int, float, int, float]] = []
    self.last: float | None = None  # when this sink last wrote (monotonic); None: never (write at once)
    self.before: float | None = None

  def due(self, now: float) -> bool:
    return self.last is None or now - self.last >= self.every

  def take(self) -> dict[str, Any] | None:
    """What the window holds, summed up (None when empty); the window starts again."""
    batch, self.batch = self.batch, []
    if not batch:
      return None
    first, self.last = self.last is None, batch[-1][3]
    since = self.before if self.before is not None else batch[0][3]
    self.before = batch[-1][3]
    gaps = len(batch) if since != batch[0][3] else len(batch) - 1
    span = batch[-1][3] - since
    step, duration, nbytes, _ = batch[-1]
    return dict(first=first, commits=len(batch), span=span, interval=span / gaps if gaps else None, step=step,
                duration=duration, nbytes=nbytes)


class CommitTally:
  """The local tier's commits, summed up: in the event log one `local_committed` event for the run's first
  commit, then one per `SUMMARY_SECS` for every commit since the previous one (`commits`, their mean
  `interval_s`, the newest's `step`, `duration_s` and `bytes`); in the log one line per `LOG_SECS` (commits,
  rate, newest step), so that a reader of the log sees the tier working. A commit a second would otherwise
  be 86,400 events a day, all read at every start; a kill loses at most one period's count."""

  def __init__(self, events: events_lib.EventLog):
    self._events = events
    self._lock = threading.Lock()
    self._event = _Window(SUMMARY_SECS)
    self._log = _Window(LOG_SECS)

  def add(self, step: int, duration: float, nbytes: int) -> None:
    now = time.monotonic()
    with self._lock:
      for window in (self._event, self._log):
        window.batch.append((step, duration, nbytes, now))
      due = self._event.due(now), self._log.due(now)
    if any(due):
      self.write(*due)

  def write(self, event: bool = True, log: bool = True) -> None:
    """The commits since the previous event (`event`) and line (`log`), if any."""
    with self._lock:
      to_event = self._event.take() if event else None
      to_log = self._log.take() if log else None
    if to_event:
      self._events.write('local_committed', step=to_event['step'], duration_s=round(to_event['duration'], 6),
                         bytes=to_event['nbytes'], commits=to_event['commits'],
                         **({'interval_s': round(to_event['interval'], 6)} if to_event['interval'] else {}))
    if to_log:
      _log_line(to_log)


def _log_line(w: dict[str, Any]) -> None:
  if w['first']:
    logging.info('[autockpt] local save of step %d committed in %.3f s (%.1f MB); from now on one line every '
                 '%.0f s sums up the local commits.', w['step'], w['duration'], w['nbytes'] / 1e6, LOG_SECS)
    return
  rate = f'one every {w["interval"]:.2f} s' if w['interval'] else 'one'
  logging.info('[autockpt] local tier: %d commit(s) in the last %.0f s (%s), newest step %d, committed in %.3f s '
               '(%.1f MB).', w['commits'], w['span'], rate, w['step'], w['duration'], w['nbytes'] / 1e6)
