"""The `pax-autockpt` command: launch, status, report, verify, demo."""

import argparse
import sys

from pax_autockpt.startup import environment
from pax_autockpt.tools import report_legend


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog='pax-autockpt', description=__doc__)
  sub = parser.add_subparsers(dest='command', required=True)

  launch = sub.add_parser('launch', help='start N local processes as N hosts of one job')
  launch.add_argument('--num_hosts', type=int, required=True)
  launch.add_argument('--num_slices', type=int, default=1)
  launch.add_argument('--port', type=int, default=None, help='coordinator port (default: a free one)')
  launch.add_argument('--preempt_after', type=float, default=None,
                      help='send SIGTERM after this many seconds (tests, demos)')
  launch.add_argument('--preempt_host', type=int, default=None, help='only to this host (default: all)')
  launch.add_argument('--peer_exit_secs', type=float, default=60.0,
                      help='once a host failed, SIGKILL the others after this many seconds')
  launch.add_argument('--max_restarts', type=int, default=0,
                      help='after a failure (a crash, a kill, a failure exit, a SIGTERM the launcher did not send), '
                      'start every host again, up to this many times; never after exit 0, 2 or a stop the launcher '
                      'received')
  launch.add_argument('--no_standby', action='store_true',
                      help='start every host (and restart it) as a fresh interpreter, instead of forking it from one '
                      'standby process that imported paxml once')
  launch.add_argument('args', nargs=argparse.REMAINDER,
                      help='-- then the pax_autockpt.main flags (--exp, --job_log_dir, ...)')

  status = sub.add_parser('status', help='the newest committed checkpoint and how the last run ended')
  status.add_argument('job_log_dir')
  status.add_argument('--wait_for_checkpoint', type=int, default=None, metavar='STEP',
                      help='first wait until a checkpoint of STEP or later is committed (exit 1 when the run ends '
                      'first, when --pid is gone, or after --timeout_secs); without --pid, a line every 30 s')
  status.add_argument('--wait_for_local_step', type=int, default=None, metavar='STEP',
                      help="then wait until host 0's local directory (--local_dir) holds a committed local step of "
                      'STEP or later, the same way')
  status.add_argument('--pid', type=int, default=None,
                      help="with a --wait_for_*: the run's process ($! in a shell); its end ends the wait")
  status.add_argument('--timeout_secs', type=float, default=300.0, help='with a --wait_for_*, each (default 300)')
  status.add_argument('--local_dir', default=None, metavar='TEMPLATE',
                      help="the run's --autockpt_local_dir: host 0's newest local step read from it (else from the "
                      'event log, which records a running job\'s local commits at most once a minute)')

  report = sub.add_parser('report', help='checkpoint timeline and figures of a job', epilog=report_legend.legend_text(),
                          formatter_class=argparse.RawDescriptionHelpFormatter)
  report.add_argument('job_log_dir')
  report.add_argument('--mtbf_hours', type=float, default=None,
                      help='the mean time between failures you expect, in hours: adds the goodput line')
  report.add_argument('--plot', default=None, metavar='FILE.png', help='also draw the checkpoint timeline')
  report.add_argument('--json', action='store_true', help='the figures as JSON instead of lines')

  verify = sub.add_parser('verify', help='check committed checkpoints against their content manifests')
  verify.add_argument('job_log_dir')
  verify.add_argument('--step', type=int, default=None, help='only this step (default: every committed one; '
                      'with --against, the newest)')
  verify.add_argument('--against', default=None, metavar='OTHER',
                      help="compare with the same step of the job OTHER (or with OTHER, a step directory) "
                      'array by array, input position included: 0 when identical, 1 naming the first difference')

  demo = sub.add_parser('demo', help='train, SIGTERM, save, exit, resume (what `make demo` runs)')
  demo.add_argument('--workdir', default=None)
  return parser


def main(argv: list[str] | None = None) -> int:
  why = environment.problem()
  if why:  # `python3 -m pax_autockpt.tools.cli` outside the environment: one line, not a traceback
    print(f'error: {why}', file=sys.stderr)
    return 2
  args = _parser().parse_args(argv)
  if args.command == 'launch':
    from pax_autockpt.tools import launcher  # pylint: disable=g-import-not-at-top  (yaml)
    rest = args.args[1:] if args.args[:1] == ['--'] else args.args
    cfg = launcher.LaunchConfig(num_hosts=args.num_hosts, num_slices=args.num_slices, port=args.port,
                                preempt_after=args.preempt_after, preempt_host=args.preempt_host,
                                peer_exit_secs=args.peer_exit_secs, args=tuple(rest),
                                max_restarts=args.max_restarts, standby=not args.no_standby)
    try:
      return launcher.launch(cfg)
    except launcher.LaunchError as e:
      print(f'error: {e}', file=sys.stderr)
      return 2
  if args.command == 'status':
    from pax_autockpt.tools import status  # pylint: disable=g-import-not-at-top
    return status.run(args.job_log_dir, args.wait_for_checkpoint, args.timeout_secs, args.pid, args.local_dir,
                      args.wait_for_local_step)
  if args.command == 'report':
    from pax_autockpt.tools import report  # pylint: disable=g-import-not-at-top  (matplotlib)
    return report.run(args.job_log_dir, mtbf_hours=args.mtbf_hours, plot_path=args.plot,
                      as_json=args.json)
  if args.command == 'verify':
    from pax_autockpt.tools import verify  # pylint: disable=g-import-not-at-top  (tensorstore, orbax)
    return verify.run(args.job_log_dir, args.step, args.against)
  from pax_autockpt.tools import demo  # pylint: disable=g-import-not-at-top
  return demo.run(args.workdir)


if __name__ == '__main__':
  sys.exit(main())
