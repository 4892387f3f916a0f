"""What `pax-autockpt launch` recorded of a job (`JOB_LOG_DIR/autockpt/launch.jsonl`, `tools.launch_events`): its
restarts, each with its reason and the backoff it waited, shown beside the `restarts:` line of the report (the
hosts' event logs say that a run started again, not that the launcher restarted it nor how long it waited)."""

from __future__ import annotations

from typing import Any

from pax_autockpt.tools import launch_events
from pax_autockpt.tools.report import values


def restarts(job_log_dir: str) -> list[dict[str, Any]]:
  """The launcher's restarts: {restart, max_restarts, reason, backoff_s, t}; [] when it recorded none (or the
  record cannot be read: the rest of the report does not depend on it)."""
  try:
    records = launch_events.read(job_log_dir)
  except OSError:
    return []
  return [{'restart': values.integer(r.get('restart')), 'max_restarts': values.integer(r.get('max_restarts')),
           'reason': values.string(r.get('reason')), 'backoff_s': values.number(r.get('backoff_s')), 't': r['t']}
          for r in records if r['event'] == 'restart']


def line(found: list[dict[str, Any]]) -> str | None:
  """`launch restarts: N of at most M, backoff 2.0 s + 4.0 s = 6.0 s in all; the last after <reason>`."""
  if not found:
    return None
  waits = [r['backoff_s'] for r in found if r['backoff_s'] is not None]
  shown = [f'{w:.1f} s' for w in waits]
  if len(shown) > 6:
    shown = shown[:3] + ['...'] + shown[-2:]
  total = f'{sum(waits):.1f} s in all'
  backoff = f'{" + ".join(shown)} = {total}' if len(waits) > 1 else total
  most = found[-1]['max_restarts']
  of = f' of at most {most}' if most is not None else ''
  return (f'launch restarts: {len(found)}{of}, backoff {backoff}; the last after '
          f'{found[-1]["reason"] or "an unrecorded reason"}')


def with_line(text: str, job_log_dir: str) -> str:
  """The report's text with the launcher's line after its `restarts:` line (at the end if it has none)."""
  said = line(restarts(job_log_dir))
  if said is None:
    return text
  lines = text.split('\n')
  at = next((i + 1 for i, x in enumerate(lines) if x.startswith('restarts: ')), len(lines))
  return '\n'.join(lines[:at] + [said] + lines[at:])
