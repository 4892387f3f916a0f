"""Goodput for a given MTBF, and the checkpoint interval that would maximise it (Young/Daly).

First-order model: each interval tau pays the save cost delta, and each failure (every M seconds on
average) loses half an interval of work plus the restart cost R. The report measures delta, tau and
R from the event log (see the package docstring); only M has to be supplied. The formulas are the
runtime's own (`pax_autockpt.policies`), which the adaptive interval (`--autockpt_mtbf_hours`) uses
while the job runs: `adaptive` compares the interval it converged to with the optimum computed here.
"""

from __future__ import annotations

from typing import Any

from pax_autockpt import policies
from pax_autockpt.tools.report import model
from pax_autockpt.tools.report import values


def checked_mtbf_hours(mtbf_hours: Any) -> float:
  """`mtbf_hours` as a float; ReportError unless it is a positive finite number."""
  m_h = values.number(mtbf_hours)
  if m_h is None or m_h <= 0:
    raise model.ReportError(f'--mtbf_hours must be a positive number of hours, got {mtbf_hours!r}')
  return m_h


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
  tau_opt = policies.young_daly_interval(delta, m)
  out['tau_opt_s'] = tau_opt
  out['goodput_opt'] = policies.goodput(delta, tau_opt, r, m)
  if tau is None or tau <= 0:
    out['note'] = 'goodput not computable: no checkpoint interval measured (< 2 committed saves)'
  else:
    out['goodput'] = policies.goodput(delta, tau, r, m)
  return out


def adaptive(report: model.Report) -> dict[str, Any] | None:
  """The adaptive interval at the job's last continuous save against the Young/Daly optimum for the
  save cost measured over the whole job (None when the job did not use one)."""
  if report.adaptive_interval_s is None or report.adaptive_mtbf_hours is None:
    return None
  out: dict[str, Any] = {'mtbf_hours': report.adaptive_mtbf_hours, 'interval_s': report.adaptive_interval_s,
                         'save_cost_s': report.save_cost_s, 'tau_opt_s': None, 'ratio': None,
                         'interval_p50_s': report.interval_p50_s}
  if report.save_cost_s is not None:
    out['tau_opt_s'] = policies.young_daly_interval(report.save_cost_s, report.adaptive_mtbf_hours * 3600.0)
    out['ratio'] = report.adaptive_interval_s / out['tau_opt_s'] if out['tau_opt_s'] > 0 else None
  return out
