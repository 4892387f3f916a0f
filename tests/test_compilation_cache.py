"""The restored state's copy out of NumPy's memory where JAX's persistent compilation cache is on (CPU)."""

import os
import subprocess
import sys

import jax
import numpy as np

from pax_autockpt import compilation_cache


def _restored_like(host):
  restored = jax.device_put(host, jax.devices('cpu')[0])  # what orbax's restore leaves on CPU
  assert restored.unsafe_buffer_pointer() == host.ctypes.data  # NumPy's memory: unsafe to donate
  return restored


def test_without_the_cache_nothing_is_copied(monkeypatch):
  monkeypatch.setattr(compilation_cache, '_cache_dir', lambda: None)
  state = {'w': _restored_like(np.arange(16, dtype=np.float32))}
  assert compilation_cache.owned_by_xla(state) is state


def test_with_the_cache_every_array_moves_to_memory_xla_owns_same_values_and_sharding(monkeypatch, tmp_path):
  monkeypatch.setattr(compilation_cache, '_cache_dir', lambda: str(tmp_path))
  host = np.arange(4096, dtype=np.float32)
  restored = _restored_like(host)
  state = {'w': restored, 'step': 7, 'b': [restored + 1]}
  owned = compilation_cache.owned_by_xla(state)
  assert owned['step'] == 7
  for before, after in ((state['w'], owned['w']), (state['b'][0], owned['b'][0])):
    assert after.unsafe_buffer_pointer() not in (before.unsafe_buffer_pointer(), host.ctypes.data)
    np.testing.assert_array_equal(np.asarray(after), np.asarray(before))
    assert after.sharding == before.sharding


_DONATE_AFTER_COPY = '''
import jax, numpy as np
from pax_autockpt import compilation_cache
host = np.arange(1 << 20, dtype=np.float32)
state = compilation_cache.owned_by_xla([jax.device_put(host)])
out = jax.jit(lambda x: x * 2 + 1, donate_argnums=0)(state[0])
print(out.unsafe_buffer_pointer() == host.ctypes.data, float(out[3]), float(host[3]))
'''


def test_a_cached_step_that_donates_the_copied_state_leaves_numpys_memory_alone(tmp_path):
  """The same program as tests/test_dependencies.py's, whose cached run writes into NumPy's memory."""
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
             JAX_PLATFORMS='cpu')
  runs = [subprocess.run([sys.executable, '-c', _DONATE_AFTER_COPY], env=env, capture_output=True, text=True,
                         timeout=120) for _ in range(2)]
  assert [r.stdout.strip() for r in runs] == ['False 7.0 3.0'] * 2, [r.stderr[-2000:] for r in runs]
  assert os.listdir(tmp_path)  # the second run's step came from the cache
