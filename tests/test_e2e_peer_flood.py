"""End to end, the peer server strangers cannot exhaust (issue 46): a live 2-host buddy job under
`pax-autockpt launch`, its peer port taken by a stranger, then flooded by one.

`make soak`: the model split over 2 hosts (no replica), the local tier every 0.5 s with buddy copies, and
`--autockpt_local_peer_port` a port this test holds listening (launch gives every host the same one): both
hosts must say so in one line and serve on another port, and both hosts' copies must still come. Then a
stranger's flood (rigs.bench.flood, a process of its own: silent, trickling and huge-headed
connections and GETs without the secret) against host 0's server for FLOOD_SECS: host 0's memory and
descriptors must stay flat, its local commits and host 1's copies of them must keep coming, its log must hold
a summary of the refusals rather than a line each, and a SIGTERM must still end the job 143.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from pax_autockpt import layout
from pax_autockpt.shared import events as events_lib
from pax_autockpt.tools import process
from tests import forkserver

pytestmark = [pytest.mark.e2e, pytest.mark.soak]

EXP = 'experiments.bench.TinyModelParallelAutockpt'
FLOOD_SECS = 20.0
RSS_GROWTH_MB = 20.0  # over the largest RSS of the same span just before the flood
FD_GROWTH = 64  # the server's cap is max(8, 4 x hosts) connections; each one a descriptor at most
_SERVING = re.compile(r'buddy copies: this host keeps host \d+\'s newest local step in .*; serving on ([\d.]+):(\d+)\.')
_REFUSALS = 'request(s) refused or ended early'


def _launch(jobs, tmp_path, job_dir, port):
  job = forkserver.job([sys.executable, '-m', 'pax_autockpt.tools.cli', 'launch', '--num_hosts=2', '--',
                        f'--exp={EXP}', f'--job_log_dir={job_dir}', '--autockpt_notices=off',
                        f'--autockpt_local_dir={tmp_path}/local-{{host}}', '--autockpt_local_min_interval_secs=0.5',
                        '--autockpt_local_buddy', f'--autockpt_local_peer_port={port}'],
                       str(tmp_path / 'job.log'))
  jobs.append(job)
  return job


def _host_pid(job_dir, host):
  starts = [e for e in events_lib.read(job_dir, host) if e['event'] == 'start']
  return starts[-1]['pid'] if starts else None


def _status_kb(pid, field):
  with open(f'/proc/{pid}/status') as f:
    return int(next(line for line in f if line.startswith(f'{field}:')).split()[1])


def _fd_limit(pid):
  with open(f'/proc/{pid}/limits') as f:
    return int(next(line for line in f if line.startswith('Max open files')).split()[3])


def _newest(folder):
  steps = layout.local_committed_steps(folder)
  return steps[-1] if steps else None


def _sample(pid, local):
  """Host 0's RSS (MB) and open descriptors, its newest local commit, and the newest copies each host keeps."""
  return dict(t=time.monotonic(), rss=_status_kb(pid, 'VmRSS') / 1024, fds=len(os.listdir(f'/proc/{pid}/fd')),
              own=_newest(local[0]), kept_by_1=_newest(layout.local_buddy_dir(local[1])),
              kept_by_0=_newest(layout.local_buddy_dir(local[0])))


def _watch(pid, local, until_done, every=0.25):
  """Samples every `every` s until `until_done()` is true."""
  samples = []
  while not until_done():
    samples.append(_sample(pid, local))
    time.sleep(every)
  return samples


def _after(secs):
  end = time.monotonic() + secs
  return lambda: time.monotonic() > end


def _distinct(samples, key):
  return len({s[key] for s in samples if s[key] is not None})


def _started(job, job_dir, local, port):
  """Both hosts told the port was taken and serve elsewhere, and both hold a buddy copy: host 0's address."""
  logs = [os.fspath(layout.host_log_path(job_dir, h)) for h in (0, 1)]
  for log in logs:
    process.wait_until(lambda p=log: _SERVING.search(process.text_of(p)), f'the serving line in {log}', 600, 0.5, job)
  process.wait_until(lambda: all(_newest(layout.local_buddy_dir(f)) for f in local), 'a buddy copy on each host',
                     300, 0.2, job)
  for log in logs:
    text = process.text_of(log)
    assert text.count(f'peer transfer: port {port} is not free') == 1, text[-3000:]
    assert int(_SERVING.search(text).group(2)) != port
  return _SERVING.search(process.text_of(logs[0])).group(1, 2)


def test_a_stranger_on_the_peer_port_then_a_flood_leave_a_live_buddy_job_training_and_copying(jobs, tmp_path):
  job_dir = str(tmp_path / 'job')
  local = [tmp_path / f'local-{h}' for h in (0, 1)]
  with socket.socket() as holder:  # a stranger on the port every host is given
    holder.bind(('127.0.0.1', 0))
    holder.listen()
    port = holder.getsockname()[1]
    job = _launch(jobs, tmp_path, job_dir, port)
    host, served = _started(job, job_dir, local, port)
    pid = process.wait_until(lambda: _host_pid(job_dir, 0), 'host 0\'s start event', 30, 0.2)
    before = _watch(pid, local, _after(10))
    log0 = os.fspath(layout.host_log_path(job_dir, 0))
    since = os.path.getsize(log0)
    flood = subprocess.Popen([sys.executable, '-m', 'rigs.bench.flood', host, served, str(FLOOD_SECS)],
                             stdout=subprocess.PIPE, text=True)
    during = _watch(pid, local, lambda: flood.poll() is not None)
    counts = json.loads(flood.stdout.read().strip().splitlines()[-1])
    after = _watch(pid, local, _after(5))
  _report(before, during, counts, _fd_limit(pid))
  _assert_flooded(counts)
  _assert_unharmed(before, during, after, _fd_limit(pid))
  lines = [line for line in process.text_of(log0, since).splitlines() if 'peer transfer' in line]
  assert 1 <= len(lines) <= 2 and all(_REFUSALS in line for line in lines), (len(lines), lines[:3])  # a summary
  job.send(signal.SIGTERM)
  assert job.wait(300) == 143, job.log()[-3000:]
  for h in (0, 1):
    assert f'[launch] host {h} exit code 143' in job.log(), job.log()[-3000:]


def _report(before, during, counts, limit):
  print(f'\nflood counts: {counts}')
  print(f'host 0 RSS before {max(s["rss"] for s in before):.1f} MB, during max {max(s["rss"] for s in during):.1f} '
        f'MB; fds before max {max(s["fds"] for s in before)}, during max {max(s["fds"] for s in during)} '
        f'(limit {limit})')
  for name, samples in (('before', before), ('during', during)):
    secs = samples[-1]['t'] - samples[0]['t']
    print(f'{name} ({secs:.1f} s): host 0 local commits seen {_distinct(samples, "own")}, host 1\'s copies of host '
          f'0\'s {_distinct(samples, "kept_by_1")}, host 0\'s copies of host 1\'s {_distinct(samples, "kept_by_0")}')


def _assert_flooded(counts):
  """The flood reached the server and its bounds acted: strangers evicted, huge heads cut, GETs refused."""
  assert counts.get('silent_opened', 0) > 100 and counts.get('silent_closed_by_server', 0) > 50, counts
  assert counts.get('trickle_closed_by_server', 0) > 0, counts
  assert counts.get('huge_closed_by_server', 0) > 0 and not counts.get('huge_sent_whole'), counts
  assert counts.get('get_403', 0) > 0 and not counts.get('get_200') and not counts.get('get_404'), counts


def _assert_unharmed(before, during, after, limit):
  """Memory and descriptors flat; commits and both hosts' copies kept coming during the flood."""
  rss, fds = [max(s['rss'] for s in during) - max(s['rss'] for s in before),
               max(s['fds'] for s in during) - max(s['fds'] for s in before)]
  assert rss <= RSS_GROWTH_MB, f'host 0\'s RSS grew {rss:.1f} MB during the flood'
  assert fds <= FD_GROWTH and max(s['fds'] for s in during) < limit / 4, f'host 0 opened {fds} more descriptors'
  assert _distinct(during, 'own') >= 5, during
  assert _distinct(during, 'kept_by_1') >= 3, during  # fetched from the flooded server
  assert _distinct(during, 'kept_by_0') >= 3, during
  assert after[-1]['own'] > during[-1]['own'] or _distinct(after, 'own') >= 2, after
