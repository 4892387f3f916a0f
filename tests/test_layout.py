"""The job directory's names and the one commit rule, on local disk and on a local GCS server."""

import ast
import os

from etils import epath
import pytest

from pax_autockpt import layout
from pax_autockpt.shared import events as events_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a training process imports: pax_autockpt/ and its packages, not tools/.
RUNTIME = tuple(os.path.relpath(d, ROOT) for d, _, files in os.walk(os.path.join(ROOT, 'pax_autockpt'))
                if any(f.endswith('.py') for f in files) and os.path.join('pax_autockpt', 'tools') not in d)


def _orbax_save(ckpt_dir: epath.Path, step: int, commit: bool = True) -> epath.Path:
  """What orbax 0.5.9 leaves: locally a temporary name renamed on commit; on gs:// the final name,
  with commit_success.txt written last."""
  final = layout.step_dir(ckpt_dir, step)
  where = final if layout.is_object_store(final) else final.with_name(f'{final.name}{layout.ORBAX_TMP}1')
  (where / 'state').mkdir(parents=True, exist_ok=True)
  (where / 'state' / 'x').write_text('array bytes')
  if commit:
    if layout.is_object_store(final):
      (final / layout.COMMIT_MARKER).write_text('ok')
    else:
      where.rename(final)
  return final


@pytest.fixture(params=['local', 'gcs'])
def ckpt_dir(request, tmp_path):
  if request.param == 'local':
    return layout.checkpoint_dir(tmp_path)
  gcs = request.getfixturevalue('gcs')
  return layout.checkpoint_dir(gcs.url(f'layout-{os.getpid()}-{request.node.name}'))


def test_only_gs_commits_with_a_marker_as_orbax_0_5_9_does():
  """orbax.checkpoint.utils.is_gcs_path: elsewhere, any scheme, the final name is the commit; a
  committed checkpoint there must not look uncommitted (and be removed as a leftover)."""
  assert layout.uses_commit_marker('gs://bucket/job/checkpoints')
  for other in ('s3://bucket/job', 'hdfs://nn/job', '/local/job', 'job'):
    assert not layout.uses_commit_marker(other), other


def test_step_names():
  assert layout.step_of('checkpoint_00001000') == 1000
  assert layout.step_of('checkpoint_123456789') == 123456789  # Pax's %08d grows past 8 digits
  for other in ('checkpoint_00001000.orbax-checkpoint-tmp-17', 'checkpoint_1000', 'ckpt_00001000', 'x'):
    assert layout.step_of(other) is None


def test_only_committed_steps_count_and_leftovers_are_found(ckpt_dir):
  _orbax_save(ckpt_dir, 100)
  _orbax_save(ckpt_dir, 200)
  _orbax_save(ckpt_dir, 300, commit=False)  # a save killed or failed before its commit
  assert layout.committed_steps(ckpt_dir) == [100, 200]
  assert layout.newest_committed(ckpt_dir) == 200
  assert not layout.is_committed(layout.step_dir(ckpt_dir, 300))
  assert [p.name.split('.')[0] for p in layout.leftovers(ckpt_dir, 300)] == ['checkpoint_00000300']
  assert layout.leftovers(ckpt_dir, 200) == []  # a committed checkpoint is never a leftover


def test_delete_takes_the_commit_first(ckpt_dir, monkeypatch):
  """A delete that dies half-way must not leave something that still looks committed."""
  path = _orbax_save(ckpt_dir, 100)

  def killed(self, missing_ok=False):
    raise OSError('killed mid-delete')

  monkeypatch.setattr(type(path), 'rmtree', killed)
  with pytest.raises(OSError):
    layout.uncommit_and_delete(path)
  monkeypatch.undo()
  assert layout.committed_steps(ckpt_dir) == [] and list(ckpt_dir.iterdir())  # uncommitted, not gone
  _orbax_save(ckpt_dir, 200)
  layout.uncommit_and_delete(layout.step_dir(ckpt_dir, 200))
  assert layout.committed_steps(ckpt_dir) == [] and not layout.step_dir(ckpt_dir, 200).exists()


def test_a_damaged_checkpoint_is_set_aside_never_deleted(ckpt_dir):
  job = ckpt_dir.parent
  _orbax_save(ckpt_dir, 100)
  path = _orbax_save(ckpt_dir, 200)
  where = layout.set_aside_damaged(job, path, 'state/x is missing')
  assert layout.committed_steps(ckpt_dir) == [100] and layout.newest_committed(ckpt_dir) == 100
  if layout.is_object_store(path):  # marked in place: data kept, out of every listing, not a leftover
    assert 'marked unrestorable' in where and (path / 'state' / 'x').exists()
    assert layout.marked_unrestorable_steps(ckpt_dir) == [200] and layout.leftovers(ckpt_dir, 200) == []
    assert 'missing' in (path / layout.UNRESTORABLE_MARKER).read_text()
  else:
    aside = layout.unrestorable_dir(job) / 'checkpoint_00000200'
    assert where == f'moved to {aside}' and (aside / 'state' / 'x').exists()
  # The step is due again: its name is freed, the damaged data kept aside.
  aside = layout.move_aside(job, path) if path.exists() else None
  if aside is not None:
    assert (aside / 'state' / 'x').read_text() == 'array bytes' and not path.exists()


def test_set_aside_on_gcs_costs_a_few_requests_whatever_the_size(gcs):
  job = epath.Path(gcs.url(f'aside-{os.getpid()}'))
  path = _orbax_save(layout.checkpoint_dir(job), 100)
  for i in range(40):
    (path / 'state' / f'chunk{i}').write_text('x')
  gcs.stats(reset=True)
  layout.set_aside_damaged(job, path, 'damaged')
  requests = gcs.stats()['requests']
  assert requests <= 8, gcs.stats()
  print(f'set aside on GCS: {requests} requests for a checkpoint of 42 objects')


def test_event_log_on_gcs_is_parts_of_bounded_size_read_back_in_order(gcs):
  job = gcs.url(f'events-{os.getpid()}')
  log = events_lib.EventLog(job, host=3)
  for i in range(150):
    log.write('save_started', step=i)
  log.flush()
  names = sorted(n for n in gcs.objects(f'events-{os.getpid()}/autockpt/') if not n.endswith('/'))
  assert [n.rsplit('/', 1)[1] for n in names] == [f'events.host3.{p:06d}.jsonl' for p in range(3)]
  assert all(gcs.read(n).count(b'\n') <= events_lib.PART_EVENTS for n in names)
  assert [e['step'] for e in events_lib.read(job, 3)] == list(range(150))
  again = events_lib.EventLog(job, host=3)  # a restarted process starts a new part, reads nothing
  again.write('start')
  again.flush()
  assert [e['event'] for e in events_lib.read(job, 3)][-2:] == ['save_started', 'start']
  assert len(events_lib.event_files(job)[3]) == 4
  # A gap (part 1 removed by hand): the next process starts part 4, it does not overwrite part 3.
  layout.events_path(job, 3, 1).unlink()
  third = events_lib.EventLog(job, host=3)
  third.write('exit')
  third.flush()
  assert [p.name for p in events_lib.event_files(job)[3]] == [f'events.host3.{p:06d}.jsonl' for p in (0, 2, 3, 4)]
  assert [e['event'] for e in events_lib.read(job, 3)][-2:] == ['start', 'exit']


def test_an_event_log_on_gcs_that_cannot_be_listed_is_not_taken_for_no_log(gcs, monkeypatch):
  """A listing the storage refuses is "could not ask", not "no log": the reader raises (after brief retries)
  instead of answering no history, and a new process's writer does not start at part 0 over the oldest."""
  name = f'events-unlisted-{os.getpid()}'
  job, parts = gcs.url(name), [f'{name}/autockpt/events.host0.{p:06d}.jsonl' for p in (0, 1)]
  oldest = b'{"t": 1.0, "host": 0, "event": "save_committed", "step": 10}\n'
  gcs.write(parts[0], oldest)  # written past TF's client: nothing of it is in its caches
  gcs.write(parts[1], oldest.replace(b'10', b'20'))
  monkeypatch.setattr(events_lib, '_LIST_PAUSES', (0.0, 0.0), raising=False)
  gcs.set_faults(fail_fraction=1.0, status=403, path_contains=f'prefix={name}/autockpt')  # its listings fail
  try:
    with pytest.raises(Exception) as read:
      events_lib.read(job, 0)
    with monkeypatch.context() as answered:  # the folder's own check answered (as from TF's cache in a long run)
      answered.setattr(type(epath.Path(job)), 'mkdir', lambda self, **kwargs: None)
      with pytest.raises(Exception) as started:
        log = events_lib.EventLog(job, host=0)
        log.write('start')
        log.flush()
  finally:
    gcs.set_faults()
  for raised in (read.value, started.value):
    assert 'the event log could not be listed' in str(raised) and '\n' not in str(raised), raised
  assert gcs.read(parts[0]) == oldest  # not overwritten
  again = events_lib.EventLog(job, host=0)  # the storage answers again: part 2, after what is there
  again.write('start')
  again.flush()
  assert [e.get('step') for e in events_lib.read(job, 0)] == [10, 20, None]


def test_event_log_locally_is_one_file_and_a_torn_line_is_salvaged(tmp_path):
  log = events_lib.EventLog(tmp_path, host=0)
  log.write('start')
  with open(layout.events_path(tmp_path, 0), 'a') as f:
    f.write('{"t": 1.0, "host": 0, "event": "save_sta')  # killed mid-write, no newline
  log.write('start', pid=2)
  records, bad = events_lib.parse(layout.events_path(tmp_path, 0).read_bytes())
  assert [r['event'] for r in records] == ['start', 'start'] and bad == 1
  assert events_lib.event_files(tmp_path) == {0: [layout.events_path(tmp_path, 0)]}


def test_host_logs_of_a_gcs_job_are_local():
  path = layout.host_log_path('gs://bucket/some/job', 2)
  assert not layout.is_object_store(path) and str(path).endswith('pax-autockpt-logs/bucket/some/job/host2.log')


def _imports(path):
  tree = ast.parse(open(path).read())
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      yield from [node.module] + [f'{node.module}.{a.name}' for a in node.names]


def test_a_training_process_never_imports_the_tools():
  """pax_autockpt/*.py, its packages but tools/, and experiments/ are what a training process runs;
  pax_autockpt/tools/ is the command line and its tools, which may import the runtime but never the other way
  round. Nothing there imports the repository's rigs/ either (not in the wheel)."""
  assert len(RUNTIME) >= 10 and os.path.join('pax_autockpt', 'exit') in RUNTIME  # the walk found the packages
  runtime = [os.path.join(ROOT, d, f) for d in (*RUNTIME, 'experiments') for f in os.listdir(os.path.join(ROOT, d))
             if f.endswith('.py')]
  bad = {os.path.relpath(p, ROOT): m for p in runtime for m in _imports(p)
         if m.startswith('pax_autockpt.tools') or m.split('.')[0] == 'rigs'}
  assert not bad, bad


def _sys_exits(path: str):
  """(line, at the top of `if __name__ == '__main__':` or of a __main__.py) for each sys.exit call."""
  tree = ast.parse(open(path).read())
  guarded = {id(n) for stmt in tree.body if isinstance(stmt, ast.If) and '__name__' in ast.unparse(stmt.test)
             for n in ast.walk(stmt)}
  top = os.path.basename(path) == '__main__.py'
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and ast.unparse(node.func) == 'sys.exit':
      yield node.lineno, top or id(node) in guarded


def test_only_the_entry_points_and_the_executor_exit():
  """The checkpointer and the rest raise; `main`, the mixin's `validate` (stock paxml/main.py's entry
  into the plugin) and the executor turn outcomes into exit codes, and tools exit only as scripts."""
  exits_allowed = {'main.py', 'executor.py', 'experiment.py', 'standby.py'}
  bad = []
  for folder, _, files in (*os.walk(os.path.join(ROOT, 'pax_autockpt')), *os.walk(os.path.join(ROOT, 'rigs'))):
    for f in (f for f in files if f.endswith('.py')):
      path = os.path.join(folder, f)
      runtime = os.path.relpath(folder, ROOT) in RUNTIME
      bad += [f'{os.path.relpath(path, ROOT)}:{line}' for line, as_script in _sys_exits(path)
              if not (f in exits_allowed if runtime else as_script)]
  assert not bad, bad


def test_a_step_in_a_log_line_is_a_number_or_none_never_pythons_none():
  assert (layout.step_text(None), layout.step_text(0), layout.step_text(1347)) == ('none', '0', '1347')
