"""`make bench`: every figure a ratio against a baseline measured in the same run, on this machine.

Writes bench/results.md and bench/results.json. Scenarios:
  (a) SIGTERM -> exit with the checkpoint committed, ~50M and ~200M-parameter states, against a raw
      sequential write + fsync of the same number of bytes on the same disk;
  (b) the same scenario under stock paxml/main.py with the seed's flags: ratio ours / stock;
  (c) step time with continuous checkpointing and with Pax's fixed interval, against checkpointing off;
      P50/P90 checkpoint interval in steps and seconds;
  (d) restart-to-first-step against a fresh start;
  (e) per-step cost of the hook when nothing is saved: ours / stock with saving off;
  (f) per-step cost of the multi-host save decision (2 hosts) when nothing is saved;
  (g) the save path, two formats: Pax's default zarr layout (a directory and files per array) vs
      OCDBT (--tensorstore_use_ocdbt): loop blocking per continuous save of the tiny state, and the
      on-demand save of the ~50M-parameter state against the raw write.
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time

from pax_autockpt import events as events_lib
from pax_autockpt import layout
from pax_autockpt.tools import process
from pax_autockpt.tools import report as report_lib

_B = 'pax_autockpt.tools.bench_experiments.'
_STEP_DONE = r'\[PAX STATUS\]: Step `\d+` completed'
_RATE = re.compile(r'steps/sec: ([0-9.]+)')


def _say(msg):
  print(f'[bench] {msg}', flush=True)


def _wiring(port):
  return ('--num_hosts=1', '--host_idx=0', f'--server_addr=127.0.0.1:{port}')


def _base(argv):
  """argv without its --job_log_dir (each run appends its own)."""
  return [a for a in argv if not a.startswith('--job_log_dir=')]


def _dir_bytes(path):
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def raw_write_secs(directory, nbytes, chunk=8 << 20):
  """Sequential write + fsync of nbytes: the disk's limit for a checkpoint of that size."""
  path = os.path.join(directory, 'raw.bin')
  buf = os.urandom(chunk)
  start = time.perf_counter()
  with open(path, 'wb') as f:
    left = nbytes
    while left > 0:
      f.write(buf[:min(chunk, left)])
      left -= chunk
    f.flush()
    os.fsync(f.fileno())
  secs = time.perf_counter() - start
  os.remove(path)
  return secs


def preempt_once(argv, workdir, name, train_secs=2.0):
  """Starts, waits for training, SIGTERM; returns (exit code, SIGTERM->exit s, job dir)."""
  job_dir = os.path.join(workdir, name)
  job = process.Job([*argv, f'--job_log_dir={job_dir}'], os.path.join(workdir, f'{name}.log'))
  try:
    job.wait_for_log(_STEP_DONE, timeout=900)
    time.sleep(train_secs)
    sent = job.send(signal.SIGTERM)
    code = job.wait(900)
    return code, time.time() - sent, job_dir
  finally:
    job.kill()


def mean_step_secs(log_text, skip=3):
  """Mean step time from Pax's 'steps/sec' lines (one per 10 steps), after warm-up."""
  rates = [float(r) for r in _RATE.findall(log_text)][skip:]
  rates = [r for r in rates if r > 0]
  return statistics.mean(1.0 / r for r in rates) if rates else float('nan')


def timed_run(argv, workdir, name, secs):
  """Trains for `secs` after the first step, then SIGKILL; returns (mean step s, job dir)."""
  job_dir = os.path.join(workdir, name)
  job = process.Job([*argv, f'--job_log_dir={job_dir}'], os.path.join(workdir, f'{name}.log'))
  try:
    job.wait_for_log(_STEP_DONE, timeout=600)
    time.sleep(secs)
  finally:
    job.kill()
  return mean_step_secs(job.log()), job_dir


def first_step_secs(argv, workdir, name, job_dir):
  """Process start -> first step completed."""
  job = process.Job([*argv, f'--job_log_dir={job_dir}'], os.path.join(workdir, f'{name}.log'))
  try:
    job.wait_for_log(_STEP_DONE, timeout=600)
    return time.time() - job.started
  finally:
    job.kill()


def _on_demand_save_vs_raw(workdir, job_dir):
  """The on-demand save (start -> commit, loop blocking, from the event log) of a preempted run,
  against a raw write + fsync of its newest checkpoint's bytes."""
  evs = events_lib.read(job_dir)
  step = next((e['step'] for e in evs if e.get('event') == 'preemption'), None)
  save = {}
  for e in evs:
    if e.get('step') == step and e.get('event') == 'save_started':
      save['blocking_s'] = e.get('blocking_s')
    if e.get('step') == step and e.get('event') == 'save_committed':
      save['save_s'] = e.get('duration_s')
  ckpt = layout.checkpoint_dir(job_dir)
  nbytes = _dir_bytes(os.fspath(layout.step_dir(ckpt, layout.newest_committed(ckpt))))
  raw = raw_write_secs(workdir, nbytes)
  return dict(bytes=nbytes, save_s=save.get('save_s'), blocking_s=save.get('blocking_s'),
              raw_write_fsync_s=raw, ratio_save_vs_raw=(save.get('save_s') or float('nan')) / raw)


def scenario_a_b(workdir, sizes, port):
  rows = []
  for size in sizes:
    ours = _base(process.ours_argv(f'{_B}{size}Autockpt', ''))
    stock = _base(process.stock_argv(f'{_B}{size}Stock', '', '--jax_fully_async_checkpoint',
                                     '--exit_after_ondemand_checkpoint', *_wiring(port)))
    code_o, secs_o, dir_o = preempt_once(ours, workdir, f'a_{size}_ours')
    code_s, secs_s, dir_s = preempt_once(stock, workdir, f'b_{size}_stock')
    save = _on_demand_save_vs_raw(workdir, dir_o)
    nbytes, raw = save['bytes'], save['raw_write_fsync_s']
    rows.append(dict(size=size, bytes=nbytes, ours_exit_code=code_o, ours_sigterm_to_exit_s=secs_o,
                     ours_save_blocking_s=save['blocking_s'], ours_save_s=save['save_s'],
                     ratio_save_vs_raw=save['ratio_save_vs_raw'],
                     stock_exit_code=code_s, stock_sigterm_to_exit_s=secs_s, raw_write_fsync_s=raw,
                     ratio_ours_vs_raw=secs_o / raw, ratio_ours_vs_stock=secs_o / secs_s))
    _say(f'(a/b) {size}: {nbytes / 1e6:.0f} MB, ours {secs_o:.2f} s (exit {code_o}; save '
         f'{save["save_s"]} s, loop blocked {save["blocking_s"]} s), stock '
         f'{secs_s:.2f} s (exit {code_s}), raw write {raw:.2f} s')
    shutil.rmtree(dir_o, ignore_errors=True)
    shutil.rmtree(dir_s, ignore_errors=True)
  return rows


def scenario_c(workdir, secs):
  base = _base(process.ours_argv(f'{_B}TinyAutockpt', ''))
  off, _ = timed_run([*base, '--enable_checkpoint_saving=false'], workdir, 'c_off', secs)
  fixed, fixed_dir = timed_run(base, workdir, 'c_interval', secs)
  cont, cont_dir = timed_run([*base, '--autockpt_continuous', '--autockpt_keep_latest=3'], workdir,
                             'c_continuous', secs)
  cont1, cont1_dir = timed_run([*base, '--autockpt_continuous', '--autockpt_min_interval_secs=1',
                                '--autockpt_keep_latest=3'], workdir, 'c_continuous_min1s', secs)
  # The baseline again at the end: the two bracket any drift of the machine during the runs.
  off_again, _ = timed_run([*base, '--enable_checkpoint_saving=false'], workdir, 'c_off_again', secs)
  off_first, off = off, (off + off_again) / 2
  out = dict(step_s_off_first=off_first, step_s_off_last=off_again,
             step_s_off=off, step_s_interval=fixed, step_s_continuous=cont,
             step_s_continuous_min1s=cont1, ratio_continuous_vs_off=cont / off,
             ratio_continuous_min1s_vs_off=cont1 / off, ratio_interval_vs_off=fixed / off)
  for name, job_dir in (('interval', fixed_dir), ('continuous', cont_dir),
                        ('continuous_min1s', cont1_dir)):
    r = report_lib.load(job_dir).to_dict()
    out[f'{name}_intervals'] = {k: v for k, v in r.items() if 'interval' in k.lower()}
  _say(f'(c) step time off {off * 1e3:.2f} ms, interval {fixed * 1e3:.2f} ms, continuous '
       f'{cont * 1e3:.2f} ms, continuous with a 1 s minimum {cont1 * 1e3:.2f} ms')
  return out


def scenario_d(workdir):
  argv = _base(process.ours_argv(f'{_B}TinyAutockpt', ''))
  job_dir = os.path.join(workdir, 'd_job')
  fresh = first_step_secs(argv, workdir, 'd_fresh', job_dir)
  restart = first_step_secs(argv, workdir, 'd_restart', job_dir)
  _say(f'(d) first step: fresh {fresh:.1f} s, restart {restart:.1f} s')
  return dict(fresh_first_step_s=fresh, restart_first_step_s=restart, ratio_restart_vs_fresh=restart / fresh)


def scenario_e(workdir, secs, port):
  ours, _ = timed_run(_base(process.ours_argv(f'{_B}TinyAutockpt', '')) +
                      ['--enable_checkpoint_saving=false'], workdir, 'e_ours', secs)
  stock_argv = _base(process.stock_argv(f'{_B}TinyStock', '', '--jax_fully_async_checkpoint',
                                        '--exit_after_ondemand_checkpoint', *_wiring(port),
                                        '--enable_checkpoint_saving=false'))
  stock, _ = timed_run(stock_argv, workdir, 'e_stock', secs)
  _say(f'(e) step time with nothing saved: ours {ours * 1e3:.3f} ms, stock {stock * 1e3:.3f} ms')
  return dict(step_s_ours=ours, step_s_stock=stock, ratio_ours_vs_stock=ours / stock,
              per_step_cost_ms=(ours - stock) * 1e3)


def _launch_timed(workdir, name, secs, *flags):
  """2 local hosts through the launcher; mean step time on host 0 after warm-up."""
  job_dir = os.path.join(workdir, name)
  argv = [sys.executable, '-m', 'pax_autockpt.tools.cli', 'launch', '--num_hosts=2', '--',
          f'--exp={_B}TinyMultisliceRareSaves', f'--job_log_dir={job_dir}', *flags]
  job = process.Job(argv, os.path.join(workdir, f'{name}.log'))
  host0 = os.fspath(layout.host_log_path(job_dir, 0))
  try:
    deadline = time.time() + 600
    while not (os.path.exists(host0) and 'Step `3` completed' in open(host0, errors='replace').read()):
      if time.time() > deadline or job.proc.poll() is not None:
        raise RuntimeError(f'{name} did not start training: {job.log()[-2000:]}')
      time.sleep(0.5)
    time.sleep(secs)
  finally:
    job.kill()
  return mean_step_secs(open(host0, errors='replace').read())


def scenario_f(workdir, secs):
  """Per-step cost of the multi-host save decision (primary decides, key-value store) when
  nothing is saved: continuous with an unreachable minimum interval vs Pax's (never due) interval."""
  local = _launch_timed(workdir, 'f_pax_interval', secs)
  agreed = _launch_timed(workdir, 'f_agreed', secs, '--autockpt_continuous',
                         '--autockpt_min_interval_secs=1e9')
  _say(f'(f) 2 hosts, nothing saved: Pax interval {local * 1e3:.2f} ms/step, primary-decides '
       f'{agreed * 1e3:.2f} ms/step')
  return dict(step_s_local_decision=local, step_s_agreed_decision=agreed,
              ratio_agreed_vs_local=agreed / local, per_step_cost_ms=(agreed - local) * 1e3)


def _f(x):
  return 'n/a' if x is None else f'{x:.2f}'


def _continuous_saves(workdir, name, secs, *flags):
  """Median loop blocking and start -> commit of back-to-back saves of the tiny state."""
  base = _base(process.ours_argv(f'{_B}TinyAutockpt', ''))
  _, job_dir = timed_run([*base, '--autockpt_continuous', '--autockpt_keep_latest=3', *flags],
                         workdir, name, secs)
  evs = events_lib.read(job_dir)[3:]  # past the first saves' compilation and warm-up
  blocking = [e['blocking_s'] for e in evs if e.get('event') == 'save_started']
  duration = [e['duration_s'] for e in evs if e.get('event') == 'save_committed']
  return dict(saves=len(blocking), blocking_s_p50=statistics.median(blocking),
              duration_s_p50=statistics.median(duration))


def scenario_g(workdir, secs, size):
  zarr_flag, ocdbt_flag = '--tensorstore_use_ocdbt=false', '--tensorstore_use_ocdbt'
  zarr = _continuous_saves(workdir, 'g_zarr', secs, zarr_flag)
  ocdbt = _continuous_saves(workdir, 'g_ocdbt', secs, ocdbt_flag)
  out = dict(tiny_zarr=zarr, tiny_ocdbt=ocdbt,
             ratio_blocking_ocdbt_vs_zarr=ocdbt['blocking_s_p50'] / zarr['blocking_s_p50'],
             ratio_duration_ocdbt_vs_zarr=ocdbt['duration_s_p50'] / zarr['duration_s_p50'])
  _say(f'(g) tiny state, per save: zarr blocks {zarr["blocking_s_p50"] * 1e3:.1f} ms, OCDBT '
       f'{ocdbt["blocking_s_p50"] * 1e3:.1f} ms')
  for fmt, flags in (('zarr', (zarr_flag,)), ('ocdbt', (ocdbt_flag,))):
    argv = _base(process.ours_argv(f'{_B}{size}Autockpt', '', *flags))
    _, _, job_dir = preempt_once(argv, workdir, f'g_{size}_{fmt}')
    save = out[f'{size}_{fmt}'] = _on_demand_save_vs_raw(workdir, job_dir)
    _say(f'(g) {size} on-demand save, {fmt}: {save["save_s"]} s for {save["bytes"] / 1e6:.0f} MB, raw '
         f'write {save["raw_write_fsync_s"]:.2f} s')
    shutil.rmtree(job_dir, ignore_errors=True)
  return out


def to_markdown(res):
  a = res.get('a_b', [])
  lines = ['# pax-autockpt benchmark', '', f'Machine: {res["machine"]}. Each ratio is against a baseline '
           'measured in the same run.', '']
  if a:
    lines += ['## (a) SIGTERM -> exit with the checkpoint committed, vs raw write + fsync; (b) vs stock paxml',
              '', 'SIGTERM -> exit includes up to 1 s for XLA\'s preemption notifier to poll; "save" is the '
              'on-demand save alone (start -> commit), "blocked" the part of it that held the loop.', '',
              '| state | bytes | ours s | save s | blocked s | raw write s | ours/raw | save/raw | stock s | '
              'ours/stock | exit ours/stock |',
              '|---|---|---|---|---|---|---|---|---|---|---|']
    for r in a:
      lines.append(f'| {r["size"]} | {r["bytes"] / 1e6:.0f} MB | {r["ours_sigterm_to_exit_s"]:.2f} | '
                   f'{_f(r["ours_save_s"])} | {_f(r["ours_save_blocking_s"])} | '
                   f'{r["raw_write_fsync_s"]:.2f} | {r["ratio_ours_vs_raw"]:.2f} | {_f(r["ratio_save_vs_raw"])} | '
                   f'{r["stock_sigterm_to_exit_s"]:.2f} | {r["ratio_ours_vs_stock"]:.2f} | '
                   f'{r["ours_exit_code"]}/{r["stock_exit_code"]} |')
    lines.append('')
  if 'c' in res:
    c = res['c']
    lines += ['## (c) step time: continuous and fixed-interval checkpointing vs off', '',
              f'- off {c["step_s_off"] * 1e3:.2f} ms (mean of a first and a last run: '
              f'{c["step_s_off_first"] * 1e3:.2f}, {c["step_s_off_last"] * 1e3:.2f}), '
              f'interval {c["step_s_interval"] * 1e3:.2f} ms '
              f'(x{c["ratio_interval_vs_off"]:.3f}), continuous {c["step_s_continuous"] * 1e3:.2f} ms '
              f'(x{c["ratio_continuous_vs_off"]:.3f}), continuous with a 1 s minimum '
              f'{c["step_s_continuous_min1s"] * 1e3:.2f} ms (x{c["ratio_continuous_min1s_vs_off"]:.3f})',
              f'- intervals, continuous: {json.dumps(c["continuous_intervals"])}',
              f'- intervals, continuous with a 1 s minimum: {json.dumps(c["continuous_min1s_intervals"])}',
              f'- intervals, fixed: {json.dumps(c["interval_intervals"])}', '']
  if 'd' in res:
    d = res['d']
    lines += ['## (d) restart to first step vs fresh start', '',
              f'- fresh {d["fresh_first_step_s"]:.1f} s, restart {d["restart_first_step_s"]:.1f} s, '
              f'ratio {d["ratio_restart_vs_fresh"]:.2f}', '']
  if 'e' in res:
    e = res['e']
    lines += ['## (e) per-step cost of the hook when nothing is saved', '',
              f'- ours {e["step_s_ours"] * 1e3:.3f} ms, stock {e["step_s_stock"] * 1e3:.3f} ms, '
              f'ratio {e["ratio_ours_vs_stock"]:.3f} ({e["per_step_cost_ms"]:+.3f} ms/step)', '']
  if 'f' in res:
    f = res['f']
    lines += ['## (f) per-step cost of the multi-host save decision when nothing is saved (2 hosts)', '',
              f'- Pax interval (local decision) {f["step_s_local_decision"] * 1e3:.2f} ms, primary decides '
              f'via the key-value store {f["step_s_agreed_decision"] * 1e3:.2f} ms, ratio '
              f'{f["ratio_agreed_vs_local"]:.3f} ({f["per_step_cost_ms"]:+.3f} ms/step)', '']
  if 'g' in res:
    g = res['g']
    z, o = g['tiny_zarr'], g['tiny_ocdbt']
    lines += ['## (g) save path: zarr (Pax default, ours) vs OCDBT (--tensorstore_use_ocdbt)', '',
              f'- tiny state, back-to-back saves: loop blocked per save P50 zarr '
              f'{z["blocking_s_p50"] * 1e3:.1f} ms, OCDBT {o["blocking_s_p50"] * 1e3:.1f} ms (ratio '
              f'{g["ratio_blocking_ocdbt_vs_zarr"]:.2f}); start -> commit P50 zarr {z["duration_s_p50"] * 1e3:.1f} '
              f'ms, OCDBT {o["duration_s_p50"] * 1e3:.1f} ms (ratio {g["ratio_duration_ocdbt_vs_zarr"]:.2f}); '
              f'saves in the same time: {z["saves"]} vs {o["saves"]}']
    for key in sorted(k for k, v in g.items() if isinstance(v, dict) and not k.startswith('tiny')):
      r = g[key]
      lines.append(f'- {key}: on-demand save {_f(r["save_s"])} s for {r["bytes"] / 1e6:.0f} MB, raw write + '
                   f'fsync {r["raw_write_fsync_s"]:.2f} s, save/raw {_f(r["ratio_save_vs_raw"])}')
    lines.append('')
  return '\n'.join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(prog='python -m pax_autockpt.bench', description=__doc__)
  parser.add_argument('--out', default='bench')
  parser.add_argument('--only', default='abcdefg', help='scenarios to run, e.g. "ce"')
  parser.add_argument('--secs', type=float, default=30.0, help='training seconds per timed run')
  parser.add_argument('--sizes', default='Medium,Large')
  args = parser.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  workdir = tempfile.mkdtemp(prefix='autockpt-bench-', dir=args.out)
  port = 20000 + os.getpid() % 10000
  res = {'machine': f'{os.cpu_count()} CPUs, {sys.platform}', 'secs': args.secs}
  try:
    if 'a' in args.only or 'b' in args.only:
      res['a_b'] = scenario_a_b(workdir, args.sizes.split(','), port)
    if 'c' in args.only:
      res['c'] = scenario_c(workdir, args.secs)
    if 'd' in args.only:
      res['d'] = scenario_d(workdir)
    if 'e' in args.only:
      res['e'] = scenario_e(workdir, args.secs, port + 1)
    if 'f' in args.only:
      res['f'] = scenario_f(workdir, args.secs)
    if 'g' in args.only:
      res['g'] = scenario_g(workdir, min(args.secs, 20.0), args.sizes.split(',')[0])
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  with open(os.path.join(args.out, 'results.json'), 'w') as f:
    json.dump(res, f, indent=2, default=str)
  md = to_markdown(res)
  with open(os.path.join(args.out, 'results.md'), 'w') as f:
    f.write(md + '\n')
  print(md)
  return 0


if __name__ == '__main__':
  sys.exit(main())
