"""A background thread's Linux nice value: the job directory's saves (pax_autockpt.save.background_save) and the local
tier's buddy copies (pax_autockpt.local.buddy) yield the CPU to training; neither owns the rule.
"""

import os
import sys
import threading

from absl import logging


def lower_priority(nice: int) -> None:
  """The calling thread, and the threads it starts (they inherit it), at Linux nice `nice`: a routine
  save then takes the CPU time the training step leaves rather than half of it (two runnable threads
  share a core equally at the same nice; at 19 the save gets ~1.5% of a contended core). Linux only,
  where the value is per thread (elsewhere it would be the whole process's); an unprivileged thread can
  raise its nice value but never lower it again, so only a thread of its own is lowered."""
  if nice <= 0 or not sys.platform.startswith('linux'):
    return
  try:
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
  except OSError as e:
    logging.warning('[autockpt] could not lower the save thread\'s priority: %s', e)


def thread_nice() -> int | None:
  """The calling thread's Linux nice value (None elsewhere), for the `save_started` event."""
  if not sys.platform.startswith('linux'):
    return None
  return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
