"""Estimates that count devices, not reports, for memoized collections (docs/privacy-over-time.md,
"Memoized collections count devices").

A device that memoizes [RAPPOR §3] sends the same permanent response again and again: its
thousandth report adds no information about its record. So for a collection whose mechanism
memoizes (``Mechanism.memoization() is not None``) the worker counts each device once, at its
*latest* report: a new report of a device *moves* its contribution, subtracting its previous
report from the bucket it was counted in (fine, coarse and all-time tensors) and adding the new
one. Every window that ends now then holds each device that reported in it exactly once, and
the count tables, their totals, the error bounds and the drift variances all count devices.

The state of one partition in the worker's clock epoch ``e = floor(now / L)`` (``L`` = the
collection's bucket retention, 2 × the longest window + one bucket; one day when only ``all`` is
kept) is a :class:`DeviceTable`: the devices' ids, sorted, and one int32 row each (version,
fine bucket + 1 (0: all-time only), report width, report values). Every step is an array
operation: the latest report of each device of a run is found by ``np.unique``, its previous
row by ``np.searchsorted``. In Redis the table is a binary log, the string
``memo:<layout>:<e>`` of the shard: each apply appends the rows it changes (little-endian: a
header (width, rows), the devices' ids (u64), their rows (i32)), in the same Lua apply
that adds the counts and moves the offset, so exactly-once holds for it too. When the log holds
more than 1.5 times the table's rows (plus :data:`COMPACT_MIN`), the apply replaces it by the
table.
An entry is looked up in the epochs ``e`` and ``e - 1``; when an epoch's table leaves that pair,
the devices it alone holds are carried into the previous epoch's table as all-time only
(:func:`carry`; the row's bucket column then holds ``-(epoch of its last report)``), so the
all-time tensor counts each device once however long it is silent, **within the collection's
retention**: a device whose last report is ``device_retention_s`` or more old at a roll is
*evicted* instead (its row subtracted from the all-time tensor and dropped). The rows carried,
the evictions and the emptying of the expired tables' logs go into Redis with the partition's
next apply, all in one Lua call, so a worker that dies before it re-derives the same roll from
the logs, and one that dies after it finds the old logs empty. A log expires ``min(K + 3, 8)``
epochs after its own (agents/ingest/memo_gate.py ``MemoGate._kept``). The state therefore holds the
devices active within the retention (plus up to one epoch), bounded by ``device_state_max`` as a guard.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from ldpstream.windows import BucketPolicy

__all__ = ["PREFIX", "side_name", "epoch_length", "epoch_of", "DeviceTable", "Moves",
           "LogWrite", "latest_per_device", "last_of", "encode_log", "parse_log", "META",
           "COMPACT_MIN", "carry", "log_chunks", "CODES", "row_bytes", "value_code", "encode_rows",
           "decode_rows", "chunk_size", "roll", "stack_rows", "retention_epochs", "group_rows",
           "distinct"]

PREFIX = "memo:"
#: columns of a row before its report values: version, fine bucket + 1, report width
META = 3
#: superseded rows a log may hold beyond half its table's before an apply rewrites it
COMPACT_MIN = 1024
#: new devices a table keeps aside before merging them into its sorted main arrays
MERGE_MIN = 1 << 16
_I8, _U8, _I4 = np.dtype("<i8"), np.dtype("<u8"), np.dtype("<i4")
#: a table's rows in memory: 4 bytes a cell, as in the log (a version above 2**31 - 1 wraps:
#: :func:`group_rows` reads it back unsigned)
ROW = np.int32


def side_name(epoch: int, layout_id: str) -> str:
    """The side key of the devices' latest reports written in epoch ``epoch`` under the count
    layout ``layout_id`` (agents/store/layout.py): a config whose marginals change counts into new
    keys, and its devices start afresh there too."""
    return f"{PREFIX}{layout_id}:{int(epoch)}"


def epoch_length(policy: BucketPolicy) -> float:
    """How long a device's entry is kept at least: the buckets' retention (one day if none)."""
    return policy.state_epoch_s()


def retention_epochs(retention_s: float, policy: BucketPolicy) -> int:
    """``K``: at the roll into epoch ``e`` a device last seen in an epoch below ``e - K`` has
    been silent at least ``retention_s`` and is evicted (so it leaves between ``retention_s``
    and ``retention_s`` + 2 epochs after its last report)."""
    return max(1, math.ceil(retention_s / epoch_length(policy) - 1e-9))


def epoch_of(now: float, policy: BucketPolicy) -> int:
    return int(math.floor(now / epoch_length(policy)))


def distinct(values: np.ndarray) -> np.ndarray:
    """The distinct ``values``, sorted: one sort (none when already sorted) and a mask.
    ``np.unique`` of numpy 2.3+ takes ~20 times as long for the integer arrays of a poll
    (docs/scaling.md "Per-device state")."""
    if values.size > 1 and not bool((values[1:] >= values[:-1]).all()):
        values = np.sort(values)
    if values.size < 2:
        return values.copy()
    keep = np.empty(values.size, dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def last_of(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``ids`` (sorted) and the index of each one's last occurrence."""
    u, rev = np.unique(ids[::-1], return_index=True)
    return u, ids.size - 1 - rev


def _pad(rows: np.ndarray, cols: int) -> np.ndarray:
    """``rows`` with zero columns appended up to ``cols`` columns."""
    if rows.shape[1] >= cols:
        return rows
    return np.pad(rows, ((0, 0), (0, cols - rows.shape[1])))


def stack_rows(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Rows of several widths as one array (narrower ones padded); (0, META) if none."""
    if not parts:
        return np.empty((0, META), dtype=np.int64)
    cols = max(p.shape[1] for p in parts)
    return np.concatenate([_pad(p, cols) for p in parts])


class DeviceTable:
    """The latest report of each device of one partition in one epoch: ``ids`` sorted (uint64),
    ``rows[i]`` = (version, fine bucket + 1, report width, report values padded with 0);
    ``logged``: rows of its log in Redis, superseded ones included.

    New devices go to a small sorted side table, merged into the main one once it holds more
    than an eighth of it (:data:`MERGE_MIN` at least): a poll's new devices cost a copy of the
    side table, not of the whole table (amortized: 8 row copies per new device)."""

    def __init__(self, ids: np.ndarray | None = None, rows: np.ndarray | None = None,
                 logged: int = 0) -> None:
        self._ids = np.empty(0, dtype=np.uint64) if ids is None else ids
        self._rows = np.empty((0, META), dtype=ROW) if rows is None else \
            rows.astype(ROW, copy=False)
        self._new_ids = np.empty(0, dtype=np.uint64)
        self._new_rows = np.empty((0, self._rows.shape[1]), dtype=ROW)
        self.logged = logged
        #: rows set by :func:`carry` that its log does not hold yet (written with the next delta)
        self.unlogged: list[tuple[np.ndarray, np.ndarray]] = []
        #: rows of devices :func:`carry` evicted: the next delta subtracts them from all-time
        self.evicted: list[np.ndarray] = []
        #: epochs whose logs the next delta empties (their devices carried here or evicted)
        self.cleared: list[int] = []

    @property
    def ids(self) -> np.ndarray:
        self._merge()
        return self._ids

    @property
    def rows(self) -> np.ndarray:
        self._merge()
        return self._rows

    @property
    def nbytes(self) -> int:
        """Bytes of its arrays (the worker's memory per device: docs/privacy-over-time.md)."""
        return int(self._ids.nbytes + self._rows.nbytes + self._new_ids.nbytes
                   + self._new_rows.nbytes)

    def __len__(self) -> int:
        return int(self._ids.size + self._new_ids.size)

    @staticmethod
    def _search(table: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not table.size:
            return np.zeros(ids.size, dtype=bool), np.zeros(ids.size, dtype=np.intp)
        idx = np.minimum(np.searchsorted(table, ids), table.size - 1)
        return table[idx] == ids, idx

    def count_between(self, lo: int, hi: int) -> int:
        """How many devices of the table have an id in ``[lo, hi)`` (two binary searches per
        sorted part; no merge)."""
        out = 0
        for t in (self._ids, self._new_ids):
            start = int(np.searchsorted(t, np.uint64(lo)))
            # hi may be 2**64 (the last fleet tag): everything from lo on
            end = t.size if hi > np.iinfo(np.uint64).max else int(np.searchsorted(t, np.uint64(hi)))
            out += end - start
        return out

    def holds(self, ids: np.ndarray) -> np.ndarray:
        """Whether the table holds each of ``ids``."""
        return self._search(self._ids, ids)[0] | self._search(self._new_ids, ids)[0]

    def _outside(self, ids: np.ndarray) -> bool:
        """Whether every one of ``ids`` lies beyond the range of ids held (nothing to search)."""
        if not len(self) or not ids.size:
            return True
        lo = min(int(t[0]) for t in (self._ids, self._new_ids) if t.size)
        hi = max(int(t[-1]) for t in (self._ids, self._new_ids) if t.size)
        return int(ids.min()) > hi or int(ids.max()) < lo

    def lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether the table holds each of ``ids``, and the rows of those it holds (in order)."""
        if self._outside(ids):   # e.g. positions past every row this delta rewrote so far
            return (np.zeros(ids.size, dtype=bool),
                    np.empty((0, max(self._rows.shape[1], self._new_rows.shape[1])), dtype=ROW))
        fm, im = self._search(self._ids, ids)
        fd, idd = self._search(self._new_ids, ids)
        cols = max(self._rows.shape[1], self._new_rows.shape[1])
        if not (fm.any() or fd.any()):
            return fm, np.empty((0, cols), dtype=ROW)
        out = np.zeros((ids.size, cols), dtype=ROW)
        out[fm, :self._rows.shape[1]] = self._rows[im[fm]]
        out[fd, :self._new_rows.shape[1]] = self._new_rows[idd[fd]]
        found = fm | fd
        return found, out[found]

    def upsert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Set the rows of the sorted distinct ``ids`` (new devices inserted in order)."""
        cols = max(rows.shape[1], self._rows.shape[1], self._new_rows.shape[1])
        self._rows, self._new_rows = _pad(self._rows, cols), _pad(self._new_rows, cols)
        rows = _pad(rows, cols)
        fm, im = self._search(self._ids, ids)
        self._rows[im[fm]] = rows[fm]
        rest = np.flatnonzero(~fm)
        fd, idd = self._search(self._new_ids, ids[rest])
        self._new_rows[idd[fd]] = rows[rest[fd]]
        new = rest[~fd]
        if new.size:
            self._new_ids, self._new_rows = _insert_sorted(self._new_ids, self._new_rows,
                                                           ids[new], rows[new])
            if self._new_ids.size > max(MERGE_MIN, self._ids.size // 8):
                self._merge()

    def _merge(self) -> None:
        if not self._new_ids.size:
            return
        self._ids, self._rows = _insert_sorted(self._ids, self._rows, self._new_ids,
                                               self._new_rows)
        self._new_ids = np.empty(0, dtype=np.uint64)
        self._new_rows = np.empty((0, self._rows.shape[1]), dtype=ROW)


def _insert_sorted(ids: np.ndarray, rows: np.ndarray, new_ids: np.ndarray,
                   new_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted ``ids`` (and their rows) with the sorted ``new_ids``, none held, put in order:
    appended when all of them come after the last one (devices, or positions, arriving in
    order), else inserted."""
    if not ids.size or int(new_ids[0]) > int(ids[-1]):
        return (np.concatenate([ids, new_ids.astype(ids.dtype, copy=False)]),
                np.concatenate([rows, new_rows.astype(rows.dtype, copy=False)]))
    at = np.searchsorted(ids, new_ids)
    return np.insert(ids, at, new_ids), np.insert(rows, at, new_rows, axis=0)


def last_seen(rows: np.ndarray, epoch: int) -> np.ndarray:
    """The epoch of each row's last report, for rows of the table of ``epoch``: a carried row
    holds it as ``-bucket column``, any other row was reported in ``epoch``."""
    col = rows[:, 1]
    return np.where(col < 0, -col, int(epoch))


class Holder(Protocol):
    def holds(self, ids: np.ndarray) -> np.ndarray: ...


class Receiver(Holder, Protocol):
    """What :func:`carry` carries into: a :class:`DeviceTable`, or the worker's epoch log
    (agents/ingest/memo_gate.py)."""

    unlogged: list
    evicted: list
    cleared: list

    def upsert(self, ids: np.ndarray, rows: np.ndarray) -> None: ...


def carry(old: Sequence[tuple[int, DeviceTable]], into: Receiver, newer: Holder,
          keep_from: int) -> None:
    """Keep the devices of expiring tables (``old``: (epoch, table), newest first) that neither
    ``into`` nor ``newer`` holds and whose last report is in epoch ``keep_from`` or later: their
    rows move into ``into`` as all-time only (bucket column ``-last epoch``; their fine and
    coarse buckets have expired), so a device back after a silence replaces its report in the
    all-time tensor instead of being counted twice there. The others are evicted: their rows
    wait in ``into.evicted`` for the next delta, which subtracts them from the all-time counts
    and empties the expired tables' logs (``into.cleared``)."""
    seen = np.empty(0, dtype=np.uint64)
    for epoch, t in old:
        if t.logged or len(t):
            into.cleared.append(int(epoch))
        into.evicted += t.evicted        # left by an earlier roll without a delta since
        into.cleared += t.cleared
        fresh = ~np.isin(t.ids, seen, assume_unique=True) if seen.size else \
            np.ones(len(t), dtype=bool)   # a device in two expiring tables: the newer one's row
        seen = np.union1d(seen, t.ids)
        keep = fresh & ~into.holds(t.ids) & ~newer.holds(t.ids)
        if not keep.any():
            continue
        ids, rows = t.ids[keep], t.rows[keep].copy()
        ls = last_seen(rows, epoch)
        rows[:, 1] = -ls          # all-time only from now on (its buckets have expired)
        gone = ls < keep_from
        if gone.any():
            into.evicted.append(rows[gone])
        ids, rows = ids[~gone], rows[~gone]
        if ids.size:
            into.upsert(ids, rows)
            into.unlogged.append((ids, rows))
def roll(memo: dict[int, DeviceTable], epoch: int, keep_from: int) -> dict[int, DeviceTable]:
    """The tables of ``epoch - 1`` and ``epoch``, the devices of older ones carried into the
    former as all-time only, those last seen before epoch ``keep_from`` evicted (:func:`carry`)."""
    into = memo.get(epoch - 1, DeviceTable())
    cur = memo.get(epoch, DeviceTable())
    carry([(e, memo[e]) for e in sorted(memo, reverse=True) if e < epoch - 1], into, cur,
          keep_from)
    return {epoch - 1: into, epoch: cur}


def encode_log(ids: np.ndarray, rows: np.ndarray) -> bytes:
    """One log chunk: a header (report width, rows) of two int64 words, the devices' ids (u64),
    then their rows (i32; codec values, versions and buckets fit), padded to whole words."""
    body = np.ascontiguousarray(rows, dtype=_I4).tobytes()
    head = np.array([rows.shape[1] - META, ids.size], dtype=_I8).tobytes()
    return head + ids.astype(_U8).tobytes() + body + b"\0" * (-len(body) % 8)


#: the report values' encodings of a chunk (the high 32 bits of its header's width word): 0 the
#: 4-byte integers of the format before, 1 2-byte, 2 1-byte unsigned; the three metadata columns
#: stay 4-byte, a row is padded to whole 4-byte words
CODES = (np.dtype("<i4"), np.dtype("<i2"), np.dtype("u1"))
#: each code's rank by the values it holds (u1 within i2 within i4)
CODE_RANK = (2, 1, 0)


def row_bytes(width: int, code: int) -> int:
    """Bytes of one row of ``width`` report values encoded as ``code``."""
    return 4 * META + -(-width * CODES[code].itemsize // 4) * 4


def value_code(values: np.ndarray) -> int:
    """The narrowest code holding every one of ``values``."""
    if not values.size:
        return 2
    lo, hi = int(values.min()), int(values.max())
    return 2 if lo >= 0 and hi <= 255 else 1 if lo >= -(1 << 15) and hi < (1 << 15) else 0


def encode_rows(rows: np.ndarray, code: int, out: np.ndarray | None = None) -> np.ndarray:
    """Rows (version, bucket + 1, width, values) as an ``(n, row_bytes)`` uint8 matrix (into
    ``out`` if given); the values must fit ``code``."""
    n, cols = rows.shape
    size = row_bytes(cols - META, code)
    if out is None:
        out = np.zeros((n, size), dtype=np.uint8)
    if code == 0:
        out.view(_I4)[:, :cols] = rows
        return out
    out[:, :4 * META].view(_I4)[:] = rows[:, :META]
    dt = CODES[code]
    out[:, 4 * META:4 * META + (cols - META) * dt.itemsize].view(dt)[:] = rows[:, META:]
    return out


def decode_rows(raw: np.ndarray, width: int, code: int) -> np.ndarray:
    """The int32 rows of an ``(n, row_bytes)`` uint8 matrix of ``code``."""
    if code == 0:
        return raw.view(_I4)[:, :META + width]
    rows = np.empty((raw.shape[0], META + width), dtype=ROW)
    rows[:, :META] = raw[:, :4 * META].view(_I4)
    dt = CODES[code]
    rows[:, META:] = raw[:, 4 * META:4 * META + width * dt.itemsize].view(dt)
    return rows


def chunk_size(n: int, width: int, code: int) -> int:
    """Bytes of a chunk of ``n`` rows: header, ids, rows, padding to whole 8-byte words."""
    body = n * row_bytes(width, code)
    return 16 + 8 * n + body + body % 8


def log_chunks(data: bytes, with_offsets: bool = False, rows_too: bool = True) -> list:
    """The chunks of a log, in order: (ids, rows) each, or (byte offset, ids, rows, code) with
    ``with_offsets`` (rows as int32 whatever their code; without ``rows_too`` an empty array
    of the rows' shape: an index needs only the ids); ValueError when it is not a log."""
    if len(data) % 8:
        raise ValueError(f"device state of {len(data)} bytes is not a log of int64 words")
    out: list = []
    pos = 0
    while pos < len(data):   # one step per apply that wrote it, not per device
        if pos + 16 > len(data):
            raise ValueError("device state log ends inside a chunk header")
        word, n = np.frombuffer(data, dtype=_I8, count=2, offset=pos).tolist()
        width, code = word & 0xFFFFFFFF, word >> 32
        if code not in (0, 1, 2) or n < 0:
            raise ValueError(f"corrupt device state log chunk (header {word}, rows {n})")
        size = row_bytes(width, code)
        end = pos + chunk_size(n, width, code)
        if end > len(data):
            raise ValueError(f"corrupt device state log chunk (width {width}, rows {n})")
        ids = np.frombuffer(data, dtype=_U8, count=n, offset=pos + 16)
        if rows_too:
            raw = np.frombuffer(data, dtype=np.uint8, count=n * size,
                                offset=pos + 16 + 8 * n).reshape(n, size)
            rows = decode_rows(raw, width, code)
        else:
            rows = np.empty((n, META + width), dtype=ROW)   # never touched: not resident
        out.append((pos, ids, rows, code) if with_offsets else (ids, rows))
        pos = end
    return out


def parse_log(data: bytes | None) -> DeviceTable:
    """The table a log holds (each device's last row); ValueError when it is not a log."""
    if not data:
        return DeviceTable()
    chunks = log_chunks(data)
    ids = [c[0] for c in chunks]
    rows = [c[1] for c in chunks]
    if len(ids) == 1 and bool((ids[0][1:] > ids[0][:-1]).all()):
        # one chunk of sorted distinct devices (a rewritten log): one copy, no sort
        return DeviceTable(ids[0].astype(np.uint64), rows[0].astype(ROW), logged=ids[0].size)
    all_ids, all_rows = np.concatenate(ids), stack_rows(rows)
    u, keep = last_of(all_ids)
    return DeviceTable(u, all_rows[keep].astype(ROW), logged=int(all_ids.size))


@dataclass
class LogWrite:
    """What one delta writes to an epoch's log: appended chunks, or (``replace``) the whole
    table followed by later chunks (none: the log is emptied); the key expires at
    ``expire_at`` (unix s)."""

    expire_at: float
    replace: bool = False
    chunks: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def clear(self) -> None:
        """Empty the log (its devices were carried into a newer one or evicted)."""
        self.replace, self.chunks = True, []

    def writes(self) -> bool:
        return bool(self.chunks) or self.replace

    def record(self, table: DeviceTable, ids: np.ndarray, rows: np.ndarray) -> None:
        """Log the rows just set in ``table``; rewrite the log when it holds too many
        superseded rows (more than half the table's, plus COMPACT_MIN)."""
        table.logged += int(ids.size)
        if table.logged > len(table) + len(table) // 2 + COMPACT_MIN:
            self.replace, self.chunks = True, [(table.ids.copy(), table.rows.copy())]
            table.logged = len(table)
        else:
            self.chunks.append((ids, rows))

    def payload(self) -> bytes:
        """The chunks as one log chunk (a device set twice: its last row)."""
        if not self.chunks:
            return b""
        if len(self.chunks) == 1:
            ids, rows = self.chunks[0]
        else:
            all_ids = np.concatenate([c[0] for c in self.chunks])
            ids, keep = last_of(all_ids)
            rows = stack_rows([c[1] for c in self.chunks])[keep]
        return encode_log(ids, rows)


@dataclass
class Moves:
    """What one run of reports (one version) changes: ``keep`` indexes the reports counted (the
    latest of each device, in device order), ``ids`` those devices (sorted) and ``rows`` their
    new rows, ``old`` the rows of the previous reports they supersede, ``evicted`` the rows of
    devices silent beyond the retention the same delta subtracts (:func:`carry`)."""

    keep: np.ndarray
    ids: np.ndarray
    rows: np.ndarray
    old: np.ndarray
    evicted: np.ndarray = field(default_factory=lambda: np.empty((0, META), dtype=np.int64))

    def removed_rows(self) -> dict[tuple[int, int], np.ndarray]:
        """The superseded reports per (version, fine bucket or -1) (:func:`group_rows`)."""
        return group_rows(self.old)


def group_rows(rows: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """Rows as their reports per (version, fine bucket or -1 for all-time only) as ``(k, width)``
    arrays: one group per distinct pair, not per device."""
    if not rows.shape[0]:
        return {}
    b1 = np.maximum(rows[:, 1].astype(np.int64), 0)   # carried rows (< 0): all-time only
    span = int(b1.max()) + 1                # (version, bucket + 1) as one int64 key
    version = rows[:, 0].astype(np.int64) & 0xFFFFFFFF
    keys = version * span + b1
    groups = distinct(keys)   # a few (version, bucket) pairs: one mask each
    out: dict[tuple[int, int], np.ndarray] = {}
    for key in groups.tolist():
        sel = rows if groups.size == 1 else rows[keys == key]
        out[(key // span, key % span - 1)] = sel[:, META:META + int(sel[0, 2])]
    return out


def latest_per_device(device_ids: np.ndarray, reports: np.ndarray, buckets: np.ndarray,
                      version: int, tables: Sequence[DeviceTable]) -> Moves:
    """The latest report of each device among ``reports`` (in order) and the previous row it
    supersedes, looked up in ``tables`` (the first that holds the device: this epoch's, then
    the one before). Array operations only: no Python step per report or device."""
    ids = np.asarray(device_ids, dtype=np.uint64)
    u, keep = last_of(ids)
    width = int(reports.shape[1])
    rows = np.empty((u.size, META + width), dtype=np.int64)
    rows[:, 0] = int(version)
    rows[:, 1] = np.broadcast_to(buckets, ids.shape)[keep] + 1
    rows[:, 2] = width
    rows[:, META:] = reports[keep]
    todo = np.ones(u.size, dtype=bool)
    old = []
    for t in tables:
        if not len(t) or not todo.any():
            continue
        ask = np.flatnonzero(todo)
        found, prev = t.lookup(u[ask])
        old.append(prev)
        todo[ask[found]] = False
    return Moves(keep, u, rows, stack_rows(old))
