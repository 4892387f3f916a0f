"""A stranger's flood against a peer server (pax_autockpt.local.peer), for a test and the bench (issue 46).

  python -m rigs.bench.flood HOST PORT SECONDS [--nice N]

For SECONDS it keeps open as many as it can of: connections that sent one byte and then nothing; connections
trickling one byte every TRICKLE_SECS (a request head that never ends); connections sending a head of HUGE_MB
without the secret; and plain GETs without the secret, one after another. Then one JSON line of counts:
connections opened, closed by the server, answers by status, bytes of huge heads sent. It is a process of its
own so that the flood's CPU is not the flooded process's, at nice 10 by default (the server's threads' default
background nice): it stands in for another machine, so it should take as little of this one as the server
does answering it. At most SILENT + TRICKLING + HUGE + GETS (255) sockets, one thread per kind of attack.
"""

import argparse
import collections
import http.client
import json
import os
import select
import socket
import sys
import threading
import time

SILENT, TRICKLING, HUGE, GETS = 150, 100, 2, 3  # sockets held at once per kind (<= 300 in all)
TRICKLE_SECS = 3.0
HUGE_MB = 4
CONNECT_SECS = 2.0  # a connect the server's backlog does not take in time counts as refused
_HEAD = b'GET /v1/steps/1/index.json HTTP/1.1\r\nHost: x\r\nX-Padding: '


class Counts:
  """Counters shared by the attack threads."""

  def __init__(self):
    self._lock, self.values = threading.Lock(), collections.Counter()

  def add(self, key: str, n: int = 1) -> None:
    with self._lock:
      self.values[key] += n


def _connect(address: tuple[str, int], counts: Counts, kind: str) -> socket.socket | None:
  try:
    sock = socket.create_connection(address, timeout=CONNECT_SECS)
  except OSError:
    counts.add(f'{kind}_connect_failed')
    return None
  counts.add(f'{kind}_opened')
  return sock


def _hold(address: tuple[str, int], until: float, counts: Counts, kind: str, limit: int,
          every: float | None) -> None:
  """Keeps up to `limit` connections open that sent one byte, each one more byte every `every` s (None: never);
  one the server closes (readable: EOF or a reset) is counted and opened again."""
  held: dict[socket.socket, float] = {}
  while time.monotonic() < until:
    while len(held) < limit and time.monotonic() < until:
      sock = _connect(address, counts, kind)
      if sock is None or not _send(sock, b'G', held, counts, kind):
        time.sleep(0.05)
        break
      held[sock] = time.monotonic() + (every or float('inf'))
    readable = select.select(list(held), [], [], 0.1)[0] if held else []
    for sock in readable:
      _drop(sock, held, counts, kind)
    now = time.monotonic()
    for sock in [s for s, due in held.items() if due <= now]:
      if _send(sock, b'a', held, counts, kind):
        held[sock] = now + every
  for sock in held:
    sock.close()


def _send(sock: socket.socket, data: bytes, held: dict, counts: Counts, kind: str) -> bool:
  try:
    sock.sendall(data)
    return True
  except OSError:
    _drop(sock, held, counts, kind)
    return False


def _drop(sock: socket.socket, held: dict, counts: Counts, kind: str) -> None:
  held.pop(sock, None)
  sock.close()
  counts.add(f'{kind}_closed_by_server')


def _huge(address: tuple[str, int], until: float, counts: Counts) -> None:
  """One connection after another, each sending a head of HUGE_MB that never shows the secret."""
  chunk = b'a' * 65536
  while time.monotonic() < until:
    sock = _connect(address, counts, 'huge')
    if sock is None:
      time.sleep(0.05)
      continue
    sent = 0
    try:
      sock.sendall(_HEAD)
      while sent < HUGE_MB << 20 and time.monotonic() < until:
        sock.sendall(chunk)
        sent += len(chunk)
      counts.add('huge_sent_whole' if sent >= HUGE_MB << 20 else 'huge_cut_by_the_end')
    except OSError:
      counts.add('huge_closed_by_server')
    finally:
      counts.add('huge_bytes_sent', sent)
      sock.close()


def _gets(address: tuple[str, int], until: float, counts: Counts) -> None:
  """Plain GETs without the secret, one after another: counted by the answer's status."""
  while time.monotonic() < until:
    connection = http.client.HTTPConnection(*address, timeout=5)
    counts.add('get_sent')
    try:
      connection.request('GET', '/v1/steps/1/index.json')
      response = connection.getresponse()
      response.read()
      counts.add(f'get_{response.status}')
    except (OSError, http.client.HTTPException):
      counts.add('get_failed')
      time.sleep(0.05)
    finally:
      connection.close()


def flood(host: str, port: int, seconds: float) -> dict[str, int]:
  """Every attack at once for `seconds`; the counts."""
  address, until, counts = (host, port), time.monotonic() + seconds, Counts()
  threads = [threading.Thread(target=_hold, args=(address, until, counts, 'silent', SILENT, None)),
             threading.Thread(target=_hold, args=(address, until, counts, 'trickle', TRICKLING, TRICKLE_SECS))]
  threads += [threading.Thread(target=_huge, args=(address, until, counts)) for _ in range(HUGE)]
  threads += [threading.Thread(target=_gets, args=(address, until, counts)) for _ in range(GETS)]
  for thread in threads:
    thread.daemon = True
    thread.start()
  for thread in threads:
    thread.join(seconds + 30)
  return dict(sorted(counts.values.items()))


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m rigs.bench.flood', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('host')
  parser.add_argument('port', type=int)
  parser.add_argument('seconds', type=float)
  parser.add_argument('--nice', type=int, default=10, help='this process\'s nice value (0: as training)')
  args = parser.parse_args(argv)
  if args.nice > 0:
    os.nice(args.nice)
  print(json.dumps(flood(args.host, args.port, args.seconds)), flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main())
