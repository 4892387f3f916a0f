"""Peer transfer of a local step: a real server on 127.0.0.1 serving real local-tier files, fetched by the
receiver into another folder (whole, refused, cut and resumed, damaged, from a list of donors, in bounded
memory)."""

import contextlib
import http.client
import json
import select
import shutil
import socket
import threading
import time
import tracemalloc
import types

import numpy as np
import pytest

from pax_autockpt import layout
from pax_autockpt.local import format as local_format
from pax_autockpt.local import lineage as lineage_lib
from pax_autockpt.local import peer
from pax_autockpt.local import restoring

SECRET = peer.new_secret()
LINEAGE = lineage_lib.Lineage('job-a', 'run-1', base=None)
REFUSED = ("peer transfer: 1 request(s) refused or ended early (1 without this job's secret), the last from "
           '127.0.0.1; at most one such line every 60 s.')
CUT = (3 << 20) // 2  # a cut server sends 1.5 MB of shards.bin: mid-shard, mid-buffer


def _donor(folder, step, rows=8, cols=1024, parts=4):
  """A committed local step of `folder`: a float32 (rows, cols) split in `parts` row shards, a scalar and a
  zero-size array; returns the step directory."""
  w = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) + step
  size = rows // parts
  shards = {f'{i * size}:{(i + 1) * size},0:{cols}': w[i * size:(i + 1) * size] for i in range(parts)}
  snapshot = local_format.Snapshot({'w': ((rows, cols), 'float32', shards),
                                    'step': ((), 'int32', {'': np.array(step, dtype=np.int32)}),
                                    'empty': ((0,), 'float32', {'0:0': np.zeros(0, dtype=np.float32)})},
                                 input_state=b'position 7')
  partial, arrays = local_format.write_part(folder, step, snapshot)
  return local_format.commit(partial, local_format.index(step, 0, 2, local_format.fingerprint_of(snapshot), arrays,
                                                         {0: b'position 7', 1: None}, 1700000000.0, LINEAGE))


def _server(folder, secret=SECRET, asked=None):
  """A server offering `folder`'s committed local steps; `asked` collects the steps it was asked for."""
  def offered(step):
    if asked is not None:
      asked.append(step)
    return layout.local_step_dir(folder, step) if step in layout.local_committed_steps(folder) else None
  return peer.PeerServer(offered, secret)


def _get(address, path, headers=None):
  connection = http.client.HTTPConnection(*address, timeout=10)
  try:
    connection.request('GET', path, headers=headers or {})
    response = connection.getresponse()
    return response.status, dict(response.getheaders()), response.read()
  finally:
    connection.close()


def _closed_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _same_files(a, b):
  for name in (layout.LOCAL_INDEX, layout.LOCAL_SHARDS):
    assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.fixture
def served(monkeypatch):
  """What the servers stream: (port, path, Range header, bytes sent) per file; a server whose port is in
  `cut` sends only CUT bytes of shards.bin, then closes the connection (a donor that died mid-transfer)."""
  record = types.SimpleNamespace(sent=[], cut=set())
  stream = peer._Handler._stream

  def cut_stream(self, f, length):
    port = self.server.server_address[1]
    if port in record.cut and self.path.endswith(layout.LOCAL_SHARDS):
      length = min(length, CUT)
    record.sent.append((port, self.path, self.headers.get('Range'), length))
    stream(self, f, length)

  monkeypatch.setattr(peer._Handler, '_stream', cut_stream)
  return record


def test_a_step_fetched_whole_is_byte_identical_and_reads_back(tmp_path):
  donor = _donor(tmp_path / 'donor', 5)
  with _server(tmp_path / 'donor') as server:
    host, port = server.address
    assert host == '127.0.0.1' and port > 0
    got = peer.fetch_step((host, port), SECRET, 5, tmp_path / 'receiver')
  assert got == layout.local_step_dir(tmp_path / 'receiver', 5)
  _same_files(donor, got)
  found = local_format.read_index(got)
  shards = local_format.read_shards(got, found)
  assert shards['w']['2:4,0:1024'].tobytes() == local_format.read_shards(donor, found)['w']['2:4,0:1024'].tobytes()
  assert int(shards['step']['']) == 5 and shards['empty']['0:0'].shape == (0,)
  assert local_format.input_state(found, 0) == b'position 7'
  assert layout.local_committed_steps(tmp_path / 'receiver') == [5]
  assert layout.local_partials(tmp_path / 'receiver') == []


def test_a_request_without_the_secret_or_with_a_wrong_one_gets_403_one_log_line_and_nothing_is_written(
    tmp_path, caplog, capsys):
  """The first refusal is one line at once; the rest are summed up (one line a minute at most, and at the
  stop): a stranger's requests do not write a line each into the job's logs."""
  _donor(tmp_path / 'donor', 5)
  with _server(tmp_path / 'donor') as server:
    for headers in ({}, {peer.SECRET_HEADER: 'not-the-secret'}, {peer.SECRET_HEADER: ''}):
      for path in ('/v1/steps/5/shards.bin', '/v1/steps/1/../../etc/passwd'):  # nothing said of a path either
        status, _, body = _get(server.address, path, headers)
        assert (status, body) == (403, b'')
    with pytest.raises(peer.PeerRefused):
      peer.fetch_step(server.address, 'another-jobs-secret', 5, tmp_path / 'receiver')
    assert [r.getMessage() for r in caplog.records] == [f'[autockpt] {REFUSED}']
  lines = [r.getMessage() for r in caplog.records]
  assert len(lines) == 2 and "6 request(s) refused or ended early in the last" in lines[1], lines
  assert "(6 without this job's secret), the last from 127.0.0.1" in lines[1], lines
  assert not (tmp_path / 'receiver').exists()
  assert 'GET' not in capsys.readouterr().err  # no access log


def test_only_the_two_files_of_an_offered_step_are_served(tmp_path):
  donor = _donor(tmp_path / 'donor', 1)
  (donor / 'other.txt').write_text('not served')
  (tmp_path / 'passwd').write_text('not served')
  asked = []
  with _server(tmp_path / 'donor', asked=asked) as server:
    good = {peer.SECRET_HEADER: SECRET}
    assert _get(server.address, '/v1/steps/1/index.json', good)[2] == (donor / layout.LOCAL_INDEX).read_bytes()
    for path in ('/v1/steps/1/../../etc/passwd', '/v1/steps/1/../../../passwd', '/v1/steps/1/%2e%2e/%2e%2e/passwd',
                 '/v1/steps/1/other.txt', '/v1/steps/2/index.json', '/v1/steps/-1/index.json',
                 '/v1/steps/1/index.json/', '/v1/steps/1/index.json?x=1',
                 '/v1/steps/1', '/'):
      status, _, body = _get(server.address, path, good)
      assert (status, body) == (404, b''), path
  assert asked == [1, 2]  # only a number ever reaches the caller's choice


def test_ranges_are_served_as_asked_and_one_past_the_end_is_416(tmp_path):
  data = (_donor(tmp_path / 'donor', 1) / layout.LOCAL_SHARDS).read_bytes()
  size = len(data)
  with _server(tmp_path / 'donor') as server:
    def get(asked):
      return _get(server.address, '/v1/steps/1/shards.bin', {peer.SECRET_HEADER: SECRET, 'Range': asked})
    status, headers, body = get('bytes=10-19')
    assert (status, headers['Content-Range'], headers['Content-Length'], body) == (
        206, f'bytes 10-19/{size}', '10', data[10:20])
    status, headers, body = get(f'bytes={size - 5}-')
    assert (status, headers['Content-Range'], body) == (206, f'bytes {size - 5}-{size - 1}/{size}', data[-5:])
    status, headers, body = get(f'bytes={size}-')
    assert (status, headers['Content-Range'], body) == (416, f'bytes */{size}', b'')


def test_a_cut_transfer_leaves_the_partial_and_the_next_fetch_resumes_with_a_range(tmp_path, served):
  donor = _donor(tmp_path / 'donor', 3, rows=16, cols=65536)  # 4 MB: four 1 MB shards
  size = (donor / layout.LOCAL_SHARDS).stat().length
  with _server(tmp_path / 'donor') as server:
    served.cut.add(server.address[1])
    with pytest.raises(peer.PeerUnavailable, match='closed at byte'):
      peer.fetch_step(server.address, SECRET, 3, tmp_path / 'receiver')
    partial = layout.local_partial_dir(tmp_path / 'receiver', 3) / layout.LOCAL_SHARDS
    assert partial.stat().length == CUT
    assert layout.local_committed_steps(tmp_path / 'receiver') == []
    served.cut.clear()
    served.sent.clear()
    got = peer.fetch_step(server.address, SECRET, 3, tmp_path / 'receiver')
  shards = [s for s in served.sent if s[1].endswith(layout.LOCAL_SHARDS)]
  assert shards == [(server.address[1], '/v1/steps/3/shards.bin', f'bytes={CUT}-', size - CUT)]
  _same_files(donor, got)
  assert layout.local_partials(tmp_path / 'receiver') == []


def test_a_partial_copy_that_does_not_match_the_index_is_fetched_whole(tmp_path, served):
  donor = _donor(tmp_path / 'donor', 3, rows=16, cols=65536)
  partial = layout.local_partial_dir(tmp_path / 'receiver', 3)
  partial.mkdir(parents=True)
  (partial / layout.LOCAL_SHARDS).write_bytes(b'\0' * (2 << 20))  # another save's bytes, or a crash's zeros
  with _server(tmp_path / 'donor') as server:
    got = peer.fetch_step(server.address, SECRET, 3, tmp_path / 'receiver')
  assert [s[2] for s in served.sent if s[1].endswith(layout.LOCAL_SHARDS)] == [None]  # no Range: whole
  _same_files(donor, got)


def test_a_flipped_byte_in_the_donors_shards_is_damage_and_nothing_is_committed(tmp_path):
  donor = _donor(tmp_path / 'donor', 5)
  data = bytearray((donor / layout.LOCAL_SHARDS).read_bytes())
  data[len(data) // 2] ^= 1
  (donor / layout.LOCAL_SHARDS).write_bytes(bytes(data))
  with _server(tmp_path / 'donor') as server:
    with pytest.raises(local_format.LocalDamage, match='shard 4:6,0:1024 does not match its digest'):
      peer.fetch_step(server.address, SECRET, 5, tmp_path / 'receiver')
  assert layout.local_committed_steps(tmp_path / 'receiver') == []
  assert layout.local_partials(tmp_path / 'receiver') == []


def test_a_changed_index_is_damage_before_any_shard_moves(tmp_path, served):
  donor = _donor(tmp_path / 'donor', 5)
  (donor / layout.LOCAL_INDEX).write_text((donor / layout.LOCAL_INDEX).read_text().replace('run-1', 'run-2'))
  with _server(tmp_path / 'donor') as server:
    with pytest.raises(local_format.LocalDamage, match='does not match its digest'):
      peer.fetch_step(server.address, SECRET, 5, tmp_path / 'receiver')
  assert [s[1] for s in served.sent] == ['/v1/steps/5/index.json']
  assert not (tmp_path / 'receiver').exists()


def test_the_fill_takes_each_source_in_turn_when_one_is_down_or_cut_and_resumes_its_partial(tmp_path, served):
  """The fill's fallback after its first attempt failed (`LocalRestore._in_turn`): each source the plan lists,
  in turn, each resuming what the one before left; the last PeerUnavailable when none served it."""
  donor = _donor(tmp_path / 'donor', 3, rows=16, cols=65536)
  size = (donor / layout.LOCAL_SHARDS).stat().length
  receiver = restoring.LocalRestore(tmp_path / 'receiver', host=1, hosts=4)
  down = {'address': ['127.0.0.1', _closed_port()], 'secret': SECRET}
  first = peer.PeerUnavailable('the first attempt')
  with pytest.raises(peer.PeerUnavailable, match='Connection refused'):
    receiver._in_turn(_client({'fill/0/0/peer': down, 'fill/2/0/peer': down}), 'fill/', 3,  # pylint: disable=protected-access
                      [(0, False), (2, False)], first)
  with _server(tmp_path / 'donor') as cut, _server(tmp_path / 'donor') as good:
    served.cut.add(cut.address[1])
    published = {'fill/0/0/peer': down, 'fill/2/0/peer': {'address': list(cut.address), 'secret': SECRET},
                 'fill/3/1/peer': {'address': list(good.address), 'secret': SECRET}}
    got, used = receiver._in_turn(_client(published), 'fill/', 3,  # pylint: disable=protected-access
                                  [(0, False), (2, False), (3, True)], first)
  assert used == [(3, True)]
  shards = [s for s in served.sent if s[1].endswith(layout.LOCAL_SHARDS)]
  assert shards == [(cut.address[1], '/v1/steps/3/shards.bin', None, CUT),
                    (good.address[1], '/v1/steps/3/shards.bin', f'bytes={CUT}-', size - CUT)]
  _same_files(donor, got)


def test_memory_stays_bounded_by_the_buffer_not_the_shares_size(tmp_path):
  donor = _donor(tmp_path / 'donor', 9, rows=64, cols=1 << 18, parts=16)  # 64 MB: sixteen 4 MB shards
  assert (donor / layout.LOCAL_SHARDS).stat().length == (64 << 20) + 4  # and the scalar
  with _server(tmp_path / 'donor') as server:
    tracemalloc.start()
    try:
      got = peer.fetch_step(server.address, SECRET, 9, tmp_path / 'receiver')
      _, peak = tracemalloc.get_traced_memory()  # both ends: the server runs in this process
    finally:
      tracemalloc.stop()
  assert peak < 8 << 20, peak
  _same_files(donor, got)


class _CapClock:
  """pax_autockpt.local.peer's clock, stopped for the thread that made it (the fetch): only the cap's sleeps move
  it (at once), so what they add up to is the cap's doing alone, whatever this machine's speed. Other threads (the
  server's, or another test's retry still sleeping) keep the real clock: under coverage one such retry's 256 s
  sleep was counted as the cap's."""

  def __init__(self):
    self.slept: list[float] = []
    self._owner = threading.get_ident()

  def monotonic(self) -> float:
    return sum(self.slept) if threading.get_ident() == self._owner else time.monotonic()

  def sleep(self, secs: float) -> None:
    if threading.get_ident() == self._owner:
      self.slept.append(secs)
    else:
      time.sleep(secs)


def test_a_capped_fetch_takes_at_least_its_bytes_over_the_cap_and_arrives_whole(tmp_path, monkeypatch):
  """A background copy (buddy copies) is capped: 8 MB at 16 MB/s cannot take less than 0.5 s. Before each read
  the copy sleeps until the bytes so far fit the cap: the sleeps add up to the bytes before the last read."""
  donor = _donor(tmp_path / 'donor', 5, rows=64, cols=32 * 1024)
  size = (donor / layout.LOCAL_SHARDS).stat().length
  clock = _CapClock()
  monkeypatch.setattr(peer, 'time', clock)
  with _server(tmp_path / 'donor') as server:
    got = peer.fetch_step(server.address, SECRET, 5, tmp_path / 'got', max_bytes_per_sec=16e6)
  assert size > 8e6 and (size - peer.BUFFER_BYTES) / 16e6 <= sum(clock.slept) <= size / 16e6, (size, clock)
  assert len(clock.slept) >= size / peer.BUFFER_BYTES  # a sleep before each read, a read per buffer at most
  assert (got / layout.LOCAL_SHARDS).read_bytes() == (donor / layout.LOCAL_SHARDS).read_bytes()


def _client(published):
  """The coordination service's two reads a receiver makes, over `published` (key -> value)."""
  return types.SimpleNamespace(
      blocking_key_value_get=lambda key, unused_ms: json.dumps(published[key]),
      key_value_dir_get=lambda folder: [(k, json.dumps(v)) for k, v in published.items() if k.startswith(folder)])


def test_two_donors_serve_their_own_halves_in_parallel_and_one_that_dies_mid_part_hands_it_on(tmp_path, served):
  """The plan lists every source of a host's shards (a replica's own copy, then a buddy copy), each with the
  address and secret its donor published: both stream a part of shards.bin at once (a range each); when the
  replica's donor dies mid-part, the keeper of the buddy copy goes on with that part from where it stopped,
  under its own secret. Whole shards only per part; the files end identical to the donor's."""
  donor = _donor(tmp_path / 'replica', 3, rows=16, cols=65536)
  size = (donor / layout.LOCAL_SHARDS).stat().length
  kept = layout.local_step_dir(layout.local_buddy_dir(tmp_path / 'keeper'), 3)
  shutil.copytree(donor, kept)
  secrets = [peer.new_secret() for _ in range(2)]
  for cut in (False, True):
    receiver = tmp_path / f'receiver-{cut}'
    served.sent.clear()
    with peer.PeerServer(lambda s: donor if s == 3 else None, secrets[0]) as replica, \
        peer.PeerServer(lambda s: kept if s == 3 else None, secrets[1]) as keeper:
      if cut:
        served.cut.add(replica.address[1])
      client = _client({'fill/0/0/peer': {'address': list(replica.address), 'secret': secrets[0]},
                        'fill/2/1/peer': {'address': list(keeper.address), 'secret': secrets[1]}})
      restoring.LocalRestore(receiver, host=1, hosts=3)._receive(  # pylint: disable=protected-access
          client, 'fill/', 3, ((0, False), (2, True)))
    ranges = sorted((rng, port) for port, path, rng, _ in served.sent if path.endswith(layout.LOCAL_SHARDS))
    half = int(ranges[-1][0].split('=')[1].split('-')[0])  # where the keeper's own part starts
    assert 0 < half < size and ranges[0] == (f'bytes=0-{half - 1}', replica.address[1])
    assert ranges[-1] == (f'bytes={half}-{size - 1}', keeper.address[1])
    assert ranges[1:-1] == ([(f'bytes={CUT}-{half - 1}', keeper.address[1])] if cut else []), ranges
    _same_files(donor, layout.local_step_dir(receiver, 3))


def test_parts_are_whole_shards_of_about_equal_bytes_and_never_empty():
  def offsets(entries, n):
    return [[e[0] for e in part] for part in peer._split(entries, n)]  # pylint: disable=protected-access
  even = [(i * 10, 10, '', '') for i in range(10)]
  assert offsets(even, 2) == [[0, 10, 20, 30, 40], [50, 60, 70, 80, 90]]
  assert offsets(even, 3) == [[0, 10, 20], [30, 40, 50, 60], [70, 80, 90]]
  assert offsets(even, 20) == [[o] for o in range(0, 100, 10)]  # no more parts than shards
  lopsided = [(0, 100, '', ''), (100, 100, '', ''), (200, 1, '', '')]  # two large shards: one for each donor
  assert offsets(lopsided, 2) == [[0], [100, 200]] and offsets([], 2) == []


# --- a server strangers cannot exhaust (issue 46) ----------------------------------------------------


def _strangers(address, n):
  """`n` connections that each send one byte of a request and then nothing (a stranger holding a slot)."""
  socks = []
  for _ in range(n):
    socks.append(socket.create_connection(address, timeout=5))
    socks[-1].sendall(b'G')
  return socks


def _closed(socks, want, wait=5.0):
  """How many of `socks` the server closed, waiting at most `wait` s for `want` of them (a bounded loop)."""
  closed, deadline = set(), time.monotonic() + wait
  while len(closed) < want and time.monotonic() < deadline:
    readable, _, _ = select.select([s for s in socks if s not in closed], [], [], 0.1)
    for s in readable:
      try:
        data = s.recv(1)
      except OSError:
        data = b''
      if not data:
        closed.add(s)
  return len(closed)


def _eventually(predicate, wait=5.0):
  deadline = time.monotonic() + wait
  while not predicate() and time.monotonic() < deadline:
    time.sleep(0.05)
  return predicate()


def test_a_taken_port_is_one_line_and_a_free_port_instead(tmp_path, caplog):
  """Under `launch` every local host is given the same --autockpt_local_peer_port: all but one found it
  taken, and the OSError killed the buddy-copy thread. Peers learn the address through the coordination
  service, so any free port serves."""
  donor = _donor(tmp_path / 'donor', 5)
  with socket.socket() as holder:
    holder.bind(('127.0.0.1', 0))
    holder.listen()
    port = holder.getsockname()[1]
    with peer.PeerServer(lambda s: donor if s == 5 else None, SECRET, port=port) as server:
      assert server.address[1] not in (0, port)
      got = peer.fetch_step(server.address, SECRET, 5, tmp_path / 'receiver')
  _same_files(donor, got)
  lines = [r.getMessage() for r in caplog.records if 'is not free' in r.getMessage()]
  assert len(lines) == 1 and f'port {port} is not free' in lines[0], lines


def test_strangers_beyond_the_connection_cap_wait_their_turn_and_a_peer_of_the_job_still_gets_in(
    tmp_path, caplog):
  """252 strangers each sending a byte made the donor's own open() fail (EMFILE). Now at most
  MIN_CONNECTIONS are open: each newer one waits in the kernel's queue while the oldest that showed no secret
  is closed, and a peer with the secret is served among them; the refusals are a summary, not a line each."""
  donor = _donor(tmp_path / 'donor', 5)
  cap = peer.MIN_CONNECTIONS
  with _server(tmp_path / 'donor') as server:
    strangers = _strangers(server.address, 3 * cap)
    try:
      assert _closed(strangers, want=2 * cap) >= 2 * cap
      assert _eventually(lambda: server.connections <= cap), server.connections
      got = peer.fetch_step(server.address, SECRET, 5, tmp_path / 'receiver', timeout=5)
    finally:
      for s in strangers:
        s.close()
  _same_files(donor, got)
  lines = [r.getMessage() for r in caplog.records if 'over the connection cap' in r.getMessage()]
  assert 1 <= len(lines) <= 2, lines  # the first at once, the rest summed up at the stop


def test_a_request_that_trickles_in_is_closed_at_its_deadline_however_often_a_byte_comes(tmp_path, monkeypatch):
  """The 60 s timeout was per read: a byte every 30 s held a connection (and a thread) for ever."""
  monkeypatch.setattr(peer, 'REQUEST_SECS', 0.5)
  _donor(tmp_path / 'donor', 5)
  with _server(tmp_path / 'donor') as server:
    with socket.create_connection(server.address, timeout=5) as s:
      for _ in range(50):  # a byte every 0.1 s, for 5 s at most: ten times the deadline
        try:
          s.sendall(b'G')
        except OSError:
          break
        if _closed([s], want=1, wait=0.1):
          break
      else:
        pytest.fail('a request trickling in for 5 s is still open')


def test_a_request_head_over_the_limit_is_closed_unanswered_in_bounded_memory_secret_or_not(tmp_path):
  """40 connections sending 6.5 MB of headers each took the donor from 121 MB to 1,537 MB: the headers were
  parsed whole before the secret was looked at. Now HEAD_LIMIT bytes of them are ever held."""
  _donor(tmp_path / 'donor', 5)
  head = f'GET /v1/steps/5/index.json HTTP/1.0\r\n{peer.SECRET_HEADER}: {SECRET}\r\n'.encode()
  request = memoryview(head + (b'X-Pad: ' + b'a' * 60000 + b'\r\n') * 98 + b'\r\n')  # 99 headers, 5.9 MB
  with _server(tmp_path / 'donor') as server:
    tracemalloc.start()
    try:
      for _ in range(4):
        with socket.create_connection(server.address, timeout=5) as s:
          try:
            s.sendall(request)  # within http.client's count of headers
            answer = s.recv(100)
          except OSError:
            answer = b''
          assert answer == b''
      _, peak = tracemalloc.get_traced_memory()  # the server runs in this process
    finally:
      tracemalloc.stop()
  assert peak < 2 << 20, peak


def test_an_index_answered_without_a_length_is_read_only_to_its_limit(tmp_path, monkeypatch):
  """A donor (or anything on its port) answering an index without a Content-Length was read until it closed:
  here, until the read timed out, with every byte in memory."""
  monkeypatch.setattr(peer, 'INDEX_LIMIT', 64 << 10)
  held = threading.Event()
  with socket.socket() as listener:
    listener.bind(('127.0.0.1', 0))
    listener.listen()

    def answer():
      conn, _ = listener.accept()
      with conn, contextlib.suppress(OSError):
        conn.recv(65536)
        conn.sendall(b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n')
        for _ in range(16):
          conn.sendall(b' ' * (16 << 10))  # four times the limit, then the connection held open
        held.wait(10)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
      with pytest.raises(local_format.LocalDamage, match='without a length, longer than 65536 bytes'):
        peer.fetch_step(listener.getsockname(), SECRET, 5, tmp_path / 'receiver', timeout=3)
    finally:
      held.set()
      thread.join(10)
