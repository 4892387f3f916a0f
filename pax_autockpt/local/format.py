"""The local tier's on-disk form: one host's shards of one step, on that host's own disk.

A job-directory save goes through orbax and tensorstore (per-array metadata, chunking, compression, a round trip
per object); the local tier needs none of that: the reader is the same host (or a peer holding the same
shards, after a replaced VM) on the same topology. So a local step is this host's shards written raw,
back to back, into one file (`shards.bin`), with an index (`index.json`): each array's shape and dtype,
each shard's place in the file and its xxh3-64, and every host's input position at that step. Written
under a temporary name and renamed: the final name is the commit (layout).

The `fingerprint` names which shards a host holds (every array's shard indexes on its devices): a host
can restore a peer's copy only where the fingerprints are equal — another data-parallel replica.
"""

import base64
import dataclasses
import json
import os
from typing import Any, Callable, Collection

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import xxhash

from pax_autockpt import layout
from pax_autockpt.hosts import agreement
from pax_autockpt.local import lineage as lineage_lib
from pax_autockpt.shared import input_position
from pax_autockpt.shared import manifest as manifest_lib

FORMAT = 2  # 2: the index has a digest and a lineage
READ_CHUNK_BYTES = 64 << 20  # a local step is read in chunks this size, each a sign of progress


class LocalDamage(ValueError):
  """A local step whose index or shards do not read back as written."""


@dataclasses.dataclass
class Snapshot:
  """One host's shards of a step in host memory (name -> shape, dtype, shard key -> bytes), and its
  input position (None: no input state, or one without get_state())."""

  arrays: dict[str, tuple[tuple[int, ...], str, dict[str, np.ndarray]]]
  input_state: bytes | None

  @property
  def nbytes(self) -> int:
    return sum(d.nbytes for _, _, shards in self.arrays.values() for d in shards.values())


def _names(tree: Any) -> list[tuple[str, Any]]:
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [(jax.tree_util.keystr(path), leaf) for path, leaf in leaves]


def capture(train_state: Any, pipeline: Any = None) -> Snapshot:
  """On the training thread: a copy of every shard this host holds (each index once, replicas on
  several local devices included once), and the input's position at this step."""
  arrays = {}
  for name, x in _names(train_state):
    if not isinstance(x, jax.Array):
      continue
    shards = {}
    for s in x.addressable_shards:
      key = manifest_lib.shard_key(s.index, x.shape)
      if key not in shards:
        shards[key] = np.array(s.data, copy=True)  # the next step donates the device buffer
    arrays[name] = (tuple(x.shape), str(x.dtype), shards)
  state = None
  if pipeline is not None:
    taken = input_position.input_snapshot(pipeline)
    state = taken.state if isinstance(taken, input_position.InputSnapshot) else None
  return Snapshot(arrays, state)


def fingerprint(arrays: dict[str, tuple[tuple[int, ...], str, list[str]]]) -> str:
  """Which shards a host holds: name -> (shape, dtype, shard keys), hashed."""
  canonical = json.dumps({n: [list(shape), dtype, sorted(keys)] for n, (shape, dtype, keys) in arrays.items()},
                         sort_keys=True)
  return xxhash.xxh3_64(canonical.encode()).hexdigest()


def fingerprint_of(snapshot: Snapshot) -> str:
  return fingerprint({n: (shape, dtype, list(shards)) for n, (shape, dtype, shards) in snapshot.arrays.items()})


def fingerprint_for(shapes: Any, mesh: Any, specs: Any) -> str:
  """The fingerprint this host's part of a state would have on this mesh (before any array exists)."""
  arrays = {}
  spec_of = dict(_names(jax.tree_util.tree_map(lambda _, s: s, shapes, specs)))
  for name, leaf in _names(shapes):
    sharding = jax.sharding.NamedSharding(mesh, spec_of[name])
    indices = sharding.addressable_devices_indices_map(leaf.shape).values()
    keys = {manifest_lib.shard_key(i, leaf.shape) for i in indices}
    arrays[name] = (tuple(leaf.shape), str(jnp.dtype(leaf.dtype)), list(keys))
  return fingerprint(arrays)


def write_part(folder: epath.PathLike, step: int, snapshot: Snapshot) -> tuple[epath.Path, dict[str, Any]]:
  """This host's shards into the step's temporary directory, synced; returns it and the index's arrays."""
  partial = layout.local_partial_dir(folder, step)
  if partial.exists():
    partial.rmtree()
  partial.mkdir(parents=True)
  arrays = {}
  with open(partial / layout.LOCAL_SHARDS, 'wb') as f:
    for name, (shape, dtype, shards) in snapshot.arrays.items():
      entries = {}
      for key, data in shards.items():
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        entries[key] = [f.tell(), raw.nbytes, xxhash.xxh3_64(raw).hexdigest()]
        f.write(raw.data)
      arrays[name] = {'shape': list(shape), 'dtype': dtype, 'shards': entries}
    f.flush()
    os.fsync(f.fileno())
  return partial, arrays


def commit(partial: epath.Path, index: dict[str, Any]) -> epath.Path:
  """The index with its digest, then the rename that commits the step; both synced."""
  body = {k: v for k, v in index.items() if k != 'digest'}
  _write_synced(partial / layout.LOCAL_INDEX, json.dumps({**body, 'digest': _digest(body)}).encode())
  final = layout.local_step_dir(partial.parent, index['step'])
  replaced = layout.local_partial_dir(partial.parent, index['step'], replaced=True)  # the next commit removes it
  if final.exists():  # the same step again (a peer's copy for a damaged one, a step trained again): the new wins
    final.rename(replaced)
  partial.rename(final)
  _sync_dir(final.parent)
  if replaced.exists():
    replaced.rmtree()
  return final


def prune(folder: epath.PathLike, keep: Collection[int], partials_from: int | None = None,
          spare: Callable[[epath.Path], bool] | None = None) -> None:
  """Every step entry of `folder` but the `keep` steps goes: other committed steps, `.partial`s a kill left,
  anything else named as a step. One rule for a host's own steps (pax_autockpt.local.saving) and the buddy copy
  it keeps (pax_autockpt.local.buddy), so the two cannot drift. `partials_from`: the `.partial`s of that step
  and newer stay (a buddy copy in flight, which the next fetch resumes). `spare(entry)`: True for an entry that
  is not this job's to delete (another job's committed step, `job_of`). OSError: the caller's to log."""
  folder = epath.Path(folder)
  kept = {layout.local_step_dir(folder, s).name for s in keep}
  if partials_from is not None:
    kept |= {p.name for s, p in layout.local_partials(folder) if s >= partials_from}
  for entry in folder.iterdir():
    if not entry.name.startswith('step_') or entry.name in kept or (spare is not None and spare(entry)):
      continue
    if entry.is_dir():
      entry.rmtree()
    else:
      entry.unlink()


def job_of(step_dir: epath.Path) -> tuple[str, str | None] | None:
  """(job identity, job directory where the index records it) of a committed local step; None for anything
  whose index does not read back (a `.partial`, a damaged or older-format step: no job can restore it)."""
  try:
    found = read_index(step_dir)
    return lineage_of(found).job, found.get('job_log_dir') if isinstance(found.get('job_log_dir'), str) else None
  except (LocalDamage, OSError):
    return None


def index(step: int, host: int, hosts: int, fp: str, arrays: dict[str, Any], inputs: dict[int, bytes | None],
          captured_at: float | None, lineage: lineage_lib.Lineage, job_log_dir: str | None = None) -> dict:
  """`captured_at`: when the step's state was copied (unix seconds), what a kill's lost training counts from;
  `lineage`: the job and line of training it belongs to; `job_log_dir`: that job's directory, which names the
  job to a user (another job that finds this step in its way says whose it is). The whole index is covered by
  its `digest`: every byte that steers a restore (shard places, input positions, lineage) is checked before it
  is used: the commit adds it."""
  return {'format': FORMAT, 'hash': manifest_lib.HASH, 'step': step, 'host': host, 'hosts': hosts, 'fingerprint': fp,
          'captured_at': captured_at, 'lineage': lineage.to_json(),
          **({'job_log_dir': job_log_dir} if job_log_dir is not None else {}),
          'arrays': arrays, 'inputs': {str(h): None if v is None else base64.b64encode(v).decode()
                                       for h, v in inputs.items()}}


def _digest(found: dict[str, Any]) -> str:
  return xxhash.xxh3_64(json.dumps(found, sort_keys=True, separators=(',', ':')).encode()).hexdigest()


def read_index(step_dir: epath.Path) -> dict[str, Any]:
  """A local step's index, checked against its digest and against its directory's step; LocalDamage for
  anything else (unreadable, not JSON, another format, a byte changed, another step's index)."""
  path = step_dir / layout.LOCAL_INDEX
  try:
    text = path.read_text()
  except (OSError, ValueError) as e:
    raise LocalDamage(f'{path}: {e}') from None
  found = parse_index(text, path)
  _check_named_for(found, step_dir)
  return found


def _check_named_for(found: dict[str, Any], step_dir: epath.Path) -> None:
  """The step is its directory's name, the one the restore lists and plans by; the digest covers only the
  index. A copy of step_00000100 named step_00000200 holds step 100's state: as step 200 it would resume
  step 100's weights counted 100 steps on."""
  step = found.get('step')
  named = isinstance(step, int) and not isinstance(step, bool) and layout.local_step_dir('', step).name == step_dir.name
  if not named:
    raise LocalDamage(f"{step_dir.name}: its index is step {step!r}'s (a copy under another step's name)")


def parse_index(text: str, path: Any) -> dict[str, Any]:
  """An index's text (from `path`, for the message) checked as `read_index` does."""
  try:
    found = json.loads(text)
  except ValueError as e:
    raise LocalDamage(f'{path}: {e}') from None
  if not isinstance(found, dict) or found.get('format') != FORMAT or found.get('hash') != manifest_lib.HASH:
    raise LocalDamage(f'{path}: format {found.get("format") if isinstance(found, dict) else found!r}')
  digest = found.pop('digest', None)
  if digest != _digest(found):
    raise LocalDamage(f'{path}: does not match its digest' if digest else f'{path}: no digest (an older format)')
  return found


def read_shards(step_dir: epath.Path, found: dict[str, Any]) -> dict[str, dict[str, np.ndarray]]:
  """Every shard of a local step, checked against its digest (LocalDamage on the first that differs, or
  for an index whose fields are not what this code writes)."""
  try:
    return _read_shards(step_dir, found)
  except LocalDamage:
    raise
  except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
    raise LocalDamage(f'{step_dir.name}: {type(e).__name__}: {e}') from None


def _read_shards(step_dir: epath.Path, found: dict[str, Any]) -> dict[str, dict[str, np.ndarray]]:
  data = _read_all(step_dir / layout.LOCAL_SHARDS)
  out = {}
  for name, entry in found['arrays'].items():
    dtype = _dtype(entry['dtype'])
    out[name] = {}
    for key, (offset, nbytes, digest) in entry['shards'].items():
      raw = data[offset:offset + nbytes]
      if raw.nbytes != nbytes or xxhash.xxh3_64(raw).hexdigest() != digest:
        raise LocalDamage(f'{step_dir.name}: {name} shard {key or "()"} does not match its digest')
      agreement.moved()  # a shard hashed
      shape = tuple(s.stop - s.start for s in manifest_lib.shard_index(key))
      out[name][key] = raw.view(dtype).reshape(shape)
  return out


def _read_all(path: epath.Path) -> np.ndarray:
  """A whole file, in chunks, each a sign of progress (agreement.moved): the hosts waiting at the restore's
  plan or read wait as long as this one reads, however large its share and slow its disk."""
  with open(path, 'rb') as f:
    data = np.empty(os.fstat(f.fileno()).st_size, dtype=np.uint8)
    view, done = memoryview(data), 0
    while done < len(data) and (n := f.readinto(view[done:done + READ_CHUNK_BYTES])):
      done += n
      agreement.moved()
  return data[:done]


def lineage_of(found: dict[str, Any]) -> lineage_lib.Lineage:
  try:
    return lineage_lib.Lineage.from_json(found.get('lineage'))
  except ValueError as e:
    raise LocalDamage(str(e)) from None


def input_state(found: dict[str, Any], host: int) -> bytes | None:
  text = found.get('inputs', {}).get(str(host))
  return None if text is None else base64.b64decode(text)


def arrays_for(shards: dict[str, dict[str, np.ndarray]], shapes: Any, mesh: Any, specs: Any) -> Any:
  """The state as global jax.Arrays on this mesh, each device's shard from the local copy."""
  spec_of = dict(_names(jax.tree_util.tree_map(lambda _, s: s, shapes, specs)))
  names = iter(_names(shapes))

  def one(leaf):
    name, _ = next(names)
    mine = shards[name]
    return jax.make_array_from_callback(
        leaf.shape, jax.sharding.NamedSharding(mesh, spec_of[name]),
        lambda index: mine[manifest_lib.shard_key(index, leaf.shape)])

  return jax.tree_util.tree_map(one, shapes)


def _dtype(name: str) -> np.dtype:
  """A dtype by its name through jax's own types: np.dtype('bfloat16') finds TensorFlow's bfloat16 where
  TensorFlow is loaded (as under paxml), which XLA does not accept."""
  return np.dtype(getattr(jnp, name, None) or getattr(jnp, f'{name}_'))


def _write_synced(path: epath.Path, data: bytes) -> None:
  with open(path, 'wb') as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


def _sync_dir(path: epath.Path) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)
