"""Which Kafka log a stored offset belongs to, and what to do when the log is not that one.

The offsets in Redis say "counted up to offset s of partition p". When the broker loses its log
(a broker with in-memory storage restarts, a topic is deleted and recreated, an unclean leader
election truncates it), the new log's offsets start again at 0, and a worker that trusts ``s``
skips every new record up to ``s`` as already counted — silently (measured: 55,800 of 60,000
reports dropped with ``/healthz`` ok and lag 0).

So each partition's offsets hash also keeps a **log mark**: ``"<offset>:<timestamp ms>:<crc32 of
the value>"`` of one record counted from that log (the first one counted). The worker checks the
log against the mark and the stored offset ``s`` when it is assigned the partition, when a fetch
position is out of range (the consumer never resets silently: ``auto_offset_reset="none"``), and
when the log's end falls below ``s + 1`` on a lag check. :func:`judge` decides, from the log's
start and end offsets and the record now at the mark's offset:

==================  =========================================================  ====================
verdict             evidence                                                   rule: continue after
==================  =========================================================  ====================
``recreated``       the record at the mark's offset differs, or the log is     ``start - 1``: the
                    shorter than ``s`` and the mark's record is gone           new log is counted
                                                                               from its start
``truncated``       the mark's record is intact but the log ends at or below   ``end - 1``: records
                    ``s`` (lost tail)                                          still there were
                                                                               counted
``retention_gap``   the log starts after ``s + 1``: records were deleted       ``start - 1``: they
                    before they were counted                                   are lost, reported
``None`` (intact)   otherwise                                                  ``s``
==================  =========================================================  ====================

Nothing is ever skipped silently: a verdict re-bases the stored offset by compare-and-set
(:meth:`~.store.CountStore.rebase_log`; counts already in Redis stay, they were real reports) and
is reported in ``ldp_log_resets_total{collection,kind}``, ``/healthz`` (``checks.log``) and the
``LogReset`` alert. After ``truncated``, records appended between the truncation and its
detection (the worker checks every second while it runs) are past ``end - 1`` and counted; a
truncation below the mark's record cannot be told from a recreation and is handled as one.
"""
from __future__ import annotations

import dataclasses
import zlib
from typing import Any

__all__ = ["LogMark", "Verdict", "mark_of", "judge", "KINDS"]

KINDS = ("recreated", "truncated", "retention_gap")


@dataclasses.dataclass(frozen=True)
class LogMark:
    """One record of a log: its offset, timestamp (ms) and the CRC-32 of its value."""

    offset: int
    timestamp: int
    crc: int

    def __str__(self) -> str:
        return f"{self.offset}:{self.timestamp}:{self.crc}"

    @classmethod
    def parse(cls, text: str) -> "LogMark":
        off, ts, crc = text.split(":")
        return cls(int(off), int(ts), int(crc))


def mark_of(record: Any) -> LogMark:
    """The mark of an aiokafka ``ConsumerRecord``."""
    value = record.value if record.value is not None else b""
    return LogMark(int(record.offset), int(record.timestamp if record.timestamp is not None else -1),
                   zlib.crc32(value))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What :func:`judge` found: ``kind`` (None: intact) and the offset to continue after
    (``position``; None: nothing counted from this log yet)."""

    kind: str | None
    position: int | None
    detail: str


def judge(stored: int | None, mark: LogMark | None, start: int, end: int,
          found: LogMark | None) -> Verdict:
    """The verdict for a partition whose stored offset is ``stored`` and log mark ``mark``; the
    log now holds offsets ``[start, end)`` and ``found`` is the record now at ``mark.offset``
    (None: absent, or no mark). Pure."""
    if stored is None:
        return Verdict(None, None, "nothing counted yet")
    below = None if start == 0 else start - 1
    if mark is not None and start <= mark.offset < end:
        if found != mark:
            return Verdict("recreated", below,
                           f"record {mark.offset} is {found} now, was {mark}: a new log")
        if end <= stored:
            return Verdict("truncated", end - 1 if end > 0 else None,
                           f"log ends at {end}, {stored - end + 1} counted record(s) are gone")
    elif end <= stored:
        if mark is not None:
            return Verdict("recreated", below,
                           f"log [{start}, {end}) is shorter than the {stored + 1} record(s) "
                           f"counted and record {mark.offset} is gone: a new log")
        return Verdict("truncated", end - 1 if end > 0 else None,
                       f"log ends at {end} (no mark to tell a new log): {stored - end + 1} "
                       f"counted record(s) are gone")
    if start > stored + 1:
        return Verdict("retention_gap", start - 1,
                       f"records {stored + 1}..{start - 1} were deleted before being counted")
    return Verdict(None, stored, "intact")
