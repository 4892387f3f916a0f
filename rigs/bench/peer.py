"""Bench scenario `peertransfer_<size>`: a committed local step streamed between two local hosts (issue 39).

The donor is one process serving the step with pax_autockpt.local.peer.PeerServer on 127.0.0.1, the receiver
another running its fetch_step into an empty folder (HTTP, each shard's xxh3 checked, the commit's
rename); against, in alternation, a raw loopback socket copy of the same shards file: a sender process
(socket.sendfile) and a receiver process writing it to a file in the same folder, fsynced. Each receiver
times itself from the start of the transfer to its end (the commit, or the fsync) and reports it on stdout;
each of the four processes reports its peak RSS growth during the transfer (VmHWM, reset just before it,
minus VmRSS then).

The state: a synthetic local step of the bytes the bench's Medium / Large states hold raw (500 / 2,660 MB:
the raw-chunk on-demand saves of MediumAutockpt / LargeAutockpt in bench/results.json), a few float32 arrays
of up to 256 MB, written by pax_autockpt.local.format's write_part + commit in the bench's work folder (the disk
a local tier would use here).

The processes' side, run by the scenario (one JSON line each on stdout):

  python -m rigs.bench.peer donor FOLDER SECRET   # prints its port; a stdin line stops it
  python -m rigs.bench.peer fetch PORT SECRET STEP FOLDER
  python -m rigs.bench.peer rawsend FILE          # prints its port; a stdin line stops it
  python -m rigs.bench.peer rawfetch PORT FILE
"""

import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import time

from rigs.bench import measure
from rigs.bench.measure import Figure
from rigs.bench.measure import Storage

SIZES = {'Medium': 500_000_000, 'Large': 2_660_000_000}  # bytes of the state, raw (see the module's docstring)
STEP = 1000
TARGET_RATIO = 0.5  # ours >= x0.5 the raw copy's MB/s
TARGET_RSS_MB = 256.0  # each side's peak RSS growth during a transfer
_ARRAY_BYTES = 256 << 20
_BUFFER = 1 << 20


# --- the processes' side ---------------------------------------------------------------------------


class _Peak:
  """A process's peak RSS growth from now: the high-water mark reset (/proc/self/clear_refs) and read back
  after; where the reset is refused, ru_maxrss's growth (a lower bound when an earlier peak was higher)."""

  def __init__(self):
    self._reset = True
    try:
      with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')
    except OSError:
      self._reset = False
    self._rss_kb = _status_kb('VmRSS') if self._reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

  def growth_mb(self) -> float:
    peak = _status_kb('VmHWM') if self._reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max(0, peak - self._rss_kb) * 1024 / 1e6


def _status_kb(field: str) -> int:
  with open('/proc/self/status') as f:
    return int(re.search(field + r':\s+(\d+) kB', f.read()).group(1))


def _say(**fields) -> None:
  print(json.dumps(fields), flush=True)


def _donor(folder: str, secret: str) -> None:
  from pax_autockpt import layout  # pylint: disable=g-import-not-at-top
  from pax_autockpt.local import peer  # pylint: disable=g-import-not-at-top
  offered = lambda step: layout.local_step_dir(folder, step) if step in layout.local_committed_steps(folder) else None
  with peer.PeerServer(offered, secret) as server:
    peak = _Peak()
    _say(port=server.address[1])
    sys.stdin.readline()  # the receiver is done
    _say(rss_growth_mb=peak.growth_mb())


def _fetch(port: int, secret: str, step: int, folder: str) -> None:
  from pax_autockpt import layout  # pylint: disable=g-import-not-at-top
  from pax_autockpt.local import peer  # pylint: disable=g-import-not-at-top
  peak = _Peak()
  start = time.perf_counter()
  got = peer.fetch_step(('127.0.0.1', port), secret, step, folder)
  secs = time.perf_counter() - start
  _say(secs=secs, bytes=os.path.getsize(got / layout.LOCAL_SHARDS), rss_growth_mb=peak.growth_mb())


def _rawsend(path: str) -> None:
  with socket.create_server(('127.0.0.1', 0)) as listener:
    peak = _Peak()
    _say(port=listener.getsockname()[1])
    connection, _ = listener.accept()
    with connection, open(path, 'rb') as f:
      connection.sendfile(f)
    sys.stdin.readline()
    _say(rss_growth_mb=peak.growth_mb())


def _rawfetch(port: int, path: str) -> None:
  peak = _Peak()
  view = memoryview(bytearray(_BUFFER))
  start = time.perf_counter()
  size = 0
  with socket.create_connection(('127.0.0.1', port)) as connection, open(path, 'wb') as f:
    while n := connection.recv_into(view):
      f.write(view[:n])
      size += n
    f.flush()
    os.fsync(f.fileno())
  secs = time.perf_counter() - start
  _say(secs=secs, bytes=size, rss_growth_mb=peak.growth_mb())


def main(argv: list[str] | None = None) -> int:
  what, *args = sys.argv[1:] if argv is None else argv
  if what == 'donor':
    _donor(args[0], args[1])
  elif what == 'fetch':
    _fetch(int(args[0]), args[1], int(args[2]), args[3])
  elif what == 'rawsend':
    _rawsend(args[0])
  elif what == 'rawfetch':
    _rawfetch(int(args[0]), args[1])
  else:
    raise SystemExit(f'usage: {__doc__}')
  return 0


# --- the scenario ----------------------------------------------------------------------------------


def _synthetic_step(folder: str, nbytes: int) -> str:
  """A committed local step of `nbytes` of float32 arrays (up to 256 MB each, each a different slice of one
  random buffer: distinct bytes, one buffer in memory); returns its shards file."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  from pax_autockpt import layout  # pylint: disable=g-import-not-at-top
  from pax_autockpt.local import format as local_format  # pylint: disable=g-import-not-at-top
  from pax_autockpt.local import lineage as lineage_lib  # pylint: disable=g-import-not-at-top
  count = -(-nbytes // _ARRAY_BYTES)
  base = np.random.default_rng(0).standard_normal(_ARRAY_BYTES // 4 + count * 1024, dtype=np.float32)
  arrays, left = {}, nbytes // 4
  for i in range(count):
    n = min(left, _ARRAY_BYTES // 4)
    arrays[f'params.w{i}'] = ((n,), 'float32', {f'0:{n}': base[i * 1024:i * 1024 + n]})
    left -= n
  snapshot = local_format.Snapshot(arrays, input_state=None)
  partial, found = local_format.write_part(folder, STEP, snapshot)
  index = local_format.index(STEP, 0, 2, local_format.fingerprint_of(snapshot), found, {0: None, 1: None}, time.time(),
                             lineage_lib.Lineage('bench', 'peertransfer', base=None))
  return os.fspath(local_format.commit(partial, index) / layout.LOCAL_SHARDS)


def _start(*args: str) -> tuple[subprocess.Popen, dict]:
  """A serving process (donor or raw sender) and the port it printed."""
  proc = subprocess.Popen([sys.executable, '-m', 'rigs.bench.peer', *args], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
  line = proc.stdout.readline()
  if not line:
    proc.kill()
    raise RuntimeError(f'{args[0]} exited {proc.wait()} before printing its port')
  return proc, json.loads(line)


def _transfer(serve: tuple[str, ...], fetch: tuple[str, ...]) -> dict:
  """One transfer: the serving process started, the receiving one run to its end; both sides' figures."""
  server, port = _start(*serve)
  try:
    got = subprocess.run([sys.executable, '-m', 'rigs.bench.peer', fetch[0], str(port['port']),
                          *fetch[1:]], capture_output=True, text=True, timeout=600)
    if got.returncode:
      raise RuntimeError(f'{fetch[0]} exited {got.returncode}: {got.stderr[-2000:]}')
    out, _ = server.communicate('done\n', timeout=60)
  finally:
    server.kill()
  received = json.loads(got.stdout.strip().splitlines()[-1])
  return dict(received, sender_rss_mb=json.loads(out.strip().splitlines()[-1])['rss_growth_mb'])


def peer_transfer(storage: Storage, size: str, pairs: int) -> list[Figure]:
  """The local step streamed donor -> receiver (separate processes, 127.0.0.1) against a raw loopback socket
  copy + fsync of the same shards file, alternating; each side's peak RSS growth during our transfer."""
  from pax_autockpt.local import peer as peer_lib  # pylint: disable=g-import-not-at-top
  nbytes = SIZES[size]
  donor = os.path.join(storage.workdir, f'peer-{size}-donor')
  shards = _synthetic_step(donor, nbytes)
  assert os.path.getsize(shards) == nbytes, (shards, os.path.getsize(shards), nbytes)
  secret = peer_lib.new_secret()
  ours, raw = [], []
  try:
    for i in range(pairs):
      folder = os.path.join(storage.workdir, f'peer-{size}-receiver-{i}')
      os.makedirs(folder)
      ours.append(_transfer(('donor', donor, secret), ('fetch', secret, str(STEP), folder)))
      raw.append(_transfer(('rawsend', shards), ('rawfetch', os.path.join(folder, 'raw.bin'))))
      shutil.rmtree(folder)
      for label, got in (('peer transfer', ours[-1]), ('raw socket copy', raw[-1])):
        if got['bytes'] != nbytes:
          raise RuntimeError(f'{label} #{i}: {got["bytes"]} bytes received of {nbytes}')
      measure.say(f'peertransfer {size} #{i}: ours {ours[-1]["secs"]:.2f} s ({nbytes / 1e6 / ours[-1]["secs"]:.0f} '
                  f'MB/s), raw {raw[-1]["secs"]:.2f} s ({nbytes / 1e6 / raw[-1]["secs"]:.0f} MB/s); RSS growth '
                  f'donor {ours[-1]["sender_rss_mb"]:.1f} MB, receiver {ours[-1]["rss_growth_mb"]:.1f} MB, raw '
                  f'sender {raw[-1]["sender_rss_mb"]:.1f} MB, raw receiver {raw[-1]["rss_growth_mb"]:.1f} MB')
  finally:
    shutil.rmtree(donor, ignore_errors=True)
  mbps = lambda runs: [nbytes / 1e6 / r['secs'] for r in runs]
  where = f'{size} ({nbytes / 1e6:.0f} MB), 2 local processes on 127.0.0.1, {storage.name} disk'
  base = 'raw loopback socket copy + fsync'
  return [
      Figure(f'peer transfer (HTTP, xxh3 checked, committed) vs {base} of the same bytes, {where} '
             f'(target >= x{TARGET_RATIO:g})', 'MB/s', mbps(ours), mbps(raw), base),
      Figure(f'peer transfer start of fetch -> commit, {where}', 's', [r['secs'] for r in ours]),
      Figure(f'donor peak RSS growth during a transfer, {where} (target <= {TARGET_RSS_MB:.0f} MB)', 'MB',
             [r['sender_rss_mb'] for r in ours]),
      Figure(f'receiver peak RSS growth during a transfer, {where} (target <= {TARGET_RSS_MB:.0f} MB)', 'MB',
             [r['rss_growth_mb'] for r in ours]),
  ]


if __name__ == '__main__':
  sys.exit(main())
