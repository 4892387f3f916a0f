"""The fork server's children are processes of their own that begin and end as `python -m MODULE` would:
what the end-to-end tests rely on when they start training processes through it (tests/forkserver.py)."""

import json
import os
import signal

import pytest

from pax_autockpt.tools import process
from tests import forkserver

PROBE = '''
import atexit, json, os, sys, threading, time
mode = sys.argv[1]
print(json.dumps(dict(argv=sys.argv[1:], cwd=os.getcwd(), pid=os.getpid(), sid=os.getsid(0), name=__name__,
                      probe=os.environ.get('PROBE'), path0=sys.path[0])), flush=True)
atexit.register(lambda: open('atexit', 'w').write(mode))
if mode == 'thread':
  threading.Thread(target=lambda: (time.sleep(0.5), open('thread', 'w').write('joined'))).start()
elif mode == 'exit':
  sys.exit(3)
elif mode == 'message':
  sys.exit('a message')
elif mode == 'interrupt':
  raise KeyboardInterrupt
elif mode == 'wait':
  time.sleep(120)
'''


@pytest.fixture
def start(tmp_path):
  """Runs the probe (a module in tmp_path, importable since `-m` puts the working directory first)
  through this worker's server; returns (process, its stdout and stderr so far)."""
  (tmp_path / 'probe.py').write_text(PROBE)
  env = {**os.environ, 'PROBE': 'passed'}
  server = forkserver.server_for(env)

  def run(mode):
    proc = server.start('probe', [mode], env=env, cwd=str(tmp_path), stdout=str(tmp_path / 'out'),
                        stderr=str(tmp_path / 'err'))
    return proc, lambda: (process.text_of(str(tmp_path / 'out')), process.text_of(str(tmp_path / 'err')))
  return run


def test_a_child_has_its_own_pid_session_directory_environment_and_exit_code(start, tmp_path):
  proc, output = start('exit')
  assert proc.wait(60) == 3
  seen = json.loads(output()[0].splitlines()[0])
  assert seen == dict(argv=['exit'], cwd=str(tmp_path), pid=proc.pid, sid=proc.pid, name='__main__',
                      probe='passed', path0=str(tmp_path))
  assert (tmp_path / 'atexit').read_text() == 'exit'


def test_a_child_ends_as_the_interpreter_does(start, tmp_path):
  proc, _ = start('thread')
  assert proc.wait(60) == 0
  assert (tmp_path / 'thread').read_text() == 'joined' and (tmp_path / 'atexit').read_text() == 'thread'
  proc, output = start('message')
  assert proc.wait(60) == 1 and output()[1].endswith('a message\n')
  proc, output = start('interrupt')
  assert proc.wait(60) == -signal.SIGINT and 'KeyboardInterrupt' in output()[1]


def test_a_signal_reaches_the_child_and_its_exit_status_says_so(start):
  proc, output = start('wait')
  process.wait_until(lambda: output()[0], 'the probe to start', 60)
  assert proc.poll() is None
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(60) == -signal.SIGTERM
