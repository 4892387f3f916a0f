"""process.wait_until: what every end-to-end test, the soak and the benchmarks wait with."""

import sys

import pytest

from pax_autockpt.tools import process


def test_returns_the_first_truthy_value():
  answers = iter([None, 0, '', 'found'])
  assert process.wait_until(lambda: next(answers), 'an answer', timeout=5, every=0.01) == 'found'


def test_times_out_naming_what_it_waited_for():
  with pytest.raises(TimeoutError, match='^no the impossible after 0.05 s$'):
    process.wait_until(lambda: False, 'the impossible', timeout=0.05, every=0.01)


def test_a_job_that_exits_first_fails_at_once_with_its_log(tmp_path):
  job = process.Job([sys.executable, '-c', 'print("last words"); raise SystemExit(3)'], str(tmp_path / 'log'))
  job.wait(60)
  with pytest.raises(RuntimeError, match='(?s)^process exited 3 before a step; .*last words') as raised:
    process.wait_until(lambda: False, 'a step', timeout=60, job=job)
  assert 'after 60' not in str(raised.value)


def test_what_a_job_wrote_before_exiting_still_counts(tmp_path):
  job = process.Job([sys.executable, '-c', 'import time; time.sleep(1); print("exit 143")'],
                    str(tmp_path / 'log'))
  looks = []

  def cond():  # the first look misses the line, and the job exits right after it
    looks.append(1)
    if len(looks) == 1:
      job.wait(60)
      return False
    return 'exit 143' in job.log()

  assert process.wait_until(cond, 'the exit line', timeout=60, job=job)
  assert len(looks) == 2


def test_text_of_reads_from_a_byte_offset_and_is_empty_before_the_file_exists(tmp_path):
  path = tmp_path / 'host0.log'
  assert process.text_of(str(path)) == ''
  path.write_bytes('é first\nsecond\n'.encode())
  assert process.text_of(str(path), since=len('é first\n'.encode())) == 'second\n'
