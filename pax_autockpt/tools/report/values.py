"""Fields of untrusted event records read as Python types, and aggregates that skip what is missing.

Anyone could have written the event files: a field of the wrong type reads as None instead of
raising, so that one odd record costs one figure, never the whole report.
"""

from __future__ import annotations

import math
from typing import Any, Iterable


def number(v: Any) -> float | None:
  """A finite int or float as a float, else None (a bool is not a number here)."""
  if isinstance(v, bool) or not isinstance(v, (int, float)):
    return None
  v = float(v)
  return v if math.isfinite(v) else None


def duration(v: Any) -> float | None:
  """A finite number >= 0 as a float, else None: a negative time (a hand-edited log) would make a square root of
  the Young/Daly optimum fail, and reads as unknown instead."""
  v = number(v)
  return v if v is not None and v >= 0 else None


def integer(v: Any) -> int | None:
  """An int, or a float with an integral value, as an int, else None (steps may come as 1e3)."""
  if isinstance(v, bool):
    return None
  if isinstance(v, int):
    return v
  if isinstance(v, float) and math.isfinite(v) and v.is_integer():
    return int(v)
  return None


def string(v: Any) -> str | None:
  return v if isinstance(v, str) else None


def max_known(values: Iterable[Any]) -> Any:
  """The max of the values that are not None; None when none is known."""
  known = [v for v in values if v is not None]
  return max(known) if known else None


def percentile(sorted_values: list[float], q: float) -> float:
  """Linear interpolation between closest ranks (numpy.percentile's default), without numpy."""
  pos = (len(sorted_values) - 1) * q / 100.0
  lo = math.floor(pos)
  hi = min(lo + 1, len(sorted_values) - 1)
  return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def median(values: list[float]) -> float | None:
  return percentile(sorted(values), 50) if values else None


def weighted_percentile(pairs: list[tuple[float, int]], q: int) -> float:
  """`percentile` of the list that holds each value `weight` times (pairs sorted by value, weights >= 1), without
  making that list: an event that stands for 1e10 commits costs one pair, not 80 GB. Integer arithmetic, so that a
  weight past a float's range still places the rank exactly."""
  total = sum(w for _, w in pairs)
  lo, rest = divmod((total - 1) * q, 100)
  hi = min(lo + 1, total - 1)
  at_lo = at_hi = pairs[-1][0]
  seen = 0
  for v, w in pairs:
    if seen <= lo < seen + w:
      at_lo = v
    if seen <= hi < seen + w:
      at_hi = v
      break
    seen += w
  return at_lo + (at_hi - at_lo) * rest / 100
