"""The exit path's plan inside the grace period, and its watchdog (pure logic, real threads)."""

import threading
import time

import pytest

from pax_autockpt.signals import grace


def _ctx(remaining, duration, in_flight=None, elapsed=0.0):
  return grace.ExitContext(remaining_s=remaining, save_duration_s=duration, in_flight_step=in_flight,
                           in_flight_elapsed_s=elapsed)


@pytest.mark.parametrize('ctx, action', [
    (_ctx(300, None), grace.SAVE),  # nothing measured yet: try, bounded
    (_ctx(300, 25.0), grace.SAVE),
    (_ctx(300, 25.0, in_flight=100, elapsed=5.0), grace.SAVE),
    # 1.5 x 25 = 37.5 for the new save, 32.5 left of the one in flight, 2 s to exit: 72 s.
    (_ctx(72.0, 25.0, in_flight=100, elapsed=5.0), grace.SAVE),
    (_ctx(71.9, 25.0, in_flight=100, elapsed=5.0), grace.KEEP_IN_FLIGHT),
    (_ctx(10.0, 25.0, in_flight=100, elapsed=5.0), grace.KEEP_IN_FLIGHT),  # try it; the wait is bounded
    (_ctx(39.5, 25.0), grace.SAVE),
    (_ctx(39.4, 25.0), grace.GIVE_UP),
    (_ctx(-1.0, 0.1), grace.GIVE_UP),
])
def test_plan_saves_only_what_fits(ctx, action):
  got = grace.plan(ctx)
  assert got.action == action, got
  assert got.kept_step == (ctx.in_flight_step if action == grace.KEEP_IN_FLIGHT else None)
  assert grace.ExitPlan.decode(got.encode()) == got


@pytest.mark.parametrize('remaining, mean, took, committed, action', [
    (37.9, 20.0, 24.0, 100, grace.KEEP_IN_FLIGHT),  # a new save: 1.5 x 24 (the longer) + 2 = 38 s > 37.9
    (38.0, 20.0, 24.0, 100, grace.SAVE),
    (50.0, 20.0, 24.0, 100, grace.SAVE),  # the save in flight took longer than the mean; a new one still fits
    (30.0, 15.0, 24.0, 100, grace.KEEP_IN_FLIGHT),  # the mean said 24.5 s fits, the save just measured says not
    (30.0, 15.0, 24.0, None, grace.GIVE_UP),  # and it failed: nothing to name but the newest committed
    (30.0, None, None, 100, grace.SAVE),  # nothing measured: try, bounded
])
def test_replan_after_the_save_in_flight_uses_its_measured_duration(remaining, mean, took, committed, action):
  got = grace.replan(_ctx(remaining, mean), committed, took)
  assert got.action == action, got
  assert got.kept_step == (committed if action == grace.KEEP_IN_FLIGHT else None)
  if action == grace.KEEP_IN_FLIGHT:
    assert got.why.endswith(f'after the save of step {committed} took {took:.1f} s')


def test_plan_says_why_in_words():
  why = grace.plan(_ctx(30.0, 25.0, in_flight=100, elapsed=5.0)).why
  assert why == '30.0 s left of the grace period, a save takes ~25.0 s: no time for a new save after the one of ' \
                'step 100 in flight'


def test_deadline_counts_from_the_arrival():
  d = grace.Deadline(arrival=1000.0, grace_secs=300)
  assert d.at == 1300.0 and d.remaining(now=1100.0) == 200.0


def test_watchdog_fires_once_before_the_earliest_deadline(monkeypatch):
  monkeypatch.setattr(grace, 'WATCHDOG_LEAD_SECS', 0.05)
  fired = []
  done = threading.Event()
  dog = grace.Watchdog(lambda d: (fired.append((d.grace_secs, time.time())), done.set()))
  now = time.time()
  dog.arm(grace.Deadline(now, 5.0))
  dog.arm(grace.Deadline(now, 0.3))  # earlier: wins
  dog.arm(grace.Deadline(now, 10.0))  # later: ignored
  assert done.wait(3)
  time.sleep(0.2)
  assert [g for g, _ in fired] == [0.3]
  assert fired[0][1] - now >= 0.2  # the lead before the 0.3 s deadline, never sooner (done.wait(3): not a hang)


def test_a_cancelled_watchdog_never_fires(monkeypatch):
  """What the tests' signal reset relies on: an in-process "SIGTERM" arms a watchdog that would end the
  test process when its grace period runs out."""
  monkeypatch.setattr(grace, 'WATCHDOG_LEAD_SECS', 0.05)
  fired = []
  dog = grace.Watchdog(fired.append)
  dog.arm(grace.Deadline(time.time(), 0.3))
  grace.cancel_all()
  dog.arm(grace.Deadline(time.time(), 0.2))  # stays cancelled
  time.sleep(0.6)
  assert fired == []


def test_a_plan_to_save_after_the_save_in_flight_names_it_for_every_host_and_carries_the_earliest_deadline():
  """`wait_step`: the hosts wait for that save's commit because host 0's plan says so, not because of their own
  thread; the deadline every host keeps to is the earliest any host published."""
  assert grace.plan(_ctx(300, 25.0, in_flight=100, elapsed=5.0)).wait_step == 100
  assert grace.plan(_ctx(300, 25.0)).wait_step is None
  assert grace.plan(_ctx(10.0, 25.0, in_flight=100)).wait_step is None  # keep_in_flight: nothing to wait for first
  late, early = grace.Deadline(1000.0, 60.0), grace.Deadline(990.0, 60.0)
  assert grace.earliest([late, grace.Deadline.decode(early.encode())]).at == early.at and grace.earliest([]) is None
  carried = grace.ExitPlan(grace.SAVE, 'why', arrival=early.arrival, grace_secs=early.grace_secs)
  assert grace.ExitPlan.decode(carried.encode()).deadline.at == 1050.0
