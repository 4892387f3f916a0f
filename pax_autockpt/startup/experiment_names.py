"""The one-line error for a wrong --exp, said before paxml is imported where the sources settle it: a module
that does not exist, or a class its module's source does not register; else the registered names closest to
it, said after paxml found none.

Before the import nothing is registered yet (paxml imports an experiment's module only when asked), so a
missing module is certain there. A missing class is certain only where the module's source shows every
registration it makes (each a `register` class decorator, no other use of `register`, no star import) and
never binds the name: then the error comes in about a second instead of after TensorFlow's ~14 s import.
"""

import ast
import difflib
import importlib.machinery
import importlib.util
import os
from typing import Iterable

EXAMPLE = 'experiments.lm_cloud_autockpt.LmCloudSpmdTinyAutockpt'


def _spec(module: str) -> importlib.machinery.ModuleSpec | None:
  """`module`'s spec (None: it does not exist), found without running any package's __init__: a user's package
  may import paxml, and that must wait for pax_autockpt.main. Raises where the search itself fails."""
  parts = module.split('.')
  spec = importlib.util.find_spec(parts[0])
  for i in range(2, len(parts) + 1):
    if spec is None or spec.submodule_search_locations is None:
      return None
    spec = importlib.machinery.PathFinder.find_spec('.'.join(parts[:i]), list(spec.submodule_search_locations))
  return spec


def module_found(module: str) -> bool | None:
  """Whether `module` can be imported; None when the search itself fails (paxml's import decides then)."""
  try:
    return _spec(module) is not None
  except Exception:  # pylint: disable=broad-except  (e.g. nested namespace packages: unsure, so paxml decides)
    return None


def _is_register(node: ast.AST) -> bool:
  """`register`, `anything.register`, or a call of either (`@experiment_registry.register(tags=...)`)."""
  node = node.func if isinstance(node, ast.Call) else node
  return getattr(node, 'id', getattr(node, 'attr', None)) == 'register'


def registered_classes(tree: ast.AST) -> list[str]:
  """The classes in a module's syntax tree under a `register` decorator."""
  return [n.name for n in ast.walk(tree)
          if isinstance(n, ast.ClassDef) and any(_is_register(d) for d in n.decorator_list)]


def _all_registrations_seen(tree: ast.AST, classes: list[str]) -> bool:
  """Whether the decorators in `classes` are the module's only registrations: some, `register` named nowhere
  else (a call like `register(make_class())` registers what the source does not name), no star import."""
  if not classes:
    return False
  mentions = sum(1 for n in ast.walk(tree) if isinstance(n, (ast.Name, ast.Attribute)) and _is_register(n))
  star = any(isinstance(n, ast.ImportFrom) and any(a.name == '*' for a in n.names) for n in ast.walk(tree))
  return mentions == len(classes) and not star


def _binds(tree: ast.AST, name: str) -> bool:
  """Whether the module defines, assigns or imports `name` anywhere (then paxml's import decides)."""
  for n in ast.walk(tree):
    if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == name:
      return True
    if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store):
      return True
    if isinstance(n, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in n.names):
      return True
  return False


def registered_in_sources(package: str = 'experiments') -> list[str]:
  """`package.module.Class` for each class under a `register` decorator in the package's own files."""
  try:
    spec = importlib.util.find_spec(package)
  except (ImportError, ValueError):
    return []
  names = []
  for root in (spec and spec.submodule_search_locations) or ():
    for file in sorted(f for f in os.listdir(root) if f.endswith('.py')):
      tree = _parsed(os.path.join(root, file))
      names += [f'{package}.{file[:-3]}.{c}' for c in (registered_classes(tree) if tree else [])]
  return names


def _parsed(path: str) -> ast.AST | None:
  """The syntax tree of the Python file at `path`; None where it cannot be read or parsed (paxml decides)."""
  try:
    with open(path, encoding='utf-8', errors='replace') as f:
      return ast.parse(f.read(), path)
  except (OSError, SyntaxError, ValueError):
    return None


def unknown(exp: str) -> str | None:
  """The error for an --exp that the sources show paxml will not find (its module, or its class), or None."""
  return module_missing(exp) or class_missing(exp)


def class_missing(exp: str) -> str | None:
  """The error for an --exp whose module exists but, by its source, registers no such class; None when unsure
  (the source does not show every registration, binds the name, or `exp` is itself a module)."""
  module, _, name = exp.rpartition('.')
  try:
    spec = _spec(module) if module and not module_found(exp) else None
  except Exception:  # pylint: disable=broad-except  (as module_found: paxml decides)
    return None
  tree = _parsed(spec.origin) if spec and spec.origin and spec.origin.endswith('.py') else None
  classes = registered_classes(tree) if tree else []
  if not _all_registrations_seen(tree, classes) or _binds(tree, name):
    return None
  return f'--exp={exp} is not a registered experiment: {closest(exp, [f"{module}.{c}" for c in classes])}'


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
