"""Buddy copies: each host also keeps its neighbour's newest committed local step (`--autockpt_local_buddy`).

Without a data-parallel replica (a model sharded over every host of one slice) a host that lost its disk has
no peer holding its shards, and every host falls back to the job directory. With buddy copies each host's
newest committed local step is also on one other host, its keeper: the same host of the next slice where
there are several slices (losing one slice then never takes both copies), else the next host. After each
local commit the keeper streams that step from its owner over the peer path (pax_autockpt.local.peer:
this job's secret, each shard checked against its digest as it arrives, a `.partial` committed by rename)
into `buddy/` of its own local tier, on one background thread at the background nice value and capped at
`local_buddy_mb_per_sec`, and keeps only the newest copy: `buddy/` holds at most two shares, the newest copy and
the one in flight (a `.partial` of any other step goes before a fetch starts), and never loses another job's
copies (issue 57). A copy that falls behind skips to the newest commit; one that fails logs a line and the next
commit tries again. A restart's plan
(pax_autockpt.local.restoring) uses a buddy copy after a host's own copy and a replica's. The owner serves only
the steps this run committed; the coordination service carries only its address and secret.

Nothing ends the copying thread (issue 46): a taken port is a free one (pax_autockpt.local.peer), a server
that cannot start is published at once as an error under its address's key (its keeper says so in a line
instead of waiting ADDRESS_WAIT_MS at each commit) while this host goes on copying its owner's, and any
other failure is a line at most once a minute and `BuddyCopies.serving` / `server_error` / `copy_error`.
"""

import json
import os
import threading
import time

from absl import logging
from etils import epath

from pax_autockpt import layout
from pax_autockpt.local import format as local_format
from pax_autockpt.local import peer
from pax_autockpt.shared import coordination
from pax_autockpt.shared import failures
from pax_autockpt.shared import priority

RETRY_SECS = 10.0  # an owner renames its step a moment after its keeper does: a 404 is retried this long
ADDRESS_WAIT_MS = 60_000  # every host publishes its address before the first local commit can happen
OFFERED = 1000  # this run's commits within this many steps of its newest are served (a copy may lag behind)
LOG_SECS = 60.0  # at most one line on the copies per this long (after the first)


def _per_slice(hosts: int, slices: int) -> int:
  return hosts // slices if 1 < slices < hosts and hosts % slices == 0 else 1


def keeper(host: int, hosts: int, slices: int = 1) -> int | None:
  """The host that keeps `host`'s copy: the same host of the next slice, else the next host; None for one
  host (there is no other disk)."""
  return None if hosts < 2 else (host + _per_slice(hosts, slices)) % hosts


def owner(host: int, hosts: int, slices: int = 1) -> int | None:
  """The host whose copy `host` keeps (the inverse of `keeper`)."""
  return None if hosts < 2 else (host - _per_slice(hosts, slices)) % hosts


class BuddyCopies:
  """One host's side: serves the local steps it committed to its keeper, and keeps its owner's newest."""

  def __init__(self, folder: epath.PathLike, *, host: int, hosts: int, slices: int, mb_per_sec: float,
               nice: int, address: str, port: int = 0, job: str | None = None):
    self.folder = epath.Path(folder)
    self._job = job  # this job's identity: another job's copies in buddy/ stay (None: every entry is this job's)
    self.kept = layout.local_buddy_dir(folder)
    self.owner = owner(host, hosts, slices)
    self._rate, self._nice = mb_per_sec * 1e6, nice
    self._client = coordination.client()
    self._offered: set[int] = set()  # this run's recent commits: nothing else on this disk is served
    self._cond = threading.Condition()
    self._wanted: int | None = None
    self._peer: dict | None = None  # the owner's address and secret, read once
    self._log = _Log()
    self._host, self._keeper, self._address = host, keeper(host, hosts, slices), (address, port)
    self._hosts = hosts
    self._server: peer.PeerServer | None = None
    self.serving = False  # this host's steps are served to its keeper (what `status` can show)
    self.server_error: str | None = None  # why they are not
    self.copy_error: str | None = None  # the newest copy's failure; None once a copy succeeded
    self._thread = threading.Thread(target=self._run, name='autockpt-buddy', daemon=True)

  def _start(self) -> None:
    """On the copying thread, at the background nice value (the server's threads inherit it: serving a copy
    yields the CPU to training as copying one does): the server, its address and secret published for the
    keeper; or, when it cannot start, its error under the same key, at once."""
    priority.lower_priority(self._nice)
    secret = peer.new_secret()
    try:
      self._server = peer.PeerServer(self._serve, secret, host=self._address[0], port=self._address[1],
                                     hosts=self._hosts)
      published = {'address': list(self._server.start()), 'secret': secret}
      self.serving = True
    except Exception as e:  # pylint: disable=broad-except  (this host still keeps its owner's copy)
      self.server_error = failures.one_line(e)
      published = {'error': self.server_error}
      logging.warning('[autockpt] buddy copies: this host cannot serve its local steps on %s:%d (%s): host %d keeps '
                      'no copy of them; this host still keeps host %d\'s.', *self._address, self.server_error,
                      self._keeper, self.owner)
    self._client.key_value_set(f'{coordination.BUDDY_ADDRESSES}{self._host}', json.dumps(published))
    if self.serving:
      logging.info('[autockpt] buddy copies: this host keeps host %d\'s newest local step in %s (at most %.0f MB/s); '
                   'host %d keeps this host\'s; serving on %s:%d.', self.owner, self.kept, self._rate / 1e6,
                   self._keeper, *published['address'])

  def committed(self, step: int) -> None:
    """Every host committed local `step` (a local commit waits for every host's part): serve this host's,
    and copy the owner's. The first starts the copying thread (after the restore, whose own transfers may use
    the same port)."""
    if self._thread.ident is None:
      self._thread.start()
    with self._cond:
      self._offered = {s for s in self._offered if s > step - OFFERED} | {step}
      self._wanted = step
      self._cond.notify()

  def _serve(self, step: int) -> epath.Path | None:
    with self._cond:
      return layout.local_step_dir(self.folder, step) if step in self._offered else None

  def _run(self) -> None:
    """Copies until the process ends (a daemon thread: a copy in flight then stops, and the next run's first
    copy prunes the `.partial` it left). Nothing ends it: a failure is logged and the next commit tries."""
    try:
      self._start()
    except Exception as e:  # pylint: disable=broad-except  (the coordination service, say: copying goes on)
      self.server_error = self.server_error or failures.one_line(e)
      self._log.failed('starting the buddy copies', e)
    while True:
      with self._cond:
        self._cond.wait_for(lambda: self._wanted is not None)
        step, self._wanted = self._wanted, None
      try:
        self._copy(step)
      except Exception as e:  # pylint: disable=broad-except  (a copy is a spare: the next commit tries again)
        self._failed(step, e)

  def _copy(self, step: int) -> None:
    """The owner's `step` into `buddy/`, retried while the owner has not renamed it yet; then the older go."""
    began = time.monotonic()
    try:
      self._drop_stale_partials(step)
      path = self._fetch(step, began + RETRY_SECS)
    except Exception as e:  # pylint: disable=broad-except  (a copy is a spare: training goes on)
      self._failed(step, e)
      return
    if path is None:
      return  # a newer commit came first: that one is copied instead
    self._prune(step)
    self.copy_error = None
    nbytes = os.path.getsize(path / layout.LOCAL_SHARDS)
    self._log.copied(step, self.owner, nbytes, time.monotonic() - began)

  def _failed(self, step: int, error: Exception) -> None:
    self.copy_error = failures.one_line(error)
    self._log.failed(f'buddy copy of host {self.owner}\'s local step {step}', error)

  def _fetch(self, step: int, deadline: float) -> epath.Path | None:
    if self._peer is None:
      key = f'{coordination.BUDDY_ADDRESSES}{self.owner}'
      self._peer = json.loads(self._client.blocking_key_value_get(key, ADDRESS_WAIT_MS))
    if 'error' in self._peer:
      raise peer.PeerUnavailable(f'host {self.owner} serves no copies: {self._peer["error"]}')
    while True:
      try:
        return peer.fetch_step(tuple(self._peer['address']), self._peer['secret'], step, self.kept,
                               max_bytes_per_sec=self._rate)
      except peer.PeerUnavailable:
        with self._cond:
          newer = self._wanted is not None
        if newer:
          return None
        if time.monotonic() > deadline:
          raise
        time.sleep(0.2)

  def _prune(self, newest: int) -> None:
    """Only the newest copy stays (and another job's copies); a `.partial` of a newer one is a copy in flight,
    resumed by its next fetch."""
    try:
      local_format.prune(self.kept, {newest}, partials_from=newest, spare=self._another_jobs)
    except OSError as e:
      logging.warning('[autockpt] could not prune the buddy copies in %s: %s', self.kept, failures.one_line(e))

  def _drop_stale_partials(self, step: int) -> None:
    """Before fetching `step`: every other `.partial` goes (a copy that failed, one a previous run left above this
    run's numbers), so that `buddy/` never holds more than the newest copy and this one."""
    for found, partial in layout.local_partials(self.kept):
      if found != step:
        partial.rmtree(missing_ok=True)

  def _another_jobs(self, entry: epath.Path) -> bool:
    found = local_format.job_of(entry) if self._job is not None else None
    return found is not None and found[0] != self._job


class _Log:
  """The first copy in a line, then one line per LOG_SECS at most (copies since, newest, rate); a failure at
  most once per LOG_SECS."""

  def __init__(self):
    self._copies, self._last_line, self._last_failure = 0, None, -float('inf')

  def copied(self, step: int, owner: int, nbytes: int, took: float) -> None:
    self._copies += 1
    now = time.monotonic()
    if self._last_line is not None and now - self._last_line < LOG_SECS:
      return
    since = '' if self._last_line is None else f' in the last {LOG_SECS:.0f} s'
    logging.info('[autockpt] buddy copies: %d of host %d\'s local steps copied%s, newest %d (%.1f MB in %.2f s, '
                 '%.0f MB/s).', self._copies, owner, since, step, nbytes / 1e6, took, nbytes / 1e6 / max(took, 1e-6))
    self._copies, self._last_line = 0, now

  def failed(self, what: str, error: Exception) -> None:
    now = time.monotonic()
    if now - self._last_failure >= LOG_SECS:
      self._last_failure = now
      logging.warning('[autockpt] %s failed (%s); the next commit tries again.', what, failures.one_line(error))
