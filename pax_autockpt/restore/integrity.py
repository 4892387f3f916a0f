"""Cheap checks that a committed checkpoint can really be restored.

A zarr array chunk missing from storage is not an error for tensorstore: it reads the fill value
(zeros) and the restore "succeeds" with silently wrong weights. So before a restore, every chunk the
arrays' `.zarray` metadata promises must be present and non-empty, and an uncompressed chunk (the raw
on-demand saves) exactly its chunk's size: a cut-short raw chunk only makes tensorstore report a failed
read, which says nothing of why. Truncated compressed chunks and damaged metadata make the restore itself
raise, which the checkpointer handles. OCDBT storage (one
key-value database per checkpoint) reads through its manifest: a missing or truncated data file makes
the restore raise, so only an absent manifest or an empty file is flagged here. The small JSON files
orbax and Pax read first (`state/_sharding`, `state/_METADATA`, `metadata/metadata`) must parse: a
committed one that is empty or cut short is named here, with its size, instead of surfacing as a bare
`JSONDecodeError` from inside the restore.
"""

from concurrent import futures
import itertools
import json
import math

from etils import epath
import numpy as np

from pax_autockpt import layout

_READERS = 16  # storage requests in flight at once while checking a checkpoint's arrays


def problems(step_path: epath.Path, limit: int = 3) -> list[str]:
  """Up to `limit` reasons why `step_path` cannot be restored as written; empty when it looks whole.

  Only positive evidence counts: a name is missing when a listing that succeeded lacks it. On gs://,
  `is_dir()` and `exists()` answer False when the storage refuses or fails the request, so they never
  decide here; a listing or a read that fails raises, for the caller to classify (pax_autockpt.shared.failures).
  """
  state = step_path / 'state'
  if 'state' not in layout.entries(step_path):
    return [f'{state} is missing']
  entries = layout.entries(state)
  found = (_json_problems(state, entries, ('_sharding', '_METADATA')) +
           _json_problems(step_path / 'metadata', layout.entries(step_path / 'metadata'), ('metadata',)) +
           _ocdbt_problems(state, entries))[:limit]
  if len(found) >= limit:
    return found  # no need to read every array as well
  arrays = [state / name for name in sorted(entries)
            if not name.startswith(('.', '_', 'ocdbt.process_')) and name not in ('d', 'manifest.ocdbt')]
  # One storage round trip after another is ~5 per array: 54 arrays took 4.4 s on the local GCS, and a
  # real model has hundreds. The reads are independent, so they overlap (each thread waits on storage).
  with futures.ThreadPoolExecutor(min(_READERS, max(1, len(arrays))), thread_name_prefix='autockpt-check') as pool:
    for array_found in pool.map(lambda array: _zarr_problems(array, limit), arrays):
      found += array_found
      if len(found) >= limit:
        pool.shutdown(cancel_futures=True)
        break
  return found[:limit]


def _json_problems(folder: epath.Path, entries: dict[str, epath.Path], names: tuple[str, ...]) -> list[str]:
  """Those of `names` that the listing holds and that do not parse as JSON."""
  found = []
  for name in names:
    if name in entries:
      text = entries[name].read_bytes()
      try:
        json.loads(text)
      except ValueError as e:
        found.append(f'{folder.name}/{name} is not JSON ({type(e).__name__}: {str(e)[:60]}, {len(text)} bytes)')
  return found


def _zarr_problems(array: epath.Path, limit: int) -> list[str]:
  """Every chunk the array's `.zarray` promises, present and non-empty ([] where there is no `.zarray`:
  not a zarr array, e.g. orbax's own files, left to the restore)."""
  meta = array / '.zarray'
  if not meta.exists():
    return []
  try:
    spec = json.loads(meta.read_text())
    grid = [math.ceil(s / c) for s, c in zip(spec['shape'], spec['chunks'])]
    sep = spec.get('dimension_separator', '.')
    raw = _raw_chunk_bytes(spec)
  except (ValueError, KeyError, TypeError, ZeroDivisionError) as e:
    return [f'{array.name}/.zarray is damaged ({type(e).__name__})']
  present, found = layout.entries(array), []
  keys = [sep.join(map(str, i)) for i in itertools.product(*map(range, grid))] if grid else ['0']
  for key in keys:
    length = present[key].stat().length if key in present else None
    if length is None:
      found.append(f'{array.name}/{key} is missing')
    elif length == 0:
      found.append(f'{array.name}/{key} is empty')
    elif raw is not None and length != raw:
      found.append(f'{array.name}/{key} is {length} bytes, an uncompressed chunk of it {raw} (cut short)')
    if len(found) >= limit:
      break
  return found


def _raw_chunk_bytes(spec: dict) -> int | None:
  """The size every chunk of an uncompressed, unfiltered zarr v2 array has (edge chunks are stored whole),
  or None (compressed: no fixed size; a dtype this cannot size)."""
  if spec.get('compressor', 'unknown') is not None or spec.get('filters') or 'dtype' not in spec:
    return None
  try:
    itemsize = np.dtype(spec['dtype']).itemsize
  except TypeError:
    itemsize = {'bfloat16': 2}.get(spec['dtype'])
  return None if itemsize is None else math.prod(spec['chunks']) * itemsize


def _ocdbt_problems(state: epath.Path, entries: dict[str, epath.Path]) -> list[str]:
  """Whether an OCDBT checkpoint's manifests and data files are there and non-empty."""
  found = []
  databases = [(state, entries)]
  databases += [(p, layout.entries(p)) for n, p in sorted(entries.items()) if n.startswith('ocdbt.process_')]
  for db, names in databases:
    if 'd' not in names:
      continue
    manifest = names.get('manifest.ocdbt')
    if manifest is None or manifest.stat().length == 0:
      found.append(f'{db.name}/manifest.ocdbt is missing or empty')
    found += [f'{db.name}/d/{f.name} is empty' for f in names['d'].iterdir() if f.stat().length == 0]
  return found
