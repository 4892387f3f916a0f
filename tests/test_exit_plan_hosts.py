"""One exit plan for every host (issue 60): threads stand in for hosts against one fake coordination service
(tests/fakes.CoordinationStore), each with its own ExitPath. The interleavings (host 0's thread still running the
preservation after a commit when the signal comes; a peer that never reaches the plan) are forced with events,
never with sleeps. The save is a stand-in with orbax's shape: one save at a time per host, a barrier every host
must reach, host 0's commit."""

import signal
import threading
import time
import types

import pytest

from pax_autockpt import layout
from pax_autockpt.exit import exit_path as exit_path_lib
from pax_autockpt.hosts import agreement
from pax_autockpt.save import background_save
from pax_autockpt.shared import coordination
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import stops
from pax_autockpt.signals import grace
from tests import fakes

pytestmark = pytest.mark.usefixtures('clean_signals')

STEP, IN_FLIGHT = 21, 20  # the agreed step; the step of the save before it
BARRIER_MS = 3000  # orbax's barrier in the stand-in save: a host that never comes fails it, the test never hangs


class Background:
  """BackgroundSaves as the exit path sees it on one host: the save of IN_FLIGHT committed, and the thread alive
  (host 0: the preservation policy runs after each commit; elsewhere nothing does) until this host first waits
  for it: the preservation outlasts every decision the exit takes before it waits."""

  def __init__(self, alive: bool):
    self.released = threading.Event()
    if not alive:
      self.released.set()

  @property
  def in_flight(self) -> bool:
    return not self.released.is_set()

  @property
  def saving_step(self) -> int | None:
    return IN_FLIGHT if self.in_flight else None

  def saving_for(self) -> float:
    return 1.0 if self.in_flight else 0.0

  def wait(self, timeout=None) -> bool:
    del timeout
    self.released.set()
    return True

  uncommitted_step = None  # committed: what the real class reports then (test_the_save_is_in_flight_until...)
  committed_steps = [IN_FLIGHT]

  def uncommitted_for(self) -> float:
    return 0.0

  def wait_until_settled(self, timeout=None) -> bool:
    del timeout
    return True

  def took(self, step):
    del step
    return 1.0


class Saves:
  """JobDirectorySaves as the exit path uses it: a save waits for this host's background thread (one save at a
  time), then meets every host at a barrier (orbax's), and host 0 commits."""

  def __init__(self, host: int, store: fakes.CoordinationStore, ckpt_dir, background: Background,
               duration_s: float):
    self._host, self._store, self._dir = host, store, ckpt_dir
    self.background, self.enabled, self.applies_preservation = background, True, False
    self.costs = types.SimpleNamespace(duration_s=duration_s, last_duration_s=duration_s)
    self.committed_this_run: list[int] = []

  def step_dir(self, step):
    return layout.step_dir(self._dir, step)

  def newest_committed(self):
    return layout.newest_committed(self._dir)

  def latest_step(self):
    return self.newest_committed()

  def save(self, step, reason, state, last=False, deadline=None):
    del reason, state, last
    if not self.background.wait(grace.time_left(deadline)):
      return
    try:
      self._store.wait_at_barrier(f'save-{step}', BARRIER_MS)
      if self._host == 0:
        fakes.write_checkpoint(self.step_dir(step))
      self._store.wait_at_barrier(f'commit-{step}', BARRIER_MS)
    except RuntimeError:
      return  # the save failed: the exit names the newest committed
    self.committed_this_run.append(step)


def _hosts(tmp_path, count, *, grace_secs, arrivals, duration_s=1.0, preserving=True):
  """One ExitPath per host. `arrivals`: host -> when its SIGTERM came (absent: it never came there). Host 0's
  background thread is still alive after the commit of IN_FLIGHT when `preserving`."""
  job = tmp_path / 'job'
  fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), IN_FLIGHT))
  paths, store = [], fakes.CoordinationStore(count)
  for h in range(count):
    background = Background(alive=preserving and h == 0)
    saves = Saves(h, store, layout.checkpoint_dir(job), background, duration_s)
    path = exit_path_lib.ExitPath(
        events=events_lib.EventLog(job, h), saves=saves, exit_after_ondemand=True, grace_secs=grace_secs,
        preemption=types.SimpleNamespace(signal_name='SIGTERM', agreed_step=STEP), exit_code=143,
        notice_action='train_on', restored_step=lambda: None, last_step=lambda: STEP,
        restorer=types.SimpleNamespace(unbacked_step=None, local_agreed_newest=None))
    if h in arrivals:
      path.signal_arrived(signal.SIGTERM, arrivals[h])
    paths.append(path)
  return paths, store


def _run(monkeypatch, paths, store, run=None, wait_s=60.0):
  """Each host's `on_preemption(STEP)` (or `run(host)`) in its own thread: its exception, or what it returned."""
  monkeypatch.setattr(coordination, 'client', lambda: store)
  monkeypatch.setattr(agreement.jax, 'process_count', lambda: len(paths))
  results = {}

  def host(h):
    try:
      results[h] = (run or (lambda h: paths[h].on_preemption(STEP, {})))(h)
    except Exception as e:  # pylint: disable=broad-except
      results[h] = e

  threads = [threading.Thread(target=host, args=(h,), name=f'host-{h}', daemon=True) for h in range(len(paths))]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(wait_s)
  return results


@pytest.fixture(autouse=True)
def no_exit_from_the_watchdog(monkeypatch):
  """The watchdog of an in-process host records its expiry instead of ending the test process."""
  fired = []
  monkeypatch.setattr(exit_path_lib.ExitPath, '_out_of_time', lambda self, deadline: fired.append(deadline))
  return fired


@pytest.mark.parametrize('grace_secs', [60.0, 1000.0])
def test_a_sigterm_while_host_0_preserves_after_a_commit_saves_the_agreed_step_on_every_host(
    tmp_path, monkeypatch, grace_secs):
  """Host 0's thread runs the preservation after step 20's commit; its peers' threads have ended. The plan is
  host 0's alone (nothing in flight: 20 committed) and every host saves step 21. (Previous main: host 0 took
  its live thread for a save in flight and waited for re-plan reports no peer sent, while they waited for it at
  the save's barrier: no step saved, and past 600 s an uncaught agreement.Timeout on host 0.)"""
  monkeypatch.setattr(agreement, 'STALL_SECS', 2.0)  # what host 0 would wait for its peers, shortened
  now = time.time()
  paths, store = _hosts(tmp_path, 3, grace_secs=grace_secs, arrivals={1: now})
  results = _run(monkeypatch, paths, store)
  assert all(isinstance(results.get(h), stops.Preempted) for h in range(3)), results
  assert {str(r) for r in results.values()} == {f'On-demand checkpoint of step {STEP} committed'}
  assert layout.committed_steps(layout.checkpoint_dir(tmp_path / 'job')) == [IN_FLIGHT, STEP]
  plans = [fakes.events(tmp_path / 'job', 'preemption')[0]] + [
      e for h in (1, 2) for e in events_lib.read(tmp_path / 'job', h) if e['event'] == 'preemption']
  assert [(e['plan'], e['saved_step']) for e in plans] == [(grace.SAVE, STEP)] * 3


def test_the_plan_uses_the_earliest_deadline_any_host_published(tmp_path, monkeypatch):
  """Host 1 got the SIGTERM 50 s ago, host 0 5 s ago, host 2 never: of a 60 s grace period 10 s are left on host
  1's scheduler, less than a save needs (1.5 x 10 s + 2 s): every host gives up, and every host's watchdog keeps
  to host 1's deadline. (Previous main: host 0 planned with its own 55 s and saved; host 2 counted from now.)"""
  now = time.time()
  paths, store = _hosts(tmp_path, 3, grace_secs=60.0, arrivals={0: now - 5.0, 1: now - 50.0}, duration_s=10.0,
                        preserving=False)
  results = _run(monkeypatch, paths, store)
  assert all(isinstance(results.get(h), stops.SaveFailed) for h in range(3)), results
  assert all(str(r).startswith(f'No time left to save step {STEP} (') for r in results.values()), results
  assert [p._watchdog.deadline.at for p in paths] == [now + 10.0] * 3  # pylint: disable=protected-access
  event, = fakes.events(tmp_path / 'job', 'preemption')
  assert event['plan'] == grace.GIVE_UP and float(event['why'].split(' s left')[0]) <= 10.0, event
  assert not layout.is_committed(layout.step_dir(layout.checkpoint_dir(tmp_path / 'job'), STEP))


def test_a_host_without_the_signal_keeps_to_the_published_deadline(tmp_path, monkeypatch):
  """Only host 1 got the SIGTERM (20 s ago, of 300 s): host 0 plans and saves, and both hosts' watchdogs keep to
  host 1's deadline, not to one counted from when host 0 learned of the agreement."""
  arrival = time.time() - 20.0
  paths, store = _hosts(tmp_path, 2, grace_secs=300.0, arrivals={1: arrival}, preserving=False)
  results = _run(monkeypatch, paths, store)
  assert all(isinstance(results.get(h), stops.Preempted) for h in range(2)), results
  assert [p._watchdog.deadline.at for p in paths] == [arrival + 300.0] * 2  # pylint: disable=protected-access
  event, = fakes.events(tmp_path / 'job', 'preemption')
  assert 270.0 < float(event['why'].split(' s left')[0]) <= 280.0, event


def test_a_peer_that_never_reaches_the_plan_ends_the_exit_before_the_deadline_in_one_line(tmp_path, monkeypatch):
  """Grace 1000 s, 5 s of it left; host 1 never reaches the exit plan. Host 0 waits no longer than the deadline
  allows (less the margin) and raises SaveFailed in one line naming host 1 (previous main: it waited 600 s, then
  raised agreement.Timeout)."""
  arrival = time.time() - 995.0
  paths, store = _hosts(tmp_path, 2, grace_secs=1000.0, arrivals={0: arrival}, preserving=False)
  ended = []
  results = _run(monkeypatch, paths, store, run=_only_host_0(paths, ended), wait_s=30.0)
  failed = results.get(0)
  assert isinstance(failed, stops.SaveFailed), results
  assert 'host(s) 1 did not reach' in str(failed) and '\n' not in str(failed), failed
  assert str(failed).endswith(f'the newest committed checkpoint is {IN_FLIGHT}')
  assert ended[0] < arrival + 1000.0 - grace.WATCHDOG_LEAD_SECS  # before the watchdog's time, not at it


def _only_host_0(paths, ended):
  """Host 0 exits; host 1 stalls (never reaches the plan) until host 0 is done."""
  done = threading.Event()

  def run(h):
    if h != 0:
      return done.wait()
    try:
      return paths[0].on_preemption(STEP, {})
    finally:
      ended.append(time.time())
      done.set()
  return run


def test_a_long_grace_period_ends_a_stalled_peers_exit_in_one_line_not_a_timeout(tmp_path, monkeypatch):
  """A grace period longer than the agreement's stall rule: host 1 stalls, host 0's exchange times out; that is
  the exit's one line (SaveFailed, exit 1), never an uncaught agreement.Timeout."""
  monkeypatch.setattr(agreement, 'STALL_SECS', 1.0)
  paths, store = _hosts(tmp_path, 2, grace_secs=100_000.0, arrivals={0: time.time()}, preserving=False)
  results = _run(monkeypatch, paths, store, run=_only_host_0(paths, []), wait_s=30.0)
  assert isinstance(results.get(0), stops.SaveFailed), results
  assert 'made no progress for 1 s' in str(results[0]) and '\n' not in str(results[0])


def test_the_save_is_in_flight_until_its_commit_not_until_its_thread_ends(tmp_path):
  """BackgroundSaves around the fake orbax manager: once the commit is done, `done` (host 0's preservation)
  still runs in the thread. The save is no longer in flight for the exit plan (`uncommitted_step`), while the
  thread is (`in_flight`, for "may the next save start"); its commit is on record (`committed_steps`)."""
  fake = fakes.FakePaxCheckpointer(tmp_path / 'job', interval=10)
  background = background_save.BackgroundSaves(fake.orbax)
  fake.orbax.gate.clear()
  in_done, leave = threading.Event(), threading.Event()
  fake.save_final(IN_FLIGHT, partitioned_train_state=fakes.STATE)
  background.launch(started=lambda s: None, done=lambda s, error: (in_done.set(), leave.wait(30)))
  assert background.uncommitted_step == IN_FLIGHT and not background.wait_until_settled(0.05)
  fake.orbax.gate.set()
  assert in_done.wait(30)
  assert background.uncommitted_step is None and background.wait_until_settled(0)
  assert background.in_flight and background.saving_step == IN_FLIGHT
  assert background.committed_steps == [IN_FLIGHT] and background.took(IN_FLIGHT) > 0
  leave.set()
  assert background.wait(30)
