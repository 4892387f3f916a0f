"""bench/results.md is written from bench/results.json: the two never disagree, and a scenario's note shows."""

import json
import pathlib

from rigs.bench import markdown

BENCH = pathlib.Path(__file__).parent.parent / 'bench'


def test_results_md_is_what_results_json_renders():
  """A table edited by hand (or a results.json left uncommitted) shows here, not at the next bench run."""
  results = json.loads((BENCH / 'results.json').read_text())
  assert (BENCH / 'results.md').read_text() == markdown.render(results)


def test_a_scenario_note_is_printed_above_its_table():
  figure = dict(name='f', unit='s', n=1, median=1.0, min=1.0, max=1.0)
  scenario = dict(measured='t', commit='c', pairs=1, figures=[figure], note='Per-run values not kept.')
  text = markdown.render({'scenarios': {'x': scenario}})
  assert text.index('Per-run values not kept.') < text.index('Measured t') < text.index('| f | s |')
  assert 'Per-run values not kept.' not in markdown.render({'scenarios': {'x': {**scenario, 'note': ''}}})
