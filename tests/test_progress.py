"""pax_autockpt.hook.progress: host 0's `progress` events, at most one per PROGRESS_SECS, none for start-up."""

from pax_autockpt.hook import progress
from pax_autockpt.shared import events as events_lib


def _marks(tmp_path, host, clock):
  return progress.ProgressMarks(events_lib.EventLog(tmp_path, host), clock=lambda: clock[0])


def test_one_mark_per_period_from_the_first_iteration(tmp_path):
  clock = [100.0]
  marks = _marks(tmp_path, 0, clock)
  for step in range(0, 200):  # an iteration every second for 200 s
    clock[0] = 100.0 + step
    marks.step(step)
  got = [(e['event'], e['step']) for e in events_lib.read(tmp_path, 0)]
  assert got == [('progress', 30), ('progress', 60), ('progress', 90), ('progress', 120), ('progress', 150),
                 ('progress', 180)]


def test_other_hosts_write_none(tmp_path):
  clock = [0.0]
  marks = _marks(tmp_path, 1, clock)
  for step in range(100):
    clock[0] = float(step)
    marks.step(step)
  assert events_lib.read(tmp_path, 1) == []
