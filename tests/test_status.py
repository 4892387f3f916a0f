"""`pax-autockpt status`: two lines from the checkpoint listing and host 0's events."""

import pytest

from pax_autockpt import events as events_lib
from pax_autockpt import layout
from pax_autockpt.tools import status
from tests import fakes


def _run(job, *events):
  log = events_lib.EventLog(job, 0)
  for kind, fields in events:
    log.write(kind, **fields)
  log.flush()


def test_a_fresh_directory_a_preempted_run_and_one_still_running(tmp_path, capsys):
  job = str(tmp_path / 'job')
  assert status.run(job) == 2 and 'does not exist' in capsys.readouterr().err
  (tmp_path / 'job').mkdir()
  assert status.run(job) == 0
  assert capsys.readouterr().out.splitlines() == [
      'newest committed checkpoint: none (the same command starts fresh)', 'last run: none recorded']
  for step in (0, 500, 731):
    fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), step))
  _run(job, ('start', {'restored_step': None}), ('preemption', {'step': 731, 'signal': 'SIGTERM'}),
       ('exit', {'code': 143, 'step': 731}))
  status.run(job)
  first, second = capsys.readouterr().out.splitlines()
  assert first == ('newest committed checkpoint: step 731, which the same command resumes from (3 committed: 0, '
                   '500, 731)')
  assert ', fresh): preempted (on-demand checkpoint committed) by SIGTERM at step 731, exit 143, ' in second
  _run(job, ('start', {'restored_step': 731}))
  status.run(job)
  assert 'from step 731): no exit recorded: still running, or killed' in capsys.readouterr().out


@pytest.mark.parametrize('code,words', [(0, 'finished'), (1, 'failed'), (2, 'stopped on bad configuration'),
                                        (130, 'stopped by Ctrl-C')])
def test_each_exit_code_reads_as_words(tmp_path, code, words):
  job = str(tmp_path / 'job')
  _run(job, ('start', {'restored_step': 5}), ('exit', {'code': code, 'step': 9}))
  assert f': {words} at step 9, exit {code}, ' in status.run_line(job)


def test_a_job_with_a_local_tier_says_its_newest_local_step_and_whether_a_restart_takes_it(tmp_path, capsys):
  job = str(tmp_path / 'job')
  fakes.write_checkpoint(layout.step_dir(layout.checkpoint_dir(job), 0))
  _run(job, ('start', {'restored_step': None}), ('local_committed', {'step': 300, 'duration_s': 0.02}))
  status.run(job)
  lines = capsys.readouterr().out.splitlines()
  assert lines[1].startswith('local tier: step 300 committed on host 0 at ') and lines[1].endswith(
      ', newer: the same command resumes from it where every host still holds its copy, or a replica does')
  _run(job, ('start', {'restored_step': 300, 'restored_from': 'local'}))
  status.run(job)
  assert 'from step 300 of the local tier): no exit recorded' in capsys.readouterr().out
