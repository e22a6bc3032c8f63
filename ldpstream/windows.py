"""Time buckets and windows (docs/windows.md): pure functions of the clock, no I/O.

A report batch is counted in the *fine bucket* of its Kafka record timestamp
(``floor(t / bucket_s)``), in the *coarse bucket* that contains it (``COARSE_FACTOR`` fine buckets)
and in the all-time tensor. The record timestamp is stored in the log, so a replayed message lands
in the same bucket as the first time.

A window of ``W`` seconds at time ``now`` is the ``k = W / bucket_s`` newest fine buckets
(the current, partial one included); the *previous* window is the ``k`` buckets before those. A
range of fine buckets is read as the coarse buckets that lie wholly inside it plus the fine buckets
at its two edges (:func:`cover`), so a 24 h window at 60 s buckets costs at most 23 coarse + 118
fine reads instead of 1,440.

Rules for timestamps (applied by the ingest service, counted in ``ldp_reports_clamped_total``):

- *future*: a record stamped more than :data:`FUTURE_TOLERANCE_S` ahead of the worker's clock is
  counted in the current bucket (its timestamp is clamped to now);
- *late*: a record whose fine bucket has already expired (older than the retention) is counted in
  the all-time tensor only.

Fine and coarse buckets expire :func:`retention_s` after their end: twice the longest window (drift
compares a window with the previous one) plus one fine bucket of slack.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["COARSE_FACTOR", "FUTURE_TOLERANCE_S", "Window",
           "parse_window", "BucketPolicy", "cover"]

COARSE_FACTOR = 60            # fine buckets per coarse bucket
FUTURE_TOLERANCE_S = 120.0    # clock skew accepted before a timestamp is clamped to now
ALL = "all"

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_WINDOW_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd])$")


@dataclass(frozen=True)
class Window:
    """A named window: ``seconds`` is None for ``all``."""

    name: str
    seconds: float | None

    @property
    def is_all(self) -> bool:
        return self.seconds is None


def parse_window(text: str) -> Window:
    """``"5m"`` → Window("5m", 300.0); ``"all"`` → Window("all", None). Raises ValueError."""
    if not isinstance(text, str):
        raise ValueError(f"a window is a duration like 5m, 1h, 24h, 7d or 'all' (got {text!r})")
    t = text.strip()
    if t == ALL:
        return Window(ALL, None)
    m = _WINDOW_RE.match(t)
    if m is None:
        raise ValueError(f"a window is a duration like 30s, 5m, 1h, 7d or 'all' (got {text!r})")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not seconds > 0:
        raise ValueError(f"a window must be longer than 0 s (got {text!r})")
    return Window(t, seconds)


@dataclass(frozen=True)
class BucketPolicy:
    """How one collection buckets time: fine bucket width and the windows it serves."""

    bucket_s: float
    windows: tuple[Window, ...]

    def __post_init__(self) -> None:
        if not (self.bucket_s > 0 and math.isfinite(self.bucket_s)):
            raise ValueError(f"bucket_s must be a finite number > 0 (got {self.bucket_s})")
        for w in self.windows:
            if w.seconds is not None and not _multiple(w.seconds, self.bucket_s):
                raise ValueError(f"window {w.name} is not a whole number of buckets of "
                                 f"{self.bucket_s:g} s")

    @property
    def coarse_s(self) -> float:
        return COARSE_FACTOR * self.bucket_s

    @property
    def longest_s(self) -> float | None:
        """The longest finite window (None when only ``all`` is kept: no buckets at all)."""
        finite = [w.seconds for w in self.windows if w.seconds is not None]
        return max(finite) if finite else None

    @property
    def bucketed(self) -> bool:
        return self.longest_s is not None

    def retention_s(self) -> float:
        """How long a bucket is kept after its end: 2 × the longest window + one fine bucket."""
        longest = self.longest_s
        return 0.0 if longest is None else 2.0 * longest + self.bucket_s

    def state_epoch_s(self) -> float:
        """The epoch of a memoized collection's per-device state (docs/privacy-over-time.md,
        "Memory"): the buckets' retention, one day when only ``all`` is kept."""
        return self.retention_s() if self.bucketed else 86_400.0

    def fine_bucket(self, t: float) -> int:
        return int(math.floor(t / self.bucket_s))

    def buckets_in(self, window: Window) -> int:
        assert window.seconds is not None
        return int(round(window.seconds / self.bucket_s))

    def fine_expire_at(self, bucket: int) -> float:
        return (bucket + 1) * self.bucket_s + self.retention_s()

    def coarse_expire_at(self, coarse: int) -> float:
        return (coarse + 1) * self.coarse_s + self.retention_s()

    def place(self, t: float, now: float) -> tuple[int | None, str | None]:
        """The fine bucket a record stamped ``t`` is counted in at wall time ``now`` and why it
        was moved: ``(bucket, None)``; ``(now's bucket, "future")`` when stamped too far ahead;
        ``(None, "late")`` when its bucket has expired (all-time only). Without finite windows:
        ``(None, None)`` (only the all-time tensor is kept)."""
        if not self.bucketed:
            return None, None
        if t > now + FUTURE_TOLERANCE_S:
            return self.fine_bucket(now), "future"
        b = self.fine_bucket(t)
        if self.fine_expire_at(b) <= now:
            return None, "late"
        return b, None

    def place_many(self, t: np.ndarray, now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorized :meth:`place`: fine bucket per timestamp (-1: all-time only) and the masks
        of the timestamps clamped as future and moved as late."""
        t = np.asarray(t, dtype=np.float64)
        if not self.bucketed:
            none = np.zeros(t.shape, dtype=bool)
            return np.full(t.shape, -1, dtype=np.int64), none, none
        future = t > now + FUTURE_TOLERANCE_S
        b = np.floor(np.where(future, now, t) / self.bucket_s).astype(np.int64)
        late = (b + 1) * self.bucket_s + self.retention_s() <= now
        b[late] = -1
        return b, future, late

    def ranges(self, window: Window, now: float) -> tuple[tuple[int, int], tuple[int, int]]:
        """Fine-bucket ranges (inclusive) of ``window`` at ``now`` and of the previous,
        non-overlapping window of the same length."""
        k = self.buckets_in(window)
        end = self.fine_bucket(now)
        return (end - k + 1, end), (end - 2 * k + 1, end - k)


def cover(first: int, last: int, factor: int = COARSE_FACTOR) -> tuple[list[int], list[int]]:
    """Fine buckets ``first..last`` (inclusive) as (fine buckets, coarse buckets): the coarse
    buckets wholly inside the range, the fine ones at its edges. Their union is exactly the range.

    >>> cover(55, 130, 60)
    ([55, 56, 57, 58, 59, 120, 121, 122, 123, 124, 125, 126, 127, 128, 129, 130], [1])
    """
    if last < first:
        return [], []
    c0 = -(-first // factor)          # first coarse bucket starting at or after ``first``
    c1 = (last + 1) // factor - 1     # last coarse bucket ending at or before ``last``
    if c1 < c0:
        return list(range(first, last + 1)), []
    fine = list(range(first, c0 * factor)) + list(range((c1 + 1) * factor, last + 1))
    return fine, list(range(c0, c1 + 1))


def _multiple(x: float, unit: float) -> bool:
    q = x / unit
    return abs(q - round(q)) < 1e-9 and round(q) >= 1


def window_names(windows: Sequence[Window]) -> list[str]:
    return [w.name for w in windows]
