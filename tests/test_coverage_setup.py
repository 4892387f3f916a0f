"""`make coverage` counts the lines that only the tests' real processes run (.coveragerc).

The product's exits are often `os._exit` in a child forked without exec (tests/forkserver.py,
pax_autockpt.startup.standby's hosts): a figure that lost those processes' data would name well-tested exit paths as
uncovered. One Python process started by a measured one forks; its child runs a product line and ends with
os._exit. Without coverage nothing of this is patched: the product runs as a user's job does.
"""

import os
import subprocess
import sys
import textwrap

import coverage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Started by the measured process: forks, and only the fork's child calls the product (then os._exit, as the
# product's exits do: no atexit, no flush, so no data unless coverage saves it first).
GRANDCHILD = textwrap.dedent('''
    import os, signal, sys
    from pax_autockpt.signals import signals
    pid = os.fork()
    if pid == 0:
      print(type(os._exit).__name__, signals.name(signal.SIGTERM), flush=True)
      os._exit(7)
    sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
''')
MEASURED = 'import subprocess, sys; sys.exit(subprocess.run([sys.executable, sys.argv[1]]).returncode)'


def _env(**extra) -> dict[str, str]:
  """This environment without an enclosing `make coverage`'s settings (its processes measure themselves)."""
  return {**{k: v for k, v in os.environ.items() if not k.startswith('COVERAGE_')}, **extra}


def _signals_name_line() -> int:
  with open(os.path.join(ROOT, 'pax_autockpt', 'signals', 'signals.py')) as f:
    lines = f.read().splitlines()
  return lines.index('def name(signum: int) -> str:') + 2  # its body


def test_a_forked_childs_lines_are_counted_when_it_ends_with_os_exit(tmp_path):
  (tmp_path / 'grandchild.py').write_text(GRANDCHILD)
  (tmp_path / 'measured.py').write_text(MEASURED)
  data = str(tmp_path / '.coverage')
  run = subprocess.run([sys.executable, '-m', 'coverage', 'run', '--rcfile', os.path.join(ROOT, '.coveragerc'),
                        str(tmp_path / 'measured.py'), str(tmp_path / 'grandchild.py')],
                       cwd=ROOT, env=_env(COVERAGE_FILE=data), capture_output=True, text=True, timeout=120)
  assert run.returncode == 7, run.stderr[-2000:]
  assert run.stdout.split()[-1] == 'SIGTERM', run.stdout
  cov = coverage.Coverage(data_file=data)
  cov.combine([str(tmp_path)])
  signals_py = os.path.join(ROOT, 'pax_autockpt', 'signals', 'signals.py')
  assert _signals_name_line() in (cov.get_data().lines(signals_py) or []), 'the fork\'s data was lost'


def test_without_coverage_nothing_is_patched(tmp_path):
  (tmp_path / 'grandchild.py').write_text(GRANDCHILD)
  run = subprocess.run([sys.executable, str(tmp_path / 'grandchild.py')], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=60)
  assert (run.returncode, run.stdout.split()) == (7, ['builtin_function_or_method', 'SIGTERM']), run.stderr[-2000:]
