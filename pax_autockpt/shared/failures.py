"""What a failure to read a checkpoint means, decided before anything acts on it.

A restart that cannot read its newest checkpoint is where a user stands right after a preemption, and
the three causes call for opposite actions:
- DAMAGE: the checkpoint itself is broken (a chunk that does not decode, a file a committed checkpoint
  lists but lacks, metadata that does not parse, digests that do not match). Only this, positive
  evidence, sets a checkpoint aside; the next newest is restored instead.
- MISMATCH: the checkpoint is whole but does not fit this run (a changed model config, input state
  written by another number of hosts). Nothing is moved: the run exits 2 and the same checkpoint
  restores once the config is right.
- TRANSIENT: storage or network errors and resource exhaustion. Retried with backoff for a bounded
  time, then the run exits 1; nothing is moved.
Anything not recognised is UNKNOWN: exit 1 with one line, nothing moved, no retry (a guess either way
could lose a good checkpoint or loop forever).
"""

import enum
import errno
import json
import re
import time
from typing import Callable, TypeVar

from absl import logging

T = TypeVar('T')


class Damaged(ValueError):
  """A file of a committed checkpoint that is there but unreadable as what it must be (names the file)."""


class Kind(enum.Enum):
  DAMAGE = 'damage'
  MISMATCH = 'mismatch'
  TRANSIENT = 'transient'
  UNKNOWN = 'unknown'


# What every host does when hosts found different kinds for the same step: the most conservative
# action wins (a mismatch anywhere stops everyone before anything moves; damage anywhere is evidence).
PRECEDENCE = (Kind.MISMATCH, Kind.DAMAGE, Kind.UNKNOWN, Kind.TRANSIENT)

# TensorFlow's (tf.errors.<Name>Error) and Python's names for errors that a retry can cure.
_TRANSIENT_TYPES = {'UnavailableError', 'DeadlineExceededError', 'ResourceExhaustedError', 'AbortedError',
                    'CancelledError', 'ConnectionError', 'TimeoutError', 'MemoryError', 'URLError',
                    'RemoteDisconnected', 'IncompleteRead'}
_TRANSIENT_ERRNOS = {errno.EIO, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNREFUSED,
                     errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENOMEM, errno.ESTALE, errno.ECONNABORTED}
_TRANSIENT_TEXT = re.compile(r'\b(UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|ABORTED|CANCELLED)\b|'
                             r'HTTP response code:? (429|5\d\d)\b|[Cc]onnection (reset|refused|closed)|'
                             r'[Tt]imed? ?out|Out of memory|Cannot allocate memory')
# tensorstore's and orbax's words for bytes that are there but wrong, or missing from a whole checkpoint.
_DAMAGE_TEXT = re.compile(r'\b(DATA_LOSS|NOT_FOUND)\b|Truncated|Error decoding|Error parsing|[Cc]orrupt|'
                          r'checksum|Unexpected end of|Invalid (zstd|blosc|gzip)|JSONDecodeError')
_MISMATCH_TEXT = re.compile(r'PaxMetadata is not compatible|[Ss]hape mismatch|[Dd]oes not match the '
                            r'expected (shape|dtype)|[Uu]nexpected key|[Mm]issing key')


def classify(error: BaseException) -> Kind:
  """The kind of a failure, from the error and the errors it was raised from (orbax and tensorstore
  wrap the storage's own error)."""
  seen = []
  while error is not None and error not in seen and len(seen) < 8:
    seen.append(error)
    kind = _classify_one(error)
    if kind is not Kind.UNKNOWN:
      return kind
    error = error.__cause__ or error.__context__
  return Kind.UNKNOWN


def _classify_one(error: BaseException) -> Kind:
  names = {t.__name__ for t in type(error).__mro__}
  code = getattr(error, 'code', None)
  if 'HTTPError' in names and isinstance(code, int) and code < 500 and code != 429:
    return Kind.UNKNOWN  # a 4xx answer: a retry gets the same
  if isinstance(error, (Damaged, json.JSONDecodeError, FileNotFoundError)):
    return Kind.DAMAGE  # a file of a committed checkpoint that does not parse, or is not there
  if names & _TRANSIENT_TYPES or getattr(error, 'errno', None) in _TRANSIENT_ERRNOS:
    return Kind.TRANSIENT
  text = str(error)
  if _TRANSIENT_TEXT.search(text):
    return Kind.TRANSIENT  # before damage: "UNAVAILABLE: Error reading ..." is the storage, not the bytes
  if _DAMAGE_TEXT.search(text):
    return Kind.DAMAGE
  if _MISMATCH_TEXT.search(text):
    return Kind.MISMATCH
  return Kind.UNKNOWN


def backoff(budget_secs: float, first: float = 1.0, longest: float = 30.0) -> list[float]:
  """The pauses before each retry: doubling from `first` up to `longest`, adding up to at least
  `budget_secs`. A function of the budget alone, so every host retries the same number of times and
  meets the others at each try."""
  pauses, total, pause = [], 0.0, first
  while total < budget_secs:
    pause = min(pause, budget_secs - total)
    pauses.append(pause)
    total += pause
    pause = min(2 * pause, longest)
  return pauses


def retrying_transient(call: Callable[[], T], what: str, budget_secs: float) -> T:
  """`call()`, retried on TRANSIENT errors along `backoff(budget_secs)`; the last error is raised.
  For one host's own reads (a directory listing), where no other host waits on each try."""
  for pause in [*backoff(budget_secs), None]:
    try:
      return call()
    except Exception as e:  # pylint: disable=broad-except
      if pause is None or classify(e) is not Kind.TRANSIENT:
        raise
      logging.warning('[autockpt] %s failed (%s); retrying in %.0f s.', what, one_line(e), pause)
      time.sleep(pause)
  raise AssertionError('unreachable')


def one_line(error: BaseException, limit: int = 300) -> str:
  """An error as one line of at most `limit` characters: its type and the first line of its message."""
  text = f'{type(error).__name__}: {error}'.splitlines()[0]
  return text if len(text) <= limit else text[:limit - 3] + '...'
