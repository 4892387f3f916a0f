"""JAX's persistent compilation cache on CPU, made safe for a restored train state.

With jax 0.4.26 on CPU, orbax's restore leaves each array in NumPy's memory (`jax.device_put` keeps it,
no copy), and Pax's train step donates its state. A freshly compiled step copies such a buffer before
writing its output there; the same step loaded from the persistent compilation cache
(`JAX_COMPILATION_CACHE_DIR`, `--jax_compilation_cache_dir`) writes into NumPy's memory in place, which
NumPy later frees under JAX: restored runs aborted at their first step ('corrupted double-linked
list'). tests/test_dependencies.py shows the jax behaviour. With the cache set, the restored state is
copied once into buffers XLA allocates itself; without it, or on accelerators (whose restore copies to
device memory), nothing is copied, so a large CPU state is never held twice for nothing.
"""

from typing import Any

from absl import logging
import jax
from jax import numpy as jnp


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
