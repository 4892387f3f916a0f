"""Every name in a job directory, and the one rule for whether a checkpoint is committed.

JOB_LOG_DIR/
  checkpoints/checkpoint_%08d/       Pax's checkpoints (orbax writes them)
    autockpt_manifest/host<IDX>.json   their content digests, written before the commit
  autockpt/events.host<IDX>.jsonl    the event log (CONTRACT §6); on object storage in parts:
  autockpt/events.host<IDX>.<PART>.jsonl
  autockpt/host<IDX>.log             a host's output under `pax-autockpt launch` (local disk only)
  autockpt/unrestorable/             damaged checkpoints moved aside (local disk)
  autockpt/job_id                    the job's identity, made once (pax_autockpt.local.lineage)
  autockpt/compilation_cache/        JAX's compiled programs for the next start (pax_autockpt.startup.compilation_cache)
  summaries/autockpt/                the save scalars for TensorBoard

LOCAL_DIR/ (the local tier, one per host, --autockpt_local_dir with {host} replaced)
  step_%08d/                         a committed local step (its final name is the commit)
    shards.bin                         this host's shards, raw bytes back to back
    index.json                         where each shard is in shards.bin, its xxh3, every host's input
  step_%08d.partial                  a local save in progress (never restored; removed by the next commit)
  buddy/step_%08d/                   a neighbour host's newest committed local step, kept for it (buddy
                                     copies, pax_autockpt.local.buddy): the same form, its index names its host

Committed means complete on storage, and differs by storage because orbax 0.5.9 commits differently:
on a local disk (and any storage but gs://) it writes `checkpoint_N.orbax-checkpoint-tmp-<time>` and
renames it, so the final name is the commit; on gs:// (no atomic rename) it writes under the final name
and adds `commit_success.txt` last, so that object is the commit. `is_committed` is the only place that
decides; everything else (restore choice, history, preservation, the exit-143 check, report, soak,
bench, tests) asks it.
"""

import re
import tempfile
import time

from etils import epath

CHECKPOINTS = 'checkpoints'
COMMIT_MARKER = 'commit_success.txt'  # orbax's, on object storage
# Ours, on object storage: a committed checkpoint found damaged loses its commit marker and gets
# this one, which says why and keeps orbax's start-up clean-up from deleting it.
UNRESTORABLE_MARKER = 'autockpt_unrestorable.txt'
ORBAX_TMP = '.orbax-checkpoint-tmp-'
_STEP = re.compile(r'checkpoint_(\d{8,})')


def is_object_store(path: epath.PathLike) -> bool:
  """gs:// and the like: no rename, no append; a "directory" is a name prefix."""
  return '://' in str(path)


def uses_commit_marker(path: epath.PathLike) -> bool:
  """Where orbax 0.5.9 commits with `commit_success.txt` instead of a rename: gs:// only
  (orbax.checkpoint.utils.is_gcs_path). Elsewhere, any scheme, the final name is the commit."""
  return str(path).startswith('gs://')


def checkpoint_dir(job_log_dir: epath.PathLike) -> epath.Path:
  return epath.Path(job_log_dir) / CHECKPOINTS


def step_dir(ckpt_dir: epath.PathLike, step: int) -> epath.Path:
  """Pax's layout: checkpoint_%08d."""
  return epath.Path(ckpt_dir) / f'checkpoint_{step:08d}'


def step_of(name: str) -> int | None:
  """The step of a final checkpoint name (`checkpoint_00001000` -> 1000), else None."""
  m = _STEP.fullmatch(name)
  return int(m.group(1)) if m else None


def is_committed(path: epath.Path) -> bool:
  """Whether a checkpoint directory is complete on its storage (see the module docstring)."""
  if step_of(path.name) is None:
    return False
  if uses_commit_marker(path):
    return (path / COMMIT_MARKER).exists()
  return path.is_dir()


def _step_dirs(ckpt_dir: epath.Path) -> list[tuple[int, epath.Path]]:
  """(step, path) of every entry under a final checkpoint name, newest first."""
  if not ckpt_dir.exists():
    return []
  found = ((step_of(p.name), p) for p in ckpt_dir.iterdir())
  return sorted(((s, p) for s, p in found if s is not None), key=lambda sp: -sp[0])


def entries(folder: epath.Path) -> dict[str, epath.Path]:
  """What a listing of `folder` holds, by name ({} when it is absent). Raises when the listing fails: on
  gs:// `is_dir()` and `exists()` answer False when the storage refuses or fails the request, so absence is
  decided only by a listing that succeeded."""
  try:
    return {p.name: p for p in folder.iterdir()}
  except FileNotFoundError:
    return {}


def committed_steps(ckpt_dir: epath.PathLike) -> list[int]:
  """Committed steps, oldest first (one existence check per step on object storage)."""
  return sorted(s for s, p in _step_dirs(epath.Path(ckpt_dir)) if is_committed(p))


def newest_committed(ckpt_dir: epath.PathLike) -> int | None:
  """The newest committed step; checks from the newest down, so usually one check."""
  return next((s for s, p in _step_dirs(epath.Path(ckpt_dir)) if is_committed(p)), None)


def step_text(step: int | None) -> str:
  """A step for a log line: its number, or 'none' (never Python's `None`)."""
  return 'none' if step is None else str(step)


def newest_steps_text(steps: list[int], most: int) -> str:
  """The newest `most` of `steps` (oldest first) for a one-line message, '..., ' before them when cut."""
  shown = ', '.join(map(str, steps[-most:]))
  return shown if len(steps) <= most else f'..., {shown}'


def leftovers(ckpt_dir: epath.PathLike, step: int) -> list[epath.Path]:
  """What a failed save of `step` left: orbax's temporary directories, or on object storage the
  final name without a commit marker (never a checkpoint marked unrestorable)."""
  path = step_dir(ckpt_dir, step)
  if uses_commit_marker(path):
    if path.exists() and not is_committed(path) and not (path / UNRESTORABLE_MARKER).exists():
      return [path]
    return []
  return list(epath.Path(ckpt_dir).glob(f'{path.name}{ORBAX_TMP}*'))


def is_marked_unrestorable(path: epath.Path) -> bool:
  return uses_commit_marker(path) and (path / UNRESTORABLE_MARKER).exists()


def marked_unrestorable_steps(ckpt_dir: epath.PathLike) -> list[int]:
  """Object storage: steps whose name a damaged checkpoint, marked in place, still holds."""
  if not uses_commit_marker(ckpt_dir):
    return []
  return sorted(s for s, p in _step_dirs(epath.Path(ckpt_dir))
                if not is_committed(p) and is_marked_unrestorable(p))


def _aside_path(job_log_dir: epath.PathLike, path: epath.Path) -> epath.Path:
  aside = unrestorable_dir(job_log_dir) / path.name
  return aside.with_name(f'{aside.name}.{int(time.time())}') if aside.exists() else aside


def set_aside_damaged(job_log_dir: epath.PathLike, path: epath.Path, reason: str) -> str:
  """Takes a damaged checkpoint out of every listing (ours, orbax's, stock paxml's) without
  deleting it; returns where it is now, for the log.

  On gs://, where a rename is a copy of every object: marked in place in O(1) requests, our marker
  (with the reason) first, then orbax's commit marker removed. A crash between the two leaves it
  committed and damaged, so the next restore finds it again and finishes the job. Elsewhere the final
  name is the commit: moved into JOB_LOG_DIR/autockpt/unrestorable/ (a rename on local disk).
  """
  if uses_commit_marker(path):
    (path / UNRESTORABLE_MARKER).write_text(f'{reason}\n')
    (path / COMMIT_MARKER).unlink(missing_ok=True)
    return f'marked unrestorable in place ({UNRESTORABLE_MARKER})'
  return f'moved to {move_aside(job_log_dir, path)}'


def move_aside(job_log_dir: epath.PathLike, path: epath.Path) -> epath.Path:
  """Frees a step's name for a new save: renames, or on object storage copies then deletes."""
  aside = _aside_path(job_log_dir, path)
  if not is_object_store(path):
    aside.parent.mkdir(parents=True, exist_ok=True)
    path.rename(aside)
    return aside
  for folder, _, files in path.walk():
    for name in files:
      source = epath.Path(folder) / name
      target = aside / source.relative_to(path)
      target.parent.mkdir(parents=True, exist_ok=True)
      source.copy(target)
  path.rmtree()
  return aside


def uncommit_and_delete(path: epath.Path) -> None:
  """Deletes a checkpoint so that a crash half-way never leaves something that looks committed:
  first the commit goes (the marker object, or the final name by an atomic rename), then the rest."""
  if is_object_store(path):
    (path / COMMIT_MARKER).unlink(missing_ok=True)
    path.rmtree(missing_ok=True)
    return
  doomed = path.with_name(f'{path.name}{ORBAX_TMP}deleting')
  if doomed.exists():
    doomed.rmtree()
  path.rename(doomed)
  doomed.rmtree()


def manifest_dir(path: epath.Path) -> epath.Path:
  """Inside a checkpoint: the content manifest, one file per host (pax_autockpt.shared.manifest)."""
  return path / 'autockpt_manifest'


def manifest_path(path: epath.Path, host: int) -> epath.Path:
  return manifest_dir(path) / f'host{host}.json'


# --- the plugin's own files ----------------------------------------------------------------------


def autockpt_dir(job_log_dir: epath.PathLike) -> epath.Path:
  return epath.Path(job_log_dir) / 'autockpt'


def unrestorable_dir(job_log_dir: epath.PathLike) -> epath.Path:
  return autockpt_dir(job_log_dir) / 'unrestorable'


def set_aside_steps(job_log_dir: epath.PathLike) -> list[int]:
  """Steps of damaged checkpoints a restore set aside: marked in place (gs://) or moved aside."""
  steps = set(marked_unrestorable_steps(checkpoint_dir(job_log_dir)))
  aside = unrestorable_dir(job_log_dir)
  if aside.is_dir():
    steps.update(s for s in (step_of(p.name.split('.', 1)[0]) for p in aside.iterdir()) if s is not None)
  return sorted(steps)


def compilation_cache_dir(job_log_dir: epath.PathLike) -> epath.Path:
  """JAX's persistent compilation cache where the user named none (pax_autockpt.startup.compilation_cache)."""
  return autockpt_dir(job_log_dir) / 'compilation_cache'


def job_id_path(job_log_dir: epath.PathLike) -> epath.Path:
  return autockpt_dir(job_log_dir) / 'job_id'


def events_path(job_log_dir: epath.PathLike, host: int, part: int | None = None) -> epath.Path:
  """A host's event log; on object storage, part `part` of it."""
  suffix = '' if part is None else f'.{part:06d}'
  return autockpt_dir(job_log_dir) / f'events.host{host}{suffix}.jsonl'


def host_log_path(job_log_dir: epath.PathLike, host: int) -> epath.Path:
  """A host's output under `pax-autockpt launch`: beside the event log, or for a job on object
  storage (which cannot append) in a local folder named after it, $TMPDIR/pax-autockpt-logs/<bucket>/<path>/."""
  if is_object_store(job_log_dir):
    local = str(job_log_dir).split('://', 1)[1].strip('/')
    return epath.Path(tempfile.gettempdir()) / 'pax-autockpt-logs' / local / f'host{host}.log'
  return autockpt_dir(job_log_dir) / f'host{host}.log'


def standby_log_path(job_log_dir: epath.PathLike) -> epath.Path:
  """The output of `pax-autockpt launch`'s standby process (its imports' warnings), beside the hosts' logs."""
  return host_log_path(job_log_dir, 0).with_name('standby.log')


def summary_dir(job_log_dir: epath.PathLike) -> epath.Path:
  """The save scalars, beside Pax's own summaries (`tensorboard --logdir JOB_LOG_DIR/summaries`)."""
  return epath.Path(job_log_dir) / 'summaries' / 'autockpt'


# --- the local tier (pax_autockpt.local.format) -----------------------------------------------------

LOCAL_SHARDS = 'shards.bin'
LOCAL_INDEX = 'index.json'
_LOCAL_STEP = re.compile(r'step_(\d{8,})')
_LOCAL_PARTIAL = '.partial'


def local_dir(template: str, host: int) -> epath.Path:
  """A host's local tier: the setting with `{host}` replaced by the host index."""
  return epath.Path(template.replace('{host}', str(host)))


def local_step_dir(folder: epath.PathLike, step: int) -> epath.Path:
  return epath.Path(folder) / f'step_{step:08d}'


def local_partial_dir(folder: epath.PathLike, step: int, replaced: bool = False) -> epath.Path:
  """A local step being written; `replaced`: a committed one moved aside for a new copy of its step."""
  return epath.Path(folder) / f'step_{step:08d}{".replaced" if replaced else ""}{_LOCAL_PARTIAL}'


def local_buddy_dir(folder: epath.PathLike) -> epath.Path:
  """Where a host keeps its neighbour's newest committed local step (pax_autockpt.local.buddy)."""
  return epath.Path(folder) / 'buddy'


def local_committed_steps(folder: epath.PathLike) -> list[int]:
  """Committed local steps, oldest first: a final name with its index (written before the rename)."""
  folder = epath.Path(folder)
  if not folder.is_dir():
    return []
  found = (_LOCAL_STEP.fullmatch(p.name) for p in folder.iterdir())
  return sorted(int(m.group(1)) for m in found if m and (folder / m.group(0) / LOCAL_INDEX).exists())


def local_partials(folder: epath.PathLike) -> list[tuple[int, epath.Path]]:
  """(step, path) of local saves that never committed (a kill mid-save, a peer that never finished its
  part) and of replaced copies a kill left behind."""
  folder = epath.Path(folder)
  if not folder.is_dir():
    return []
  found = ((_LOCAL_STEP.match(p.name), p) for p in folder.iterdir() if p.name.endswith(_LOCAL_PARTIAL))
  return [(int(m.group(1)), p) for m, p in found if m]
