"""A restart restores the freshest complete copy: the local tier's newest complete step, or the job directory's.

Every host lists its committed local steps and offers only those of this job's lineage (`lineage.refusal`:
another job's, or a rolled-back lineage's, are named and left where they are) that read back against their
digests, with the fingerprint of the shards it needs on this run's mesh. From the same reports every host
reaches the same plan (`choose`): the newest step for which every host has a copy of its own shards from
one save — on its own disk, on a peer's that holds the same shards (another data-parallel replica: a
replaced VM with an empty disk), or in the buddy copy its keeper holds (pax_autockpt.local.buddy: a model
without a replica) — if it is at least as new as the job directory's newest committed checkpoint (host 0's
listing); else the job directory. A host without its own copy streams the peer's
straight from it before anyone reads (`fill`, over pax_autockpt.local.peer's authenticated HTTP: the
coordination service carries only the donor's address and the transfer's secret). Reading a local step
never touches the job directory; if it fails anywhere, every host falls back to the job directory together.
The restore plans again whenever it sets a job-directory checkpoint aside.

`decide` is the same choice made from the files alone (a job directory and the hosts' local directories, no
training process, no coordination service): `pax-autockpt status` and the tests' reference model ask it.
"""

import dataclasses
import json
import os
import time
from typing import Any

from absl import logging
from etils import epath

from pax_autockpt import layout
from pax_autockpt.hosts import agreement
from pax_autockpt.hosts import hosts as hosts_lib
from pax_autockpt.local import format as local_format
from pax_autockpt.local import lineage as lineage_lib
from pax_autockpt.local import peer
from pax_autockpt.shared import coordination
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import failures
from pax_autockpt.shared import manifest as manifest_lib

_FILL_WAIT_MS = 10 * 60 * 1000


@dataclasses.dataclass(frozen=True)
class HostReport:
  """What one host needs (its shards' fingerprint on this mesh) and has (usable local step -> (fingerprint,
  lineage token)), and the buddy copies it keeps for a neighbour (the same); host 0's also carries the job
  directory's newest committed step, which every host plans against. `refused`: the (step, lineage token) of
  the local steps and buddy copies whose lineage this host refused (`lineage.refusal`): a refusal on any host
  is one on every host (`choose`), as each host judges from its own event log and listing."""

  needs: str
  has: dict[int, tuple[str, str]]
  job_dir: int | None = None  # host 0's: the job directory's newest committed step
  buddy: dict[int, tuple[str, str]] = dataclasses.field(default_factory=dict)
  refused: tuple[tuple[int, str], ...] = ()

  def encode(self) -> str:
    return json.dumps({'needs': self.needs, 'has': {str(s): list(f) for s, f in self.has.items()},
                       'job_dir': self.job_dir, 'buddy': {str(s): list(f) for s, f in self.buddy.items()},
                       'refused': [list(r) for r in self.refused]})

  @classmethod
  def decode(cls, text: str) -> 'HostReport':
    found = json.loads(text)
    return cls(found['needs'], {int(s): tuple(f) for s, f in found['has'].items()}, found.get('job_dir'),
               {int(s): tuple(f) for s, f in found.get('buddy', {}).items()},
               tuple((int(s), t) for s, t in found.get('refused', [])))


@dataclasses.dataclass(frozen=True)
class Plan:
  """Restore local `step`; host -> the host whose copy it restores (itself where it has one). A host without
  its own copy has `sources`: every (donor, buddy) holding its shards, in the order it tries them (a replica's
  own copy, then the buddy copy a peer keeps for it): a donor that dies mid-transfer sends it to the next."""

  step: int
  donors: dict[int, int]
  sources: dict[int, tuple[tuple[int, bool], ...]] = dataclasses.field(default_factory=dict)

  @property
  def from_buddy(self) -> frozenset[int]:
    """The hosts whose first donor serves the buddy copy it keeps for them."""
    return frozenset(h for h, s in self.sources.items() if s[0][1])

  @property
  def filled(self) -> dict[int, int]:
    return {h: d for h, d in self.donors.items() if h != d}


def choose(reports: dict[int, HostReport], hosts: int, job_dir_step: int | None) -> Plan | None:
  """The newest local step every host can restore from copies of one save (one lineage token): its own
  copy first, else the lowest peer's with the same shards, else a buddy copy of its shards; if the job
  directory has none newer; never a save some host refused. None: restore from the job directory."""
  if sorted(reports) != list(range(hosts)):
    return None
  refused = {r for report in reports.values() for r in report.refused}
  copies = [c for r in reports.values() for c in (r.has, r.buddy)]
  for step in sorted({s for c in copies for s in c}, reverse=True):
    if job_dir_step is not None and step < job_dir_step:
      return None
    for token in sorted({c[step][1] for c in copies if step in c} - {t for s, t in refused if s == step}):
      plan = _donors(reports, hosts, step, token)
      if plan is not None:
        return plan
  return None


def _donors(reports: dict[int, HostReport], hosts: int, step: int, token: str) -> Plan | None:
  donors, sources = {}, {}
  for host in range(hosts):
    want = (reports[host].needs, token)
    if reports[host].has.get(step) == want:
      donors[host] = host
      continue
    found = [(g, False) for g in range(hosts) if reports[g].has.get(step) == want]
    found += [(g, True) for g in range(hosts)
              if g != host and (g, False) not in found and reports[g].buddy.get(step) == want]  # a donor once
    if not found:
      return None
    donors[host], sources[host] = found[0][0], tuple(found)
  return Plan(step, donors, sources)


@dataclasses.dataclass(frozen=True)
class JobState:
  """What the restart found in the job directory, that a local step's lineage is checked against."""

  job: str
  committed: list[int]
  set_aside: list[int]
  ever_committed: frozenset[int] = frozenset()  # steps whose save_committed event this host logged
  saves: dict[int, tuple[str | None, ...]] = dataclasses.field(default_factory=dict)  # their ids (lineage)
  own: dict[int, str | None] = dataclasses.field(default_factory=dict)  # the save id each checkpoint records
  gone: tuple[tuple[int, str], ...] = ()  # commits the log records, deleted with no record (lineage.rolled_back)
  lines: dict[str, tuple[tuple[str, int], ...]] = dataclasses.field(default_factory=dict)  # lineage.save_lines
  later: dict[str, dict[int, str]] = dataclasses.field(default_factory=dict)  # lineage.kept_later

  @property
  def newest(self) -> int | None:
    return self.committed[-1] if self.committed else None


def job_state(job_log_dir: epath.PathLike, job: str, host: int, ckpt_dir: epath.PathLike | None = None,
              saves: dict[int, tuple[str | None, ...]] | None = None) -> JobState:
  """What a local step's lineage is checked against, read from the job directory: its listing (`ckpt_dir`,
  default Pax's), the save id inside each checkpoint (its manifest), the commits in host `host`'s event log
  (`saves`: `lineage.committed_saves` of it, where the caller read it already) and host 0's `deleted` records
  (preservation runs there)."""
  ckpt = layout.checkpoint_dir(job_log_dir) if ckpt_dir is None else epath.Path(ckpt_dir)
  committed, aside = layout.committed_steps(ckpt), layout.set_aside_steps(job_log_dir)
  primary = events_lib.read(job_log_dir, 0)
  if saves is None:
    saves = lineage_lib.committed_saves(primary if host == 0 else events_lib.read(job_log_dir, host))
  paths = {**_aside_paths(job_log_dir, ckpt), **{s: layout.step_dir(ckpt, s) for s in committed}}
  own = {s: _own_id(path, s, primary) for s, path in paths.items()}
  gone = lineage_lib.rolled_back(saves, lineage_lib.policy_deleted(primary), committed + aside, own)
  return JobState(job, committed, aside, frozenset(saves), saves, own, gone, lineage_lib.save_lines(primary),
                  lineage_lib.kept_later(primary, gone))


def restored_save(job: JobState, step: int) -> str | None:
  """The save id of the job directory's checkpoint `step` that a run restores, what its local steps grow from:
  the one its manifest records, else its newest commit's in the log; None where it was replaced by a save that
  records none (a tool's: unknown, judged by its step)."""
  if job.own.get(step) is not None:
    return job.own[step] or None
  return (job.saves.get(step) or (None,))[-1]


def _aside_paths(job_log_dir: epath.PathLike, ckpt: epath.Path) -> dict[int, epath.Path]:
  """Where each set-aside checkpoint is now (marked in place, or moved aside: the newest move of a step)."""
  found = {s: layout.step_dir(ckpt, s) for s in layout.marked_unrestorable_steps(ckpt)}
  aside = layout.unrestorable_dir(job_log_dir)
  for path in sorted(aside.iterdir()) if aside.is_dir() else []:
    step = layout.step_of(path.name.split('.', 1)[0])
    if step is not None:
      found[step] = path
  return found


def _own_id(path: epath.Path, step: int, primary: list[dict[str, Any]]) -> str | None:
  """The save id the checkpoint at `path` (of `step`) records in its manifest; '' (no save's id) where it
  records none but the newest commit of that step in host 0's log wrote one (a manifest and an id): the
  checkpoint was replaced since (edited in place, retrained by a tool); None where nothing is known."""
  found = manifest_lib.save_id(path)
  if found is not None:
    return found
  commits = [e for e in primary if e.get('event') == 'save_committed' and e.get('step') == step]
  return '' if commits and commits[-1].get('manifest') and isinstance(commits[-1].get('id'), str) else None


def decide(job_log_dir: epath.PathLike, folders: dict[int, epath.PathLike], needs: dict[int, str], *,
           job: str, needs_input: bool = False) -> tuple['Plan | None', int | None, dict[int, str]]:
  """The restore's choice from the files alone: (the plan, None for the job directory; the job directory's
  newest committed step; why each local step of host 0 is not offered). `folders`: every host's local
  directory; `needs`: each host's shards' fingerprint; `job`: the job's identity (lineage.job_identity).
  The same functions as a restart's (`LocalRestore.plan` without the coordination service)."""
  reports, why = {}, {}
  for host, folder in folders.items():
    reports[host], reasons = host_report(job_log_dir, folder, host, len(folders), needs[host], job, needs_input)
    why = reasons if host == 0 else why
  newest = reports[0].job_dir if 0 in reports else None
  return choose(reports, len(folders), newest), newest, why


def host_report(job_log_dir: epath.PathLike, folder: epath.PathLike, host: int, hosts: int, needs: str, job: str,
                needs_input: bool = False) -> tuple[HostReport, dict[int, str]]:
  """What host `host` reports to a restart's plan from its local directory, and why each of its own steps is
  not offered."""
  local = LocalRestore(folder, host=host, hosts=hosts)
  state = job_state(job_log_dir, job, host)
  has, buddy = local.offers(needs_input, state)
  return HostReport(needs, has, state.newest, buddy, tuple(sorted(local.refused))), local.reasons


def verdict(job_log_dir: epath.PathLike, folders: dict[int, epath.PathLike], hosts: int, step: int) -> str | None:
  """Why a restart would not restore host 0's local `step` (None: it would), decided as the restore decides
  (`decide`) from the local directories in `folders`: all `hosts` of them, the whole plan; fewer (the others are
  on other machines), host 0's own offer."""
  path = layout.job_id_path(job_log_dir)
  job = lineage_lib.job_identity(path.read_text().strip(), job_log_dir) if path.exists() else ''
  needs = {h: _fingerprint_at(folders, h, step) for h in folders}
  if len(folders) < hosts:
    report, why = host_report(job_log_dir, folders[0], 0, hosts, needs[0], job)
    return None if step in report.has else why.get(step, 'the job directory\'s newest checkpoint is newer')
  plan, _, why = decide(job_log_dir, folders, needs, job=job)
  if plan is not None and plan.step == step:
    return None
  return why.get(step) or 'not every host can restore it (a copy missing or damaged, or refused on another host)'


def _fingerprint_at(folders: dict[int, epath.PathLike], host: int, step: int) -> str:
  """The shards' fingerprint of host `host`'s copy of `step`: its own, else a buddy copy another host keeps of
  its shards ('' where none reads)."""
  kept = [layout.local_buddy_dir(f) for h, f in folders.items() if h != host]
  for folder in (folders[host], *kept):
    try:
      found = local_format.read_index(layout.local_step_dir(folder, step))
    except (local_format.LocalDamage, OSError):
      continue
    if found.get('host') == host:
      return found.get('fingerprint', '')
  return ''


class LocalRestore:
  """One host's side of the plan, the fill and the read (see the module docstring)."""

  def __init__(self, folder: epath.PathLike, *, host: int, hosts: int, peer_port: int = 0):
    self.folder = epath.Path(folder)
    self.buddy_folder = layout.local_buddy_dir(folder)  # a neighbour's copy (pax_autockpt.local.buddy)
    self._host, self._hosts = host, hosts
    self._peer_port = peer_port  # where this host serves its copy to a peer (pax_autockpt.local.peer)
    self._plans = 0  # a fresh coordination key for each plan of this run
    self.restored_lineage: lineage_lib.Lineage | None = None  # of the local step `load` read
    self.agreed_newest: int | None = None  # the job directory's newest checkpoint the last plan was made against
    self.refused: set[tuple[int, str]] = set()  # (step, lineage token) this host's lineage check refused
    self.reasons: dict[int, str] = {}  # own step -> why it was not offered, as the last plan found

  def usable_steps(self, needs_input: bool, job: JobState, buddy: bool = False) -> dict[int, tuple[str, str]]:
    """Committed local steps of this job's lineage (`lineage.refusal`) at least as new as its newest
    checkpoint, that read back as written, for this number of hosts, with every host's input position
    where the run restores one: step -> (fingerprint, lineage token). Every other one is named in a line
    and left where it is. `buddy`: the neighbour's copies this host keeps, not its own steps."""
    usable = {}
    folder = self.buddy_folder if buddy else self.folder
    for step in layout.local_committed_steps(folder):
      if job.newest is not None and step < job.newest:
        continue  # the job directory's is newer
      why, found = self._refusal(folder, step, needs_input, job)
      if why is not None and not buddy:
        self.reasons[step] = why
      if why is not None:
        logging.warning('[autockpt] %slocal step %d is not offered for the restore: %s',
                        'the buddy copy of ' if buddy else '', step, why)
        continue
      usable[step] = (found['fingerprint'], local_format.lineage_of(found).token)
    return usable

  def _refusal(self, folder: epath.Path, step: int, needs_input: bool,
               job: JobState) -> tuple[str | None, dict[str, Any]]:
    """Why local `step` in `folder` is not offered (None: it is), and its index."""
    path = layout.local_step_dir(folder, step)
    try:
      found = local_format.read_index(path)
      lineage = local_format.lineage_of(found)
      why = lineage_lib.refusal(lineage, step, job=job.job, committed=job.committed, set_aside=job.set_aside,
                                ever_committed=job.ever_committed, saves=job.saves, own=job.own, gone=job.gone,
                                lines=job.lines, later=job.later)
      if why is None:
        local_format.read_shards(path, found)
      else:
        self.refused.add((step, lineage.token))  # reported: refused on every host (`choose`)
    except (local_format.LocalDamage, OSError) as e:
      return f'damaged ({failures.one_line(e)})', {}
    if why is None and found.get('hosts') != self._hosts:
      why = f'written by {found.get("hosts")} hosts, this run has {self._hosts}'
    inputs = found.get('inputs', {})
    if why is None and needs_input and not all(inputs.get(str(h)) for h in range(self._hosts)):
      why = 'it holds no input position for every host'
    return why, found

  def plan(self, needs: str, job: JobState, needs_input: bool) -> Plan | None:
    """Every host's reports, one plan on every host (against host 0's newest job-directory checkpoint)."""
    key = f'{coordination.LOCAL_RESTORE}plan/{self._plans + 1}'
    with agreement.working(key, self._host):  # the hosts already at the plan wait while this one reads
      has, buddy = self.offers(needs_input, job)
    self._plans += 1
    found = agreement.reports(key, self._host,
                              HostReport(needs, has, job.newest, buddy, tuple(sorted(self.refused))).encode())
    reports = {h: HostReport.decode(t) for h, t in found.items()}
    _say_refused_elsewhere(reports, self._host, has, buddy)
    newest = self.agreed_newest = reports[0].job_dir if 0 in reports else job.newest
    plan = choose(reports, self._hosts, newest)
    logging.info('[autockpt] local tier: this host offers steps %s%s; the job directory\'s newest checkpoint is %s; '
                 'restoring %s.', sorted(has) or 'none', f' (and a buddy copy of {sorted(buddy)})' if buddy else '',
                 'none' if newest is None else newest, _where(plan, newest))
    return plan

  def offers(self, needs_input: bool, job: JobState) -> tuple[dict, dict]:
    """This host's usable steps and buddy copies; none from a folder that cannot be read."""
    offers, self.refused, self.reasons = [], set(), {}
    for buddy, folder in ((False, self.folder), (True, self.buddy_folder)):
      try:
        offers.append(self.usable_steps(needs_input, job, buddy=buddy))
      except OSError as e:
        logging.warning('[autockpt] local tier %s unreadable: %s', folder, failures.one_line(e))
        offers.append({})
    return offers[0], offers[1]

  def fill(self, plan: Plan) -> bool:
    """Hosts without their own copy stream a peer's straight from it (pax_autockpt.local.peer: the
    coordination service carries only its address and a secret made for this transfer); True on every host
    when every fill succeeded, else every host restores from the job directory."""
    client = coordination.client()
    prefix = f'{coordination.LOCAL_RESTORE}fill/{self._plans}/{plan.step}/'
    kinds = sorted({buddy for found in plan.sources.values() for donor, buddy in found if donor == self._host})
    error, servers = None, []
    try:
      with agreement.working(f'{prefix}done', self._host):  # the hosts done already wait while this one moves
        for buddy in kinds:
          servers.append(self._serve(client, f'{prefix}{self._host}/{int(buddy)}/', plan.step, buddy))
        if self._host in plan.sources:
          self._receive(client, prefix, plan.step, plan.sources[self._host])
    except Exception as e:  # pylint: disable=broad-except
      error = f'host {self._host}: {failures.one_line(e)}'
    try:
      failed = agreement.first_report(f'{prefix}done', self._host, error)  # agreement.Timeout: the caller's
    finally:
      for server in servers:
        server.stop()  # every receiver is done with it (or the job is)
      if kinds:
        _release(client, f'{prefix}{self._host}')
    if failed is not None:
      logging.warning('[autockpt] local step %d could not be copied from a peer (%s): restoring from the job '
                      'directory.', plan.step, failed)
    return failed is None

  def _serve(self, client: Any, prefix: str, step: int, buddy: bool) -> peer.PeerServer:
    """This host's copy of `step` (`buddy`: the one it keeps for a neighbour), and nothing else, served to the
    peers that need it."""
    path = layout.local_step_dir(self.buddy_folder if buddy else self.folder, step)
    secret = peer.new_secret()
    server = peer.PeerServer(lambda s: path if s == step else None, secret,
                             host=hosts_lib.own_address(coordination.coordinator_address()), port=self._peer_port,
                             hosts=self._hosts)
    try:
      address = server.start()
    except Exception as e:
      client.key_value_set(f'{prefix}peer', json.dumps({'error': failures.one_line(e)}))  # receivers move on now
      raise
    client.key_value_set(f'{prefix}peer', json.dumps({'address': list(address), 'secret': secret}))
    return server

  def _receive(self, client: Any, prefix: str, step: int, sources: tuple[tuple[int, bool], ...]) -> None:
    """`step` from the plan's first source, in parallel with every other source already serving by then
    (each donor its own part); where that fails, from each source left in turn (each waited for)."""
    began = time.monotonic()
    ready = {0: _peer(client, prefix, sources[0], wait=True)}
    ready.update({i: p for i, s in enumerate(sources) if i and (p := _peer(client, prefix, s, wait=False))})
    donors = [(tuple(ready[i]['address']), ready[i]['secret']) for i in sorted(ready)]
    try:
      path = (peer.fetch_step_in_parallel(donors, step, self.folder) if len(donors) > 1 else
              peer.fetch_step(*donors[0], step, self.folder))
      used = [sources[i] for i in sorted(ready)]
    except peer.PeerUnavailable as e:
      logging.warning('[autockpt] local step %d from host(s) %s: %s', step, [sources[i][0] for i in ready],
                      failures.one_line(e))
      path, used = self._in_turn(client, prefix, step, [s for i, s in enumerate(sources) if i not in ready], e)
    nbytes = os.path.getsize(path / layout.LOCAL_SHARDS)
    took = time.monotonic() - began
    logging.info('[autockpt] local step %d received from %s in %.3f s (%.1f MB, %.0f MB/s).', step, _from(used), took,
                 nbytes / 1e6, nbytes / 1e6 / max(took, 1e-6))

  def _in_turn(self, client: Any, prefix: str, step: int, sources: list[tuple[int, bool]],
               error: Exception) -> tuple[epath.Path, list[tuple[int, bool]]]:
    """`step` from each source left, in turn (each waited for), each resuming the `.partial` the one before
    left: the first attempt's `error` where there is none left, else the last source's."""
    for source in sources:
      try:
        donor = _peer(client, prefix, source, wait=True)
        return peer.fetch_step(tuple(donor['address']), donor['secret'], step, self.folder), [source]
      except peer.PeerUnavailable as e:
        logging.warning('[autockpt] local step %d from host %d: %s', step, source[0], failures.one_line(e))
        error = e
    raise error

  def load(self, step: int, shapes: Any, mesh: Any, specs: Any) -> tuple[Any, bytes | None]:
    """The state of local step `step` on this mesh, read back against its digests, and this host's input
    position at that step (for the caller to set once every host's read succeeded)."""
    path = layout.local_step_dir(self.folder, step)
    found = local_format.read_index(path)
    shards = local_format.read_shards(path, found)
    self.restored_lineage = local_format.lineage_of(found)
    return local_format.arrays_for(shards, shapes, mesh, specs), local_format.input_state(found, self._host)


def _peer(client: Any, prefix: str, source: tuple[int, bool], wait: bool) -> dict | None:
  """The address and secret a donor published for `source` (its own copy, or the buddy copy it keeps);
  without `wait`, None when it has not yet. PeerUnavailable at once for a donor whose server could not start
  (it publishes its error where the address would be: no receiver waits the fill's timeout for it)."""
  key = f'{prefix}{source[0]}/{int(source[1])}/peer'
  if wait:
    found = json.loads(client.blocking_key_value_get(key, _FILL_WAIT_MS))
  else:
    published = dict(client.key_value_dir_get(key.rsplit('/', 1)[0] + '/'))
    found = json.loads(published[key]) if key in published else None
  if found is not None and 'error' in found:
    if not wait:
      return None
    raise peer.PeerUnavailable(f'host {source[0]} cannot serve its copy: {found["error"]}')
  return found


def _say_refused_elsewhere(reports: dict[int, HostReport], host: int, has: dict, buddy: dict) -> None:
  """One line for the copies this host offers of a save another host refused (`choose` leaves them out)."""
  mine = {(s, f[1]) for c in (has, buddy) for s, f in c.items()}
  by = {r: h for h, report in sorted(reports.items(), reverse=True) if h != host for r in report.refused}
  for step, token in sorted(mine & by.keys()):
    logging.warning('[autockpt] local step %d is not offered for the restore: host %d refused it (a refusal on '
                    'any host is one on every host).', step, by[(step, token)])


def _from(used: list[tuple[int, bool]]) -> str:
  if len(used) == 1:
    return f'host {used[0][0]}' + (' (the buddy copy it keeps for this host)' if used[0][1] else '')
  return 'hosts ' + ', '.join(f'{d}' + (' (a buddy copy)' if b else '') for d, b in used) + ' in parallel'


def _where(plan: Plan | None, newest: int | None) -> str:
  if plan is None:
    return 'the job directory' + ('' if newest is not None else ' (empty: a fresh start)')
  peers = sorted(h for h in plan.filled if h not in plan.from_buddy)
  buddies = sorted(h for h in plan.filled if h in plan.from_buddy)
  return (f'local step {plan.step}' + (f', hosts {peers} from a peer\'s copy' if peers else '') +
          (f', hosts {buddies} from the buddy copy a peer keeps for them' if buddies else ''))


def _release(client: Any, folder: str) -> None:
  """Deletes a published copy from the coordination service (host 0's memory), every key under `folder`."""
  try:
    coordination.delete(client, folder)
  except Exception as e:  # pylint: disable=broad-except  (memory, not correctness)
    logging.warning('[autockpt] could not release the copy under %s: %s', folder, failures.one_line(e))
