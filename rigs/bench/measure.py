"""How the bench measures: storages, one timed run, and paired figures with median and min-max.

A figure is never one run: each scenario runs its arms in alternation (A, B, A, B, ...) in the same
invocation, so that drift of this shared machine hits both, and reports the median with the min-max of
each arm and of the per-pair ratio.
"""

import dataclasses
import os
import re
import shutil
import signal
import statistics
import tempfile
import time
from typing import Any

from pax_autockpt import layout
from pax_autockpt.shared import events as events_lib
from pax_autockpt.tools import process
from rigs import local_gcs

STEP_DONE = r'\[PAX STATUS\]: Step `\d+` completed'
_RATE = re.compile(r'steps/sec: ([0-9.]+)')


def say(msg: str) -> None:
  print(f'[bench] {msg}', flush=True)


@dataclasses.dataclass
class Figure:
  """One measured quantity over paired runs; `baseline[i]` was measured beside `values[i]`."""

  name: str
  unit: str
  values: list[float]
  baseline: list[float] | None = None
  baseline_name: str = ''

  @staticmethod
  def _summary(xs: list[float]) -> dict[str, Any]:
    xs = [x for x in xs if x is not None and x == x]
    if not xs:
      return {'n': 0, 'median': None, 'min': None, 'max': None}
    return {'n': len(xs), 'median': statistics.median(xs), 'min': min(xs), 'max': max(xs)}

  def to_dict(self) -> dict[str, Any]:
    out = {'name': self.name, 'unit': self.unit, 'values': self.values, **self._summary(self.values)}
    if self.baseline is not None:
      ratios = [v / b for v, b in zip(self.values, self.baseline) if v is not None and b]
      out.update(baseline_name=self.baseline_name, baseline_values=self.baseline,
                 baseline=self._summary(self.baseline), ratio=self._summary(ratios), ratios=ratios)
    return out


class Storage:
  """Where a bench job writes: the local disk, or the local GCS server at a given request latency."""

  def __init__(self, name: str, workdir: str, gcs: local_gcs.LocalGCS | None = None, latency_ms: float = 0):
    self.name, self.workdir, self.gcs, self.latency_ms = name, workdir, gcs, latency_ms

  @property
  def is_gcs(self) -> bool:
    return self.gcs is not None

  def job_dir(self, run: str) -> str:
    return self.gcs.url(f'bench/{run}') if self.is_gcs else os.path.join(self.workdir, run)

  def env(self) -> dict[str, str]:
    return {**os.environ, **self.gcs.env()} if self.is_gcs else dict(os.environ)

  def begin(self) -> None:
    """Before a run: this storage's latency, counters from zero."""
    if self.is_gcs:
      self.gcs.set_faults(latency_ms=self.latency_ms)
      self.gcs.stats(reset=True)

  def checkpoint_requests(self) -> int | None:
    return self.gcs.stats().get('under:checkpoints', 0) if self.is_gcs else None

  def step_bytes(self, job_dir: str, step: int) -> int:
    path = layout.step_dir(layout.checkpoint_dir(job_dir), step)
    if self.is_gcs:
      prefix = os.fspath(path).split(f'gs://{self.gcs.bucket}/', 1)[1] + '/'
      return sum(self.gcs.objects(prefix).values())
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)

  def baseline_write_secs(self, nbytes: int) -> float:
    """The storage's own limit for these bytes: a raw sequential write + fsync, or one upload of a
    single object of the same size through the same server (and latency)."""
    data = os.urandom(min(nbytes, 64 << 20))
    if self.is_gcs:
      blob = (data * (nbytes // len(data) + 1))[:nbytes]
      start = time.perf_counter()
      self.gcs.write('bench/raw.bin', blob)
      secs = time.perf_counter() - start
      self.gcs.delete('bench/raw.bin')
      return secs
    path = os.path.join(self.workdir, 'raw.bin')
    start = time.perf_counter()
    with open(path, 'wb') as f:
      left = nbytes
      while left > 0:
        f.write(data[:min(len(data), left)])
        left -= len(data)
      f.flush()
      os.fsync(f.fileno())
    secs = time.perf_counter() - start
    os.remove(path)
    return secs

  def clean(self, job_dir: str) -> None:
    if self.is_gcs:
      self.gcs.delete_prefix(job_dir.split(f'gs://{self.gcs.bucket}/', 1)[1] + '/')
    else:
      shutil.rmtree(job_dir, ignore_errors=True)


def mean_step_secs(log_text: str, skip: int = 3) -> float:
  """Mean step time from Pax's 'steps/sec' lines (one per 10 steps), after warm-up."""
  rates = [float(r) for r in _RATE.findall(log_text)][skip:]
  rates = [r for r in rates if r > 0]
  return statistics.mean(1.0 / r for r in rates) if rates else float('nan')


@dataclasses.dataclass
class Run:
  """What one training process left: its log, its events, its exit."""

  job_dir: str
  log: str
  events: list[dict[str, Any]]
  code: int | None = None
  sigterm_to_exit_s: float | None = None
  checkpoint_requests: int | None = None

  def saves(self, reason: str | None = None, skip: int = 0) -> list[dict[str, Any]]:
    started = [e for e in self.events if e['event'] == 'save_started' and (reason is None or e['reason'] == reason)]
    return started[skip:]

  def committed(self) -> dict[int, float]:
    return {e['step']: e['duration_s'] for e in self.events if e['event'] == 'save_committed'}


def timed_run(storage: Storage, argv: list[str], name: str, *, train_secs: float, preempt: bool,
              job_dir: str | None = None) -> Run:
  """Starts a job (in `job_dir`, e.g. to restore another run's checkpoint; default: a new one named
  after the run), lets it train `train_secs` after its first step, then SIGTERM (and waits for the
  exit) or SIGKILL."""
  job_dir = job_dir or storage.job_dir(name)
  storage.begin()
  log_path = os.path.join(storage.workdir, f'{name}.log')
  job = process.Job([*argv, f'--job_log_dir={job_dir}'], log_path, env=storage.env())
  code = took = None
  try:
    job.wait_for_log(STEP_DONE, timeout=900)
    time.sleep(train_secs)
    if preempt:
      sent = job.send(signal.SIGTERM)
      code = job.wait(900)
      took = time.time() - sent
  finally:
    job.kill()
  requests = storage.checkpoint_requests()
  return Run(job_dir, job.log(), events_lib.read(job_dir), code, took, requests)


def scratch(out: str) -> str:
  os.makedirs(out, exist_ok=True)
  return tempfile.mkdtemp(prefix='autockpt-bench-', dir=out)
