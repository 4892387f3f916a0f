"""orbax 0.5.9's own save of a checkpoint's arrays, with nothing of pax-autockpt around it: the floor under
a save's fixed cost (bench scenario `tinyfloor`).

  python -m rigs.bench.orbax_floor STEP_DIR WORKDIR [--saves N]

Reads the array shapes and dtypes of a zarr checkpoint (STEP_DIR/state/<name>/.zarray), makes arrays of
them on this host's device, and saves them N times with orbax's CheckpointManager and AsyncCheckpointer
(PyTreeCheckpointHandler, as paxml builds it; raw chunks, as the on-demand save writes them), each save
waited for until committed, into WORKDIR. Prints one JSON line: the median and every save's milliseconds
after two warm-up saves.
"""

import argparse
import json
import os
import statistics
import sys
import time

import jax.numpy as jnp
import orbax.checkpoint as ocp

from pax_autockpt.shared import internals


def arrays_of(step_dir: str) -> dict[str, jnp.ndarray]:
  state = os.path.join(step_dir, 'state')
  out = {}
  for name in sorted(os.listdir(state)):
    meta = os.path.join(state, name, '.zarray')
    if os.path.exists(meta):
      with open(meta) as f:
        m = json.load(f)
      out[name.replace('.', '_')] = jnp.ones(m['shape'], dtype=jnp.dtype(m['dtype']))
  return out


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m rigs.bench.orbax_floor', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('step_dir')
  parser.add_argument('workdir')
  parser.add_argument('--saves', type=int, default=12)
  args = parser.parse_args(argv)
  tree = arrays_of(args.step_dir)
  manager = ocp.CheckpointManager(
      args.workdir, {'state': ocp.AsyncCheckpointer(ocp.PyTreeCheckpointHandler())},
      options=ocp.CheckpointManagerOptions(create=True))
  took = []
  with internals.uncompressed_chunks():
    for step in range(args.saves + 2):
      start = time.perf_counter()
      manager.save(step, {'state': tree})
      manager.wait_until_finished()
      took.append((time.perf_counter() - start) * 1e3)
  print(json.dumps({'arrays': len(tree), 'bytes': sum(x.nbytes for x in tree.values()),
                    'median_ms': statistics.median(took[2:]), 'ms': took[2:]}))
  return 0


if __name__ == '__main__':
  sys.exit(main())
