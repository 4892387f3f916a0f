"""The README is a guide and docs/ the reference it maps: the README stays short, every docs page is on its
map, and every relative link and anchor in them leads somewhere (GitHub's anchor rule). Pure and fast."""

import collections
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, 'README.md')
DOCS = os.path.join(ROOT, 'docs')
README_MAX_LINES = 250

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


def test_readme_is_a_guide_of_at_most_250_lines():
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
  """docs/how-it-works.md walks a step through the package one module a line: a module added, moved or renamed
  without its line there fails here."""
  with open(os.path.join(DOCS, 'how-it-works.md')) as f:
    text = f.read()
  package = os.path.join(ROOT, 'pax_autockpt')
  modules = [name[:-3] for name in os.listdir(package) if name.endswith('.py') and name != '__init__.py']
  modules += [f'local/{name[:-3]}' for name in os.listdir(os.path.join(package, 'local'))
              if name.endswith('.py') and name != '__init__.py']
  missing = sorted(m for m in modules if f'`{m}.py`' not in text)
  assert not missing, f'docs/how-it-works.md does not name: {missing}'
