"""`python -m rigs.local_gcs serve` stops its server and proxy on SIGTERM too (not only
on Ctrl-C), and in the background, where a shell starts it with SIGINT ignored."""

import os
import signal
import subprocess
import sys

from pax_autockpt.tools import process
from rigs import local_gcs


def _children(pid: int) -> list[int]:
  with open(f'/proc/{pid}/task/{pid}/children') as f:
    return [int(x) for x in f.read().split()]


def _alive(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().split()[2] != 'Z'
  except FileNotFoundError:
    return False


def test_serve_stops_server_and_proxy_on_sigterm_even_with_sigint_ignored(tmp_path):
  log = str(tmp_path / 'serve.log')
  serve = process.Job([sys.executable, '-m', 'rigs.local_gcs', 'serve', '--workdir',
                       str(tmp_path / 'gcs')], log,
                      env={**os.environ, 'PYTHONUNBUFFERED': '1'})
  try:
    serve.wait_for_log(r'# bucket: gs://', timeout=60)
    children = _children(serve.pid)
    assert len(children) == 2, children  # fake-gcs-server and the proxy
    serve.send(signal.SIGTERM)
    assert serve.wait(30) == 0, serve.log()[-2000:]
    process.wait_until(lambda: not any(_alive(c) for c in children), 'server and proxy gone', 15)
  finally:
    serve.kill()


def test_serve_in_the_background_of_a_shell_stops_on_sigterm(tmp_path):
  """`cmd &` in a non-interactive shell starts it with SIGINT ignored: SIGTERM must still stop it."""
  out = subprocess.run(['bash', '-c', f'{sys.executable} -m rigs.local_gcs serve --workdir '
                        f'{tmp_path}/gcs > {tmp_path}/bg.log 2>&1 & echo $!'], capture_output=True, text=True)
  pid = int(out.stdout.strip())
  try:
    process.wait_until(lambda: '# bucket' in process.text_of(f'{tmp_path}/bg.log'), 'serving', 60)
    children = _children(pid)
    os.kill(pid, signal.SIGTERM)
    process.wait_until(lambda: not _alive(pid) and not any(_alive(c) for c in children), 'all stopped', 30)
  finally:
    for p in [pid, *([] if not _alive(pid) else _children(pid))]:
      if _alive(p):
        os.kill(p, signal.SIGKILL)


def test_a_status_query_of_an_upload_whose_data_never_arrived_is_answered_as_gcs_does(tmp_path):
  """GCS answers 308 (nothing received) and keeps no object; fake-gcs-server alone completed the object
  with 0 bytes (measured: 200, size 0), so a client whose data request failed took the upload for done."""
  import http.client  # pylint: disable=g-import-not-at-top
  import urllib.parse  # pylint: disable=g-import-not-at-top
  with local_gcs.LocalGCS(str(tmp_path / 'gcs')) as gcs:
    netloc = urllib.parse.urlsplit(gcs.http_url).netloc

    def request(method, path, body=b'', headers=None):
      conn = http.client.HTTPConnection(netloc, timeout=30)
      conn.request(method, path, body=body, headers={'Content-Length': str(len(body)), **(headers or {})})
      resp = conn.getresponse()
      out = resp.status, dict(resp.getheaders()), resp.read()
      conn.close()
      return out

    def session(name):
      _, headers, _ = request('POST', f'/upload/storage/v1/b/{gcs.bucket}/o?uploadType=resumable&name={name}')
      where = urllib.parse.urlsplit(headers.get('Location') or headers['location'])
      return f'{where.path}?{where.query}'

    lost = session('lost.json')  # its data request failed before reaching the server
    assert request('PUT', lost, headers={'Content-Range': 'bytes */13'})[0] == 308
    assert request('GET', f'/storage/v1/b/{gcs.bucket}/o/lost.json')[0] == 404
    assert request('PUT', lost, b'{"step": 123}', {'Content-Range': 'bytes 0-12/13'})[0] == 200  # the retry
    sent = session('sent.json')
    assert request('PUT', sent, b'{"step": 123}', {'Content-Range': 'bytes 0-12/13'})[0] == 200
    assert gcs.read('lost.json') == gcs.read('sent.json') == b'{"step": 123}'
