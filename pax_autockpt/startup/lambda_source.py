"""Finds a lambda's source for Fiddle's auto_config with Python's parser: ~3 s less start-up per host.

Importing paxml auto-configs six lambdas (`praxis.optimizers`, `paxml.tasks_lib`). For each one,
fiddle 0.3.0 parses the lambda's whole module with libcst and walks every node with position
metadata: 0.5-1.3 s per lambda, about 3 s of the ~8 s that importing paxml takes on these CPUs, paid
by every host at every start and restart (so after every preemption). `ast` finds the same lambda by
its line in milliseconds. Where it does not find exactly one, fiddle's own lookup runs, so its
errors ("multiple lambdas found on line N") stay as they are.

`pax_autockpt.main` installs this before it imports paxml; stock `paxml/main.py` runs are untouched.
"""

import ast
import inspect
import linecache
from typing import Any, Callable

_parsed: dict[str, tuple[str, ast.Module]] = {}


def _module_ast(filename: str, source: str) -> ast.Module:
  """The parse of one source file, kept: a module may hold several auto-configured lambdas."""
  cached = _parsed.get(filename)
  if cached is None or cached[0] != source:
    cached = _parsed[filename] = (source, ast.parse(source, filename))
  return cached[1]


def source_of(fn: Callable[..., Any]) -> str | None:
  """The text of lambda `fn` as written, or None if its line holds no lambda or several."""
  filename = inspect.getsourcefile(fn)
  if not filename:
    return None
  module = inspect.getmodule(fn)
  source = ''.join(linecache.getlines(filename, module.__dict__ if module else None))
  line = fn.__code__.co_firstlineno
  found = [node for node in ast.walk(_module_ast(filename, source))
           if isinstance(node, ast.Lambda) and node.lineno == line]
  return ast.get_source_segment(source, found[0]) if len(found) == 1 else None


def install() -> None:
  """Routes fiddle's lambda lookup through `source_of`, falling back to fiddle's own."""
  from fiddle._src.experimental import auto_config  # pylint: disable=g-import-not-at-top
  fiddle_lookup = getattr(auto_config, '_getsource_for_lambda', None)
  if fiddle_lookup is None or getattr(fiddle_lookup, 'autockpt', False):
    return  # another fiddle release, or already installed

  def lookup(fn: Callable[..., Any]) -> str:
    return source_of(fn) or fiddle_lookup(fn)

  lookup.autockpt = True
  auto_config._getsource_for_lambda = lookup  # pylint: disable=protected-access
