"""Shared fixtures and checks for the pax-autockpt tests."""

import dataclasses
import fcntl
import os
import signal
import tempfile
import threading
import time

import pytest

# TensorFlow's gs:// client reads its cache settings once, when TensorFlow loads (its file system is
# built at registration), so they are set before anything here imports it: the checks must see other
# processes' writes at once. With the default 5 s stat cache a part of the event log read 2 s before a
# signal was read again at its old size after the exit, without the events the exit appended.
os.environ['GCS_STAT_CACHE_MAX_AGE'] = '0'
os.environ['GCS_READ_CACHE_MAX_SIZE_MB'] = '0'

from pax_autockpt import layout
from pax_autockpt.shared import events as events_lib
from pax_autockpt.signals import grace
from pax_autockpt.signals import signals
from pax_autockpt.tools import process
from tests import forkserver


def checkpoint_steps(job_log_dir) -> tuple[list[int], list[str]]:
  """(committed steps, every other entry) in Pax's checkpoint directory, local or gs://."""
  ckpt_dir = layout.checkpoint_dir(job_log_dir)
  names = sorted(p.name for p in ckpt_dir.iterdir()) if ckpt_dir.exists() else []
  committed = layout.committed_steps(ckpt_dir)
  return committed, [n for n in names if layout.step_of(n) not in committed]


def assert_restorable(job_log_dir, step: int) -> None:
  """A committed Pax checkpoint with its state and metadata written."""
  path = layout.step_dir(layout.checkpoint_dir(job_log_dir), step)
  assert layout.is_committed(path), f'{path} is not committed'
  assert (path / 'state').is_dir(), f'{path} has no state/'
  assert (path / 'metadata' / 'metadata').exists(), f'{path} has no metadata'


def events_of(job_log_dir, kind: str, host: int = 0) -> list[dict]:
  return [e for e in events_lib.read(job_log_dir, host) if e['event'] == kind]


def tb_scalars(job_log_dir) -> dict[str, list[tuple[int, float]]]:
  """The autockpt TensorBoard scalars: tag -> [(step, value)], read with TensorBoard's own reader."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  acc = event_accumulator.EventAccumulator(os.path.join(job_log_dir, 'summaries', 'autockpt'),
                                           size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  out = {}
  for tag in acc.Tags()['tensors']:
    out[tag] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                for e in acc.Tensors(tag)]
  return out


def reset_signals() -> None:
  """No signal recorded, no Ctrl-C watcher: pytest's own SIGINT handling again. The watcher thread records
  a SIGTERM from the wakeup fd, milliseconds after it arrived: a signal an earlier test sent is let land
  first (else it was recorded after this reset, and the next test's watcher agreed at once: seen once)."""
  time.sleep(0.1)
  signals.uninstall_interrupt()
  signals._received.clear()  # pylint: disable=protected-access
  signals._state.update(interrupts=0, publish=None, forwarded=False, xla=None,  # pylint: disable=protected-access
                        xla_notified=False, early_sigterm_passed=False)
  signals._on_first.clear()  # pylint: disable=protected-access
  grace.cancel_all()  # a watchdog armed by an in-process "signal" would end this process 299 s later


# The files with the longest end-to-end tests, ordered by their longest single test (fresh-clone make test,
# 2 workers, 2026-11-27: the README tutorial 174 s, the multihost restore decisions 137 s, lineage 102 s, the
# gs:// slow restore 91 s, then anywhere ~50 s), so that no long test is left to start last.
_SLOWEST_FIRST = ('test_readme_tutorial.py', 'test_e2e_multihost.py', 'test_e2e_lineage.py', 'test_e2e_gcs.py',
                  'test_e2e_anywhere.py', 'test_e2e_restore_fallback.py', 'test_e2e_continuous.py',
                  'test_e2e_single_host.py', 'test_e2e_disk_full.py', 'test_bad_input.py',
                  'test_e2e_exact_resume.py', 'test_soak.py', 'test_e2e_policies.py')


def pytest_configure(config):
  """Every training process the suite starts shares one JAX persistent compilation cache: ~9 s less per
  process after the first of each experiment (the train step alone compiles in ~6.7 s here). Safe on
  CPU because a restored state is copied out of NumPy's memory first (pax_autockpt.startup.compilation_cache).
  A path of the caller's own wins; each machine user gets one directory, kept between runs (entries
  are keyed by the program, jax version and flags, and checksummed)."""
  del config
  os.environ.setdefault('JAX_COMPILATION_CACHE_DIR',
                        os.path.join(tempfile.gettempdir(), f'pax-autockpt-jax-cache-{os.getuid()}'))
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')


def pytest_collection_modifyitems(items):
  """Longest tests first: xdist hands tests out in this order, so the last ones to start are the
  seconds-long unit tests, not a two-minute end-to-end run that leaves the other worker idle."""
  def rank(item):
    name = os.path.basename(str(item.fspath))
    return _SLOWEST_FIRST.index(name) if name in _SLOWEST_FIRST else len(_SLOWEST_FIRST)
  items.sort(key=rank)  # stable: each file's own order is kept


@pytest.fixture(autouse=True)
def absl_info_logs():
  """Tests read the plugin's INFO lines (caplog); absl's own level may have been raised by an earlier
  test in the same worker (absl flag parsing sets it)."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logging.set_verbosity(absl_logging.INFO)


@pytest.fixture
def exits(monkeypatch, clean_signals):
  """pax_autockpt.exit.startup_exit's end of the process faked: it ends the calling thread, noting (thread name, code)
  under the returned condition."""
  del clean_signals
  from pax_autockpt.exit import startup_exit  # pylint: disable=g-import-not-at-top  (jax-heavy: only where used)
  from tests import fakes  # pylint: disable=g-import-not-at-top
  codes, cond = [], threading.Condition()

  def fake_exit(code):
    with cond:
      codes.append((threading.current_thread().name, code))
      cond.notify_all()
    raise fakes.ProcessExited()

  monkeypatch.setattr(startup_exit.os, '_exit', fake_exit)
  return codes, cond


@pytest.fixture
def clean_signals():
  """The signal record empty, and the process's SIGTERM/SIGINT handling as it was, around a test."""
  saved = signal.getsignal(signal.SIGTERM)
  reset_signals()
  yield
  reset_signals()
  signal.signal(signal.SIGTERM, saved)


@pytest.fixture
def job_dir(tmp_path):
  return str(tmp_path / 'job')


@pytest.fixture
def jobs():
  """Jobs started by a test; any still running at its end are killed."""
  started = []
  yield started
  for job in started:
    job.kill()


@pytest.fixture(scope='session')
def local_gcs(tmp_path_factory):
  """One local GCS server per test session (per xdist worker), stopped by pid at the end.

  Its variables go into this process's environment, so that the tests' own checks (layout, events,
  report on gs://) and every training process they start use it through TF's built-in client.
  """
  from rigs import local_gcs as local_gcs_lib  # pylint: disable=g-import-not-at-top
  gcs = local_gcs_lib.LocalGCS(str(tmp_path_factory.mktemp('gcs'))).start()
  saved = dict(os.environ)
  os.environ.update(gcs.env())
  os.environ['TF_CPP_MIN_LOG_LEVEL'] = '1'  # not one INFO line per anonymous request
  try:
    yield gcs
  finally:
    os.environ.clear()
    os.environ.update(saved)
    gcs.stop()


@pytest.fixture
def gcs(local_gcs, request):
  """The session's local GCS, normal service and zeroed counters for this test."""
  local_gcs.set_faults()
  local_gcs.stats(reset=True)
  yield local_gcs
  local_gcs.set_faults()


TFRECORD_EXP = 'tests.e2e_experiments.TinyTFRecordRareSaves'  # real input, 600 steps, Pax saves at 0 and 600


@dataclasses.dataclass(frozen=True)
class UninterruptedRun:
  """An uninterrupted run of TFRECORD_EXP to its end, on `corpus`, in `job_dir`."""
  corpus: str
  job_dir: str
  log_path: str

  def wait(self, timeout: float = 300) -> None:
    """Until it has exited 0 (its exit event: it may run in another xdist worker)."""
    def exited():
      return next((e for e in events_lib.read(self.job_dir, 0) if e['event'] == 'exit'), None)
    code = process.wait_until(exited, f'the uninterrupted run in {self.job_dir} to end', timeout, 0.2)['code']
    assert code == 0, f'the uninterrupted run exited {code}: {process.text_of(self.log_path)[-3000:]}'


@pytest.fixture(scope='session')
def uninterrupted_tfrecord_run(tmp_path_factory):
  """The run that exact resume and the local tier compare their resumed jobs with (`verify --against`):
  one per test session, started by the first test that asks for it, in the background; a test on
  another xdist worker waits for that one (a start and 600 steps fewer). Same corpus for every user:
  use `corpus`."""
  root = tmp_path_factory.getbasetemp()
  root = root.parent if os.environ.get('PYTEST_XDIST_WORKER') else root  # the workers' common folder
  run = UninterruptedRun(str(root / 'uninterrupted-tfrecord' / 'data.tfrecord'),
                         str(root / 'uninterrupted-tfrecord' / 'job'), str(root / 'uninterrupted-tfrecord.log'))
  started = None
  with open(root / 'uninterrupted-tfrecord.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(os.path.dirname(run.corpus)):
      from experiments import tfrecord_lm_input  # pylint: disable=g-import-not-at-top
      tfrecord_lm_input.write_corpus(run.corpus)
      started = forkserver.job(process.ours_argv(TFRECORD_EXP, run.job_dir, '--autockpt_notices=off'), run.log_path,
                            env={**os.environ, 'AUTOCKPT_TINY_TFRECORD': run.corpus})
  yield run
  if started is not None:
    started.kill()
