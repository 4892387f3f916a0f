"""A host's committed local steps, served to a replaced peer over plain HTTP, and fetched by it (issue 39).

A host that lost its disk (a replaced VM) restores from a peer's copy of its shards. Sent through the JAX
coordination service, that copy travels as 1 MB base64 values held in host 0's memory: slow, and memory
that grows with the share. Here the donor serves its step directory with the standard library's HTTP
server, and the receiver streams it to disk a fixed buffer at a time, checking each shard's xxh3 as its
bytes arrive, resuming a cut transfer where it stopped (a Range request), committing only what checked.

What the secret protects against: another job's, or a stray process's, requests on a shared network.
Every request carries a secret made for this job (`new_secret`) and shared only through the job's
coordination service; a request without it gets 403 and nothing else, not even whether a path exists.
What it does not: there is no TLS. A private network is assumed (a VPC, a cluster network): the secret
and the shards travel in clear, so anyone who can read the traffic can read both. The shards' digests
catch a corrupted transfer, not a forged one.

The request's path reaches the filesystem only as `offered(step) / name`, with `name` one of the local
tier's two file names: the caller decides which steps are offered (this job's committed local steps).
"""

import concurrent.futures
import contextlib
import hmac
import http.client
import http.server
import os
import re
import secrets
import socket
import sys
import threading
import time
from typing import Any, Callable

from absl import logging
from etils import epath
import xxhash

from pax_autockpt import failures
from pax_autockpt import layout
from pax_autockpt import local_tier

BUFFER_BYTES = 1 << 20  # what a transfer holds in memory at a time, on either side
SECRET_HEADER = 'X-Autockpt-Secret'
INDEX_LIMIT = 256 << 20  # an index is held in memory whole: a longer answer is not one this code wrote
_NAMES = (layout.LOCAL_INDEX, layout.LOCAL_SHARDS)
_PATH = re.compile(r'/v1/steps/(\d{1,20})/(' + '|'.join(re.escape(n) for n in _NAMES) + ')')
_RANGE = re.compile(r'bytes=(\d+)-(\d*)')


class PeerUnavailable(Exception):
  """The donor could not be reached or stopped answering (refused connection, timeout, 5xx, a short read,
  a step it does not offer): another donor may serve; the partial copy stays for a resume."""


class PeerRefused(Exception):
  """The donor refused this job's secret (403): another job's server, or a secret from another run."""


def new_secret() -> str:
  """A secret for one job, to be shared through its coordination service."""
  return secrets.token_hex(16)


class _Handler(http.server.BaseHTTPRequestHandler):
  """GET /v1/steps/<step>/<index.json|shards.bin>, behind the secret; HTTP/1.0 (one request a connection)."""

  server: '_Server'
  timeout = 60  # a peer that stops reading (or never sends a request) frees its thread

  def do_GET(self):  # pylint: disable=invalid-name
    given = self.headers.get(SECRET_HEADER)
    if given is None or not hmac.compare_digest(given.encode('latin-1'), self.server.secret):
      logging.warning('[autockpt] peer transfer: refused a request from %s without this job\'s secret',
                      self.client_address[0])
      return self._empty(403)
    found = _PATH.fullmatch(self.path)
    folder = found and self.server.offered(int(found.group(1)))
    if folder is None:
      return self._empty(404)
    try:
      f = open(epath.Path(folder) / found.group(2), 'rb')
    except FileNotFoundError:
      return self._empty(404)
    with f:
      self._send(f, os.fstat(f.fileno()).st_size)

  def _send(self, f: Any, size: int) -> None:
    """The whole file (200) or the range asked for (206); 416 for a range that starts past its end."""
    start, end, asked = 0, size - 1, _RANGE.fullmatch(self.headers.get('Range', ''))
    if asked:
      start, end = int(asked.group(1)), min(int(asked.group(2) or end), end)
      if start > end:
        return self._empty(416, {'Content-Range': f'bytes */{size}'})
    self.send_response(206 if asked else 200)
    self.send_header('Content-Type', 'application/octet-stream')
    self.send_header('Content-Length', str(end + 1 - start))
    self.send_header('Accept-Ranges', 'bytes')
    if asked:
      self.send_header('Content-Range', f'bytes {start}-{end}/{size}')
    self.end_headers()
    f.seek(start)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the peer gave up: it may resume
      self._stream(f, end + 1 - start)

  def _stream(self, f: Any, length: int) -> None:
    """`length` bytes of `f` to the peer, one buffer at a time (never the whole file in memory)."""
    view = memoryview(bytearray(BUFFER_BYTES))
    while length > 0:
      n = f.readinto(view[:min(length, BUFFER_BYTES)])
      if not n:
        return  # the file shrank: the peer sees a short read
      self.wfile.write(view[:n])
      length -= n

  def _empty(self, code: int, headers: dict[str, str] | None = None) -> None:
    self.send_response(code)
    for key, value in (headers or {}).items():
      self.send_header(key, value)
    self.send_header('Content-Length', '0')
    self.end_headers()

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    """No access log: a transfer is logged by its receiver, a refusal once by do_GET."""


class _Server(http.server.ThreadingHTTPServer):
  daemon_threads = True

  def __init__(self, address: tuple[str, int], offered: Callable[[int], Any], secret: bytes):
    self.address_family = socket.AF_INET6 if ':' in address[0] else socket.AF_INET
    self.offered, self.secret = offered, secret
    super().__init__(address, _Handler)

  def handle_error(self, request, client_address):
    """One line, not socketserver's traceback on stderr."""
    logging.warning('[autockpt] peer transfer: a request from %s failed: %s', client_address[0],
                    failures.one_line(sys.exc_info()[1] or RuntimeError('unknown')))


class PeerServer:
  """Serves the steps `offered` names (a step -> its committed local step directory, or None) to peers
  holding `secret`; `with PeerServer(...) as server:` starts and stops it."""

  def __init__(self, offered: Callable[[int], epath.Path | None], secret: str, host: str = '127.0.0.1',
               port: int = 0):
    if not secret or not secret.isascii():
      raise ValueError('a peer transfer secret must be a non-empty ASCII string (new_secret())')
    self._offered, self._secret, self._address = offered, secret.encode('latin-1'), (host, port)
    self._server: _Server | None = None
    self._thread: threading.Thread | None = None
    self.address: tuple[str, int] | None = None  # once started: the bound (host, port)

  def start(self) -> tuple[str, int]:
    """Binds (port 0: any free port) and serves on a daemon thread; returns the bound (host, port)."""
    self._server = _Server(self._address, self._offered, self._secret)
    self._thread = threading.Thread(target=self._server.serve_forever, kwargs={'poll_interval': 0.1},
                                    name='autockpt-peer-server', daemon=True)
    self._thread.start()
    self.address = self._server.server_address[:2]
    return self.address

  def stop(self) -> None:
    if self._server is not None:
      self._server.shutdown()
      self._server.server_close()
      self._thread.join()
      self._server = self._thread = None

  def __enter__(self) -> 'PeerServer':
    self.start()
    return self

  def __exit__(self, *unused) -> None:
    self.stop()


# --- the receiver ---------------------------------------------------------------------------------


def fetch_step_from(donors: list[tuple[str, int]], secret: str, step: int, folder: epath.PathLike, *,
                    timeout: float = 30.0, max_bytes_per_sec: float | None = None) -> epath.Path:
  """Local step `step` from the first donor that serves it whole, each resuming what the one before left;
  the last PeerUnavailable when none could. A refusal or damage ends the attempt: the one secret given
  holds for every donor listed, and damage removed the partial copy."""
  error = PeerUnavailable('no donor')
  for address in donors:
    try:
      return fetch_step(address, secret, step, folder, timeout=timeout, max_bytes_per_sec=max_bytes_per_sec)
    except PeerUnavailable as e:
      logging.warning('[autockpt] peer transfer: %s', e)
      error = e
  raise error


def fetch_step(address: tuple[str, int], secret: str, step: int, folder: epath.PathLike, *,
               timeout: float = 30.0, max_bytes_per_sec: float | None = None) -> epath.Path:
  """Local step `step` from the donor at `address` into `folder`, committed only once every shard matched
  the donor's index (whose own digest is checked first); returns the committed step directory.

  PeerUnavailable (the partial copy stays: the next fetch resumes it), PeerRefused, LocalDamage (the
  donor's copy does not match its index: the partial copy is removed). `timeout`: the seconds a connect or
  one read may wait (not the whole transfer's, which grows with the share); `max_bytes_per_sec`: a cap on
  the shards' rate (None: as fast as the network and disk go), for a copy that must not compete with training."""
  where = f'{address[0]}:{address[1]} step {step}'
  found = _index(address, secret, step, timeout)
  partial = layout.local_partial_dir(folder, step)
  partial.mkdir(parents=True, exist_ok=True)
  try:
    _receive_shards(address, secret, step, partial / layout.LOCAL_SHARDS, _entries(found, where), timeout,
                    max_bytes_per_sec)
  except local_tier.LocalDamage:
    partial.rmtree(missing_ok=True)
    raise
  return local_tier.commit(partial, found)  # writes the index as the donor's commit did, digest included


def fetch_step_in_parallel(donors: list[tuple[tuple[str, int], str]], step: int, folder: epath.PathLike, *,
                           timeout: float = 30.0) -> epath.Path:
  """Local step `step` from several donors at once, each `(address, secret)`: the first's index, then each
  donor streams its own part of shards.bin (whole shards, about equal bytes) into the one `.partial` file,
  every shard checked as it arrives; a part whose donor fails goes on from its last byte with the next donor
  (the others' parts are theirs). Committed once every part checked; PeerUnavailable when a part found no
  donor, PeerRefused or LocalDamage as `fetch_step`. Unlike `fetch_step` it does not resume across calls."""
  found = _index(*donors[0], step, timeout)
  where = f'step {step} from {len(donors)} donors'
  entries = _entries(found, where)
  partial = layout.local_partial_dir(folder, step)
  partial.mkdir(parents=True, exist_ok=True)
  path = partial / layout.LOCAL_SHARDS
  with open(path, 'wb') as f:
    f.truncate(entries[-1][0] + entries[-1][1] if entries else 0)
  parts = _split(entries, len(donors))
  try:
    with concurrent.futures.ThreadPoolExecutor(max(1, len(parts)), thread_name_prefix='autockpt-peer-fetch') as pool:
      for done in [pool.submit(_fetch_part, donors, i, part, path, step, timeout) for i, part in enumerate(parts)]:
        done.result()
  except local_tier.LocalDamage:
    partial.rmtree(missing_ok=True)
    raise
  with open(path, 'rb+') as f:
    os.fsync(f.fileno())
  return local_tier.commit(partial, found)


def _split(entries: list[tuple[int, int, str, str]], n: int) -> list[list[tuple[int, int, str, str]]]:
  """Consecutive shards in at most `n` parts of about equal bytes (none empty)."""
  total = entries[-1][0] + entries[-1][1] if entries else 0
  parts, part = [], []
  for entry in entries:
    if part and len(parts) < n - 1 and entry[0] + entry[1] / 2 > total * (len(parts) + 1) / n:
      parts, part = parts + [part], []  # the part's share is reached before this shard's middle
    part.append(entry)
  return parts + ([part] if part else [])


def _fetch_part(donors: list[tuple[tuple[str, int], str]], first: int, part: list[tuple[int, int, str, str]],
                path: epath.Path, step: int, timeout: float) -> None:
  """One part of shards.bin, from donor `first`, else the next ones in turn, each from the byte the one
  before stopped at."""
  check = _Check(part, f'step {step}', start=part[0][0])
  if check.size == check.total:
    return  # zero-size shards only: checked already
  fd, error = os.open(path, os.O_WRONLY), None
  try:
    for k in range(len(donors)):
      address, secret = donors[(first + k) % len(donors)]
      where = f'{address[0]}:{address[1]} step {step}'
      try:
        with _get(address, secret, step, layout.LOCAL_SHARDS, check.size, timeout, end=check.total) as response:
          if response.length != check.total - check.size:
            raise local_tier.LocalDamage(f'{where}: {response.length} bytes for {check.size}-{check.total}')
          _copy(response, lambda data, offset: os.pwrite(fd, data, offset), check, where)
        return
      except PeerUnavailable as e:
        logging.warning('[autockpt] peer transfer: %s; the next donor goes on from there', e)
        error = e
    raise error
  finally:
    os.close(fd)


def _index(address: tuple[str, int], secret: str, step: int, timeout: float) -> dict[str, Any]:
  """The donor's index of `step`, checked against its digest."""
  where = f'{address[0]}:{address[1]} step {step}'
  with _get(address, secret, step, layout.LOCAL_INDEX, 0, timeout) as response:
    if (response.length or 0) > INDEX_LIMIT:
      raise local_tier.LocalDamage(f'{where}: an index of {response.length} bytes')
    text = _read(response, where).decode('utf-8', 'replace')
  found = local_tier.parse_index(text, f'{where} {layout.LOCAL_INDEX}')
  if found.get('step') != step:
    raise local_tier.LocalDamage(f'{where}: the index is step {found.get("step")}\'s')
  return found


def _entries(found: dict[str, Any], where: str) -> list[tuple[int, int, str, str]]:
  """(offset, nbytes, digest, what) of every shard in file order; LocalDamage for a gap, an overlap or a
  field this code does not write (the receiver checks as it goes, so the file must be what the index says)."""
  try:
    entries = sorted((offset, nbytes, digest, f'{name} shard {key or "()"}')
                     for name, entry in found['arrays'].items()
                     for key, (offset, nbytes, digest) in entry['shards'].items())
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    raise local_tier.LocalDamage(f'{where}: {type(e).__name__}: {e}') from None
  end = 0
  for offset, nbytes, digest, what in entries:
    if not (type(offset) is int and type(nbytes) is int and nbytes >= 0 and isinstance(digest, str)):
      raise local_tier.LocalDamage(f'{where}: {what}: not an offset, a size and a digest')
    if offset != end:
      raise local_tier.LocalDamage(f'{where}: {what} at {offset}, after bytes up to {end} (a gap or an overlap)')
    end += nbytes
  return entries


class _Check:
  """A shards file's bytes, fed in order, checked against each shard's digest as its last byte arrives."""

  def __init__(self, entries: list[tuple[int, int, str, str]], where: str, start: int = 0):
    self._entries, self._where, self._next, self.size = entries, where, 0, start
    self.total = entries[-1][0] + entries[-1][1] if entries else start
    self._hash = xxhash.xxh3_64()
    self._settle()

  def feed(self, data: memoryview) -> None:
    while data:
      offset, nbytes, _, _ = self._entries[self._next]
      take = min(len(data), offset + nbytes - self.size)
      self._hash.update(data[:take])
      self.size, data = self.size + take, data[take:]
      self._settle()

  def _settle(self) -> None:
    """Checks every shard that ends where the bytes fed so far end (zero-size shards included)."""
    while self._next < len(self._entries) and sum(self._entries[self._next][:2]) == self.size:
      _, _, digest, what = self._entries[self._next]
      if self._hash.hexdigest() != digest:
        raise local_tier.LocalDamage(f'{self._where}: {what} does not match its digest')
      self._next, self._hash = self._next + 1, xxhash.xxh3_64()


def _receive_shards(address: tuple[str, int], secret: str, step: int, path: epath.Path,
                    entries: list[tuple[int, int, str, str]], timeout: float,
                    max_bytes_per_sec: float | None = None) -> None:
  """shards.bin from the donor into `path`, after what a cut transfer left there (read back and checked
  first); synced once whole."""
  where = f'{address[0]}:{address[1]} step {step}'
  check = _resumable(path, entries, where)
  if check.size < check.total:
    with _get(address, secret, step, layout.LOCAL_SHARDS, check.size, timeout) as response:
      if response.length != check.total - check.size:
        raise local_tier.LocalDamage(f'{where}: {layout.LOCAL_SHARDS} answered {response.length} bytes from '
                                     f'{check.size}; its index says {check.total - check.size}')
      with open(path, 'ab') as f:
        _copy(response, lambda data, unused_offset: f.write(data), check, where, max_bytes_per_sec)
  with open(path, 'rb+') as f:
    os.fsync(f.fileno())


def _resumable(path: epath.Path, entries: list[tuple[int, int, str, str]], where: str) -> '_Check':
  """The check, fed with what an earlier transfer left in `path`; that is emptied when it does not match
  this index (another save's copy, a tail a crash left unwritten) or is longer."""
  check = _Check(entries, where)
  if path.exists() and os.path.getsize(path) <= check.total:
    view = memoryview(bytearray(BUFFER_BYTES))
    try:
      with open(path, 'rb') as f:
        while n := f.readinto(view):
          check.feed(view[:n])
      return check
    except local_tier.LocalDamage as e:
      logging.info('[autockpt] peer transfer: the partial copy does not match (%s); fetching it whole', e)
  open(path, 'wb').close()
  return _Check(entries, where)


def _copy(response: http.client.HTTPResponse, write: Callable[[memoryview, int], Any], check: _Check, where: str,
          max_bytes_per_sec: float | None = None) -> None:
  """The response's body through `write(data, offset in the file)` and `check`, one buffer at a time (at most
  `max_bytes_per_sec` on average since the copy began: it sleeps where it ran ahead)."""
  view, want = memoryview(bytearray(BUFFER_BYTES)), check.total
  began, start = time.monotonic(), check.size
  try:
    while check.size < want:
      if max_bytes_per_sec:
        time.sleep(max(0.0, began + (check.size - start) / max_bytes_per_sec - time.monotonic()))
      n = response.readinto(view[:min(BUFFER_BYTES, want - check.size)])
      if not n:
        raise PeerUnavailable(f'{where}: the connection closed at byte {check.size} of {want}')
      write(view[:n], check.size)
      check.feed(view[:n])
  except (OSError, http.client.HTTPException) as e:
    raise PeerUnavailable(f'{where}: {failures.one_line(e)} at byte {check.size} of {want}') from None


@contextlib.contextmanager
def _get(address: tuple[str, int], secret: str, step: int, name: str, start: int, timeout: float,
         end: int | None = None):
  """The donor's answer to GET of one file of `step` (from byte `start`, to byte `end` exclusive), its status
  checked; closed after."""
  where = f'{address[0]}:{address[1]} step {step}'
  connection = http.client.HTTPConnection(address[0], address[1], timeout=timeout)
  ranged = bool(start) or end is not None
  headers = {SECRET_HEADER: secret, **({'Range': f'bytes={start}-{"" if end is None else end - 1}'} if ranged else {})}
  try:
    connection.request('GET', f'/v1/steps/{step}/{name}', headers=headers)
    response = connection.getresponse()
  except (OSError, http.client.HTTPException) as e:
    connection.close()
    raise PeerUnavailable(f'{where}: {failures.one_line(e)}') from None
  with contextlib.closing(connection):
    if response.status == 403:
      raise PeerRefused(f'{where}: the donor refused this job\'s secret')
    if response.status == 416:
      raise local_tier.LocalDamage(f'{where}: {name} is shorter than its index says (416 from byte {start})')
    if response.status != (206 if ranged else 200):
      raise PeerUnavailable(f'{where}: {name}: HTTP {response.status} {response.reason}')
    yield response


def _read(response: http.client.HTTPResponse, where: str) -> bytes:
  """A small body whole; PeerUnavailable when the connection ends before its Content-Length."""
  try:
    return response.read()
  except (OSError, http.client.HTTPException) as e:
    raise PeerUnavailable(f'{where}: {failures.one_line(e)}') from None
