"""The README is a guide and docs/ the reference it maps: the README stays short, every docs page is on its
map, and every relative link and anchor in them leads somewhere (GitHub's anchor rule). Pure and fast."""

import collections
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, 'README.md')
DOCS = os.path.join(ROOT, 'docs')
README_MAX_LINES = 265  # 250 until issue 61 added the reference part (exit codes; the `| tee` paragraph to come)

_FENCE = re.compile(r'^\s*(```|~~~)')
_HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$')
# [text](target): the text may hold brackets one level deep and run over lines; the target has no spaces.
_LINK = re.compile(r'\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^()\s]+)\)')
_SCHEME = re.compile(r'^[a-zA-Z][a-zA-Z0-9+.-]*:')


def _docs_pages() -> list[str]:
  return sorted(os.path.join(DOCS, n) for n in os.listdir(DOCS) if n.endswith('.md'))


def _prose(text: str) -> str:
  """The text without fenced code blocks, inline code spans and HTML comments (links there are not links)."""
  lines, fenced = [], False
  for line in text.splitlines():
    if _FENCE.match(line):
      fenced = not fenced
      lines.append('')
    else:
      lines.append('' if fenced else line)
  prose = '\n'.join(lines)
  prose = re.sub(r'<!--.*?-->', '', prose, flags=re.S)
  return re.sub(r'`[^`]*`', '', prose)


def slug(heading: str) -> str:
  """GitHub's anchor for a heading: lowercase, punctuation but `-` dropped, spaces -> `-`."""
  text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading)  # a link in a heading anchors by its text
  text = text.replace('`', '').strip().lower()
  text = re.sub(r'[^\w\- ]', '', text)
  return text.replace(' ', '-')


def anchors(text: str) -> set[str]:
  """The anchors of a markdown text's headings (outside code blocks), duplicates numbered as GitHub does."""
  seen, out = collections.Counter(), set()
  fenced = False
  for line in text.splitlines():
    if _FENCE.match(line):
      fenced = not fenced
      continue
    m = None if fenced else _HEADING.match(line)
    if m:
      base = slug(m.group(2))
      out.add(base if not seen[base] else f'{base}-{seen[base]}')
      seen[base] += 1
  return out


def links(text: str) -> list[str]:
  """The link targets of a markdown text, outside code."""
  return _LINK.findall(_prose(text))


def broken_links(path: str, text: str | None = None) -> list[str]:
  """Every relative link of the file at `path` (or of `text`, as if it were there) that leads nowhere."""
  if text is None:
    with open(path) as f:
      text = f.read()
  problems = []
  for target in links(text):
    if _SCHEME.match(target):
      continue  # http(s)://, mailto: ... not checked here
    file_part, _, anchor = target.partition('#')
    dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
    where = f'{os.path.relpath(path, ROOT)}: ({target})'
    if not os.path.exists(dest):
      problems.append(f'{where}: no file {os.path.relpath(dest, ROOT)}')
      continue
    if anchor and dest.endswith('.md'):
      if dest == path:
        dest_text = text
      else:
        with open(dest) as f:
          dest_text = f.read()
      if anchor not in anchors(dest_text):
        problems.append(f'{where}: no heading with anchor #{anchor} in {os.path.relpath(dest, ROOT)}')
  return problems


def test_readme_is_a_guide_of_at_most_265_lines():
  with open(README) as f:
    n = len(f.read().splitlines())
  assert n <= README_MAX_LINES, f'README.md has {n} lines (at most {README_MAX_LINES}): move reference text to docs/'


def test_every_docs_page_is_on_the_readme_map():
  with open(README) as f:
    targets = {os.path.normpath(os.path.join(ROOT, t.partition('#')[0])) for t in links(f.read())}
  missing = [os.path.relpath(p, ROOT) for p in _docs_pages() if p not in targets]
  assert not missing, f'README.md does not link to {missing}: add them to "Where to read more"'


def test_every_docs_page_links_back_to_the_readme():
  for page in _docs_pages():
    with open(page) as f:
      head = '\n'.join(f.read().splitlines()[:8])
    assert '(../README.md' in head, f'{os.path.relpath(page, ROOT)}: link back to the README in its first lines'


def test_every_relative_link_and_anchor_leads_somewhere():
  problems = [p for page in [README, *_docs_pages()] for p in broken_links(page)]
  assert not problems, '\n'.join(problems)


def test_github_anchor_rule():
  assert slug('Checkpoints on gs://') == 'checkpoints-on-gs'
  assert slug('Cloud TPU quickstart (single slice)') == 'cloud-tpu-quickstart-single-slice'
  assert slug('Scale: the save decision at 1,024 hosts') == 'scale-the-save-decision-at-1024-hosts'
  assert slug('The `pax-autockpt` command') == 'the-pax-autockpt-command'
  assert slug('7a. The local tier (`--autockpt_local_dir`)') == '7a-the-local-tier---autockpt_local_dir'
  assert anchors('# A\n```\n# not a heading\n```\n## A\n') == {'a', 'a-1'}


def test_a_broken_link_is_caught():
  """The check is not vacuous: a missing file, a missing anchor and a missing heading of this page fail."""
  page = os.path.join(DOCS, 'settings.md')
  good = '# Title\n\n[back](../README.md#two-commands), [here](#title), [code](`x`) `[not](a-link.md)`\n'
  assert broken_links(page, good) == []
  assert len(broken_links(page, good + '[gone](no-such-page.md)\n')) == 1
  assert len(broken_links(page, good + '[moved](../README.md#no-such-section)\n')) == 1
  assert len(broken_links(page, good + '[self](#no-such-heading)\n')) == 1
  assert len(broken_links(page, good + '[over\nlines](continuous.md#no-such-heading)\n')) == 1


def test_how_it_works_names_every_module_a_training_process_imports():
  """docs/how-it-works.md walks a step through the package one module a line, grouped as the folders are: a module
  added, moved or renamed without its line there (a line that starts with the module's path in backticks, e.g.
  exit/exit_path.py), or a package without its group's heading ('the package' and its folder, e.g. exit/, in
  backticks), fails here. tools/ is not what a training process imports."""
  with open(os.path.join(DOCS, 'how-it-works.md')) as f:
    text = f.read()
  package = os.path.join(ROOT, 'pax_autockpt')
  modules, packages = [], []
  for folder, dirs, files in os.walk(package):
    dirs[:] = sorted(d for d in dirs if d not in ('tools', '__pycache__'))
    where = os.path.relpath(folder, package).replace(os.sep, '/')
    if where != '.':
      packages.append(where)
    modules += [name if where == '.' else f'{where}/{name}' for name in files
                if name.endswith('.py') and name != '__init__.py']
  assert len(modules) > 50 and 'exit/exit_path.py' in modules and 'main.py' in modules  # the walk read the package
  lines = text.splitlines()
  missing = sorted(m for m in modules if not any(line.startswith(f'- `{m}`') for line in lines))
  assert not missing, f'docs/how-it-works.md has no line for: {missing}'
  headless = sorted(p for p in packages if f'the package `{p}/`' not in text)
  assert not headless, f'docs/how-it-works.md has no group heading for the package(s): {headless}'


# A figure with a unit of time: a number, or a range of two, then the unit (`~` before it is allowed).
_TIMING = re.compile(r'(?<![\w.,])(\d+(?:\.\d+)?)(?:–(\d+(?:\.\d+)?))?\s?(ms|s|seconds|min|minutes|h|hours)\b')
_SECONDS = {'ms': 0.001, 's': 1.0, 'seconds': 1.0, 'min': 60.0, 'minutes': 60.0, 'h': 3600.0, 'hours': 3600.0}
# The README's figures that are not measurements of ours, with why; every other one is traced to bench/results.md.
NOT_FROM_BENCH = {
    '5 minutes': "Cloud TPU's grace period before maintenance (its documentation)",
    '1 s': "the local tier's minimum interval, a setting (with '20 save durations')",
    '2.5 minutes': "the eval's length in the stock paxml comparison (a setup, not a result)",
    '167 s': "stock paxml's one run in that comparison (docs/benchmarks.md, `anywhere`; stock is not benched there)",
}


def _bench_seconds() -> list[float]:
  """Every figure bench/results.md's tables hold (medians, ranges, baselines; the set-ups' times), in seconds."""
  with open(os.path.join(ROOT, 'bench', 'results.md')) as f:
    rows = [line.split('|')[1:-1] for line in f if line.startswith('| ') and not line.startswith('| figure')]
  values = []
  for cells in rows:
    unit = _SECONDS.get(cells[1].strip())
    if unit:
      values += [float(v) * unit for cell in cells[2:4] for v in re.findall(r'\d+(?:\.\d+)?', cell.split(':')[-1])]
    values += [float(m[0]) * _SECONDS[m[2]] for m in _TIMING.findall(cells[0])]
  return values


_DATED = re.compile(r'20\d\d-\d\d-\d\d.*2 cores|2 cores.*20\d\d-\d\d-\d\d', re.S)
# The first table's signal rows quote figures without their date and machine; the lead edits those rows (issue 61).
AWAITING_DATE: set[str] = set()


def _blocks(text: str) -> list[str]:
  """The prose's paragraphs, each table row a block of its own."""
  blocks = []
  for paragraph in re.split(r'\n\s*\n', _prose(text)):
    rows = [line for line in paragraph.splitlines() if line.lstrip().startswith('|')]
    rest = '\n'.join(line for line in paragraph.splitlines() if not line.lstrip().startswith('|'))
    blocks += [*rows, rest]
  return blocks


def untraced_timings(text: str, bench: list[float]) -> list[str]:
  """The timings in `text`'s prose (code blocks are commands and one run's output) that are not in NOT_FROM_BENCH
  and are either not, rounded as the README rounds them, a figure of bench/results.md, or quoted in a paragraph
  (a table row) that does not give the date and the machine ("2 cores")."""
  def traced(number: str, unit: str) -> bool:
    digits = len(number.partition('.')[2])
    return any(round(v / _SECONDS[unit], digits) == float(number) for v in bench)
  bad = []
  for block in _blocks(text):
    for m in _TIMING.finditer(block):
      figure = m.group(0).lstrip('~')
      if figure in NOT_FROM_BENCH:
        continue
      numbers = [n for n in (m.group(1), m.group(2)) if n]
      if not all(traced(n, m.group(3)) for n in numbers) or not (_DATED.search(block) or figure in AWAITING_DATE):
        bad.append(m.group(0))
  return bad


def test_every_timing_the_readme_quotes_is_a_dated_bench_figure():
  """A timing from one quiet hour misleads on a busy machine: the README quotes bench/results.md's figures with
  their date and machine, or says "seconds" without a number."""
  with open(README) as f:
    text = f.read()
  bench = _bench_seconds()
  assert not untraced_timings(text, bench), untraced_timings(text, bench)
  assert untraced_timings('Installs in about 35 s.\n\nExit in 0.82 s (0.67–1.57 s), 2026-11-26, 2 cores, idle; '
                          'or 0.76 s.\n\n| row | 22 s |\n', bench) == ['35 s', '0.76 s', '22 s']


def _our_flags() -> set[str]:
  """The flags of `pax_autockpt.main` (paxml's aside) and of every `pax-autockpt` subcommand."""
  from pax_autockpt.startup import precheck  # pylint: disable=g-import-not-at-top
  from pax_autockpt.tools import cli  # pylint: disable=g-import-not-at-top
  names = {*precheck._SETTING_FLAGS, 'autockpt_print_wiring', 'help', 'helpfull'}  # pylint: disable=protected-access
  for action in cli._parser()._actions:  # pylint: disable=protected-access
    for sub in (getattr(action, 'choices', None) or {}).values():
      names |= {o[2:] for a in sub._actions for o in a.option_strings if o.startswith('--')}  # pylint: disable=protected-access
  return names


def _paxml_flags() -> set[str]:
  """The absl flags paxml/main.py defines (`flags.DEFINE_*('name', ...)`), read from the installed source."""
  import ast  # pylint: disable=g-import-not-at-top
  import importlib.util  # pylint: disable=g-import-not-at-top
  path = os.path.join(importlib.util.find_spec('paxml').submodule_search_locations[0], 'main.py')
  with open(path) as f:
    tree = ast.parse(f.read())
  calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
           and getattr(n.func, 'attr', getattr(n.func, 'id', '')).startswith('DEFINE')]
  return {n.args[0].value for n in calls if n.args and isinstance(n.args[0], ast.Constant)}


# Other tools' flags the README shows (gcloud's; their hyphenated ones and pip's --no-deps are skipped by the pattern).
OTHER_TOOLS_FLAGS = {'zone', 'version', 'worker'}


def test_every_flag_the_readme_names_is_paxmls_or_ours():
  """One spelling per flag: each `--name` in the README is a flag of paxml's main, of ours or of a subcommand (the
  multislice quickstart once said --host_index, paxml's is --host_idx)."""
  with open(README) as f:
    named = set(re.findall(r'(?<![\w-])--([a-z][a-z0-9_]*[a-z0-9])(?![\w-])', f.read()))
  paxml = _paxml_flags()
  assert {'host_idx', 'num_hosts', 'server_addr', 'exp', 'job_log_dir'} <= paxml and 'host_index' not in paxml
  unknown = named - paxml - _our_flags() - OTHER_TOOLS_FLAGS
  assert not unknown, f'README.md names flags that neither paxml nor pax-autockpt defines: {sorted(unknown)}'


def _section(text: str, heading: str) -> str:
  """The text under a `## heading` up to the next heading of that level."""
  return text.partition(f'\n## {heading}\n')[2].partition('\n## ')[0]


def test_the_subcommand_table_names_every_flag_the_readmes_commands_use():
  """A reader who meets `status --pid` in the tutorial finds it in the command table."""
  with open(README) as f:
    text = f.read()
  table = _section(text, 'The `pax-autockpt` command')
  rows = {m.group(1): m.group(0) for m in re.finditer(r'^\| `pax-autockpt (\w+)[^\n]*', table, re.M)}
  used = re.findall(r'pax-autockpt (\w+) ([^\n#]*)', '\n'.join(_code_lines(text)))
  missing = sorted({f'{sub} --{flag}' for sub, args in used for flag in re.findall(r'--(\w+)', args)
                    if sub in rows and f'--{flag}' not in rows[sub]})
  assert not missing, f'README.md: the subcommand table does not list {missing}'


def _code_lines(text: str) -> list[str]:
  lines, fenced = [], False
  for line in text.splitlines():
    if _FENCE.match(line):
      fenced = not fenced
    elif fenced:
      lines.append(line)
  return lines


def test_the_readme_lists_every_exit_code_the_contract_gives():
  """The README's exit-code table has a row for each code of CONTRACT §4 (0, 143, 130, 2, 1), and names launch's."""
  with open(README) as f:
    section = _section(f.read(), 'Exit codes')
  with open(os.path.join(DOCS, 'CONTRACT.md')) as f:
    contract = _section(f.read(), '4. Exit codes of a training process')
  codes = re.findall(r'^- `(\d+)`', contract, re.M)
  assert codes == ['0', '143', '130', '2', '1'], codes
  rows = re.findall(r'^\| (\d+) \|', section, re.M)
  assert rows == codes, rows
  assert '`pax-autockpt launch` exits with' in section and '| other |' in section


def test_development_md_puts_the_current_figures_first_and_stays_short():
  """docs/development.md is for a contributor: how long `make test` takes now, first, then a short dated history
  (one table row per stop; the git log keeps the measurement notes)."""
  with open(os.path.join(DOCS, 'development.md')) as f:
    text = f.read()
  assert len(text.splitlines()) <= 150, 'docs/development.md: at most 150 lines; the git log keeps the history'
  now = _section(text, 'How long it takes').strip().split('\n\n')[0]
  dates = re.findall(r'^\| (20\d\d-\d\d-\d\d) \|', _section(text, 'History'), re.M)
  assert now.startswith('**Now**') and dates and max(dates) in now, now[:200]
