"""Every place the plugin reaches into private parts of paxml 1.4.0 and orbax-checkpoint 0.5.9, and why.

Neither has hooks for these; each function names the private attribute it uses, so that an upgrade
has one file to check. `version_warning` says in one line when other versions are installed.
"""

import collections
from concurrent import futures
import contextlib
import dataclasses
import importlib.metadata
import json
import os
import threading
from typing import Any, Callable

from absl import logging
from etils import epath
import jax
import numpy as np
from orbax.checkpoint import multihost as orbax_multihost
from orbax.checkpoint import utils as orbax_utils

from pax_autockpt import layout
from pax_autockpt.shared import coordination
from pax_autockpt.shared import failures
from pax_autockpt.shared import stops

WRITTEN_FOR = {'paxml': '1.4.0', 'orbax-checkpoint': '0.5.9'}
_original_tmp_checkpoints = orbax_utils.tmp_checkpoints
_original_checkpoint_steps = orbax_utils.checkpoint_steps


def version_warning() -> str | None:
  """One line when the installed paxml or orbax is not the version these patches were written for."""
  installed = {name: importlib.metadata.version(name) for name in WRITTEN_FOR}
  other = [f'{name} {v} (written for {WRITTEN_FOR[name]})' for name, v in installed.items() if v != WRITTEN_FOR[name]]
  if not other:
    return None
  return (f'pax_autockpt patches private parts of {", ".join(other)}: saves, restores or their '
          'agreement may misbehave; install the versions it was written for (make venv does).')


def _tmp_checkpoints_keeping_unrestorable(checkpoint_dir: epath.PathLike) -> list[str]:
  names = _original_tmp_checkpoints(checkpoint_dir)
  return [n for n in names if not layout.is_marked_unrestorable(epath.Path(checkpoint_dir) / n)]


def retry_listing(budget_secs: float) -> None:
  """orbax lists a job's checkpoints when Pax builds its checkpoint manager, before any restore code of
  ours runs; a storage outage there (TensorFlow's own 10 retries exhausted) ended the run with a
  traceback. The listing is one host's own read: retried here along failures.backoff."""
  def checkpoint_steps(checkpoint_dir, *args, **kwargs):
    try:
      return failures.retrying_transient(lambda: _original_checkpoint_steps(checkpoint_dir, *args, **kwargs),
                                         'listing the checkpoints', budget_secs)
    except Exception as e:  # pylint: disable=broad-except
      kind = failures.classify(e)
      waited = f' for {budget_secs:g} s' if kind is failures.Kind.TRANSIENT else ''
      raise stops.RestoreFailed(None, f'the checkpoints in {checkpoint_dir} could not be listed{waited} '
                                   f'({failures.one_line(e, 200)}); nothing was moved') from e
  orbax_utils.checkpoint_steps = checkpoint_steps


def keep_unrestorable_at_startup() -> None:
  """orbax's start-up clean-up (paxml turns it on) deletes every step without a commit marker on
  object storage. A damaged checkpoint we took the marker from must survive it: it is evidence,
  and the plugin never deletes a checkpoint it did not decide to. Call before Pax builds its
  checkpoint manager (AutockptMixin.validate does)."""
  orbax_utils.tmp_checkpoints = _tmp_checkpoints_keeping_unrestorable


def route_reached_preemption(manager: Any, is_agreed: Callable[[int], bool]) -> None:
  """orbax's save()/should_save() ask `reached_preemption(step)` themselves, which would feed XLA's
  preemption counter a second time; they get the decision already taken instead."""
  manager.reached_preemption = is_agreed


def turn_off_max_to_keep(manager: Any) -> None:
  """Pax's max_to_keep would delete behind a preservation policy's back (and without events)."""
  manager._options = dataclasses.replace(manager._options, max_to_keep=None)  # pylint: disable=protected-access


class _CommitFirstDeleter:
  """orbax 0.5.9's checkpoint deleter (`delete`, `delete_steps`, `close`) for Pax's `max_to_keep`, deleting as
  our preservation does (`layout.uncommit_and_delete`): orbax's own `rmtree`s the final name in place, so a
  kill mid-delete leaves a half-deleted checkpoint that still counts as committed. A failure costs one line:
  raised in orbax's commit thread, it would make the save that triggered it look failed."""

  def __init__(self, directory: epath.Path, primary: bool, deleted: Callable[[int], None]):
    self._directory, self._primary, self._deleted = directory, primary, deleted

  def delete(self, step: int) -> None:
    if not self._primary:
      return
    path = layout.step_dir(self._directory, step)
    try:
      if path.exists():
        layout.uncommit_and_delete(path)
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('[autockpt] could not delete step %d (max_to_keep): %s', step, failures.one_line(e))
      return
    self._deleted(step)

  def delete_steps(self, steps: Any) -> None:
    for step in steps:
      self.delete(step)

  def close(self) -> None:
    pass


def delete_commit_first(manager: Any, *, primary: bool, deleted: Callable[[int], None]) -> None:
  """orbax's `_checkpoint_deleter` (what `max_to_keep` deletes through) replaced by `_CommitFirstDeleter`;
  `deleted(step)` after each delete. A manager without one (a test's fake) is left as it is."""
  if hasattr(manager, '_checkpoint_deleter'):
    manager._checkpoint_deleter = _CommitFirstDeleter(epath.Path(manager.directory), primary, deleted)  # pylint: disable=protected-access


def orbax_manager(pax_checkpointer: Any) -> Any:
  """paxml's training checkpointer -> its OrbaxCheckpointManager -> orbax's CheckpointManager."""
  return pax_checkpointer.checkpoint_manager._manager  # pylint: disable=protected-access


def programs(executor: Any) -> tuple[Any, Any]:
  """paxml's DefaultExecutor keeps the train and eval programs it was set up with; their outputs are
  the metrics of each step (pax_autockpt.save.metrics)."""
  return executor._train_program, executor._eval_programs  # pylint: disable=protected-access


def decode_programs(executor: Any) -> Any:
  """paxml's DefaultExecutor keeps its decode programs beside the train and eval programs."""
  return executor._decode_programs  # pylint: disable=protected-access


def uses_ocdbt(pax_checkpointer: Any) -> bool:
  """Whether the run saves OCDBT (--tensorstore_use_ocdbt) rather than Pax's zarr layout."""
  return bool(getattr(pax_checkpointer.checkpoint_manager, '_tensorstore_use_ocdbt', False))


def array_names(train_state: Any, *, use_ocdbt: bool) -> list[tuple[str, Any]]:
  """(on-disk name, leaf) for every array of a train state, named as Pax 1.4.0 names them: its own
  flattened prefix names in the zarr layout (paxml.checkpoints._tensorstore_prepare), orbax's
  dotted key paths with OCDBT (paxml leaves the names to orbax there)."""
  if use_ocdbt:
    from orbax.checkpoint import pytree_checkpoint_handler  # pylint: disable=g-import-not-at-top
    names = jax.tree_util.tree_leaves(pytree_checkpoint_handler._get_param_names(train_state),  # pylint: disable=protected-access
                                      is_leaf=orbax_utils.is_empty_or_leaf)
    leaves = jax.tree_util.tree_leaves(train_state, is_leaf=orbax_utils.is_empty_or_leaf)
  else:
    from paxml import checkpoints as pax_checkpoints  # pylint: disable=g-import-not-at-top
    leaves, names, _ = pax_checkpoints._tensorstore_prepare(train_state)  # pylint: disable=protected-access
  return [(n, x) for n, x in zip(names, leaves) if hasattr(x, 'addressable_shards')]


def is_ocdbt_checkpoint(step_path: epath.Path) -> bool:
  from orbax.checkpoint import type_handlers  # pylint: disable=g-import-not-at-top
  return type_handlers.is_ocdbt_checkpoint(step_path / 'state')


def write_before_commit(orbax_manager: Any, start: Callable[[epath.Path], futures.Future | None]) -> None:
  """Has orbax's checkpoint handler call `start(directory)` once its arrays' writes are under way. The
  future it returns joins the save's commit futures, which orbax's commit thread waits for before the
  commit (the rename, or gs://'s commit marker): what it writes overlaps the arrays' writes (on a
  bucket, ~10 round trips less on the save's path) and a failure fails the save. The commit thread
  gets them as one future (AllSettled), so a failed save ends only once none of its writes goes on."""
  handler = orbax_manager._checkpointer._handler  # pylint: disable=protected-access
  original = handler.async_save

  async def async_save(directory, *args, **kwargs):
    commit_futures = list(await original(directory, *args, **kwargs) or [])
    extra = start(epath.Path(directory))
    return [AllSettled(commit_futures if extra is None else [*commit_futures, extra])]  # a list: orbax iterates it

  handler.async_save = async_save


class AllSettled:
  """One of orbax's commit futures standing for all of a save's writes: done when every one of them is
  done, then failing with the first failure. Orbax's commit thread stops at the first failed write while
  the others go on; the save would be reported failed and its leftovers removed while writes still
  landed in them (seen: a full disk left the failed saves' temporary directories behind)."""

  def __init__(self, writes: list[Any]):
    self._writes = writes

  def result(self, timeout: float | None = None) -> None:
    first = None
    for write in self._writes:
      try:
        write.result() if timeout is None else write.result(timeout=timeout)
      except Exception as e:  # pylint: disable=broad-except
        first = first or e
    if first is not None:
      raise first


class _NewStep(threading.local):
  path: str | None = None  # the step directory a job directory save is making, in the thread running that save
  absent = False  # its absence is known (asked once): orbax's later questions get that answer


_new_step = _NewStep()


@contextlib.contextmanager
def making_step_on_object_store(step_path: epath.Path):
  """Within, in this thread: orbax 0.5.9 asks three times whether a new step's directory exists, then
  makes it and each item's directory. On an object store each question costs two round trips and each
  directory four or five (TF's client checks the parents, then writes an empty marker object), all
  before the first array byte. A directory there is only a name prefix, and tensorstore and TF write
  objects under one without a marker: the markers are not written, and a first answer 'absent' stands
  until the step's directory is 'made' (17 round trips less per save; a leftover of a failed save at
  this step is still found and removed by orbax's first question)."""
  _install_new_step_hooks()
  _new_step.path, _new_step.absent = os.fspath(step_path), False
  try:
    yield
  finally:
    _new_step.path, _new_step.absent = None, False


def _install_new_step_hooks() -> None:
  from etils.epath import gpath  # pylint: disable=g-import-not-at-top
  cls = gpath._GPath  # pylint: disable=protected-access
  if getattr(cls, '_autockpt_hooked', False):
    return
  exists, mkdir = cls.exists, cls.mkdir

  def hooked_exists(self) -> bool:
    if _new_step.path is None or os.fspath(self) != _new_step.path:
      return exists(self)
    if _new_step.absent:
      return False
    found = exists(self)
    _new_step.absent = not found
    return found

  def hooked_mkdir(self, *args, **kwargs) -> None:
    path = os.fspath(self)
    if _new_step.path is None or not (path == _new_step.path or path.startswith(_new_step.path + '/')):
      return mkdir(self, *args, **kwargs)
    _new_step.absent = False  # 'made': from now on every question goes to the storage

  cls.exists, cls.mkdir, cls._autockpt_hooked = hooked_exists, hooked_mkdir, True  # pylint: disable=protected-access


def saving_enabled(pax_checkpointer: Any) -> bool:
  """False under --enable_checkpoint_saving=false, where Pax's saves are no-ops."""
  return getattr(pax_checkpointer, '_enable_checkpoint_saving', True)


def guard_restore(pax_checkpointer: Any, guard: Callable[..., Any]) -> None:
  """Pax's get_model_states reads the arrays in `_restore_with_args`, then starts device computations
  on the restored state. `guard(read, *args, **kwargs)` runs in its place, so that every host can agree
  on the read's outcome before those computations (pax_autockpt.restore.restore)."""
  read = pax_checkpointer._restore_with_args  # pylint: disable=protected-access
  pax_checkpointer._restore_with_args = lambda *args, **kwargs: guard(read, *args, **kwargs)  # pylint: disable=protected-access


_restoring = threading.local()


@contextlib.contextmanager
def no_orbax_restore_barrier():
  """orbax's Checkpointer.restore ends in a barrier of all hosts; a host whose read failed never
  reaches it and the others would wait there for the barrier's timeout. Inside this block that barrier
  is skipped: the caller's agreement on the outcome is the barrier."""
  _restoring.active = True
  try:
    yield
  finally:
    _restoring.active = False


def restore_step(pax_checkpointer: Any, step: int) -> None:
  """Points Pax's restore at `step` (a local-tier step, served by the restore guard)."""
  pax_checkpointer._step_to_restore = step  # pylint: disable=protected-access


def restore_newest_instead(pax_checkpointer: Any) -> None:
  """After a checkpoint was taken out of the listing: re-list, and restore the newest one left."""
  orbax_manager(pax_checkpointer).reload()
  pax_checkpointer._step_to_restore = pax_checkpointer.checkpoint_manager.latest_step()  # pylint: disable=protected-access


_BARRIER_TIMEOUT_MS = 10 * 60 * 1000  # a peer stuck this long is gone: fail rather than hang
_uses = collections.Counter()
_uses_lock = threading.Lock()


def _next_key(kind: str, name: str) -> str:
  """Every host calls orbax's barriers and broadcasts in the same order: per-name counters agree."""
  with _uses_lock:
    _uses[(kind, name)] += 1
    return f'{coordination.ORBAX_SYNC}{kind}/{name}/{_uses[(kind, name)]}'


def _barrier(name: str, processes: Any = None) -> None:
  client = coordination.client()
  if client is None or jax.process_count() == 1:
    return
  if name == 'Checkpointer:restore' and getattr(_restoring, 'active', False):
    return
  if processes is not None:
    raise NotImplementedError('orbax barrier over a subset of processes (paxml 1.4.0 uses none)')
  client.wait_at_barrier(_next_key('barrier', name), _BARRIER_TIMEOUT_MS)


def _broadcast(in_tree: Any, *, is_source: bool | None = None, processes: Any = None) -> Any:
  client = coordination.client()
  if client is None or jax.process_count() == 1:
    return in_tree
  if processes is not None:
    raise NotImplementedError('orbax broadcast to a subset of processes (paxml 1.4.0 uses none)')
  leaves, tree = jax.tree_util.tree_flatten(in_tree)
  key = _next_key('broadcast', 'one_to_some')
  source = jax.process_index() == 0 if is_source is None else is_source
  if source:
    client.key_value_set(key, json.dumps([[np.asarray(x).tolist(), np.asarray(x).dtype.str] for x in leaves]))
    return in_tree
  got = json.loads(client.blocking_key_value_get(key, _BARRIER_TIMEOUT_MS))
  return jax.tree_util.tree_unflatten(tree, [np.asarray(v, dtype=d) for v, d in got])


def use_coordination_service_for_orbax_sync() -> None:
  """orbax 0.5.9's barriers (`sync_global_processes`) and the broadcast of a save's temporary name are
  device collectives (a jitted psum). Called from a background save thread they would interleave with
  the training step's collectives; through jax.distributed's coordination service (a barrier, the
  key-value store) they are safe from any thread, and cost nothing with one process."""
  orbax_utils.sync_global_processes = _barrier
  orbax_multihost.broadcast_one_to_some = _broadcast


def input_handler_without_collectives(orbax_manager: Any, item: str) -> None:
  """paxml's BaseInputCheckpointHandler ends its save with `sync_global_devices`, a device collective,
  which from the background save thread would interleave with the training step's. Its item gets a
  handler that writes the same file (`process_<i>-of-<N>`) and leaves the cross-host wait to orbax's
  own barrier before the commit (the coordination service, above). Restores are paxml's, unchanged."""
  from paxml import checkpoints  # pylint: disable=g-import-not-at-top

  class InputHandler(checkpoints.BaseInputCheckpointHandler):

    def save(self, directory: epath.Path, item: Any) -> None:
      path = directory / f'process_{jax.process_index()}-of-{jax.process_count()}'
      path.parent.mkdir(parents=True, exist_ok=True)
      item.save(path)

  handlers = getattr(orbax_manager._checkpointer._handler, '_known_handlers', {})  # pylint: disable=protected-access
  wrapper = handlers.get(item)
  if wrapper is not None and isinstance(wrapper._handler, checkpoints.BaseInputCheckpointHandler):  # pylint: disable=protected-access
    wrapper._handler = InputHandler()  # pylint: disable=protected-access


_uncompressed = threading.Event()  # set while a save that writes its chunks uncompressed runs


@contextlib.contextmanager
def uncompressed_chunks(on: bool = True):
  """Within: orbax 0.5.9 writes each array chunk without zstd, which it sets for every array in
  `type_handlers._build_ts_zarr_shard_and_chunk_metadata` (zarr's `compressor`, zarr3's codec list).
  Saves run one at a time per process (pax_autockpt.save.background_save), so a process-wide switch is
  enough, and it reaches orbax's and tensorstore's own threads. Restores read each array's stored
  metadata, so checkpoints with and without compression restore alike."""
  from orbax.checkpoint import type_handlers  # pylint: disable=g-import-not-at-top
  build = type_handlers._build_ts_zarr_shard_and_chunk_metadata  # pylint: disable=protected-access
  if not getattr(build, 'autockpt', False):
    type_handlers._build_ts_zarr_shard_and_chunk_metadata = _honouring_uncompressed(build)  # pylint: disable=protected-access
  if on:
    _uncompressed.set()
  try:
    yield
  finally:
    _uncompressed.clear()


def _honouring_uncompressed(build: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
  def metadata(*args, **kwargs):
    got = build(*args, **kwargs)
    if _uncompressed.is_set():
      if 'compressor' in got:
        got['compressor'] = None  # zarr v2: raw chunks
      for codec in got.get('codecs', []):
        inner = codec.get('configuration', {})
        inner['codecs'] = [c for c in inner.get('codecs', []) if c.get('name') != 'zstd']
    return got
  metadata.autockpt = True
  return metadata


def instrument_programs(train_program: Any, eval_programs: Any, decode_programs: Any, phases: Any) -> None:
  """paxml 1.4.0's programs call their own `run`, `train_step`, `_maybe_run_eval_train`, `eval_step` and
  `decode_step` through `self`: instance attributes wrapping them record the loop's phase in `phases`
  (pax_autockpt.shared.phases) and make each eval and decode batch an agreement point. No other behaviour changes."""
  _wrap(train_program, 'run', before=lambda *_: phases.enter('input'), after=lambda *_: phases.enter('loop'))
  _wrap(train_program, 'train_step', before=lambda *_: phases.enter('train'),
        after=lambda out, *_: phases.trained(out[0], out[1]))
  _wrap(train_program, '_maybe_run_eval_train', before=lambda *_: phases.point('eval'),
        after=lambda *_: phases.enter('after-step'))
  for kind, programs_of_kind, step_fn in (('eval', eval_programs, 'eval_step'), ('decode', decode_programs,
                                                                                  'decode_step')):
    for program in programs_of_kind or ():
      _wrap(program, 'run', before=lambda *_, k=kind: phases.enter(k), after=lambda *_: phases.enter('loop'))
      if hasattr(program, step_fn):  # stock paxml needs only `run` of a custom program: no batches to stop at
        _wrap(program, step_fn, before=lambda *_, k=kind: phases.point(k))


def _wrap(obj: Any, name: str, before: Callable[..., None], after: Callable[..., None] | None = None) -> None:
  original = getattr(obj, name)

  def wrapped(*args, **kwargs):
    before(*args)
    out = original(*args, **kwargs)
    if after is not None:
      after(out, *args)
    return out

  setattr(obj, name, wrapped)
