"""The wheel a user installs: every module of pax_autockpt, and none of the repository's test and bench rigs (rigs/:
the local GCS server, the fake metadata server, the soak driver, the decision simulator, the benchmarks) or tests.

Built with the venv's own pip, setuptools and wheel (no build isolation, nothing fetched) from a copy of what the build
reads (and of rigs/ and tests/ beside it), so that no build/ or egg-info lands in the clone. ~3 s on 2 cores."""

import os
import shutil
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RIGS = ('local_gcs.py', 'fake_metadata.py', 'soak.py', 'decision_sim.py')


def _wheel_files(tmp_path) -> list[str]:
  source = tmp_path / 'source'
  source.mkdir()
  for name in ('setup.cfg', 'pyproject.toml', 'README.md'):
    shutil.copy(os.path.join(ROOT, name), source / name)
  for name in ('pax_autockpt', 'experiments', 'rigs', 'tests'):  # rigs and tests beside, as in the clone
    shutil.copytree(os.path.join(ROOT, name), source / name, ignore=shutil.ignore_patterns('__pycache__'))
  built = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '.', '--no-deps', '--no-build-isolation', '--no-index',
                          '-w', str(tmp_path / 'wheel'), '-q'], cwd=source, capture_output=True, text=True, timeout=300)
  assert built.returncode == 0, built.stderr[-3000:]
  [wheel] = os.listdir(tmp_path / 'wheel')
  with zipfile.ZipFile(tmp_path / 'wheel' / wheel) as z:
    return z.namelist()


def test_the_wheel_holds_every_module_of_pax_autockpt_and_no_test_rig(tmp_path):
  files = _wheel_files(tmp_path)
  ours = sorted(os.path.relpath(os.path.join(d, f), ROOT).replace(os.sep, '/')
                for d, _, names in os.walk(os.path.join(ROOT, 'pax_autockpt')) for f in names if f.endswith('.py'))
  assert 'pax_autockpt/exit/exit_path.py' in ours and 'pax_autockpt/tools/cli.py' in ours  # the walk read the package
  assert sorted(set(ours) - set(files)) == []  # a package missing from setup.cfg's `packages` fails here
  tops = {f.split('/')[0] for f in files}
  assert {t for t in tops if not t.endswith('.dist-info')} == {'pax_autockpt', 'experiments'}
  rigs = [f for f in files if f.startswith(('rigs/', 'tests/')) or '/bench/' in f or os.path.basename(f) in RIGS]
  assert rigs == []
