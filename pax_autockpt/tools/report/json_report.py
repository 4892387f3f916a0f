"""The report as JSON (`pax-autockpt report --json`): the loaded report plus the figures derived from it
(Young/Daly's goodput and adaptive interval, the measured goodput). Its own module so that `model`, which
`young_daly` and `measured` build on, imports neither of them."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from pax_autockpt.tools.report import launches
from pax_autockpt.tools.report import measured
from pax_autockpt.tools.report import model
from pax_autockpt.tools.report import young_daly


def as_dict(report: model.Report, mtbf_hours: float | None = None) -> dict[str, Any]:
  """JSON-native: string keys, lists, finite floats; `json.loads(json.dumps(d)) == d`."""
  d = dataclasses.asdict(report)
  for r in d['runs']:
    r.pop('points', None)
  d.pop('set_aside_points', None)  # the plot's
  if d['local'] is not None:
    d['local'].pop('points', None)
  if mtbf_hours is not None:
    d['goodput'] = young_daly.goodput(report, mtbf_hours)
  d['adaptive'] = young_daly.adaptive(report)
  d['goodput_measured'] = measured.measure(report).to_dict()
  d['launch_restarts'] = launches.restarts(report.job_log_dir)
  return _jsonable(d)


def _jsonable(x: Any) -> Any:
  """Host numbers as string keys and non-finite floats as null, as JSON can hold them."""
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x
