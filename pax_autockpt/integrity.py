"""Cheap checks that a committed checkpoint can really be restored.

A zarr array chunk missing from storage is not an error for tensorstore: it reads the fill value
(zeros) and the restore "succeeds" with silently wrong weights. So before a restore, every chunk the
arrays' `.zarray` metadata promises must be present and non-empty. Truncated chunks and damaged
metadata make the restore itself raise, which the checkpointer handles. OCDBT storage (one
key-value database per checkpoint) reads through its manifest: a missing or truncated data file makes
the restore raise, so only an absent manifest or an empty file is flagged here.
"""

import itertools
import json
import math

from etils import epath


def problems(step_path: epath.Path, limit: int = 3) -> list[str]:
  """Up to `limit` reasons why `step_path` cannot be restored as written; empty when it looks whole."""
  state = step_path / 'state'
  if not state.is_dir():
    return [f'{state} is missing']
  found = _ocdbt_problems(state)[:limit]
  for array in sorted(p for p in state.iterdir() if p.is_dir()):
    meta = array / '.zarray'
    if not meta.exists():
      continue  # not a zarr array (e.g. OCDBT storage): left to the restore
    try:
      spec = json.loads(meta.read_text())
      grid = [math.ceil(s / c) for s, c in zip(spec['shape'], spec['chunks'])]
      sep = spec.get('dimension_separator', '.')
    except (ValueError, KeyError, TypeError, ZeroDivisionError) as e:
      found.append(f'{array.name}/.zarray is damaged ({type(e).__name__})')
      continue
    present = {p.name: p for p in array.iterdir()}
    keys = [sep.join(map(str, i)) for i in itertools.product(*map(range, grid))] if grid else ['0']
    for key in keys:
      if key not in present:
        found.append(f'{array.name}/{key} is missing')
      elif present[key].stat().length == 0:
        found.append(f'{array.name}/{key} is empty')
      if len(found) >= limit:
        return found
  return found


def _ocdbt_problems(state: epath.Path) -> list[str]:
  """Whether an OCDBT checkpoint's manifests and data files are there and non-empty."""
  found = []
  for db in [state, *state.glob('ocdbt.process_*')]:
    data = db / 'd'
    if not data.is_dir():
      continue
    manifest = db / 'manifest.ocdbt'
    if not manifest.exists() or manifest.stat().length == 0:
      found.append(f'{db.name}/manifest.ocdbt is missing or empty')
    found += [f'{db.name}/d/{f.name} is empty' for f in data.iterdir() if f.stat().length == 0]
  return found
