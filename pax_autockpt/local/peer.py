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

What a stranger who can reach the port can cost the donor (issue 46): at most max(8, 4 x hosts) connections
are open at once, counting every one not yet closed (one the gate ended included); one more waits in the
kernel's accept queue (no descriptor of this process) while the oldest connection that has not shown the secret
is closed to make room and its handler closes it. "Shown" is judged from the bytes that reached this host, read
by the handler or still waiting in the socket (issue 57: only a handler that had read the whole head counted,
so eight bare connections arriving before a peer's handler ran closed the peer's request unanswered). A
request's line and headers must arrive whole within REQUEST_SECS and HEAD_LIMIT bytes before it is served;
refusals are one line, then one summary a minute. So a flood holds the cap's descriptors and HEAD_LIMIT bytes
each (twice: the handler's and the gate's copy), never a thread for long; a peer whose secret has arrived is
never closed, and a receiver whose connection fails tries the same donor again for RETRY_SECS.
"""

import collections
import concurrent.futures
import contextlib
import errno
import hmac
import http.client
import http.server
import io
import os
import re
import secrets
import select
import socket
import sys
import threading
import time
from typing import Any, Callable

from absl import logging
from etils import epath
import xxhash

from pax_autockpt import layout
from pax_autockpt.hosts import agreement
from pax_autockpt.local import format as local_format
from pax_autockpt.shared import failures

BUFFER_BYTES = 1 << 20  # what a transfer holds in memory at a time, on either side
SECRET_HEADER = 'X-Autockpt-Secret'
INDEX_LIMIT = 256 << 20  # an index is held in memory whole: a longer answer is not one this code wrote
HEAD_LIMIT = 16 << 10  # a request's line and headers (this code's client sends ~150 bytes)
REQUEST_SECS = 10.0  # the whole request line and headers, however slowly they trickle in
ANSWER_SECS = 60.0  # a peer that stops reading its answer frees its thread
MIN_CONNECTIONS = 8  # open at once: max(this, CONNECTIONS_PER_HOST x hosts)
CONNECTIONS_PER_HOST = 4
RETRY_SECS = 5.0  # a receiver tries a donor again (0.25 s, then doubling) while its first attempt is this recent
_ROOM_POLL_SECS = 0.1  # how often a server waiting for room looks whether it is being stopped
SUMMARY_SECS = 60.0  # refusals: the first in a line, then at most one line (a count) per this long
_NAMES = (layout.LOCAL_INDEX, layout.LOCAL_SHARDS)
_PATH = re.compile(r'/v1/steps/(\d{1,20})/(' + '|'.join(re.escape(n) for n in _NAMES) + ')')
_RANGE = re.compile(r'bytes=(\d+)-(\d*)')
_SECRET_LINE = re.compile(rb'\n' + re.escape(SECRET_HEADER.encode()) + rb':[ \t]*([!-~]+)[ \t]*\r?\n', re.IGNORECASE)


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
  timeout = None  # blocking (with MSG_DONTWAIT reads) until the head is read: see `_Gate.answer_within`

  def setup(self):
    """The request line and headers read whole first, within REQUEST_SECS and HEAD_LIMIT bytes (a per-read
    timeout alone let a byte a minute hold a thread for ever, and the header parser held 6.5 MB a
    connection); a request that comes short of that is closed unanswered."""
    super().setup()
    self.rfile.close()  # the socket's own reader: the request is parsed from the head read here
    head = _read_head(self.connection, time.monotonic() + REQUEST_SECS, self.server.gate)
    self.server.gate.answer_within(self.connection, ANSWER_SECS)
    if head is None:
      evicted = self.server.gate.evicted(self.connection)
      why = 'over the connection cap, no secret shown' if evicted else 'too slow, too large or cut short'
      self.server.refusals.add(why, self.client_address[0])
    self.rfile = io.BytesIO(head or b'')

  def do_GET(self):  # pylint: disable=invalid-name
    given = self.headers.get(SECRET_HEADER)
    if given is None or not hmac.compare_digest(given.encode('latin-1'), self.server.secret):
      self.server.refusals.add("without this job's secret", self.client_address[0])
      return self._empty(403)
    self.server.gate.trusted(self.connection)
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
    """No access log: a transfer is logged by its receiver, refusals in the server's summary."""


def _read_head(sock: socket.socket, deadline: float, gate: '_Gate') -> bytes | None:
  """A request's line and headers through their blank line; None when the deadline passed, HEAD_LIMIT was
  exceeded, or the peer closed (or was closed by the gate) first. Each read goes through the gate
  (`_Gate.receive`), so that the bytes it takes from the socket are where the gate looks for the secret."""
  head, poller = bytearray(), select.poll()
  poller.register(sock, select.POLLIN)
  while len(head) <= HEAD_LIMIT:
    remaining = deadline - time.monotonic()
    if remaining <= 0 or not poller.poll(max(1, int(remaining * 1000))):
      return None
    chunk = gate.receive(sock, HEAD_LIMIT + 1 - len(head))
    if chunk is None:
      continue  # nothing after all: wait again
    if not chunk:
      return None
    tail = head[-3:] + chunk  # the blank line may straddle two reads
    head += chunk
    if b'\r\n\r\n' in tail or b'\n\n' in tail:
      return bytes(head)
  return None


def _shows_secret(data: bytes, secret: bytes) -> bool:
  """Whether a request's head so far carries this job's secret in a whole header line."""
  found = _SECRET_LINE.search(data)
  return found is not None and hmac.compare_digest(found.group(1), secret)


def _shut(sock: socket.socket) -> None:
  """Ends a connection another thread is reading: its read returns at once, and that thread closes it."""
  with contextlib.suppress(OSError):
    sock.shutdown(socket.SHUT_RDWR)


class _Gate:
  """The server's open connections, at most `limit`, every one not yet closed counted (one this gate ended that
  its handler has not closed yet included). While it is full and another connection waits, the oldest one that
  has not shown the secret is closed, and the next is accepted once its handler has closed it (`room`). Whether a
  connection showed the secret is judged under the gate's lock from every byte of it that reached this host:
  those its handler took (`receive`) and those still in the socket: a peer whose request has arrived is never
  closed here, however many connections come before its handler runs. When every open connection showed it, the
  next waits for one to end. A flood can then take neither the donor's descriptors nor a peer's turn."""

  def __init__(self, limit: int, secret: bytes):
    self.limit, self._secret = limit, secret
    self._cond = threading.Condition()
    self._waiting: dict[socket.socket, bytearray] = {}  # no secret shown yet -> the head read so far, oldest first
    self._trusted: set[socket.socket] = set()
    self._evicted: set[socket.socket] = set()  # closed by the gate, until their handler closed them

  def room(self, stopping: threading.Event) -> bool:
    """Waits until one more connection fits, closing a stranger to make it; False when `stopping` was set."""
    with self._cond:
      while not stopping.is_set():
        if self._count() < self.limit:
          return True
        stranger = None if self._evicted else next((s for s in list(self._waiting) if not self._showed_secret(s)), None)
        if stranger is not None:  # (one at a time: a slot is freed when the one closed before is gone)
          del self._waiting[stranger]
          self._evicted.add(stranger)
          _shut(stranger)  # its handler's poll returns at once; it closes it, and `gone` frees the slot
        self._cond.wait(_ROOM_POLL_SECS)
    return False

  def _showed_secret(self, request: socket.socket) -> bool:
    """Under the lock: whether what `request`'s handler read, and what waits in it unread, shows the secret (it
    is then trusted)."""
    try:  # a socket with a timeout would wait for it first, whatever the flags: the handler sets one only after
      unread = request.recv(HEAD_LIMIT, socket.MSG_PEEK | socket.MSG_DONTWAIT) if request.gettimeout() is None else b''
    except OSError:  # nothing waiting (EAGAIN), or closed
      unread = b''
    if not _shows_secret(bytes(self._waiting[request]) + unread, self._secret):
      return False
    self._trust(request)
    return True

  def receive(self, request: socket.socket, size: int) -> bytes | None:
    """The handler's read of `request` (at most `size` bytes, without waiting; None: nothing there after all,
    b'': closed), taken under the lock so that no byte is ever out of the gate's sight."""
    with self._cond:
      try:
        chunk = request.recv(size, socket.MSG_DONTWAIT)
      except BlockingIOError:
        return None
      except OSError:
        return b''
      if request in self._waiting and chunk:
        self._waiting[request] += chunk[:HEAD_LIMIT + 1 - len(self._waiting[request])]
        if _shows_secret(bytes(self._waiting[request]), self._secret):
          self._trust(request)
      return chunk

  def answer_within(self, request: socket.socket, seconds: float) -> None:
    """The handler's timeout for answering, once the head is read; set under the lock, so that the gate's own
    reads (which must not wait) never meet a socket that waits first."""
    with self._cond:
      request.settimeout(seconds)

  def admit(self, request: socket.socket) -> bool:
    """Whether `request`, accepted after `room`, fits (always, but for a server stopping meanwhile)."""
    with self._cond:
      if self._count() >= self.limit:
        return False
      self._waiting[request] = bytearray()
      return True

  def trusted(self, request: socket.socket) -> None:
    with self._cond:
      self._trust(request)

  def _trust(self, request: socket.socket) -> None:
    if request in self._waiting:  # else the gate closed it already
      del self._waiting[request]
      self._trusted.add(request)

  def evicted(self, request: socket.socket) -> bool:
    with self._cond:
      return request in self._evicted

  def gone(self, request: socket.socket) -> None:
    with self._cond:
      self._waiting.pop(request, None)
      self._trusted.discard(request)
      self._evicted.discard(request)
      self._cond.notify_all()

  def close_all(self) -> None:
    with self._cond:
      for request in [*self._waiting, *self._trusted]:
        _shut(request)

  def _count(self) -> int:
    return len(self._waiting) + len(self._trusted) + len(self._evicted)

  @property
  def open(self) -> int:
    with self._cond:
      return self._count()


class _Refusals:
  """Refused connections (and requests ended by an error), counted per reason: the first in one line at once,
  then at most one line per SUMMARY_SECS, the rest when the server stops (a line each let 1,424 strangers'
  requests write 1,424 warning lines into the job's logs)."""

  def __init__(self):
    self._lock = threading.Lock()
    self._counts: collections.Counter = collections.Counter()
    self._last_line: float | None = None
    self._who = ''

  def add(self, why: str, who: str) -> None:
    with self._lock:
      self._counts[why] += 1
      self._who = who
      now = time.monotonic()
      if self._last_line is not None and now - self._last_line < SUMMARY_SECS:
        return
      line = self._take(now)
    logging.warning(line)

  def flush(self) -> None:
    with self._lock:
      line = self._take(time.monotonic()) if self._counts else None
    if line:
      logging.warning(line)

  def _take(self, now: float) -> str:
    since = '' if self._last_line is None else f' in the last {now - self._last_line:.0f} s'
    details = ', '.join(f'{n} {why}' for why, n in self._counts.items())
    total, self._last_line = sum(self._counts.values()), now
    self._counts.clear()
    return (f'[autockpt] peer transfer: {total} request(s) refused or ended early{since} ({details}), the last '
            f'from {self._who}; at most one such line every {SUMMARY_SECS:.0f} s.')


class _Server(http.server.ThreadingHTTPServer):
  daemon_threads = True
  request_queue_size = 64  # connections the kernel holds until accepted: none is this process's descriptor

  def __init__(self, address: tuple[str, int], offered: Callable[[int], Any], secret: bytes, limit: int):
    self.address_family = socket.AF_INET6 if ':' in address[0] else socket.AF_INET
    self.offered, self.secret = offered, secret
    self.gate, self.refusals = _Gate(limit, secret), _Refusals()
    self.stopping = threading.Event()
    super().__init__(address, _Handler)

  def get_request(self):
    """The next connection, accepted only once the gate has room for it (until then it waits in the kernel's
    queue); OSError, which socketserver takes as "nothing to handle", when the server is being stopped."""
    if not self.gate.room(self.stopping):
      raise OSError('the peer server is stopping')
    return super().get_request()

  def verify_request(self, request, client_address) -> bool:
    """Within the gate's limit (socketserver shuts a request refused here)."""
    admitted = self.gate.admit(request)
    if not admitted:
      self.refusals.add('over the connection cap', client_address[0])
    return admitted

  def shutdown_request(self, request) -> None:
    super().shutdown_request(request)
    self.gate.gone(request)  # after the close: the gate's count never misses a connection still open

  def handle_error(self, request, client_address):
    """A count in the refusals' summary, not socketserver's traceback on stderr (nor a line each)."""
    self.refusals.add(f'ended by {type(sys.exc_info()[1]).__name__}', client_address[0])


class PeerServer:
  """Serves the steps `offered` names (a step -> its committed local step directory, or None) to peers
  holding `secret`, at most max(MIN_CONNECTIONS, CONNECTIONS_PER_HOST x `hosts`) connections at once;
  `with PeerServer(...) as server:` starts and stops it."""

  def __init__(self, offered: Callable[[int], epath.Path | None], secret: str, host: str = '127.0.0.1',
               port: int = 0, hosts: int = 1):
    if not secret or not secret.isascii():
      raise ValueError('a peer transfer secret must be a non-empty ASCII string (new_secret())')
    self._offered, self._secret, self._address = offered, secret.encode('latin-1'), (host, port)
    self._limit = max(MIN_CONNECTIONS, CONNECTIONS_PER_HOST * hosts)
    self._server: _Server | None = None
    self._thread: threading.Thread | None = None
    self.address: tuple[str, int] | None = None  # once started: the bound (host, port)

  def start(self) -> tuple[str, int]:
    """Binds and serves on a daemon thread; returns the bound (host, port), which peers learn through the
    coordination service."""
    self._server = self._bind()
    self._thread = threading.Thread(target=self._server.serve_forever, kwargs={'poll_interval': 0.1},
                                    name='autockpt-peer-server', daemon=True)
    self._thread.start()
    self.address = self._server.server_address[:2]
    return self.address

  def _bind(self) -> _Server:
    """On the port asked for; where that is taken (under `launch` every local host is given the same one),
    on a free port, in one line: peers learn the address through the coordination service anyway."""
    try:
      return _Server(self._address, self._offered, self._secret, self._limit)
    except OSError as e:
      if not self._address[1] or e.errno not in (errno.EADDRINUSE, errno.EACCES):
        raise
      logging.warning('[autockpt] peer transfer: port %d is not free (%s); serving on a free port instead.',
                      self._address[1], failures.one_line(e))
    return _Server((self._address[0], 0), self._offered, self._secret, self._limit)

  @property
  def connections(self) -> int:
    """The connections open now (0 when stopped)."""
    server = self._server
    return server.gate.open if server is not None else 0

  def stop(self) -> None:
    """Stops serving; a connection still open is ended (every peer is done with this server by now)."""
    if self._server is not None:
      self._server.stopping.set()  # a wait for room ends: serve_forever can then see the shutdown
      self._server.shutdown()
      self._server.gate.close_all()
      self._server.server_close()
      self._thread.join()
      self._server.refusals.flush()
      self._server = self._thread = None

  def __enter__(self) -> 'PeerServer':
    self.start()
    return self

  def __exit__(self, *unused) -> None:
    self.stop()


# --- the receiver ---------------------------------------------------------------------------------


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
  except local_format.LocalDamage:
    partial.rmtree(missing_ok=True)
    raise
  return local_format.commit(partial, found)  # writes the index as the donor's commit did, digest included


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
  except local_format.LocalDamage:
    partial.rmtree(missing_ok=True)
    raise
  with open(path, 'rb+') as f:
    os.fsync(f.fileno())
  return local_format.commit(partial, found)


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
            raise local_format.LocalDamage(f'{where}: {response.length} bytes for {check.size}-{check.total}')
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
    text = _read(response, f'{where} {layout.LOCAL_INDEX}', INDEX_LIMIT).decode('utf-8', 'replace')
  found = local_format.parse_index(text, f'{where} {layout.LOCAL_INDEX}')
  if found.get('step') != step:
    raise local_format.LocalDamage(f'{where}: the index is step {found.get("step")}\'s')
  return found


def _entries(found: dict[str, Any], where: str) -> list[tuple[int, int, str, str]]:
  """(offset, nbytes, digest, what) of every shard in file order; LocalDamage for a gap, an overlap or a
  field this code does not write (the receiver checks as it goes, so the file must be what the index says)."""
  try:
    entries = sorted((offset, nbytes, digest, f'{name} shard {key or "()"}')
                     for name, entry in found['arrays'].items()
                     for key, (offset, nbytes, digest) in entry['shards'].items())
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    raise local_format.LocalDamage(f'{where}: {type(e).__name__}: {e}') from None
  end = 0
  for offset, nbytes, digest, what in entries:
    if not (type(offset) is int and type(nbytes) is int and nbytes >= 0 and isinstance(digest, str)):
      raise local_format.LocalDamage(f'{where}: {what}: not an offset, a size and a digest')
    if offset != end:
      raise local_format.LocalDamage(f'{where}: {what} at {offset}, after bytes up to {end} (a gap or an overlap)')
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
        raise local_format.LocalDamage(f'{self._where}: {what} does not match its digest')
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
        raise local_format.LocalDamage(f'{where}: {layout.LOCAL_SHARDS} answered {response.length} bytes from '
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
    except local_format.LocalDamage as e:
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
      agreement.moved()  # the hosts waiting at the fill's end wait while this moves
  except (OSError, http.client.HTTPException) as e:
    raise PeerUnavailable(f'{where}: {failures.one_line(e)} at byte {check.size} of {want}') from None


@contextlib.contextmanager
def _get(address: tuple[str, int], secret: str, step: int, name: str, start: int, timeout: float,
         end: int | None = None):
  """The donor's answer to GET of one file of `step` (from byte `start`, to byte `end` exclusive), its status
  checked; closed after."""
  where = f'{address[0]}:{address[1]} step {step}'
  ranged = bool(start) or end is not None
  headers = {SECRET_HEADER: secret, **({'Range': f'bytes={start}-{"" if end is None else end - 1}'} if ranged else {})}
  connection, response = _request(address, f'/v1/steps/{step}/{name}', headers, timeout, where)
  with contextlib.closing(connection):
    if response.status == 403:
      raise PeerRefused(f'{where}: the donor refused this job\'s secret')
    if response.status == 416:
      raise local_format.LocalDamage(f'{where}: {name} is shorter than its index says (416 from byte {start})')
    if response.status != (206 if ranged else 200):
      raise PeerUnavailable(f'{where}: {name}: HTTP {response.status} {response.reason}')
    yield response


def _request(address: tuple[str, int], path: str, headers: dict[str, str], timeout: float,
             where: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
  """The connection and the head of its answer. A connection that fails before an answer (refused, reset, closed
  unanswered: a donor under a flood, one restarting its server) is tried again after 0.25 s, then twice as long
  each time, while the first attempt is less than RETRY_SECS old; then PeerUnavailable, and the caller moves on
  to its next donor. An answer, whatever its status, is not retried here."""
  first, pause = time.monotonic(), 0.25
  while True:
    connection = http.client.HTTPConnection(address[0], address[1], timeout=timeout)
    try:
      connection.request('GET', path, headers=headers)
      return connection, connection.getresponse()
    except (OSError, http.client.HTTPException) as e:
      connection.close()
      if time.monotonic() + pause - first > RETRY_SECS:
        raise PeerUnavailable(f'{where}: {failures.one_line(e)}') from None
      logging.info('[autockpt] peer transfer: %s: %s; trying it again in %.2f s', where, failures.one_line(e), pause)
    time.sleep(pause)
    pause *= 2


def _read(response: http.client.HTTPResponse, where: str, limit: int) -> bytes:
  """A small body whole, never more than `limit` bytes of it in memory whether or not the donor sent a length
  (LocalDamage past it: not an answer this code wrote); PeerUnavailable when the connection ends before its
  length."""
  if (response.length or 0) > limit:
    raise local_format.LocalDamage(f'{where}: an answer of {response.length} bytes, over {limit}')
  parts, size = [], 0
  try:
    if response.length is not None:
      return response.read()
    while size <= limit and (chunk := response.read(min(BUFFER_BYTES, limit + 1 - size))):
      parts.append(chunk)
      size += len(chunk)
  except (OSError, http.client.HTTPException) as e:
    raise PeerUnavailable(f'{where}: {failures.one_line(e)}') from None
  if size > limit:
    raise local_format.LocalDamage(f'{where}: an answer without a length, longer than {limit} bytes')
  return b''.join(parts)
