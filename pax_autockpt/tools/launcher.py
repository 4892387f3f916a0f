"""`pax-autockpt launch`: N local processes as N hosts of one job, for tests and demos.

Each host is `python -m pax_autockpt.main ARGS --host_idx=i --num_hosts=N --server_addr=127.0.0.1:P`
with one CPU device and Gloo cross-process collectives (the one set-up that trains across local
processes with jaxlib 0.4.26: with 2+ devices per process Gloo's context set-up times out). Processes
are grouped into slices in host order; praxis lays jax.devices() (ordered by process) out as ICI x DCN.

Every host is forked from one standby process (`pax_autockpt.startup.standby`) that imported paxml, jax and
TensorFlow once, instead of N interpreters importing the same modules on the same cores (`--no_standby`: a
fresh interpreter per host). With `--max_restarts N` the launcher is also the job's scheduler: when a host fails
(a crash, a kill, a failure exit, a SIGTERM it did not send) every host starts again, forked again (a restart
without imports), up to N times, as a JobSet or Slurm's `--requeue` would — never after exit 0, a bad-input
exit (2: a rerun fails the same way) or a signal the launcher itself received or sent.
"""

import dataclasses
import json
import math
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Sequence

from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt.hosts import hosts
from pax_autockpt.signals import console
from pax_autockpt.signals import signals
from pax_autockpt.startup import standby as standby_lib
from pax_autockpt.tools import launch_events
from pax_autockpt.tools import status

# Console tail: the plugin's own lines and failures; everything goes to the host's log file.
_TAIL = re.compile(r'\[autockpt\]|Traceback|[A-Z][A-Za-z]*Error\b|^error:|Fatal|Aborted')
_FAILED = 'failed'
_BAD_INPUT = 2  # pax_autockpt.main's exit for bad input (CONTRACT): a rerun would fail the same way
_DEFAULT_GRACE_SECS = next(f.default for f in dataclasses.fields(settings_lib.Settings) if f.name == 'grace_secs')
_KILL_MARGIN_SECS = 10.0  # after the grace period: a host's own watchdog ends it 1 s before, this is the rest


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
  num_hosts: int
  num_slices: int = 1
  port: int | None = None
  preempt_after: float | None = None
  preempt_host: int | None = None
  peer_exit_secs: float = 60.0  # after one host fails, how long the others get before SIGKILL
  args: Sequence[str] = ()
  max_restarts: int = 0  # in-place restarts of the whole job after a failure
  standby: bool = True  # hosts forked from one process that imported paxml, not N fresh interpreters
  restart_backoff_secs: float = 2.0  # the wait before a restart (Backoff): doubled after each quick failure
  restart_backoff_max_secs: float = 60.0


class LaunchError(ValueError):
  """Bad launcher arguments (exit 2)."""


def _flag(args: Sequence[str], name: str) -> str | None:
  """The value of `--name=V` or `--name V` among the hosts' flags."""
  for i, arg in enumerate(args):
    if arg.startswith(f'--{name}='):
      return arg.split('=', 1)[1]
    if arg == f'--{name}' and i + 1 < len(args):
      return args[i + 1]
  return None


def _job_log_dir(args: Sequence[str]) -> str:
  found = _flag(args, 'job_log_dir')
  if found is None:
    raise LaunchError('--job_log_dir is missing after "--": pass the training flags, e.g. '
                      'pax-autockpt launch --num_hosts 2 -- --exp=... --job_log_dir=DIR')
  return found


def _preemption_exit_code(args: Sequence[str]) -> int:
  """The hosts' --autockpt_exit_code, else the default: an exit with it is not a failure."""
  value = _flag(args, 'autockpt_exit_code') or ''
  return int(value) if value.isdigit() else settings_lib.DEFAULT_EXIT_CODE


def validate(cfg: LaunchConfig) -> None:
  if cfg.num_hosts < 1:
    raise LaunchError(f'--num_hosts={cfg.num_hosts}: use 1 or more hosts')
  if cfg.num_slices < 1 or cfg.num_hosts % cfg.num_slices:
    raise LaunchError(f'--num_slices={cfg.num_slices} must divide --num_hosts={cfg.num_hosts} '
                      '(every slice holds the same number of hosts)')
  if cfg.port is not None and not 1 <= cfg.port <= 65535:
    raise LaunchError(f'--port={cfg.port}: use a free TCP port 1..65535, or omit it')
  if cfg.preempt_after is not None and cfg.preempt_after < 0:
    raise LaunchError(f'--preempt_after={cfg.preempt_after}: use seconds >= 0')
  if cfg.max_restarts < 0:
    raise LaunchError(f'--max_restarts={cfg.max_restarts}: use 0 (no restart) or more')
  if cfg.preempt_host is not None and not 0 <= cfg.preempt_host < cfg.num_hosts:
    raise LaunchError(f'--preempt_host={cfg.preempt_host} is out of range: use 0..{cfg.num_hosts - 1}')
  for banned in ('--host_idx', '--num_hosts', '--server_addr'):
    if any(a == banned or a.startswith(banned + '=') for a in cfg.args):
      raise LaunchError(f'{banned} is set by the launcher for each host: remove it after "--"')
  _job_log_dir(cfg.args)


def host_args(cfg: LaunchConfig, host: int, port: int) -> list[str]:
  """The `pax_autockpt.main` flags of host `host` (what a standby is handed, or a fresh interpreter runs)."""
  return [*cfg.args, f'--host_idx={host}', f'--num_hosts={cfg.num_hosts}', f'--server_addr=127.0.0.1:{port}',
          '--jax_cpu_enable_gloo_collectives=true']


def host_argv(cfg: LaunchConfig, host: int, port: int) -> list[str]:
  return [sys.executable, '-m', standby_lib.MAIN, *host_args(cfg, host, port)]


def host_env(port: int | None = None) -> dict[str, str]:
  """One CPU device per host; the coordinator (host 0) listens on loopback only, not on every address."""
  env = dict(os.environ)
  env.setdefault('JAX_PLATFORMS', 'cpu')
  if port is not None:
    env['JAX_COORDINATOR_BIND_ADDRESS'] = f'127.0.0.1:{port}'
  xla_flags = re.sub(r'--xla_force_host_platform_device_count=\S+', '', env.get('XLA_FLAGS', ''))
  env['XLA_FLAGS'] = (xla_flags + ' --xla_force_host_platform_device_count=1').strip()
  return env


def _sigterm_when_launcher_dies(launcher_pid: int):
  """A child's pre-exec hook: if the launcher dies (even by SIGKILL), the host (or the standby, and through it
  its hosts) gets SIGTERM, so it saves at the agreed step and exits instead of training on as an orphan."""
  return lambda: standby_lib.sigterm_when_parent_dies(launcher_pid)


class _Console:
  """The launcher's lines on stdout and stderr, written by one thread, so that no signal handler and no host's
  pump ever waits on the console: a `| tee` that died (EPIPE), a closed or full stream, a pager that stopped
  reading. A stream whose write fails is said once on stderr (if that still works) and pointed at /dev/null, as
  the training process's own lines are (`pax_autockpt.signals.console`): its later lines are dropped, and Python's own
  flush at exit cannot fail (which would make the exit code 120)."""

  _MAX_QUEUED = 10_000  # lines waiting for a console that blocks; beyond it they are dropped, not held

  def __init__(self):
    self._lines: queue.SimpleQueue = queue.SimpleQueue()  # put() is safe in a signal handler
    self._failed: set[str] = set()
    self._thread: threading.Thread | None = None
    self._start_lock = threading.Lock()

  def start(self) -> None:
    """The writer thread; called where no signal handler runs (a handler must not start a thread)."""
    with self._start_lock:
      if self._thread is None or not self._thread.is_alive():
        self._thread = threading.Thread(target=self._write_all, name='launch-console', daemon=True)
        self._thread.start()

  def say(self, line: str, stream: str = 'stdout') -> None:
    """Queues one whole line; never blocks, never raises."""
    if self._lines.qsize() < self._MAX_QUEUED:
      self._lines.put((stream, line))

  def drain(self, timeout: float) -> None:
    """Waits until the lines said so far are written, at most `timeout` s (a blocked console is not waited on)."""
    done = threading.Event()
    self._lines.put((None, done))
    done.wait(timeout)

  def _write_all(self) -> None:
    while True:
      stream, line = self._lines.get()
      if stream is None:
        line.set()
      elif stream not in self._failed:
        self._write(stream, line)

  def _write(self, stream: str, line: str) -> None:
    """One line; a stream that fails is pointed at /dev/null (`console.write`) and said once on stderr."""
    if not console.write(getattr(sys, stream), stream, line + '\n'):
      self._failed.add(stream)
      if stream != 'stderr':
        self._write('stderr', f'[launch] the console ({stream}) cannot be written ({console.lost().get(stream)}): '
                    "its lines are dropped from now on; every host's output is still in its log")


_console = _Console()


def _say(line: str) -> None:
  """One whole line on the console, from the console's thread (see _Console)."""
  _console.say(line)


def _warn(line: str) -> None:
  _console.say(line, 'stderr')


_STANDBY_READY_SECS = 120.0  # a standby still importing after this long is replaced by fresh interpreters


def _spawn(argv: list[str], env: dict[str, str], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
           stderr=subprocess.STDOUT) -> subprocess.Popen:
  """A host or the standby: its own session (a terminal's Ctrl-C reaches the launcher only, which forwards it
  once), SIGTERM if the launcher dies, output to a pipe the launcher reads."""
  return subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr, stdin=stdin, start_new_session=True,
                          preexec_fn=_sigterm_when_launcher_dies(os.getpid()))


class _Host:
  """One host's process; its output goes to its log file, plugin lines also to the console."""

  def __init__(self, idx: int, proc, log_path: str):
    self.idx = idx
    self.log_path = log_path
    self.proc = proc  # a subprocess.Popen, or a _Forked
    self.pump = threading.Thread(target=self._pump, daemon=True)
    self.pump.start()

  def _pump(self):
    """Reads the host's output to its end whatever the log does: a host whose pipe is not drained blocks in its
    next write once the pipe holds 64 KiB, and with it its exit."""
    log = _LogFile(self.log_path, self.idx)
    for raw in self.proc.stdout:
      log.write(raw)
      line = raw.decode(errors='replace').rstrip()
      if _TAIL.search(line):
        _say(f'[host {self.idx}] {line[-300:]}')
    log.close()

  def signal(self, signum: int) -> None:
    if self.proc.poll() is None:
      try:
        self.proc.send_signal(signum)
      except ProcessLookupError:
        pass


class _LogFile:
  """A host's log file. A write that fails (a full disk: ENOSPC) is said once on stderr; the host's output is
  then read and dropped (its plugin lines still reach the console), never left in its pipe."""

  def __init__(self, path: str, host: int):
    self._path, self._host = path, host
    self._file = None
    try:
      self._file = open(path, 'ab')  # pylint: disable=consider-using-with  (closed by close())
    except OSError as e:
      self._fail(e)

  def write(self, raw: bytes) -> None:
    if self._file is not None:
      try:
        self._file.write(raw)
        self._file.flush()
      except OSError as e:
        self._fail(e)

  def close(self) -> None:
    if self._file is not None:
      try:
        self._file.close()
      except OSError as e:
        self._fail(e)

  def _fail(self, error: OSError) -> None:
    if self._file is not None:
      try:
        self._file.close()
      except OSError:
        pass  # what it held is what failed
      self._file = None
    _warn(f"[launch] host {self._host}'s log {self._path} cannot be written ({type(error).__name__}: "
          f"{error.strerror or error}): the rest of its output is read and dropped (its [autockpt] lines still "
          'appear here); free the space and the next launch writes it again')


class _Forked:
  """What the launcher uses of `subprocess.Popen`, for a host the standby forked."""

  def __init__(self, standby: '_Standby', pid: int, stdout):
    self._standby = standby
    self.pid = pid
    self.stdout = stdout
    self.returncode = None

  def poll(self) -> int | None:
    if self.returncode is None:
      self.returncode = self._standby.exit_code(self.pid)
    return self.returncode

  def send_signal(self, signum: int) -> None:
    if self.poll() is None:
      os.kill(self.pid, signum)


class _Standby:
  """The launch's standby process (pax_autockpt.startup.standby), started with `env`: `fork` asks it for a host once
  its imports are done; its own output (the imports' warnings) goes to `log_path`."""

  def __init__(self, env: dict[str, str], log_path: str, argv: Sequence[str] = (sys.executable, '-m',
                                                                                 'pax_autockpt.startup.standby')):
    self.env = env
    self._requests, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with open(log_path, 'ab') as log:
      self.proc = _spawn(list(argv), env, stdin=theirs, stderr=log)
    theirs.close()
    self.started = time.time()
    self.ready = threading.Event()
    self._pids: queue.Queue = queue.Queue()
    self._codes: dict[int, int] = {}
    self._gone = False
    threading.Thread(target=self._read, daemon=True, name='standby-reader').start()

  def _read(self) -> None:
    for line in self.proc.stdout:
      message = json.loads(line)
      if message == standby_lib.READY:
        self.ready.set()
        _say(f'[launch] standby process ready ({time.time() - self.started:.1f} s of imports, once): every host '
             'is forked from it')
      elif 'pid' in message:
        self._pids.put(message['pid'])
      else:
        self._codes[message['exit']] = message['code']
    self._gone = True
    self._pids.put(None)

  def wait_ready(self, stopped: '_Signalled | None' = None) -> bool:
    """Whether its imports are done, waiting for them until `_STANDBY_READY_SECS` after its start (or a stop)."""
    while not self.ready.wait(0.1) and not self._gone and time.time() < self.started + _STANDBY_READY_SECS:
      if stopped is not None and stopped.name:
        return False
    return self.usable()

  def usable(self) -> bool:
    return self.ready.is_set() and not self._gone

  def exit_code(self, pid: int) -> int | None:
    """A forked host's exit code once it ended; 1 for one whose end the standby, itself ended, cannot report."""
    if pid in self._codes:
      return self._codes[pid]
    if self._gone and not status.running(pid):
      return self._codes.get(pid, 1)
    return None

  def fork(self, args: list[str], env: dict[str, str]) -> _Forked | None:
    """The host `python -m pax_autockpt.main ARGS` with `env`, forked once the imports are done; None where it
    cannot be (the standby ended or is not ready in time, or the host's environment differs in a variable its
    imports read: a fresh interpreter then)."""
    if not self.wait_ready() or standby_lib.stale(self.env, env):
      return None
    read, write = os.pipe()
    try:
      socket.send_fds(self._requests, [standby_lib.request(args, env)], [write])
      pid = self._pids.get(timeout=60)
    except (OSError, queue.Empty):
      pid = None
    finally:
      os.close(write)
    if pid is None:
      os.close(read)
      return None
    return _Forked(self, pid, os.fdopen(read, 'rb'))

  def stop(self) -> None:
    """The end of its requests: it ends once its hosts have; killed if it has not within 30 s."""
    self._requests.close()
    if not self.ready.is_set():
      self.proc.kill()  # still importing: nothing of it is needed
    try:
      self.proc.wait(30)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()


class _Signalled:
  """Whether the launcher received (or, with --preempt_after, sent) a stop: then no restart. `reached`: how
  many hosts had started when it came (one started later gets it at its start); `at`: when the first came (the
  hosts' grace period runs from then)."""

  def __init__(self):
    self.name: str | None = None
    self.signum: int | None = None
    self.reached = 0
    self.at: float | None = None


@dataclasses.dataclass
class Backoff:
  """The wait before each restart: `first_secs`, doubled after each run shorter than `reset_after_secs`, at most
  `max_secs`; `first_secs` again after a run that lasted that long (it trained: a new failure, not the same crash
  loop). A job that fails at start is restarted at a scheduler's pace, not as fast as it can crash."""
  first_secs: float = 2.0
  max_secs: float = 60.0
  reset_after_secs: float = 600.0
  quick_runs: int = 0  # runs in a row that ended before reset_after_secs

  def next(self, run_secs: float) -> float:
    """The wait before the restart that follows a run of `run_secs` seconds."""
    if run_secs >= self.reset_after_secs:
      self.quick_runs = 0
    delay = min(self.max_secs, self.first_secs * 2.0 ** min(self.quick_runs, 32))
    self.quick_runs += 1
    return delay


@dataclasses.dataclass
class Ended:
  """How one start of every host ended."""
  codes: list[int]  # each host's exit code, 128 + S for a signal S
  first_failed: int | None = None  # the host that failed first on its own (not a clean exit, not our SIGKILL)
  killed: set[int] = dataclasses.field(default_factory=set)  # hosts the launcher SIGKILLed


def job_code(ended: Ended) -> int:
  """The job's exit code: the first failing host's own code (never the launcher's SIGKILL of the others, nor a
  later host's abort); else 137 when the launcher SIGKILLed a host that outlived a stop's grace period; else the
  first non-zero code in host order (0 when every host finished)."""
  if ended.first_failed is not None:
    return ended.codes[ended.first_failed]
  if ended.killed:
    return 128 + signal.SIGKILL
  return next((c for c in ended.codes if c), 0)


def launch(cfg: LaunchConfig) -> int:
  """Starts the hosts, forwards SIGTERM/SIGINT, waits; exits with `job_code`. With --max_restarts, a failed job
  starts again (`restart_reason`) after a `Backoff`, each restart recorded in launch.jsonl."""
  validate(cfg)
  _console.start()
  job_log_dir = _job_log_dir(cfg.args)
  layout.host_log_path(job_log_dir, 0).parent.mkdir(parents=True, exist_ok=True)
  stopped, children = _Signalled(), []
  previous = {s: signal.signal(s, _forwarder(children, stopped)) for s in (signal.SIGTERM, signal.SIGINT)}
  standby = _Standby(host_env(), os.fspath(layout.standby_log_path(job_log_dir))) if cfg.standby else None
  try:
    return _run_until_done(cfg, job_log_dir, standby, stopped, children)
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    if standby:
      standby.stop()
    _console.drain(timeout=5.0)


def _run_until_done(cfg: LaunchConfig, job_log_dir: str, standby: _Standby | None, stopped: _Signalled,
                    children: list[_Host]) -> int:
  """Every start of the hosts, restarts included; the job's exit code."""
  restarts, backoff = 0, Backoff(cfg.restart_backoff_secs, cfg.restart_backoff_max_secs)
  while True:
    began = time.time()
    ended = _run_once(cfg, job_log_dir, restarts, standby, stopped, children)
    if ended is None:
      _say(f'[launch] {stopped.name} before any host started: nothing to save; exit {128 + stopped.signum}')
      return 128 + stopped.signum
    reason = restart_reason(ended.codes, ended.first_failed, stopped.name, restarts, cfg.max_restarts)
    if reason is None:
      return _said_code(ended)
    restarts += 1
    took = 'forked from the standby process' if standby and standby.usable() else 'fresh processes'
    _say(f'[launch] {reason}: restart {restarts} of {cfg.max_restarts}, every host ({took})')
    delay = backoff.next(time.time() - began)
    _record_restart(job_log_dir, restarts, cfg.max_restarts, reason, ended, delay, time.time() - began)
    _say(f'[launch] restart {restarts} in {delay:.0f} s (backoff: {backoff.first_secs:.0f} s, doubled after each '
         f'run shorter than {backoff.reset_after_secs / 60:.0f} min, at most {backoff.max_secs:.0f} s)')
    _sleep_unless_stopped(delay, stopped)


def _said_code(ended: Ended) -> int:
  """`job_code`, with one line naming whose code it is when a host failed or was killed."""
  code = job_code(ended)
  if ended.first_failed is not None:
    _say(f'[launch] exit {code}: host {ended.first_failed} failed first')
  elif ended.killed:
    _say(f'[launch] exit {code}: host(s) {", ".join(map(str, sorted(ended.killed)))} SIGKILLed after the grace '
         'period')
  return code


def _record_restart(job_log_dir: str, restart: int, max_restarts: int, reason: str, ended: Ended, delay: float,
                    run_secs: float) -> None:
  """A `restart` record in launch.jsonl for `report`; a write that fails is one line, and the restart goes on."""
  try:
    launch_events.write(job_log_dir, 'restart', restart=restart, max_restarts=max_restarts, reason=reason,
                        codes=ended.codes, backoff_s=delay, run_s=round(run_secs, 3))
  except OSError as e:
    _warn(f'[launch] could not record restart {restart} in {launch_events.path(job_log_dir)} '
          f'({type(e).__name__}: {e}); restarting all the same')


def _sleep_unless_stopped(secs: float, stopped: _Signalled) -> None:
  """The backoff: a stop during it ends the wait (and then the job, with no host started)."""
  deadline = time.time() + secs
  while not stopped.name and time.time() < deadline:
    time.sleep(0.05)


def _clean(cfg: LaunchConfig) -> tuple[int, ...]:
  """Exits that do not make the launcher end the other hosts: done, saved on a stop, interrupted."""
  return (0, _preemption_exit_code(cfg.args), signals.INTERRUPT_EXIT_CODE)


def restart_reason(codes: Sequence[int], first_failed: int | None, stopped_by: str | None, restarts: int,
                   max_restarts: int) -> str | None:
  """Why the job starts again after its hosts ended with `codes` (`first_failed`: the host whose failure ended
  the others, if one did), or None. Not after a stop the launcher received or sent (`stopped_by`), nor when
  every host ended 0, nor after bad input (2: a rerun fails the same way), nor after a Ctrl-C on a host (130: a
  person stopped it); a SIGTERM a host got from elsewhere (a preempted VM) is a restart, as a scheduler's."""
  if stopped_by is not None or restarts >= max_restarts or all(c == 0 for c in codes):
    return None
  if _BAD_INPUT in codes or signals.INTERRUPT_EXIT_CODE in codes:
    return None
  host = first_failed if first_failed is not None else next(i for i, c in enumerate(codes) if c)
  return f'host {host} ended with exit {codes[host]}'


def _run_once(cfg: LaunchConfig, job_log_dir: str, restarts: int, standby: _Standby | None, stopped: _Signalled,
              children: list[_Host]) -> Ended | None:
  """One start of every host, to the end of all (None when a stop came before any host started). `children` is
  the list the signal forwarder reads: this start's hosts, as each starts."""
  port = cfg.port or hosts.free_loopback_port()
  _say(f'[launch] {cfg.num_hosts} hosts in {cfg.num_slices} slice(s), coordinator 127.0.0.1:{port}, '
       f'logs {layout.host_log_path(job_log_dir, 0).parent}/host<i>.log')
  children.clear()
  stopped.reached = 0
  if not _start_hosts(cfg, port, job_log_dir, standby, stopped, children):
    return None
  if cfg.preempt_after is not None and restarts == 0:
    _preempt_later(cfg, children, stopped)
  ended = _watch(children, cfg.peer_exit_secs, _clean(cfg), stopped, grace_secs(cfg.args))
  for child in children:
    child.pump.join(timeout=5)
    _say(f'[launch] host {child.idx} exit code {ended.codes[child.idx]}')
  return ended


def _start_hosts(cfg: LaunchConfig, port: int, job_log_dir: str, standby: _Standby | None, stopped: _Signalled,
                 children: list[_Host]) -> bool:
  """Every host's process, forked by the standby where it can, else a fresh interpreter; False when a stop came
  before the first started (none is started then)."""
  if standby:
    standby.wait_ready(stopped)
  if stopped.name:
    return False
  for i in range(cfg.num_hosts):
    env = host_env(port)
    proc = standby.fork(host_args(cfg, i, port), env) if standby else None
    children.append(_Host(i, proc or _spawn(host_argv(cfg, i, port), env), os.fspath(layout.host_log_path(
        job_log_dir, i))))
    if stopped.name and len(children) > stopped.reached:
      children[-1].signal(stopped.signum)
  return True


def _forwarder(children: list[_Host], stopped: _Signalled):
  def forward(signum, frame):
    """Once per signal received: the hosts run in their own sessions, so a terminal's Ctrl-C reaches
    them only through here (a second Ctrl-C, forwarded again, makes them abort). Every host first, the line
    after: nothing the console does can keep a host from its signal."""
    del frame
    stopped.name, stopped.signum, stopped.reached = signal.Signals(signum).name, signum, len(children)
    stopped.at = stopped.at or time.time()
    for child in list(children):
      child.signal(signum)
    _say(f'[launch] forwarding {stopped.name} to every host')
  return forward


def _preempt_later(cfg: LaunchConfig, children: list[_Host], stopped: _Signalled) -> None:
  targets = children if cfg.preempt_host is None else [children[cfg.preempt_host]]

  def preempt():
    stopped.name = 'SIGTERM (--preempt_after)'
    stopped.at = stopped.at or time.time()
    for c in targets:
      c.signal(signal.SIGTERM)
      _say(f'[launch] SIGTERM to host {c.idx} (--preempt_after)')
  timer = threading.Timer(cfg.preempt_after, preempt)
  timer.daemon = True
  timer.start()


def grace_secs(args: Sequence[str]) -> float:
  """The hosts' --autockpt_grace_secs, else the product's default: how long a stop may take on a host."""
  try:
    value = float(_flag(args, 'autockpt_grace_secs') or 'nan')
  except ValueError:
    value = math.nan
  return value if math.isfinite(value) and value > 0 else _DEFAULT_GRACE_SECS


class _Watch:
  """One start's hosts until every one has ended (see `_watch`)."""

  def __init__(self, children: list[_Host], peer_exit_secs: float, clean: tuple[int, ...], stopped: _Signalled,
               grace: float):
    self.children, self.peer_exit_secs, self.clean = children, peer_exit_secs, clean
    self.stopped, self.grace = stopped, grace
    self.ended = Ended(codes=[])
    self.peer_deadline: float | None = None

  def run(self) -> Ended:
    while True:
      codes = [c.proc.poll() for c in self.children]
      self._note_failure(codes)  # also when the last hosts ended together: whose failure came first
      if all(code is not None for code in codes):
        self.ended.codes = [_exit_code(code) for code in codes]
        return self.ended
      self._kill_overdue()
      time.sleep(0.05)

  def _note_failure(self, codes: list[int | None]) -> None:
    """The first host to fail on its own (host order within one poll); the others get peer_exit_secs."""
    if self.ended.first_failed is not None:
      return
    failed = [c for c, code in zip(self.children, codes)
              if code is not None and code not in self.clean and c.idx not in self.ended.killed]
    if failed:
      self.ended.first_failed, self.peer_deadline = failed[0].idx, time.time() + self.peer_exit_secs
      others = f'; others get {self.peer_exit_secs:.0f} s to exit' if None in codes else ''
      _say(f'[launch] host {failed[0].idx} failed ({_exit_code(failed[0].proc.returncode)}){others}')

  def _kill_overdue(self) -> None:
    """SIGKILL to the hosts still running `peer_exit_secs` after a failure, or the grace period and a margin
    after a stop the launcher forwarded or sent (a host's exit path hung: `launch` still returns)."""
    now, limit = time.time(), self.grace + _KILL_MARGIN_SECS
    if self.peer_deadline is not None and now > self.peer_deadline:
      self._kill('still running; SIGKILL')
    elif self.stopped.at is not None and now > self.stopped.at + limit:
      self._kill(f'still running {limit:.0f} s after the {self.stopped.name} it was forwarded '
                 f'(--autockpt_grace_secs={self.grace:g} + {_KILL_MARGIN_SECS:.0f} s): SIGKILL')

  def _kill(self, why: str) -> None:
    for child in self.children:
      if child.idx not in self.ended.killed and child.proc.poll() is None:
        self.ended.killed.add(child.idx)
        child.signal(signal.SIGKILL)
        _say(f'[launch] host {child.idx} {why}')


def _watch(children: list[_Host], peer_exit_secs: float, clean: tuple[int, ...], stopped: _Signalled,
           grace: float) -> Ended:
  """Waits for every host. Once one failed (not a `clean` exit), SIGKILLs the others after `peer_exit_secs`;
  after a stop the launcher forwarded or sent, SIGKILLs any host alive `grace` s + a margin later."""
  return _Watch(children, peer_exit_secs, clean, stopped, grace).run()


def _exit_code(returncode: int) -> int:
  """A child killed by signal S reports 128 + S, as a shell would."""
  return 128 - returncode if returncode < 0 else returncode
