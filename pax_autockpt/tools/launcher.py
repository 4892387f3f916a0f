"""`pax-autockpt launch`: N local processes as N hosts of one job, for tests and demos.

Each host is `python -m pax_autockpt.main ARGS --host_idx=i --num_hosts=N --server_addr=127.0.0.1:P`
with one CPU device and Gloo cross-process collectives (the one set-up that trains across local
processes with jaxlib 0.4.26: with 2+ devices per process Gloo's context set-up times out). Processes
are grouped into slices in host order; praxis lays jax.devices() (ordered by process) out as ICI x DCN.
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

# Console tail: the plugin's own lines and failures; everything goes to the host's log file.
_TAIL = re.compile(r'\[autockpt\]|Traceback|[A-Z][A-Za-z]*Error\b|^error:|Fatal|Aborted')
_FAILED = 'failed'
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
  if cfg.preempt_host is not None and not 0 <= cfg.preempt_host < cfg.num_hosts:
    raise LaunchError(f'--preempt_host={cfg.preempt_host} is out of range: use 0..{cfg.num_hosts - 1}')
  for banned in ('--host_idx', '--num_hosts', '--server_addr'):
    if any(a == banned or a.startswith(banned + '=') for a in cfg.args):
      raise LaunchError(f'{banned} is set by the launcher for each host: remove it after "--"')
  _job_log_dir(cfg.args)


def host_argv(cfg: LaunchConfig, host: int, port: int) -> list[str]:
  return [sys.executable, '-m', 'pax_autockpt.main', *cfg.args, f'--host_idx={host}',
          f'--num_hosts={cfg.num_hosts}', f'--server_addr=127.0.0.1:{port}',
          '--jax_cpu_enable_gloo_collectives=true']


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


class _Host:
  """One child process; its output goes to its log file, plugin lines also to the console."""

  def __init__(self, idx: int, argv: list[str], env: dict[str, str], log_path: str):
    self.idx = idx
    self.log_path = log_path
    # Own session: a terminal's Ctrl-C reaches the launcher only, which forwards it once.
    self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 preexec_fn=_sigterm_when_launcher_dies(os.getpid()))
    self.pump = threading.Thread(target=self._pump, daemon=True)
    self.pump.start()

  def _pump(self):
    with open(self.log_path, 'ab') as log:
      for raw in self.proc.stdout:
        log.write(raw)
        log.flush()
        line = raw.decode(errors='replace').rstrip()
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


def launch(cfg: LaunchConfig) -> int:
  """Starts the hosts, forwards SIGTERM/SIGINT, waits; the first non-zero code in host order wins."""
  validate(cfg)
  port = cfg.port or hosts.free_loopback_port()
  job_log_dir = _job_log_dir(cfg.args)
  log_dir = layout.host_log_path(job_log_dir, 0).parent
  log_dir.mkdir(parents=True, exist_ok=True)
  print(f'[launch] {cfg.num_hosts} hosts in {cfg.num_slices} slice(s), coordinator 127.0.0.1:{port}, '
        f'logs {log_dir}/host<i>.log', flush=True)
  children = [_Host(i, host_argv(cfg, i, port), host_env(port), os.fspath(layout.host_log_path(job_log_dir, i)))
              for i in range(cfg.num_hosts)]

  def forward(signum, frame):
    """Once per signal received: the hosts run in their own sessions, so a terminal's Ctrl-C reaches
    them only through here (a second Ctrl-C, forwarded again, makes them abort)."""
    del frame
    print(f'[launch] forwarding {signal.Signals(signum).name} to every host', flush=True)
    for child in children:
      child.signal(signum)

  previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  if cfg.preempt_after is not None:
    targets = children if cfg.preempt_host is None else [children[cfg.preempt_host]]
    timer = threading.Timer(cfg.preempt_after, lambda: [
        (print(f'[launch] SIGTERM to host {c.idx} (--preempt_after)', flush=True),
         c.signal(signal.SIGTERM)) for c in targets])
    timer.daemon = True
    timer.start()
  try:
    codes = _wait(children, cfg.peer_exit_secs,
                  clean=(0, _preemption_exit_code(cfg.args), signals.INTERRUPT_EXIT_CODE))
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
  for child in children:
    child.pump.join(timeout=5)
    print(f'[launch] host {child.idx} exit code {codes[child.idx]}', flush=True)
  return next((c for c in codes if c != 0), 0)


def _wait(children: list[_Host], peer_exit_secs: float, clean: tuple[int, ...]) -> list[int]:
  """Waits for all; once a host failed (not a `clean` exit), SIGKILLs the others after a while."""
  deadline = None
  while True:
    codes = [c.proc.poll() for c in children]
    if all(code is not None for code in codes):
      return [_exit_code(code) for code in codes]
    failed = [c for c, code in zip(children, codes) if code is not None and code not in clean]
    if failed and deadline is None:
      deadline = time.time() + peer_exit_secs
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
