"""`make bench`: every figure from alternating, paired runs in one invocation, median with min-max,
against a baseline measured alongside (saving off, stock paxml, a raw write or a single-object upload of
the same bytes). Not in CI; scenarios can run separately and their figures are merged into
bench/results.json, from which bench/results.md is written.

  python -m rigs.bench --only tiny_local,tiny_gcs30 --pairs 5

Storages: `local` (this disk), `gcs0` and `gcs30` (rigs.local_gcs with 0 and 30 ms per
request). Scenarios (see scenarios.py): tiny_<storage> (step time with continuous saving vs off, loop
blocking, save duration, interval, requests per save), ondemand_<size>_<storage> (the on-demand save vs
the storage's own limit for the same bytes), ondemandzstd_<size>_<storage> (the on-demand save written
raw vs with zstd), inflight_<size>_<storage> (SIGTERM during a continuous save, with a grace budget that
holds a new save and one that does not), stock_<size> (SIGTERM -> exit vs stock paxml), anywhere (SIGTERM
-> exit during a 2-minute eval, and with the train input blocked, each vs between training steps), restart,
agedlog (a restart with a week of events in its log vs one run's), hook, decision,
formats_<storage> (zarr vs OCDBT), notices_<size> (notice -> committed), noticestart
(start-up with notices auto and no server vs off), checksums (the manifest's cost), verification
(restore + manifest check vs restore), adaptive (the self-set interval against the Young/Daly
optimum), localtier_<size>_<storage> (an unplanned kill: training lost and the restore, local tier every
1 s against continuous saves to the job directory only), localstep (step time with the local tier at its default
cadence vs off), nice_<storage> (continuous saving with its threads at the default nice vs 0), tinyfloor (the tiny
on-demand save against orbax 0.5.9 saving the same arrays alone: the fixed cost's floor),
peertransfer_<size> (a committed local step of the Medium / Large state's bytes streamed between 2 local
processes by pax_autockpt.local.peer vs a raw loopback socket copy + fsync of the same bytes, and each side's peak RSS
growth; see peer.py; Medium ~30 s, in the default set; Large ~100 s, not), decision_scale (the save
decision's protocol at 8 to 1,024 simulated hosts, no model; not in the default set: ~20 minutes),
planscale (the restart's local-tier plan at 8 to 1,024 simulated hosts, one host's share from a buddy copy
vs every host its own; pure Python, ~15 s; see plan_scale.py), buddystep_<size> (step time of a 2-host job
whose model is split over both hosts, local tier every 10 s, with buddy copies vs without; _cap<MB/s>: the
copies capped at that rate, e.g. buddystep_Medium_cap30),
buddyrelaunch_<size> (relaunch -> first step with host 1's local directory gone, its share from host 0's
buddy copy, vs every directory intact) and buddyflood_<size> (host 0's step time, RSS growth, local commits and
host 1's copies of them in a 20 s window with a stranger's flood against host 0's buddy server vs undisturbed;
Tiny ~20 minutes at 5 pairs, start-ups mostly); see buddy.py; not in the default set: ~25 and ~15 minutes at Medium:

  python -m rigs.bench --only buddystep_Medium,buddyrelaunch_Medium,buddyflood_Tiny

goodputtrace_<size> (goodput under one seeded failure trace, a preemption, crash or replaced VM per 400 s window
(the MTBF ~18x our restart, Pax's interval ~MTBF/5), 2 seeds: the lineage each arm ends with, stock paxml with the
guide's two flags, ours with the job directory, continuous, and the local tier, against undisturbed stock; see
trace.py; Tiny only; not in the default set: ~1 h per pass):

  python -m rigs.bench --only goodputtrace_Tiny --pairs 2

goodputtrace_harsh (failures every 1.5-2x the measured restart, of mixed kinds, a SIGTERM in the job's first compile
first, a SIGKILL with the local directory gone among them; stock, ours with the job directory and with the local tier,
against undisturbed stock, and the train step's compiles paid and dropped per window; see harsh.py; ~13 min a pass):

  python -m rigs.bench --only goodputtrace_harsh --pairs 1

launchrestart (2 hosts under `launch --max_restarts`, forked from its standby process vs fresh interpreters: launch
-> first step, and kill -> first step after the restart) and restartcache_<size> (one host killed and started
again at once: kill -> first step, the compilation cache on by default vs off vs stock paxml); see restarts.py;
on demand.
"""

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys

from rigs import local_gcs
from rigs.bench import markdown
from rigs.bench import measure
from rigs.bench import scenarios

STORAGES = {'local': None, 'gcs0': 0.0, 'gcs30': 30.0}
DEFAULT = ('tiny_local,tiny_gcs0,tiny_gcs30,ondemand_Medium_local,ondemand_Large_local,ondemand_Medium_gcs0,'
           'ondemand_Medium_gcs30,stock_Medium,restart,hook,decision,formats_local,formats_gcs30,notices_Tiny,'
           'notices_Medium,noticestart,checksums,verification,adaptive,ondemandzstd_Large_local,ondemandzstd_Medium_gcs30,'
           'inflight_Large_gcs30,localtier_Medium_gcs30,localstep,tinyfloor,nice_local,peertransfer_Medium,planscale,'
           'anywhere')
ON_DEMAND = ('decision_scale,peertransfer_Large,buddystep_Medium,buddyrelaunch_Medium,'  # long: run with --only
             'buddyflood_Tiny,goodputtrace_Tiny,goodputtrace_harsh,launchrestart,restartcache_Tiny')


def _run(name: str, storage: measure.Storage, args) -> list[measure.Figure]:
  kind, *rest = name.split('_')
  if kind == 'tiny':
    return scenarios.tiny_saves(storage, args.pairs, args.secs)
  if kind == 'ondemand':
    return scenarios.on_demand(storage, rest[0], args.pairs)
  if kind == 'ondemandzstd':
    return scenarios.on_demand_zstd(storage, rest[0], args.pairs)
  if kind == 'inflight':
    return scenarios.sigterm_in_flight(storage, rest[0], args.pairs)
  if kind == 'inflightwide':  # a short budget the plan still saves in: twice the save + 5 s
    return scenarios.sigterm_in_flight(storage, rest[0], args.pairs, short=(2.0, 5.0))
  if kind == 'stock':
    return scenarios.sigterm_vs_stock(storage, rest[0], args.pairs)
  if kind == 'anywhere':
    return scenarios.sigterm_anywhere(storage, args.pairs)
  if kind == 'restart':
    return scenarios.restart(storage, args.pairs)
  if kind == 'agedlog':
    from rigs.bench import aged_log  # pylint: disable=g-import-not-at-top
    return aged_log.aged_restart(storage, args.pairs)
  if kind == 'hook':
    return scenarios.hook_cost(storage, args.pairs, args.secs)
  if name == 'decision_scale':
    return scenarios.decision_scale(args.pairs)
  if kind == 'decision':
    return scenarios.decision(storage, args.pairs, args.secs)
  if kind == 'formats':
    return scenarios.formats(storage, args.pairs, args.secs)
  if kind == 'notices':
    return scenarios.notices(storage, rest[0], args.pairs)
  if kind == 'noticestart':
    return scenarios.notices_startup(storage, args.pairs)
  if kind == 'verification':
    return scenarios.verification(storage, args.pairs)
  if kind == 'checksums':
    return scenarios.checksums(storage, args.pairs, args.secs)
  if kind == 'adaptive':
    return scenarios.adaptive(storage, args.pairs)
  if kind == 'localtier':
    return scenarios.local_tier_kill(storage, rest[0], args.pairs)
  if kind == 'nice':
    return scenarios.background_nice(storage, args.pairs, args.secs)
  if kind == 'tinyfloor':
    return scenarios.orbax_floor(storage, args.pairs)
  if kind == 'localstep':
    return scenarios.local_step_time(storage, args.pairs, args.secs)
  if kind == 'peertransfer':
    from rigs.bench import peer  # pylint: disable=g-import-not-at-top  # also run with -m
    return peer.peer_transfer(storage, rest[0], args.pairs)
  if kind == 'planscale':
    from rigs.bench import plan_scale  # pylint: disable=g-import-not-at-top
    return plan_scale.plan_scale(args.pairs)
  if kind in ('launchrestart', 'restartcache'):
    from rigs.bench import restarts  # pylint: disable=g-import-not-at-top
    if kind == 'launchrestart':
      return restarts.launch_restart(storage, args.pairs)
    return restarts.restart_cache(storage, rest[0], args.pairs)
  if kind in ('buddystep', 'buddyrelaunch', 'buddyflood'):
    from rigs.bench import buddy  # pylint: disable=g-import-not-at-top
    if kind == 'buddyflood':
      return buddy.buddy_flood(storage, rest[0], args.pairs)
    if kind == 'buddystep':  # buddystep_<size>[_cap<MB/s>]
      cap = float(rest[1][3:]) if len(rest) > 1 and rest[1].startswith('cap') else None
      return buddy.buddy_step_time(storage, rest[0], args.pairs, max(args.secs, buddy.STEP_SECS), cap)
    return buddy.buddy_relaunch(storage, rest[0], args.pairs)
  if name == 'goodputtrace_harsh':
    from rigs.bench import harsh  # pylint: disable=g-import-not-at-top
    return harsh.goodput_harsh(storage, args.pairs)
  if kind == 'goodputtrace':
    from rigs.bench import trace  # pylint: disable=g-import-not-at-top
    return trace.goodput_trace(storage, rest[0], args.pairs)
  raise SystemExit(f'error: unknown scenario {name!r}: choose from {DEFAULT},{ON_DEMAND}')


def _storage_of(name: str) -> str:
  last = name.split('_')[-1]
  return last if last in STORAGES else 'local'


def _commit() -> str:
  try:
    return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True,
                          timeout=10).stdout.strip()
  except OSError:
    return ''


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='python -m rigs.bench', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--out', default='bench')
  parser.add_argument('--only', default=DEFAULT, help='comma-separated scenarios')
  parser.add_argument('--pairs', type=int, default=5, help='alternating runs per arm (>= 5 for a figure)')
  parser.add_argument('--secs', type=float, default=15.0, help='training seconds per timed run')
  args = parser.parse_args(argv)
  results_path = os.path.join(args.out, 'results.json')
  results = json.load(open(results_path)) if os.path.exists(results_path) else {}
  results.update(machine=f'{os.cpu_count()} CPUs, {sys.platform}', scenarios=results.get('scenarios', {}))
  workdir = measure.scratch(args.out)
  names = [n for n in args.only.split(',') if n]
  gcs = None
  try:
    if any(_storage_of(n) != 'local' for n in names):
      gcs = local_gcs.LocalGCS(os.path.join(workdir, 'gcs'), bucket='autockpt-bench').start()
      os.environ.update(gcs.env())  # this process reads the event logs on the bucket too
    for name in names:
      where = _storage_of(name)
      storage = measure.Storage(where, workdir, gcs if where != 'local' else None, STORAGES[where] or 0)
      measure.say(f'--- {name} ({args.pairs} pairs)')
      figures = _run(name, storage, args)
      results['scenarios'][name] = {
          'measured': datetime.datetime.now().isoformat(timespec='seconds'), 'commit': _commit(),
          'pairs': args.pairs, 'secs': args.secs, 'figures': [f.to_dict() for f in figures]}
      with open(results_path, 'w') as f:  # after each scenario: a long run keeps what it measured
        json.dump(results, f, indent=1)
      with open(os.path.join(args.out, 'results.md'), 'w') as f:
        f.write(markdown.render(results))
  finally:
    if gcs is not None:
      gcs.stop()
    shutil.rmtree(workdir, ignore_errors=True)
  print(markdown.render(results))
  return 0


if __name__ == '__main__':
  sys.exit(main())
