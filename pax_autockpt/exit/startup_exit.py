"""A signal before the first training step completes ends the job at once when there is nothing to save.

From its start to the end of the first step a job has trained nothing: its newest state is the job
directory's newest checkpoint (or nothing at all). A SIGTERM then — during input construction, the listing,
the restore, or the first step's compile, which takes minutes on a large model — should end it within a
second, not after the restore, the compile and a step that gains nothing. (A signal that arrives before this
object exists, while Python imports, is answered as soon as it does: pax_autockpt.signals.signals replays it.)
The main thread is in C++ then (XLA, tensorstore) and cannot act; the thread that
records the signal (pax_autockpt.signals.signals) can. Every host must reach the same decision, so the signalled host
claims one coordination-service key, first writer wins: `exit` (every host's waiting thread wakes and ends
its process with the exit code) or, written by the main thread once the first step completed, `trained` (the
ordinary exit path at an agreed step takes over). Where the run has, or may come to have, something only a
save would keep (a local step the job directory lacks: with a local tier, until its restore ended),
`nothing_to_save` says no and the loop's first iteration decides instead (pax_autockpt.hook.checkpointer). An exit
before the restore ended writes the run's `start` event itself (`before_restore`), so that the event log's
runs stay whole.

A signal that finds the first step's compile in flight may let it finish into the compilation cache first
(pax_autockpt.exit.compile_on_exit decides, on the signalled host): the key then says `finish`, with the grace period's
end; every host's waiting thread owns the exit at once (no rescue saves beside it) and waits, and each host's main
thread, back at the loop's next checkpointer call with the compile done and cached, ends the process with 143. A
main thread not back by the deadline less the exit's margins is not waited for.
"""

import atexit
import os
import signal
import sys
import threading
import time
from typing import Callable

from absl import logging
import jax

from pax_autockpt.exit import compile_on_exit
from pax_autockpt.exit import exit_path
from pax_autockpt.shared import coordination
from pax_autockpt.shared import events as events_lib
from pax_autockpt.signals import console
from pax_autockpt.signals import grace
from pax_autockpt.signals import signals

_WAIT_MS = 24 * 60 * 60 * 1000  # a waiting thread's bound: the first step completes long before
_RECORD_SECS = 5.0  # the exit's events and line get this long; then the process ends without them


class StartupExit:
  """One host's side (see the module docstring). `nothing_to_save()`: whether the newest state is the job
  directory's (no save needed); `newest()`: its newest committed step, known without a storage call."""

  def __init__(self, client, host: int, events: events_lib.EventLog, exit_code: int, grace_secs: float,
               nothing_to_save: Callable[[], bool], newest: Callable[[], int | None],
               take_over: Callable[[], bool] = lambda: True,
               first_compile: compile_on_exit.FirstCompile | None = None):
    """`take_over()`: the exit path's (pax_autockpt.exit.exit_path.ExitPath.take_over): False when the main thread
    took the exit first (its loop's first iteration saw the same signal): then it ends the process, not this.
    `first_compile`: whether a compile in flight may finish first (None: never)."""
    self._client, self._host, self._events = client, host, events
    self._take_over, self._first_compile = take_over, first_compile
    self._owned = False  # one of this object's threads took the exit (the owner is a thread to the exit path)
    self._own_lock = threading.Lock()
    self._finishing: str | None = None  # one process: the `finish` decision its main thread acts on
    self._arrived = threading.Event()  # the main thread came back with the compile done
    self._exit_code, self._grace_secs = exit_code, grace_secs
    self._nothing_to_save, self._newest = nothing_to_save, newest
    self._lock = threading.Lock()
    self._exiting = threading.Lock()  # held by the one thread that ends the process
    self._done = False  # the first step completed (or the decision was taken): nothing more to do here
    self._thread = None
    if client is not None:
      self._thread = threading.Thread(target=self._wait, name='autockpt-startup-exit', daemon=True)
      self._thread.start()
      atexit.register(self._release)  # before jax.distributed's own shutdown (atexit runs last-in first-out)
    signals.on_first_signal(self._signalled)

  def _release(self) -> None:
    """At the interpreter's exit (a run that ended before its second iteration, an exit at the first): the
    waiting threads return before the coordination client goes, which would abort the process under a
    thread still blocked in it."""
    with self._lock:
      self._done = True
    if self._thread.is_alive():  # else it returned already (the key is written, or the coordinator is gone)
      self._claim('trained')
      self._thread.join(2.0)

  def first_step_done(self) -> None:
    """Main thread, at the loop's second iteration: from now on a signal takes the ordinary path. Where a
    host claimed the key for `exit` first, this host ends with the others; for `finish`, the compile it waited
    for is done (and cached): this thread ends the process."""
    with self._lock:
      finishing = self._finishing
      if self._done and finishing is None:
        return
      self._done = True
    value = finishing
    if value is None and self._client is not None and not self._claim('trained'):
      value = self._read()
    if value is not None and value.startswith('finish'):
      self._arrived.set()
      self._exit(value, finished=True)
    elif value is not None and value.startswith('exit'):
      self._exit(value)

  def _signalled(self, signum: int, arrival: float) -> None:
    """In the thread that recorded the signal: claim `exit` (or `finish`) where nothing needs saving."""
    with self._lock:
      if self._done or not self._nothing_to_save():
        return
      value = self._decision(signum, arrival)
      self._done = self._client is None
      if self._client is None and value.startswith('finish'):
        self._finishing = value
    if self._client is None:
      self._act(value)
    else:
      self._claim(value)  # every host's waiting thread, this one's too, acts on what was written first

  def _decision(self, signum: int, arrival: float) -> str:
    """`exit|SIGNAL|host|why the compile in flight is dropped` or `finish|SIGNAL|host|the deadline` (no I/O)."""
    now = time.time()
    decided = (self._first_compile.decide(signum, arrival, self._grace_secs, now) if self._first_compile
               else compile_on_exit.Decision(False, ''))
    head = f'{signals.name(signum)}|{self._host}'
    if decided.finish:
      return f'finish|{head}|{arrival + self._grace_secs:.3f}'
    dropped = f'the first compile in flight ({decided.compiling_for_s:.1f} s in) is dropped: {decided.note}'
    return f'exit|{head}|{dropped if decided.note else ""}'

  def _act(self, value: str) -> None:
    """`exit`: end the process now; `finish`: own the exit and wait for the main thread, in a thread of its own
    (the signal's thread must not block)."""
    if value.startswith('exit'):
      self._exit(value)
    elif not value.startswith('finish'):
      return  # `trained`: the ordinary path
    elif threading.current_thread() is self._thread:
      self._finish(value)
    else:
      threading.Thread(target=self._finish, args=(value,), name='autockpt-first-compile', daemon=True).start()

  def _finish(self, value: str) -> None:
    """Owns the exit (so that no rescue saves beside the compile) and waits for the main thread to come back
    with the compile done; at the deadline less the exit's margins, ends the process without it."""
    if not self._own():
      return  # the main thread took the exit first: it ends the process
    deadline = float(value.split('|')[3])
    if not self._arrived.wait(max(0.0, deadline - time.time() - grace.WATCHDOG_LEAD_SECS - grace.MARGIN_SECS)):
      self._exit(value, finished=False)

  def _own(self) -> bool:
    """Whether this object owns the exit, taking it if no one has: any of its threads may then end the process."""
    with self._own_lock:
      if not self._owned:
        self._owned = self._take_over()
      return self._owned

  def _wait(self) -> None:
    """Every host: until the key is written, then act on it (`trained`: nothing to do)."""
    try:
      value = self._client.blocking_key_value_get(coordination.STARTUP_EXIT, _WAIT_MS)
    except Exception:  # pylint: disable=broad-except  (the job ends otherwise: nothing to decide)
      return
    self._act(value)

  def _claim(self, value: str) -> bool:
    return coordination.claim(self._client, coordination.STARTUP_EXIT, value)  # False: another host wrote first

  def _read(self) -> str:
    return self._client.blocking_key_value_get(coordination.STARTUP_EXIT, 10_000)

  def _exit(self, value: str, finished: bool | None = None) -> None:
    """The events and the one line, then the process ends (the main thread is in C++ and cannot unwind).
    Once per process: a second caller (another thread that read the same key) waits for the first's end.
    `finished`: after a `finish`, whether the compile was done (None: an `exit`)."""
    if not self._exiting.acquire(blocking=False) or not self._own():
      threading.Event().wait()  # another thread ends the process (and writes the events): one record, not two
    kind, name, host, *rest = value.split('|', 3)
    code = signals.INTERRUPT_EXIT_CODE if name == signal.SIGINT.name else self._exit_code
    compile_fields = self._compile_fields(kind, rest[0] if rest else '', finished)
    try:  # whatever the output and storage do (a broken pipe, a full disk, a write that hangs), the process ends
      console.bounded(lambda: self._record(name, int(host), code, compile_fields), _RECORD_SECS)
    finally:
      os._exit(code)  # pylint: disable=protected-access

  @staticmethod
  def _compile_fields(kind: str, rest: str, finished: bool | None) -> dict[str, str | float]:
    """The `preemption` event's `first_compile` (`finished`, `not_finished`, `dropped`), `first_compile_s` (the
    wait after the signal) and, for a dropped one, `why` (absent: no compile was in flight)."""
    got = signals.received()
    waited = round(max(0.0, time.time() - got[1]), 3) if got else 0.0
    if kind == 'finish':
      return {'first_compile': 'finished' if finished else 'not_finished', 'first_compile_s': waited}
    return {'first_compile': 'dropped', 'why': rest} if rest else {}

  def _record(self, name: str, host: int, code: int, compile_fields: dict[str, str | float]) -> None:
    newest = self._newest()
    got = signals.received()
    if 'start' not in self._events.kinds_written:  # the restore did not end: the run stood at the newest step
      self._events.write('start', num_hosts=jax.process_count(), pid=os.getpid(), restored_step=newest,
                         restored_from=None, before_restore=True)
    self._events.write('preemption', step=newest or 0, signal=name, saved_step=newest, plan='nothing_to_save',
                       during='start-up', seen_by=host, signal_at=round(got[1], 6) if got else None,
                       **({'grace_s': self._grace_secs} if name == signal.SIGTERM.name else {}), **compile_fields)
    self._events.write('exit', code=code, step=newest or 0)
    self._events.flush()
    message = (f'[autockpt] {exit_path.nothing_trained(newest)} ({name}){_compile_words(compile_fields)}; exiting '
               f'{code}. (Host {host} had it before the first step completed.)')
    logging.info(message)
    logging.flush()
    console.write(sys.stderr, 'stderr', message + '\n')
    console.settle()


def _compile_words(fields: dict[str, str | float]) -> str:
  """The exit line's clause on the compile in flight at the signal ('' where there was none)."""
  how, secs = fields.get('first_compile'), fields.get('first_compile_s', 0.0)
  if how == 'finished':
    return (f'; the first compile, in flight at the signal, was let finish ({secs:.1f} s after the signal) and is in '
            'the compilation cache for the next run')
  if how == 'not_finished':
    return (f'; the first compile, in flight at the signal, did not finish within the grace period ({secs:.1f} s '
            'after the signal): the next run compiles it again')
  return f'; {fields["why"]}' if how == 'dropped' else ''
