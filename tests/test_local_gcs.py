"""`python -m pax_autockpt.tools.local_gcs serve` stops its server and proxy on SIGTERM too (not only
on Ctrl-C), and in the background, where a shell starts it with SIGINT ignored."""

import os
import signal
import subprocess
import sys

from pax_autockpt.tools import process


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
  serve = process.Job([sys.executable, '-m', 'pax_autockpt.tools.local_gcs', 'serve', '--workdir',
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
  out = subprocess.run(['bash', '-c', f'{sys.executable} -m pax_autockpt.tools.local_gcs serve --workdir '
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
