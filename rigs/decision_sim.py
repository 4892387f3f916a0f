"""The per-step save decision (pax_autockpt.hosts.agreement) at many hosts, without a model.

A real coordination service (jaxlib's, as `jax.distributed` starts it on host 0) in a process of its own,
and N lightweight clients (threads in a few worker processes, each a real `DistributedRuntimeClient`)
that run only the decision loop: every host calls `PrimaryDecides` once per step, in lockstep, as the
training loop does before each step. Measured per client count:

- decision latency: per step, from the step's start until the slowest host has the answer (the time the
  training loop of the last host waits, since all hosts reach the step together in a real job);
- coordinator CPU per step: the service process's CPU time (/proc) during the decision loop, minus its
  idle rate (heartbeats) measured just before with the same clients connected.

  python -m rigs.decision_sim --clients 8,32,128 --steps 100 --period_ms 100

All servers listen on 127.0.0.1 and every process is stopped by pid.
"""

import argparse
import dataclasses
import json
import math
import mmap
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

_TIMEOUT_MS = 10 * 60 * 1000
_THREADS_PER_WORKER = 64


# --- the processes --------------------------------------------------------------------------------


def _serve(port: int, num_nodes: int) -> None:
  """The coordination service alone; it runs until stdin closes or the process is killed."""
  from jax._src.lib import xla_extension  # pylint: disable=g-import-not-at-top
  service = xla_extension.get_distributed_runtime_service(f'127.0.0.1:{port}', num_nodes)
  print('serving', flush=True)
  sys.stdin.read()
  del service
  os._exit(0)  # pylint: disable=protected-access  (no shutdown barrier with killed clients)


class _Lockstep:
  """A real step's collective, without the coordinator: no host starts step n before every host has its
  answer for step n-1 (what the protocol relies on to delete old keys). Each host writes the last step it
  finished into its own slot of a file every worker maps; one thread per worker watches the minimum."""

  def __init__(self, path: str, num_nodes: int):
    with open(path, 'r+b') as f:
      self._map = mmap.mmap(f.fileno(), num_nodes * 8)
    self._slots = memoryview(self._map).cast('q')
    self._all_done = -1
    self._cond = threading.Condition()
    threading.Thread(target=self._watch, daemon=True).start()

  def finished(self, node: int, step: int) -> None:
    self._slots[node] = step

  def wait(self, step: int) -> None:
    """Until every host has finished `step`."""
    with self._cond:
      self._cond.wait_for(lambda: self._all_done >= step)

  def _watch(self) -> None:
    while True:
      low = min(self._slots)
      if low > self._all_done:
        with self._cond:
          self._all_done = low
          self._cond.notify_all()
      time.sleep(0.0005)


def _host(node: int, num_nodes: int, addr: str, cfg: dict, lockstep: _Lockstep, out: dict) -> None:
  """One host: connect, agree on a start time, stay idle, then the decision loop; times into `out`."""
  from jax._src.lib import xla_extension  # pylint: disable=g-import-not-at-top

  from pax_autockpt.hosts import agreement  # pylint: disable=g-import-not-at-top
  client = xla_extension.get_distributed_runtime_client(addr, node, init_timeout=600)
  client.connect()
  client.wait_at_barrier('autockpt-sim/connected', _TIMEOUT_MS)
  if node == 0:
    client.key_value_set('autockpt-sim/t0', repr(time.time() + 1.0))
  t0 = float(client.blocking_key_value_get('autockpt-sim/t0', _TIMEOUT_MS))
  t_loop = t0 + cfg['idle_s'] + 0.5
  out.update(node=node, t0=t0, t_loop=t_loop)
  if node == 0:  # tells the driver when the idle window and the loop start
    _write_json(cfg['t0_path'], [t0, t_loop, cfg['idle_s']])
  if cfg['interval'] == 0:  # the harness's own floor: each host decides alone, nothing exchanged
    agree = lambda decide: decide()
  else:
    agree = agreement.PrimaryDecides(node, client=client, process_count=num_nodes, interval=cfg['interval'])
  period = cfg['period_ms'] / 1000
  calls, answers = [], []
  for n in range(cfg['steps']):
    lockstep.wait(n - 1)
    _sleep_until(t_loop + n * period)
    calls.append(time.time())
    agree(lambda n=n: n % cfg['save_every'] == 0)
    answers.append(time.time())
    lockstep.finished(node, n)
  out.update(calls=calls, answers=answers, client=client)  # the client stays alive until the end


def _sleep_until(when: float) -> None:
  left = when - time.time()
  if left > 0:
    time.sleep(left)


def _worker(addr: str, num_nodes: int, first: int, count: int, cfg: dict, result_path: str) -> None:
  """Hosts first..first+count-1 as threads; writes their times, then waits to be killed."""
  outs = [{} for _ in range(count)]
  lockstep = _Lockstep(cfg['lockstep_path'], num_nodes)
  threads = [threading.Thread(target=_host, args=(first + i, num_nodes, addr, cfg, lockstep, outs[i]),
                              daemon=True) for i in range(count)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  _write_json(result_path, [{k: v for k, v in o.items() if k != 'client'} for o in outs])
  time.sleep(3600)


def _read_json(path: str):
  with open(path) as f:
    return json.load(f)


def _write_json(path: str, value) -> None:
  """Whole or not at all: the driver polls for the file."""
  with open(path + '.tmp', 'w') as f:
    json.dump(value, f)
  os.rename(path + '.tmp', path)


# --- the driver -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
  """One measurement at `clients` hosts."""

  clients: int
  interval: int  # steps between exchanges of the decision (1: every step, the protocol before; 0: none)
  latency_ms_per_step: float  # mean over all steps of: step start -> the slowest host has the answer
  latency_ms_exchange_p50: float  # the same, over the steps with an exchange only
  latency_ms_exchange_p90: float
  coordinator_cpu_ms_per_step: float  # above its idle (heartbeat) rate
  coordinator_idle_cpu_pct: float
  hosts_cpu_pct: float  # the simulated hosts' own CPU during the loop (100 = one core): this machine's load
  steps: int
  period_ms: float


def _cpu_secs(pid: int) -> float:
  """utime + stime of a process, from /proc (Linux)."""
  with open(f'/proc/{pid}/stat') as f:
    fields = f.read().rsplit(')', 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def _spawn(args: list[str], **kwargs) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, '-m', 'rigs.decision_sim', *args],
                          start_new_session=True, **kwargs)


def _stop(procs: list[subprocess.Popen]) -> None:
  for proc in procs:
    if proc.poll() is None:
      os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def measure(clients: int, *, interval: int | None = None, steps: int = 128, period_ms: float = 100.0,
            idle_s: float = 5.0, save_every: int = 50, workdir: str | None = None) -> Result:
  """Starts the service and the clients, runs the idle window and the decision loop, stops them all.
  `interval` None: the protocol's own (agreement.decision_interval); 1: an exchange every step; 0: none
  (each host decides alone: what this machine adds to a step with no protocol at all)."""
  from pax_autockpt.hosts import agreement  # pylint: disable=g-import-not-at-top
  from pax_autockpt.hosts import hosts  # pylint: disable=g-import-not-at-top
  workdir = tempfile.mkdtemp(prefix='autockpt-sim-', dir=workdir)
  interval = agreement.decision_interval(clients) if interval is None else interval
  cfg = dict(steps=steps, period_ms=period_ms, idle_s=idle_s, save_every=save_every, interval=interval,
             t0_path=os.path.join(workdir, 't0'), lockstep_path=os.path.join(workdir, 'lockstep'))
  with open(cfg['lockstep_path'], 'wb') as f:
    f.write(struct.pack(f'{clients}q', *[-1] * clients))
  port = hosts.free_loopback_port()
  service = _spawn(['serve', f'--port={port}', f'--num_nodes={clients}'], stdin=subprocess.PIPE,
                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
  procs = [service]
  try:
    assert service.stdout.readline().strip() == b'serving', 'the coordination service did not start'
    paths = []
    for first in range(0, clients, _THREADS_PER_WORKER):
      paths.append(os.path.join(workdir, f'hosts{first}.json'))
      count = min(_THREADS_PER_WORKER, clients - first)
      procs.append(_spawn(['hosts', f'--addr=127.0.0.1:{port}', f'--num_nodes={clients}', f'--first={first}',
                           f'--count={count}', f'--cfg={json.dumps(cfg)}', f'--out={paths[-1]}'],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return _observe(service.pid, procs, paths, clients, cfg)
  finally:
    _stop(procs)
    shutil.rmtree(workdir, ignore_errors=True)


def _observe(service_pid: int, procs, paths: list[str], clients: int, cfg: dict) -> Result:
  """Samples the service's CPU around the idle window and the loop, then reads the hosts' times."""
  t0_path = cfg['t0_path']
  deadline = time.time() + 900
  samples = {}
  while not all(os.path.exists(p) for p in paths):
    if time.time() > deadline or any(p.poll() is not None for p in procs):
      raise RuntimeError(f'{clients} simulated hosts did not finish (exit codes {[p.poll() for p in procs]})')
    if 'idle' not in samples and os.path.exists(t0_path):
      samples['idle'] = _window(service_pid, t0_path)
      samples['hosts'] = sum(_cpu_secs(p.pid) for p in procs[1:])
    time.sleep(0.05)
  hosts_cpu = sum(_cpu_secs(p.pid) for p in procs[1:]) - samples['hosts']
  hosts = [h for p in paths for h in _read_json(p)]
  end = max(max(h['answers']) for h in hosts)
  cpu_end = _cpu_secs(service_pid)  # the loop's last answers are in: nothing after them but heartbeats
  idle_rate, cpu_loop_start = samples['idle']
  loop_s = end - hosts[0]['t_loop']
  busy = cpu_end - cpu_loop_start - idle_rate * loop_s
  per_step = _per_step_latency_ms(hosts, cfg)
  exchanges = per_step[::cfg['interval'] or 1]
  return Result(clients, cfg['interval'], statistics.mean(per_step), _pct(exchanges, 50), _pct(exchanges, 90),
                max(0.0, busy) / cfg['steps'] * 1e3, idle_rate * 100, hosts_cpu / loop_s * 100, cfg['steps'],
                cfg['period_ms'])


def _window(service_pid: int, t0_path: str) -> tuple[float, float]:
  """(idle CPU rate, CPU at the loop's start): sleeps through the idle window."""
  with open(t0_path) as f:
    t0, t_loop, idle_s = json.load(f)
  _sleep_until(t0 + 0.1)
  start = _cpu_secs(service_pid)
  _sleep_until(t0 + 0.1 + idle_s - 0.2)
  rate = (_cpu_secs(service_pid) - start) / (idle_s - 0.2)
  _sleep_until(t_loop - 0.05)
  return rate, _cpu_secs(service_pid)


def _per_step_latency_ms(hosts: list[dict], cfg: dict) -> list[float]:
  """Per step: from when every host could start it (its scheduled time, or the previous step's last
  answer if later) until the last host has its answer."""
  period = cfg['period_ms'] / 1000
  t_loop = hosts[0]['t_loop']
  last = [max(h['answers'][n] for h in hosts) for n in range(cfg['steps'])]
  starts = [max(t_loop + n * period, last[n - 1] if n else 0.0) for n in range(cfg['steps'])]
  return [(last[n] - starts[n]) * 1e3 for n in range(cfg['steps'])]


def _pct(xs: list[float], q: float) -> float:
  xs = sorted(xs)
  pos = (len(xs) - 1) * q / 100
  lo = math.floor(pos)
  hi = min(lo + 1, len(xs) - 1)
  return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def extrapolate(results: list[Result], field: str, to: int = 1024) -> float:
  """Least-squares line through (clients, field), evaluated at `to` hosts (the work per step grows with
  the number of hosts that read the decision)."""
  xs = [r.clients for r in results]
  ys = [getattr(r, field) for r in results]
  if len(set(xs)) < 2:
    return ys[0]
  slope, intercept = statistics.linear_regression(xs, ys)
  return intercept + slope * to


# --- command line ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m rigs.decision_sim', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest='command')
  serve = sub.add_parser('serve')
  serve.add_argument('--port', type=int, required=True)
  serve.add_argument('--num_nodes', type=int, required=True)
  hosts_p = sub.add_parser('hosts')
  for name in ('addr', 'cfg', 'out'):
    hosts_p.add_argument(f'--{name}', required=True)
  for name in ('num_nodes', 'first', 'count'):
    hosts_p.add_argument(f'--{name}', type=int, required=True)
  parser.add_argument('--clients', default='8,32,128')
  parser.add_argument('--interval', type=int, default=None, help='1: exchange every step (the protocol before)')
  parser.add_argument('--steps', type=int, default=128)
  parser.add_argument('--period_ms', type=float, default=100.0)
  args = parser.parse_args(argv)
  if args.command == 'serve':
    _serve(args.port, args.num_nodes)
  elif args.command == 'hosts':
    _hosts_command(args)
  else:
    results = [measure(int(n), interval=args.interval, steps=args.steps, period_ms=args.period_ms)
               for n in args.clients.split(',')]
    for r in results:
      print(json.dumps(dataclasses.asdict(r)), flush=True)
    for field in ('latency_ms_per_step', 'coordinator_cpu_ms_per_step'):
      print(f'{field} extrapolated to 1024 hosts: {extrapolate(results, field):.2f}', flush=True)
  return 0


def _hosts_command(args) -> None:
  _worker(args.addr, args.num_nodes, args.first, args.count, json.loads(args.cfg), args.out)


if __name__ == '__main__':
  sys.exit(main())
