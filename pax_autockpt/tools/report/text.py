"""The report as text: one line per figure, in the order an operator asks about a job."""

from __future__ import annotations

from pax_autockpt.tools.report import measured
from pax_autockpt.tools.report import model
from pax_autockpt.tools.report import young_daly


def _fmt_s(seconds: float | None) -> str:
  """A duration in the unit that keeps it readable at a glance."""
  if seconds is None:
    return 'n/a'
  if abs(seconds) < 60:
    return f'{seconds:.2g} s' if abs(seconds) < 1 else f'{seconds:.1f} s'
  if abs(seconds) < 7200:
    return f'{seconds / 60:.1f} min'
  return f'{seconds / 3600:.1f} h'


format_seconds = _fmt_s  # for the plot's labels: the same units as the text


def _fmt_num(v: float | None, digits: int = 2) -> str:
  if v is None:
    return 'n/a'
  if float(v).is_integer() and abs(v) >= 1:
    return str(int(v))
  return f'{v:.{digits}f}'


def _fmt_steps(steps: list[int], limit: int = 8) -> str:
  """The steps, or the first and last three of a long list, so that the line stays one line."""
  if not steps:
    return 'none'
  if len(steps) <= limit:
    return ', '.join(map(str, steps))
  return ', '.join(map(str, steps[:3])) + ', ..., ' + ', '.join(map(str, steps[-3:]))


def _stats_line(label: str, stats: dict[str, model.Stats]) -> str:
  """mean/p50/p90/max per save reason, in ms when all are under a second (a blocking time of 3.4 ms
  would read as 0.00 s), else in s."""
  shown = [(key, s) for key, s in stats.items() if s.n]
  ms = all(s.max < 1 for _, s in shown)
  unit, scale, digits = ('ms', 1000, 1) if ms else ('s', 1, 2)
  parts = [f'{key} ' + '/'.join(f'{v * scale:.{digits}f}' for v in (s.mean, s.p50, s.p90, s.max))
           for key, s in shown]
  return f'{label} {unit} mean/p50/p90/max: ' + ('; '.join(parts) if parts else 'n/a')


def _job_lines(r: model.Report) -> list[str]:
  starts = set(r.starts_per_host.values())
  if len(starts) == 1:
    n = starts.pop()
    times = f'{n} time{"s" if n > 1 else ""}'
    per_host = f'each started {times}' if len(r.hosts) > 1 else f'started {times}'
  else:
    per_host = 'starts: ' + ', '.join(f'host {h} x{n}' for h, n in r.starts_per_host.items())
  declared = '' if r.num_hosts in (None, len(r.hosts)) else f' (the job declared {r.num_hosts})'
  restored = ', '.join(_restored_words(x) for x in r.restart_details)
  return [f'job: {r.job_log_dir}',
          f'hosts: {len(r.hosts)}{declared}, {per_host}',
          f'restarts: {r.restarts}' + (f' (restored: {restored})' if restored else '')]


def _restored_words(x: model.Restart) -> str:
  """What one restart restored, and from which tier: the reader asks where the job came back from."""
  if not x.trained:
    return 'nothing: ' + _ended_before_training(x)
  if x.restored_step is None:
    return 'no checkpoint'
  if x.restored_from == 'local':
    return f'local step {x.restored_step}'
  return f'step {x.restored_step} from the job directory'


def _save_lines(r: model.Report) -> list[str]:
  by_reason = ', '.join(f'{k} {v}' for k, v in r.saves_by_reason.items())
  lines = [f'saves: {r.saves_started}' + (f' ({by_reason})' if by_reason else '')
           + f', committed {r.saves_committed}',
           f'steps saved: {_fmt_steps(r.steps_saved)}',
           _stats_line('save blocking', r.blocking_s),
           _stats_line('save duration', r.duration_s)]
  if r.interval_steps.n:
    secs = ('n/a' if r.interval_s.p50 is None
            else f'{r.interval_s.p50:.1f}/{r.interval_s.p90:.1f} s')
    lines.append(f'interval P50/P90: {r.interval_steps.p50:.0f}/{r.interval_steps.p90:.0f} steps, '
                 f'{secs} (between checkpoints of one run; a restart\'s downtime is in R)')
  else:
    lines.append('interval P50/P90: n/a (fewer than two committed saves in one run)')
  return lines


def _preemption_line(r: model.Report) -> str:
  if not r.preemptions:
    return 'preemptions: 0'
  steps = ', '.join('?' if p.step is None else str(p.step) for p in r.preemptions)
  details = ', '.join(f'{p.signal or "?"}{_phase_words(p)} -> {_exit_words(p)}' for p in r.preemptions)
  return (f'preemptions: {len(r.preemptions)} at step{"s" if len(r.preemptions) > 1 else ""}'
          f' {steps} ({details})')


_AGREED_WORDS = {'eval': ' at an eval batch', 'decode': ' at a decode batch',
                 'rescue': ' by another thread: the main thread was held'}


def _phase_words(p: model.Preemption) -> str:
  """' during eval': the loop's phase the signal found (pax_autockpt.shared.phases), when the log recorded it."""
  return f' during {p.during}' if p.during else ''


def _exit_words(p: model.Preemption) -> str:
  """'exit 0.96 s (agreed 0.80 s, save 0.16 s)': from the signal's arrival, with its parts."""
  if p.exit_after_s is None:
    return 'no exit'
  text = f'exit {p.exit_after_s:.2f} s'
  if p.agreed_after_s is not None:
    where = _AGREED_WORDS.get(p.agreed_during, '')
    text += f' (agreed {p.agreed_after_s:.2f} s{where}, then {max(0.0, p.exit_after_s - p.agreed_after_s):.2f} s'
    text += {'keep_in_flight': f' keeping the save of step {p.saved_step} in flight)',
             'give_up': ': no save fitted)', 'nothing_to_save': ': nothing trained, no save)'}.get(p.plan, ')')
  return text


def _notice_line(r: model.Report) -> str:
  if not r.notices:
    return 'notices: 0'
  parts = []
  for n in r.notices:
    lead = '' if n.lead_s is None else f', SIGTERM {n.lead_s:.1f} s later after {n.steps_after} more steps'
    saved = 'saved' if n.committed else 'not saved'
    parts.append(f'{n.source}={(n.value or "?")[:40]} -> step {n.step} {saved}{lead}')
  return f'notices: {len(r.notices)} ({"; ".join(parts)})'


def _exit_lines(r: model.Report) -> list[str]:
  """Exit codes, and the steps each restart lost, in words: how the run before it ended, what it restored."""
  codes = ', '.join(f'{c} x{n}' for c, n in r.exit_codes.items())
  killed = sum(1 for run in r.runs if not run.exited)
  lost = f'steps lost: {r.steps_lost_total} total, max {r.steps_lost_max}'
  if r.restart_details:
    lost += ' (' + '; '.join(_lost_words(x) for x in r.restart_details) + ')'
  return [f'exit codes: {codes or "none"}'
          + (f'; {killed} run(s) without an exit event' if killed else ''),
          lost]


def _lost_words(x: model.Restart) -> str:
  """'run 2 was killed at step ~575, run 3 restored local step 575: 0 lost', runs counted from 1 as the user
  counts them. A killed run's step is the newest its log shows it trained (or the step the next run restored, if
  newer), hence '~': the steps it trained after its last event are not counted."""
  if not x.trained:
    return f'run {x.index + 1} {_ended_before_training(x)}'
  reached = '?' if x.reached_step is None else str(x.reached_step)
  before = x.index if x.previous_index is None else x.previous_index + 1
  if x.lower_bound:
    ended = f'run {before} was killed at step ~{reached}'
  else:
    code = '' if x.previous_exit_code is None else f' {x.previous_exit_code}'
    ended = f'run {before} exited{code} at step {reached}'
  return f'{ended}, run {x.index + 1} restored {_restored_words(x)}: {x.steps_lost} lost'


def _ended_before_training(x: model.Restart) -> str:
  """'ended before training (exit 1)': a restart whose restore failed, or that was killed in it."""
  return 'ended before training (' + ('killed' if x.exit_code is None else f'exit {x.exit_code}') + ')'


def _storage_lines(r: model.Report) -> list[str]:
  """What the checkpoint directory holds, and what the policies and restores did to it."""
  policies = ', '.join(f'{k} {v}' for k, v in r.deletions_by_policy.items())
  newest = f', newest {r.newest_checkpoint}' if r.newest_checkpoint is not None else ''
  return [f'deletions: {r.deletions}' + (f' ({policies})' if policies else ''),
          f'restore skipped: {r.restore_skipped}'
          + (f' (steps {_fmt_steps(r.restore_skipped_steps)})' if r.restore_skipped else ''),
          f'checkpoints: {len(r.checkpoints_complete)} complete{newest}, '
          f'{r.checkpoints_incomplete} incomplete',
          f'unparsable lines: {r.unparsable_lines}']


def _local_lines(r: model.Report) -> list[str]:
  """The local tier, where the job used one: how often it committed, and which tier each restart read."""
  t = r.local
  if t is None:
    return []
  gaps = 'n/a' if t.interval_s.p50 is None else f'{t.interval_s.p50:.2f}/{t.interval_s.p90:.2f} s'
  took = 'n/a' if t.duration_s.p50 is None else f'{t.duration_s.p50:.3f} s'
  tiers = ', '.join(_TIERS.get(k, k) for k in t.restored_from)
  count = f'>= {t.saves_committed} saves committed (a killed run\'s last minute is not logged)' if (
      t.count_lower_bound) else f'{t.saves_committed} saves committed'
  return [f'local tier: {count}, interval P50/P90 {gaps}, duration P50 {took}; each run started from: {tiers}']


_TIERS = {None: 'fresh', 'job_dir': 'the job directory', 'local': 'the local tier'}


# Each badput item once, in words: one start-up (the process's own before its `start`, less the restore, and on to
# the end of its first step), idle, and where a restart recorded no process start the two unsplit.
_BADPUT_WORDS = ((('wasted_progress',), 'wasted progress'), (('start_up', 'training_prep'), 'start-up'),
                 (('checkpoint_save',), 'save blocking'), (('checkpoint_restore',), 'restore'),
                 (('idle_between_runs',), 'idle between runs'),
                 (('between_runs',), 'between runs (no process start recorded)'),
                 (('other',), 'other'))


def _shown(m: measured.Measured, keys: tuple[str, ...]) -> bool:
  """Every item but the unsplit one, which shows only when it holds time (and then idle only if it does too)."""
  if keys == ('between_runs',):
    return m.seconds['between_runs'] != 0
  if keys == ('idle_between_runs',):
    return m.seconds['idle_between_runs'] != 0 or m.seconds['between_runs'] == 0
  return True


def _measured_line(r: model.Report) -> str:
  """Where the job's wall time went (pax_autockpt.tools.report.measured); 'at least' where a kill hides an end."""
  m = measured.measure(r)
  if m.wall_s is None:
    return f'goodput (measured): {m.note}'
  share = lambda keys: (f'{_fmt_s(sum(m.seconds[k] for k in keys))} '
                        f'({100 * sum(m.shares[k] for k in keys):.1f}%)')
  wall = ('at least ' if m.last_run_open else '') + f'{_fmt_s(m.wall_s)} wall'
  badput = ', '.join(f'{words} {share(keys)}' for keys, words in _BADPUT_WORDS if _shown(m, keys))
  caveat = []
  if m.killed_runs - m.last_run_open:
    caveat.append(f'{m.killed_runs - m.last_run_open} killed run(s) end at their last event here: wasted progress is '
                  'a lower bound, the time between runs an upper bound')
  if m.restore_unrecorded:
    caveat.append(f'{m.restore_unrecorded} restore(s) not recorded (a log before restore_s): in between runs')
  if m.note:
    caveat.append(m.note)
  return (f'goodput (measured): {100 * m.goodput:.1f}% of {wall}, productive training '
          f'{_fmt_s(m.seconds["productive_training"])}; badput: {badput}' + ''.join(f'; {c}' for c in caveat))


_PHASE_WORDS = (('scheduler_s', 'scheduler'), ('imports_s', 'imports'), ('distributed_s', 'distributed init'),
                ('setup_s', 'set-up'), ('restore_s', 'restore'), ('first_step_s', 'to the first step'))


def _phases_lines(r: model.Report) -> list[str]:
  """Where a restart's downtime goes, phase by phase (medians over the restarts; --json has each restart's)."""
  if not r.restart_details:
    return []
  p = r.restart_phases
  if p is None:
    return ['restart phases: n/a (no restart\'s start event records its process\'s start: off Linux, or a log '
            'before process_start_t)']
  n = p['restarts']
  parts = [f'{words} {_fmt_s(p[key])}' + (f' (compile {_fmt_s(p["compile_s"])})' if key == 'first_step_s' else '')
           for key, words in _PHASE_WORDS]
  return [f'restart phases (median of {n} restart{"s" if n > 1 else ""}): {", ".join(parts)}; '
          f'{_fmt_s(p["total_s"])} in all, from the previous run\'s last event']


def _goodput_line(r: model.Report, mtbf_hours: float | None) -> str:
  if mtbf_hours is None:
    return (f'goodput @ MTBF: a model, not shown; give --mtbf_hours H, the hours between failures you expect, for '
            f'Young/Daly\'s goodput at this job\'s save cost {_fmt_s(r.save_cost_s)}, interval '
            f'{_fmt_s(r.interval_p50_s)} and R {_fmt_s(r.restart_cost_s)}')
  g = young_daly.goodput(r, mtbf_hours)
  head = f'goodput @ MTBF {_fmt_num(g["mtbf_hours"], 1)} h: '
  if g['tau_opt_s'] is None:
    return head + g['note']
  now = 'n/a' if g['goodput'] is None else f'{100 * g["goodput"]:.1f}%'
  return head + (f'{now} (Young/Daly optimum {_fmt_s(g["tau_opt_s"])} -> '
                 f'{100 * g["goodput_opt"]:.1f}%)' + (f'; {g["note"]}' if g['note'] else ''))


def _adaptive_lines(r: model.Report) -> list[str]:
  a = young_daly.adaptive(r)
  if a is None:
    return []
  against = ('n/a' if a['tau_opt_s'] is None else
             f'{_fmt_s(a["tau_opt_s"])} for the mean save cost {_fmt_s(a["save_cost_s"])} '
             f'(converged/optimum {a["ratio"]:.2f})')
  return [f'adaptive interval @ MTBF {a["mtbf_hours"]:g} h: converged to {_fmt_s(a["interval_s"])}; '
          f'Young/Daly optimum afterwards {against}; measured P50 {_fmt_s(a["interval_p50_s"])}']


def format_text(report: model.Report, mtbf_hours: float | None = None) -> str:
  """The report in plain lines; the goodput line needs `mtbf_hours` (ReportError when invalid)."""
  r = report
  return '\n'.join([
      *_job_lines(r),
      *_save_lines(r),
      _preemption_line(r),
      _notice_line(r),
      *_exit_lines(r),
      *_storage_lines(r),
      *_local_lines(r),
      f'restart cost R: {_fmt_s(r.restart_cost_s)} per restart ({r.restart_cost_note})',
      *_phases_lines(r),
      _measured_line(r),
      _goodput_line(r, mtbf_hours),
      *_adaptive_lines(r),
  ])
