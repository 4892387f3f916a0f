"""The policies as the running product asks them (issue 60): the contexts, times and metrics that
pax_autockpt.save.saves really builds, around the fake Pax checkpointer of tests/fakes.py, and orbax 0.5.9's
own deleter for Pax's max_to_keep in a real process killed mid-delete."""

import datetime
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
from unittest import mock

from etils import epath
from jax import numpy as jnp
import pytest

from pax_autockpt import layout
from pax_autockpt import policies as P
from pax_autockpt import settings as settings_lib
from pax_autockpt.hook import checkpointer as checkpointer_lib
from pax_autockpt.save import metrics as metrics_lib
from pax_autockpt.save import saves as saves_lib
from pax_autockpt.shared import events as events_lib
from pax_autockpt.startup import experiment_names
from tests import fakes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE = fakes.STATE
NOW = 1_700_000_000.0


@pytest.fixture
def job(tmp_path):
  return tmp_path / 'job'


def committed(job):
  return layout.committed_steps(layout.checkpoint_dir(job))


def earlier_run(job, saves):
  """A previous run's committed checkpoints: {step: (save start or None for no event, metrics or None)}."""
  log = events_lib.EventLog(job, 0)
  for step, (start, metrics) in saves.items():
    fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), step))
    if start is not None:
      log.write('save_started', t=start, step=step, reason='continuous', blocking_s=0.1, wait_s=0.0)
      log.write('save_committed', t=start + 1, step=step, duration_s=1.0,
                **({'metrics': metrics_lib.for_event(metrics)} if metrics else {}))


def preserved(job, policy, now=NOW, **fake_kwargs):
  """The product's preservation (the primary host after a commit) with the clock at `now`: what stays."""
  ckpt, _ = fakes.wrap(job, settings_lib.Settings(preservation_policy=policy), **fake_kwargs)
  ckpt._saves.clock = lambda: now  # pylint: disable=protected-access
  ckpt._saves.preserve()  # pylint: disable=protected-access
  return committed(job)


def test_latest_duration_deletes_in_the_running_product(job):
  """The save path once put a unix float into PreservationContext.now: LatestDuration raised on every commit
  and nothing was ever deleted (63 of 63 kept in the issue's run)."""
  earlier_run(job, {10: (NOW - 1000, None), 20: (NOW - 500, None), 30: (NOW - 50, None), 40: (NOW - 10, None)})
  policy = P.AnyPreservationPolicy([P.LatestN(1), P.LatestDuration(datetime.timedelta(seconds=100))])
  assert preserved(job, policy) == [30, 40]
  assert [e['step'] for e in fakes.events(job, 'deleted')] == [10, 20]


def test_the_preservation_context_takes_only_an_aware_datetime():
  with pytest.raises(TypeError, match=r'^PreservationContext.now=1700000000.0: use a timezone-aware datetime'):
    P.PreservationContext(now=NOW)
  with pytest.raises(TypeError):
    P.PreservationContext(now=datetime.datetime(2024, 1, 1))  # naive: orbax's datetimes are UTC-aware
  assert P.PreservationContext(now=P.utc(NOW)).now.timestamp() == NOW


def test_a_checkpoint_of_unknown_time_is_kept_by_every_n_seconds(job, monkeypatch):
  """Stock paxml's checkpoints on gs:// (no events, a prefix's mtime 0) were all dated "now": EveryNSeconds
  then kept the oldest and newest only. Unknown is kept."""
  earlier_run(job, {10: (None, None), 20: (None, None), 30: (None, None), 40: (NOW - 10, None)})
  monkeypatch.setattr(saves_lib, 'storage_time', lambda path: None)
  assert preserved(job, P.EveryNSeconds(3600)) == [10, 20, 30, 40]


def test_unknown_times_take_no_part_in_the_spacing_and_latest_duration_keeps_them():
  c = [P.CheckpointInfo.at(1, NOW), P.CheckpointInfo.at(2, None), P.CheckpointInfo.at(3, NOW + 10),
       P.CheckpointInfo.at(4, NOW + 100), P.CheckpointInfo.at(5, None)]
  context = P.PreservationContext(now=P.utc(NOW + 1000))
  assert P.EveryNSeconds(50).should_preserve(c, context=context) == [True, True, False, True, True]
  assert P.LatestDuration(datetime.timedelta(seconds=950)).should_preserve(c, context=context) == [
      False, True, False, True, True]
  assert P.ContinuousCheckpointingPolicy(minimum_interval_secs=60).should_save(
      P.CheckpointInfo.at(6, NOW), c[-1:], context=P.DecisionContext(is_saving_in_progress=False))


def test_a_checkpoint_s_time_is_read_from_storage_where_it_can_be(job, monkeypatch):
  """No event: its directory's mtime on a local disk; on gs:// (a prefix has mtime 0) its commit marker's."""
  earlier_run(job, {10: (None, None), 20: (None, None), 30: (None, None), 40: (NOW - 10, None)})
  for step, ago in ((10, 7200), (20, 7000), (30, 3500)):
    os.utime(layout.step_dir(layout.checkpoint_dir(job), step), (NOW - ago, NOW - ago))
  assert preserved(job, P.EveryNSeconds(3600)) == [10, 30, 40]

  gs = epath.Path('gs://bucket/job/checkpoints/checkpoint_00000010')
  stat = lambda path: mock.Mock(mtime=NOW if path.name == layout.COMMIT_MARKER else 0)  # noqa: E731
  monkeypatch.setattr(type(gs), 'stat', stat)
  assert saves_lib.storage_time(gs) == NOW
  monkeypatch.setattr(type(gs), 'stat', mock.Mock(side_effect=OSError('503')))
  assert saves_lib.storage_time(gs) is None  # an outage: unknown, so kept


def train(ckpt, step_metrics, losses):
  for step, loss in losses.items():
    step_metrics.train_output(step, jnp.float32(loss), {})
    ckpt.save_if_needed(step, STATE)
    ckpt.wait_until_finished()


def test_the_history_carries_the_metrics_from_the_commit(job):
  """An orbax-style save policy reading previous_steps[-1].metrics: the entry made at the save's start is
  updated at its commit (it raised, into Pax's loop, on every step after this run's first save)."""
  seen = []

  class SaveWhenLossFell:

    def should_save(self, step, previous_steps, *, context):
      del context
      seen.append(previous_steps[-1].metrics if previous_steps else None)
      return not previous_steps or previous_steps[-1].metrics['train/loss'] > 1.0

  step_metrics = metrics_lib.StepMetrics()
  ckpt, fake = fakes.wrap(job, settings_lib.Settings(save_policy=SaveWhenLossFell()), metrics=step_metrics)
  train(ckpt, step_metrics, {1: 2.0, 2: 0.5, 3: 0.7, 4: 0.1})
  assert fake.orbax.attempts == [1, 2]
  assert seen == [None, {'train/loss': 2.0}, {'train/loss': 0.5}, {'train/loss': 0.5}]


@pytest.mark.parametrize('where', ['save', 'preservation'])
def test_a_policy_that_raises_costs_one_warning_and_no_save_or_delete(job, caplog, where):
  """Never the run: the exception must not escape into Pax's loop (or the save thread)."""

  class Broken:

    def should_save(self, step, previous_steps, *, context):
      raise KeyError('train/loss')

    def should_preserve(self, checkpoints, *, context):
      raise KeyError('train/loss')

  caplog.set_level(logging.WARNING)
  settings = settings_lib.Settings(**{f'{where}_policy': Broken()})
  ckpt, fake = fakes.wrap(job, settings, interval=1)
  for step in (1, 2, 3):
    ckpt.save_if_needed(step, STATE)
    ckpt.wait_until_finished()
  assert fake.orbax.attempts == ([] if where == 'save' else [1, 2, 3])
  lines = [r for r in caplog.records if "KeyError: 'train/loss'" in r.getMessage()]
  assert lines and all(r.levelno == logging.WARNING and '\n' not in r.getMessage() for r in lines)
  assert len(lines) == (1 if where == 'save' else 3)  # a save policy's: at most one a minute
  assert fakes.events(job, 'deleted') == []


def test_nan_and_inf_rank_worst_for_best_n():
  nan, inf = math.nan, math.inf
  c = [P.CheckpointInfo.at(s, NOW + s, {'loss': v}) for s, v in enumerate([1.0, nan, 0.5, inf, -inf, nan, 2.0])]
  context = P.PreservationContext()
  low = P.BestN(metric='loss', reverse=True, n=2).should_preserve(c, context=context)
  assert low == [True, False, True, False, False, False, False]  # the lowest two; -inf is no "lowest"
  high = P.BestN(get_metric_fn=lambda m: m['loss'], n=2).should_preserve(c, context=context)
  assert high == [True, False, False, False, False, False, True]  # the highest two; +inf is no "highest"
  worst_kept = P.BestN(metric='loss', n=5).should_preserve(c, context=context)
  assert worst_kept == [True, False, True, False, True, True, True]  # non-finite: the newest of them first


def test_best_n_deletes_a_diverged_run_s_checkpoints(job):
  """keep_best=2 after the loss went NaN: the NaN checkpoints are deleted (all but the newest, never deleted);
  they were once left out of the metrics and kept as "without metrics" (43 of 44 in the issue's run)."""
  step_metrics = metrics_lib.StepMetrics()
  ckpt, _ = fakes.wrap(job, settings_lib.Settings(keep_best=2), metrics=step_metrics, interval=10)
  train(ckpt, step_metrics, {10: 3.0, 20: 2.0, 30: math.nan, 40: math.inf, 50: math.nan})
  assert committed(job) == [10, 20, 50]
  assert fakes.events(job, 'save_committed')[-1]['metrics'] == {'train/loss': 'nan'}


def test_an_absurd_grace_period_is_one_line_and_exit_2(tmp_path, grace='1e10'):
  """1e10 ("no deadline") was accepted, then every wait raised OverflowError at SIGTERM (inf, nan and
  more than a week: tests/test_settings.py)."""
  out = subprocess.run([sys.executable, '-m', 'pax_autockpt.main', f'--exp={experiment_names.EXAMPLE}',
                        f'--job_log_dir={tmp_path}/job', f'--autockpt_grace_secs={grace}'],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert out.returncode == 2, out.stderr
  line, = out.stderr.strip().splitlines()
  assert line.startswith('error: --autockpt_grace_secs=') and 'at most 604800 (a week)' in line, line


def test_pax_s_max_to_keep_goes_through_the_commit_first_deleter(job):
  """No preservation policy: orbax's deleter (what max_to_keep deletes through) is replaced, on every host,
  and only the primary deletes; a delete leaves the policies' history."""
  fake = fakes.FakePaxCheckpointer(job, interval=10)
  fake.orbax._checkpoint_deleter = 'orbax'  # pylint: disable=protected-access
  ckpt = checkpointer_lib.AutockptCheckpointer(fake, settings=settings_lib.Settings(),
                                               events=events_lib.EventLog(job, 0), enable_summaries=False,
                                               exit_after_ondemand_checkpoint=True)
  deleter = fake.orbax._checkpoint_deleter  # pylint: disable=protected-access
  assert deleter != 'orbax'
  ckpt._startup.first_step_done()  # pylint: disable=protected-access
  for step in (10, 20):
    ckpt.save_if_needed(step, STATE)
  ckpt.wait_until_finished()
  deleter.delete_steps([10, 99])  # 99: no such step, one line
  assert committed(job) == [20]
  assert [c.step for c in ckpt._saves._history] == [20]  # pylint: disable=protected-access


KILLED_MID_DELETE = textwrap.dedent('''
    """orbax 0.5.9's CheckpointManager with max_to_keep=1, SIGKILLed after the delete's first file."""
    import os, signal, sys
    import numpy as np
    import orbax.checkpoint as ocp
    from etils import epath
    from pax_autockpt.shared import internals

    directory, hooked = epath.Path(sys.argv[1]), sys.argv[2] == 'hooked'
    manager = ocp.CheckpointManager(directory, ocp.PyTreeCheckpointer(), ocp.CheckpointManagerOptions(
        max_to_keep=1, step_prefix='checkpoint', step_format_fixed_length=8))
    if hooked:
      internals.delete_commit_first(manager, primary=True, deleted=lambda step: None)
    manager.save(0, {f'a{i}': np.arange(8) for i in range(4)})
    manager.wait_until_finished()

    def rmtree(self, missing_ok=False):  # deletes one file, then the process is killed
      os.remove(next(os.path.join(d, f) for d, _, files in os.walk(self) for f in files))
      os.kill(os.getpid(), signal.SIGKILL)

    type(directory).rmtree = rmtree
    manager.save(1, {f'a{i}': np.arange(8) for i in range(4)})
    manager.wait_until_finished()
''')


@pytest.mark.parametrize('hooked', [True, False], ids=['commit_first', 'orbax_own'])
def test_a_kill_mid_delete_of_max_to_keep_leaves_nothing_that_looks_committed(tmp_path, hooked):
  """A real process killed in the middle of max_to_keep's delete of step 0: with the commit-first deleter
  the half-deleted step is not committed; orbax's own rmtree of the final name leaves it "committed"."""
  directory = tmp_path / 'checkpoints'
  out = subprocess.run([sys.executable, '-c', KILLED_MID_DELETE, str(directory), 'hooked' if hooked else 'own'],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
  assert layout.committed_steps(directory) == ([1] if hooked else [0, 1])
  if not hooked:  # what orbax's own delete leaves: step 0, "committed", with a file missing
    assert layout.is_committed(layout.step_dir(directory, 0))
