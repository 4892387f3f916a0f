"""How a restart chooses, checks, classifies and agrees on the checkpoint it restores.

Pax restores the newest committed checkpoint it lists (`step_to_restore`). For that step, in order:
1. check, before any array is read: the files a committed checkpoint must have (`integrity`) and
   whether it fits this run (`fit_problem`: each array's saved shape and dtype against this model's,
   the input state's number of hosts);
2. read: Pax's own restore; a failure is classified (`failures.classify`);
3. verify: the digests of what was read against the checkpoint's manifest.
After each phase every host publishes what it found and all act on one agreed finding (the most
conservative kind any host found, `failures.PRECEDENCE`), through the coordination service, before
any device collective: damage sets the checkpoint aside and the next newest is tried; a mismatch ends
the run with exit 2 and a transient failure is retried along `failures.backoff`, then exit 1 — both with
one line and nothing moved; anything unrecognised exits 1, nothing moved.
"""

import dataclasses
import functools
import itertools
import json
import time
from typing import Any, Callable

from absl import logging
from etils import epath
import jax

from pax_autockpt import layout
from pax_autockpt.hosts import agreement
from pax_autockpt.local import format as local_format
from pax_autockpt.local import restoring
from pax_autockpt.restore import integrity
from pax_autockpt.shared import coordination
from pax_autockpt.shared import events as events_lib
from pax_autockpt.shared import failures
from pax_autockpt.shared import internals
from pax_autockpt.shared import manifest as manifest_lib
from pax_autockpt.shared import stops
from pax_autockpt.startup import compilation_cache

Kind = failures.Kind
_FIX = 'nothing was moved: rerun with the config that wrote it, or use a new --job_log_dir'


@dataclasses.dataclass(frozen=True)
class Finding:
  """What one host found wrong with a checkpoint, or what all hosts agreed on."""

  kind: Kind
  reason: str
  host: int = 0
  timeout: bool = False  # a host made no progress toward the agreement (agreement.Timeout): never encoded

  def encode(self) -> str:
    return f'{self.kind.value}|{self.reason}'

  @classmethod
  def decode(cls, host: int, text: str) -> 'Finding':
    kind, reason = text.split('|', 1)
    return cls(Kind(kind), reason, host)


def decide(found: dict[int, str]) -> Finding | None:
  """The one finding every host acts on: the most conservative kind, then the lowest host."""
  findings = [Finding.decode(h, t) for h, t in sorted(found.items())]
  return min(findings, key=lambda f: failures.PRECEDENCE.index(f.kind), default=None)


def agree(key: str, host: int, mine: Finding | None) -> Finding | None:
  """Every host passes its own finding and gets the same decision back: a host that stopped making progress
  toward it is a transient failure, the same on every host (agreement.Timeout), never a traceback."""
  try:
    return decide(agreement.reports(key, host, mine.encode() if mine else None))
  except agreement.Timeout as e:
    return Finding(Kind.TRANSIENT, str(e), e.by, timeout=True)


# --- does the checkpoint fit this run? -----------------------------------------------------------


def _arrays(tree: Any, prefix: str = '') -> dict[str, dict[str, Any]]:
  """Pax's metadata tree ({name: {..., _array_metadata_tag: true}}) as dotted name -> leaf."""
  if isinstance(tree, dict) and tree.get('_array_metadata_tag'):
    return {prefix: tree}
  if isinstance(tree, dict):
    items = tree.items()
  elif isinstance(tree, (list, tuple)):
    items = enumerate(tree)
  else:
    return {}
  out = {}
  for k, v in items:
    out.update(_arrays(v, f'{prefix}.{k}' if prefix else str(k)))
  return out


def _shown(leaf: dict[str, Any] | None) -> str:
  if leaf is None:
    return 'absent'
  shape = leaf.get('unpadded_shape')
  return f'{leaf.get("dtype", "?")}{list(shape) if shape is not None else "[?]"}'


def expected_arrays(metadata: Any) -> dict[str, dict[str, Any]]:
  """This run's arrays as Pax records them in a checkpoint's metadata item (paxml's own PaxMetadata)."""
  from paxml import checkpoint_metadata  # pylint: disable=g-import-not-at-top  (paxml-heavy)
  pax = checkpoint_metadata.PaxMetadata.from_padded_and_unpadded(
      metadata.padded_global_shapes, metadata.unpadded_global_shapes, version=1.1)
  return _arrays(json.loads(json.dumps(pax.to_dict()['train_state_metadata'], default=list)))


def array_mismatch(saved: dict[str, dict[str, Any]], expected: dict[str, dict[str, Any]]) -> str | None:
  """The first array (by name) whose saved shape or dtype is not this run's, or that one side lacks."""
  for name in sorted(saved.keys() | expected.keys()):
    a, b = saved.get(name), expected.get(name)
    if a is not None and b is not None and a.get('is_optax_masked_node') and b.get('is_optax_masked_node'):
      continue  # as Pax: masked optimizer slots have no shape to compare
    if a is None or b is None or list(a.get('unpadded_shape') or []) != list(b.get('unpadded_shape') or []) \
        or a.get('dtype') != b.get('dtype'):
      return f'{name} is {_shown(a)} there, {_shown(b)} here'
  return None


def fit_problem(step_path: epath.Path, metadata: Any, *, input_state: bool, host: int, hosts: int) -> str | None:
  """Why a whole checkpoint cannot serve this run, or None. Reads only its small metadata files."""
  meta = step_path / 'metadata' / 'metadata'
  if metadata is not None and getattr(metadata, 'unpadded_global_shapes', None) is not None and meta.exists():
    try:
      saved = json.loads(meta.read_text()).get('train_state_metadata')
    except json.JSONDecodeError as e:
      raise failures.Damaged(f'metadata/metadata is not JSON ({e}, {meta.stat().length} bytes)') from None
    if saved is not None:
      differs = array_mismatch(_arrays(saved), expected_arrays(metadata))
      if differs:
        return differs
  why = input_hosts_problem(step_path, host=host, hosts=hosts) if input_state else None
  return why and f'{why} (--autockpt_input_on_host_change=restart restores the weights and starts the input over)'


def input_hosts_problem(step_path: epath.Path, *, host: int, hosts: int) -> str | None:
  """Pax saves the input's position per process (`train_input/process_<i>-of-<N>`): on another number
  of hosts this host has none to read."""
  inputs = step_path / 'train_input'
  if not inputs.is_dir() or (inputs / f'process_{host}-of-{hosts}').exists():
    return None
  written = sorted(p.name for p in inputs.iterdir() if p.name.startswith('process_'))
  return (f'its input state was written by {written[0].rsplit("-of-", 1)[-1] if written else "no"} hosts, this '
          f'run has {hosts}')


# --- the restore -----------------------------------------------------------------------------------


class _Agreed(Exception):
  """Raised on every host out of Pax's restore once the hosts agreed that it failed."""

  def __init__(self, finding: Finding):
    super().__init__(finding.reason)
    self.finding = finding


class Restorer:
  """Pax's `get_model_states` for a wrapped Pax checkpointer (see the module docstring)."""

  def __init__(self, inner: Any, *, events: events_lib.EventLog, checksums: bool, retry_secs: float,
               set_aside: Callable[[int], None], restart_input: bool = False,
               local: restoring.LocalRestore | None = None, local_job: str = '',
               ever_committed: frozenset[int] = frozenset(), saves: dict[int, tuple[str | None, ...]] | None = None):
    """`set_aside(step)` is called on every host after a damaged checkpoint left the listing;
    `restart_input`: an input state written by another number of hosts is not restored (the input
    starts over) instead of being a mismatch; `local`: the local tier, restored from where its newest
    complete step is at least as new as the job directory's newest checkpoint; `local_job`: this job's id
    (pax_autockpt.local.lineage), that a local step must have been written by; `ever_committed`: the steps this
    host's event log records a committed save of (a local step's lineage is checked against them), and `saves`
    the ids of those commits (pax_autockpt.local.lineage.committed_saves)."""
    self._local, self._local_job, self._ever_committed = local, local_job, ever_committed
    self._saves = saves or {}
    self.job_state: restoring.JobState | None = None  # what the last local plan checked lineages against
    self._local_failed = False  # a local read failed: the rest of this restore is the job directory's
    self._after_read: Callable[[], None] | None = None  # a local read's input position, set once all hosts read
    self._local_step: int | None = None  # the local step being restored (Pax's step_to_restore)
    self._inner = inner
    self._restart_input = restart_input
    self._events = events
    self._host = events.host
    self._checksums = checksums
    self._pauses = failures.backoff(retry_secs)
    self._retry_secs = retry_secs
    self._forget = set_aside
    self._key = ''
    self._hosts = jax.process_count()
    self.verified: dict[str, int] = {}  # shards_checked/shards_unchecked of the restored checkpoint
    self.restored_from: str | None = None  # the tier the restored step came from: 'job_dir' or 'local'
    internals.guard_restore(inner, self._guarded_read)

  @property
  def checkpoint_dir(self) -> epath.Path:
    return epath.Path(self._inner.checkpoint_manager.directory)

  def get_model_states(self, partitioner, metadata, root_prng_key, train_input_pipeline=None):
    plan = functools.partial(self._local_plan, partitioner, metadata, train_input_pipeline)
    self._local_step = plan()
    tries = 0
    for attempt in itertools.count():
      step = self._inner.step_to_restore
      if step is None:
        logging.info('[autockpt] no committed checkpoint: starting fresh.')
        return self._inner.get_model_states(partitioner, metadata, root_prng_key, train_input_pipeline)
      self._key = f'{coordination.RESTORE}{attempt}/{step}/{tries}'
      local = step == self._local_step
      began, restored = time.monotonic(), None
      pipeline = train_input_pipeline if local else self._input_to_restore(step, train_input_pipeline)
      found = None if local else agree(f'{self._key}/check', self._host, self._check(step, metadata, pipeline))
      if found is None:
        try:
          restored = self._inner.get_model_states(partitioner, metadata, root_prng_key, pipeline)
        except _Agreed as e:
          found = e.finding
      if found is None and self._checksums and not local:  # a local step's digests are checked as it is read
        found = agree(f'{self._key}/verify', self._host, self._verify(step, restored[0]))
      if found is None:
        self.restored_from = events_lib.LOCAL if local else events_lib.JOB_DIR
        logging.info('[autockpt] %s %d restored in %.3f s.', 'local step' if local else 'checkpoint', step,
                     time.monotonic() - began)
        return (compilation_cache.owned_by_xla(restored[0]), *restored[1:])
      if local:
        self._job_dir_instead(step, found)
        continue
      tries = self._act(step, found, tries)
      if tries == 0 and not self._local_failed:  # a checkpoint was set aside: the freshest copy is decided again
        self._local_step = plan()

  def restored_save(self, step: int) -> str | None:
    """The save id of the restored job-directory checkpoint `step` (restoring.restored_save: its manifest's
    first, then the event log's), what this run's local steps grow from."""
    if self.job_state is None:
      return self._saves.get(step, (None,))[-1]
    return restoring.restored_save(self.job_state, step)

  @property
  def local_lineage(self) -> Any:
    """The lineage of the restored local step (pax_autockpt.local.lineage.Lineage)."""
    return self._local.restored_lineage

  @property
  def local_agreed_newest(self) -> int | None:
    return None if self._local is None else self._local.agreed_newest

  @property
  def may_hold_unbacked(self) -> bool:
    """Whether this run holds, or may come to hold, a local step the job directory lacks: with a local tier,
    until the restore has ended (a plan for the job directory's newest checkpoint is made again when that
    checkpoint turns out damaged, and an older local step then wins: seen in the lineage test), and after
    it when the restored local step is not in the job directory. False without a local tier: a signal
    before the first step then has nothing to save."""
    if self._local is None:
      return False
    return self.restored_from is None or self.unbacked_step is not None

  @property
  def unbacked_step(self) -> int | None:
    """The restored local step where the job directory has no checkpoint of it (or newer): until one is
    committed there, this run's state lives only on local disks."""
    if self.restored_from != events_lib.LOCAL:
      return None
    newest = self._local.agreed_newest  # the same on every host
    return self._local_step if newest is None or newest < self._local_step else None

  def _job_state(self) -> restoring.JobState:
    """The job directory as a local step's lineage is checked against (restoring.job_state: committed and
    set-aside steps, the save ids their manifests and this host's event log record, the rollbacks)."""
    return restoring.job_state(self._events.job_log_dir, self._local_job, self._host, self.checkpoint_dir,
                               {**{s: () for s in self._ever_committed}, **self._saves})

  def _local_plan(self, partitioner: Any, metadata: Any, pipeline: Any) -> int | None:
    """The local step every host restores (Pax is pointed at it), or None for the job directory's newest."""
    if self._local is None:
      return None
    try:
      needs = local_format.fingerprint_for(metadata.padded_global_shapes, partitioner.global_mesh,
                                           metadata.partition_specs)
      job = self.job_state = self._job_state()
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('[autockpt] local tier not used for this restore: %s', failures.one_line(e))
      needs, job = '', restoring.JobState(self._local_job, [], [])
    plan = None
    try:
      plan = self._local.plan(needs, job, needs_input=pipeline is not None)
      filled = plan is not None and self._local.fill(plan)
    except agreement.Timeout as e:  # the same on every host
      self._local_timed_out(e, plan and plan.step)
      return None
    if not filled:
      return None
    internals.restore_step(self._inner, plan.step)
    return plan.step

  def _local_timed_out(self, e: agreement.Timeout, step: int | None) -> None:
    """A host stopped making progress toward the local tier's plan or fill: every host restores from the job
    directory, with this one line and event (the same on every host), and plans no local step again."""
    logging.warning('[autockpt] local tier not used for this restore: %s; restoring from the job directory.', e)
    self._events.write('local_restore_failed', step=step, kind='timeout', error=str(e), seen_by=e.by)
    self._local_failed = True

  def _job_dir_instead(self, step: int, found: Finding) -> None:
    """A local step failed to restore on some host: every host goes to the job directory's newest checkpoint
    (the local copy stays where it is; the next local commits prune it)."""
    logging.warning('[autockpt] local step %d could not be restored (%s); restoring from the job directory instead.',
                    step, found.reason)
    self._events.write('local_restore_failed', step=step, kind='timeout' if found.timeout else found.kind.value,
                       error=found.reason, seen_by=found.host)
    self._local_step, self._local_failed = None, True
    internals.restore_newest_instead(self._inner)

  def _input_to_restore(self, step: int, pipeline: Any) -> Any:
    """The input pipeline to restore with the state, or None where its saved position was written by
    another number of hosts and the setting says to start the input over (a warning and an event)."""
    if pipeline is None or not self._restart_input:
      return pipeline
    try:
      why = input_hosts_problem(layout.step_dir(self.checkpoint_dir, step), host=self._host, hosts=self._hosts)
    except Exception:  # pylint: disable=broad-except
      return pipeline  # the check below classifies a listing that fails
    if why is None:
      return pipeline
    logging.warning('[autockpt] checkpoint %d: %s; restoring the weights and starting the input over '
                    '(--autockpt_input_on_host_change=restart): batches already trained on may come again.',
                    step, why)
    self._events.write('input_restarted', step=step, reason=why)
    return None

  def _check(self, step: int, metadata: Any, train_input_pipeline: Any) -> Finding | None:
    path = layout.step_dir(self.checkpoint_dir, step)
    try:
      found = integrity.problems(path)
      if found:
        return Finding(Kind.DAMAGE, '; '.join(found), self._host)
      differs = fit_problem(path, metadata, input_state=train_input_pipeline is not None, host=self._host,
                            hosts=self._hosts)
    except Exception as e:  # pylint: disable=broad-except
      return Finding(failures.classify(e), failures.one_line(e), self._host)
    return Finding(Kind.MISMATCH, differs, self._host) if differs else None

  def _guarded_read(self, read: Callable[..., Any], *args, **kwargs) -> Any:
    """Pax's restore proper (its `_restore_with_args`): every host learns whether all hosts read their
    part, before Pax's next device collective; a failure anywhere raises _Agreed everywhere."""
    mine, restored, self._after_read = None, None, None
    if self._local_step is not None and args and args[0] == self._local_step:
      read = self._local_read
    with internals.no_orbax_restore_barrier():  # the agreement below is the barrier
      try:
        with agreement.working(f'{self._key}/read', self._host):  # the hosts done wait while this one reads
          restored = read(*args, **kwargs)
      except Exception as e:  # pylint: disable=broad-except
        mine = Finding(failures.classify(e), failures.one_line(e), self._host)
    found = agree(f'{self._key}/read', self._host, mine)
    if found is not None:
      raise _Agreed(found)
    if self._after_read is not None:
      self._after_read()
    return restored

  def _local_read(self, step: int, shapes: Any, unpadded_shapes: Any, mesh: Any, specs: Any,
                  train_input_pipeline: Any = None) -> Any:
    """Pax's `_restore_with_args` for a local step: the same state, from this host's local copy. The input's
    position is set only once every host read its part (a failure anywhere sends all to the job directory)."""
    del unpadded_shapes  # the local tier holds the arrays as they were in memory (padded)
    state, position = self._local.load(step, shapes, mesh, specs)
    if train_input_pipeline is not None:
      self._after_read = functools.partial(train_input_pipeline.set_state, position)
    return state

  def _verify(self, step: int, state: Any) -> Finding | None:
    """This host's restored shards against the manifest: in memory where a restored shard is a saved
    one, else (another partitioning than the save's) read back from storage, those shards split
    across hosts. Every saved shard is checked by some host; the counts go into the start event."""
    start, path = time.time(), layout.step_dir(self.checkpoint_dir, step)
    try:
      expected = manifest_lib.read(path)
      if expected is None:
        return self._without_manifest(step)
      ocdbt = internals.is_ocdbt_checkpoint(path)
      arrays = internals.array_names(state, use_ocdbt=ocdbt)
      problems, in_memory = manifest_lib.compare(arrays, expected)
      stored = manifest_lib.uncovered(arrays, expected)
      mine = stored[self._host::self._hosts]
      problems += manifest_lib.compare_stored(path, mine, expected, ocdbt=ocdbt)
    except manifest_lib.ManifestError as e:
      return Finding(Kind.DAMAGE, f'manifest: {e}', self._host)
    except Exception as e:  # pylint: disable=broad-except
      return Finding(failures.classify(e), failures.one_line(e), self._host)
    saved = sum(len(shards) for shards in expected.values())
    # Unchecked is 0 by construction: a saved shard is either a restored shard on some host (checked
    # there in memory) or in `stored`, read back by exactly one host.
    self.verified = dict(shards_checked=in_memory + len(mine), shards_unchecked=0)
    logging.info('[autockpt] checkpoint %d: %d shards of %d arrays checked against the manifest (%d in memory, %d '
                 'read back from storage), %d of %d saved shards unchecked, in %.3f s; %d mismatched.', step,
                 in_memory + len(mine), len(arrays), in_memory, len(mine), self.verified['shards_unchecked'],
                 saved, time.time() - start, len(problems))
    return Finding(Kind.DAMAGE, f'host {self._host}: {problems[0]}', self._host) if problems else None

  def _without_manifest(self, step: int) -> Finding | None:
    """A checkpoint without a manifest restores unverified (saved before checksums, or by stock
    paxml), unless its own save says it wrote one: then the manifest was lost, and so may more be."""
    wrote = any(e['event'] == 'save_committed' and e.get('step') == step and e.get('manifest')
                for e in events_lib.read(self._events.job_log_dir, self._host))
    if wrote:
      return Finding(Kind.DAMAGE, 'its save wrote a content manifest (save_committed event) and it is gone',
                     self._host)
    logging.info('[autockpt] checkpoint %d has no content manifest (saved before checksums, or by stock '
                 'paxml): restored unverified.', step)
    return None

  def _evidence(self, step: int) -> Finding | None:
    """After a failure not recognised as damage: this host's share of the checkpoint's saved shards read
    back and digested against its manifest, after the cheap file checks. A problem found is damage; a read
    the storage fails is no evidence of anything (None), nor is a checkpoint without a manifest."""
    path = layout.step_dir(self.checkpoint_dir, step)
    try:
      found = integrity.problems(path)
      expected = manifest_lib.read(path) if not found else None
      if expected is not None:
        shards = sorted((name, key) for name, keys in expected.items() for key in keys)
        found = manifest_lib.compare_stored(path, shards[self._host::self._hosts], expected,
                                            ocdbt=internals.is_ocdbt_checkpoint(path))
    except manifest_lib.ManifestError as e:
      found = [f'manifest: {e}']
    except Exception as e:  # pylint: disable=broad-except
      logging.warning('[autockpt] checkpoint %d: the content check could not run (%s).', step, failures.one_line(e))
      return None
    logging.info('[autockpt] checkpoint %d: content check after an unrecognised error: %s.', step,
                 '; '.join(found) if found else 'no problem found')
    return Finding(Kind.DAMAGE, f'host {self._host}: {found[0]}', self._host) if found else None

  def _act(self, step: int, found: Finding, tries: int) -> int:
    """What every host does about the agreed finding; returns the next try's number (0 for the next
    newest checkpoint), or raises for the executor."""
    if found.kind is Kind.UNKNOWN:  # an error this code does not recognise: the content check decides
      found = agree(f'{self._key}/evidence', self._host, self._evidence(step)) or found
    if found.kind is Kind.DAMAGE:
      self._set_aside(step, found.reason)
      return 0
    if found.kind is Kind.TRANSIENT and tries < len(self._pauses):
      pause = self._pauses[tries]
      logging.warning('[autockpt] checkpoint %d could not be read (%s); retry %d of %d in %.0f s.', step,
                      found.reason, tries + 1, len(self._pauses), pause)
      time.sleep(pause)
      return tries + 1
    self._events.write('restore_failed', step=step, kind=found.kind.value, error=found.reason, seen_by=found.host)
    raise _stop(step, found, self._retry_secs)

  def _set_aside(self, step: int, reason: str) -> None:
    """Sets the damaged checkpoint aside (never deletes it) and points Pax at the next newest one.
    Host 0 moves it; every host learns the outcome through the coordination service, then re-lists.
    Where it cannot be moved, every host stops (exit 1): restoring it again would loop."""
    self._events.write('restore_skipped', step=step, error=reason)
    where = None
    if self._host == 0:
      try:
        where = 'ok|' + layout.set_aside_damaged(self._events.job_log_dir,
                                                 layout.step_dir(self.checkpoint_dir, step), reason)
      except Exception as e:  # pylint: disable=broad-except
        where = f'failed|{failures.one_line(e)}'
    try:
      outcome, where = agreement.first_report(f'{coordination.SET_ASIDE}{step}', self._host, where).split('|', 1)
    except agreement.Timeout as e:
      outcome, where = 'failed', str(e)
    if outcome == 'failed':
      raise stops.RestoreFailed(step, _fit(f'checkpoint {step} is damaged ({{}}) and could not be set aside '
                                              f'({where}); nothing was deleted', reason))
    logging.error('[autockpt] checkpoint %d is damaged (%s); %s by host 0, trying the next newest.', step,
                  reason, where)
    internals.restore_newest_instead(self._inner)
    self._forget(step)


def _fit(template: str, reason: str, limit: int = 300) -> str:
  """`template` with `reason` in place of {}, the reason cut so that the line keeps to `limit`."""
  room = max(40, limit - len(template) + 2)
  return template.replace('{}', reason if len(reason) <= room else reason[:room - 3] + '...', 1)


def _stop(step: int, found: Finding, retry_secs: float) -> stops.StopTraining:
  """The one line a failed restore ends with, and its exit code (2 mismatch, else 1)."""
  where = '' if found.host == 0 else f' (host {found.host})'
  if found.kind is Kind.MISMATCH:
    return stops.RestoreMismatch(step, _fit(f'checkpoint {step} does not fit this run{where}: {{}}; {_FIX}',
                                               found.reason))
  if found.kind is Kind.TRANSIENT:
    return stops.RestoreFailed(step, _fit(f'checkpoint {step} could not be read for {retry_secs:g} s{where} '
                                             '({}); nothing was moved: rerun once storage is back', found.reason))
  return stops.RestoreFailed(step, _fit(f'checkpoint {step} failed to restore{where} ({{}}); not recognised '
                                           'as damage, so nothing was moved', found.reason))
