"""A restart restores the freshest complete copy: the local tier's newest complete step, or the bucket's.

Every host lists its committed local steps, reads each back against its digests (a damaged one is left
where it is and not offered), and reports them with the fingerprint of the shards it needs on this
run's mesh. From the same reports every host reaches the same plan (`choose`): the newest step for
which every host has a copy of its own shards — on its own disk, or on a peer's that holds the same
shards (another data-parallel replica: a replaced VM with an empty disk) — if it is at least as new as
the bucket's newest committed checkpoint; else the bucket. A host without its own copy receives the
peer's through the coordination service before anyone reads (`fill`). Reading a local step never
touches the bucket; if it fails anywhere, every host falls back to the bucket together.
"""

import base64
import dataclasses
import json
import time
from typing import Any

from absl import logging
from etils import epath
from jax._src import distributed

from pax_autockpt import agreement
from pax_autockpt import failures
from pax_autockpt import layout
from pax_autockpt import local_tier

_KEY = 'autockpt/local-restore/'
_CHUNK = 1 << 20  # raw bytes per coordination-service value (base64 makes it 1.4 MB; gRPC's limit is 4 MB)
_FILL_WAIT_MS = 10 * 60 * 1000


@dataclasses.dataclass(frozen=True)
class HostReport:
  """What one host needs (its shards' fingerprint on this mesh) and has (usable local step -> fingerprint)."""

  needs: str
  has: dict[int, str]

  def encode(self) -> str:
    return json.dumps({'needs': self.needs, 'has': {str(s): f for s, f in self.has.items()}})

  @classmethod
  def decode(cls, text: str) -> 'HostReport':
    found = json.loads(text)
    return cls(found['needs'], {int(s): f for s, f in found['has'].items()})


@dataclasses.dataclass(frozen=True)
class Plan:
  """Restore local `step`; host -> the host whose copy it restores (itself where it has one)."""

  step: int
  donors: dict[int, int]

  @property
  def filled(self) -> dict[int, int]:
    return {h: d for h, d in self.donors.items() if h != d}


def choose(reports: dict[int, HostReport], hosts: int, bucket_step: int | None) -> Plan | None:
  """The newest local step every host can restore (its own copy first, else the lowest peer's with the
  same shards), if the bucket has none newer; None: restore from the bucket."""
  if sorted(reports) != list(range(hosts)):
    return None
  for step in sorted({s for r in reports.values() for s in r.has}, reverse=True):
    if bucket_step is not None and step < bucket_step:
      return None
    donors = {}
    for host in range(hosts):
      need = reports[host].needs
      holders = [host] if reports[host].has.get(step) == need else []
      holders += [g for g in range(hosts) if reports[g].has.get(step) == need]
      if not holders:
        break
      donors[host] = holders[0]
    else:
      return Plan(step, donors)
  return None


class LocalRestore:
  """One host's side of the plan, the fill and the read (see the module docstring)."""

  def __init__(self, folder: epath.PathLike, *, host: int, hosts: int):
    self.folder = epath.Path(folder)
    self._host, self._hosts = host, hosts

  def usable_steps(self, needs_input: bool) -> dict[int, str]:
    """Committed local steps that read back as written, for this number of hosts, with every host's
    input position where the run restores one: step -> fingerprint."""
    usable = {}
    for step in layout.local_committed_steps(self.folder):
      path = layout.local_step_dir(self.folder, step)
      try:
        found = local_tier.read_index(path)
        local_tier.read_shards(path, found)
      except (local_tier.LocalDamage, OSError) as e:
        logging.warning('[autockpt] local step %d is damaged, not offered for the restore: %s', step,
                        failures.one_line(e))
        continue
      inputs = found.get('inputs', {})
      if found.get('hosts') == self._hosts and (not needs_input or all(inputs.get(str(h)) for h in range(self._hosts))):
        usable[step] = found['fingerprint']
    return usable

  def plan(self, needs: str, bucket_step: int | None, needs_input: bool) -> Plan | None:
    """Every host's reports, one plan on every host."""
    try:
      has = self.usable_steps(needs_input)
    except OSError as e:
      logging.warning('[autockpt] local tier %s unreadable: %s', self.folder, failures.one_line(e))
      has = {}
    found = agreement.reports(f'{_KEY}plan', self._host, HostReport(needs, has).encode())
    plan = choose({h: HostReport.decode(t) for h, t in found.items()}, self._hosts, bucket_step)
    where = ('the bucket' if plan is None else
             f'local step {plan.step}' + (f', hosts {sorted(plan.filled)} from a peer\'s copy' if plan.filled else ''))
    logging.info('[autockpt] local tier: this host has steps %s; bucket newest %s; restoring %s.',
                 sorted(has) or 'none', bucket_step, where)
    return plan

  def fill(self, plan: Plan) -> bool:
    """Hosts without their own copy get a peer's; True on every host when every fill succeeded."""
    client = distributed.global_state.client
    prefix = f'{_KEY}fill/{plan.step}/'
    error = None
    try:
      if self._host in plan.filled.values():
        self._publish(client, f'{prefix}{self._host}/', plan.step)
      if self._host in plan.filled:
        began = time.time()
        self._receive(client, f'{prefix}{plan.filled[self._host]}/', plan.step)
        logging.info('[autockpt] local step %d received from host %d in %.3f s.', plan.step,
                     plan.filled[self._host], time.time() - began)
    except Exception as e:  # pylint: disable=broad-except
      error = f'host {self._host}: {failures.one_line(e)}'
    failed = agreement.first_report(f'{prefix}done', self._host, error)
    if failed is not None:
      logging.warning('[autockpt] local step %d could not be copied from a peer (%s): restoring from the bucket.',
                      plan.step, failed)
    return failed is None

  def _publish(self, client: Any, prefix: str, step: int) -> None:
    path = layout.local_step_dir(self.folder, step)
    data = (path / layout.LOCAL_SHARDS).read_bytes()
    chunks = [data[i:i + _CHUNK] for i in range(0, len(data), _CHUNK)] or [b'']
    for i, chunk in enumerate(chunks):
      client.key_value_set(f'{prefix}chunk/{i}', base64.b64encode(chunk).decode())
    client.key_value_set(f'{prefix}index', (path / layout.LOCAL_INDEX).read_text())
    client.key_value_set(f'{prefix}chunks', str(len(chunks)))

  def _receive(self, client: Any, prefix: str, step: int) -> None:
    count = int(client.blocking_key_value_get(f'{prefix}chunks', _FILL_WAIT_MS))
    found = json.loads(client.blocking_key_value_get(f'{prefix}index', _FILL_WAIT_MS))
    partial = layout.local_partial_dir(self.folder, step)
    if partial.exists():
      partial.rmtree()
    partial.mkdir(parents=True)
    with open(partial / layout.LOCAL_SHARDS, 'wb') as f:
      for i in range(count):
        f.write(base64.b64decode(client.blocking_key_value_get(f'{prefix}chunk/{i}', _FILL_WAIT_MS)))
    local_tier.read_shards(partial, found)  # as the donor wrote it
    local_tier.commit(partial, found)

  def load(self, step: int, shapes: Any, mesh: Any, specs: Any, pipeline: Any = None) -> Any:
    """The state of local step `step` on this mesh, read back against its digests; the input's position
    set from this host's entry."""
    path = layout.local_step_dir(self.folder, step)
    found = local_tier.read_index(path)
    shards = local_tier.read_shards(path, found)
    if pipeline is not None:
      pipeline.set_state(local_tier.input_state(found, self._host))
    return local_tier.arrays_for(shards, shapes, mesh, specs)

