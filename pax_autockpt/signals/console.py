"""The plugin's own lines on stdout and stderr, written so that no signal, exit or watchdog ever waits on them.

A terminal's Ctrl-C reaches every process of its group: with the Pax quickstart's `python ... 2>&1 | tee log`,
`tee` dies with it, and the next line the job writes fails with EPIPE (Python ignores SIGPIPE). A full disk
under a redirected log fails with ENOSPC, and a reader that stopped draining a pipe makes a write block. So
the signal path acts first and writes after, never raises on a write, and hands its lines to a writer thread
(`say`): a write that blocks holds only that thread. The first failed write of a stream is noted once
(`lost()`, for the `exit` event) and the stream's file descriptor is pointed at /dev/null: every later write
to it, Python's, absl's or C++'s, succeeds silently, and the interpreter's final flush cannot turn the job's
exit code into 120 (what Python reports when flushing stdout fails at exit).
"""

import errno
import os
import queue
import sys
import threading
from typing import Callable

_lines: 'queue.SimpleQueue[tuple[str, threading.Event | None]]' = queue.SimpleQueue()  # re-entrant put
_writer: list[threading.Thread] = []
_writer_lock = threading.RLock()  # a forked child's SIGTERM handler may say() inside the main thread's say()
_lost: dict[str, str] = {}  # stream name -> the errno name of its first failed write


def say(line: str, wait_secs: float = 0.0) -> None:
  """`[autockpt] line` to stderr from the writer thread; waits at most `wait_secs` for it (0: not at all).
  Never raises, never blocks longer."""
  done = threading.Event() if wait_secs > 0 else None
  _lines.put((f'[autockpt] {line}\n', done))
  _start_writer()
  if done is not None:
    done.wait(wait_secs)


def _start_writer() -> None:
  with _writer_lock:
    if not _writer or not _writer[0].is_alive():
      _writer[:] = [threading.Thread(target=_write_lines, name='autockpt-console', daemon=True)]
      _writer[0].start()


def _write_lines() -> None:
  while True:
    text, done = _lines.get()
    try:
      write(sys.stderr, 'stderr', text)
    finally:
      if done is not None:
        done.set()


def write(stream, name: str, text: str) -> bool:
  """`text` to `stream`, flushed; False (and the stream pointed at /dev/null, once) when that fails."""
  try:
    stream.write(text)
    stream.flush()
    return True
  except (OSError, ValueError) as e:  # ValueError: a closed file
    give_up(stream, name, e)
    return False


def give_up(stream, name: str, error: BaseException) -> None:
  """Notes the first failure of `name` and points its file descriptor at /dev/null (see the module doc)."""
  code = getattr(error, 'errno', None)
  _lost.setdefault(name, errno.errorcode.get(code, type(error).__name__) if code else type(error).__name__)
  try:
    fd = stream.fileno()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)
    stream.flush()  # what it still holds goes to /dev/null now
  except (OSError, ValueError, AttributeError):
    pass


def settle() -> None:
  """Before the process ends: stdout and stderr flushed, or pointed at /dev/null where that fails."""
  for name in ('stdout', 'stderr'):
    stream = getattr(sys, name, None)
    if stream is None:
      continue
    try:
      stream.flush()
    except (OSError, ValueError) as e:
      give_up(stream, name, e)


def lost() -> dict[str, str]:
  """The streams whose writes failed in this process, with the first error's name."""
  return dict(_lost)


def lost_fields() -> dict[str, dict[str, str]]:
  """For the `exit` event: `output_lost` (stream -> error) when a write to stdout or stderr failed."""
  return {'output_lost': lost()} if _lost else {}


def bounded(work: Callable[[], None], secs: float, name: str = 'autockpt-record') -> bool:
  """Runs `work` in a daemon thread and waits at most `secs` for it: True when it finished. For what an exit
  writes before it ends the process (events, log lines): storage or a pipe that hangs cannot hold the exit."""
  worker = threading.Thread(target=_quietly(work), name=name, daemon=True)
  worker.start()
  worker.join(secs)
  return not worker.is_alive()


def _quietly(work: Callable[[], None]) -> Callable[[], None]:
  def run() -> None:
    try:
      work()
    except Exception:  # pylint: disable=broad-except  (an exit's record is best effort; the exit is not)
      pass
  return run
