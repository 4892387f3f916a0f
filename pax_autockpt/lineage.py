"""Which job and which line of training a local-tier step belongs to, and whether a restart may restore it.

A local step is a copy on a disk the job directory knows nothing about: the same local directory can hold
another job's steps (a sweep, a fine-tune on the same VM), or steps of this job that a rollback (deleting
the newest checkpoints to train again from an older one) left behind. A step number says none of that. So
every local step records, in its digest-covered index:
- `job`: the job directory's identity, a random id written once into `JOB_LOG_DIR/autockpt/job_id` (a job
  directory deleted and made again is a new job; its path is not its identity);
- `run`: the run that wrote it (one id for all hosts of a run), so that every host's copy of a step can be
  checked to be the same save;
- `base`: the newest job-directory checkpoint this run knew committed when the step's state was captured
  (the one it grew from), and `started`: this run's job-directory saves begun after that one, up to the step.

A restart offers a local step only when `refusal` finds nothing wrong: the same job; its base, and any save it
started that the event log says committed, still in the job directory (committed, or set aside as damaged:
the state grew from it before the damage), else it was rolled back; and the job directory's newest checkpoint
at or below the step one it grew from. Pure, fed
what the restart listed.
"""

import dataclasses
import threading
from typing import Any
import uuid

from etils import epath

from pax_autockpt import agreement
from pax_autockpt import layout


@dataclasses.dataclass(frozen=True)
class Lineage:
  """What a local step grew from (see the module docstring)."""

  job: str
  run: str
  base: int | None
  started: tuple[int, ...] = ()

  def to_json(self) -> dict[str, Any]:
    return {'job': self.job, 'run': self.run, 'base': self.base, 'started': list(self.started)}

  @classmethod
  def from_json(cls, found: Any) -> 'Lineage':
    """ValueError for anything that is not a lineage as `to_json` writes it."""
    if not isinstance(found, dict):
      raise ValueError('no lineage (written before local steps recorded their job)')
    job, run, base, started = found.get('job'), found.get('run'), found.get('base'), found.get('started')
    if not (isinstance(job, str) and isinstance(run, str) and (base is None or isinstance(base, int))
            and isinstance(started, list) and all(isinstance(s, int) for s in started)):
      raise ValueError(f'lineage {found!r} is malformed')
    return cls(job, run, base, tuple(started))

  @property
  def token(self) -> str:
    """Equal on every host's copy of one save."""
    return f'{self.job}/{self.run}'


def refusal(lineage: Lineage, step: int, *, job: str, committed: list[int], set_aside: list[int],
            ever_committed: frozenset[int] = frozenset()) -> str | None:
  """Why local `step` may not restore into job `job` whose job directory holds `committed` (and damaged
  `set_aside` checkpoints), or None; `ever_committed`: the steps this job's event log says a save committed
  (a save still in flight when the step was captured, committed and since deleted, is a rollback too). Each
  reason reads after "local step N is not offered: "."""
  if lineage.job != job:
    return f'written by another job (job id {lineage.job}, this job is {job})'
  there = set(committed) | set(set_aside)
  gone = [s for s in (lineage.base, *(s for s in lineage.started if s in ever_committed)) if s is not None
          and s <= step and s not in there]
  if gone:
    return (f'it grew from checkpoint {max(gone)}, which is no longer in the job directory (rolled back): '
            'restoring it would undo the rollback')
  below = [s for s in committed if s <= step]
  newest = below[-1] if below else None
  if newest is not None and newest not in lineage.started and (lineage.base is None or newest > lineage.base):
    return f'the job directory\'s checkpoint {newest} is not one it grew from'
  return None


class Tracker:
  """This run's lineage as it trains: the base moves to each job-directory save as it commits. Thread-safe
  (commits are seen from the save's background thread)."""

  def __init__(self, job: str, run: str):
    self._job, self._run = job, run
    self._base: int | None = None
    self._started: list[int] = []
    self._lock = threading.Lock()

  def restored(self, step: int | None, grew_from: Lineage | None = None) -> None:
    """The state this run starts from: job-directory checkpoint `step` (None: fresh), or a local step that
    `grew_from` that lineage."""
    with self._lock:
      self._base = grew_from.base if grew_from is not None else step
      self._started = list(grew_from.started) if grew_from is not None else []

  def save_started(self, step: int) -> None:
    with self._lock:
      self._started.append(step)

  def save_committed(self, step: int) -> None:
    with self._lock:
      if self._base is None or step > self._base:
        self._base = step
      self._started = [s for s in self._started if s > self._base]

  def save_failed(self, step: int) -> None:
    with self._lock:
      self._started = [s for s in self._started if s != step]

  def at(self, step: int) -> Lineage:
    """The lineage of a local step captured now."""
    with self._lock:
      return Lineage(self._job, self._run, self._base, tuple(s for s in self._started if s <= step))


def identify(job_log_dir: epath.PathLike, host: int) -> tuple[str, str]:
  """(this job's id, this run's id), the same on every host: host 0 reads the job's id, or writes a new
  one into a job directory that has none, and makes the run's; the others get both through the
  coordination service."""
  mine = None
  if host == 0:
    path = layout.job_id_path(job_log_dir)
    if not path.exists():
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(f'{uuid.uuid4().hex}\n')
    mine = f'{path.read_text().strip()}|{uuid.uuid4().hex}'
  job, run = agreement.first_report('autockpt/lineage/ids', host, mine).split('|', 1)
  return job, run
