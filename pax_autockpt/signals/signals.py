"""Preemption signals caught in Python, for the stretches XLA's preemption notifier does not cover, and Ctrl-C.

XLA installs its own SIGTERM notifier when `jax.distributed` is initialised. Before that (imports,
flag parsing) and in jobs without `jax.distributed`, a SIGTERM would kill the process outright;
this module records it instead. A signal is process-wide, so the record is too.

Ctrl-C (SIGINT) is never XLA's: the first one is recorded like a SIGTERM (the agreed step is saved, then
the process exits 130), a second one aborts at once. Python runs signal handlers only in the main thread
and only between bytecodes, so a main thread stuck in C (an XLA compile, a collective, a key-value wait)
would sit on both presses. Instead Python's own C-level handler writes every SIGINT to a wakeup pipe
(`signal.set_wakeup_fd`), and a small thread reading it acts at once. Once XLA owns SIGTERM,
`hand_over` makes a Ctrl-C publish itself (so that every host exits 130) and then re-raise itself as a
SIGTERM to XLA's notifier: it then agrees on a step with every host, as for a preemption.

XLA's notifier (a C-level handler) notices a SIGTERM only when its listener thread next polls, up to a
second later, and tells no one when it came. The grace period counts from the arrival, so `hand_over` puts
Python's C-level handler in front of XLA's (read and kept with sigaction): the watcher thread records the
arrival within milliseconds and then calls XLA's handler itself, once.
"""

import ctypes
import os
import signal
import threading
import time
from typing import Callable

from pax_autockpt.signals import console

INTERRUPT_EXIT_CODE = 130  # 128 + SIGINT, what a shell reports after Ctrl-C

_received: list[tuple[int, float]] = []  # (signum, unix time) of the first preemption signal
_lock = threading.RLock()  # re-entrant: the SIGTERM handler may run in the main thread while it holds it
_state = {'interrupts': 0, 'publish': None, 'forwarded': False, 'pipe': None, 'previous': None, 'xla': None,
          'xla_notified': False, 'early_sigterm_passed': False}
_on_first: list[Callable[[int, float], None]] = []  # called once, with the first signal and its arrival


def _record(signum, frame):
  del frame
  with _lock:
    if _received:
      return
    _received.append((signum, time.time()))
    callbacks = list(_on_first)
  for callback in callbacks:  # one that raises costs its own work, never the others'
    try:
      callback(*_received[0])
    except Exception as e:  # pylint: disable=broad-except
      console.say(f'a first-signal callback failed ({type(e).__name__}: {e})')


def on_first_signal(callback: Callable[[int, float], None]) -> None:
  """`callback(signum, arrival)` once the first SIGTERM or Ctrl-C is recorded (now, if it already is).
  It runs in whichever thread records the signal: keep it short and never blocking."""
  with _lock:
    _on_first.append(callback)
    got = received()
  if got:
    callback(*got)


def install() -> None:
  """From now on a SIGTERM is recorded, not fatal, and Ctrl-C saves (main thread only; SIGTERM until XLA
  installs its own). With the watcher thread running, the SIGTERM is recorded there, never in a Python
  handler: that runs in the main thread between two bytecodes, possibly inside a `with lock:` that a
  callback (`on_first_signal`) takes too, and would then wait on itself forever (measured: an Event set from
  a handler hung 3 processes in 300)."""
  install_interrupt()
  signal.signal(signal.SIGTERM, _noted_by_watcher if _state['pipe'] is not None else _record)


def _noted_by_watcher(signum, frame):
  """SIGTERM's Python handler while the watcher thread reads the wakeup pipe: it records the signal."""
  del frame
  _wake_watcher_if_disconnected(signum)


def _wake_watcher_if_disconnected(signum: int) -> None:
  """In a Python handler (main thread): Python's C-level handler wrote the signal to the watcher's pipe already,
  unless someone has pointed the wakeup fd elsewhere since (asyncio's loop adding and then removing a signal
  handler leaves it at -1). Then the pipe is ours again (another live owner keeps it) and this writes the
  byte itself, non-blocking: the watcher acts on it as on any other."""
  pipe = _state['pipe']
  if pipe is None:
    return
  try:
    old = signal.set_wakeup_fd(pipe[1], warn_on_full_buffer=False)
    if old == pipe[1]:
      return
    if old != -1:
      signal.set_wakeup_fd(old)
    os.write(pipe[1], bytes([signum]))
  except (OSError, ValueError):
    pass


def reconnect() -> None:
  """Main thread, once per step: the watcher's wakeup fd and our Python handlers back in place where someone
  reset them to nothing (`set_wakeup_fd(-1)`, SIG_DFL), so that no later signal is lost to them. Someone
  else's live handler or wakeup fd is left alone."""
  pipe = _state['pipe']
  if pipe is None or threading.current_thread() is not threading.main_thread():
    return
  try:
    old = signal.set_wakeup_fd(pipe[1], warn_on_full_buffer=False)
    if old not in (-1, pipe[1]):
      signal.set_wakeup_fd(old)
    if signal.getsignal(signal.SIGINT) in (signal.SIG_DFL, signal.default_int_handler):
      signal.signal(signal.SIGINT, _python_handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
      signal.signal(signal.SIGTERM, _python_handler if _state['xla'] is not None else _noted_by_watcher)
  except (OSError, ValueError):
    pass


def is_installed() -> bool:
  """Whether Python's table has our SIGTERM handler (blind to XLA's C-level notifier)."""
  return signal.getsignal(signal.SIGTERM) in (_record, _noted_by_watcher, _python_handler)


def received() -> tuple[int, float] | None:
  """(signum, time) of the first SIGTERM or SIGINT recorded here, or None."""
  return _received[0] if _received else None


def interrupted() -> bool:
  """Whether this process got a Ctrl-C."""
  return _state['interrupts'] > 0


def redeliver() -> None:
  """SIGTERM again, to whoever handles it now: XLA's notifier, directly when ours is in front of it."""
  if _state['xla'] is not None:
    _notify_xla()
  else:
    os.kill(os.getpid(), signal.SIGTERM)


class _Sigaction(ctypes.Structure):
  """glibc's struct sigaction on Linux (x86-64 and aarch64 share the layout)."""
  _fields_ = [('handler', ctypes.c_void_p), ('mask', ctypes.c_ulong * 16), ('flags', ctypes.c_int),
              ('restorer', ctypes.c_void_p)]


def _c_sigterm_handler() -> int | None:
  """The address of the C-level SIGTERM handler installed now (None where sigaction cannot be read)."""
  action = _Sigaction()
  try:
    if ctypes.CDLL(None).sigaction(signal.SIGTERM, None, ctypes.byref(action)) != 0:
      return None
  except (OSError, AttributeError):
    return None
  return action.handler or 0


def take_sigterm_back_from_xla() -> bool:
  """Right after jax.distributed's initialize installed XLA's notifier (the experiment's `validate`, which paxml
  calls just after its setup_jax): ours in front of it again at once, so that a SIGTERM from now on is recorded
  on arrival, as before the initialize, and not only by XLA's notifier, which tells no one when it came (the
  start-up exit would not see it, and the job would restore, compile and train a step first)."""
  return _put_ours_in_front_of_xla()


def _put_ours_in_front_of_xla() -> bool:
  """Python's C-level handler (which writes to the watcher's pipe) in front of XLA's, whose address is
  kept to be called by the watcher. False (nothing changed) without the pipe, outside the main thread,
  or where the handler in place is Python's own (no XLA notifier: Python records the signal already)."""
  if _state['pipe'] is None or threading.current_thread() is not threading.main_thread():
    return False
  if _state['xla'] is not None:
    return True
  before = _c_sigterm_handler()
  previous = signal.signal(signal.SIGTERM, _python_handler)
  after = _c_sigterm_handler()
  if before in (None, 0, 1) or before == after:  # SIG_DFL, SIG_IGN, unreadable, or Python's own
    signal.signal(signal.SIGTERM, previous)
    return False
  _state['xla'] = ctypes.CFUNCTYPE(None, ctypes.c_int)(before)
  return True


def _notify_xla() -> None:
  """Calls XLA's SIGTERM handler, once (it sets a notification its listener thread polls for)."""
  with _lock:
    if _state['xla_notified']:
      return
    _state['xla_notified'] = True
  _state['xla'](signal.SIGTERM)


def name(signum: int) -> str:
  return signal.Signals(signum).name


# --- Ctrl-C ----------------------------------------------------------------------------------


def _python_handler(signum, frame):
  """Runs later, in the main thread: the watcher thread has acted already. Installed so that Python's C-level
  handler (which writes to the wakeup pipe) stays in place; it writes the byte itself where the wakeup fd was
  taken from the watcher (`_wake_watcher_if_disconnected`)."""
  del frame
  _wake_watcher_if_disconnected(signum)


def install_interrupt() -> None:
  """Ctrl-C handling from now on (idempotent). Outside the main thread, or where someone else owns the
  wakeup fd, nothing changes: Python's KeyboardInterrupt stays."""
  if _state['pipe'] is not None or threading.current_thread() is not threading.main_thread():
    return
  read_fd, write_fd = os.pipe()
  os.set_blocking(write_fd, False)
  old = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
  if old != -1:  # someone else's: leave it to them
    signal.set_wakeup_fd(old)
    os.close(read_fd)
    os.close(write_fd)
    return
  _state['pipe'] = (read_fd, write_fd)
  _state['previous'] = signal.signal(signal.SIGINT, _python_handler)
  threading.Thread(target=_watch, args=(read_fd,), name='autockpt-sigint', daemon=True).start()
  _sigterm_handler(_record, _noted_by_watcher)  # the watcher records it from now on
  if not _state.get('fork_hook'):
    os.register_at_fork(after_in_child=_forget_in_child)
    _state['fork_hook'] = True


def _forget_in_child() -> None:
  """A forked child (no exec) would write its SIGINTs into our pipe, where they would count as this
  process's Ctrl-C (a terminal's Ctrl-C reaches the whole process group): it gets its own handling."""
  if _state['pipe'] is None:
    return
  try:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.default_int_handler)
  except ValueError:  # not the child's main thread
    pass
  _sigterm_handler(_noted_by_watcher, _record)  # no watcher in the child: the handler records it
  if _state['xla'] is not None:  # forked by a training process (an input worker, not a host): SIGTERM ends it
    _sigterm_handler(_python_handler, signal.SIG_DFL)
  for fd in _state['pipe']:
    os.close(fd)
  _state.update(pipe=None, previous=None, interrupts=0, publish=None, forwarded=False, early_sigterm_passed=False,
                xla=None, xla_notified=False)


def _sigterm_handler(if_now: Callable, then: Callable) -> None:
  """SIGTERM's Python handler becomes `then` where it is `if_now` (never someone else's)."""
  try:
    if signal.getsignal(signal.SIGTERM) is if_now:
      signal.signal(signal.SIGTERM, then)
  except ValueError:  # not the main thread
    pass


def uninstall_interrupt() -> None:
  """Python's own Ctrl-C again (tests); the watcher thread ends when its pipe closes."""
  if _state['pipe'] is None:
    return
  signal.set_wakeup_fd(-1)
  signal.signal(signal.SIGINT, _state['previous'] or signal.default_int_handler)
  _sigterm_handler(_noted_by_watcher, _record)
  read_fd, write_fd = _state['pipe']
  os.close(write_fd)
  _state.update(pipe=None, previous=None)
  del read_fd  # the watcher reads EOF and closes it


def _watch(read_fd: int) -> None:
  """The watcher thread: one byte per signal that has a Python handler. Nothing it does for one signal (a
  callback that raises, a line that cannot be written) can end it: every later signal would be lost."""
  while True:
    try:
      data = os.read(read_fd, 64)
    except OSError:
      return
    if not data:
      os.close(read_fd)
      return
    for signum in data:
      try:
        _act_on(signum)
      except Exception as e:  # pylint: disable=broad-except
        console.say(f'handling {signal.Signals(signum).name} failed ({type(e).__name__}: {e}); still watching.')


def _act_on(signum: int) -> None:
  if signum == signal.SIGINT:
    _on_interrupt()
  elif signum == signal.SIGTERM:  # recorded here even while the main thread is in C (Python's handler waits)
    _record(signal.SIGTERM, None)  # the arrival, within milliseconds: the grace period counts from it
    if _state['xla'] is not None:  # ours in front of XLA's
      _notify_xla()
    else:  # came before XLA took SIGTERM, recorded only now: possibly after hand_over looked for it
      _pass_early_sigterm_on()


def _on_interrupt() -> None:
  """The first Ctrl-C is a preemption that exits 130; the second ends the process now. Each acts first and
  writes its line after (the line's write may fail or block: `console`)."""
  _state['interrupts'] += 1
  if _state['interrupts'] > 1:
    console.say('second Ctrl-C: aborting now; steps since the last committed checkpoint are lost.', wait_secs=0.5)
    os._exit(INTERRUPT_EXIT_CODE)  # pylint: disable=protected-access
  try:
    _record(signal.SIGINT, None)
    _forward_interrupt()
  finally:
    console.say('Ctrl-C: saving at the step every host agrees on, then exiting 130; Ctrl-C again aborts at once.')


def hand_over(publish: Callable[[], None]) -> None:
  """XLA's notifier agrees on SIGTERM from now on (ours in front of it records the arrival first): an early
  SIGTERM recorded here goes to it now, and a Ctrl-C (recorded already or later) first calls `publish`,
  then becomes a SIGTERM to XLA's notifier."""
  with _lock:
    _state['publish'] = publish
  _put_ours_in_front_of_xla()
  _pass_early_sigterm_on()
  _forward_interrupt()


def _pass_early_sigterm_on() -> None:
  """Once, after `hand_over`: a SIGTERM recorded here goes to whoever agrees on it now. Called by both
  `hand_over` and the watcher (which records a signal milliseconds after it came: either may be last)."""
  with _lock:
    got = received()
    if _state['publish'] is None or _state['early_sigterm_passed'] or not got or got[0] != signal.SIGTERM:
      return
    _state['early_sigterm_passed'] = True
  redeliver()


def _forward_interrupt() -> None:
  """Once: publish the Ctrl-C, then hand XLA a SIGTERM (the publication first, so that every host can
  see it by the time any of them reaches the agreed step)."""
  with _lock:
    publish = _state['publish']
    if publish is None or not _state['interrupts'] or _state['forwarded']:
      return
    _state['forwarded'] = True
  try:
    publish()
  finally:
    redeliver()

