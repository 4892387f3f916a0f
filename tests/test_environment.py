"""An interpreter without paxml's environment (the system `python3` typed in the clone) ends in one line
naming the fix, exit 2, not a traceback."""

import os
import subprocess
import sys

from pax_autockpt.startup import environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_this_environment_can_run_it():
  assert environment.problem() is None


def test_a_missing_module_is_named_with_the_fix():
  why = environment.problem(('absl', 'no_such_module_for_autockpt'))
  assert 'lacks no_such_module_for_autockpt: ' in why and '.venv/bin/activate` once per shell' in why
  assert f'`source {os.path.join(ROOT, ".venv", "bin")}/activate`' in why  # the clone's own venv


def test_python_dash_m_without_site_packages_is_one_line_and_exit_2():
  """`-S`: this interpreter without its site-packages, started in the clone as a user would type it; the
  package itself is found from the working directory, paxml's dependencies are not."""
  for module in ('pax_autockpt.main', 'pax_autockpt.tools.cli'):
    out = subprocess.run([sys.executable, '-S', '-m', module, '--exp=x', '--job_log_dir=/nonexistent/job'],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and out.stdout == '', (module, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: this Python (') and 'lacks absl' in lines[0], out.stderr
