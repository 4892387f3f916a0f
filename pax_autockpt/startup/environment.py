"""Whether this interpreter can run pax-autockpt at all, answered in one line before anything imports.

`python3 -m pax_autockpt.main` typed in the clone imports this package from the working directory with
whatever `python3` is first on PATH; without paxml's environment it used to end in a traceback
(`No module named 'absl'`). Standard library only, so that it runs where nothing else would.
"""

import importlib.util
import os
import sys

# What every entry point imports first (absl, etils); paxml for training. Found, not imported: ~1 ms.
NEEDED = ('absl', 'etils', 'paxml')


def problem(needed: tuple[str, ...] = NEEDED) -> str | None:
  """Why this interpreter cannot run pax-autockpt, in one line with the fix; None when it can."""
  missing = [name for name in needed if importlib.util.find_spec(name) is None]
  version = '.'.join(map(str, sys.version_info[:2]))
  if not missing and sys.version_info[:2] == (3, 10):
    return None
  venv = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), '.venv', 'bin')
  what = f'lacks {", ".join(missing)}' if missing else f'is Python {version} (paxml 1.4.0 needs 3.10)'
  return (f'this Python ({sys.executable}, {version}) {what}: run pax-autockpt with the environment `make venv` '
          f'creates: `source {venv}/activate` once per shell, or `{venv}/python -m pax_autockpt.main ...`')


def shell_path(path: str) -> str:
  """`path` in the shortest form that works pasted in the current directory: relative below it."""
  relative = os.path.relpath(path)
  return path if relative.startswith('..') else relative


def command(script: str) -> str:
  """`script` of this interpreter's environment (`pax-autockpt`, `python`) as a shell runs it when pasted
  in the current directory: `.venv/bin/pax-autockpt` in the clone, whether or not the venv is activated (a
  bare name would be looked up on PATH: then the whole path)."""
  path = os.path.join(os.path.dirname(sys.executable), script)
  shown = shell_path(path)
  return shown if os.sep in shown else path
