"""What the Makefile installs over paxml's own pins, kept in step with what the code expects."""

import importlib.metadata
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*path: str) -> str:
  with open(os.path.join(ROOT, *path)) as f:
    return f.read()


def test_the_tensorstore_fix_is_pinned_once_and_installed():
  makefile = re.search(r'^TENSORSTORE := (\S+)$', _read('Makefile'), re.M).group(1)
  expected = re.search(r"^TENSORSTORE_FIXED = '([^']+)'", _read('pax_autockpt', 'main.py'), re.M).group(1)
  assert makefile == expected
  # The training processes of this suite run on it (a venv that `make` did not build may not).
  assert importlib.metadata.version('tensorstore') == expected


_DONATE = '''
import jax, numpy as np
host = np.arange(1 << 20, dtype=np.float32)
on_cpu = jax.device_put(host)  # NumPy's memory, as orbax's restore leaves it
out = jax.jit(lambda x: x * 2 + 1, donate_argnums=0)(on_cpu)
print(out.unsafe_buffer_pointer() == host.ctypes.data)
'''


def test_jax_0_4_26_cached_executables_write_donated_numpy_memory_in_place(tmp_path):
  """Why pax_autockpt.startup.compilation_cache copies a restored state on CPU: compiled, the donated NumPy
  buffer is copied first; loaded from the cache, the output lands in NumPy's memory (which NumPy frees
  while JAX still uses it). When this fails, jax no longer does it and the copy can go."""
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
             JAX_PLATFORMS='cpu')
  runs = [subprocess.run([sys.executable, '-c', _DONATE], env=env, capture_output=True, text=True, timeout=120)
          for _ in range(2)]
  assert [r.stdout.strip() for r in runs] == ['False', 'True'], [r.stderr[-2000:] for r in runs]


def test_other_paxml_or_orbax_versions_are_named_in_one_line(monkeypatch):
  from pax_autockpt.shared import internals  # pylint: disable=g-import-not-at-top
  assert internals.version_warning() is None  # what make venv installs
  monkeypatch.setitem(internals.WRITTEN_FOR, 'orbax-checkpoint', '0.5.8')
  warning = internals.version_warning()
  assert warning.startswith('pax_autockpt patches private parts of orbax-checkpoint 0.5.9 (written for 0.5.8)')
  assert '\n' not in warning
