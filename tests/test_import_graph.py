"""No import circle anywhere in pax_autockpt: every `import` of one of its modules, at any level (a
function-level import that only works because it runs late counts too), forms an acyclic graph."""

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'pax_autockpt')


def _modules() -> dict[str, str]:
  """Dotted module name -> file, for every .py under pax_autockpt (a package is its __init__)."""
  found = {}
  for folder, _, files in os.walk(ROOT):
    for name in files:
      if name.endswith('.py'):
        path = os.path.join(folder, name)
        dotted = os.path.relpath(path[:-3], os.path.dirname(ROOT)).replace(os.sep, '.')
        found[dotted.removesuffix('.__init__')] = path
  return found


def _imports(path: str, modules: dict[str, str]) -> set[str]:
  """The pax_autockpt modules a file imports (`from package import module` names the module)."""
  named = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('pax_autockpt'):
      named |= {f'{node.module}.{a.name}' if f'{node.module}.{a.name}' in modules else node.module
                for a in node.names}
    elif isinstance(node, ast.Import):
      named |= {a.name for a in node.names if a.name.startswith('pax_autockpt')}
  return {m for m in named if m in modules}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Every back edge's cycle found by a depth-first walk (empty: the graph is acyclic)."""
  found, state, path = [], {}, []

  def visit(node: str) -> None:
    state[node] = 'open'
    path.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 'open':
        found.append(path[path.index(nxt):] + [nxt])
      elif nxt not in state:
        visit(nxt)
    path.pop()
    state[node] = 'done'

  for node in sorted(graph):
    if node not in state:
      visit(node)
  return found


def test_the_walk_finds_a_circle_where_there_is_one():
  assert cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c', 'a']]
  assert cycles({'a': {'b'}, 'b': set(), 'c': {'a', 'b'}}) == []


def test_no_module_of_pax_autockpt_imports_itself_through_others():
  modules = _modules()
  graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
  assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the walk read the package
  assert cycles(graph) == []
