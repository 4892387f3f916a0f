"""Damage for the verified-checkpoint tests: a byte flipped inside an array's data, written back as a
valid chunk (so only a content check can tell), or a manifest file broken."""

import json

from etils import epath
import numpy as np

from pax_autockpt import layout
from pax_autockpt.shared import manifest as manifest_lib
from pax_autockpt.tools import verify


def flip_a_byte(step_path: epath.Path, *, host: int | None = None) -> tuple[str, str]:
  """Flips one byte in the middle of the largest shard listed in the manifest (of `host`'s file, when
  given) and writes it back through tensorstore, which re-encodes the chunk: its length and format stay
  valid. Returns (array name, shard key)."""
  path = layout.manifest_path(step_path, host) if host is not None else None
  if path is not None:
    listed = json.loads(path.read_text())['arrays']
  else:
    listed = manifest_lib.read(step_path)
  ocdbt = verify.is_ocdbt(step_path)
  sizes = {}
  for name, shards in listed.items():
    for key in shards:
      index = manifest_lib.shard_index(key)
      sizes[(name, key)] = int(np.prod([s.stop - s.start for s in index])) if index else 1
  name, key = max(sizes, key=sizes.get)
  array = verify.open_array(step_path, name, ocdbt)
  index = manifest_lib.shard_index(key)
  data = np.array(array[index].read().result())
  raw = data.reshape(-1).view(np.uint8)
  raw[raw.size // 2] ^= 0x10
  array[index].write(data).result()
  return name, key


def break_manifest(step_path: epath.Path, host: int = 0) -> None:
  path = layout.manifest_path(step_path, host)
  text = path.read_text()
  path.write_text(text[:len(text) // 2])
