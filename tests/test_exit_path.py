"""The exit path's plan at the agreed step, through AutockptCheckpointer around the fake (tests/fakes.py): the
budget (`grace_secs`, from the signal's arrival) and the save duration (an earlier run's event log) are the
test's, so the plan does not depend on how fast this machine saves."""

import re
import threading
import time
from unittest import mock

import numpy as np
import pytest

from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import stops
from pax_autockpt.signals import grace
from pax_autockpt.signals import signals
from tests import fakes
from tests.fakes import STATE

pytestmark = pytest.mark.usefixtures('clean_signals')


@pytest.fixture
def job(tmp_path):
  return tmp_path / 'job'


def measured(job, duration_s: float) -> None:
  """An earlier run of the job committed step 10 in `duration_s`: this job's measured save duration."""
  fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), 10))
  log = events_lib.EventLog(job, 0)
  now = time.time()
  log.write('save_started', t=now - 1000.0, step=10, reason='interval', blocking_s=0.1, wait_s=0.0)
  log.write('save_committed', t=now - 1000.0 + duration_s, step=10, duration_s=duration_s)


def seconds_left(event) -> float:
  """The budget the plan saw, from its words ('<left> s left of the grace period, ...')."""
  return float(re.match(r'(-?[\d.]+) s left of the grace period', event['why']).group(1))


def test_the_budget_counts_from_the_signals_arrival_not_from_the_agreed_step(job):
  """The agreed step comes 50 s after the SIGTERM: of a 60 s grace period 10 s are left, less than a new save
  needs (1.5 x 10 s + 2 s): give up. Counted from the agreed step, 60 s would be left, and the save would start."""
  measured(job, 10.0)
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(grace_secs=60.0), interval=1000)
  ckpt.save_if_needed(11, STATE)
  fakes.preempt()
  arrival, real_time = signals.received()[1], time.time
  with mock.patch.object(time, 'time', side_effect=lambda: real_time() + 50.0):  # the loop is 50 s later
    with pytest.raises(stops.SaveFailed, match='No time left to save step 12'):
      ckpt.save_if_needed(12, STATE)
  event, = fakes.events(job, 'preemption')
  assert (event['plan'], event['signal_at']) == (grace.GIVE_UP, round(arrival, 6))
  assert 0.0 < seconds_left(event) <= 10.0, event  # 10 s, less what this test took (not 60)
  assert event['phase_s'] >= 50.0
  assert fake.orbax.attempts == []


def test_no_time_for_a_new_save_keeps_the_save_in_flight(job, monkeypatch):
  """A save takes ~100 s (150 s with the margin): the one in flight (step 20) and a new one need ~302 s of the
  250 s left, a new one alone would fit. The exit keeps step 20's save, waits for its commit, starts none of
  step 21, and names step 20."""
  measured(job, 100.0)
  monkeypatch.setattr(fakes, 'GATE_TIMEOUT_S', 60.0)  # the commit waits for the plan, however slow the machine
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(grace_secs=250.0), interval=20)
  fake.orbax.gate.clear()
  plans = []
  real_plan = grace.plan

  def plan_then_commit(ctx):  # the save in flight commits only once the plan saw it in flight
    plans.append(real_plan(ctx))
    fake.orbax.gate.set()
    return plans[-1]

  monkeypatch.setattr(grace, 'plan', plan_then_commit)
  for step in range(11, 21):
    ckpt.save_if_needed(step, STATE)  # 20: Pax's interval, a background save held at its commit
  fakes.preempt()
  with pytest.raises(stops.Preempted) as stop:
    ckpt.save_if_needed(21, STATE)
  assert [(p.action, p.kept_step) for p in plans] == [(grace.KEEP_IN_FLIGHT, 20)]
  assert stop.value.step == 21 and str(stop.value) == 'Checkpoint of step 20 committed (no time to save step 21 ' \
                                                       'as well)'
  assert fake.orbax.attempts == [20]  # no save of step 21 started
  assert layout.committed_steps(layout.checkpoint_dir(job)) == [10, 20]
  event, = fakes.events(job, 'preemption')
  assert (event['step'], event['plan'], event['saved_step']) == (21, grace.KEEP_IN_FLIGHT, 20)
  assert 200.0 < seconds_left(event) <= 250.0, event


@pytest.mark.parametrize('duration_s, plan', [(100.0, grace.SAVE), (200.0, grace.GIVE_UP)])
def test_with_nothing_in_flight_a_save_that_does_not_fit_gives_up(job, duration_s, plan):
  """250 s left, nothing in flight: a 100 s save (152 s with the margins) fits and is saved; a 200 s one (302 s)
  does not: SaveFailed (the executor exits 1, tests/test_executor.py) naming the newest committed, nothing saved."""
  measured(job, duration_s)
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(grace_secs=250.0), interval=1000)
  ckpt.save_if_needed(11, STATE)
  fakes.preempt()
  if plan == grace.SAVE:
    with pytest.raises(stops.Preempted, match='On-demand checkpoint of step 12 committed'):
      ckpt.save_if_needed(12, STATE)
    assert fake.orbax.attempts == [12]
  else:
    with pytest.raises(stops.SaveFailed) as failed:
      ckpt.save_if_needed(12, STATE)
    assert failed.value.step == 12
    assert str(failed.value).startswith('No time left to save step 12 (') and \
        str(failed.value).endswith('the newest committed checkpoint is 10')
    assert fake.orbax.attempts == []
  event, = fakes.events(job, 'preemption')
  assert (event['plan'], event['saved_step']) == (plan, 12)
  assert 200.0 < seconds_left(event) <= 250.0, event


@pytest.mark.parametrize('compression, interval_save, exit_save', [('auto', 'zstd', None), ('zstd', 'zstd', 'zstd'),
                                                                    ('none', None, None)])
def test_the_save_a_signals_exit_waits_for_is_written_raw_under_auto_and_the_others_zstd(
    job, monkeypatch, compression, interval_save, exit_save):
  """`compression=auto`: the on-demand save the exit waits for writes its chunks raw (zstd gains little on float
  weights and the grace period is short), an interval save zstd as orbax does; `zstd` and `none` apply to both.
  What each save writes is the zarr compressor orbax builds for an array while that save runs."""
  from orbax.checkpoint import type_handlers  # pylint: disable=g-import-not-at-top
  compressors, original = [], fakes.FakeHandler.async_save

  async def async_save(self, directory, *args, **kwargs):  # inside the save, where orbax builds its arrays' metadata
    meta = type_handlers._build_ts_zarr_shard_and_chunk_metadata((4,), (4,), False, np.dtype('float32'))  # pylint: disable=protected-access
    compressors.append((meta['compressor'] or {}).get('id'))
    return await original(self, directory, *args, **kwargs)

  monkeypatch.setattr(fakes.FakeHandler, 'async_save', async_save)
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(notices='off', compression=compression), interval=10)
  ckpt.save_if_needed(10, STATE)  # Pax's interval
  ckpt.save_if_needed(11, STATE)
  fakes.preempt()
  with pytest.raises(stops.Preempted, match='On-demand checkpoint of step 12 committed'):
    ckpt.save_if_needed(12, STATE)
  assert fake.orbax.attempts == [10, 12]
  assert compressors == [interval_save, exit_save]


@pytest.mark.parametrize('commits', [True, False])
def test_a_storage_outage_during_the_exit_ends_in_one_line_naming_what_this_run_knows(job, monkeypatch, commits):
  """After the signal storage stops answering (on gs:// `exists()` raises on anything but NotFound: 503 here).
  The exit still ends in its one line: the on-demand step committed by orbax's own record (Preempted, 143), or its
  save failed and the line names the newest step this run committed (SaveFailed, 1); no traceback from any thread.
  (Previous main: the OSError of the commit check escaped the exit.)"""
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(notices='off'), interval=10)
  ckpt.save_if_needed(10, STATE)  # Pax's interval: committed in this run
  ckpt.save_if_needed(11, STATE)
  ckpt.wait_until_finished()
  crashed = []
  monkeypatch.setattr(threading, 'excepthook', crashed.append)
  outage = fakes.raises(OSError('503 Service Unavailable: the bucket does not answer'))
  monkeypatch.setattr(layout, 'is_committed', outage)
  monkeypatch.setattr(layout, 'newest_committed', outage)
  if not commits:
    fake.orbax.fail_commit = OSError('503 Service Unavailable')
  fakes.preempt()
  with pytest.raises(stops.Preempted if commits else stops.SaveFailed) as stop:
    ckpt.save_if_needed(12, STATE)
  assert str(stop.value) == ('On-demand checkpoint of step 12 committed' if commits else
                             'On-demand checkpoint of step 12 failed to commit; the newest committed checkpoint is 10')
  assert ckpt.newest_committed() == (12 if commits else 10)  # what the executor's run summary names
  assert crashed == []
