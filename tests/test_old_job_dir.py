"""A job directory written by an older version still reads the same: tests/data/old_job_dir.

Its event log was written by a real run of LmCloudSpmdTinyShortAutockpt (800 steps, a save every 200) before the
job directory's tier was renamed from 'bucket' to 'job_dir': run 1 was sent SIGTERM after step 200 committed and
saved step 270 on demand (exit 143); run 2 restored 270 (`restored_from: "bucket"` in its `start` event) and
finished at 800 (exit 0). Checked in: the event log and the checkpoint listing, each step's directory with
orbax's small `metadata/metadata` only (no arrays, no content manifests), so the fixture stays ~18 KB. Users'
job directories hold such logs for weeks: the report, `status` and the restore's choice must read them as
today's, the old value as the job directory's.
"""

import json
import pathlib
import shutil

from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt.tools import cli
from pax_autockpt.tools.report import loader
from pax_autockpt.tools.report import text
from tests import fakes

FIXTURE = pathlib.Path(__file__).parent / 'data' / 'old_job_dir'
STEPS = [0, 200, 270, 400, 600, 800]


def _copy(tmp_path) -> pathlib.Path:
  """The fixture where a test may write (a restore logs events, sets damaged steps aside)."""
  job = tmp_path / 'job'
  shutil.copytree(FIXTURE, job)
  return job


def test_the_fixture_is_what_the_old_version_wrote():
  """Guards the premise: the restart's `start` says 'bucket', as logged before the rename."""
  starts = [json.loads(line) for line in (FIXTURE / 'autockpt' / 'events.host0.jsonl').read_text().splitlines()
            if '"start"' in line]
  assert [(s['restored_step'], s['restored_from']) for s in starts] == [(None, None), (270, 'bucket')]


def test_the_report_reads_the_old_restart_as_from_the_job_directory(tmp_path, capsys):
  job = _copy(tmp_path)
  r = loader.load(job)
  assert [(run.restored_step, run.restored_from) for run in r.runs] == [(None, None), (270, 'job_dir')]
  assert [(run.exit_code, run.exit_step) for run in r.runs] == [(143, 270), (0, 800)]
  assert r.restarts == 1 and r.restored_steps == [None, 270]
  (restart,) = r.restart_details
  assert (restart.restored_step, restart.restored_from, restart.previous_exit_code) == (270, 'job_dir', 143)
  assert restart.steps_lost == 0
  assert r.steps_saved == STEPS and r.checkpoints_complete == STEPS and r.newest_checkpoint == 800
  assert r.saves_by_reason == {'interval': 5, 'preemption': 1} and r.exit_codes == {143: 1, 0: 1}
  assert r.local is None  # the job used no local tier
  words = text.format_text(r, None)
  assert 'restarts: 1 (restored: step 270 from the job directory)' in words and 'bucket' not in words
  assert cli.main(['report', str(job), '--json']) == 0  # what a user's script parses
  d = json.loads(capsys.readouterr().out)
  assert [run['restored_from'] for run in d['runs']] == [None, 'job_dir']
  assert d['restart_details'][0]['restored_from'] == 'job_dir'


def test_the_restore_chooses_the_newest_committed_step_of_the_listing(tmp_path):
  """The listing's rule (what Pax's step_to_restore lists), then the wrapper's restore over it with the old
  event log: step 800, from the job directory. The arrays are not checked in: an empty `state/` stands in for
  them, and the content manifests they would be verified against are not checked in either (checksums off)."""
  job = _copy(tmp_path)
  ckpt_dir = layout.checkpoint_dir(job)
  assert layout.committed_steps(ckpt_dir) == STEPS and layout.newest_committed(ckpt_dir) == 800
  for step in STEPS:
    (layout.step_dir(ckpt_dir, step) / 'state').mkdir()
  wrapped, fake = fakes.wrap(job, settings_lib.Settings(checksums=False))
  assert fake.step_to_restore == 800
  assert wrapped.get_model_states(None, None, None)[2] == 800 and fake.restored == [800]
  assert wrapped.restored_from == 'job_dir'
  assert fakes.events(job, 'restore_skipped') == []


def test_status_reads_the_old_job_directory(capsys):
  assert cli.main(['status', str(FIXTURE)]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == 'newest committed checkpoint: step 800 (6 committed: ..., 200, 270, 400, 600, 800)', lines
  assert lines[-1].startswith('last run (started ') and ', from step 270)' in lines[-1], lines
  assert 'finished at step 800, exit 0' in lines[-1] and lines[-1].endswith('trains nothing'), lines
