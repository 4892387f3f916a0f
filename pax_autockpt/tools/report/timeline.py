"""The report as a PNG timeline: step against seconds since the first event, one line per run.

Uses matplotlib's object API with an explicit Agg canvas: no pyplot, so no global backend change
in a process that may have its own, and no display needed.
"""

from __future__ import annotations

from etils import epath

from pax_autockpt.tools.report import model
from pax_autockpt.tools.report import text as text_lib

_REASON_COLOURS = {'interval': 'tab:blue', 'continuous': 'tab:cyan', 'preemption': 'tab:red', 'notice': 'tab:orange',
                   'final': 'tab:green'}
_RUN_COLOURS = ('tab:purple', 'tab:orange', 'tab:brown', 'tab:pink', 'tab:olive', 'black',
                'darkgoldenrod', 'slateblue')
_HOST_STYLES = ('-', '--', ':', '-.')
LOCAL_EVENT_SECS = 60.0  # pax_autockpt.local.saving.SUMMARY_SECS (a test holds them equal; that module imports jax)


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
  """A line per run that trained (colour = run, line style = host); a cross where a killed run's log ends (its
  last event, at the newest step it logged: what it trained after is the next run's restored step, drawn there)."""
  multi_host = len(r.hosts) > 1
  for run in r.runs:
    if not run.points or not run.trained:
      continue
    colour = _RUN_COLOURS[run.index % len(_RUN_COLOURS)]
    style = _HOST_STYLES[r.hosts.index(run.host) % len(_HOST_STYLES)] if multi_host else '-'
    xs = [t - r.t0 for t, _ in run.points]
    ys = [s for _, s in run.points]
    ax.plot(xs, ys, color=colour, linestyle=style, linewidth=1.5, alpha=0.8, label=label(_run_label(run)))
    if not run.exited:
      # Below the save dots (its log often ends with a save of that step), its arms wider than a dot.
      ax.scatter([run.t_last - r.t0], [max(ys)], marker='x', color='black', s=110, linewidths=1.5, zorder=6,
                 label=label('killed: no exit event (its last event)'))
    if run.index > 0 and run.restored_step is not None and run.t_start is not None:
      local = run.restored_from == 'local'
      ax.scatter([run.t_start - r.t0], [run.restored_step], marker='>', s=70, zorder=4, edgecolors='black',
                 color='tab:olive' if local else 'tab:blue',
                 label=label('restored: local step' if local else 'restored: job directory\'s step'))


def _downtimes(r: model.Report) -> list[tuple[float, float | None, float]]:
  """Host 0's (else the lowest host's) gaps between runs that trained: (a run's end, the next process's start if
  recorded, the next run's first step, else its `start`), in seconds since the first event."""
  host = 0 if 0 in r.hosts else min(r.hosts)
  runs = sorted((x for x in r.runs if x.host == host and x.trained), key=lambda x: x.index)
  out = []
  for a, b in zip(runs, runs[1:]):
    resume = b.t_first_step if b.t_first_step is not None else b.t_start
    if resume is None:
      continue
    end = a.t_exit if a.exited and a.t_exit is not None else a.t_last
    began = None if b.process_start_t is None else min(max(b.process_start_t, end), resume) - r.t0
    out.append((end - r.t0, began, resume - r.t0))
  return out


def _plot_downtime(ax, r: model.Report, label: _Legend) -> None:
  """Each gap between runs shaded, the downtime the product exists to shrink, its length written above it: darker
  until the next process started (the scheduler's part, and restarts that ended before training, whose exits are
  marked in it), where its start is recorded."""
  for end, began, resume in _downtimes(r):
    if began is not None and began > end:
      ax.axvspan(end, began, color='tab:gray', alpha=0.35, lw=0, zorder=0,
                 label=label('down: until the next process started'))
    ax.axvspan(end if began is None else began, resume, color='tab:gray', alpha=0.15, lw=0, zorder=0,
               label=label('down: start-up, restore, first step' if began is not None else 'down between runs'))
    ax.text((end + resume) / 2, 0.98, f'down {text_lib.format_seconds(resume - end)}', ha='center', va='top',
            transform=ax.get_xaxis_transform(), fontsize='small', color='dimgray')


def _plot_saves(ax, r: model.Report, label: _Legend) -> None:
  """A dot per save (colour = reason), hollow when it was never committed."""
  for reason in sorted({s.reason for s in r.saves}):
    colour = _REASON_COLOURS.get(reason, 'tab:gray')
    for committed in (True, False):
      pts = [((s.t if s.t is not None else s.t_committed) - r.t0, s.step)
             for s in r.saves if s.reason == reason and s.committed == committed]
      if not pts:
        continue
      ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker='o', s=28, zorder=7,  # above an exit's cross
                 edgecolors='black' if committed else colour, linewidths=0.6,
                 facecolors=colour if committed else 'none',
                 label=label(f'save: {reason}' + ('' if committed else ' (not committed)')))


def _plot_set_aside(ax, r: model.Report, label: _Legend) -> None:
  """A ring around the save of each checkpoint a restore set aside (damaged): why the next run restored an older
  step than the newest saved."""
  pts = [(t - r.t0, step) for t, step in r.set_aside_points]
  if pts:
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker='o', s=220, facecolors='none', edgecolors='tab:red',
               linewidths=1.5, zorder=8, label=label('set aside by a restore (damaged)'))


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
    # Large and below the save dots: the on-demand save of the same step, a moment before, stays visible on it.
    ax.scatter([run.t_exit - r.t0], [step], marker='X', color=colour, s=160, alpha=0.55, zorder=6, label=label(text))


def _plot_local(ax, r: model.Report, label: _Legend) -> None:
  """The local tier's commits as their own series: a restart from a local step newer than the last
  checkpoint then shows where that step came from. Each dot is one logged summary (its newest step)."""
  if r.local is None or not r.local.points:
    return
  ax.scatter([t - r.t0 for t, _ in r.local.points], [s for _, s in r.local.points], marker='d', s=22,
             color='tab:olive', zorder=5,
             label=label(f'local tier: newest committed step (an event at most every {LOCAL_EVENT_SECS:.0f} s)'))


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

  fig = Figure(figsize=(13, 5.5), dpi=100)
  FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  label = _Legend()
  _plot_downtime(ax, report, label)
  _plot_runs(ax, report, label)
  _plot_saves(ax, report, label)
  _plot_local(ax, report, label)
  _plot_set_aside(ax, report, label)
  _plot_preemptions_and_exits(ax, report, label)
  ax.set_title(_title(report))
  ax.set_xlabel('wall time since first event (s)')
  ax.set_ylabel('step')
  ax.grid(True, alpha=0.3)
  if label.used:
    ax.legend(loc='upper left', bbox_to_anchor=(1.01, 1.0), fontsize='small')  # outside: it hides no mark
  fig.tight_layout()
  return fig


def plot(report: model.Report, path: str) -> None:
  """Writes a PNG timeline: step against seconds since the first event, one line per run."""
  with epath.Path(path).open('wb') as f:
    figure(report).savefig(f, format='png')
