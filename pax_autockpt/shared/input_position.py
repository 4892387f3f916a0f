"""A training input's position at a step (Pax's `train_input` item), taken on the training thread.

The position saved with a step must be that step's: read later by reference, after the loop drew more batches,
a resumed run would skip them. Both tiers take it here, with the state's copy: the job directory's background
save (pax_autockpt.save.background_save) and the local tier's (pax_autockpt.local.format).
"""

from typing import Any

from absl import logging
from etils import epath

INPUT_ITEM = 'train_input'  # paxml's checkpoint_paths.INPUT_ITEM_NAME


class InputSnapshot:
  """A training input's position at the captured step: the bytes of its `get_state()`, written by
  the background save where Pax's BaseInput.save would write them."""

  def __init__(self, state: bytes):
    self.state = state

  def save(self, checkpoint_path: epath.PathLike) -> None:
    epath.Path(checkpoint_path).write_bytes(self.state)


_by_reference_warned: set[str] = set()


def input_snapshot(pipeline: Any) -> Any:
  """The pipeline's position now (an InputSnapshot). An input that implements only save()/restore(),
  not get_state(), stays by reference: its position is saved late, so a resumed run may skip batches
  (Pax's own caveat for such inputs); one warning says so."""
  try:
    return InputSnapshot(pipeline.get_state())
  except NotImplementedError:
    name = type(pipeline).__name__
    if name not in _by_reference_warned:
      _by_reference_warned.add(name)
      logging.warning('[autockpt] %s implements no get_state(): its position is saved when the background '
                      'save writes it, after later batches; a resumed run may skip them.', name)
    return pipeline
