"""The shape of pax_autockpt's imports: no circle anywhere, and every import goes down the layers (RANKS), never up
or sideways. Every `import` of one of its modules counts, at any level (a function-level import that only works
because it runs late too). Also: `ls pax_autockpt/` shows only the packages and the allowed top-level modules, and no
package holds more than MOST_MODULES modules."""

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'pax_autockpt')

# The layers, top first: a module may import the modules of its own group and those of any group of lower rank;
# never a group of its own rank (save and restore are siblings: neither imports the other) or above.
# `pkg.*`: the package and everything under it; any other name: that module only.
RANKS = (
    (10, 'tools', ('pax_autockpt.tools.*',)),  # the user's commands; training never imports them
    (9, 'entry', ('pax_autockpt.main', 'pax_autockpt.experiment', 'pax_autockpt.executor')),  # may import each other
    (8, 'hook', ('pax_autockpt.hook.*',)),
    (7, 'exit', ('pax_autockpt.exit.*',)),
    (6, 'save', ('pax_autockpt.save.*',)),
    (6, 'restore', ('pax_autockpt.restore.*',)),
    (5, 'startup', ('pax_autockpt.startup.*',)),
    (4, 'local', ('pax_autockpt.local.*',)),
    (3, 'signals', ('pax_autockpt.signals.*',)),
    (2, 'hosts', ('pax_autockpt.hosts.*',)),
    (1, 'shared', ('pax_autockpt.shared.*',)),
    # The top-level leaves (settings imports policies) and the package itself.
    (0, 'leaves', ('pax_autockpt', 'pax_autockpt.settings', 'pax_autockpt.layout', 'pax_autockpt.policies')),
)
# What `ls pax_autockpt/` may show besides the packages (each a folder with an __init__.py).
TOP_MODULES = {'__init__.py', 'main.py', 'experiment.py', 'executor.py', 'settings.py', 'layout.py', 'policies.py'}
MOST_MODULES = 10  # per package, its __init__.py not counted


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


def place(module: str) -> tuple[int, str] | None:
  """(rank, group) of a dotted module name per RANKS, or None where no group holds it."""
  for rank, group, members in RANKS:
    for member in members:
      if module == member.removesuffix('.*') or member.endswith('.*') and module.startswith(member[:-1]):
        return rank, group
  return None


def violations(graph: dict[str, set[str]]) -> list[str]:
  """Every import that goes up or sideways between groups (or from or to a module no group holds), one line each."""
  found = []
  for name in sorted(graph):
    for target in sorted(graph[name]):
      here, there = place(name), place(target)
      if here is None or there is None:
        found.append(f'{name} -> {target}: {name if here is None else target} has no rank (place it in RANKS)')
      elif here[1] != there[1] and there[0] >= here[0]:
        found.append(f'{name} ({here[1]}, rank {here[0]}) imports {target} ({there[1]}, rank {there[0]})')
  return found


def test_the_rank_check_reports_an_upward_or_sideways_import_and_passes_a_downward_one():
  upward = {'pax_autockpt.shared.events': {'pax_autockpt.exit.exit_path', 'pax_autockpt.layout'}}
  assert violations(upward) == [
      'pax_autockpt.shared.events (shared, rank 1) imports pax_autockpt.exit.exit_path (exit, rank 7)']
  sideways = {'pax_autockpt.save.saves': {'pax_autockpt.restore.restore'}}
  assert violations(sideways) == [
      'pax_autockpt.save.saves (save, rank 6) imports pax_autockpt.restore.restore (restore, rank 6)']
  assert violations({'pax_autockpt.tools.cli': {'pax_autockpt.hook.checkpointer'}, 'pax_autockpt.main': {
      'pax_autockpt.executor', 'pax_autockpt.startup.precheck'}, 'pax_autockpt.settings': {'pax_autockpt.policies'},
                     'pax_autockpt.exit.rescue': {'pax_autockpt.exit.exit_path', 'pax_autockpt.shared.phases'}}) == []
  assert violations({'pax_autockpt.newgroup.thing': {'pax_autockpt.layout'}}) == [
      'pax_autockpt.newgroup.thing -> pax_autockpt.layout: pax_autockpt.newgroup.thing has no rank (place it in RANKS)']


def test_every_import_of_pax_autockpt_goes_down_the_layers():
  modules = _modules()
  graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
  assert sum(map(len, graph.values())) > 100  # the walk read the package
  assert violations(graph) == []


def test_every_module_of_pax_autockpt_has_a_rank():
  """A new package (or top-level module) is placed in RANKS before anything may import it or it may import."""
  modules = _modules()
  assert len(modules) > 50 and 'pax_autockpt.exit.exit_path' in modules  # the walk read the package
  assert sorted(m for m in modules if place(m) is None) == []


def test_nothing_in_pax_autockpt_imports_the_repositorys_rigs_or_tests():
  """Neither is in the wheel: an installed pax_autockpt that imported one would fail on a user's machine."""
  found = []
  for name, path in _modules().items():
    for node in ast.walk(ast.parse(open(path).read())):
      named = [a.name for a in node.names] if isinstance(node, ast.Import) else (
          [node.module or ''] if isinstance(node, ast.ImportFrom) else [])
      found += [f'{name} imports {n}' for n in named if n.split('.')[0] in ('rigs', 'tests')]
  assert found == []


def test_ls_pax_autockpt_shows_the_groups_and_no_group_is_too_big():
  """Only packages and the allowed top-level modules at the top; no package holds more than MOST_MODULES modules."""
  top = sorted(n for n in os.listdir(ROOT) if n != '__pycache__')
  packages = [n for n in top if os.path.isdir(os.path.join(ROOT, n))]
  assert [n for n in packages if not os.path.isfile(os.path.join(ROOT, n, '__init__.py'))] == []
  assert sorted(set(top) - set(packages) - TOP_MODULES) == []
  assert {'exit', 'hook', 'local', 'tools'} <= set(packages) and len(packages) >= 10
  sizes = {}
  for folder, dirs, files in os.walk(ROOT):
    dirs[:] = [d for d in dirs if d != '__pycache__']
    if folder != ROOT:
      sizes[os.path.relpath(folder, ROOT)] = len([f for f in files if f.endswith('.py') and f != '__init__.py'])
  assert {p: n for p, n in sizes.items() if n > MOST_MODULES} == {}, f'more than {MOST_MODULES} modules'
