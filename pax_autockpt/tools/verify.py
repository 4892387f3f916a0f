"""`pax-autockpt verify JOB_LOG_DIR [--step N]`: checks committed checkpoints against their content
manifests offline (no training, no devices): every array shard the manifest lists is read back with
tensorstore and digested. One line per checkpoint; exit 0 when all are whole, 1 when any is damaged,
2 on bad input. Works on gs:// as on a local disk.
"""

import argparse
import sys
import time

from etils import epath

from pax_autockpt import internals
from pax_autockpt import layout
from pax_autockpt import manifest as manifest_lib


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


def run(job_log_dir: str, step: int | None = None) -> int:
  ckpt_dir = layout.checkpoint_dir(job_log_dir)
  steps = layout.committed_steps(ckpt_dir)
  if step is not None:
    if step not in steps:
      print(f'verify: error: step {step} is not a committed checkpoint in {ckpt_dir} (committed: '
            f'{steps or "none"})', file=sys.stderr)
      return 2
    steps = [step]
  if not steps:
    print(f'verify: error: no committed checkpoint in {ckpt_dir}', file=sys.stderr)
    return 2
  whole = True
  for s in steps:
    line, ok = check(layout.step_dir(ckpt_dir, s))
    print(line, flush=True)
    whole &= ok
  return 0 if whole else 1


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='pax-autockpt verify', description=__doc__)
  parser.add_argument('job_log_dir')
  parser.add_argument('--step', type=int, default=None)
  args = parser.parse_args(argv)
  return run(args.job_log_dir, args.step)


if __name__ == '__main__':
  sys.exit(main())
