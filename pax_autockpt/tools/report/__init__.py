"""`pax-autockpt report JOB_LOG_DIR`: checkpoint timeline and figures from the event log (CONTRACT §6).

Reads only the event logs `JOB_LOG_DIR/autockpt/events.host<IDX>.jsonl` (through
`pax_autockpt.shared.events`, the one reader), the launcher's record `JOB_LOG_DIR/autockpt/launch.jsonl` (its restarts
and their backoff, `launches`) and the listing of `JOB_LOG_DIR/checkpoints`. Each line is
parsed with `json.loads` and nothing else: no pickle, no eval, nothing from the job directory is
ever executed or imported.

How the figures are derived (the interpretations the contract leaves open):
- Lines that are not a JSON object with a string "event" and a finite numeric "t" are skipped and
  counted in `unparsable_lines`. A killed writer can leave a torn line with the next process's first
  record appended to it; the trailing record is salvaged (still with `json.loads`), the torn part counted.
- A *run* is one process on one host: the events that carry its `process` mark (logs before the mark: cut where a
  `start` or a restore's event, which a process writes before its `start`, follows a `start` or an `exit`). So a
  restart's failed restore (`restore_failed`, `exit` 1) or set-aside checkpoint is the restart's, never the killed
  run's before it; a restart that ended before its `start` is a run without one, which trained nothing. Run `k` of
  every host is the job's k-th run (hosts restart together).
- Saves, preemptions, deletions and skipped restores are logged by every host. The k-th event of one
  kind for step S on a host is matched with the k-th one for step S on every other host and counted
  once (so a step saved again after a restart is a second save). A merged save takes the max
  `blocking_s` / `duration_s` over hosts, host 0's timestamps when host 0 logged it (else the earliest
  start / latest commit), and host 0's reason.
- Checkpoint interval: committed saves sorted by save start time (commit time when the start was not
  logged), across restarts; consecutive pairs with a positive step difference; seconds between their
  start times. Percentiles interpolate linearly (numpy's default).
- Steps lost by restart k on a host = (run k-1's exit step, else the highest step in any of its
  `start`/`save_started`/`save_committed`/`local_committed`/`preemption` events or run k's `restored_step`,
  which proves how far a killed run trained) - run k's `restored_step` (0 when null), floored at 0, where run k-1
  is the latest run before k that trained (a restart that ended before training loses nothing itself); after a
  kill (no `exit` event) the steps trained after the run's last event are not counted (the text marks its
  step with ~). Per job: the max over hosts per restart; total = sum over restarts.
- Checkpoints: complete = committed by `pax_autockpt.layout`'s rule; incomplete = the other attempts
  in the directory (orbax's `*.orbax-checkpoint-tmp-*`, and on gs:// a `checkpoint_N` without its
  commit marker).
- Goodput for an MTBF of M seconds: delta = mean `blocking_s` of non-preemption saves, tau = P50
  interval seconds, R = restart cost: per restart, downtime (previous run's last event -> next `start`)
  plus startup (`start` -> the run's first `save_started`, minus the time the steps trained in between
  take at the median seconds/step measured within runs; 0 when not measurable), max over hosts, mean
  over restarts; 0 when there was no restart.
  goodput = max(0, 1 - delta/tau - (tau/2 + R)/M); Young/Daly optimum tau_opt = sqrt(2 delta M).
- Measured goodput and badput: the wall time from the first `start` to the last run's end split into buckets
  that add up to it (productive training, wasted progress, start-up to the first step, save blocking, restore,
  idle between runs and start-up, or between runs where a `start` records no process start, other; the text
  shows the two start-ups as one item); how each is derived is in `measured`'s docstring.
- Restart phases: per restart, host 0's (else the lowest host's) previous run's last event -> its process start
  (`process_start_t`) -> imports (`imported_s`), distributed init (`distributed_s`), set-up (the rest), restore
  (`restore_s`) -> its `start` -> its `first_step` event; they add up to that span. Medians over restarts.

Modules: `model` (what a report holds), `loader` (job directory -> Report), `young_daly` (goodput for an MTBF),
`measured` (the goodput the job had), `text` and `timeline` (the text and the PNG). This package re-exports their
public names.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from pax_autockpt.tools import report_legend
from pax_autockpt.tools.report import json_report
from pax_autockpt.tools.report import launches
from pax_autockpt.tools.report import loader
from pax_autockpt.tools.report import model
from pax_autockpt.tools.report import text
from pax_autockpt.tools.report import timeline
from pax_autockpt.tools.report import young_daly

REASONS = model.REASONS
Preemption = model.Preemption
Report = model.Report
ReportError = model.ReportError
Restart = model.Restart
Run = model.Run
Save = model.Save
Stats = model.Stats
format_text = text.format_text
goodput = young_daly.goodput
load = loader.load
plot = timeline.plot


def _error(msg: object) -> None:
  print('report: error: ' + ' '.join(str(msg).split()), file=sys.stderr)


def run(job_log_dir: str, *, mtbf_hours: float | None = None, plot_path: str | None = None,
        as_json: bool = False, out: TextIO | None = None) -> int:
  """Prints the report (text, or JSON with `as_json`) to `out` (sys.stdout when None).

  Returns 0, or 2 after one line on stderr when the input is bad (no events, bad MTBF, unwritable plot).
  """
  out = sys.stdout if out is None else out
  try:
    if mtbf_hours is not None:
      young_daly.checked_mtbf_hours(mtbf_hours)  # before reading: a typo fails fast
    report = loader.load(job_log_dir)
    if plot_path:
      timeline.plot(report, plot_path)
  except (model.ReportError, OSError) as e:
    _error(e)
    return 2
  if as_json:
    out.write(json.dumps(json_report.as_dict(report, mtbf_hours), indent=2, sort_keys=True, allow_nan=False)
              + '\n')
  else:
    out.write(launches.with_line(text.format_text(report, mtbf_hours), job_log_dir) + '\n')
    if plot_path:
      out.write(f'plot: {plot_path}\n')
  return 0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog='pax-autockpt report', description='Checkpoint timeline and figures of a job.',
                                   epilog=report_legend.legend_text(),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('job_log_dir')
  parser.add_argument('--mtbf_hours', type=float, default=None)
  parser.add_argument('--plot', default=None, metavar='FILE.png')
  parser.add_argument('--json', action='store_true')
  args = parser.parse_args(argv)
  return run(args.job_log_dir, mtbf_hours=args.mtbf_hours, plot_path=args.plot, as_json=args.json)
