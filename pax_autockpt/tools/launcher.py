"""`pax-autockpt launch`: N local processes as N hosts of one job, for tests and demos.

Each host is `python -m pax_autockpt.main ARGS --host_idx=i --num_hosts=N --server_addr=127.0.0.1:P`
with one CPU device and Gloo cross-process collectives (the one set-up that trains across local
processes with jaxlib 0.4.26: with 2+ devices per process Gloo's context set-up times out). Processes
are grouped into slices in host order; praxis lays jax.devices() (ordered by process) out as ICI x DCN.

With `--max_restarts N` the launcher is also the job's scheduler: when a host fails (a crash, a kill, a
failure exit, a SIGTERM it did not send) every host starts again, up to N times, as a JobSet or Slurm's
`--requeue` would — never after exit 0, a bad-input exit (2: a rerun fails the same way) or a signal the
launcher itself received or sent. Once every host has trained a step, it keeps one standby process per host
(`pax_autockpt.standby`: paxml, jax and TensorFlow imported ahead of need), so a restart skips the imports.
"""

import ctypes
import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Sequence

from pax_autockpt import hosts
from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt import signals
from pax_autockpt import standby as standby_lib

# Console tail: the plugin's own lines and failures; everything goes to the host's log file.
_TAIL = re.compile(r'\[autockpt\]|Traceback|[A-Z][A-Za-z]*Error\b|^error:|Fatal|Aborted')
_FAILED = 'failed'
_BAD_INPUT = 2  # pax_autockpt.main's exit for bad input (CONTRACT): a rerun would fail the same way
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


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
  standby: bool = True  # with max_restarts: restarts start from processes that imported ahead of need


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
  """A child's pre-exec hook: if the launcher dies (even by SIGKILL), the host gets SIGTERM, so
  it saves at the agreed step and exits instead of training on as an orphan (Linux only)."""

  def hook():
    if sys.platform.startswith('linux'):
      ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
      if os.getppid() != launcher_pid:  # died before the hook ran
        os.kill(os.getpid(), signal.SIGTERM)

  return hook


_CONSOLE = threading.Lock()


_STANDBY_READY_SECS = 120.0  # a standby still importing after this long is replaced by a fresh interpreter
_STEP_DONE = re.compile(r'\[PAX STATUS\]: Step `\d+` completed')  # paxml's line for a trained step


def _spawn(argv: list[str], env: dict[str, str], stdin=subprocess.DEVNULL) -> subprocess.Popen:
  """A host or a standby: its own session (a terminal's Ctrl-C reaches the launcher only, which forwards it
  once), SIGTERM if the launcher dies, output to a pipe the launcher reads."""
  return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=stdin,
                          start_new_session=True, preexec_fn=_sigterm_when_launcher_dies(os.getpid()))


class _Host:
  """One host's process; its output goes to its log file, plugin lines also to the console."""

  def __init__(self, idx: int, proc: subprocess.Popen, log_path: str, early: Sequence[bytes] = ()):
    self.idx = idx
    self.log_path = log_path
    self.proc = proc
    self._early = early  # a standby's output before it became this host (its imports')
    self.trained = threading.Event()  # paxml reported a trained step
    self.pump = threading.Thread(target=self._pump, daemon=True)
    self.pump.start()

  def _pump(self):
    with open(self.log_path, 'ab') as log:
      log.writelines(self._early)
      for raw in self.proc.stdout:
        log.write(raw)
        log.flush()
        line = raw.decode(errors='replace').rstrip()
        if _STEP_DONE.search(line):
          self.trained.set()
        if _TAIL.search(line):
          with _CONSOLE:  # print() writes the line and its newline apart: two hosts' lines could merge
            sys.stdout.write(f'[host {self.idx}] {line[-300:]}\n')
            sys.stdout.flush()

  def signal(self, signum: int) -> None:
    if self.proc.poll() is None:
      try:
        self.proc.send_signal(signum)
      except ProcessLookupError:
        pass


class _Standby:
  """A process per host that imports paxml ahead of need (pax_autockpt.standby), started with `env`; `ready`
  once its imports are done (its output until then is kept for the host's log)."""

  def __init__(self, env: dict[str, str]):
    self.env = env
    self.proc = _spawn([sys.executable, '-m', 'pax_autockpt.standby'], env, stdin=subprocess.PIPE)
    self.early: list[bytes] = []
    self.ready = threading.Event()
    self._reader = threading.Thread(target=self._read_until_ready, daemon=True)
    self._reader.start()

  def _read_until_ready(self) -> None:
    for raw in self.proc.stdout:
      if raw == standby_lib.READY:
        self.ready.set()
        return
      self.early.append(raw)

  def take(self, args: list[str], env: dict[str, str]) -> subprocess.Popen | None:
    """This process as the host `python -m pax_autockpt.main ARGS` with `env`, once its imports are done;
    None where it cannot be (it ended or hangs, or the host's environment differs in a variable its imports
    read)."""
    self._reader.join(timeout=_STANDBY_READY_SECS)
    if not self.ready.is_set() or self.proc.poll() is not None or standby_lib.stale(self.env, env):
      self.stop()
      return None
    try:
      self.proc.stdin.write(standby_lib.request(args, env))
      self.proc.stdin.close()
    except OSError:  # it ended in between
      self.stop()
      return None
    return self.proc

  def stop(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.wait()


class _Signalled:
  """Whether the launcher received (or, with --preempt_after, sent) a stop: then no restart."""

  def __init__(self):
    self.name: str | None = None


def launch(cfg: LaunchConfig) -> int:
  """Starts the hosts, forwards SIGTERM/SIGINT, waits; the first non-zero code in host order wins. With
  --max_restarts, a failed job starts again (`restart_reason`), from standby processes where there are some."""
  validate(cfg)
  job_log_dir = _job_log_dir(cfg.args)
  layout.host_log_path(job_log_dir, 0).parent.mkdir(parents=True, exist_ok=True)
  stopped, spares, restarts = _Signalled(), [], 0
  while True:
    codes, first_failed, spares = _run_once(cfg, job_log_dir, restarts, spares, stopped)
    reason = restart_reason(codes, first_failed, stopped.name, restarts, cfg.max_restarts)
    if reason is None:
      for spare in spares:
        spare.stop()
      return next((c for c in codes if c != 0), 0)
    restarts += 1
    took = 'standby processes' if spares else 'fresh processes'
    print(f'[launch] {reason}: restart {restarts} of {cfg.max_restarts}, every host ({took})', flush=True)


def _clean(cfg: LaunchConfig) -> tuple[int, ...]:
  """Exits that do not make the launcher end the other hosts: done, saved on a stop, interrupted."""
  return (0, _preemption_exit_code(cfg.args), signals.INTERRUPT_EXIT_CODE)


def restart_reason(codes: Sequence[int], first_failed: int | None, stopped_by: str | None, restarts: int,
                   max_restarts: int) -> str | None:
  """Why the job starts again after its hosts ended with `codes` (`first_failed`: the host whose failure ended
  the others, if one did), or None. Not after a stop the launcher received or sent (`stopped_by`), nor when
  every host ended 0, nor after bad input (2: a rerun fails the same way); a SIGTERM a host got from elsewhere
  (a preempted VM) is a restart, as a scheduler's."""
  if stopped_by is not None or restarts >= max_restarts or all(c == 0 for c in codes) or _BAD_INPUT in codes:
    return None
  host = first_failed if first_failed is not None else next(i for i, c in enumerate(codes) if c)
  return f'host {host} ended with exit {codes[host]}'


def _run_once(cfg: LaunchConfig, job_log_dir: str, restarts: int, spares: list[_Standby],
              stopped: _Signalled) -> tuple[list[int], int | None, list[_Standby]]:
  """One start of every host, to the end of all: their exit codes, the host that failed first (None: none
  did), and the standbys kept for a next start."""
  port = cfg.port or hosts.free_loopback_port()
  print(f'[launch] {cfg.num_hosts} hosts in {cfg.num_slices} slice(s), coordinator 127.0.0.1:{port}, '
        f'logs {layout.host_log_path(job_log_dir, 0).parent}/host<i>.log', flush=True)
  children = _start_hosts(cfg, port, job_log_dir, spares)
  previous = {s: signal.signal(s, _forwarder(children, stopped)) for s in (signal.SIGTERM, signal.SIGINT)}
  if cfg.preempt_after is not None and restarts == 0:
    _preempt_later(cfg, children, stopped)
  want_spares = cfg.standby and restarts < cfg.max_restarts
  try:
    codes, first_failed, kept = _wait(children, cfg.peer_exit_secs, clean=_clean(cfg),
                        standbys=(lambda: [_Standby(host_env()) for _ in children]) if want_spares else None)
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  for child in children:
    child.pump.join(timeout=5)
    print(f'[launch] host {child.idx} exit code {codes[child.idx]}', flush=True)
  return codes, first_failed, kept


def _start_hosts(cfg: LaunchConfig, port: int, job_log_dir: str, spares: list[_Standby]) -> list[_Host]:
  """Every host's process: its standby's where it has a usable one, else a fresh interpreter."""
  children = []
  for i in range(cfg.num_hosts):
    env = host_env(port)
    proc = spares[i].take(host_args(cfg, i, port), env) if i < len(spares) else None
    early = spares[i].early if proc else ()
    log = os.fspath(layout.host_log_path(job_log_dir, i))
    children.append(_Host(i, proc or _spawn(host_argv(cfg, i, port), env), log, early))
  return children


def _forwarder(children: list[_Host], stopped: _Signalled):
  def forward(signum, frame):
    """Once per signal received: the hosts run in their own sessions, so a terminal's Ctrl-C reaches
    them only through here (a second Ctrl-C, forwarded again, makes them abort)."""
    del frame
    stopped.name = signal.Signals(signum).name
    print(f'[launch] forwarding {stopped.name} to every host', flush=True)
    for child in children:
      child.signal(signum)
  return forward


def _preempt_later(cfg: LaunchConfig, children: list[_Host], stopped: _Signalled) -> None:
  targets = children if cfg.preempt_host is None else [children[cfg.preempt_host]]

  def preempt():
    stopped.name = 'SIGTERM (--preempt_after)'
    for c in targets:
      print(f'[launch] SIGTERM to host {c.idx} (--preempt_after)', flush=True)
      c.signal(signal.SIGTERM)
  timer = threading.Timer(cfg.preempt_after, preempt)
  timer.daemon = True
  timer.start()


def _wait(children: list[_Host], peer_exit_secs: float, clean: tuple[int, ...],
          standbys=None) -> tuple[list[int], int | None, list[_Standby]]:
  """Waits for all; once a host failed (not a `clean` exit), SIGKILLs the others after a while. Once every
  host trained a step, `standbys()` starts the processes a restart will take (not before: their imports
  would slow the hosts' own start on a machine they share)."""
  deadline, kept, first_failed, announced = None, [], None, False
  while True:
    codes = [c.proc.poll() for c in children]
    if all(code is not None for code in codes):
      return [_exit_code(code) for code in codes], first_failed, kept
    if standbys is not None and not kept and all(c.trained.is_set() for c in children):
      kept, started = standbys(), time.time()
    if kept and not announced and all(s.ready.is_set() for s in kept):
      announced = True
      print(f'[launch] {len(kept)} standby process(es) ready ({time.time() - started:.1f} s of imports): a '
            'restart skips them', flush=True)
    failed = [c for c, code in zip(children, codes) if code is not None and code not in clean]
    if failed and deadline is None:
      deadline, first_failed = time.time() + peer_exit_secs, failed[0].idx
      print(f'[launch] host {failed[0].idx} failed ({_exit_code(failed[0].proc.returncode)}); '
            f'others get {peer_exit_secs:.0f} s to exit', flush=True)
    if deadline is not None and time.time() > deadline:
      for child in children:
        if child.proc.poll() is None:
          print(f'[launch] host {child.idx} still running; SIGKILL', flush=True)
          child.signal(signal.SIGKILL)
    time.sleep(0.05)


def _exit_code(returncode: int) -> int:
  """A child killed by signal S reports 128 + S, as a shell would."""
  return 128 - returncode if returncode < 0 else returncode
