"""`pax-autockpt verify JOB_LOG_DIR [--step N]`: checks committed checkpoints against their content
manifests offline (no training, no devices): every array shard the manifest lists is read back with
tensorstore and digested. One line per checkpoint; exit 0 when all are whole, 1 when any is damaged,
2 on bad input. Works on gs:// as on a local disk.

`pax-autockpt verify JOB_LOG_DIR --against OTHER [--step N]` compares two checkpoints instead: step N
(default: the newest committed) of this job with the same step of the job OTHER (or with OTHER, a step
directory). Every saved array is read back from both, shard by shard, and compared byte for byte, and so
is the training input's saved position: exit 0 when all are identical, 1 naming the first difference.
That is how a resumed run is checked against an uninterrupted one (docs/troubleshooting.md, "Exact resume").
"""

import argparse
import base64
import json
import sys
import time

from etils import epath
import numpy as np

from pax_autockpt import layout
from pax_autockpt.shared import internals
from pax_autockpt.shared import manifest as manifest_lib


def is_ocdbt(step_path: epath.Path) -> bool:
  return internals.is_ocdbt_checkpoint(step_path)


def open_array(step_path: epath.Path, name: str, ocdbt: bool):
  return manifest_lib.open_saved(step_path, name, ocdbt)


def check(step_path: epath.Path) -> tuple[str, bool]:
  """(one line, whole?) for one checkpoint."""
  step = layout.step_of(step_path.name)
  start = time.time()
  try:
    expected = manifest_lib.read(step_path)
  except manifest_lib.ManifestError as e:
    return f'step {step}: DAMAGED: manifest {e}', False
  if expected is None:
    return f'step {step}: no content manifest (saved before checksums, or by stock paxml): not verified', True
  ocdbt = is_ocdbt(step_path)
  shards = 0
  for name, digests in sorted(expected.items()):
    try:
      array = open_array(step_path, name, ocdbt)
    except Exception as e:  # pylint: disable=broad-except
      return f'step {step}: DAMAGED: {name} cannot be opened ({type(e).__name__}: {str(e)[:150]})', False
    for key, want in sorted(digests.items()):
      try:
        got = manifest_lib.digest(array[manifest_lib.shard_index(key)].read().result())
      except Exception as e:  # pylint: disable=broad-except
        return f'step {step}: DAMAGED: {name} shard [{key}] cannot be read ({type(e).__name__})', False
      if got != want:
        return (f'step {step}: DAMAGED: {name} shard [{key}] does not match the manifest '
                f'({manifest_lib.HASH} {got}, expected {want})'), False
      shards += 1
  return f'step {step}: ok ({len(expected)} arrays, {shards} shards, {time.time() - start:.2f} s)', True


def saved_arrays(step_path: epath.Path) -> dict[str, list[str]]:
  """Array name -> shard keys: the manifest's shards, else each array whole (names from orbax's
  `state/_sharding`, whose keys are the base64 of the names, zarr and OCDBT alike)."""
  expected = manifest_lib.read(step_path)
  if expected is not None:
    return {name: sorted(shards) for name, shards in expected.items()}
  sharding = json.loads((step_path / 'state' / '_sharding').read_text())
  return {base64.b64decode(key).decode(): [None] for key in sharding}


def _region(array, key: str | None) -> np.ndarray:
  return (array if key is None else array[manifest_lib.shard_index(key)]).read().result()


def _inputs(step_path: epath.Path) -> dict[str, bytes]:
  """Pax's per-process input states (`process_<i>-of-<N>`; on gs:// the folder also holds orbax's
  `commit_success.txt`, which holds the time of the commit)."""
  folder = step_path / 'train_input'
  return {p.name: p.read_bytes() for p in folder.iterdir() if p.name.startswith('process_')} \
      if folder.is_dir() else {}


def compare_checkpoints(path: epath.Path, other: epath.Path) -> tuple[str, bool]:
  """(one line, identical?): every saved array shard and the input's saved state, byte for byte."""
  start, step = time.time(), layout.step_of(path.name)
  mine, theirs = saved_arrays(path), saved_arrays(other)
  if mine.keys() != theirs.keys():
    name = sorted(mine.keys() ^ theirs.keys())[0]
    return f'step {step}: DIFFERENT: {name} is only in {path if name in mine else other}', False
  shards, ocdbt = 0, (is_ocdbt(path), is_ocdbt(other))
  for name in sorted(mine):
    a, b = open_array(path, name, ocdbt[0]), open_array(other, name, ocdbt[1])
    for key in mine[name]:
      x, y = _region(a, key), _region(b, key)
      if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
        where = 'whole' if key is None else f'shard [{key}]'
        return f'step {step}: DIFFERENT: {name} {where} differs from {other}', False
      shards += 1
  inputs, their_inputs = _inputs(path), _inputs(other)
  if inputs != their_inputs:
    name = sorted(n for n in inputs.keys() | their_inputs.keys() if inputs.get(n) != their_inputs.get(n))[0]
    return f'step {step}: DIFFERENT: train_input/{name} (the input position) differs from {other}', False
  return (f'step {step}: identical to {other} ({len(mine)} arrays, {shards} shards, {len(inputs)} input '
          f'states, {time.time() - start:.2f} s)'), True


def _steps(job_log_dir: str, step: int | None) -> list[int] | None:
  """`[step]`, or every committed step when None; None (the error said) when there is nothing to check."""
  ckpt_dir = layout.checkpoint_dir(job_log_dir)
  if not epath.Path(job_log_dir).exists():
    print(f'verify: error: {job_log_dir} does not exist', file=sys.stderr)
    return None
  steps = layout.committed_steps(ckpt_dir)
  if step is not None and step not in steps:
    print(f'verify: error: step {step} is not a committed checkpoint in {ckpt_dir} (committed: '
          f'{steps or "none"})', file=sys.stderr)
    return None
  if not steps:
    print(f'verify: error: no committed checkpoint in {ckpt_dir}', file=sys.stderr)
    return None
  return steps if step is None else [step]


def run_against(job_log_dir: str, other: str, step: int | None = None) -> int:
  """Compares step `step` (default: the newest committed) with OTHER's same step, or OTHER itself."""
  steps = _steps(job_log_dir, step)
  if steps is None:
    return 2
  step, ckpt_dir = steps[-1], layout.checkpoint_dir(job_log_dir)
  target = epath.Path(other)
  if layout.step_of(target.name) is None:
    target = layout.step_dir(layout.checkpoint_dir(other), step)
  if not layout.is_committed(target):
    print(f'verify: error: --against {other}: no committed checkpoint of step {step} there ({target})',
          file=sys.stderr)
    return 2
  line, same = compare_checkpoints(layout.step_dir(ckpt_dir, step), target)
  print(line, flush=True)
  return 0 if same else 1


def run(job_log_dir: str, step: int | None = None, against: str | None = None) -> int:
  """Every committed checkpoint (or `step`) against its manifest; with `against`, see run_against."""
  if against is not None:
    return run_against(job_log_dir, against, step)
  steps = _steps(job_log_dir, step)
  if steps is None:
    return 2
  ckpt_dir, whole = layout.checkpoint_dir(job_log_dir), True
  for s in steps:
    line, ok = check(layout.step_dir(ckpt_dir, s))
    print(line, flush=True)
    whole &= ok
  return 0 if whole else 1


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='pax-autockpt verify', description=__doc__)
  parser.add_argument('job_log_dir')
  parser.add_argument('--step', type=int, default=None)
  parser.add_argument('--against', default=None)
  args = parser.parse_args(argv)
  return run(args.job_log_dir, args.step, args.against)


if __name__ == '__main__':
  sys.exit(main())
