"""docs/report.md's sample report is rendered from a checked-in job directory, so that it cannot drift.

tests/data/tutorial_job_dir holds the event log of a real run of the README tutorial's commands
(LmCloudSpmdTinyShortAutockpt, 800 steps, a save every 200: run 1 SIGTERMed after step 200 committed, saving 395 on
demand; run 2 with the local tier, `kill -9` once local step 401 was committed; run 3 restored local step 469 and
finished) and the checkpoint listing (each step's orbax `metadata/metadata` only, no arrays).
"""

import io
import pathlib

from pax_autockpt.tools import report

ROOT = pathlib.Path(__file__).parent.parent
FIXTURE = ROOT / 'tests' / 'data' / 'tutorial_job_dir'
DOCS_JOB = '/tmp/autockpt-try/job'  # the README tutorial's job directory, as the docs show it


def _docs_sample() -> list[str]:
  docs = (ROOT / 'docs' / 'report.md').read_text()
  return docs.split('## Reading the report', 1)[1].split('```\n', 2)[1].splitlines()


def test_the_docs_sample_report_is_what_the_report_prints_of_the_tutorials_job():
  out = io.StringIO()
  assert report.run(str(FIXTURE), out=out) == 0  # what `pax-autockpt report` prints
  printed = out.getvalue().replace(f'job: {FIXTURE}', f'job: {DOCS_JOB}')
  assert _docs_sample() == printed.splitlines(), 'docs/report.md: paste `pax-autockpt report` of the fixture'


def test_the_sample_names_start_up_once_and_no_goodput_line_contradicts_the_measured_one():
  """Issue 61: 'start-up to the first step' and 'start-up' read alike; 'goodput: not computed' followed the
  measured goodput."""
  lines = _docs_sample()
  measured = next(line for line in lines if line.startswith('goodput (measured)'))
  assert measured.count('start-up') == 1 and 'between runs (idle, start-up)' not in measured
  assert not any('not computed' in line for line in lines)


def test_the_tutorials_plot_draws_each_restore_where_its_run_begins_and_shades_both_downtimes(tmp_path):
  """The PNG a newcomer gets from the tutorial: run 3's local step 469 drawn at run 3's start, two gaps shaded."""
  from pax_autockpt.tools.report import timeline  # pylint: disable=g-import-not-at-top
  r = report.load(FIXTURE)
  ax = timeline.figure(r).axes[0]
  run3 = next(x for x in r.runs if x.index == 2)
  local = next(c for c in ax.collections if c.get_label() == 'restored: local step')
  assert [tuple(p) for p in local.get_offsets()] == [(run3.t_start - r.t0, 469)]
  assert [t.get_text() for t in ax.texts] == ['down 24.3 s', 'down 1.1 min']
  assert report.run(str(FIXTURE), plot_path=str(tmp_path / 'timeline.png'), out=open(tmp_path / 'out', 'w')) == 0
  assert (tmp_path / 'timeline.png').read_bytes().startswith(b'\x89PNG\r\n\x1a\n')
