"""A host for tests/test_launcher.py's standby, in place of pax_autockpt.main: says its arguments and one
variable, then exits with the code its first argument names, or (`wait`) waits up to 600 s for SIGTERM and
exits 143."""

import os
import signal
import sys
import time


def main() -> None:
  print(f'argv={sys.argv[1:]} AUTOCKPT_X={os.environ.get("AUTOCKPT_X")} stdin={sys.stdin.read()!r}', flush=True)
  if sys.argv[1] == 'wait':
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    time.sleep(600)
  sys.exit(int(sys.argv[1]))


if __name__ == '__main__':
  main()
