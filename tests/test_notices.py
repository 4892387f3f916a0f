"""Notices: the metadata watcher against the fake server (long polls, ETags), and the agreement on one
step across hosts through a real coordination service (threads as hosts, no model)."""

import threading
import time

import pytest

from pax_autockpt.hosts import hosts
from pax_autockpt.signals import notices
from rigs import fake_metadata


@pytest.fixture(scope='module')
def metadata(tmp_path_factory):
  with fake_metadata.FakeMetadataServer(str(tmp_path_factory.mktemp('metadata'))) as server:
    yield server


def _until(cond, timeout=10.0):
  deadline = time.time() + timeout
  while not cond() and time.time() < deadline:
    time.sleep(0.02)
  return cond()


@pytest.mark.parametrize('key, value, expected', [
    ('maintenance-event', 'NONE', False), ('maintenance-event', 'TERMINATE_ON_HOST_MAINTENANCE', True),
    ('maintenance-event', 'MIGRATE_ON_HOST_MAINTENANCE', True), ('preempted', 'FALSE', False),
    ('preempted', 'TRUE', True), ('upcoming-maintenance', None, False),
    ('upcoming-maintenance', '{"window_start_time": "2026-11-23T10:00:00Z"}', True),
])
def test_which_values_are_notices(key, value, expected):
  assert notices.is_notice(key, value) == expected


def test_watcher_reports_each_change_once_through_long_polls(metadata):
  for key, value in fake_metadata.DEFAULTS.items():
    metadata.set(key, value)
  metadata.set('upcoming-maintenance', None)
  seen = []
  notices.MetadataWatcher(metadata.host, lambda key, value: seen.append((key, value)), required=True).start()
  time.sleep(1.0)  # the watcher has read every key and is long-polling
  assert seen == []
  metadata.set('maintenance-event', 'MIGRATE_ON_HOST_MAINTENANCE')
  assert _until(lambda: len(seen) == 1, 5)
  metadata.set('maintenance-event', 'NONE')
  metadata.set('maintenance-event', 'TERMINATE_ON_HOST_MAINTENANCE')
  metadata.set('preempted', 'TRUE')
  window = '{"window_start_time": "2026-11-23T10:00:00Z"}'
  metadata.set('upcoming-maintenance', window)
  assert _until(lambda: len(seen) == 4, 5), seen
  assert seen[0] == ('maintenance-event', 'MIGRATE_ON_HOST_MAINTENANCE')
  assert set(seen[1:]) == {('maintenance-event', 'TERMINATE_ON_HOST_MAINTENANCE'), ('preempted', 'TRUE'),
                           ('upcoming-maintenance', window)}


def test_no_server_costs_nothing_at_start_and_gives_up_with_one_line(caplog):
  caplog.set_level('INFO')
  caplog.set_level('INFO', logger='absl')  # absl's own level may have been raised by an earlier test
  seen = []
  host = f'127.0.0.1:{hosts.free_loopback_port()}'
  watcher = notices.MetadataWatcher(host, lambda *n: seen.append(n), required=False)
  watcher.start()
  assert _until(lambda: not any(t.is_alive() for t in watcher._threads), 5)  # pylint: disable=protected-access
  lines = [r for r in caplog.records if 'notices' in r.getMessage() and host in r.getMessage()]
  assert len(lines) == 1 and 'no metadata server' in lines[0].getMessage() and seen == []
  assert lines[0].threadName == 'autockpt-notices'  # the probe ran (and gave up) on its own thread, not start()'s


def test_one_process_saves_the_next_step():
  agreement = notices.NoticeAgreement(host=0)
  assert agreement.due(7) is None
  agreement.announce('preempted', 'TRUE')
  assert agreement.due(8) == notices.Notice('preempted', 'TRUE', 0)
  assert agreement.due(9) is None


def _coordination_service(num_hosts):
  from jax._src.lib import xla_extension  # pylint: disable=g-import-not-at-top
  address = f'127.0.0.1:{hosts.free_loopback_port()}'
  service = xla_extension.get_distributed_runtime_service(address, num_hosts)
  clients = [xla_extension.get_distributed_runtime_client(address, i, init_timeout=30) for i in range(num_hosts)]
  threads = [threading.Thread(target=c.connect) for c in clients]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return service, clients


def test_a_notice_one_host_saw_is_saved_at_the_same_step_by_all_hosts():
  """4 hosts in lockstep (a barrier per step stands for the step's collectives); host 2 alone sees the
  notice; every host's loop gets it at one step, and no host runs past that step without it."""
  num_hosts, steps = 4, 60
  service, clients = _coordination_service(num_hosts)
  agreements = [notices.NoticeAgreement(h, clients[h], num_hosts) for h in range(num_hosts)]
  lockstep = threading.Barrier(num_hosts)
  got = [[] for _ in range(num_hosts)]

  def loop(h):
    for step in range(steps):
      notice = agreements[h].due(step)
      if notice is not None:
        got[h].append((step, notice))
      if h == 2 and step == 20:
        agreements[2].announce('maintenance-event', 'TERMINATE_ON_HOST_MAINTENANCE')
      lockstep.wait(timeout=60)
      time.sleep(0.002)

  threads = [threading.Thread(target=loop, args=(h,)) for h in range(num_hosts)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(120)
  try:
    assert all(not t.is_alive() for t in threads)
    assert all(len(g) == 1 for g in got), got
    assert len({g[0] for g in got}) == 1, f'hosts disagree: {got}'
    step, notice = got[0][0]
    assert 20 < step <= 23 and notice == notices.Notice('maintenance-event', 'TERMINATE_ON_HOST_MAINTENANCE', 2)
  finally:
    _shutdown(service, clients)


def _shutdown(service, clients):
  """As processes exiting together: every client at once (one alone waits for its peers)."""
  threads = [threading.Thread(target=c.shutdown) for c in clients]
  for t in threads:
    t.start()
  for t in threads:
    t.join(30)
  service.shutdown()


def test_a_window_closer_than_a_save_is_warned_about(caplog):
  notice = notices.Notice('upcoming-maintenance', '{"window_start_time": "2026-11-23T10:00:00Z"}', 0)
  start = 1795428000.0  # 2026-11-23T10:00:00Z
  assert notices.warn_if_window_is_too_close(notice, [5.0, 60.0, 60.0, 60.0], now=start - 30)
  assert not notices.warn_if_window_is_too_close(notice, [5.0] * 10, now=start - 30)
  assert not notices.warn_if_window_is_too_close(notices.Notice('preempted', 'TRUE', 0), [60.0], now=start)
  assert 'starts in 30 s' in caplog.text
