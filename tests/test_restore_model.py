"""The restore's choice checked against a reference model of the job's lineage (tests/restore_model.py), over
histories Hypothesis generates: saves started and committed on the job directory and the local tier, deletions
by the policy and by a user (rollback), set-asides, copies of the job directory, retrains to an earlier number
(by the job, and in place by a tool), SIGKILLs anywhere, buddy copies, hosts replaced. Each history is written
on disk as the product writes it (the real job-directory layout and event log, real local-tier steps with tiny
arrays, each local step's lineage from the product's own tracker); at every restart the product's choice
(`restoring.decide`, the plan a restart makes, on one host or agreed on two) must be the model's newest state,
never one the model forbids. `make test` runs a bounded number of histories; AUTOCKPT_SOAK_HISTORIES=N (or
`pytest -m soak`) many more. Failing histories found stay below as `@example`-like recorded tests."""

import os
import shutil
import tempfile

from etils import epath
import hypothesis
from hypothesis import stateful
from hypothesis import strategies as st
import numpy as np
import pytest

from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt.local import format as local_format
from pax_autockpt.local import lineage as lineage_lib
from pax_autockpt.local import restoring
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import manifest as manifest_lib
from pax_autockpt.tools import status
from tests import fakes
from tests import restore_model

HISTORIES = int(os.environ.get('AUTOCKPT_SOAK_HISTORIES', '0')) or 25
ROOT = '/dev/shm' if os.path.isdir('/dev/shm') else None


def _snapshot(host: int, hosts: int, step: int) -> local_format.Snapshot:
  """Host `host`'s shard of a tiny model split over the hosts (no replica: a buddy copy is the only other)."""
  return local_format.Snapshot({'w': ((hosts,), 'float32', {f'{host}:{host + 1}': np.array([step], np.float32)})},
                               None)


class Disk:
  """One job directory and its hosts' local directories, written by the product's writers."""

  def __init__(self, root: str, hosts: int):
    self.root, self.hosts = epath.Path(root), hosts
    self.job = self.root / 'job'
    self.folders = [self.root / f'local-{h}' for h in range(hosts)]
    self.logs = [events_lib.EventLog(self.job, h) for h in range(hosts)]
    self.ckpt = layout.checkpoint_dir(self.job)
    self.needs = {h: local_format.fingerprint_of(_snapshot(h, hosts, 0)) for h in range(hosts)}

  def write_local(self, host: int, step: int, lineage: lineage_lib.Lineage, folder: epath.Path | None = None) -> None:
    snap = _snapshot(host, self.hosts, step)
    partial, arrays = local_format.write_part(folder or self.folders[host], step, snap)
    local_format.commit(partial, local_format.index(step, host, self.hosts, local_format.fingerprint_of(snap), arrays,
                                                    dict.fromkeys(range(self.hosts)), None, lineage))

  def write_ckpt(self, step: int, save: str | None) -> None:
    path = layout.step_dir(self.ckpt, step)
    fakes.write_checkpoint(path)
    for h in range(self.hosts):
      manifest_lib.write(path, {'format': manifest_lib.FORMAT, 'hash': manifest_lib.HASH, 'host': h,
                                'hosts': self.hosts, 'arrays': {'w': {f'{h}:{h + 1}': '0'}},
                                **({'save': save} if save else {})})

  def choice(self, job: str) -> tuple[int | None, str, str | None]:
    """(step, tier, lineage token of the local copy restored) of the product's choice."""
    plan, newest, _ = restoring.decide(self.job, dict(enumerate(self.folders)), self.needs, job=job)
    if plan is None:
      return newest, 'job_dir', None
    donor = plan.donors[0]
    buddy = 0 in plan.sources and plan.sources[0][0][1]
    folder = layout.local_buddy_dir(self.folders[donor]) if buddy else self.folders[donor]
    found = local_format.read_index(layout.local_step_dir(folder, plan.step))
    return plan.step, 'local', local_format.lineage_of(found).token


class Run:
  """A live run: the product's lineage tracker and where the model says it trains."""

  def __init__(self, job: str, run: str, node: int | None, step: int):
    self.tracker = lineage_lib.Tracker(job, run)
    self.node, self.step = node, step
    self.last_local = self.last_save = step
    self.pending: tuple[int, str, int] | None = None  # (step, save id, node) of the save in flight


class History(stateful.RuleBasedStateMachine):
  """See the module docstring."""

  def __init__(self):
    super().__init__()
    self.tmp = tempfile.mkdtemp(dir=ROOT, prefix='restore-model-')
    self.disk: Disk | None = None
    self.model: restore_model.Model | None = None
    self.run: Run | None = None
    self.nodes: dict[tuple[str, int], int] = {}  # (lineage token, step) -> model node of a local step
    self.job = ''
    self.forks = 0
    self.unrecorded: set[int] = set()  # checkpoints committed with their events lost
    self.exact = False  # generated histories: an older state of the same line is allowed where evidence is missing
    self.run_ids: list[str] = []
    self.tooled: set[int] = set()  # steps a tool rewrote in place (no save id)

  def teardown(self):
    shutil.rmtree(self.tmp, ignore_errors=True)

  @stateful.initialize(hosts=st.sampled_from([1, 2]))
  def start(self, hosts):
    self.disk, self.model = Disk(self.tmp, hosts), restore_model.Model(hosts)
    self.job, _ = lineage_lib.identify(self.disk.job, 0)

  # --- a run ---------------------------------------------------------------------------------

  def _node_at(self, step: int) -> int:
    """The model's node of the live run's state at `step` (one node whichever tiers save it)."""
    run = self.run
    if run.node is None or self.model.nodes[run.node].step != step:
      run.node = self.model.new(step, run.node)
    return run.node

  @stateful.precondition(lambda self: self.run is None)
  @stateful.rule()
  def restart(self):
    """The product's choice against the model's, then a run from it."""
    step, tier, token = self.disk.choice(self.job)
    if tier == 'local':
      node = self.nodes[(token, step)]
    else:
      node = None if step is None else self.model.ckpts[step]
    self._check(tier, step, node)
    _, run_id = lineage_lib.identify(self.disk.job, 0)
    self.run_ids.append(run_id)
    for log in self.disk.logs:  # as the executor writes it, after the restore
      log.write('start', restored_step=step, restored_from=tier if step is not None else None)
    self.run = Run(self.job, run_id, node, 0 if step is None else step)
    if tier == 'local':
      found = local_format.read_index(layout.local_step_dir(self._holder(step, token), step))
      self.run.tracker.restored(step, local_format.lineage_of(found))
    elif step is not None:
      state = restoring.job_state(self.disk.job, self.job, 0)  # as the restorer (restore.Restorer.restored_save)
      self.run.tracker.restored(step, save=restoring.restored_save(state, step))
    else:
      self.run.tracker.restored(None)

  def _holder(self, step: int, token: str) -> epath.Path:
    for folder in (*self.disk.folders, *[layout.local_buddy_dir(f) for f in self.disk.folders]):
      path = layout.local_step_dir(folder, step)
      if path.exists() and local_format.lineage_of(local_format.read_index(path)).token == token:
        return folder
    raise AssertionError(f'no copy of local step {step} of {token}')

  @stateful.precondition(lambda self: self.run is not None)
  @stateful.rule(steps=st.integers(1, 40))
  def train(self, steps):
    self.run.step += steps

  @stateful.precondition(lambda self: self.run is not None and self.run.step > self.run.last_local)
  @stateful.rule(killed_after=st.integers(0, 2))
  def local_save(self, killed_after):
    """Every host writes its part and commits; `killed_after` < hosts: a SIGKILL after that many hosts
    renamed theirs (the others' stay `.partial`)."""
    run, step = self.run, self.run.step
    node, lineage = self._node_at(step), run.tracker.at(step)
    run.last_local = step
    self.nodes[(lineage.token, step)] = node
    for h in range(self.disk.hosts):
      if h >= killed_after and killed_after < self.disk.hosts:
        local_format.write_part(self.disk.folders[h], step, _snapshot(h, self.disk.hosts, step))
        continue
      self.disk.write_local(h, step, lineage)
      self.model.local[h][step] = node
      self._prune(h)
    if killed_after < self.disk.hosts:
      self.run = None

  def _prune(self, host: int) -> None:
    """The newest three own steps stay (the product prunes too): the histories stay small."""
    for step in sorted(self.model.local[host])[:-3]:
      shutil.rmtree(layout.local_step_dir(self.disk.folders[host], step), ignore_errors=True)
      del self.model.local[host][step]

  @stateful.precondition(lambda self: self.run is not None and self.run.pending is None
                         and self.run.step > self.run.last_save and self.run.step not in self.model.ckpts
                         and self.run.step not in self.model.aside)
  @stateful.rule()
  def save_start(self):
    run, step = self.run, self.run.step
    save = run.tracker.save_id(step)
    run.pending, run.last_save = (step, save, self._node_at(step)), step
    run.tracker.save_started(step, save)
    grew = run.tracker.at(step)  # as pax_autockpt.save.saves writes it
    line = {'handed': [list(h) for h in grew.handed], 'base': grew.base_id}
    for log in self.disk.logs:
      log.write('save_started', step=step, reason='continuous', id=save, **{k: v for k, v in line.items() if v})

  @stateful.precondition(lambda self: self.run is not None and self.run.pending is not None)
  @stateful.rule()
  def save_commit(self):
    step, save, node = self.run.pending
    self.disk.write_ckpt(step, save)
    for log in self.disk.logs:
      log.write('save_committed', step=step, duration_s=0.1, bytes=1, manifest=True, id=save)
    self.run.tracker.save_committed(step)
    self.model.ckpts[step] = node
    self.run.pending = None

  @stateful.precondition(lambda self: self.run is not None and self.run.pending is None and len(self.model.ckpts) > 1)
  @stateful.rule(data=st.data())
  def policy_delete(self, data):
    """The preservation policy (host 0, after a commit) deletes an older checkpoint, with its record."""
    step = data.draw(st.sampled_from(sorted(self.model.ckpts)[:-1]))
    save = manifest_lib.save_id(layout.step_dir(self.disk.ckpt, step)) or ''  # as JobDirectorySaves.preserve
    layout.uncommit_and_delete(layout.step_dir(self.disk.ckpt, step))
    self.disk.logs[0].write('deleted', step=step, policy='keep', id=save)
    del self.model.ckpts[step]

  @stateful.precondition(lambda self: self.run is not None and self.run.pending is None
                         and self.run.step + 1 not in self.model.ckpts and self.run.step + 1 not in self.model.aside)
  @stateful.rule()
  def sigterm(self):
    """An on-demand save at the agreed step, committed, then the exit."""
    self.run.step += 1
    self.save_start()
    self.save_commit()
    self.run = None

  @stateful.precondition(lambda self: self.run is not None)
  @stateful.rule(committed=st.booleans())
  def sigkill(self, committed):
    """A SIGKILL: a save in flight is lost, or committed on disk with its `save_committed` events lost (a
    gs:// log's queue): the checkpoint's manifest still names its save."""
    if self.run.pending is not None and committed:
      step, save, node = self.run.pending
      self.disk.write_ckpt(step, save)
      self.model.ckpts[step] = node
      self.unrecorded.add(step)
    self.run = None

  # --- between runs ---------------------------------------------------------------------------

  @stateful.precondition(lambda self: self.run is None and self.model.ckpts)
  @stateful.rule()
  def rollback(self):
    """The user deletes the newest checkpoint (docs/local-tier.md's rollback): no record."""
    step = max(self.model.ckpts)
    hypothesis.assume(step not in self.unrecorded)  # a commit no log records: see docs/local-tier.md's limits
    shutil.rmtree(layout.step_dir(self.disk.ckpt, step))
    self.model.delete_by_user(step)

  @stateful.precondition(lambda self: self.run is None and self.model.ckpts)
  @stateful.rule()
  def set_aside(self):
    """A restore finds the newest checkpoint damaged and sets it aside."""
    step = max(self.model.ckpts)
    for log in self.disk.logs:  # as the restorer writes it, before it sets the checkpoint aside
      log.write('restore_skipped', step=step, error='damaged')
    layout.set_aside_damaged(self.disk.job, layout.step_dir(self.disk.ckpt, step), 'damaged')
    self.model.aside[step] = self.model.ckpts.pop(step)

  @stateful.precondition(lambda self: self.run is None and self.model.ckpts)
  @stateful.rule(own_manifest=st.booleans())
  def tool_retrain(self, own_manifest):
    """A tool rewrites the newest checkpoint in place (retrained from the one before), writing no events: with
    a stock manifest (no save id), or none at all."""
    step = max(self.model.ckpts)
    # Limits (docs/local-tier.md): a commit no log records; a tool's checkpoint (no id) rewritten again.
    hypothesis.assume(step not in self.unrecorded and step not in self.tooled)
    self.tooled.add(step)
    path = layout.step_dir(self.disk.ckpt, step)
    shutil.rmtree(path)
    if own_manifest:
      self.disk.write_ckpt(step, None)
    else:
      fakes.write_checkpoint(path)
    old = self.model.ckpts.pop(step)
    below = [s for s in self.model.ckpts if s < step]
    self.model.ckpts[step] = self.model.new(step, self.model.ckpts[max(below)] if below else None)
    self.model.mark(old)

  @stateful.precondition(lambda self: self.run is None)
  @stateful.rule(step=st.integers(0, 300))
  def fork(self, step):
    """A copy of the job directory runs with the same local directories: another job's steps land there."""
    self.forks += 1
    copy = self.disk.root / f'fork-{self.forks}'
    shutil.copytree(self.disk.job, copy)
    job, run = lineage_lib.identify(copy, 0)
    lineage = lineage_lib.Tracker(job, run).at(step)
    node = self.model.new(step, None, job='fork')
    self.nodes[(lineage.token, step)] = node
    for h in range(self.disk.hosts):
      self.disk.write_local(h, step, lineage)
      self.model.local[h][step] = node

  @stateful.precondition(lambda self: self.run is None and self.disk.hosts > 1)
  @stateful.rule(host=st.integers(0, 1))
  def replace_host(self, host):
    """A replaced VM: its local directory is empty."""
    shutil.rmtree(self.disk.folders[host], ignore_errors=True)
    self.model.local[host], self.model.buddy[host] = {}, {}

  @stateful.precondition(lambda self: self.run is not None and self.disk.hosts > 1)
  @stateful.rule(host=st.integers(0, 1))
  def buddy_copy(self, host):
    """`host` keeps its neighbour's newest committed local step in buddy/ (pax_autockpt.local.buddy)."""
    neighbour = (host + 1) % self.disk.hosts
    held = self.model.local[neighbour]
    hypothesis.assume(held)
    step = max(held)
    target = layout.local_step_dir(layout.local_buddy_dir(self.disk.folders[host]), step)
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(layout.local_step_dir(self.disk.folders[neighbour], step), target)
    self.model.buddy[host] = {step: held[step]}
    for old in layout.local_committed_steps(target.parent):
      if old != step:
        shutil.rmtree(layout.local_step_dir(target.parent, old))

  @stateful.precondition(lambda self: self.run is None and any(self.model.local))
  @stateful.rule(data=st.data())
  def damage_local(self, data):
    """A flipped byte in a local step's shards: damaged, never restored."""
    host = data.draw(st.sampled_from([h for h in range(self.disk.hosts) if self.model.local[h]]))
    step = data.draw(st.sampled_from(sorted(self.model.local[host])))
    shards = layout.local_step_dir(self.disk.folders[host], step) / layout.LOCAL_SHARDS
    data_ = bytearray(shards.read_bytes())
    data_[0] ^= 0xFF
    shards.write_bytes(bytes(data_))
    del self.model.local[host][step]

  @stateful.precondition(lambda self: self.run is None)
  @stateful.invariant()
  def the_choice_is_the_models(self):
    if self.disk is not None:
      step, tier, token = self.disk.choice(self.job)
      node = self.nodes[(token, step)] if tier == 'local' else (None if step is None else self.model.ckpts[step])
      self._check(tier, step, node)

  def _check(self, tier: str, step: int | None, node: int | None) -> None:
    """The product's choice is a state the model allows, and its newest; where the log lacks the evidence (not
    for a recorded replay: `exact`), an older state of the same line (a fresh start: the oldest), never another
    line's."""
    newest = self.model.newest()
    assert self.model.allowed(node), ('forbidden', tier, step, node, newest)
    if node != newest:
      assert not self.exact and newest is not None and (node is None or node in self.model.line(newest)), (
          'not the newest', tier, step, node, newest and self.model.nodes[newest])
      if hypothesis.currently_in_test_context():
        hypothesis.event('conservative: an older state of the same line than the newest allowed')


History.TestCase.settings = hypothesis.settings(max_examples=HISTORIES, stateful_step_count=25, deadline=None,
                                                suppress_health_check=list(hypothesis.HealthCheck))
test_the_restore_choice_is_the_models = History.TestCase


class SoakHistory(History):
  """The same, many more and longer histories (`make soak`, or `pytest -m soak`)."""


SoakHistory.TestCase.settings = hypothesis.settings(max_examples=int(os.environ.get('AUTOCKPT_SOAK_HISTORIES', '3000')),
                                                    stateful_step_count=40, deadline=None,
                                                    suppress_health_check=list(hypothesis.HealthCheck))
test_soak_the_restore_choice_is_the_models = pytest.mark.soak(SoakHistory.TestCase)


def _replay(hosts: int, *steps: tuple[str, dict], exact: bool = True) -> History:
  """A recorded history (a failure Hypothesis found, or a case the review named), replayed step by step; the
  product's choice must be the model's newest (`exact`), else may be an older state of the same line."""
  history = History()
  history.exact = exact
  try:
    history.start(hosts=hosts)
    for name, args in steps:
      getattr(history, name)(**args)
      if history.run is None:
        history.the_choice_is_the_models()
  finally:
    history.teardown()
  return history


@pytest.mark.parametrize('hosts', [1, 2])
def test_a_rollback_holds_against_an_older_local_step_of_the_discarded_line(hosts):
  """Found by the stateful test (issue 57's first case): local step 1, then SIGTERM's on-demand save of 2; the
  user deletes checkpoint 2 to roll back to a fresh start. Local step 1 is older than 2 and grew from nothing
  that is gone, but it is the line the rollback discarded: the restart starts fresh."""
  _replay(hosts, ('restart', {}), ('train', {'steps': 1}), ('local_save', {'killed_after': 2}), ('sigterm', {}),
          ('rollback', {}))


def test_a_rollback_to_an_older_checkpoint_holds_against_the_local_steps_between():
  """The issue's end-to-end case in small: checkpoint 5, local steps 9 and 12, 13 saved on SIGTERM, 13 deleted:
  the restart restores 5, not 12; a run retrained from 5 after it may use its own local steps."""
  history = _replay(1, ('restart', {}), ('train', {'steps': 5}), ('save_start', {}), ('save_commit', {}),
                    ('train', {'steps': 4}), ('local_save', {'killed_after': 1}), ('train', {'steps': 3}),
                    ('local_save', {'killed_after': 1}), ('sigterm', {}), ('rollback', {}), ('restart', {}),
                    ('train', {'steps': 2}), ('local_save', {'killed_after': 1}), ('sigkill', {'committed': False}))
  assert history.model.nodes[history.model.newest()].step == 7  # the retrained line's own local step


@pytest.mark.parametrize('own_manifest', [True, False])
def test_a_checkpoint_retrained_in_place_by_a_tool_refuses_the_local_steps_of_the_old_save(own_manifest):
  """Issue 57's fourth case: checkpoint 5 (its save's id in its manifest and in the log), local step 10 grown
  from it; a tool rewrites 5 in place and writes no events. The log still names the old save: only the
  checkpoint's own record (a manifest without that id, or none) shows that 5 is another save now."""
  _replay(1, ('restart', {}), ('train', {'steps': 5}), ('save_start', {}), ('save_commit', {}),
          ('train', {'steps': 5}), ('local_save', {'killed_after': 1}), ('sigkill', {'committed': False}),
          ('tool_retrain', {'own_manifest': own_manifest}))


def test_a_retrain_whose_save_committed_event_was_lost_refuses_the_old_lines_local_steps():
  """Checkpoint 5 (save r1), local step 10 grown from it; the user rolls 5 back, a new run retrains to 5 and is
  SIGKILLed as that save commits: its `save_committed` never reaches the log (a gs:// queue), which still
  names r1's. The checkpoint's manifest names the new save: local step 10 is refused."""
  _replay(1, ('restart', {}), ('train', {'steps': 5}), ('save_start', {}), ('save_commit', {}),
          ('train', {'steps': 5}), ('local_save', {'killed_after': 1}), ('sigkill', {'committed': False}),
          ('rollback', {}), ('restart', {}), ('train', {'steps': 5}), ('save_start', {}),
          ('sigkill', {'committed': True}))


@pytest.mark.usefixtures('clean_signals')
def test_a_save_writes_its_id_into_the_checkpoints_manifest(tmp_path):
  """The checkpoint's own record of which save it is, the one its events name (with a local tier)."""
  job, settings = tmp_path / 'job', settings_lib.Settings(local_dir=str(tmp_path / 'local'))
  ckpt, _ = fakes.wrap(job, settings)
  ckpt.save_if_needed(10, fakes.STATE)
  ckpt.wait_until_finished()
  committed, = fakes.events(job, 'save_committed')
  assert manifest_lib.save_id(layout.step_dir(layout.checkpoint_dir(job), 10)) == committed['id']


def test_status_never_promises_a_resume_the_restore_refuses(capsys):
  """Issue 57's third case, on the rolled-back job: local step 12 grew from checkpoint 5 in the line of 13,
  which the user deleted. The restore refuses 12; `status` asks the same decision and says so."""
  history = History()
  try:
    history.start(hosts=1)
    for name, args in [('restart', {}), ('train', {'steps': 5}), ('save_start', {}), ('save_commit', {}),
                       ('train', {'steps': 7}), ('local_save', {'killed_after': 1}), ('sigterm', {}),
                       ('rollback', {})]:
      getattr(history, name)(**args)
    template = str(history.disk.root / 'local-{host}')
    assert status.run(str(history.disk.job), local_dir=template) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith('newest committed checkpoint: step 5, which the same command resumes from')
    assert lines[1].startswith('local tier: step 12 committed on host 0 (in ')
    assert lines[1].endswith(', not offered to a restart: checkpoint 13 of its line of training (save '
                             f'{history.run_ids[-1][:16]}-13) was deleted from the job directory (rolled back, no '
                             '`deleted` record): restoring it would undo the rollback')
    history.restart()  # the restore's own choice: checkpoint 5; the retrained line's local step 15 is taken
    history.train(steps=10)
    history.local_save(killed_after=1)
    history.sigkill(committed=False)
    assert status.run(str(history.disk.job), local_dir=template) == 0
    assert capsys.readouterr().out.splitlines()[1].endswith(', newer: the same command resumes from it')
  finally:
    history.teardown()


def test_a_rollback_on_a_line_beside_a_set_aside_checkpoint_keeps_the_checkpoint_it_rolls_back_to():
  """Found by the soak (a defect of the model): 3 set aside, a new line saves 1 and 2, 2 is rolled back: the
  job directory's 1 is what the rollback keeps, whatever newer checkpoint another line set aside."""
  _replay(1, ('restart', {}), ('train', {'steps': 2}), ('sigterm', {}), ('set_aside', {}), ('restart', {}),
          ('sigterm', {}), ('restart', {}), ('sigterm', {}), ('rollback', {}))


def test_a_checkpoint_retrained_by_a_tool_then_set_aside_is_still_another_save():
  """Found by the soak: local step 1, checkpoint 2 saved on SIGTERM, a tool retrains 2 in place, the restore sets
  the new 2 aside as damaged: the save id is read from the set-aside checkpoint too, and local step 1 (the
  line the tool's retrain replaced) stays refused."""
  _replay(1, ('restart', {}), ('train', {'steps': 1}), ('local_save', {'killed_after': 1}), ('sigterm', {}),
          ('tool_retrain', {'own_manifest': False}), ('set_aside', {}))


def test_a_run_restored_from_a_checkpoint_a_tool_retrained_grows_from_that_checkpoint_not_the_logs_save():
  """Found by the soak: checkpoint 7 retrained in place by a tool (no id); a run restores it and saves local
  step 8. Its base is the checkpoint it restored, not the save the log names for 7 (the one the tool
  replaced): local step 8 is offered."""
  _replay(1, ('restart', {}), ('train', {'steps': 7}), ('sigterm', {}), ('restart', {}), ('sigterm', {}),
          ('rollback', {}), ('tool_retrain', {'own_manifest': False}), ('restart', {}), ('train', {'steps': 1}),
          ('local_save', {'killed_after': 1}), ('sigkill', {'committed': False}))


def test_a_rollback_of_a_save_grown_from_a_restored_local_step_discards_that_local_step():
  """Found by the soak: run A saves local step 19 and is killed; run B restores it and saves 20 on SIGTERM; the
  user deletes 20. Local step 19 is A's, 20 is B's: only 20's `save_started` (`handed`: B carries on A's line
  from 19) shows that 19 is in the line the rollback discarded."""
  _replay(1, ('restart', {}), ('sigterm', {}), ('restart', {}), ('train', {'steps': 18}),
          ('local_save', {'killed_after': 1}), ('sigkill', {'committed': False}), ('restart', {}), ('sigterm', {}),
          ('rollback', {}))


@pytest.mark.usefixtures('clean_signals')
def test_a_save_after_a_local_restore_records_the_line_it_carries_on(tmp_path):
  """The `save_started` event names the runs whose line the save carries on (`handed`), which a rollback of it
  discards too."""
  job, settings = tmp_path / 'job', settings_lib.Settings(local_dir=str(tmp_path / 'local'))
  ckpt, _ = fakes.wrap(job, settings)
  ckpt._lineage.restored(19, lineage_lib.Lineage('job', 'run-a', None))  # pylint: disable=protected-access
  ckpt.save_if_needed(20, fakes.STATE)
  ckpt.wait_until_finished()
  started, = fakes.events(job, 'save_started')
  assert started['handed'] == [['run-a', 19]] and 'base' not in started  # it grew from no checkpoint
  assert lineage_lib.save_lines([started]) == {started['id']: ((started['id'].rsplit('-', 1)[0], 20), ('run-a', 19))}


def test_a_rollback_discards_the_line_through_a_checkpoint_preservation_deleted():
  """Found by the soak: run A saves local step 5 and checkpoint 6; run B restores 6 and saves 7; preservation
  deletes 6 (recorded); the user deletes 7, the last checkpoint. Local step 5 is in 7's line (through 6, whose
  `save_started` 7's names as its `base`): the restart starts fresh."""
  _replay(1, ('restart', {}), ('train', {'steps': 5}), ('local_save', {'killed_after': 1}), ('sigterm', {}),
          ('restart', {}), ('sigterm', {}), ('restart', {}), ('policy_delete', {'data': _Draw(6)}),
          ('sigkill', {'committed': False}), ('rollback', {}))


class _Draw:
  """A recorded `st.data()` draw."""

  def __init__(self, value):
    self.value = value

  def draw(self, _):
    return self.value


def test_a_rollback_keeps_a_local_step_that_is_the_state_of_the_set_aside_checkpoint_it_rolls_back_to():
  """Found by the soak: run A's local step 1 and checkpoint 1 are one state; 1 is set aside, run B restores
  local step 1 and saves 2 on SIGTERM; the user deletes 2. The rollback keeps 1 (set aside, its state sound):
  local step 1, the same run's at the same step, is that state and is restored."""
  _replay(1, ('restart', {}), ('train', {'steps': 1}), ('local_save', {'killed_after': 1}), ('save_start', {}),
          ('save_commit', {}), ('sigkill', {'committed': False}), ('set_aside', {}), ('restart', {}),
          ('sigterm', {}), ('rollback', {}))


def test_a_base_preservation_deleted_under_a_set_aside_checkpoint_of_the_same_line_is_no_rollback():
  """Found by the soak: run B's local step 2 and checkpoint 2 are one state, grown from checkpoint 1; 2 is set
  aside, run C restores local step 2 and saves 3; preservation deletes 1, the user deletes 3. The rollback keeps
  the set-aside 2, newer than the deleted base 1 in the same line: local step 2 is restored."""
  _replay(1, ('restart', {}), ('sigterm', {}), ('restart', {}), ('train', {'steps': 1}),
          ('local_save', {'killed_after': 1}), ('save_start', {}), ('save_commit', {}),
          ('sigkill', {'committed': False}), ('set_aside', {}), ('restart', {}), ('sigterm', {}), ('restart', {}),
          ('train', {'steps': 1}), ('policy_delete', {'data': _Draw(1)}), ('sigkill', {'committed': False}),
          ('rollback', {}))


def test_a_rollback_keeps_a_local_step_older_than_the_set_aside_checkpoint_grown_from_it():
  """Found by the soak: run A's local step 1; run B restores it and saves 2; run C saves 3 from 2; the user
  deletes 3 (the rollback keeps 2), then 2 is set aside. Local step 1 is an ancestor of the kept 2 and is
  restored: the rollback's kept point is found along the deleted save's line, not the local step's (which has
  no checkpoint of its own there)."""
  _replay(1, ('restart', {}), ('train', {'steps': 1}), ('save_start', {}), ('local_save', {'killed_after': 1}),
          ('train', {'steps': 1}), ('local_save', {'killed_after': 0}), ('restart', {}), ('sigterm', {}),
          ('restart', {}), ('sigterm', {}), ('rollback', {}), ('set_aside', {}))


def test_a_rollback_to_before_a_set_aside_checkpoint_discards_the_local_step_grown_from_it():
  """Found by the soak: run A saves 1, run B restores it and saves 2, run C restores 2 and writes local step 3;
  2 is set aside, then the user deletes 1, the newest committed (a rollback to a fresh start). Local step 3
  grew from 1 through its base 2: refused (the product compared the runs since its base only, C's, and
  offered it)."""
  _replay(1, ('restart', {}), ('sigterm', {}), ('restart', {}), ('sigterm', {}), ('restart', {}),
          ('train', {'steps': 1}), ('local_save', {'killed_after': 1}), ('sigkill', {'committed': False}),
          ('set_aside', {}), ('rollback', {}))


def test_a_policy_delete_after_a_rollback_keeps_the_point_it_kept():
  """Found by the soak: runs save 1, 2, 3, 4 in one line; the user deletes 4 (the rollback keeps 3); run F
  retrains from 3 and saves a new 4; run G restores it, trains to 5, preservation deletes 3 (recorded), local step
  5 is written, SIGKILL. Local step 5 (grown from 3 through the new 4) is restored: 3 was there at the rollback,
  which the log shows happened before its deletion (F's start resumed 3, older than the rolled-back 4). The
  product counted only what is there now (the rollback then kept 2) and refused 5, and after any rollback every
  later local step once preservation deleted the checkpoint it kept."""
  _replay(1, ('restart', {}), ('sigterm', {}), ('restart', {}), ('sigterm', {}), ('restart', {}),
          ('sigkill', {'committed': False}), ('restart', {}), ('sigterm', {}), ('restart', {}), ('sigterm', {}),
          ('rollback', {}), ('restart', {}), ('sigterm', {}), ('restart', {}), ('train', {'steps': 1}),
          ('policy_delete', {'data': _Draw(3)}), ('local_save', {'killed_after': 1}), ('sigkill', {'committed': False}))


def test_a_policy_delete_after_a_rollback_then_set_asides_keep_the_local_step_of_the_set_aside_state():
  """Found by the soak (the same rule): saves 1, 2; the user deletes 2; retrained 2, then 3; run E trains to 4,
  preservation deletes 1 (kept by the rollback), local step 4 and checkpoint 4 (one state) are written on
  SIGTERM; 4 is set aside. The restart restores local step 4, not checkpoint 3."""
  _replay(1, ('restart', {}), ('sigterm', {}), ('restart', {}), ('sigterm', {}), ('rollback', {}), ('restart', {}),
          ('sigterm', {}), ('restart', {}), ('sigterm', {}), ('restart', {}), ('train', {'steps': 1}),
          ('policy_delete', {'data': _Draw(1)}), ('local_save', {'killed_after': 1}), ('sigterm', {}),
          ('set_aside', {}), ('restart', {}))


def test_a_checkpoint_a_tool_replaced_then_preservation_deleted_keeps_the_rollback_of_the_replaced_save():
  """Found by the soak: A saves 1; B restores it, writes local step 3, is killed; 1 is set aside; C restores
  local step 3 and saves 4; a tool retrains 4 in place (a stock manifest: a rollback of C's 4); D saves 5 from
  it; preservation deletes 4; the user deletes 5. Local step 3 is refused (C's 4, grown from it, was rolled back
  by the tool): the `deleted` of 4 named the tool's checkpoint (no save id), not C's commit, which it had
  erased from the log's rollbacks, so the restart took local step 3, a state the model forbids."""
  _replay(1, ('restart', {}), ('sigterm', {}), ('restart', {}), ('train', {'steps': 1}), ('train', {'steps': 1}),
          ('local_save', {'killed_after': 1}), ('train', {'steps': 1}), ('save_start', {}), ('train', {'steps': 1}),
          ('local_save', {'killed_after': 0}), ('set_aside', {}), ('restart', {}), ('sigterm', {}),
          ('tool_retrain', {'own_manifest': False}), ('restart', {}), ('sigterm', {}), ('restart', {}),
          ('policy_delete', {'data': _Draw(4)}), ('sigkill', {'committed': False}), ('rollback', {}))
