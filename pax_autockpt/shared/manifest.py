"""Verified checkpoints: a digest of every array shard, written inside the checkpoint before its commit,
and checked before training resumes from it.

A missing or empty chunk is caught by `integrity`, a truncated one or bad metadata by the restore
itself; a flipped bit, or a chunk rewritten with the right length, is caught by neither and the job
would train on silently wrong weights. The bytes pass through host memory at save time anyway (the
background save's host copy), so each host digests the shards it writes there, off the training thread,
with xxh3-64 (the `xxhash` package, ~10 GB/s), into `autockpt_manifest/host<IDX>.json` in the
checkpoint. At restore every host digests the shards it restored and compares. Arrays are named as
they are on disk (Pax's names for zarr, orbax's for OCDBT), so `pax-autockpt verify` can check a
checkpoint offline. With a local tier each file also names the save (`save`: its id, pax_autockpt.local.lineage):
the checkpoint's own record of which save it is, that a local step's lineage is matched against, since an
event log can lose a commit's event or outlive a checkpoint edited or retrained in place.
"""

import json
import os
from typing import Any, Iterable

from etils import epath
import jax
import numpy as np
import xxhash

from pax_autockpt import layout
from pax_autockpt.shared import failures
from pax_autockpt.shared import internals

FORMAT = 1
HASH = 'xxh3_64'


class ManifestError(ValueError):
  """A manifest that exists but cannot be read: the checkpoint is damaged."""


def digest(data: np.ndarray) -> str:
  """xxh3-64 of an array's bytes in C order."""
  flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
  return xxhash.xxh3_64(flat).hexdigest()


def shard_key(index: tuple[slice, ...], shape: tuple[int, ...]) -> str:
  """'start:stop' per dimension, e.g. '0:64,128:256' ('' for a scalar)."""
  return ','.join(f'{s.start or 0}:{dim if s.stop is None else s.stop}' for s, dim in zip(index, shape))


def shard_index(key: str) -> tuple[slice, ...]:
  if not key:
    return ()
  return tuple(slice(*map(int, part.split(':'))) for part in key.split(','))


def build(host_state: Any, *, use_ocdbt: bool, host: int, save: str | None = None) -> dict[str, Any]:
  """The digests of the shards this host writes (background_save.HostArray leaves with numpy data), and the
  save's id where it has one."""
  arrays: dict[str, dict[str, str]] = {}
  for name, array in internals.array_names(host_state, use_ocdbt=use_ocdbt):
    shards = {shard_key(s.index, array.shape): digest(s.data) for s in array.addressable_shards
              if isinstance(s.data, np.ndarray)}
    if shards:
      arrays[name] = shards
  return {'format': FORMAT, 'hash': HASH, 'host': host, 'hosts': jax.process_count(), 'arrays': arrays,
          **({'save': save} if save else {})}


def save_id(step_path: epath.Path) -> str | None:
  """The save id host 0's manifest file records (None: no manifest, none recorded, or unreadable: the event
  log's then stands). A missing file reads as None without a listing: one request."""
  try:
    found = json.loads(layout.manifest_path(step_path, 0).read_text())
  except (OSError, ValueError):
    return None
  save = found.get('save') if isinstance(found, dict) else None
  return save if isinstance(save, str) else None


def write(step_path: epath.Path, manifest: dict[str, Any]) -> None:
  """One file per host. An object store has no directories to make (a "folder" is a name prefix; making
  one costs ~5 round trips on the save's path)."""
  path = layout.manifest_path(step_path, manifest['host'])
  if not layout.is_object_store(path):
    path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(manifest, sort_keys=True))


def read(step_path: epath.Path) -> dict[str, dict[str, str]] | None:
  """Every host's digests merged (name -> shard key -> digest); None when the checkpoint has no
  manifest (written before this feature, or by stock paxml). Raises ManifestError when one is there but
  damaged, a host's file is missing (that host's shards could not be checked), or it lists no shard at all
  (an emptied folder, `"arrays": {}`): a save lists every array it wrote, so that is a manifest whose content
  was lost, and one that checks nothing must not read as "verified". Absence is decided by listings, which
  raise when the storage fails: on gs:// `is_dir()` answers False for "could not ask"."""
  if 'autockpt_manifest' not in layout.entries(step_path):
    return None
  files = layout.entries(layout.manifest_dir(step_path))
  merged: dict[str, dict[str, str]] = {}
  hosts = set()
  for name in sorted(files):
    try:
      part = json.loads(files[name].read_text())
      if part.get('format') != FORMAT or part.get('hash') != HASH:
        raise ValueError(f'format {part.get("format")!r} / hash {part.get("hash")!r}')
      for array, shards in part['arrays'].items():
        merged.setdefault(array, {}).update({str(k): str(v) for k, v in shards.items()})
      hosts.add(int(part.get('hosts', 0)))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise ManifestError(f'{name} is damaged ({type(e).__name__}: {str(e)[:100]})') from None
  missing = [f'host{h}.json' for h in range(max(hosts, default=0)) if f'host{h}.json' not in files]
  if missing:
    raise ManifestError(f'{", ".join(missing)} is missing (the save had {max(hosts)} hosts)')
  if not any(merged.values()):
    raise ManifestError(f'autockpt_manifest/ lists no array shard ({len(files)} host files): a save lists every '
                        'array it wrote')
  return merged


def open_saved(step_path: epath.Path, name: str, ocdbt: bool) -> Any:
  """One saved array of a checkpoint, as orbax 0.5.9 lays it out (zarr or OCDBT), through tensorstore."""
  from orbax.checkpoint import type_handlers  # pylint: disable=g-import-not-at-top
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  spec = type_handlers.get_tensorstore_spec(os.fspath(step_path / 'state'), name=name, use_ocdbt=ocdbt)
  return ts.open(ts.Spec(spec), open=True, context=type_handlers.get_ts_context(ocdbt)).result()


def uncovered(arrays: Iterable[tuple[str, Any]], expected: dict[str, dict[str, str]]) -> list[tuple[str, str]]:
  """The saved shards that no restored shard coincides with, on any host: the restore's partitioning
  differs from the save's (another number of hosts, another mesh), so no host can digest them from
  memory. Sorted, and the same on every host (it reads only each array's global sharding)."""
  restored = {}
  for name, array in arrays:
    indices = array.sharding.devices_indices_map(array.shape).values()
    restored[name] = {shard_key(index, array.shape) for index in indices}
  return sorted((name, key) for name, shards in expected.items() for key in shards
                if key not in restored.get(name, ()))


def compare_stored(step_path: epath.Path, shards: list[tuple[str, str]], expected: dict[str, dict[str, str]],
                   *, ocdbt: bool) -> list[str]:
  """Reads saved shards back from storage and digests them (what `pax-autockpt verify` does offline);
  mismatches and shards whose bytes do not decode, naming array and shard. A failure that is not damage
  (the storage failing) is raised, for the caller to classify."""
  problems, opened = [], {}
  for name, key in shards:
    try:
      if name not in opened:
        opened[name] = open_saved(step_path, name, ocdbt)
      got = digest(opened[name][shard_index(key)].read().result())
    except Exception as e:  # pylint: disable=broad-except
      if failures.classify(e) is not failures.Kind.DAMAGE:
        raise
      problems.append(f'{name} shard [{key}] cannot be read back ({failures.one_line(e, 150)})')
      continue
    if got != expected[name][key]:
      problems.append(f'{name} shard [{key}] does not match the manifest ({HASH} {got}, expected '
                      f'{expected[name][key]})')
  return problems


def compare(arrays: Iterable[tuple[str, Any]], expected: dict[str, dict[str, str]]) -> tuple[list[str], int]:
  """(mismatches naming array and shard, shards checked) for (name, jax.Array) pairs: every shard
  this host holds whose place the manifest knows. An array the manifest does not list is a problem: a
  save lists every array it wrote, and none of that array's shards could be checked."""
  problems, checked = [], 0
  for name, array in arrays:
    if name not in expected:
      problems.append(f'{name} is not in the manifest (a save lists every array it wrote)')
    want = expected.get(name, {})
    for shard in array.addressable_shards:
      key = shard_key(shard.index, array.shape)
      if key not in want:
        continue
      checked += 1
      got = digest(np.asarray(shard.data))
      if got != want[key]:
        problems.append(f'{name} shard [{key}] does not match the manifest ({HASH} {got}, expected {want[key]})')
  return problems, checked
