"""Bench scenario `planscale`: the restart's local-tier plan at many simulated hosts, pure Python (issue 39).

Every host of a restart runs `restoring.choose` on every host's HostReport (after the coordination
service handed them out as JSON), once per restart; buddy copies add a lookup per host without its own copy
and the keeper/owner arithmetic (pax_autockpt.local.buddy). Timed here without a model or any process: reports
as a restart after a kill sends them (each host its two newest local steps, `--autockpt_local_keep=2`, and
the buddy copy of its owner's newest; one slice, no replica), at 8, 128 and 1,024 hosts, with every host
holding its own copy against one host without (a replaced VM, its share in the buddy copy its keeper
holds); the arms' calls are taken in turn (`per_call_ms`), for at least `MIN_SECS` per host count and pair.

The per-step save decision at the same host counts is `decision_scale` (~20 minutes, `make bench-scale`):
docs/benchmarks.md sets the two side by side.
"""

import gc
import time
from typing import Any, Callable

from pax_autockpt.local import buddy
from pax_autockpt.local import restoring
from rigs.bench import measure
from rigs.bench.measure import Figure

HOSTS = (8, 128, 1024)
MIN_SECS = 0.5
NEWEST = 12_000  # the newest local step; the job directory's newest checkpoint is older
_TOKEN = 'job/run-1'


def reports(hosts: int, missing: int | None = None) -> dict[int, restoring.HostReport]:
  """Every host's report after a kill: its two newest local steps (its own shards' fingerprint) and the buddy
  copy of its owner's newest step; host `missing` has neither (its disk was replaced)."""
  out = {}
  for host in range(hosts):
    gone = host == missing
    has = {} if gone else {step: (f'shards-{host}', _TOKEN) for step in (NEWEST - 100, NEWEST)}
    kept = {} if gone else {NEWEST: (f'shards-{buddy.owner(host, hosts)}', _TOKEN)}
    out[host] = restoring.HostReport(f'shards-{host}', has, NEWEST - 1000 if host == 0 else None, kept)
  return out


def per_call_ms(*fns: Callable[[], Any], min_secs: float = MIN_SECS) -> list[float]:
  """Each of `fns`' mean time per call, the calls taken in turn (one of each, again) for at least `min_secs`:
  a call takes microseconds at 8 hosts (one alone is below the clock's grain), and taking them in turn
  puts this shared machine's drift on every arm alike. The garbage collector is off meanwhile: in a fixed
  turn its full collections (~10 ms at 1,024 hosts' reports) land on the same arm's call every time."""
  took, calls = [0.0] * len(fns), 0
  gc.collect()
  gc.disable()
  try:
    began = time.perf_counter()
    while time.perf_counter() - began < min_secs or not calls:
      for i, fn in enumerate(fns):
        start = time.perf_counter()
        fn()
        took[i] += time.perf_counter() - start
      calls += 1
  finally:
    gc.enable()
  return [t / calls * 1e3 for t in took]


def _plan(encoded: dict[int, str], hosts: int) -> restoring.Plan | None:
  """What one host does with the reports it received: decode every one, then choose."""
  found = {h: restoring.HostReport.decode(t) for h, t in encoded.items()}
  return restoring.choose(found, hosts, found[0].job_dir)


def _bookkeeping(hosts: int) -> None:
  for host in range(hosts):
    buddy.keeper(host, hosts)
    buddy.owner(host, hosts)


def _arm(hosts: int, missing: int | None) -> tuple[dict, dict[int, str]]:
  """One arm's reports, and as JSON; checks that their plan is the newest step, `missing` from a buddy copy."""
  found = reports(hosts, missing)
  encoded = {h: r.encode() for h, r in found.items()}
  plan = _plan(encoded, hosts)
  if plan is None or plan.step != NEWEST or plan.from_buddy != ({missing} if missing is not None else set()):
    raise RuntimeError(f'{hosts} hosts, host {missing} without its copy: unexpected plan {plan}')
  return found, encoded


def _measure(hosts: int) -> dict[str, float]:
  """At one host count, every arm taken in turn: choose alone, decode + choose (every host its own copy, and
  host hosts/2 without), the buddy bookkeeping; and the reports' JSON bytes."""
  (own, own_json), (one, one_json) = _arm(hosts, None), _arm(hosts, hosts // 2)
  choose = lambda found: restoring.choose(found, hosts, NEWEST - 1000)
  times = per_call_ms(lambda: choose(own), lambda: choose(one), lambda: _plan(own_json, hosts),
                      lambda: _plan(one_json, hosts), lambda: _bookkeeping(hosts))
  keys = ('choose_own', 'choose_buddy', 'plan_own', 'plan_buddy', 'bookkeeping')
  return dict(zip(keys, times), kb=sum(len(t) for t in one_json.values()) / 1e3)


def plan_scale(pairs: int, clients: tuple[int, ...] = HOSTS) -> list[Figure]:
  """The plan at each host count, one host without its own copy against every host with, in turn."""
  got = {n: [] for n in clients}
  for i in range(pairs):
    for n in clients:
      got[n].append(_measure(n))
      r = got[n][-1]
      measure.say(f'planscale #{i} {n} hosts: choose {r["choose_buddy"]:.3f} ms with a buddy copy, '
                  f'{r["choose_own"]:.3f} ms without; decode + choose {r["plan_buddy"]:.3f} / {r["plan_own"]:.3f} ms; '
                  f'keeper/owner of every host {r["bookkeeping"]:.4f} ms')
  return [f for n in clients for f in _figures(n, got[n])]


def _figures(n: int, got: list[dict]) -> list[Figure]:
  per = lambda key: [r[key] for r in got]
  one = 'one host\'s share from the buddy copy its keeper holds vs every host its own copy'
  base = 'every host its own copy'
  return [
      Figure(f'{n} hosts: the restart\'s plan (restoring.choose), {one}', 'ms', per('choose_buddy'),
             per('choose_own'), base),
      Figure(f'{n} hosts: every report decoded + the plan (what each host runs once per restart), {one}', 'ms',
             per('plan_buddy'), per('plan_own'), base),
      Figure(f'{n} hosts: buddy bookkeeping (buddy.keeper and buddy.owner of every host)', 'ms', per('bookkeeping')),
      Figure(f'{n} hosts: every host\'s report, JSON (what each host reads from the coordination service)', 'KB',
             per('kb')),
  ]
