"""The loop's snapshot of the state (pax_autockpt.background_save.to_host), on this machine's CPU."""

import jax
import jax.numpy as jnp
import numpy as np

from pax_autockpt import background_save


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
