"""Peer serving that cannot die or be reached wrongly (issue 46): the buddy copies' and the fill's servers on
a taken port, a server that cannot start published at once, a copying thread that outlives any failure, and
the address a host serves on. Real servers on 127.0.0.1; the coordination service is an in-process dict."""

import errno
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from pax_autockpt import layout
from pax_autockpt.hosts import hosts as hosts_lib
from pax_autockpt.local import buddy
from pax_autockpt.local import format as local_format
from pax_autockpt.local import lineage as lineage_lib
from pax_autockpt.local import peer
from pax_autockpt.local import restoring
from pax_autockpt.shared import coordination
from tests import test_peer_transfer as transfer

ELSEWHERE = '203.0.113.7'  # a documentation address: never this machine's, so no server binds it


class _Service:
  """The coordination service's key-value calls, in this process (a key is set once, as in JAX's)."""

  def __init__(self):
    self.values, self._cond = {}, threading.Condition()

  def key_value_set(self, key, value):
    with self._cond:
      if key in self.values:
        raise RuntimeError(f'ALREADY_EXISTS: {key}')
      self.values[key] = value
      self._cond.notify_all()

  def blocking_key_value_get(self, key, timeout_ms):
    with self._cond:
      if not self._cond.wait_for(lambda: key in self.values, timeout_ms / 1000):
        raise TimeoutError(f'DEADLINE_EXCEEDED: {key}')
      return self.values[key]

  def key_value_dir_get(self, folder):
    with self._cond:
      return [(k, v) for k, v in self.values.items() if k.startswith(folder)]


@pytest.fixture
def service(monkeypatch):
  found = _Service()
  monkeypatch.setattr(coordination, 'client', lambda: found)
  return found


@pytest.fixture
def hosts(tmp_path, service):  # pylint: disable=unused-argument  (the copies read the service at their start)
  """make(host, **kwargs): one host's BuddyCopies of a 2-host job, each with its own step 5 committed; their
  servers are stopped after the test (the copying threads are daemons, as in a run)."""
  made = []

  def make(host, address='127.0.0.1', port=0):
    transfer._donor(tmp_path / f'host{host}', 5)  # pylint: disable=protected-access
    made.append(buddy.BuddyCopies(tmp_path / f'host{host}', host=host, hosts=2, slices=1, mb_per_sec=1000.0,
                                  nice=0, address=address, port=port))
    return made[-1]

  yield make
  for copies in made:
    if copies._server is not None:  # pylint: disable=protected-access
      copies._server.stop()  # pylint: disable=protected-access


def _eventually(predicate, wait=10.0):
  deadline = time.monotonic() + wait
  while not predicate() and time.monotonic() < deadline:
    time.sleep(0.05)
  return predicate()


def _messages(caplog, text):
  return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_taken_peer_port_under_launch_leaves_every_hosts_buddy_copies_working(hosts, caplog):
  """`launch` gives every local host the same --autockpt_local_peer_port: here another process holds it, and
  the OSError used to end each host's copying thread for the whole run."""
  with socket.socket() as holder:
    holder.bind(('127.0.0.1', 0))
    holder.listen()
    port = holder.getsockname()[1]
    copies = [hosts(h, port=port) for h in range(2)]
    for c in copies:
      c.committed(5)
    assert _eventually(lambda: all(layout.local_committed_steps(c.kept) == [5] for c in copies))
  assert all(c.serving and c._thread.is_alive() for c in copies)  # pylint: disable=protected-access
  assert len(_messages(caplog, f'port {port} is not free')) == 2


def test_a_buddy_server_that_cannot_start_is_published_at_once_and_copying_goes_on(hosts, service, caplog):
  """Host 0 cannot bind its address: its keeper (host 1) learns it at once through the key the address would
  be under (it waited ADDRESS_WAIT_MS, 60 s, for an address that never came), and host 0 still keeps host 1's
  copy; the thread lives on and the fields say what is wrong."""
  copies = [hosts(0, address=ELSEWHERE), hosts(1)]
  for c in copies:
    c.committed(5)
  assert _eventually(lambda: copies[1].copy_error is not None, wait=5.0)
  assert 'host 0 serves no copies: OSError' in copies[1].copy_error
  assert json.loads(service.values['autockpt/buddy/0'])['error'].startswith('OSError')
  assert _eventually(lambda: layout.local_committed_steps(copies[0].kept) == [5])
  assert not copies[0].serving and copies[0].server_error.startswith('OSError')
  assert copies[0]._thread.is_alive() and copies[1]._thread.is_alive()  # pylint: disable=protected-access
  assert len(_messages(caplog, 'this host cannot serve its local steps')) == 1


def test_the_copying_thread_outlives_an_unexpected_error_and_the_next_commit_is_copied(
    hosts, tmp_path, monkeypatch, caplog):
  """Any error outside the fetch (here the prune after the first copy) ended the thread silently: no later
  commit was copied."""
  prune = buddy.BuddyCopies._prune  # pylint: disable=protected-access

  def failing_once(self, newest):
    if newest == 5:
      raise RuntimeError('a disk that went away')
    prune(self, newest)

  monkeypatch.setattr(buddy.BuddyCopies, '_prune', failing_once)
  copies = [hosts(h) for h in range(2)]
  for c in copies:
    c.committed(5)
  assert _eventually(lambda: copies[1].copy_error is not None)
  assert 'RuntimeError: a disk that went away' in copies[1].copy_error
  transfer._donor(tmp_path / 'host0', 6)  # pylint: disable=protected-access
  for c in copies:
    c.committed(6)
  assert _eventually(lambda: 6 in layout.local_committed_steps(copies[1].kept))
  assert _eventually(lambda: copies[1].copy_error is None)
  assert _messages(caplog, 'failed (RuntimeError: a disk that went away); the next commit tries again')


def test_a_fill_server_that_cannot_start_is_published_at_once_and_its_receiver_moves_on(
    tmp_path, service, monkeypatch):
  """The donor's error reached the `done` report, but its receiver waited the fill's 10 minutes for the
  address first."""
  monkeypatch.setattr(hosts_lib, 'own_address', lambda coordinator: ELSEWHERE)  # where restoring calls it
  transfer._donor(tmp_path / 'donor', 5)  # pylint: disable=protected-access
  donor = restoring.LocalRestore(tmp_path / 'donor', host=0, hosts=2)
  with pytest.raises(OSError):
    donor._serve(service, 'fill/1/5/0/0/', 5, False)  # pylint: disable=protected-access
  assert json.loads(service.values['fill/1/5/0/0/peer'])['error'].startswith('OSError')
  receiver = restoring.LocalRestore(tmp_path / 'receiver', host=1, hosts=2)
  with pytest.raises(peer.PeerUnavailable, match='host 0 cannot serve its copy: OSError'):
    receiver._receive(service, 'fill/1/5/', 5, ((0, False),))  # pylint: disable=protected-access


def test_a_donor_that_cannot_serve_sends_its_receiver_to_the_next_source_in_turn(tmp_path, service):
  """`_in_turn` read a published error as an address; now it is one more donor that did not serve."""
  donor = transfer._donor(tmp_path / 'keeper', 5)  # pylint: disable=protected-access
  service.key_value_set('fill/1/5/0/0/peer', json.dumps({'error': 'OSError: [Errno 99] not available'}))
  with peer.PeerServer(lambda s: donor if s == 5 else None, transfer.SECRET) as keeper:
    service.key_value_set('fill/1/5/2/1/peer', json.dumps({'address': list(keeper.address),
                                                           'secret': transfer.SECRET}))
    receiver = restoring.LocalRestore(tmp_path / 'receiver', host=1, hosts=3)
    path, used = receiver._in_turn(service, 'fill/1/5/', 5, [(0, False), (2, True)],  # pylint: disable=protected-access
                                   peer.PeerUnavailable('the parallel attempt'))
  assert used == [(2, True)]
  transfer._same_files(donor, path)  # pylint: disable=protected-access


# --- the address a host serves on ----------------------------------------------------------------------


def _routes(monkeypatch, routes):
  """hosts.own_address's view: a datagram to host `h` leaving from `routes[h]` (`routes['*']`: the default
  route; no entry: unreachable). No packet is sent either way."""

  class Probe:

    def __init__(self, *unused):
      self.source = None

    def __enter__(self):
      return self

    def __exit__(self, *unused):
      pass

    def connect(self, address):
      self.source = routes.get(address[0], routes.get('*'))
      if self.source is None:
        raise OSError(errno.ENETUNREACH, 'Network is unreachable')

    def getsockname(self):
      return self.source, 40000

  monkeypatch.setattr(hosts_lib.socket, 'socket', Probe)


def test_host_0_whose_name_maps_to_loopback_serves_on_its_outward_address(monkeypatch, caplog):
  """Debian's /etc/hosts maps the machine's own name to 127.0.1.1: where the coordinator is host 0's name,
  its route to it is loopback, and its servers bound an address no other machine reaches."""
  _routes(monkeypatch, {'node-0': '127.0.1.1', '*': '10.0.0.5'})
  assert hosts_lib.own_address('node-0:1234') == '10.0.0.5'
  _routes(monkeypatch, {'node-0': '127.0.1.1'})  # no other route: loopback, said in a line
  assert hosts_lib.own_address('node-0:1234') == '127.0.0.1'
  assert len(_messages(caplog, 'which no other machine reaches')) == 1


def test_other_hosts_and_single_machine_jobs_keep_their_address(monkeypatch, caplog):
  _routes(monkeypatch, {'node-0': '10.0.0.1', '*': '192.168.9.9'})
  assert hosts_lib.own_address('node-0:1234') == '10.0.0.1'  # the interface toward the coordinator, not the default
  monkeypatch.undo()
  for coordinator in ('127.0.0.1:1234', 'localhost:1234', '', None):  # `launch`: every host on this machine
    assert hosts_lib.own_address(coordinator) == '127.0.0.1'
  assert not _messages(caplog, 'no other machine')


# --- issue 57: buddy/ within two shares, and another job's copies left alone --------------------------------


def test_buddy_dir_holds_the_newest_copy_and_the_one_in_flight_only_and_never_another_jobs(tmp_path, service):
  """Before a fetch every other `.partial` goes: a copy that failed (step 3) and one a previous run left above this
  run's numbers (step 99) used to stay beside the copy in flight and the newest copy, three shares or more where
  the docs give two. Another job's copy (job-b's step 4) is that job's, and stays."""
  copies = [buddy.BuddyCopies(tmp_path / f'host{h}', host=h, hosts=2, slices=1, mb_per_sec=1000.0, nice=0,
                              address='127.0.0.1', job='job-a') for h in range(2)]
  try:
    transfer._donor(tmp_path / 'host0', 5)  # pylint: disable=protected-access
    transfer._donor(tmp_path / 'host1', 5)  # pylint: disable=protected-access
    kept = copies[1].kept
    for stale in (3, 99):
      layout.local_partial_dir(kept, stale).mkdir(parents=True)
    transfer._donor(kept, 4)  # pylint: disable=protected-access
    shutil.copytree(layout.local_step_dir(kept, 4), layout.local_step_dir(kept, 2))  # job-a's older copy
    other = transfer._donor(tmp_path / 'other', 4)  # pylint: disable=protected-access
    index = local_format.read_index(other)
    index['lineage'] = lineage_lib.Lineage('job-b', 'run-9', base=None).to_json()
    partial = layout.local_partial_dir(tmp_path / 'other', 4)
    other.rename(partial)
    shutil.rmtree(layout.local_step_dir(kept, 4))
    shutil.copytree(local_format.commit(partial, index), layout.local_step_dir(kept, 4))
    for c in copies:
      c.committed(5)
    assert _eventually(lambda: 5 in layout.local_committed_steps(kept))
    assert _eventually(lambda: sorted(p.name for p in kept.iterdir()) == ['step_00000004', 'step_00000005'])
    assert local_format.job_of(layout.local_step_dir(kept, 4))[0] == 'job-b'
  finally:
    for c in copies:
      if c._server is not None:  # pylint: disable=protected-access
        c._server.stop()  # pylint: disable=protected-access


# --- issue 57: a prompt peer is never evicted, the cap counts every open connection, a receiver retries ----------


def _served_sockets_open(port):
  """The server's accepted connections open in this process now, as the kernel lists them (not the gate's count):
  this process's socket descriptors whose TCP entry has local port `port` and is not the listener."""
  mine = set()
  for fd in os.listdir('/proc/self/fd'):
    try:
      target = os.readlink(f'/proc/self/fd/{fd}')
    except OSError:
      continue
    if target.startswith('socket:['):
      mine.add(target[8:-1])
  with open('/proc/net/tcp') as f:  # read in several calls: a row can come twice while the table changes
    rows = [line.split() for line in f.readlines()[1:]]
  return len({r[9] for r in rows if int(r[1].split(':')[1], 16) == port and r[3] != '0A' and r[9] in mine})


def _ask(address):
  """One GET of step 5's index with the secret, no retry: (status, body), or the error that ended it."""
  connection = http.client.HTTPConnection(*address, timeout=120)
  try:
    connection.request('GET', '/v1/steps/5/index.json', headers={peer.SECRET_HEADER: transfer.SECRET})
    response = connection.getresponse()
    return response.status, response.read()
  except (OSError, http.client.HTTPException) as e:
    return repr(e)
  finally:
    connection.close()


FLOOD_MAX_SECS = 100.0  # the flood's bound: the test ends it once the cap has turned over enough strangers


def test_a_peer_showing_its_secret_promptly_is_always_answered_under_a_flood_and_the_cap_holds(tmp_path, monkeypatch):
  """A stranger's flood, a process of its own (rigs.bench.flood: silent, trickling and huge-headed
  connections and GETs without the secret, ~255 sockets), while a peer asks again and again with the secret and
  no retry, on a loaded machine (each handler thread runs 0.2 s late): every request is answered in full. The
  peer's connection counted as "no secret shown" until its handler had read the head, so eight arrivals in that
  time closed it unanswered. Meanwhile the connections open on the server side, as the kernel lists them, never
  exceed the cap (the gate did not count the ones it had closed that their handler had not closed yet: 10 were
  seen at a cap of 8). The peer asks until the gate has closed 3x the cap's strangers and it was answered 5
  times, however fast the machine is."""
  read_head, shut, closed = peer._read_head, peer._shut, [0]  # pylint: disable=protected-access

  def late(sock, deadline, gate):
    time.sleep(0.2)
    return read_head(sock, deadline, gate)

  def counted(sock):
    closed[0] += 1
    shut(sock)

  monkeypatch.setattr(peer, '_read_head', late)
  monkeypatch.setattr(peer, '_shut', counted)
  donor = transfer._donor(tmp_path / 'donor', 5)  # pylint: disable=protected-access
  cap, stop, seen = peer.MIN_CONNECTIONS, threading.Event(), []
  with peer.PeerServer(lambda s: donor if s == 5 else None, transfer.SECRET) as server:
    port = server.address[1]
    sampler = threading.Thread(target=lambda: [seen.append(_served_sockets_open(port)) or time.sleep(0.005)
                                               for _ in iter(stop.is_set, True)], daemon=True)
    flood = subprocess.Popen([sys.executable, '-m', 'rigs.bench.flood', '127.0.0.1', str(port),
                              str(FLOOD_MAX_SECS), '--nice', '0'], stdout=subprocess.DEVNULL)
    sampler.start()
    try:
      assert _eventually(lambda: server.connections >= cap, wait=60)
      answers, began = [], time.monotonic()
      while (closed[0] <= 3 * cap or len(answers) < 5) and time.monotonic() < began + FLOOD_MAX_SECS - 10:
        answers.append(_ask(server.address))
      turned_over = closed[0]
    finally:
      stop.set()
      sampler.join(10)
      flood.kill()
      flood.wait()
  index = (donor / layout.LOCAL_INDEX).read_bytes()
  assert answers and answers == [(200, index)] * len(answers), [a if isinstance(a, str) else a[0] for a in answers]
  assert turned_over > 3 * cap and len(answers) >= 5, (turned_over, len(answers))  # the cap turned over
  assert max(seen) <= cap and len(seen) > 20, (max(seen), len(seen))
  print(f'{len(answers)} requests with the secret, all answered; at most {max(seen)} connections open at a cap of '
        f'{cap} ({len(seen)} samples); {turned_over} strangers closed by the gate')


def _closing_first(n):
  """A listener on 127.0.0.1 that closes its first `n` connections unanswered (a donor whose server is
  overwhelmed, or restarting), then frees its port; returns (port, accepted count, done event)."""
  listener = socket.create_server(('127.0.0.1', 0))
  accepted, done = [0], threading.Event()

  def run():
    with listener:
      while accepted[0] < n:
        conn, _ = listener.accept()
        accepted[0] += 1
        conn.recv(65536)
        conn.close()
    done.set()

  threading.Thread(target=run, daemon=True).start()
  return listener.getsockname()[1], accepted, done


def test_a_receiver_tries_the_same_donor_again_briefly_before_giving_up_on_it(tmp_path):
  """The donor closes the receiver's first two connections unanswered, then serves on the same port: the
  receiver gets the whole step from it (it used to give that donor up at the first closed connection)."""
  donor = transfer._donor(tmp_path / 'donor', 5)  # pylint: disable=protected-access
  port, accepted, done = _closing_first(2)
  fetched, bound = threading.Event(), []

  def serve_after():
    assert done.wait(30)
    with peer.PeerServer(lambda s: donor if s == 5 else None, transfer.SECRET, port=port) as server:
      bound.append(server.address[1])
      fetched.wait(60)

  server = threading.Thread(target=serve_after, daemon=True)
  server.start()
  try:
    path = peer.fetch_step(('127.0.0.1', port), transfer.SECRET, 5, tmp_path / 'receiver', timeout=10)
  finally:
    fetched.set()
    server.join(30)
  assert accepted[0] == 2 and bound == [port]
  transfer._same_files(donor, path)  # pylint: disable=protected-access


def test_a_donor_that_keeps_closing_is_given_up_after_a_bounded_number_of_tries(tmp_path):
  """Bounded: tries while the first is under RETRY_SECS old (0.25, 0.5, 1, 2 s apart: five), then
  PeerUnavailable, and the caller moves on to its next donor."""
  port, accepted, _ = _closing_first(100)
  with pytest.raises(peer.PeerUnavailable, match=f'127.0.0.1:{port} step 5: '):
    peer.fetch_step(('127.0.0.1', port), transfer.SECRET, 5, tmp_path / 'receiver', timeout=10)
  assert accepted[0] == 5
