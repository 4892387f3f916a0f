"""The `start` event's start-up fields (pax_autockpt.startup.startup_times): the process's own start, and the marks."""

import socket
import sys
import time

import pytest

from pax_autockpt.startup import startup_times


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='/proc: Linux only')
def test_the_process_start_is_before_now_and_after_the_boot():
  """pytest's process started long before this test: only the bounds are known, now and the boot."""
  started = startup_times.process_start_t()
  with open('/proc/uptime') as f:
    uptime = float(f.read().split()[0])
  now = time.time()
  assert started is not None
  assert now - uptime < started <= now


def test_the_fields_are_those_measured(monkeypatch):
  """imported_s counts from the process's start; distributed_s only between pax_autockpt.main's call of paxml's
  main and the experiment's validate (absent under stock paxml main, which marks neither); absent, not null."""
  monkeypatch.setattr(startup_times, '_marks', {})
  monkeypatch.setattr(startup_times, 'process_start_t', lambda: 1000.0)
  startup_times._marks.update({startup_times.IMPORTED: 1007.25, startup_times.VALIDATED: 1010.0})
  host = {'hostname': socket.gethostname()}
  assert startup_times.start_fields() == {**host, 'process_start_t': 1000.0, 'imported_s': 7.25}
  startup_times._marks.update({startup_times.JAX_SETUP: 1009.5})
  assert startup_times.start_fields()['distributed_s'] == pytest.approx(0.5)
  startup_times.mark(startup_times.JAX_SETUP)  # a second call is not the start-up's
  assert startup_times._marks[startup_times.JAX_SETUP] == 1009.5
  monkeypatch.setattr(startup_times, 'process_start_t', lambda: None)  # off Linux
  assert startup_times.start_fields() == {**host, 'distributed_s': pytest.approx(0.5)}
