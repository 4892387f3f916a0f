"""What the Makefile installs over paxml's own pins, kept in step with what the code expects."""

import importlib.metadata
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(*path: str) -> str:
  with open(os.path.join(ROOT, *path)) as f:
    return f.read()


def test_the_tensorstore_fix_is_pinned_once_and_installed():
  makefile = re.search(r'^TENSORSTORE := (\S+)$', _read('Makefile'), re.M).group(1)
  expected = re.search(r"^TENSORSTORE_FIXED = '([^']+)'", _read('pax_autockpt', 'main.py'), re.M).group(1)
  assert makefile == expected
  # The training processes of this suite run on it (a venv that `make` did not build may not).
  assert importlib.metadata.version('tensorstore') == expected
