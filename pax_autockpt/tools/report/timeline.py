"""The report as a PNG timeline: step against seconds since the first event, one line per run.

Uses matplotlib's object API with an explicit Agg canvas: no pyplot, so no global backend change
in a process that may have its own, and no display needed.
"""

from __future__ import annotations

from etils import epath

from pax_autockpt.tools.report import model

_REASON_COLOURS = {'interval': 'tab:blue', 'continuous': 'tab:cyan', 'preemption': 'tab:red', 'notice': 'tab:orange',
                   'final': 'tab:green'}
_RUN_COLOURS = ('tab:purple', 'tab:orange', 'tab:brown', 'tab:pink', 'tab:olive', 'black',
                'darkgoldenrod', 'slateblue')
_HOST_STYLES = ('-', '--', ':', '-.')


class _Legend:
  """Hands out each label once: the legend lists a kind of mark once, however often it occurs."""

  def __init__(self):
    self.used: set[str] = set()

  def __call__(self, text: str) -> str | None:
    if text in self.used:
      return None
    self.used.add(text)
    return text


def _run_label(run: model.Run) -> str:
  """'run 2 (from local step 575)': runs counted from 1, as the user counts them."""
  if run.restored_step is None:
    restored = 'fresh'
  else:
    restored = f'from {"local " if run.restored_from == "local" else ""}step {run.restored_step}'
  return f'run {run.index + 1} ({restored})'


def _plot_runs(ax, r: model.Report, label: _Legend) -> None:
  """A line per run (colour = run, line style = host); a killed run's line runs on, dotted, to the step it
  reached (the next run's restore proves it) at the time of its last event, where a cross marks the kill."""
  multi_host = len(r.hosts) > 1
  for run in r.runs:
    if not run.points:
      continue
    colour = _RUN_COLOURS[run.index % len(_RUN_COLOURS)]
    style = _HOST_STYLES[r.hosts.index(run.host) % len(_HOST_STYLES)] if multi_host else '-'
    xs = [t - r.t0 for t, _ in run.points]
    ys = [s for _, s in run.points]
    ax.plot(xs, ys, color=colour, linestyle=style, linewidth=1.5, alpha=0.8, label=label(_run_label(run)))
    if not run.exited:
      end = (run.t_last - r.t0, run.reached_step if run.reached_step is not None else ys[-1])
      ax.plot([xs[-1], end[0]], [ys[-1], end[1]], color=colour, linestyle=':', linewidth=1.5, alpha=0.8)
      ax.scatter([end[0]], [end[1]], marker='x', color='grey', s=60, zorder=7,
                 label=label('killed: no exit event (at its last event)'))


def _plot_saves(ax, r: model.Report, label: _Legend) -> None:
  """A dot per save (colour = reason), hollow when it was never committed."""
  for reason in sorted({s.reason for s in r.saves}):
    colour = _REASON_COLOURS.get(reason, 'tab:gray')
    for committed in (True, False):
      pts = [((s.t if s.t is not None else s.t_committed) - r.t0, s.step)
             for s in r.saves if s.reason == reason and s.committed == committed]
      if not pts:
        continue
      ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker='o', s=28, zorder=6,
                 edgecolors=colour, facecolors=colour if committed else 'none',
                 label=label(f'save: {reason}' + ('' if committed else ' (not committed)')))


def _plot_preemptions_and_exits(ax, r: model.Report, label: _Legend) -> None:
  for p in r.preemptions:
    ax.axvline(p.t - r.t0, color='tab:red', linestyle='--', linewidth=1,
               label=label(f'preemption ({p.signal or "?"})'))
  for n in r.notices:
    ax.axvline(n.t - r.t0, color='tab:orange', linestyle=':', linewidth=1.5,
               label=label(f'notice ({n.source or "?"})'))
  _plot_exits(ax, r, label)


_EXIT_MARKS = {143: ('tab:red', 'exit 143 (saved on a signal)'), 0: ('tab:green', 'exit 0 (finished)')}


def _plot_exits(ax, r: model.Report, label: _Legend) -> None:
  """A cross per exit event, coloured by its code: how each run ended is what the reader looks for."""
  for run in r.runs:
    if not run.exited or run.t_exit is None:
      continue
    step = run.exit_step if run.exit_step is not None else (run.max_step or 0)
    code = '?' if run.exit_code is None else run.exit_code
    colour, text = _EXIT_MARKS.get(run.exit_code, ('black', f'exit {code}'))
    ax.scatter([run.t_exit - r.t0], [step], marker='X', color=colour, s=80, zorder=7, label=label(text))


def _plot_local(ax, r: model.Report, label: _Legend) -> None:
  """The local tier's commits as their own series: a restart from a local step newer than the last
  checkpoint then shows where that step came from. Each dot is one logged summary (its newest step)."""
  if r.local is None or not r.local.points:
    return
  ax.scatter([t - r.t0 for t, _ in r.local.points], [s for _, s in r.local.points], marker='d', s=22,
             color='tab:olive', zorder=5, label=label('local tier: newest committed step (logged once a minute)'))


def _title(r: model.Report) -> str:
  multi_host = len(r.hosts) > 1
  name = epath.Path(r.job_log_dir).name or r.job_log_dir
  return (f'Checkpoint timeline: {name} ({len(r.hosts)} host{"s" if multi_host else ""}, '
          f'{r.restarts} restart{"" if r.restarts == 1 else "s"})'
          + ('; line style = host' if multi_host else ''))


def figure(report: model.Report):
  """The timeline as a matplotlib Figure (on an Agg canvas): step against seconds since the first event."""
  # Imported here: matplotlib is slow to import and only the plot needs it.
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

  fig = Figure(figsize=(10, 5.5), dpi=100)
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  label = _Legend()
  _plot_runs(ax, report, label)
  _plot_saves(ax, report, label)
  _plot_local(ax, report, label)
  _plot_preemptions_and_exits(ax, report, label)
  ax.set_title(_title(report))
  ax.set_xlabel('wall time since first event (s)')
  ax.set_ylabel('step')
  ax.grid(True, alpha=0.3)
  if label.used:
    ax.legend(loc='best', fontsize='small')
  fig.tight_layout()
  return fig


def plot(report: model.Report, path: str) -> None:
  """Writes a PNG timeline: step against seconds since the first event, one line per run."""
  with epath.Path(path).open('wb') as f:
    figure(report).savefig(f, format='png')
