"""The local tier of one run, wired from its settings: what pax_autockpt.hook.checkpointer holds of it."""

import dataclasses

from absl import logging
import jax

from pax_autockpt import layout
from pax_autockpt import settings as settings_lib
from pax_autockpt.hosts import hosts as hosts_lib
from pax_autockpt.local import buddy
from pax_autockpt.local import lineage as lineage_lib
from pax_autockpt.local import restoring
from pax_autockpt.local import saving
from pax_autockpt.shared import coordination
from pax_autockpt.shared import events as events_lib


@dataclasses.dataclass(frozen=True)
class Tier:
  """The local tier of one run, wired: the job's identity, this run's lineage, the saves and the restore."""

  job: str
  lineage: lineage_lib.Tracker
  saves: saving.LocalSaves
  restore: restoring.LocalRestore


def wire(settings: settings_lib.Settings, events: events_lib.EventLog, slices: int) -> Tier:
  """The local tier's saves (with buddy copies where asked for and there is another host) and restore, for
  pax_autockpt.hook.checkpointer."""
  folder = layout.local_dir(settings.local_dir, events.host)
  job, run = lineage_lib.identify(events.job_log_dir, events.host)
  tracker = lineage_lib.Tracker(job, run)
  hosts, copies = jax.process_count(), None
  if settings.local_buddy and hosts > 1:
    copies = buddy.BuddyCopies(folder, host=events.host, hosts=hosts, slices=slices,
                               mb_per_sec=settings.local_buddy_mb_per_sec, nice=settings.background_nice,
                               address=hosts_lib.own_address(coordination.coordinator_address()),
                               port=settings.local_peer_port, job=job)
  elif settings.local_buddy:
    logging.warning('[autockpt] buddy copies: one host, no other disk to keep a copy on; none made.')
  saves = saving.LocalSaves(folder, min_interval_secs=settings.local_min_interval_secs, keep=settings.local_keep,
                            events=events, lineage=tracker, on_commit=copies and copies.committed,
                            buddy=copies is not None)
  return Tier(job, tracker, saves, restoring.LocalRestore(folder, host=events.host, hosts=hosts,
                                                          peer_port=settings.local_peer_port))
