"""A fake of paxml's training checkpointer for the unit tests, small enough to read at once.

It has exactly what pax_autockpt touches (see pax_autockpt/shared/internals.py) and writes checkpoints on
local disk the way orbax 0.5.9 does: `checkpoint_%08d.orbax-checkpoint-tmp-<n>` first, renamed to
`checkpoint_%08d` (the commit) by a background finalize thread. A test holds the commit back by
clearing `FakeOrbaxManager.gate`, makes it fail with `fail_commit`, or makes the save fail to start
with `fail_start`.
"""

import asyncio
import dataclasses
import re
import signal
import threading
import time
import types
from typing import Any

from etils import epath
import jax
from jax import numpy as jnp
from paxml import train_states

from pax_autockpt import settings as settings_lib
from pax_autockpt.hook import checkpointer as checkpointer_lib
from pax_autockpt.shared import coordination
from pax_autockpt.shared import events as events_lib
from pax_autockpt.signals import signals

GATE_TIMEOUT_S = 5.0  # a commit held back longer fails, so that a broken wrapper fails, not hangs
_NAME = re.compile(r'checkpoint_(\d{8})')


def write_checkpoint(path: epath.Path) -> epath.Path:
  """What a restorable checkpoint holds, as far as pax_autockpt.restore.integrity looks."""
  (path / 'state').mkdir(parents=True, exist_ok=True)
  (path / 'state' / 'w').write_bytes(b'x')
  (path / 'metadata').mkdir()
  (path / 'metadata' / 'metadata').write_text('{}')
  return path


@dataclasses.dataclass(frozen=True)
class Options:
  """orbax's CheckpointManagerOptions, as far as the wrapper touches them."""

  max_to_keep: int | None = None


class FinalizeThread(threading.Thread):
  """orbax's _FinalizeThread: keeps the commit's exception in `exception`; join() raises it once."""

  exception = None

  def run(self):
    try:
      super().run()
    except BaseException as e:  # pylint: disable=broad-except
      self.exception = e

  def join(self, *args, **kwargs):
    super().join(*args, **kwargs)
    if self.exception:
      error, self.exception = self.exception, None
      raise error


class FakeHandler:
  """orbax's checkpoint handler, as far as the wrapper hooks it: async_save(directory) -> futures."""

  async def async_save(self, directory, *args, **kwargs):
    del directory, args, kwargs
    return []


class FakeOrbaxManager:
  """orbax's CheckpointManager: the in-memory step list, async commit, max_to_keep."""

  def __init__(self, directory: epath.Path, max_to_keep: int | None):
    self.directory = directory
    self.directory.mkdir(parents=True, exist_ok=True)
    self._options = Options(max_to_keep)
    self._checkpointer = types.SimpleNamespace(_handler=FakeHandler())  # orbax's AsyncCheckpointer
    self._finalize_thread: FinalizeThread | None = None
    self._steps: list[int] = []  # saved or in flight, oldest first (orbax's `_checkpoints`)
    self.gate = threading.Event()  # the commit waits for it
    self.gate.set()
    self.fail_start: BaseException | None = None
    self.fail_commit: BaseException | None = None  # the saves started while it is set fail to commit
    self.attempts: list[int] = []  # every step save() was called for
    self.tmp_dirs: list[epath.Path] = []  # every temporary directory a save created
    self.reload()

  def reached_preemption(self, step: int) -> bool:
    del step
    return False

  def reload(self) -> None:
    """Re-lists the committed steps from disk."""
    found = (_NAME.fullmatch(p.name) for p in self.directory.iterdir())
    self._steps = sorted(int(m.group(1)) for m in found if m)

  def latest_step(self) -> int | None:
    return self._steps[-1] if self._steps else None

  def save(self, step: int, items: Any = None, save_kwargs: Any = None, force: bool = False) -> bool:
    """As orbax: the step's temporary directory, then the writes, then an async commit."""
    del save_kwargs, force
    self.saved_items = items
    self.attempts.append(step)
    self.wait_until_finished()
    tmp = self.directory / f'checkpoint_{step:08d}.orbax-checkpoint-tmp-{len(self.tmp_dirs)}'
    tmp.mkdir()  # orbax creates it first, then the arrays' writes start (and may fail at once)
    self.tmp_dirs.append(tmp)
    if self.fail_start is not None:
      raise self.fail_start
    write_checkpoint(tmp)
    commit_futures = asyncio.run(self._checkpointer._handler.async_save(tmp))  # pylint: disable=protected-access
    self._steps.append(step)
    doomed = []
    if self._options.max_to_keep:
      doomed, self._steps = self._steps[:-self._options.max_to_keep], self._steps[-self._options.max_to_keep:]
    self._finalize_thread = FinalizeThread(target=self._finalize, daemon=True,
                                           args=(tmp, step, doomed, self.fail_commit, commit_futures))
    self._finalize_thread.start()
    return True

  def _finalize(self, tmp: epath.Path, step: int, doomed: list[int], error: BaseException | None,
                commit_futures: list[Any]) -> None:
    for future in commit_futures:  # as orbax's commit thread: every write the save started, then the commit
      future.result()
    if not self.gate.wait(GATE_TIMEOUT_S):
      raise TimeoutError(f'the commit of step {step} was held back for {GATE_TIMEOUT_S} s')
    if error is not None:
      raise error
    tmp.rename(self.directory / f'checkpoint_{step:08d}')
    for old in doomed:
      (self.directory / f'checkpoint_{old:08d}').rmtree()

  def wait_until_finished(self) -> None:
    """As orbax: raises a failed commit's error once, and forgets that step."""
    thread, self._finalize_thread = self._finalize_thread, None
    if thread is not None:
      try:
        thread.join()
      except BaseException:
        self._steps = self._steps[:-1]
        raise


class FakePaxManager:
  """paxml's OrbaxCheckpointManager: its directory, its save interval, orbax's manager in `_manager`."""

  def __init__(self, directory: epath.Path, interval: int, max_to_keep: int | None):
    self.directory = directory
    self.interval = interval
    self._manager = FakeOrbaxManager(directory, max_to_keep)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def should_save(self, step: int) -> bool:
    """As orbax 0.5.9's: a step that reached preemption is due whatever was saved before (even itself)."""
    if self._manager.reached_preemption(step):
      return True
    latest = self.latest_step()
    return step % self.interval == 0 and (latest is None or step > latest)

  def check_for_errors(self) -> None:
    """Nothing here: a failed commit surfaces at wait_until_finished, as it mostly does in orbax."""

  def wait_until_finished(self) -> None:
    self._manager.wait_until_finished()


class FakePaxCheckpointer:
  """paxml's _OrbaxPjitTrainingCheckpointer over JOB_LOG_DIR/checkpoints."""

  def __init__(self, job_log_dir, *, interval: int = 10, max_to_keep: int | None = None,
               enable_checkpoint_saving: bool = True):
    self.checkpoint_manager = FakePaxManager(epath.Path(job_log_dir) / 'checkpoints', interval,
                                             max_to_keep)
    self._enable_checkpoint_saving = enable_checkpoint_saving
    self._step_to_restore = self.checkpoint_manager.latest_step()
    self.restored: list[int | None] = []  # the steps get_model_states restored
    self.restored_states: dict[int, Any] = {}  # step -> the state its restore returns (default STATE)
    self.fail_restore: BaseException | list[BaseException | None] | None = None

  @property
  def orbax(self) -> FakeOrbaxManager:
    return self.checkpoint_manager._manager  # pylint: disable=protected-access

  @property
  def step_to_restore(self) -> int | None:
    return self._step_to_restore

  def get_model_states(self, partitioner, metadata, root_prng_key, train_input_pipeline=None):
    """As paxml: reads the arrays (`_restore_with_args`), then works on the restored state."""
    del partitioner, metadata, root_prng_key
    self.input_restored = train_input_pipeline is not None
    step = self._step_to_restore
    state = STATE if step is None else self._restore_with_args(step)
    return state, None, step or 0, None

  def _restore_with_args(self, step, *args):
    """Reads a checkpoint back: `fail_restore` (an exception, or a list taken one per call) first."""
    del args
    failure = self.fail_restore.pop(0) if isinstance(self.fail_restore, list) else self.fail_restore
    if failure is not None:
      raise failure
    if not (self.checkpoint_manager.directory / f'checkpoint_{step:08d}').is_dir():
      raise FileNotFoundError(f'no checkpoint for step {step}')
    self.restored.append(step)
    return self.restored_states.get(step, STATE)  # what "reading the arrays back" gives

  def save_final(self, step_i: int, *, partitioned_train_state: Any,
                 train_state_unpadded_shape_dtype_struct=None, train_state_pspecs=None,
                 train_input_pipeline=None) -> None:
    """As paxml: a forced save unless saving is off or the step is not newer than the latest."""
    del train_state_unpadded_shape_dtype_struct, train_state_pspecs, train_input_pipeline
    if not self._enable_checkpoint_saving:
      return
    latest = self.checkpoint_manager.latest_step()
    if latest is None or latest < step_i:
      self.orbax.save(step_i, {'state': partitioned_train_state, 'metadata': {'step': step_i}}, force=True)

  def wait_until_finished(self) -> None:
    self.checkpoint_manager.wait_until_finished()


# --- the wrapper around the fake, and a preemption in-process ---------------------------------------

# The train state, as Pax's: a step, one variable, one optimizer slot.
STATE = train_states.TrainState(step=jnp.zeros((), jnp.int32), mdl_vars={'w': jnp.arange(4, dtype=jnp.float32)},
                                opt_states=[{'m': jnp.ones(4, jnp.float32)}])


class ProcessExited(Exception):
  """Raised by the `exits` fixture's stand-in for os._exit (tests/conftest.py): it ends the calling thread
  instead of the process."""


def preempt(signum: int = signal.SIGTERM) -> None:
  """What the SIGTERM handler (or the Ctrl-C watcher) does, without a real signal: the test process must
  survive a mistake."""
  signals._record(signum, None)  # pylint: disable=protected-access


def wrap(job_log_dir, settings: settings_lib.Settings | None = None, metrics=None, **fake_kwargs
         ) -> tuple[checkpointer_lib.AutockptCheckpointer, FakePaxCheckpointer]:
  """An AutockptCheckpointer (host 0, exit after an on-demand save) around a new fake; `metrics` a
  pax_autockpt.save.metrics.StepMetrics the test feeds as Pax's programs would."""
  fake = FakePaxCheckpointer(job_log_dir, **fake_kwargs)
  wrapped = checkpointer_lib.AutockptCheckpointer(
      fake, settings=settings or settings_lib.Settings(), events=events_lib.EventLog(job_log_dir, 0),
      exit_after_ondemand_checkpoint=True, enable_summaries=False, metrics=metrics)
  # The fake loop stands past its first step: a signal takes the agreed-step path, never the start-up exit
  # (which ends the process: this one is pytest's; tests/test_startup_exit.py tests it with its exit patched).
  wrapped._startup.first_step_done()  # pylint: disable=protected-access
  return wrapped, fake


def events(job_log_dir, kind: str | None = None) -> list[dict[str, Any]]:
  """Host 0's events, all or of one kind."""
  return [e for e in events_lib.read(job_log_dir, 0) if kind is None or e['event'] == kind]


def raises(error: BaseException):
  """A stand-in for a function that fails with `error`."""
  def fail(*args, **kwargs):
    del args, kwargs
    raise error
  return fail


# --- jax.distributed's coordination client, shared by threads as hosts --------------------------------------


class CoordinationStore:
  """The coordination service as pax_autockpt.hosts.agreement uses it, for threads standing in for `hosts` hosts:
  a key is set once (ALREADY_EXISTS after), a blocking get ends in DEADLINE_EXCEEDED, and a barrier counts
  its timeout from its first arrival, as jaxlib 0.4.26's do."""

  def __init__(self, hosts: int):
    self.kv: dict[str, str] = {}
    self._hosts, self._barriers = hosts, {}
    self._changed = threading.Condition()
    self.timed_out_gets = 0  # blocking gets that ended without their key

  def key_value_set(self, key: str, value: str) -> None:
    with self._changed:
      if key in self.kv:
        raise RuntimeError(f'ALREADY_EXISTS: Config key {key} already exists.')
      self.kv[key] = value
      self._changed.notify_all()

  def blocking_key_value_get(self, key: str, timeout_ms: int) -> str:
    with self._changed:
      if not self._changed.wait_for(lambda: key in self.kv, timeout_ms / 1000):
        self.timed_out_gets += 1
        raise RuntimeError(f'DEADLINE_EXCEEDED: {key} not found within {timeout_ms} ms')
      return self.kv[key]

  def key_value_dir_get(self, prefix: str) -> list[tuple[str, str]]:
    with self._changed:
      return [(k, v) for k, v in sorted(self.kv.items()) if k.startswith(prefix)]

  def key_value_delete(self, key: str) -> None:
    with self._changed:
      for k in [k for k in self.kv if k == key or k.startswith(key.rstrip('/') + '/')]:
        del self.kv[k]

  def wait_at_barrier(self, name: str, timeout_ms: int) -> None:
    with self._changed:
      arrived = self._barriers.setdefault(name, [time.monotonic() + timeout_ms / 1000, 0, False])
      arrived[1] += 1
      self._changed.notify_all()
      if arrived[2] or not self._changed.wait_for(lambda: arrived[1] >= self._hosts, arrived[0] - time.monotonic()):
        arrived[2] = True  # failed: a later arrival finds it failed too
        raise RuntimeError(f'DEADLINE_EXCEEDED: Barrier timed out. Barrier_id: {name}')


def as_hosts(monkeypatch, count, run, release=None):
  """`run(host)` on a thread per host ('host-<n>') against one fake coordination service: each host's result
  or the exception that escaped it, and the service. With `release` (an Event a stalled host waits on), every
  other host ends first, then it is set."""
  store = CoordinationStore(count)
  monkeypatch.setattr(coordination, 'client', lambda: store)
  monkeypatch.setattr(jax, 'process_count', lambda: count)
  results = {}

  def host(h):
    try:
      results[h] = run(h)
    except Exception as e:  # pylint: disable=broad-except
      results[h] = e

  threads = [threading.Thread(target=host, args=(h,), name=f'host-{h}', daemon=True) for h in range(count)]
  for thread in threads:
    thread.start()
  for thread in threads[:-1] if release else threads:
    thread.join(60)
  if release:
    release.set()
    threads[-1].join(60)
  return results, store
