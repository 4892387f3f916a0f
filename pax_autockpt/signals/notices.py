"""Maintenance and preemption notices from the metadata server, acted on before SIGTERM (CONTRACT §8).

On Google Cloud the metadata server announces what is coming: `instance/maintenance-event` changes
(e.g. to TERMINATE_ON_HOST_MAINTENANCE) about 60 s before host maintenance on VMs with accelerators —
only if the key has been read since the last event, so it is long-polled here without pause;
`instance/preempted` turns TRUE when a Spot VM is being reclaimed (~30 s before the end);
`instance/upcoming-maintenance` (JSON) describes scheduled windows, days ahead on Cloud TPU.

`MetadataWatcher` long-polls each key in its own daemon thread (never in the training thread) and
reports a `Notice`. `NoticeAgreement` makes every host save the same step for a notice any one host
saw, with the protocol XLA uses for preemptions: the notice goes into jax.distributed's key-value
store, every host's listener thread publishes its current step and meets the others at a barrier, and
the step after the largest is the agreed one; a training thread that knows of a notice waits (once) for
that answer, so no host can run past the agreed step.
"""

import atexit
import dataclasses
import datetime
import json
import os
import threading
import time
from typing import Callable
import urllib.error
import urllib.parse
import urllib.request

from absl import logging

from pax_autockpt.shared import coordination

KEYS = ('maintenance-event', 'preempted', 'upcoming-maintenance')
DEFAULT_HOST = 'metadata.google.internal'
_PROBE_TIMEOUT_S = 2.0
_POLL_TIMEOUT_S = 300  # the server answers a long poll after this many seconds even with no change
_KV_TIMEOUT_MS = 10 * 60 * 1000  # a peer that does not answer for 10 minutes is gone
_STOP = 'stop'  # in place of a notice: the job is ending


@dataclasses.dataclass(frozen=True)
class Notice:
  source: str  # one of KEYS
  value: str
  host: int  # the host whose metadata server said it


def is_notice(key: str, value: str | None) -> bool:
  """Whether a key's value announces something (as opposed to 'nothing scheduled')."""
  if value is None:
    return False
  if key == 'maintenance-event':
    return value.strip() not in ('', 'NONE')
  if key == 'preempted':
    return value.strip().upper() == 'TRUE'
  return bool(value.strip())  # upcoming-maintenance: a JSON description; 404 when none


class MetadataWatcher:
  """Long-polls the notice keys of the metadata server at `host` ("host:port" or a name)."""

  def __init__(self, host: str, on_notice: Callable[[str, str], None], *, required: bool):
    self._base = f'http://{host}/computeMetadata/v1/instance/'
    self._host = host
    self._on_notice = on_notice
    self._required = required  # 'on': not finding the server is worth a warning, not an info line
    self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # link-local: no proxy
    self._threads: list[threading.Thread] = []

  def start(self) -> None:
    """Returns at once: the probe and the polls run in daemon threads."""
    probe = threading.Thread(target=self._probe_then_watch, name='autockpt-notices', daemon=True)
    probe.start()
    self._threads.append(probe)

  def _get(self, key: str, etag: str | None, timeout: float) -> tuple[str | None, str | None]:
    """(value, etag); value None when the key is not set (404). A long poll when `etag` is given."""
    query = {} if etag is None else {'wait_for_change': 'true', 'last_etag': etag,
                                     'timeout_sec': str(_POLL_TIMEOUT_S)}
    url = self._base + key + (f'?{urllib.parse.urlencode(query)}' if query else '')
    request = urllib.request.Request(url, headers={'Metadata-Flavor': 'Google'})
    try:
      with self._opener.open(request, timeout=timeout) as resp:
        return resp.read().decode(), resp.headers.get('ETag')
    except urllib.error.HTTPError as e:
      if e.code == 404:
        return None, e.headers.get('ETag')
      raise

  def _probe_then_watch(self) -> None:
    try:
      self._get(KEYS[0], None, _PROBE_TIMEOUT_S)
    except Exception as e:  # pylint: disable=broad-except
      log = logging.warning if self._required else logging.info
      log('[autockpt] notices: no metadata server at %s (%s); not watching.', self._host,
          f'{type(e).__name__}: {e}'.splitlines()[0][:200])
      return
    logging.info('[autockpt] notices: watching %s on %s.', ', '.join(KEYS), self._host)
    for key in KEYS[1:]:
      thread = threading.Thread(target=self._watch, args=(key,), name=f'autockpt-notice-{key}', daemon=True)
      thread.start()
      self._threads.append(thread)
    self._watch(KEYS[0])

  def _watch(self, key: str) -> None:
    """Reads the key, then long-polls it for changes; each value that announces something, once."""
    etag, last, failures = None, None, 0
    while failures < 5:
      try:
        value, etag = self._get(key, etag, _POLL_TIMEOUT_S + 30)
        failures = 0
      except Exception as e:  # pylint: disable=broad-except
        failures += 1
        logging.warning('[autockpt] notices: reading %s failed (%s).', key, type(e).__name__)
        time.sleep(2.0 * failures)
        etag = None
        continue
      if is_notice(key, value) and value != last:
        self._on_notice(key, value)
      last = value
    logging.warning('[autockpt] notices: %s keeps failing; no longer watched.', key)


class NoticeAgreement:
  """The step every host saves for a notice. `announce` from any thread on any host; `due(step)`
  from the training loop on every host, once per step."""

  def __init__(self, host: int, client=None, num_hosts: int = 1):
    self._host = host
    self._client = client if num_hosts > 1 else None
    self._lock = threading.Lock()
    self._step = 0  # the loop's latest step on this host
    self._due: dict[int, Notice] = {}
    self._settled = threading.Event()  # cleared while an agreement is under way on this host
    self._settled.set()
    self._generation = 0
    self._closing = False
    self._listener: threading.Thread | None = None
    if self._client is not None:
      self._listener = threading.Thread(target=self._listen, name='autockpt-notice-agreement', daemon=True)
      self._listener.start()
      atexit.register(self.close)  # after jax.distributed's own shutdown hook, so it runs before it

  def close(self) -> None:
    """Stops this host's listener before jax.distributed shuts down: a thread still blocked in the
    client when the interpreter finalizes aborts the process. Wakes the listeners of every host (the
    job is ending: they all exit together, or abort after a peer's failure)."""
    if self._listener is None or not self._listener.is_alive():
      return
    self._closing = True
    # False: a notice or another host's stop is there already: it wakes the listener as well.
    coordination.claim(self._client, f'{coordination.NOTICES}{self._generation}', _STOP)
    self._listener.join(5)

  def announce(self, source: str, value: str) -> None:
    notice = Notice(source, value, self._host)
    if self._client is None:
      with self._lock:
        self._due.setdefault(self._step + 1, notice)
      return
    payload = json.dumps(dataclasses.asdict(notice))
    generation = self._generation
    while True:
      if coordination.claim(self._client, f'{coordination.NOTICES}{generation}', payload):
        return
      # That generation is taken: by the same notice from another host (then nothing to do), else next.
      taken = self._client.blocking_key_value_get(f'{coordination.NOTICES}{generation}', _KV_TIMEOUT_MS)
      if json.loads(taken)['source'] == source and json.loads(taken)['value'] == value:
        return
      generation += 1

  def due(self, step: int) -> Notice | None:
    """The notice whose save is due at `step`, if any; waits while an agreement is under way here."""
    with self._lock:
      self._step = step
    if not self._settled.wait(_KV_TIMEOUT_MS / 1000):
      raise TimeoutError('the hosts did not agree on a step for a notice within 10 minutes')
    with self._lock:
      due = [s for s in self._due if s <= step]  # every host passes the same steps: one answer
      return self._due.pop(min(due)) if due else None

  def _listen(self) -> None:
    """Each generation's notice: publish this host's step, meet every host, agree on max + 1.
    Ends when jax.distributed shuts down (the pending read is cancelled)."""
    while True:
      key = f'{coordination.NOTICES}{self._generation}'
      try:
        raw = self._client.blocking_key_value_get(key, _KV_TIMEOUT_MS)
      except Exception as e:  # pylint: disable=broad-except
        if 'DEADLINE_EXCEEDED' not in str(e):
          return  # cancelled (shutdown) or the service is gone: no more notices
        continue  # no notice within the timeout: keep listening
      if raw == _STOP or self._closing:
        return
      self._settled.clear()
      try:
        self._agree(key, raw)
      except Exception as e:  # pylint: disable=broad-except
        logging.error('[autockpt] notices: the hosts could not agree on a step (%s); notice dropped.',
                      f'{type(e).__name__}: {e}'.splitlines()[0][:200])
      self._generation += 1
      self._settled.set()

  def _agree(self, key: str, raw: str) -> None:
    with self._lock:
      mine = self._step
    self._client.key_value_set(f'{key}/step/{self._host}', str(mine))
    self._client.wait_at_barrier(f'{key}/barrier', _KV_TIMEOUT_MS)
    steps = [int(v) for _, v in self._client.key_value_dir_get(f'{key}/step/')]
    with self._lock:
      self._due[max(steps) + 1] = Notice(**json.loads(raw))


def watch(mode: str, announce: Callable[[str, str], None]) -> MetadataWatcher | None:
  """Starts watching per the `notices` setting ('auto', 'on', 'off'); never waits for the server."""
  if mode == 'off':
    logging.info('[autockpt] notices: off.')
    return None
  watcher = MetadataWatcher(os.environ.get('GCE_METADATA_HOST') or DEFAULT_HOST, announce,
                            required=mode == 'on')
  watcher.start()
  return watcher


def _window_start(value: str) -> float | None:
  """upcoming-maintenance's window start (unix seconds), when the JSON gives one."""
  try:
    info = json.loads(value)
    text = info.get('window_start_time') or info.get('windowStartTime')
    return datetime.datetime.fromisoformat(text.replace('Z', '+00:00')).timestamp() if text else None
  except (ValueError, TypeError, AttributeError):
    return None


def warn_if_window_is_too_close(notice: Notice, save_durations: list[float], now: float | None = None) -> bool:
  """For upcoming-maintenance: one warning line when the time left is less than a save takes here
  (the P90 of this job's committed saves). Returns whether it warned."""
  start = _window_start(notice.value) if notice.source == 'upcoming-maintenance' else None
  if start is None or not save_durations:
    return False
  ordered = sorted(save_durations)
  p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
  left = start - (time.time() if now is None else now)
  if left >= p90:
    return False
  logging.warning('[autockpt] notices: the maintenance window starts in %.0f s, but a save takes %.1f s '
                  '(P90 of %d): it may not fit.', left, p90, len(ordered))
  return True
