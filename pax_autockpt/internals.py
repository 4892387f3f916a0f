"""Every place the plugin reaches into private parts of paxml 1.4.0 and orbax-checkpoint 0.5.9, and why.

Neither has hooks for these; each function names the private attribute it uses, so that an upgrade
has one file to check.
"""

import dataclasses
import threading
from typing import Any, Callable

from etils import epath
from orbax.checkpoint import utils as orbax_utils

from pax_autockpt import layout

_original_tmp_checkpoints = orbax_utils.tmp_checkpoints


def _tmp_checkpoints_keeping_unrestorable(checkpoint_dir: epath.PathLike) -> list[str]:
  names = _original_tmp_checkpoints(checkpoint_dir)
  return [n for n in names if not layout.is_marked_unrestorable(epath.Path(checkpoint_dir) / n)]


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


def orbax_manager(pax_checkpointer: Any) -> Any:
  """paxml's training checkpointer -> its OrbaxCheckpointManager -> orbax's CheckpointManager."""
  return pax_checkpointer.checkpoint_manager._manager  # pylint: disable=protected-access


def saving_enabled(pax_checkpointer: Any) -> bool:
  """False under --enable_checkpoint_saving=false, where Pax's saves are no-ops."""
  return getattr(pax_checkpointer, '_enable_checkpoint_saving', True)


def restore_newest_instead(pax_checkpointer: Any) -> None:
  """After a checkpoint was taken out of the listing: re-list, and restore the newest one left."""
  orbax_manager(pax_checkpointer).reload()
  pax_checkpointer._step_to_restore = pax_checkpointer.checkpoint_manager.latest_step()  # pylint: disable=protected-access


def finalize_thread(manager: Any) -> threading.Thread | None:
  """The thread that commits the save in flight (orbax's async finalize), if any."""
  return getattr(manager, '_finalize_thread', None)


def join_without_raising(thread: threading.Thread) -> None:
  """threading.Thread.join, not orbax's join(): that one raises the commit error and clears it, and
  orbax must still see it to drop the failed step from its list."""
  threading.Thread.join(thread)


def commit_error(thread: threading.Thread | None) -> BaseException | None:
  return getattr(thread, 'exception', None)
