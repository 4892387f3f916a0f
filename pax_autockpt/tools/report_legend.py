"""What each line of `pax-autockpt report` means, in the report's order: `pax-autockpt report --help` prints it
and docs/report.md holds the same table (tests/test_report.py fails when they part ways). Standard library
only: the command's help must not import matplotlib.
"""

import textwrap

LEGEND = (
    ('job, hosts, restarts, launch restarts', 'the job directory; how many hosts logged and how often each '
     'started (a process each); what each restart restored: a step from the job directory, a local step (the local '
     'tier), no checkpoint, or nothing: it ended before training (its restore failed, or it was killed in it); '
     'under `pax-autockpt launch --max_restarts`, the restarts it made, the backoff it waited before '
     'each and why the last one came'),
    ('saves, steps saved', 'checkpoint saves started, by reason (interval, continuous, preemption: on SIGTERM, '
     'notice, final), and how many committed; the steps of the committed ones'),
    ('save blocking', 'how long each save paused training (copying the state off the device), mean/p50/p90/max '
     'over saves, per reason'),
    ('save duration', 'from a save\'s start to its commit, written in the background while training goes on'),
    ('interval P50/P90', 'steps and seconds between consecutive committed checkpoints of one run (a pair across '
     'a restart is left out: its downtime is counted in R)'),
    ('preemptions', 'each signal the job saved on: the agreed step, the phase of the loop the signal found '
     '(`input`, `train`, `after-step`, `checkpoint`, `loop`: between training steps; `eval`, `decode`), and from '
     'the signal\'s arrival to the exit (agreeing on the step: what the phase cost, and where; then saving)'),
    ('notices', 'maintenance or preemption notices from the metadata server, the step saved for each and how '
     'long before the SIGTERM'),
    ('exit codes, steps lost', 'how runs ended (143: saved on a signal; 0: finished; 1: failed); per restart, how '
     'the run that trained before it ended and what the restart restored: the steps trained but not restored '
     '(after a kill, which leaves no exit event, from the newest step its log or the next run\'s restore shows it '
     'trained: ~); a restart that ended before training loses nothing itself'),
    ('deletions, restore skipped', 'checkpoints a preservation policy deleted; damaged checkpoints a restore '
     'passed over (kept aside, never deleted)'),
    ('checkpoints', 'committed checkpoints in the job directory now, and incomplete attempts beside them'),
    ('unparsable lines', 'event-log lines that were not valid JSON events (a killed writer\'s torn last line)'),
    ('local tier', 'local saves committed on the hosts\' own disks (each event in the log sums up a minute\'s '
     'commits: all are counted; >= where a killed run\'s last minute went unlogged), their interval and '
     'duration, and the tier each run started from'),
    ('restart cost R', 'per restart, the time from a run\'s last event to the next run\'s first save, less the '
     'steps it trained before that save: downtime plus start-up plus restore'),
    ('restart phases', 'where a restart\'s downtime went, median over restarts (--json: each restart\'s): the '
     'scheduler (the previous run\'s last event to the new process\'s start), imports (paxml, jax), distributed '
     'init (jax.distributed and the accelerator\'s start), set-up (the rest before training: flags, experiment, '
     'model, checkpoint listing), restore, and to the first step (its compile, its input, the step); they add up '
     'to the downtime up to the first step'),
    ('goodput (measured)', 'the job\'s wall time, first start to last exit, split into productive training '
     '(steps that survive into the final lineage) and badput: wasted progress (steps trained, then lost), '
     'start-up (a restarted process\'s start to its first step, less the restore), save blocking, restore, idle '
     'between runs (restarts that ended before training included), between runs where a log does not record the '
     'process start, other; they add up to the wall time'),
    ('goodput @ MTBF', 'a model, not a measurement: with --mtbf_hours M, the share of time spent on training that '
     'counts, 1 - save cost/interval - (interval/2 + R)/M (Young/Daly, first order), and at the interval that '
     'maximises it'),
    ('adaptive interval', 'with --autockpt_mtbf_hours: the interval continuous saving converged to, against '
     'the Young/Daly optimum for the save cost measured'),
)


def legend_text() -> str:
  """The legend as `report --help` prints it."""
  return 'How to read the report:\n' + '\n'.join(
      textwrap.fill(f'{label}: {meaning}', width=100, initial_indent='  ', subsequent_indent='      ')
      for label, meaning in LEGEND)


def legend_markdown() -> str:
  """The legend as docs/report.md holds it."""
  return '\n'.join(['| line | what it says |', '|---|---|',
                    *(f'| {label} | {meaning} |' for label, meaning in LEGEND)])
