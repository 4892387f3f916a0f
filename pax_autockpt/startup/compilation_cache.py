"""JAX's persistent compilation cache: on by default where the job lives, and safe on CPU for a restored state.

With jax 0.4.26 on CPU, orbax's restore leaves each array in NumPy's memory (`jax.device_put` keeps it,
no copy), and Pax's train step donates its state. A freshly compiled step copies such a buffer before
writing its output there; the same step loaded from the persistent compilation cache
(`JAX_COMPILATION_CACHE_DIR`, `--jax_compilation_cache_dir`) writes into NumPy's memory in place, which
NumPy later frees under JAX: restored runs aborted at their first step ('corrupted double-linked
list'). tests/test_dependencies.py shows the jax behaviour. With the cache set, the restored state is
copied once into buffers XLA allocates itself; without it, or on accelerators (whose restore copies to
device memory), nothing is copied, so a large CPU state is never held twice for nothing.

The cache is on by default (`use`, before the first compile): every restart of a job otherwise compiles its
train step again (6.3 s for the tiny CPU model; minutes for a large model on TPU).
"""

import contextlib
import os
import tempfile
import time
from typing import Any

from absl import flags
from absl import logging
import jax
from jax import numpy as jnp

from pax_autockpt import layout

AUTO, OFF = 'auto', 'off'
THRESHOLD = 'jax_persistent_cache_min_compile_time_secs'  # JAX's: programs compiled faster are never written
MOST_BYTES = 2 << 30  # the default directory's bound: past it, the least recently used entries go...
DOWN_TO = 0.5  # ...down to this fraction of it, so that pruning is rare


def enabled_on_cpu() -> bool:
  """The persistent compilation cache is set and the train state lives on CPU."""
  return bool(_cache_dir()) and jax.default_backend() == 'cpu'


def _cache_dir() -> str | None:
  return jax.config.jax_compilation_cache_dir  # --jax_compilation_cache_dir or JAX_COMPILATION_CACHE_DIR


def owned_by_xla(train_state: Any) -> Any:
  """`train_state` with every CPU jax.Array copied into memory XLA allocated (same values and
  shardings), where the cache is on; unchanged otherwise. One jitted copy without donation: every
  host runs it on the same tree, like the restore before it."""
  if not enabled_on_cpu():
    return train_state
  leaves, treedef = jax.tree_util.tree_flatten(train_state)
  where = [i for i, x in enumerate(leaves) if isinstance(x, jax.Array)]  # all on CPU, the backend
  if not where:
    return train_state
  arrays = [leaves[i] for i in where]
  copies = jax.jit(lambda xs: [jnp.copy(x) for x in xs], out_shardings=[x.sharding for x in arrays])(arrays)
  for i, copy in zip(where, copies):
    leaves[i] = copy
  logging.info('[autockpt] JAX compilation cache on CPU: the restored state (%d arrays) copied into memory '
               'XLA owns, which cached train steps may donate.', len(where))
  return jax.tree_util.tree_unflatten(treedef, leaves)


def use(setting: str, job_log_dir: str, prune: bool = True) -> str | None:
  """Sets `jax_compilation_cache_dir` per --autockpt_compilation_cache (`setting`), before the first compile
  (JAX reads it once, at its first compile): the directory in use, or None where JAX's own setting (or
  none) applies. A directory that cannot be written costs one warning line and a fresh compile, never the
  run (JAX's own failure would warn at every start, in two lines). `prune`: the host that bounds the default
  directory (JAX writes entries from process 0 only). Its caller starts counting compiles and cache loads first
  (pax_autockpt.exit.compile_on_exit.watch: the `first_step` event's)."""
  path, ours = directory(setting, job_log_dir)
  if path is None:
    return None
  problem = unwritable(path)
  if problem:
    logging.warning('[autockpt] no compilation cache: %s; every start compiles afresh '
                    '(--autockpt_compilation_cache=off: none, and no warning).', problem)
    return None
  if ours and prune and '://' not in path:  # a bucket: its lifecycle rules bound it, listing costs
    prune_least_recently_used(path)
  jax.config.update('jax_compilation_cache_dir', path)
  keep_every_compile()
  logging.info('[autockpt] JAX compilation cache: %s', path)
  return path


def keep_every_compile() -> None:
  """JAX writes only programs that took its threshold (1 s) to compile; the eval step on the train input (0.4-0.7 s
  for the tiny model here) and the RNG's small programs then compile again at every restart. In a cache of ours
  every program is kept (threshold 0; the LRU bound keeps the directory small), unless the user set the threshold
  (JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS or --jax_persistent_cache_min_compile_time_secs)."""
  given = THRESHOLD in flags.FLAGS and flags.FLAGS[THRESHOLD].present
  if THRESHOLD.upper() not in os.environ and not given:
    jax.config.update(THRESHOLD, 0.0)


def directory(setting: str, job_log_dir: str) -> tuple[str | None, bool]:
  """The cache directory `setting` names, and whether it is ours to prune (the default one only, never a
  user's); None: leave JAX's own setting, which 'auto' respects and 'off' does not add to."""
  if setting == OFF or (setting == AUTO and users_own()):
    return None, False
  if setting == AUTO:
    return os.fspath(layout.compilation_cache_dir(job_log_dir)), True
  return setting, False


def users_own() -> bool:
  """The user named JAX's cache: JAX_COMPILATION_CACHE_DIR, --jax_compilation_cache_dir, or jax.config."""
  flag = 'jax_compilation_cache_dir'
  given = flag in flags.FLAGS and flags.FLAGS[flag].present
  return 'JAX_COMPILATION_CACHE_DIR' in os.environ or given or bool(_cache_dir())


def unwritable(path: str) -> str | None:
  """Why a local `path` cannot hold the cache (made and a file written, as JAX will), or None. A gs:// URL
  is not probed (requests cost); JAX warns and compiles afresh where it fails."""
  if '://' in path:
    return None
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix='_probe_'):
      pass
  except OSError as e:
    return f'{path} cannot be written ({type(e).__name__}: {e.strerror or e})'
  return None


ABANDONED_WRITE_SECS = 3600.0  # JAX's `_temp_<key>` files older than this belong to a write that was killed


def _without_abandoned_writes(entries: list[tuple[float, int, str]]) -> list[tuple[float, int, str]]:
  """Removes JAX's temporary files of writes a kill cut short (JAX writes `_temp_<key>` and renames it): nothing
  ever reads or renames them, and under the size bound no LRU pass would remove them, on a disk that may be nearly
  full. A write in progress (younger than ABANDONED_WRITE_SECS) is left alone. The entries left."""
  kept, now = [], time.time()
  for used, size, path in entries:
    if os.path.basename(path).startswith('_temp_') and now - used > ABANDONED_WRITE_SECS:
      with contextlib.suppress(OSError):
        os.remove(path)
        continue
    kept.append((used, size, path))
  return kept


def prune_least_recently_used(folder: str, most_bytes: int = MOST_BYTES, down_to: float = DOWN_TO) -> int:
  """Where `folder`'s entries total more than `most_bytes`, removes the least recently used (by access time
  where the file system keeps it, else modification time) until `down_to` of it is left: the default
  directory otherwise grows by every program and jax version a job ever ran. The bytes removed."""
  entries = []
  with contextlib.suppress(OSError), os.scandir(folder) as found:
    for entry in found:
      with contextlib.suppress(OSError):
        stat = entry.stat(follow_symlinks=False)
        if entry.is_file(follow_symlinks=False):
          entries.append((max(stat.st_atime, stat.st_mtime), stat.st_size, entry.path))
  entries = _without_abandoned_writes(entries)
  left = sum(size for _, size, _ in entries)
  if left <= most_bytes:
    return 0
  removed = 0
  for _, size, path in sorted(entries):
    if left - removed <= most_bytes * down_to:
      break
    with contextlib.suppress(OSError):  # another host's pruning, or JAX's reader, got there first
      os.remove(path)
      removed += size
  logging.info('[autockpt] compilation cache %s: %d MB of least recently used entries removed (bound: %d MB).',
               folder, removed >> 20, most_bytes >> 20)
  return removed
