"""The one-line error for a wrong --exp: whether its module exists, said before paxml is imported, and
the registered names closest to it, said after paxml found none.

Before the import nothing is registered yet (paxml imports an experiment's module only when asked), so
a missing module is certain there; names found in source files are only ever suggestions.
"""

import difflib
import importlib.machinery
import importlib.util
import os
import re
from typing import Iterable

EXAMPLE = 'experiments.lm_cloud_autockpt.LmCloudSpmdTinyAutockpt'
_REGISTERED_CLASS = re.compile(r'^@\S*register\b.*\n(?:@.*\n)*class (\w+)\b', re.M)


def module_found(module: str) -> bool | None:
  """Whether `module` can be imported; None when the search itself fails (paxml's import decides then).

  Walks the path without running any package's __init__: a user's package may import paxml, and that
  must wait for pax_autockpt.main.
  """
  parts = module.split('.')
  try:
    spec = importlib.util.find_spec(parts[0])
    for i in range(2, len(parts) + 1):
      if spec is None or spec.submodule_search_locations is None:
        return False
      spec = importlib.machinery.PathFinder.find_spec('.'.join(parts[:i]), list(spec.submodule_search_locations))
  except Exception:  # pylint: disable=broad-except  (e.g. nested namespace packages: unsure, so paxml decides)
    return None
  return spec is not None


def registered_in_sources(package: str = 'experiments') -> list[str]:
  """`package.module.Class` for each class under a `register` decorator in the package's own files."""
  try:
    spec = importlib.util.find_spec(package)
  except (ImportError, ValueError):
    return []
  names = []
  for root in (spec and spec.submodule_search_locations) or ():
    for file in sorted(f for f in os.listdir(root) if f.endswith('.py')):
      with open(os.path.join(root, file), encoding='utf-8', errors='replace') as f:
        names += [f'{package}.{file[:-3]}.{c}' for c in _REGISTERED_CLASS.findall(f.read())]
  return names


def module_missing(exp: str) -> str | None:
  """The error for an --exp whose module does not exist (paxml imports all but the last part), or None."""
  module = exp.rsplit('.', 1)[0]  # as paxml's get_experiment
  if not all(module.split('.')):
    return f'--exp={exp} is not a module and class name: use --exp=<module>.<Class>, e.g. --exp={EXAMPLE}'
  if module_found(module) is not False:
    return None
  known = registered_in_sources()
  if '.' not in exp:
    return _without_module(exp, known)
  close = difflib.get_close_matches(exp, known, n=1)
  hint = f'did you mean --exp={close[0]}?' if close else f'use --exp=<module>.<Class>, e.g. --exp={EXAMPLE}'
  return f'--exp={exp}: there is no module {module} on the Python path; {hint}'


def _without_module(exp: str, known: list[str]) -> str:
  """A bare class name: paxml's registry knows only classes whose module was imported, so say which."""
  by_class = {}
  for name in known:
    by_class.setdefault(name.rpartition('.')[2], name)
  if exp in by_class:
    return f'--exp={exp} names a class without its module: use --exp={by_class[exp]}'
  close = difflib.get_close_matches(exp, by_class, n=1)
  hint = f'did you mean --exp={by_class[close[0]]}?' if close else f'e.g. --exp={EXAMPLE}'
  return f'--exp={exp} names no module: use --exp=<module>.<Class>; {hint}'


def closest(exp: str, registered: Iterable[str]) -> str:
  """What to say after paxml found no experiment `exp` among the registered ones."""
  keys = sorted(registered)
  inside = [k for k in keys if k.startswith(exp + '.')]
  if inside:
    return 'it is a module: add the class, e.g. ' + ' or '.join(f'--exp={k}' for k in inside[:3])
  module, _, name = exp.rpartition('.')
  same_module = {k.rpartition('.')[2]: k for k in keys if k.rpartition('.')[0] == module}
  close = [same_module[c] for c in difflib.get_close_matches(name, same_module, n=3)]
  if not same_module:  # the module registers nothing: compare whole names
    close = difflib.get_close_matches(exp, keys, n=3)
  if close:
    return 'did you mean ' + ' or '.join(f'--exp={k}' for k in close) + '?'
  if same_module:
    return f'{module} registers ' + ', '.join(same_module)
  return f'use --exp=<module>.<Class>, e.g. --exp={EXAMPLE}'


def not_registered(exp: str, error: ValueError, registered: Iterable[str]) -> str:
  """The one line for paxml's ValueError from get_experiment(exp) (paxml's own runs over many)."""
  cause = error.__cause__
  if isinstance(cause, ModuleNotFoundError):
    return module_missing(exp) or f'--exp={exp}: importing its module failed: {cause}'
  if 'does not uniquely identify' in str(error):
    return f'--exp={exp}: {str(error).splitlines()[0]}'
  return f'--exp={exp} is not a registered experiment: {closest(exp, registered)}'
