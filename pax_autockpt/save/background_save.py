"""The save path: the training loop waits only for the state's copy off the devices.

orbax 0.5.9 does most of an "async" save in the caller's thread: the temporary directory and its
barriers, a tensorstore open and metadata file per array, the sharding files, Pax's metadata; on
object storage each of those is a round trip. `BackgroundSaves` takes over the orbax
CheckpointManager's `save`: in the caller's thread it only copies every array shard this host will
write into host memory — a consistent snapshot of this step, since the loop donates and overwrites the
device buffers at the next step — and then runs orbax's own save, unchanged, on those copies in one
background thread, where it also waits for orbax's commit. Multi-host waits there must not be device
collectives (they would interleave with the training step's); `internals` routes orbax's barriers and
broadcasts through jax.distributed's coordination service.

The training input's position (Pax's `train_input` item, with `enable_input_checkpointing`) is part of
the same snapshot: its `get_state()` runs here (pax_autockpt.shared.input_position), on the training thread, so the
position saved with a step is that step's; passed by reference, the background thread would read it after the
loop drew more batches, and a resumed run would skip them.
"""

from concurrent import futures
import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable

from absl import logging
from etils import epath
import jax
import numpy as np
from orbax.checkpoint import type_handlers

from pax_autockpt import layout
from pax_autockpt.shared import failures
from pax_autockpt.shared import input_position
from pax_autockpt.shared import internals
from pax_autockpt.shared import priority


@dataclasses.dataclass(frozen=True)
class HostShard:
  """One addressable shard: where it sits in the global array, and its bytes if this host writes it.
  (A plain class, not a NamedTuple: jax maps over a list of shards as a pytree, shards are leaves.)"""

  index: tuple[slice, ...]
  replica_id: int
  data: Any  # np.ndarray, or a jax.ShapeDtypeStruct for a replica this host does not write


class HostArray:
  """A jax.Array's shards copied to host memory, with what orbax's ArrayHandler and jax's
  `async_serialize` read from a jax.Array (shape, dtype, sharding, addressable shards)."""

  def __init__(self, array: jax.Array, shards: list[HostShard]):
    self.shape = array.shape
    self.dtype = array.dtype
    self.sharding = array.sharding
    self.ndim = array.ndim
    self.size = array.size
    self.is_fully_addressable = array.is_fully_addressable
    self.addressable_shards = shards

  def addressable_data(self, i: int) -> Any:
    return self.addressable_shards[i].data

  @property
  def nbytes(self) -> int:
    return sum(s.data.nbytes for s in self.addressable_shards if isinstance(s.data, np.ndarray))


def _written(shard) -> bool:
  return shard.replica_id == 0  # orbax's ArrayHandler writes replica 0 of every shard


def to_host(tree: Any, copy: bool = True) -> Any:
  """Every jax.Array leaf as a HostArray: all device->host copies started first, then collected.

  `copy=False` is for a save after which no step runs (the on-demand save before exiting): nothing
  will donate the buffers, so on CPU the host data is the device buffer itself, with no copy."""
  arrays = [x for x in jax.tree_util.tree_leaves(tree) if isinstance(x, jax.Array)]
  for array in arrays:
    for shard in array.addressable_shards:
      # Accelerators: all transfers in flight at once. Not on CPU, where the device buffer already is
      # host memory, and an async copy can still be reading it when the next step donates it.
      if _written(shard) and shard.device.platform != 'cpu':
        shard.data.copy_to_host_async()

  def host(x):
    if not isinstance(x, jax.Array):
      return x
    shards = [HostShard(s.index, s.replica_id,
                        np.array(s.data, copy=copy) if _written(s)
                        else jax.ShapeDtypeStruct(s.data.shape, s.data.dtype))
              for s in x.addressable_shards]
    return HostArray(x, shards)

  return jax.tree_util.tree_map(host, tree)


def snapshot(items: dict[str, Any], copy: bool) -> dict[str, Any]:
  """Pax's items for one save, as of now: the state's shards in host memory, the input's position."""
  def one(name, item):
    if name == 'state':
      return to_host(item, copy=copy)
    return input_position.input_snapshot(item) if name == input_position.INPUT_ITEM else item
  return {name: one(name, item) for name, item in items.items()}


def _register_with_orbax() -> None:
  """HostArray is written by the very handler (and settings, e.g. Pax's metadata key) registered for
  jax.Array: that entry of orbax's registry is widened to match both (one handler per type string)."""
  handler = type_handlers.get_type_handler(jax.Array)
  type_handlers.register_type_handler(jax.Array, handler, func=lambda t: issubclass(t, (jax.Array, HostArray)),
                                      override=True)


Started = Callable[[int], None]
Done = Callable[[int, BaseException | None], None]
BeforeCommit = Callable[[int, epath.Path, dict[str, Any]], None]  # step, the checkpoint's directory, items


class BackgroundSaves:
  """Splits the orbax manager's save(): `capture` (the manager's save, in the caller's thread) takes
  the host snapshot, `launch` runs the rest of the save in a background thread."""

  def __init__(self, orbax_manager: Any, before_commit: BeforeCommit | None = None):
    self._manager = orbax_manager
    self._orbax_save = orbax_manager.save
    orbax_manager.save = self.capture
    self._pending: tuple[int, dict[str, Any], bool, int] | None = None  # step, orbax's kwargs, uncompressed, nice
    self._saving: tuple[int, dict[str, Any]] | None = None  # the save the background thread is running
    self._thread: threading.Thread | None = None
    self._launched: tuple[int, float] | None = None  # (step, start) of the save in flight
    self._settled = threading.Event()  # the newest launched save's commit is done or failed (orbax's own word)
    self._settled.set()
    self._committed: dict[int, float] = {}  # step -> launch to commit (s), of each save orbax committed here
    self._before_commit = before_commit
    self.last_save = False  # set by the checkpointer for a save after which no step runs: no copy
    self.uncompressed = False  # set by the checkpointer: the next save writes its array chunks raw
    self.nice = 0  # set by the checkpointer: the Linux nice value of the next save's thread (priority.lower_priority)
    self.captured_bytes = 0  # the array bytes this host writes in the newest captured save
    internals.write_before_commit(orbax_manager, self._write_before_commit)  # also: all writes settle together
    internals.use_coordination_service_for_orbax_sync()
    internals.input_handler_without_collectives(orbax_manager, input_position.INPUT_ITEM)

  def _write_before_commit(self, directory: epath.Path) -> futures.Future | None:
    """Runs `before_commit` in a thread of its own, beside orbax's array writes (a daemon thread: a
    stuck write never holds up an exit; the commit waits for its future)."""
    if self._saving is None or self._before_commit is None:
      return None
    step, items = self._saving
    done = futures.Future()

    def run():
      try:
        self._before_commit(step, directory, items)
        done.set_result(None)
      except BaseException as e:  # pylint: disable=broad-except
        done.set_exception(e)

    threading.Thread(target=run, name=f'autockpt-before-commit-{step}', daemon=True).start()
    return done

  def capture(self, step: int, items: Any = None, save_kwargs: Any = None, metrics: Any = None,
              force: bool = False, args: Any = None) -> bool:
    """Stands in for orbax's CheckpointManager.save: the snapshot only; `launch` does the save."""
    if args is not None or metrics is not None:
      raise NotImplementedError('orbax save with args= or metrics= (paxml 1.4.0 passes neither)')
    self.wait()
    _register_with_orbax()
    items = snapshot(items, copy=not self.last_save)
    self.captured_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(items.get('state'))
                              if isinstance(x, HostArray))
    self._pending = (step, dict(items=items, save_kwargs=save_kwargs, force=force), self.uncompressed, self.nice)
    return True

  def launch(self, started: Started, done: Done) -> int | None:
    """Runs the captured save in the background: `started(step)`, orbax's save, its commit, then
    `done(step, error)`. Returns the step, or None when nothing was captured."""
    if self._pending is None:
      return None
    step, kwargs, uncompressed, nice = self._pending
    self._pending = None
    self._launched = (step, time.time())
    self._settled.clear()
    self._thread = threading.Thread(target=self._finish, args=(step, kwargs, uncompressed, nice, started, done),
                                    name=f'autockpt-save-{step}', daemon=True)
    self._thread.start()
    return step

  def _finish(self, step: int, kwargs: dict[str, Any], uncompressed: bool, nice: int, started: Started,
              done: Done) -> None:
    error = None
    priority.lower_priority(nice)
    try:
      started(step)
      self._saving = (step, kwargs['items'])
      with internals.uncompressed_chunks(uncompressed), self._making(step):
        self._orbax_save(step, **kwargs)
        self._manager.wait_until_finished()  # the commit; raises its error and drops the step if it failed
      self._committed[step] = time.time() - self._launched[1]
    except BaseException as e:  # pylint: disable=broad-except
      error = e
    finally:
      self._saving = None
      self._settled.set()  # no longer in flight: what `done` does next (host 0: preservation) is not the save
    try:
      done(step, error)
    except Exception as e:  # pylint: disable=broad-except  (storage failing under `done`: one line, no traceback)
      logging.error('[autockpt] after the save of step %d: %s', step, failures.one_line(e))

  def _making(self, step: int) -> Any:
    """On an object store: no directory markers, no repeated questions (internals)."""
    path = layout.step_dir(self._manager.directory, step)
    return internals.making_step_on_object_store(path) if layout.is_object_store(path) else contextlib.nullcontext()

  def wait(self, timeout: float | None = None) -> bool:
    """Waits for the save in flight; True when none is left."""
    thread = self._thread
    if thread is not None:
      thread.join(timeout)
    return thread is None or not thread.is_alive()

  @property
  def in_flight(self) -> bool:
    """The background thread is alive: the save, or what runs after its commit (host 0: the preservation
    policy's deletes). For "may the next save start"; the exit path asks `uncommitted_step` instead."""
    return self._thread is not None and self._thread.is_alive()

  @property
  def uncommitted_step(self) -> int | None:
    """The step of a save launched and neither committed nor failed yet, or None: a save is in flight until its
    commit, not until its thread ends (host 0's lives on through the preservation after each commit, and the
    other hosts' do not: a plan that counted the thread would differ between hosts)."""
    launched = self._launched
    return launched[0] if launched is not None and not self._settled.is_set() else None

  def uncommitted_for(self) -> float:
    """Seconds since the uncommitted save (`uncommitted_step`) was launched (0 with none)."""
    launched = self._launched
    return time.time() - launched[1] if launched is not None and not self._settled.is_set() else 0.0

  def wait_until_settled(self, timeout: float | None = None) -> bool:
    """Waits for the save in flight to commit or fail (not for what its thread does after); True once it has."""
    return self._settled.wait(timeout)

  @property
  def committed_steps(self) -> list[int]:
    """The steps whose save orbax committed in this process, oldest first: the commit's own record, for when
    storage cannot be asked (an outage during the exit)."""
    return sorted(self._committed)

  def took(self, step: int) -> float | None:
    """How long `step`'s save took from its launch to its commit (None: it did not commit here)."""
    return self._committed.get(step)

  @property
  def saving_step(self) -> int | None:
    """The step of the save in flight, or None."""
    launched = self._launched
    return launched[0] if launched is not None and self.in_flight else None

  def saving_for(self) -> float:
    """Seconds since the save in flight was launched (0 with none)."""
    launched = self._launched
    return time.time() - launched[1] if launched is not None and self.in_flight else 0.0
