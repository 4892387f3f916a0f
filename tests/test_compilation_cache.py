"""The restored state's copy out of NumPy's memory where JAX's persistent compilation cache is on (CPU)."""

import os
import subprocess
import sys
import time

from absl import flags
import jax
import numpy as np
import pytest

from pax_autockpt import settings as settings_lib
from pax_autockpt.experiment import AutockptMixin
from pax_autockpt.startup import compilation_cache


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
from pax_autockpt.startup import compilation_cache
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


# --- on by default under the job directory (compilation_cache.use) ----------------------------------------


@pytest.fixture
def jax_flags(monkeypatch):
  """No cache of the user's (no env, flag or jax.config), and --jax_compilation_cache_dir as main defines it."""
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR', raising=False)
  monkeypatch.setattr(compilation_cache, '_cache_dir', lambda: None)
  fv = flags.FlagValues()
  flags.DEFINE_string('jax_compilation_cache_dir', None, 'JAX', flag_values=fv)
  fv(['prog'])
  monkeypatch.setattr(flags, 'FLAGS', fv)
  return fv


def test_auto_is_under_the_job_directory_and_ours_unless_the_user_named_jaxs_own(jax_flags, monkeypatch):
  job = '/jobs/one'
  assert compilation_cache.directory('auto', job) == ('/jobs/one/autockpt/compilation_cache', True)
  assert compilation_cache.directory('off', job) == (None, False)
  assert compilation_cache.directory('/fast/cache', job) == ('/fast/cache', False)  # a user's: never pruned
  assert compilation_cache.directory('gs://b/cache', job) == ('gs://b/cache', False)
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', '/theirs')
  assert compilation_cache.directory('auto', job) == (None, False)  # JAX's own setting applies
  assert compilation_cache.directory('/fast/cache', job) == ('/fast/cache', False)  # ours, named, wins
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR')
  jax_flags(['prog', '--jax_compilation_cache_dir=/theirs'])
  assert compilation_cache.directory('auto', job) == (None, False)


def test_the_setting_is_one_flag_and_attribute_with_a_one_line_error():
  class Exp(AutockptMixin):
    AUTOCKPT_COMPILATION_CACHE = 'off'
  assert settings_lib.resolve(Exp()).compilation_cache == 'off'
  assert settings_lib.Settings().compilation_cache == 'auto'
  with pytest.raises(settings_lib.ConfigError, match=r"^Bad.AUTOCKPT_COMPILATION_CACHE='' is invalid: use 'auto'"):
    settings_lib.resolve(type('Bad', (AutockptMixin,), {'AUTOCKPT_COMPILATION_CACHE': ''})())


def test_use_sets_jax_before_its_first_compile(jax_flags, monkeypatch, tmp_path):
  updates = []
  monkeypatch.setattr(compilation_cache.jax.config, 'update', lambda *a: updates.append(a))
  monkeypatch.delenv('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', raising=False)
  path = compilation_cache.use('auto', str(tmp_path))
  assert path == str(tmp_path / 'autockpt' / 'compilation_cache') and os.path.isdir(path)
  assert updates[0] == ('jax_compilation_cache_dir', path) and not os.listdir(path)  # the probe left nothing
  assert compilation_cache.use('off', str(tmp_path)) is None and len(updates) == 2


def test_a_cache_of_ours_keeps_every_compile_unless_the_user_set_jaxs_threshold(jax_flags, monkeypatch, tmp_path):
  """JAX's 1 s threshold left the tiny model's eval step on the train input (0.4-0.7 s) to every restart."""
  updates = []
  monkeypatch.setattr(compilation_cache.jax.config, 'update', lambda *a: updates.append(a))
  monkeypatch.delenv('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', raising=False)
  compilation_cache.use('auto', str(tmp_path))
  assert updates[1:] == [(compilation_cache.THRESHOLD, 0.0)]
  monkeypatch.setenv('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '2')
  compilation_cache.use(str(tmp_path / 'named'), str(tmp_path))
  assert [u for u in updates if u[0] == compilation_cache.THRESHOLD] == [(compilation_cache.THRESHOLD, 0.0)]


def test_a_cache_that_cannot_be_written_costs_one_warning_and_no_cache(jax_flags, monkeypatch, tmp_path, caplog):
  """A path under a regular file: mkdir fails even for root (tests run as root, so chmod would not do)."""
  (tmp_path / 'file').write_text('')
  updates = []
  monkeypatch.setattr(compilation_cache.jax.config, 'update', lambda *a: updates.append(a))
  assert compilation_cache.use(str(tmp_path / 'file' / 'cache'), str(tmp_path)) is None
  warnings = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  assert len(warnings) == 1 and 'file/cache cannot be written (NotADirectoryError' in warnings[0], warnings
  assert '\n' not in warnings[0] and not updates
  assert compilation_cache.unwritable('gs://bucket/cache') is None  # not probed: requests cost


def _entry(folder, name, size, used):
  path = folder / name
  path.write_bytes(b'x' * size)
  os.utime(path, (used, used))


def test_pruning_removes_the_least_recently_used_down_to_a_fraction_of_the_bound(tmp_path):
  for i, name in enumerate(['old', 'older', 'oldest']):
    _entry(tmp_path, name, 400, 1_000_000 - i * 1000)
  assert compilation_cache.prune_least_recently_used(str(tmp_path), most_bytes=1200) == 0  # within the bound
  assert compilation_cache.prune_least_recently_used(str(tmp_path), most_bytes=1000, down_to=0.5) == 800
  assert os.listdir(tmp_path) == ['old']
  assert compilation_cache.prune_least_recently_used(str(tmp_path / 'absent')) == 0


def test_a_killed_write_s_temporary_file_is_removed_under_the_bound_and_a_live_one_kept(tmp_path):
  """JAX writes `_temp_<key>` and renames it: a SIGKILL mid-write leaves it, never read again. Seen failing before
  the abandoned-write pass: under the bound nothing was removed, however old."""
  now = time.time()
  _entry(tmp_path, '_temp_killed', 400, now - 2 * compilation_cache.ABANDONED_WRITE_SECS)
  _entry(tmp_path, '_temp_writing', 400, now - 5)
  _entry(tmp_path, 'jit_train_step-abc', 400, now - 3 * compilation_cache.ABANDONED_WRITE_SECS)
  compilation_cache.prune_least_recently_used(str(tmp_path), most_bytes=10_000)
  assert sorted(os.listdir(tmp_path)) == ['_temp_writing', 'jit_train_step-abc']
