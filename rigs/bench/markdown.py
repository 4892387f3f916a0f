"""bench/results.md from bench/results.json: one table per scenario, medians with min-max."""

import json
from typing import Any


def _num(x: float | None, unit: str = '') -> str:
  if x is None:
    return 'n/a'
  if unit == 'requests':
    return f'{x:.0f}'
  return f'{x:.3g}' if abs(x) < 100 else f'{x:.0f}'


def _spread(summary: dict[str, Any], unit: str = '') -> str:
  if not summary or summary.get('median') is None:
    return 'n/a'
  return f'{_num(summary["median"], unit)} ({_num(summary["min"], unit)}–{_num(summary["max"], unit)})'


def _row(fig: dict[str, Any]) -> str:
  unit = fig['unit']
  value = _spread(fig, unit)
  if 'ratio' in fig:
    base = f'{fig["baseline_name"]}: {_spread(fig["baseline"], unit)}'
    ratio = f'×{_spread(fig["ratio"])}'
  else:
    base, ratio = '', ''
  return f'| {fig["name"]} | {unit} | {value} | {base} | {ratio} | {fig["n"]} |'


def render(results: dict[str, Any]) -> str:
  lines = ['# pax-autockpt benchmark', '',
           f'Machine: {results.get("machine", "?")}. Every figure: the median over alternating, paired runs '
           'in one invocation, (min–max) beside it; a ratio is taken per pair, against the baseline measured '
           'in the same pair. `local` is this machine\'s disk; `gcs0` / `gcs30` the local GCS server '
           '(rigs.local_gcs) with 0 / 30 ms added to every request. Regenerate with '
           '`make bench` (or `python -m rigs.bench --only NAME,...`).', '']
  for name, scenario in sorted(results.get('scenarios', {}).items()):
    lines += [f'## {name}', '', *((scenario['note'], '') if scenario.get('note') else ()),
              f'Measured {scenario["measured"]} at commit {scenario["commit"] or "?"}, {scenario["pairs"]} runs '
              'per arm.', '',
              '| figure | unit | median (min–max) | baseline, same pairs | ratio per pair | n |',
              '|---|---|---|---|---|---|']
    lines += [_row(f) for f in scenario['figures']]
    lines.append('')
  return '\n'.join(lines + _earlier(results))


def _earlier(results: dict[str, Any]) -> list[str]:
  """Figures results.json still holds from before the bench was a package (until their scenarios run
  again): kept visible rather than dropped when one scenario is re-run."""
  keys = sorted(k for k in results if k not in ('machine', 'scenarios', 'secs'))
  if not keys:
    return []
  lines = ['## Earlier figures (the bench before it was a package; not re-measured)', '']
  lines += [f'- `{k}`: `{json.dumps(results[k], sort_keys=True)}`' for k in keys]
  return lines + ['']
