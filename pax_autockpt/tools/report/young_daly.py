"""Goodput for a given MTBF, and the checkpoint interval that would maximise it (Young/Daly).

First-order model: each interval tau pays the save cost delta, and each failure (every M seconds on
average) loses half an interval of work plus the restart cost R. The report measures delta, tau and
R from the event log (see the package docstring); only M has to be supplied.
"""

from __future__ import annotations

import math
from typing import Any

from pax_autockpt.tools.report import model
from pax_autockpt.tools.report import values


def checked_mtbf_hours(mtbf_hours: Any) -> float:
  """`mtbf_hours` as a float; ReportError unless it is a positive finite number."""
  m_h = values.number(mtbf_hours)
  if m_h is None or m_h <= 0:
    raise model.ReportError(f'--mtbf_hours must be a positive number of hours, got {mtbf_hours!r}')
  return m_h


def _goodput_at(delta: float, tau: float, r: float, m: float) -> float:
  if tau <= 0:
    return max(0.0, 1.0 - r / m) if delta == 0 else 0.0
  return max(0.0, 1.0 - delta / tau - (tau / 2.0 + r) / m)


def goodput(report: model.Report, mtbf_hours: float) -> dict[str, Any]:
  """goodput ≈ max(0, 1 - delta/tau - (tau/2 + R)/M), and the same at tau_opt = sqrt(2 delta M)."""
  m_h = checked_mtbf_hours(mtbf_hours)
  m = m_h * 3600.0
  delta, tau, r = report.save_cost_s, report.interval_p50_s, report.restart_cost_s
  out: dict[str, Any] = {
      'mtbf_hours': m_h, 'mtbf_s': m, 'save_cost_s': delta, 'interval_s': tau,
      'restart_cost_s': r, 'goodput': None, 'tau_opt_s': None, 'goodput_opt': None, 'note': None}
  if delta is None:
    out['note'] = 'not computable: no non-preemption save with blocking_s was logged'
    return out
  tau_opt = math.sqrt(2.0 * delta * m)
  out['tau_opt_s'] = tau_opt
  out['goodput_opt'] = _goodput_at(delta, tau_opt, r, m)
  if tau is None or tau <= 0:
    out['note'] = 'goodput not computable: no checkpoint interval measured (< 2 committed saves)'
  else:
    out['goodput'] = _goodput_at(delta, tau, r, m)
  return out
