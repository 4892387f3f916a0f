"""A fake GCE/TPU metadata server for tests: the notice keys, with the real server's long-poll and ETags.

Serves `GET /computeMetadata/v1/instance/<key>` on 127.0.0.1 (a `Metadata-Flavor: Google` header is
required, as on the real server; 404 for a key that is not set). With `?wait_for_change=true&last_etag=E`
it answers at once when the value's ETag differs from E, else when the value changes, or after
`timeout_sec` with the unchanged value. Tests change values through `FakeMetadataServer.set`. Runs as a
child process, stopped by pid.

  with FakeMetadataServer(workdir) as server:
    env['GCE_METADATA_HOST'] = server.host      # "127.0.0.1:PORT"
    server.set('maintenance-event', 'TERMINATE_ON_HOST_MAINTENANCE')
"""

import argparse
import hashlib
import http.server
import os
import signal
import socketserver
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

from pax_autockpt.tools import process

_PREFIX = '/computeMetadata/v1/instance/'
_CONTROL = '/_fake/'
DEFAULTS = {'maintenance-event': 'NONE', 'preempted': 'FALSE'}  # upcoming-maintenance: unset (404)


class _Values:
  """Key -> value with an ETag per version; readers wait on a condition for changes."""

  def __init__(self):
    self._cond = threading.Condition()
    self._values: dict[str, str] = dict(DEFAULTS)
    self._versions: dict[str, int] = {k: 0 for k in DEFAULTS}

  def etag(self, key: str) -> str:
    version = self._versions.get(key, 0)
    return hashlib.sha1(f'{key}:{version}:{self._values.get(key)}'.encode()).hexdigest()[:16]

  def get(self, key: str, last_etag: str | None, wait: bool, timeout: float) -> tuple[str | None, str]:
    deadline = time.time() + timeout
    with self._cond:
      while wait and self.etag(key) == last_etag and time.time() < deadline:
        self._cond.wait(deadline - time.time())
      return self._values.get(key), self.etag(key)

  def set(self, key: str, value: str | None) -> None:
    with self._cond:
      if value is None:
        self._values.pop(key, None)
      else:
        self._values[key] = value
      self._versions[key] = self._versions.get(key, 0) + 1
      self._cond.notify_all()


class _Handler(http.server.BaseHTTPRequestHandler):
  protocol_version = 'HTTP/1.1'
  server: '_Server'

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    del format, args

  def _reply(self, status: int, body: str, etag: str | None = None) -> None:
    data = body.encode()
    self.send_response(status)
    self.send_header('Content-Type', 'application/text')
    self.send_header('Metadata-Flavor', 'Google')
    if etag:
      self.send_header('ETag', etag)
    self.send_header('Content-Length', str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def do_GET(self):  # pylint: disable=invalid-name
    url = urllib.parse.urlsplit(self.path)
    if not url.path.startswith(_PREFIX):
      self._reply(404, 'not found')
      return
    if self.headers.get('Metadata-Flavor') != 'Google':
      self._reply(403, 'Missing Metadata-Flavor:Google header.')
      return
    query = dict(urllib.parse.parse_qsl(url.query))
    value, etag = self.server.values.get(
        url.path[len(_PREFIX):], query.get('last_etag'), query.get('wait_for_change') == 'true',
        float(query.get('timeout_sec', 300)))
    self._reply(404 if value is None else 200, value if value is not None else 'not found', etag)

  def do_POST(self):  # pylint: disable=invalid-name
    url = urllib.parse.urlsplit(self.path)
    body = self.rfile.read(int(self.headers.get('Content-Length') or 0)).decode()
    key = dict(urllib.parse.parse_qsl(url.query)).get('key', '')
    if url.path == _CONTROL + 'set':
      self.server.values.set(key, body)
    elif url.path == _CONTROL + 'unset':
      self.server.values.set(key, None)
    else:
      self._reply(404, 'not found')
      return
    self._reply(200, 'ok')


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
  daemon_threads = True
  allow_reuse_address = True

  def __init__(self):
    super().__init__(('127.0.0.1', 0), _Handler)
    self.values = _Values()


class FakeMetadataServer:
  """The server as a child process on 127.0.0.1; `host` is what GCE_METADATA_HOST takes."""

  def __init__(self, workdir: str):
    self.workdir = os.path.abspath(workdir)
    self._proc: subprocess.Popen | None = None
    self.host: str | None = None

  def __enter__(self) -> 'FakeMetadataServer':
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()

  def start(self) -> 'FakeMetadataServer':
    os.makedirs(self.workdir, exist_ok=True)
    ready = os.path.join(self.workdir, 'metadata.port')
    if os.path.exists(ready):
      os.remove(ready)
    self._proc = subprocess.Popen([sys.executable, '-m', 'rigs.fake_metadata', '--ready', ready],
                                  stdin=subprocess.DEVNULL)
    deadline = time.time() + 30
    while not os.path.exists(ready):
      if time.time() > deadline or self._proc.poll() is not None:
        self.stop()
        raise RuntimeError('the fake metadata server did not start')
      time.sleep(0.05)
    with open(ready) as f:
      self.host = f'127.0.0.1:{int(f.read())}'
    return self

  def stop(self) -> None:
    if self._proc is not None and self._proc.poll() is None:
      os.kill(self._proc.pid, signal.SIGTERM)
      self._proc.wait(10)
    self._proc = None

  def set(self, key: str, value: str | None) -> None:
    """Changes a key (None unsets it: 404); long polls waiting on it answer at once."""
    what = 'set' if value is not None else 'unset'
    request = urllib.request.Request(f'http://{self.host}{_CONTROL}{what}?key={urllib.parse.quote(key)}',
                                     data=(value or '').encode(), method='POST')
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10):
      pass


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m rigs.fake_metadata', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--ready', required=True, help='file to write the port to once listening')
  args = parser.parse_args(argv)
  server = _Server()
  with open(args.ready + '.tmp', 'w') as f:
    f.write(str(server.server_address[1]))
  os.replace(args.ready + '.tmp', args.ready)
  process.serve_until_stopped(server)
  return 0


if __name__ == '__main__':
  sys.exit(main())
