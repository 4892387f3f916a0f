"""The loop's snapshot of the state (pax_autockpt.save.background_save.to_host), on this machine's CPU."""

from concurrent import futures
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from pax_autockpt.save import background_save
from pax_autockpt.shared import internals
from pax_autockpt.shared import priority


def _state():
  return {'w': jnp.arange(12.0).reshape(3, 4), 'step': jnp.int32(7), 'name': 'not an array'}


def test_a_snapshot_is_a_copy_that_the_next_step_cannot_change():
  state = _state()
  host = background_save.to_host(state)
  data = host['w'].addressable_data(0)
  assert isinstance(data, np.ndarray) and data.flags.owndata
  assert not np.shares_memory(data, np.asarray(state['w']))
  np.testing.assert_array_equal(data, np.arange(12.0).reshape(3, 4))
  assert host['name'] == 'not an array' and host['w'].shape == (3, 4)


def test_the_last_save_reads_the_arrays_in_place():
  """copy=False (no step runs after this save): the same bytes, without a copy."""
  state = _state()
  host = background_save.to_host(state, copy=False)
  data = host['w'].addressable_data(0)
  assert isinstance(data, np.ndarray)
  np.testing.assert_array_equal(data, np.asarray(state['w']))
  assert jax.devices()[0].platform != 'cpu' or np.shares_memory(data, np.asarray(state['w']))


class _CountingInput:
  """A stand-in for a Pax BaseInput with input checkpointing: get_state() is its position."""

  def __init__(self):
    self.drawn = 0

  def get_state(self) -> bytes:
    return str(self.drawn).encode()


def test_the_input_position_is_the_captured_steps_not_the_one_when_the_background_save_writes(tmp_path):
  pipeline = _CountingInput()
  pipeline.drawn = 300
  items = background_save.snapshot({'state': _state(), 'train_input': pipeline, 'metadata': {'v': 1}}, copy=True)
  pipeline.drawn = 311  # the loop draws on while the background save runs
  items['train_input'].save(tmp_path / 'process_0-of-1')
  assert (tmp_path / 'process_0-of-1').read_bytes() == b'300'
  assert items['metadata'] == {'v': 1} and isinstance(items['state']['w'], background_save.HostArray)


def test_an_input_without_get_state_is_saved_by_reference_with_one_warning(caplog):
  class SaveOnly:
    def get_state(self):
      raise NotImplementedError

  pipeline = SaveOnly()
  for _ in range(2):
    assert background_save.snapshot({'train_input': pipeline}, copy=True)['train_input'] is pipeline
  assert sum('implements no get_state()' in r.getMessage() for r in caplog.records) == 1


def test_a_lowered_save_thread_and_the_threads_it_starts_run_at_that_nice_value_and_no_other_thread_does():
  """pax_autockpt.shared.priority.lower_priority: per thread on Linux, inherited by the threads it
  starts (orbax's commit thread, asyncio's executors), never the caller's."""
  import threading  # pylint: disable=g-import-not-at-top
  got = {}

  def save():
    priority.lower_priority(19)
    got['save'] = priority.thread_nice()
    child = threading.Thread(target=lambda: got.update(child=priority.thread_nice()))
    child.start()
    child.join()

  before = priority.thread_nice()
  thread = threading.Thread(target=save)
  thread.start()
  thread.join()
  assert got == {'save': 19, 'child': 19} and priority.thread_nice() == before


def test_a_failed_write_fails_the_save_only_once_every_other_write_of_it_has_ended():
  failed, slow, ended = futures.Future(), futures.Future(), []
  failed.set_exception(OSError('disk full'))

  def finish_later():
    time.sleep(0.3)
    ended.append(time.time())
    slow.set_result(None)

  threading.Thread(target=finish_later).start()
  try:
    internals.AllSettled([failed, slow]).result()
    raise AssertionError('no failure')
  except OSError as e:
    assert str(e) == 'disk full' and ended  # orbax's own loop would have raised before `slow` ended
  internals.AllSettled([slow]).result()
