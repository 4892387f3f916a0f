"""Which job and which line of training a local-tier step belongs to, and whether a restart may restore it.

A local step is a copy on a disk the job directory knows nothing about: the same local directory can hold
another job's steps (a sweep, a fine-tune on the same VM, a fork trained on from a copy of the job directory),
or steps of this job that a rollback (deleting the newest checkpoints to train again from an older one) left
behind. A step number says none of that: a rollback retrains to the same numbers. So every local step records,
in its digest-covered index:
- `job`: the job's identity for the local tier, the random id written once into `JOB_LOG_DIR/autockpt/job_id`
  bound to where that job directory lives (`identify`): a job directory deleted and made again, copied or
  moved is a new job, since the local tier is a cache of one job directory;
- `run`: the run that wrote it (one id for all hosts of a run), so that every host's copy of a step can be
  checked to be the same save;
- `base`: the newest job-directory checkpoint this run knew committed when the step's state was captured
  (the one it grew from), and `started`: this run's job-directory saves begun after that one, up to the step;
- `base_id` and `started_ids`: the ids of those saves (`save_id`: each save's own, in its `save_started` and
  `save_committed` events and inside the checkpoint, in its manifest), where known. A checkpoint retrained to
  the same number is another save;
- `handed`: the earlier runs whose line of training it carries on since its base, each with the local step it
  handed on at (a run that restored a local step continues the run that wrote it).

A restart offers a local step only when `refusal` finds nothing wrong: the same job; its base, and any save it
started that the event log says committed, still in the job directory (committed, or set aside as damaged:
the state grew from it before the damage), else it was rolled back, unless a newer save it saw start is
committed there (its base removed by preservation or max_to_keep is no rollback); each of them the same save
as the job directory's checkpoint of that number (its manifest's id, else the newest `save_committed` event of
it); the job directory's newest checkpoint at or below the step one it grew from; and no rollback discarded it.
A rollback is a commit the event log records that is gone without a `deleted` record (`rolled_back`): it
discards every state that shared its line of training after the newest checkpoint still there, so a step of a
run in its line (`handed`) is refused whether it is newer or older than the deleted checkpoint. Indexes
written before ids (none recorded) are judged by step numbers alone. Pure, fed what the restart listed.
"""

import dataclasses
import hashlib
import os
import threading
from typing import Any
import uuid

from etils import epath

from pax_autockpt import layout
from pax_autockpt.hosts import agreement
from pax_autockpt.shared import coordination


@dataclasses.dataclass(frozen=True)
class Lineage:
  """What a local step grew from (see the module docstring). `started_ids` is parallel to `started` (shorter,
  or None entries, where an id is not known: an index written before ids)."""

  job: str
  run: str
  base: int | None
  started: tuple[int, ...] = ()
  base_id: str | None = None
  started_ids: tuple[str | None, ...] = ()
  handed: tuple[tuple[str, int], ...] = ()

  def to_json(self) -> dict[str, Any]:
    return {'job': self.job, 'run': self.run, 'base': self.base, 'started': list(self.started),
            'base_id': self.base_id, 'started_ids': list(self.started_ids),
            'handed': [list(h) for h in self.handed]}

  @classmethod
  def from_json(cls, found: Any) -> 'Lineage':
    """ValueError for anything that is not a lineage as `to_json` writes it (with or without the ids)."""
    if not isinstance(found, dict):
      raise ValueError('no lineage (written before local steps recorded their job)')
    job, run, base, started = found.get('job'), found.get('run'), found.get('base'), found.get('started')
    base_id, started_ids, handed = found.get('base_id'), found.get('started_ids', []), found.get('handed', [])
    if not (isinstance(job, str) and isinstance(run, str) and (base is None or isinstance(base, int))
            and isinstance(started, list) and all(isinstance(s, int) for s in started)
            and (base_id is None or isinstance(base_id, str)) and isinstance(started_ids, list)
            and len(started_ids) <= len(started) and all(i is None or isinstance(i, str) for i in started_ids)
            and isinstance(handed, list) and all(_is_hand_over(h) for h in handed)):
      raise ValueError(f'lineage {found!r} is malformed')
    return cls(job, run, base, tuple(started), base_id, tuple(started_ids), tuple(tuple(h) for h in handed))

  @property
  def token(self) -> str:
    """Equal on every host's copy of one save."""
    return f'{self.job}/{self.run}'

  def saves(self) -> list[tuple[int, str | None, bool]]:
    """(step, save id or None, whether it is the base) of the base and of every save it saw start."""
    ids = (*self.started_ids, *[None] * (len(self.started) - len(self.started_ids)))
    base = [(self.base, self.base_id, True)] if self.base is not None else []
    return base + [(s, i, False) for s, i in zip(self.started, ids)]


  def runs(self, step: int) -> list[tuple[str, int]]:
    """(run, the newest step of its line that this state holds) of every run in its line since its base, this
    step's own last: a save of such a run at step c shares this state's training up to min(c, that step)."""
    return [*self.handed, (self.run, step)]


def _is_hand_over(found: Any) -> bool:
  return (isinstance(found, list) and len(found) == 2 and isinstance(found[0], str) and isinstance(found[1], int)
          and not isinstance(found[1], bool))


def save_id(run: str, step: int) -> str:
  """The id of this run's save of `step`: the same on every host without a message (the run's id is agreed
  at the start, and a run saves the state of one step once: a retrained step is another run's), and never
  another run's."""
  return f'{run[:16]}-{step}'


def run_of(save: str) -> str:
  """The run part of a save id (`save_id`'s inverse, as far as the id keeps it: the run's first 16 characters)."""
  return save.rsplit('-', 1)[0]


def committed_saves(events: list[dict[str, Any]]) -> dict[int, tuple[str | None, ...]]:
  """Step -> the `id` of each of its `save_committed` events in an event log, oldest first (None where an
  event has none: written before save ids)."""
  saves: dict[int, tuple[str | None, ...]] = {}
  for e in events:
    if e.get('event') == 'save_committed' and isinstance(e.get('step'), int):
      saves[e['step']] = (*saves.get(e['step'], ()), e['id'] if isinstance(e.get('id'), str) else None)
  return saves


def policy_deleted(events: list[dict[str, Any]]) -> frozenset[tuple[int, str]]:
  """(step, save id) of the commits a `deleted` event (preservation, on the primary host: pass host 0's log)
  removed (`_deletions`)."""
  return frozenset((step, i) for _, step, ids in _deletions(events) for i in ids)


def kept_later(events: list[dict[str, Any]], gone: tuple[tuple[int, str], ...]) -> dict[str, dict[int, str]]:
  """Rolled-back save id (`gone`) -> {step: save id} of the checkpoints preservation deleted after host 0's log
  shows that save gone: a run started after its commit resuming an older step (no set-aside of it in between).
  They were there at the rollback, so the point it kept may be one of them (a rollback, then the policy deleting
  the checkpoint it kept, must not refuse every later local step)."""
  first = {}
  for at, e in enumerate(events):
    if e.get('event') == 'save_committed' and isinstance(e.get('id'), str):
      first.setdefault(e['id'], at)
  deletions = _deletions(events)
  out = {}
  for step, save in gone:
    seen = _seen_gone(events, first.get(save), step)
    if seen is not None:
      out[save] = {s: ids[-1] for at, s, ids in deletions if at > seen and ids}
  return out


def _seen_gone(events: list[dict[str, Any]], committed_at: int | None, step: int) -> int | None:
  """The index of the first `start` after a commit of `step` (at `committed_at`) that resumed an older step or
  none; None where there is none, or a `restore_skipped` of `step` (set aside) comes first."""
  for at in range(len(events) if committed_at is None else committed_at + 1, len(events)):
    e = events[at]
    if e.get('event') == 'restore_skipped' and e.get('step') == step:
      return None
    resumed = e.get('restored_step')
    if e.get('event') == 'start' and (resumed is None or (isinstance(resumed, int) and resumed < step)):
      return at
  return None


def _deletions(events: list[dict[str, Any]]) -> list[tuple[int, int, tuple[str, ...]]]:
  """(index, step, the save ids it removed) of every `deleted` event: the save its `id` names (the checkpoint's
  manifest's at the deletion; '' none: a checkpoint a tool replaced, whose log commit is not the one deleted), or,
  in an event without one (written before ids), every commit of its step before it."""
  commits: dict[int, list[str]] = {}
  out = []
  for at, e in enumerate(events):
    step = e.get('step')
    if e.get('event') == 'save_committed' and isinstance(step, int) and isinstance(e.get('id'), str):
      commits.setdefault(step, []).append(e['id'])
    elif e.get('event') == 'deleted' and isinstance(step, int):
      named = e.get('id')
      if isinstance(named, str):
        out.append((at, step, (named,) if named in commits.get(step, ()) else ()))
        commits[step] = [i for i in commits.get(step, []) if i != named]
      else:
        out.append((at, step, tuple(commits.pop(step, []))))
  return out


def save_lines(events: list[dict[str, Any]]) -> dict[str, tuple[tuple[str, int], ...]]:
  """Save id -> the whole line of training that save ended: (run, step) of every run in it, through its base's
  save and that one's, as the `save_started` events record them (`handed`, `base`): a rollback of the save
  discards the states of those runs past the newest checkpoint of that line still there."""
  started = {e['id']: e for e in events if e.get('event') == 'save_started' and isinstance(e.get('id'), str)}
  lines = {}
  for save in started:
    line, seen, at = [], set(), save
    while at in started and at not in seen:
      seen.add(at)
      handed = started[at].get('handed')
      line += [(run_of(at), started[at]['step'])] + [
          tuple(h) for h in (handed if isinstance(handed, list) else []) if _is_hand_over(h)]
      at = started[at].get('base')
    lines[save] = tuple(line)
  return lines


def rolled_back(saves: dict[int, tuple[str | None, ...]], deleted: frozenset[tuple[int, str]],
                there: list[int], own: dict[int, str | None] | None = None) -> tuple[tuple[int, str], ...]:
  """The commits this log records (`saves`, `committed_saves`) that are gone without a `deleted` record:
  not `there` (committed or set aside), or replaced there by another save (`own`: the save id a checkpoint's
  manifest names, '' for none where one was written; without, the newest commit of that step is taken for the
  one there). A rollback."""
  own = own or {}
  gone = []
  for step, ids in saves.items():
    for i in ids:
      if i is None or (step, i) in deleted:
        continue
      kept = step in there and (own[step] == i if own.get(step) is not None else i == ids[-1])
      if not kept:
        gone.append((step, i))
  return tuple(sorted(gone))


def refusal(lineage: Lineage, step: int, *, job: str, committed: list[int], set_aside: list[int],
            ever_committed: frozenset[int] = frozenset(),
            saves: dict[int, tuple[str | None, ...]] | None = None, own: dict[int, str | None] | None = None,
            gone: tuple[tuple[int, str], ...] = (),
            lines: dict[str, tuple[tuple[str, int], ...]] | None = None,
            later: dict[str, dict[int, str]] | None = None) -> str | None:
  """Why local `step` may not restore into job `job` whose job directory holds `committed` (and damaged
  `set_aside` checkpoints), or None. `saves` (`committed_saves` of this job's event log; `ever_committed`: the
  same steps, without ids): a save still in flight when the step was captured, committed and since deleted, is
  a rollback too, and a checkpoint whose save id (`own`: its manifest's, else its newest commit's) is another
  than the step's is another save. `gone`: the log's commits since rolled back (`rolled_back`), and `lines`
  the runs each save carried on (`save_lines`); `later`: the checkpoints deleted after each rollback
  (`kept_later`).
  Each reason reads after "local step N is not offered: "."""
  if lineage.job != job:
    return f'written by another job (job id {lineage.job}, this job is {job})'
  saves, own = {**{s: () for s in ever_committed}, **(saves or {})}, own or {}  # (): committed, ids unknown
  grown = [(s, i, base) for s, i, base in lineage.saves() if s <= step and (base or _committed(s, i, saves, own))]
  there = set(committed) | set(set_aside)
  other = [(s, i) for s, i, _ in grown if s in there and not _same(s, i, saves, own)]
  if other:
    s, i = other[-1]
    return (f'it grew from checkpoint {s} of another save (id {i}), the job directory\'s {s} is a later save: '
            'restoring it would undo the rollback')
  # A newer checkpoint of its line there (a save it saw start, of a known id; a save of a run of its line at or
  # before its part): what it grew from before that may be gone (preservation, max_to_keep), not rolled back.
  ids = {s: (own[s] or None) if own.get(s) is not None else (saves.get(s) or (None,))[-1] for s in there}
  anchor = _anchor(lineage, step, grown, committed, ids)
  missing = [s for s, _, _ in grown if s not in there and (anchor is None or s > anchor)]
  if missing:
    return (f'it grew from checkpoint {max(missing)}, which is no longer in the job directory (rolled back): '
            'restoring it would undo the rollback')
  return (_discarded(lineage, step, gone, ids, lines or {}, later or {})
          or _newest_problem(lineage, step, committed, saves, own))


def _anchor(lineage: Lineage, step: int, grown: list[tuple[int, str | None, bool]], committed: list[int],
            ids: dict[int, str | None]) -> int | None:
  """The newest checkpoint there that the step grew from after its base, or None: a save it saw start (of a
  known id) committed, or a save there (`ids`: step -> the save id of the checkpoint there, committed or set
  aside) of a run of its line at or before that run's part of it (the same run's earlier state)."""
  seen = [s for s, i, base in grown if not base and i is not None and s in committed]
  mine = [s for s, save in ids.items() if save for run, held in lineage.runs(step)
          if run_of(save) == run[:16] and s <= held]
  return max((*seen, *mine), default=None)


def _discarded(lineage: Lineage, step: int, gone: tuple[tuple[int, str], ...], ids: dict[int, str | None],
               lines: dict[str, tuple[tuple[str, int], ...]], later: dict[str, dict[int, str]]) -> str | None:
  """Why a rollback discarded the step: a deleted commit that shared its training (a run in both lines, up
  to the older of the two ends of that run's part) past the point the rollback kept, older or newer than the
  step. The step's line runs on through its base's: a rollback to before the base discards it too."""
  base = [(run_of(lineage.base_id), lineage.base), *lines.get(lineage.base_id, ())] if lineage.base_id else []
  mine = [(r[:16], held) for r, held in (*lineage.runs(step), *base)]  # its line through its base's
  for c, save in gone:
    theirs = [(r[:16], held) for r, held in lines.get(save, ())] + [(run_of(save), c)]
    kept = _kept(theirs, [*ids.items(), *later.get(save, {}).items()])
    for run, held in mine:
      if any(run == r and min(held, h) > kept for r, h in theirs):
        return (f'checkpoint {c} of its line of training (save {save}) was deleted from the job directory '
                f'(rolled back, no `deleted` record): restoring it would undo the rollback')
  return None


def _kept(theirs: list[tuple[str, int]], there: list[tuple[int, str | None]]) -> int:
  """The step a rollback kept: the newest checkpoint there at the rollback (`there`: (step, save id), committed or
  set aside now, or deleted by preservation since) on the deleted save's own line of training (`theirs`: (run,
  the step its part ends at)), -1 for none. Its line, not the local step's: a set-aside checkpoint grown from the
  local step is kept too."""
  on_line = [s for s, save in there if save and any(run_of(save) == r and s <= h for r, h in theirs)]
  return max(on_line, default=-1)


def _committed(step: int, save: str | None, saves: dict[int, tuple[str | None, ...]],
               own: dict[int, str | None]) -> bool:
  """Whether this save committed: the checkpoint there names it, or the log says so (by its id where both
  know it, else by its step)."""
  if save is not None and own.get(step) == save:
    return True
  return step in saves and (save is None or not saves[step] or save in saves[step])


def _same(step: int, save: str | None, saves: dict[int, tuple[str | None, ...]], own: dict[int, str | None]) -> bool:
  """Whether the checkpoint of `step` is the save `save`: the id its manifest records, else its newest commit's
  in the log (True where neither id is known)."""
  if save is None:
    return True
  if own.get(step) is not None:
    return own[step] == save
  return (saves.get(step) or (save,))[-1] == save


def _newest_problem(lineage: Lineage, step: int, committed: list[int],
                    saves: dict[int, tuple[str | None, ...]], own: dict[int, str | None]) -> str | None:
  """Why the job directory's newest checkpoint at or below `step` is not one the step grew from, or None."""
  below = [s for s in committed if s <= step]
  newest = below[-1] if below else None
  if newest is None or (lineage.base is not None and newest <= lineage.base):
    return None  # the base itself (the same save: checked before) or older
  if any(s == newest and _same(s, i, saves, own) for s, i, base in lineage.saves() if not base):
    return None
  return f'the job directory\'s checkpoint {newest} is not one it grew from'


class Tracker:
  """This run's lineage as it trains: the base moves to each job-directory save as it commits. Thread-safe
  (commits are seen from the save's background thread)."""

  def __init__(self, job: str, run: str):
    self._job, self._run = job, run
    self._base: tuple[int, str | None] | None = None
    self._started: list[tuple[int, str | None]] = []
    self._handed: tuple[tuple[str, int], ...] = ()  # the runs whose line this run carries on since its base
    self._lock = threading.Lock()

  @property
  def token(self) -> str:
    """The lineage token of this run's local steps (`Lineage.token`)."""
    return f'{self._job}/{self._run}'

  def save_id(self, step: int) -> str:
    """The id of this run's job-directory save of `step` (`save_id`)."""
    return save_id(self._run, step)

  def restored(self, step: int | None, grew_from: Lineage | None = None, save: str | None = None) -> None:
    """The state this run starts from: job-directory checkpoint `step` (None: fresh) of the save `save` (its
    id, None where not known), or a local step that `grew_from` that lineage."""
    with self._lock:
      if grew_from is not None:
        self._base = None if grew_from.base is None else (grew_from.base, grew_from.base_id)
        self._started = [(s, i) for s, i, base in grew_from.saves() if not base]
        self._handed = (*grew_from.handed, (grew_from.run, step))
      else:
        self._base, self._started, self._handed = (None if step is None else (step, save)), [], ()

  def save_started(self, step: int, save: str | None = None) -> None:
    with self._lock:
      self._started.append((step, save))

  def save_committed(self, step: int) -> None:
    with self._lock:
      if self._base is None or step > self._base[0]:
        self._base = next(((s, i) for s, i in reversed(self._started) if s == step), (step, None))
        self._handed = ()  # the line before the new base is the base's
      self._started = [(s, i) for s, i in self._started if s > self._base[0]]

  def save_failed(self, step: int) -> None:
    with self._lock:
      self._started = [(s, i) for s, i in self._started if s != step]

  def at(self, step: int) -> Lineage:
    """The lineage of a local step captured now."""
    with self._lock:
      started = [(s, i) for s, i in self._started if s <= step]
      base, base_id = self._base if self._base is not None else (None, None)
      return Lineage(self._job, self._run, base, tuple(s for s, _ in started), base_id,
                     tuple(i for _, i in started) if any(i is not None for _, i in started) else (), self._handed)


def identify(job_log_dir: epath.PathLike, host: int) -> tuple[str, str]:
  """(this job's id, this run's id), the same on every host: host 0 reads the job's id, or writes a new
  one into a job directory that has none, binds it to where the job directory lives (`job_identity`), and
  makes the run's; the others get both through the coordination service."""
  mine = None
  if host == 0:
    path = layout.job_id_path(job_log_dir)
    if not path.exists():
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(f'{uuid.uuid4().hex}\n')
    mine = f'{job_identity(path.read_text().strip(), job_log_dir)}|{uuid.uuid4().hex}'
  job, run = agreement.first_report(coordination.LINEAGE_IDS, host, mine).split('|', 1)
  return job, run


def job_identity(job_id: str, job_log_dir: epath.PathLike) -> str:
  """The job's identity for the local tier: the job_id file's content, which a copy of the job directory
  (`cp -r`, `gsutil cp -r`) carries along, bound to where the directory lives (its absolute path, or URL): a
  copied or moved job directory is a new job, and its local steps another job's."""
  where = os.fspath(job_log_dir)
  where = where.rstrip('/') if layout.is_object_store(job_log_dir) else os.path.realpath(where)
  return f'{job_id}-{hashlib.sha256(where.encode()).hexdigest()[:12]}'
