"""A host for tests/test_launcher_truth.py in place of pax_autockpt.main, started by a real `pax-autockpt launch`
(`DRIVER` runs the command with `standby.MAIN` pointing here): the launcher's own code paths (its pipes, signals,
exit codes, restarts) in a process that starts in a fraction of a second instead of importing paxml.

It reads the flags the launcher gives (`--host_idx`, `--job_log_dir`) and does what `--fake_host<IDX>=` says,
steps separated by commas (default `wait`):
  `print:N`  print N KiB of output lines (a plugin line every 64), then go on
  `exit:C`   exit C
  `wait`     wait up to 600 s for SIGTERM or SIGINT, then exit 143 or 130
  `ignore`   as `wait`, but a SIGTERM is only noted (the host outlives any grace period)
Files in JOB_LOG_DIR/fake/: `ready.host<I>` once it waits, `got.host<I>.<SIGNAL>` for each signal it got.
"""

import os
import signal
import sys
import time

DRIVER = ('import sys; from pax_autockpt.startup import standby; standby.MAIN = "tests.launch_fake_host"; '
          'from pax_autockpt.tools import cli; sys.exit(cli.main(sys.argv[1:]))')


def _flag(name: str, default: str | None = None) -> str | None:
  prefix = f'--{name}='
  return next((a[len(prefix):] for a in sys.argv[1:] if a.startswith(prefix)), default)


def _touch(folder: str, name: str) -> None:
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, name), 'w'):
    pass


def _wait(folder: str, host: str, ignore_sigterm: bool) -> None:
  def on_signal(signum, _):
    _touch(folder, f'got.host{host}.{signal.Signals(signum).name}')
    if not (ignore_sigterm and signum == signal.SIGTERM):
      os._exit(128 + signum)  # pylint: disable=protected-access
  for signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, on_signal)
  _touch(folder, f'ready.host{host}')
  deadline = time.time() + 600
  while time.time() < deadline:
    time.sleep(0.05)
  sys.exit(1)


def main() -> None:
  host = _flag('host_idx')
  folder = os.path.join(_flag('job_log_dir'), 'fake')
  print(f'[autockpt] fake host {host} started', flush=True)
  for step in _flag(f'fake_host{host}', 'wait').split(','):
    what, _, value = step.partition(':')
    if what == 'print':
      for i in range(int(value) * 16):  # 64-byte lines
        print(f'[autockpt] line {i:08d}' if i % 64 == 0 else f'{i:063d}', flush=i % 64 == 0)
      sys.stdout.flush()
    elif what == 'exit':
      sys.exit(int(value))
    else:
      _wait(folder, host, ignore_sigterm=what == 'ignore')


if __name__ == '__main__':
  main()
