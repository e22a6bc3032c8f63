"""What may reach the exactly-once apply script, checked and clamped in Python first
(docs/security.md "No single message breaks the apply").

Redis does not roll a Lua script back: a command that errors half-way leaves the writes before it
in place. So every value a message can influence is made safe before the script sees it, and the
script itself (agents/store/count_store.py) validates all its arguments before its first write:

- a Kafka record timestamp outside ``[-1, MAX_TIMESTAMP_MS]`` (-1: none; the upper end is the last
  millisecond of year 9999) refuses the message: ``ldp.dlq`` reason ``bad_timestamp``;
- quota windows are windows of the worker's clock, never of the producer's record timestamp
  (agents/store/quota.py), so a device cannot move its reports into windows of its choice;
- every expiry is clamped to ``[0, MAX_EXPIRE_MS]`` and a non-finite one dropped;
- ``sent_at`` is clamped by ``clamp_sent_at`` (agents/ingest/service.py) and a non-finite one dropped.
"""
from __future__ import annotations

import math
from typing import Protocol, Sequence, TypeVar

__all__ = ["MAX_TIMESTAMP_MS", "MAX_EXPIRE_MS", "BAD_TIMESTAMP", "timestamp_ok",
           "split_bad_timestamps", "expire_ms", "finite_or_none"]

#: the last millisecond of year 9999: later record timestamps are refused
MAX_TIMESTAMP_MS = 253_402_300_799_999
#: expiries (unix ms) are clamped to this: far inside Redis' range, and 15 digits at most
MAX_EXPIRE_MS = MAX_TIMESTAMP_MS
#: the ``ldp.dlq`` reason of a message whose record timestamp is out of range
BAD_TIMESTAMP = "bad_timestamp"



class _Record(Protocol):
    timestamp: int


M = TypeVar("M", bound=_Record)


def timestamp_ok(timestamp_ms: int | None) -> bool:
    """A Kafka record timestamp the worker accepts: none (-1 or None) or in
    ``[0, MAX_TIMESTAMP_MS]``."""
    return timestamp_ms is None or -1 <= int(timestamp_ms) <= MAX_TIMESTAMP_MS


def split_bad_timestamps(msgs: Sequence[M]) -> tuple[list[M], list[M]]:
    """(messages with an acceptable record timestamp, the others), each in order. One pass over
    the messages (not the reports)."""
    if all(timestamp_ok(m.timestamp) for m in msgs):
        return list(msgs), []
    good: list[M] = []
    bad: list[M] = []
    for m in msgs:
        (good if timestamp_ok(m.timestamp) else bad).append(m)
    return good, bad


def expire_ms(expire_at_s: float | None) -> str:
    """The ``PEXPIREAT`` argument of an expiry in unix seconds: '' for none (or a non-finite
    one), else the ceiling in ms clamped to ``[0, MAX_EXPIRE_MS]``."""
    if expire_at_s is None or not math.isfinite(expire_at_s):
        return ""
    return str(min(MAX_EXPIRE_MS, max(0, int(math.ceil(float(expire_at_s) * 1000.0)))))


def finite_or_none(value: float | None) -> float | None:
    """``value`` when it is a finite number, else None."""
    return None if value is None or not math.isfinite(value) else float(value)
