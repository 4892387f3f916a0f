"""The primary-decides protocol: a fake key-value store for the logic, the real coordination service for
the wiring (threads as hosts, 127.0.0.1)."""

import threading
import time

import pytest

from pax_autockpt.hosts import agreement
from pax_autockpt.hosts import hosts


class FakeStore:
  """jax.distributed's client as the protocol uses it; counts reads; a missing key is an error (a host
  that read a key the primary had already deleted would hang in the real store)."""

  def __init__(self):
    self.kv, self.reads, self.deleted = {}, 0, []

  def key_value_set(self, key, value):
    assert key not in self.kv, f'{key} set twice'
    self.kv[key] = value

  def blocking_key_value_get(self, key, timeout_ms):
    del timeout_ms
    self.reads += 1
    return self.kv[key]

  def key_value_delete(self, key):
    self.deleted.append(key)
    del self.kv[key]


def _lockstep(count, wants, interval=None):
  """Hosts 0..count-1 call the protocol step by step (host 0 first, as a collective would let it);
  `wants(step)` is the primary's policy. Returns each host's answers and the store."""
  store = FakeStore()
  agree = [agreement.PrimaryDecides(i, client=store, process_count=count, interval=interval) for i in range(count)]
  answers = [[] for _ in range(count)]
  for step in range(len(wants)):
    for host in range(count):
      answers[host].append(agree[host](lambda step=step: wants[step]))
  return answers, store


@pytest.mark.parametrize('count, interval', [(1, 1), (2, 1), (64, 1), (65, 2), (128, 2), (1024, 16), (1025, 17)])
def test_decision_interval(count, interval):
  assert agreement.decision_interval(count) == interval


def test_one_process_decides_alone():
  store = FakeStore()
  agree = agreement.PrimaryDecides(0, client=store, process_count=1)
  assert not agree.needed
  assert [agree(lambda v=v: v) for v in (True, False, True)] == [True, False, True]
  assert store.kv == {} and store.reads == 0


def test_every_step_up_to_64_hosts_is_the_primary_s_answer_on_every_host():
  wants = [False, True, False, False, True, True, False]
  answers, store = _lockstep(4, wants)
  assert all(a == wants for a in answers)
  assert store.reads == 3 * len(wants)
  assert store.deleted == [f'autockpt/decision/{i}' for i in range(len(wants) - 2)]  # two kept at most


def test_exchange_every_k_steps_keeps_a_wanted_save_until_the_next_exchange():
  """Interval 4: answers only at steps 0, 4, 8; a save wanted at step 5 (between exchanges) is taken at
  step 8 on every host, one wanted at 8 itself at 8, and nothing else; reads = hosts x exchanges."""
  wants = [False] * 12
  wants[5] = True
  answers, store = _lockstep(3, wants, interval=4)
  expected = [False] * 12
  expected[8] = True
  assert all(a == expected for a in answers), answers
  assert store.reads == 2 * 3
  wants = [False] * 12
  wants[8] = True
  answers, _ = _lockstep(3, wants, interval=4)
  assert all(a == expected for a in answers)


def test_a_wanted_save_is_taken_once():
  wants = [True, True, False, False, False, False, False, False]
  answers, _ = _lockstep(2, wants, interval=2)
  assert all(a == [True, False, True, False, False, False, False, False] for a in answers)


def test_real_coordination_service_threads_as_hosts():
  """The protocol against jaxlib's own service and clients (what jax.distributed runs): 3 hosts agree on
  every answer, every step and every 2 steps."""
  from jax._src.lib import xla_extension  # pylint: disable=g-import-not-at-top
  port = hosts.free_loopback_port()
  service = xla_extension.get_distributed_runtime_service(f'127.0.0.1:{port}', 3)
  clients = [xla_extension.get_distributed_runtime_client(f'127.0.0.1:{port}', i, init_timeout=60)
             for i in range(3)]
  wants = [False, True, False, True, True, False, False, True, False]
  answers = {}
  step_done = threading.Barrier(3)  # the training step's collective: no host runs a step ahead

  def host(i, interval):
    agree = agreement.PrimaryDecides(i, client=clients[i], process_count=3, interval=interval,
                                     prefix=f'autockpt/decision{interval}/')  # each run its own keys
    answers[i, interval] = []
    for v in wants:
      answers[i, interval].append(agree(lambda v=v: v))
      step_done.wait(30)

  try:
    _all_at_once([c.connect for c in clients])  # each waits for the others
    for interval in (1, 2):
      _all_at_once([lambda i=i, k=interval: host(i, k) for i in range(3)])
  finally:
    _all_at_once([c.shutdown for c in clients])  # a barrier too
    service.shutdown()
  assert answers[0, 1] == answers[1, 1] == answers[2, 1] == wants
  assert answers[0, 2] == answers[1, 2] == answers[2, 2] == [False, False, True, False, True, False, False,
                                                             False, True]


def _all_at_once(calls):
  threads = [threading.Thread(target=call, daemon=True) for call in calls]
  for t in threads:
    t.start()
  for t in threads:
    t.join(60)


# --- the restore's waits: from the last sign of progress (threads as hosts, a fake coordination service) ------


def _as_hosts(monkeypatch, count, run):
  from tests import fakes  # pylint: disable=g-import-not-at-top  (paxml-heavy)
  return fakes.as_hosts(monkeypatch, count, run)


def test_a_transfer_that_keeps_moving_keeps_the_others_waiting_past_the_bound(monkeypatch):
  """The fill's end: hosts 0 and 2 (donors) are there at once, host 1 receives for 4x the bound (scaled down),
  moving all along: every host gets every report."""
  monkeypatch.setattr(agreement, 'STALL_SECS', 0.5, raising=False)
  monkeypatch.setattr(agreement, 'BEAT_SECS', 0.05, raising=False)
  monkeypatch.setattr(agreement, '_TIMEOUT_MS', 500)  # the old fixed bound, scaled the same

  def run(host):
    with agreement.working('fill/done', host):
      for _ in range(40 if host == 1 else 0):
        time.sleep(0.05)
        agreement.moved()
    return agreement.reports('fill/done', host, f'from {host}')

  results, _ = _as_hosts(monkeypatch, 3, run)
  assert results == {h: {0: 'from 0', 1: 'from 1', 2: 'from 2'} for h in range(3)}, results


def test_the_fast_path_waits_for_nothing_but_the_last_report(monkeypatch):
  """Bounds of minutes: hosts that arrive 0.2 s apart, working less than a beat, end as soon as the last
  report is there (a wait of one slice, 150 s here, would outlast the join), with no progress published and no
  timed-out wait."""
  monkeypatch.setattr(agreement, 'STALL_SECS', 600, raising=False)
  monkeypatch.setattr(agreement, 'BEAT_SECS', 300, raising=False)

  def run(host):
    with agreement.working('plan/1', host):
      time.sleep(0.2 * host)
      agreement.moved()
    return agreement.reports('plan/1', host, 'x' if host else None)

  results, store = _as_hosts(monkeypatch, 3, run)
  assert results == {h: {1: 'x', 2: 'x'} for h in range(3)}, results
  assert store.timed_out_gets == 0 and not [k for k in store.kv if '/progress/' in k], store.kv
