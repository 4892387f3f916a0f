"""Bench scenario `planscale`: the restart's local-tier plan at many simulated hosts, pure Python (issue 39).

Every host of a restart runs `local_restore.choose` on every host's HostReport (after the coordination
service handed them out as JSON), once per restart; buddy copies add a lookup per host without its own copy
and the keeper/owner arithmetic (pax_autockpt.buddy). Timed here without a model or any process: reports
as a restart after a kill sends them (each host its two newest local steps, `--autockpt_local_keep=2`, and
the buddy copy of its owner's newest; one slice, no replica), at 8, 128 and 1,024 hosts, with every host
holding its own copy against one host without (a replaced VM, its share in the buddy copy its keeper
holds), alternating per pair. A call takes microseconds at 8 hosts: each figure is a call's mean over
repeated calls for at least `MIN_SECS`.

The per-step save decision at the same host counts is `decision_scale` (~20 minutes, `make bench-scale`):
docs/benchmarks.md sets the two side by side.
"""

import time
from typing import Any, Callable

from pax_autockpt import buddy
from pax_autockpt import local_restore
from pax_autockpt.tools.bench import measure
from pax_autockpt.tools.bench.measure import Figure

HOSTS = (8, 128, 1024)
MIN_SECS = 0.2
NEWEST = 12_000  # the newest local step; the job directory's newest checkpoint is older
_TOKEN = 'job/run-1'


def reports(hosts: int, missing: int | None = None) -> dict[int, local_restore.HostReport]:
  """Every host's report after a kill: its two newest local steps (its own shards' fingerprint) and the buddy
  copy of its owner's newest step; host `missing` has neither (its disk was replaced)."""
  out = {}
  for host in range(hosts):
    gone = host == missing
    has = {} if gone else {step: (f'shards-{host}', _TOKEN) for step in (NEWEST - 100, NEWEST)}
    kept = {} if gone else {NEWEST: (f'shards-{buddy.owner(host, hosts)}', _TOKEN)}
    out[host] = local_restore.HostReport(f'shards-{host}', has, NEWEST - 1000 if host == 0 else None, kept)
  return out


def per_call_ms(fn: Callable[[], Any], min_secs: float = MIN_SECS) -> float:
  """One call's mean time over repeated calls for at least `min_secs` (one alone is below the clock's grain)."""
  calls, began = 0, time.perf_counter()
  while True:
    fn()
    calls += 1
    took = time.perf_counter() - began
    if took >= min_secs:
      return took / calls * 1e3


def _plan(encoded: dict[int, str], hosts: int) -> local_restore.Plan | None:
  """What one host does with the reports it received: decode every one, then choose."""
  found = {h: local_restore.HostReport.decode(t) for h, t in encoded.items()}
  return local_restore.choose(found, hosts, found[0].bucket)


def _bookkeeping(hosts: int) -> None:
  for host in range(hosts):
    buddy.keeper(host, hosts)
    buddy.owner(host, hosts)


def _measure(hosts: int, missing: int | None) -> dict[str, float]:
  """One arm at one host count: choose alone, decode + choose, and checks the plan is the expected one."""
  found = reports(hosts, missing)
  encoded = {h: r.encode() for h, r in found.items()}
  plan = _plan(encoded, hosts)
  want = set() if missing is None else {missing}
  if plan is None or plan.step != NEWEST or plan.from_buddy != want:
    raise RuntimeError(f'{hosts} hosts, host {missing} without its copy: unexpected plan {plan}')
  return dict(choose=per_call_ms(lambda: local_restore.choose(found, hosts, NEWEST - 1000)),
              plan=per_call_ms(lambda: _plan(encoded, hosts)),
              kb=sum(len(t) for t in encoded.values()) / 1e3)


def plan_scale(pairs: int, clients: tuple[int, ...] = HOSTS) -> list[Figure]:
  """The plan at each host count, one host without its own copy against every host with, alternating."""
  got = {(n, arm): [] for n in clients for arm in ('own', 'buddy')}
  keep = {n: [] for n in clients}
  for i in range(pairs):
    for n in clients:
      got[n, 'own'].append(_measure(n, None))
      got[n, 'buddy'].append(_measure(n, n // 2))
      keep[n].append(per_call_ms(lambda n=n: _bookkeeping(n)))
      measure.say(f'planscale #{i} {n} hosts: choose {got[n, "buddy"][-1]["choose"]:.3f} ms with a buddy copy, '
                  f'{got[n, "own"][-1]["choose"]:.3f} ms without; decode + choose {got[n, "buddy"][-1]["plan"]:.3f} '
                  f'/ {got[n, "own"][-1]["plan"]:.3f} ms; keeper/owner of every host {keep[n][-1]:.4f} ms')
  return [f for n in clients for f in _figures(n, got, keep[n])]


def _figures(n: int, got: dict, keep: list[float]) -> list[Figure]:
  per = lambda arm, key: [r[key] for r in got[n, arm]]
  one = 'one host\'s share from the buddy copy its keeper holds vs every host its own copy'
  base = 'every host its own copy'
  return [
      Figure(f'{n} hosts: the restart\'s plan (local_restore.choose), {one}', 'ms', per('buddy', 'choose'),
             per('own', 'choose'), base),
      Figure(f'{n} hosts: every report decoded + the plan (what each host runs once per restart), {one}', 'ms',
             per('buddy', 'plan'), per('own', 'plan'), base),
      Figure(f'{n} hosts: buddy bookkeeping (buddy.keeper and buddy.owner of every host)', 'ms', keep),
      Figure(f'{n} hosts: every host\'s report, JSON (what each host reads from the coordination service)', 'KB',
             per('buddy', 'kb')),
  ]
