"""The device state of a memoized collection with Redis as its state of record: the worker keeps
an *index* (each device's id, the position of its row in Redis and the row packed in 32 bits when
it fits, 16 bytes), never the rows themselves (docs/scaling.md "Per-device state"; the rule
itself is agents/store/device_memo.py).

An epoch's log (``memo:<layout>:<e>``) is split into **segments**, string keys of at most
:data:`SEG_MAX` bytes (``memo:<layout>:<e>`` itself, then ``...:s1``, ``...:s2``, ...), each a
sequence of the chunks of :func:`~ldpstream.agents.store.device_memo.encode_log` whose rows all
have one width. A row never moves: a new device's row is appended to the last segment (a new
segment once it holds :data:`SEG_FILL` bytes, so an ``APPEND`` copies at most a few MB, never
the whole log); a device's next report in the same epoch *overwrites* its row in place
(``SETRANGE``, with the counts in the same Lua apply). So the log holds one row per device and
needs no compaction, and ``parse_log`` of its segments in order still gives each device's
latest row (a row rewritten wider is appended and the older one is never read again).

A position is ``segment << SEG_BITS | word offset`` (uint32). A row to subtract is taken from the
index when it is packed there (:class:`RowPacker`), else read back from Redis by position when
the delta that supersedes it is flushed (:class:`LogPending` ``fetch``; one read-only script call
per segment), except the rows this same delta wrote, which it holds in memory until it is
applied. Flushes are sequential, so what is read is what the
deltas before left, and the compare-and-set of the apply makes the read and the write one step
for exactly-once: a delta whose partition moved on meanwhile is refused and re-read.
"""
from __future__ import annotations

import dataclasses
import struct
from typing import Sequence

import numpy as np

from ldpstream.agents.store.device_memo import (
    CODES,
    META,
    ROW,
    DeviceTable,
    chunk_size,
    decode_rows,
    distinct,
    encode_rows,
    last_of,
    log_chunks,
    row_bytes,
    stack_rows,
    value_code,
)

__all__ = ["SEG_BITS", "SEG_MAX", "SEG_FILL", "STAGE_MIN", "MAX_SEGMENTS", "UNKNOWN", "segment_name",
           "DeviceIndex", "RowPacker", "EpochLog", "LogPending", "index_segments",
           "table_of_segments", "encode_segments", "patch_blob"]

#: bits of a position's word offset: a segment holds at most 2**SEG_BITS words (4 MiB)
SEG_BITS = 20
SEG_MAX = 4 << SEG_BITS
#: segments of one epoch's log (positions are uint32)
MAX_SEGMENTS = 1 << (32 - SEG_BITS)
#: a segment holds at most this many bytes (an APPEND copies at most about this much when Redis
#: grows the string)
SEG_FILL = 2 << 20
#: the cost of one row read or rewritten in Lua, and of one byte of a segment moved whole (ns;
#: measured here: :meth:`LogPending.dense`)
ROW_NS, BYTE_NS = 2500, 4
#: rows appended by one delta to a segment it starts, from this many bytes on, are not passed
#: through the Lua apply (which copies every byte of its arguments, ~5 ns a byte) but written to
#: a staging key beforehand and RENAMEd into place by the apply (agents/store/scripts.py ``<``,
#: ``>``): so a delta of new devices starts a segment of its own
STAGE_MIN = 256 << 10
_U4 = np.dtype("<u4")
#: a row's packed form when the row does not fit 32 bits or is not known (:class:`RowPacker`)
UNKNOWN = 0xFFFFFFFF
_LOW = np.uint64(0xFFFFFFFF)
_HIGH = np.uint64(32)


@dataclasses.dataclass(frozen=True)
class RowPacker:
    """A row of one epoch's log as one uint32, exactly (mixed radix: version, bucket column
    relative to the epoch's first bucket, report values), or :data:`UNKNOWN` when it does not fit
    (docs/scaling.md "Per-device state"): the index keeps it beside each device's position, so a
    device reporting again is compared with, and its previous row subtracted from, what the worker
    holds, without reading Redis. ``bounds``: each report value's exclusive bound (the
    mechanism's ``report_bounds``); ``span``: the epoch's buckets (``epoch_s / bucket_s``)."""

    bounds: tuple[int, ...]
    span: float
    #: bucket column slots: 0 (all-time only), then the epoch's fine buckets from 1
    slots: int
    #: versions packed (0 .. versions - 1)
    versions: int

    @classmethod
    def of(cls, bounds: Sequence[int], epoch_s: float, bucket_s: float) -> "RowPacker | None":
        """The packer of a collection's rows, None when even one version does not fit."""
        slots = int(np.ceil(epoch_s / bucket_s)) + 2
        cells = slots * int(np.prod([int(b) for b in bounds], dtype=object))
        if cells >= UNKNOWN:
            return None
        return cls(tuple(int(b) for b in bounds), epoch_s / bucket_s, slots,
                   min(UNKNOWN // cells, 1 << 16))

    def _base(self, epoch: int) -> int:
        return int(np.floor(epoch * self.span))

    def pack(self, rows: np.ndarray, epoch: int) -> np.ndarray:
        """Each row's code (uint32; :data:`UNKNOWN` where it does not fit)."""
        if rows.shape[1] != META + len(self.bounds) or not rows.shape[0]:
            return np.full(rows.shape[0], UNKNOWN, dtype=np.uint32)
        out = self.pack_values(rows[:, META:], rows[:, 0], rows[:, 1], epoch)
        out[rows[:, 2] != len(self.bounds)] = UNKNOWN
        return out

    def pack_values(self, values: np.ndarray, version: np.ndarray | int,
                    bucket: np.ndarray | int, epoch: int) -> np.ndarray:
        """:meth:`pack` of rows given as their report ``values`` (``(n, width)``), ``version``
        and bucket column (each an array or one value for all): two passes over the values when
        all fit (a matrix product and a column-wise bound check), a mask only when some do not."""
        n, width = values.shape
        if width != len(self.bounds):
            return np.full(n, UNKNOWN, dtype=np.uint32)
        col = np.asarray(bucket, dtype=np.int64)
        slot = np.where(col == 0, 0, col - self._base(epoch))
        ver = np.asarray(version, dtype=np.int64)
        ok = ((col == 0) | (slot >= 1)) & (slot < self.slots) & (ver >= 0) & (ver < self.versions)
        bounds = np.asarray(self.bounds, dtype=np.int64)
        weights = np.cumprod(np.concatenate(([1], bounds[::-1])))[::-1]   # radix of each field
        # a float64 product is exact below 2**53 (the codes are below 2**32) and uses BLAS
        code = (values.astype(np.float64) @ weights[1:].astype(np.float64)).astype(np.int64) \
            + (ver * self.slots + slot) * weights[0]
        if values.dtype.kind in "iu":   # negatives viewed unsigned are beyond every bound
            raw = values.view(np.dtype(f"u{values.dtype.itemsize}"))
            top = np.array([min(b - 1, int(np.iinfo(raw.dtype).max)) for b in self.bounds],
                           dtype=raw.dtype)
            fits = bool((raw <= top).all())
        else:
            fits = False
        if not fits:
            ok = ok & (values >= 0).all(axis=1) & (values < bounds).all(axis=1)
        out = np.where(ok, code, UNKNOWN).astype(np.uint32)
        return np.broadcast_to(out, (n,)).copy() if out.shape != (n,) else out

    def unpack(self, codes: np.ndarray, epoch: int) -> np.ndarray:
        """The rows of known ``codes`` (the inverse of :meth:`pack`)."""
        width = len(self.bounds)
        rows = np.empty((codes.size, META + width), dtype=ROW)
        rest = codes.astype(np.int64)
        for j in range(width - 1, -1, -1):
            rest, rows[:, META + j] = np.divmod(rest, self.bounds[j])
        version, slot = np.divmod(rest, self.slots)
        rows[:, 0] = version
        rows[:, 1] = np.where(slot == 0, 0, slot + self._base(epoch))
        rows[:, 2] = width
        return rows


def segment_name(name: str, seg: int) -> str:
    """The side key name of segment ``seg`` of the log ``name`` (segment 0: the log's own name,
    the key a log of one segment always had)."""
    return name if seg == 0 else f"{name}:s{int(seg)}"


def _search(table: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if not table.size:
        return np.zeros(keys.size, dtype=bool), np.zeros(keys.size, dtype=np.intp)
    idx = np.minimum(np.searchsorted(table, keys), table.size - 1)
    return table[idx] == keys, idx


def _rows_at(words: np.ndarray, off: np.ndarray, size: int,
             put: np.ndarray | None = None) -> np.ndarray:
    """The rows of ``size`` bytes at byte offsets ``off`` (multiples of 4) of a segment viewed as
    4-byte ``words``: one gather of ``(n, size / 4)`` words through a sliding window (no per-byte
    index array); with ``put``, those rows are overwritten by ``put`` instead (returned)."""
    k = size // 4
    win = np.lib.stride_tricks.sliding_window_view(words, k, writeable=put is not None)
    at = (off.astype(np.int64) >> 2)
    if put is None:
        return win[at]
    win[at] = put
    return put


def _merge_sorted(a: np.ndarray, ap: np.ndarray, b: np.ndarray,
                  bp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two sorted disjoint id arrays (with their positions) as one."""
    at = np.searchsorted(a, b) + np.arange(b.size)
    ids = np.empty(a.size + b.size, dtype=a.dtype)
    pos = np.empty(a.size + b.size, dtype=ap.dtype)
    rest = np.ones(ids.size, dtype=bool)
    rest[at] = False
    ids[at], pos[at] = b, bp
    ids[rest], pos[rest] = a, ap
    return ids, pos


class DeviceIndex:
    """The devices of one partition's epoch log: ``ids`` sorted (uint64) and, in one uint64
    entry, the position of each one's row in Redis (low 32 bits) and the row packed
    (:class:`RowPacker`; high 32 bits, :data:`UNKNOWN` if not known): 16 bytes a device. Devices
    beyond the highest id held are appended in place (the arrays keep spare capacity, never
    touched so never resident); others go to a small sorted side part, merged into the main one
    once it holds an eighth of it (as :class:`~ldpstream.agents.store.device_memo.DeviceTable`)."""

    MERGE_MIN = 1 << 16

    def __init__(self, ids: np.ndarray | None = None, pos: np.ndarray | None = None,
                 codes: np.ndarray | None = None) -> None:
        self._ids = np.empty(0, dtype=np.uint64) if ids is None else ids.astype(np.uint64,
                                                                                 copy=False)
        self._pos = np.empty(0, dtype=np.uint64) if pos is None else \
            _entry(pos, np.full(pos.size, UNKNOWN, dtype=np.uint32) if codes is None else codes)
        self._n = self._ids.size
        self._new_ids = np.empty(0, dtype=np.uint64)
        self._new_pos = np.empty(0, dtype=np.uint64)

    def __len__(self) -> int:
        return int(self._n + self._new_ids.size)

    @property
    def nbytes(self) -> int:
        """Bytes of its entries (16 a device; spare capacity is not resident)."""
        return 16 * len(self)

    @property
    def ids(self) -> np.ndarray:
        self._merge()
        return self._ids[:self._n]

    @property
    def pos(self) -> np.ndarray:
        self._merge()
        return (self._pos[:self._n] & _LOW).astype(np.uint32)

    def _max(self) -> int:
        top = int(self._ids[self._n - 1]) if self._n else -1
        return max(top, int(self._new_ids[-1])) if self._new_ids.size else top

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether the index holds each of ``ids`` and its row's position (0 where not)."""
        found, pos, _ = self.find_codes(ids)
        return found, pos

    def find_codes(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`find`, and each row's code (:class:`RowPacker`; :data:`UNKNOWN` where not)."""
        out = np.full(ids.size, np.uint64(UNKNOWN) << _HIGH, dtype=np.uint64)
        if not len(self) or not ids.size or int(ids.min()) > self._max():
            return np.zeros(ids.size, dtype=bool), (out & _LOW).astype(np.uint32), \
                (out >> _HIGH).astype(np.uint32)
        fm, im = _search(self._ids[:self._n], ids)
        out[fm] = self._pos[im[fm]]
        if self._new_ids.size:
            fd, idd = _search(self._new_ids, ids)
            out[fd] = self._new_pos[idd[fd]]
            fm |= fd
        return fm, (out & _LOW).astype(np.uint32), (out >> _HIGH).astype(np.uint32)

    def holds(self, ids: np.ndarray) -> np.ndarray:
        return self.find(ids)[0]

    def count_between(self, lo: int, hi: int) -> int:
        """Devices with an id in ``[lo, hi)`` (``hi`` may be 2**64)."""
        out = 0
        for t in (self._ids[:self._n], self._new_ids):
            start = int(np.searchsorted(t, np.uint64(lo)))
            end = t.size if hi > np.iinfo(np.uint64).max else int(np.searchsorted(t, np.uint64(hi)))
            out += end - start
        return out

    def _append(self, ids: np.ndarray, pos: np.ndarray) -> None:
        need = self._n + ids.size
        if need > self._ids.size:
            cap = max(need, 2 * self._ids.size + 1024)   # spare pages are never touched
            grown_ids = np.empty(cap, dtype=np.uint64)
            grown_pos = np.empty(cap, dtype=np.uint64)
            grown_ids[:self._n] = self._ids[:self._n]
            grown_pos[:self._n] = self._pos[:self._n]
            self._ids, self._pos = grown_ids, grown_pos
        self._ids[self._n:need] = ids
        self._pos[self._n:need] = pos
        self._n = need

    def upsert(self, ids: np.ndarray, pos: np.ndarray, codes: np.ndarray | None = None) -> None:
        """Set the positions (and row codes, :data:`UNKNOWN` if None) of the sorted distinct
        ``ids`` (new ones inserted in order)."""
        pos = _entry(pos, np.full(pos.size, UNKNOWN, dtype=np.uint32) if codes is None
                     else codes)
        if not ids.size:
            return
        if int(ids[0]) > self._max():   # all new and beyond every id held: appended
            self._append(ids, pos)
            return
        fm, im = _search(self._ids[:self._n], ids)
        self._pos[im[fm]] = pos[fm]
        rest = np.flatnonzero(~fm)
        if not rest.size:
            return
        fd, idd = _search(self._new_ids, ids[rest])
        self._new_pos[idd[fd]] = pos[rest[fd]]
        new = rest[~fd]
        if new.size:
            if not self._n or int(ids[new[0]]) > int(self._ids[self._n - 1]):
                self._append(ids[new], pos[new])   # beyond the main part: no side entry needed
                return
            self._new_ids, self._new_pos = _merge_sorted(self._new_ids, self._new_pos,
                                                         ids[new], pos[new])
            if self._new_ids.size > max(self.MERGE_MIN, self._n // 8):
                self._merge()

    def _merge(self) -> None:
        if not self._new_ids.size:
            return
        self._ids, self._pos = _merge_sorted(self._ids[:self._n], self._pos[:self._n],
                                             self._new_ids, self._new_pos)
        self._n = self._ids.size
        self._new_ids = np.empty(0, dtype=np.uint64)
        self._new_pos = np.empty(0, dtype=np.uint64)


def _entry(pos: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Positions and row codes as :class:`DeviceIndex` entries (uint64)."""
    return pos.astype(np.uint64) | (codes.astype(np.uint64) << _HIGH)


@dataclasses.dataclass
class Chunk:
    """Rows appended to a segment by one delta (or a roll): ``rows[i]`` (int32 in memory,
    written with the segment's value ``code``) is at position ``first + i * stride``; the rows
    stay writable until the delta is applied."""

    seg: int
    first: int
    stride: int
    ids: np.ndarray
    rows: np.ndarray
    code: int = 0

    def encode(self) -> bytes:
        buf = bytearray(chunk_size(self.rows.shape[0], self.rows.shape[1] - META, self.code))
        self.write(buf, 0)
        return bytes(buf)

    def write(self, buf: bytearray | np.ndarray, at: int) -> int:
        """Write the chunk into ``buf`` at byte ``at`` (one copy of each array, every byte
        written: ``buf`` may be uninitialized); returns the byte after it."""
        n, cols = self.rows.shape
        width = cols - META
        size = row_bytes(width, self.code)
        end = at + chunk_size(n, width, self.code)
        np.frombuffer(buf, dtype="<i8", count=2, offset=at)[:] = (width | self.code << 32, n)
        np.frombuffer(buf, dtype="<u8", count=n, offset=at + 16)[:] = self.ids
        body = at + 16 + 8 * n
        out = np.frombuffer(buf, dtype=np.uint8, count=n * size, offset=body).reshape(n, size)
        used = 4 * META + width * CODES[self.code].itemsize
        if used < size:
            out[:, used:] = 0
        encode_rows(self.rows, self.code, out)
        np.frombuffer(buf, dtype=np.uint8, count=end - body - n * size, offset=body + n * size)[:] = 0
        return end


@dataclasses.dataclass
class EpochLog:
    """One partition's log of one epoch: where its segments end (bytes, pending appends
    included) and the row width of each (-1: mixed, rows never rewritten in place there), and
    the index of its devices. ``unlogged``, ``evicted``, ``cleared``: what a roll left for the
    next delta (rows carried into this log, rows of evicted devices to subtract, the expired
    logs to delete: (name, segments))."""

    name: str
    expire_at: float
    index: DeviceIndex = dataclasses.field(default_factory=DeviceIndex)
    seg_len: list[int] = dataclasses.field(default_factory=list)
    seg_width: list[int] = dataclasses.field(default_factory=list)
    #: the value code of each segment's rows (agents/store/device_memo.py ``CODES``)
    seg_code: list[int] = dataclasses.field(default_factory=list)
    unlogged: list[Chunk] = dataclasses.field(default_factory=list)
    evicted: list[np.ndarray] = dataclasses.field(default_factory=list)
    cleared: list[tuple[str, int]] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.index)

    def tail(self) -> int:
        """The position of the next byte appended (every row written so far is below it)."""
        if not self.seg_len:
            return 0
        return ((len(self.seg_len) - 1) << SEG_BITS) | (self.seg_len[-1] >> 2)

    def slots(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The width (-1: unknown) and value code the rows at ``pos`` were written with."""
        seg = (pos >> SEG_BITS).astype(np.intp)
        return (np.asarray(self.seg_width, dtype=np.int64)[seg],
                np.asarray(self.seg_code, dtype=np.int64)[seg])

    def place(self, ids: np.ndarray, rows: np.ndarray, fresh_from: int | None = None,
              code: int | None = None) -> tuple[list[Chunk], np.ndarray]:
        """Append ``rows`` of ``ids`` (one width), their values in the narrowest code that holds
        them: the chunks and each row's position (a chunk per at most SEG_FILL bytes; a new
        segment when the width or code changes, the last one is full, or a chunk of STAGE_MIN
        bytes or more would go to a segment that starts before ``fresh_from``, the position
        where the delta's own rows start). ``code``: one known to hold the values."""
        n, cols = rows.shape
        width = cols - META
        if code is None:
            code = value_code(rows[:, META:])
        rb = row_bytes(width, code)
        per = max(1, (SEG_FILL - 16) // (8 + rb))
        pos = np.empty(n, dtype=np.uint32)
        chunks = []
        for start in range(0, n, per):   # one step per chunk of up to SEG_FILL bytes
            k = min(per, n - start)
            size = chunk_size(k, width, code)
            if not self.seg_len or self.seg_width[-1] != width or self.seg_code[-1] != code or \
                    (self.seg_len[-1] and self.seg_len[-1] + size > SEG_FILL) or \
                    (self.seg_len[-1] and size >= STAGE_MIN and fresh_from is not None
                     and ((len(self.seg_len) - 1) << SEG_BITS) < fresh_from):
                if len(self.seg_len) >= MAX_SEGMENTS:
                    raise ValueError(f"device state log {self.name} would need more than "
                                     f"{MAX_SEGMENTS} segments")
                self.seg_len.append(0)
                self.seg_width.append(width)
                self.seg_code.append(code)
            seg, off = len(self.seg_len) - 1, self.seg_len[-1]
            first = (seg << SEG_BITS) | ((off + 16 + 8 * k) >> 2)
            pos[start:start + k] = first + (rb // 4) * np.arange(k, dtype=np.uint32)
            chunks.append(Chunk(seg, first, rb // 4, ids[start:start + k],
                                np.asarray(rows[start:start + k], dtype=ROW), code))
            self.seg_len[-1] = off + size
        return chunks, pos


@dataclasses.dataclass
class LogPending:
    """What one delta writes to one epoch's log and reads back from it: rows appended at
    positions from ``start`` on (``chunks``), rows rewritten in place (``inplace``: a table keyed
    by position), the positions of applied rows it supersedes (``fetch``, read and subtracted
    when the delta is flushed; their widths in ``fetch_width`` by segment) and whether the log is
    deleted (``clear``: its segments)."""

    name: str
    expire_at: float
    start: int
    chunks: list[Chunk] = dataclasses.field(default_factory=list)
    inplace: DeviceTable = dataclasses.field(default_factory=DeviceTable)
    fetch: list[np.ndarray] = dataclasses.field(default_factory=list)
    #: segment -> (width, value code) of its rows read back / rewritten in place
    fetch_width: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
    write_width: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
    clear: int = 0
    #: segments finished (a newer one started): trimmed by the apply
    trim: set[int] = dataclasses.field(default_factory=set)
    #: segment -> its bytes when last seen (to weigh reading it whole against row by row)
    seg_bytes: dict[int, int] = dataclasses.field(default_factory=dict)
    #: segment -> its whole new content (:meth:`rebuild`): written instead of its patch
    replaced: dict[int, memoryview] = dataclasses.field(default_factory=dict)

    def _in_chunks(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        firsts = np.array([c.first for c in self.chunks], dtype=np.int64)
        ci = np.searchsorted(firsts, pos.astype(np.int64), side="right") - 1
        return ci, pos.astype(np.int64) - firsts[np.maximum(ci, 0)]

    def rows_at(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which of ``pos`` this delta holds in memory (it wrote them) and their rows."""
        mem = np.zeros(pos.size, dtype=bool)
        parts: list[np.ndarray] = []
        idx: list[np.ndarray] = []
        app = pos >= self.start
        if app.any() and self.chunks:
            at = np.flatnonzero(app)
            ci, rel = self._in_chunks(pos[at])
            for c in distinct(ci).tolist():   # one step per chunk, not per row
                sel = ci == c
                ch = self.chunks[c]
                parts.append(ch.rows[rel[sel] // ch.stride])
                idx.append(at[sel])
            mem[at] = True
        rest = np.flatnonzero(~app)
        if rest.size and len(self.inplace):
            found, rows = self.inplace.lookup(pos[rest].astype(np.uint64))
            if found.any():
                parts.append(rows)
                idx.append(rest[found])
                mem[rest[found]] = True
        if not parts:
            return mem, np.empty((0, META), dtype=ROW)
        order = np.argsort(np.concatenate(idx), kind="stable")
        return mem, stack_rows(parts)[order]

    def write_at(self, pos: np.ndarray, rows: np.ndarray, widths: np.ndarray) -> None:
        """Rewrite the rows at ``pos`` (each fits its slot of ``widths[i]`` report values)."""
        app = pos >= self.start
        if app.any():
            at = np.flatnonzero(app)
            ci, rel = self._in_chunks(pos[at])
            for c in distinct(ci).tolist():
                sel = ci == c
                ch = self.chunks[c]
                r = rows[at[sel]]
                ch.rows[rel[sel] // ch.stride] = 0
                ch.rows[rel[sel] // ch.stride, :r.shape[1]] = r
        rest = np.flatnonzero(~app)
        if rest.size:
            every = rest.size == pos.size
            p = pos.astype(np.uint64) if every else pos[rest].astype(np.uint64)
            r = rows if every else rows[rest]
            cols = META + int(widths.max() if every else widths[rest].max())
            if cols > r.shape[1]:
                r = np.pad(r, ((0, 0), (0, cols - r.shape[1])))
            if p.size > 1 and not bool((p[1:] > p[:-1]).all()):   # in order: no sort
                order = np.argsort(p)
                p, r = p[order], r[order]
            self.inplace.upsert(p, r.astype(ROW, copy=False))

    @staticmethod
    def _by_seg(pos: np.ndarray, widths: np.ndarray, codes: np.ndarray,
                into: dict[int, tuple[int, int]]) -> None:
        if pos.size:   # one row of each segment (a segment's rows share its width and code)
            seg = pos >> SEG_BITS
            order = np.argsort(seg)
            ss = seg[order]
            first = order[np.concatenate(([0], np.flatnonzero(ss[1:] != ss[:-1]) + 1))]
            for s, i in zip(seg[first].tolist(), first.tolist()):
                into[int(s)] = (int(widths[i]), int(codes[i]))

    def note_widths(self, pos: np.ndarray, widths: np.ndarray, codes: np.ndarray) -> None:
        """The slot widths and codes of rows rewritten at ``pos`` (one per segment)."""
        self._by_seg(pos, widths, codes, self.write_width)

    def fetch_add(self, pos: np.ndarray, widths: np.ndarray, codes: np.ndarray) -> None:
        if pos.size:
            self.fetch.append(pos.astype(np.uint32))
            self._by_seg(pos, widths, codes, self.fetch_width)

    def to_fetch(self) -> dict[int, tuple[int, int, int, np.ndarray]]:
        """Segment -> (width, code, bytes a row, byte offsets) of the applied rows to read
        back."""
        if not self.fetch:
            return {}
        pos = distinct(np.concatenate(self.fetch))
        seg = pos >> SEG_BITS   # sorted: each segment's positions are one run
        cuts = [0, *(np.flatnonzero(seg[1:] != seg[:-1]) + 1).tolist(), pos.size]
        out = {}
        for a, z in zip(cuts, cuts[1:]):
            s, sel = int(seg[a]), pos[a:z]
            off = ((sel & ((1 << SEG_BITS) - 1)).astype(np.uint32) * 4).astype(_U4)
            width, code = self.fetch_width[int(s)]
            out[int(s)] = (width, code, row_bytes(width, code), off)
        return out

    def rewrites(self) -> dict[int, int]:
        """Segment -> rows this delta rewrites in place there (applied segments only)."""
        if not len(self.inplace):
            return {}
        per = np.bincount((self.inplace.ids >> np.uint64(SEG_BITS)).astype(np.intp))
        return {int(s): int(per[s]) for s in np.flatnonzero(per)}

    def note_sizes(self, pos: np.ndarray, seg_len: Sequence[int]) -> None:
        for s in distinct(pos >> SEG_BITS).tolist():
            self.seg_bytes[int(s)] = int(seg_len[int(s)])

    def dense(self, seg: int, rows: int) -> bool:
        """Whether ``rows`` rows of segment ``seg`` are cheaper read and rewritten by moving the
        whole segment (GET, then a staged SET and RENAME: a few ns a byte) than one by one in
        Lua (GETRANGE and SETRANGE: a few µs a row)."""
        return rows * ROW_NS >= self.seg_bytes.get(seg, 1 << 62) * BYTE_NS

    def rebuild(self, seg: int, width: int, code: int, off: np.ndarray,
                raw: bytes) -> np.ndarray:
        """Segment ``seg`` read whole (``raw``, as applied): the rows at byte ``off`` it
        supersedes (returned), and its new content with this delta's rows rewritten in place and
        appended (:attr:`replaced`, written by the apply instead of a patch)."""
        size = row_bytes(width, code)
        tail = [ch for ch in self.chunks if ch.seg == seg]
        buf = np.empty(len(raw) + sum(chunk_size(c.rows.shape[0], c.rows.shape[1] - META, c.code)
                                      for c in tail), dtype=np.uint8)
        buf[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        words = buf[:len(raw)].view(_U4)   # a log is whole 8-byte words; rows start on 4
        old = _rows_at(words, off, size).view(np.uint8)
        old = decode_rows(old, width, code) if off.size else \
            np.empty((0, META + width), dtype=ROW)
        pos = self.inplace.ids.astype(np.int64) if len(self.inplace) else np.empty(0, np.int64)
        sel = (pos >> SEG_BITS) == seg
        if sel.any():
            ww, wc = self.write_width[seg]
            wsize = row_bytes(ww, wc)
            woff = (pos[sel] & ((1 << SEG_BITS) - 1)) * 4
            mine = self.inplace.rows if sel.all() else self.inplace.rows[sel]
            enc = encode_rows(mine[:, :META + ww], wc)
            _rows_at(words, woff, wsize, enc.view(_U4))
        at = len(raw)
        for ch in tail:
            at = ch.write(buf, at)
        self.replaced[seg] = buf.data
        return old

    def fresh(self, seg: int) -> bool:
        """Whether segment ``seg`` holds nothing but what this delta appends."""
        return (seg << SEG_BITS) >= self.start

    def patches(self) -> dict[int, tuple[memoryview, int, np.ndarray, np.ndarray]]:
        """Segment -> (bytes appended, bytes a rewritten row, their byte offsets, their rows):
        what :func:`patch_blob` encodes for the apply (segments written whole left out)."""
        out: dict[int, tuple[memoryview, int, np.ndarray, np.ndarray]] = {}
        by_seg: dict[int, list[Chunk]] = {}
        for ch in self.chunks:
            if ch.seg not in self.replaced:
                by_seg.setdefault(ch.seg, []).append(ch)
        appended: dict[int, np.ndarray] = {}
        for seg_, chunks in by_seg.items():   # one buffer a segment, each chunk copied once
            # uninitialized (no zero-fill pass): every byte is written, padding included
            buf = appended[seg_] = np.empty(sum(
                chunk_size(c.rows.shape[0], c.rows.shape[1] - META, c.code) for c in chunks),
                dtype=np.uint8)
            at = 0
            for c in chunks:
                at = c.write(buf, at)
        pos = self.inplace.ids.astype(np.int64) if len(self.inplace) else np.empty(0, np.int64)
        seg = pos >> SEG_BITS
        for s in sorted(set(appended) | set(distinct(seg).tolist()) | self.trim):
            if s in self.replaced:   # written whole (:meth:`rebuild` encoded its rows)
                continue
            sel = seg == s
            width, code = self.write_width.get(s, (0, 0))
            rows = encode_rows(self.inplace.rows[sel][:, :META + width], code) if sel.any() \
                else np.empty((0, row_bytes(width, code)), dtype=np.uint8)
            off = ((pos[sel] & ((1 << SEG_BITS) - 1)) * 4).astype(_U4)
            app = appended.get(s)
            out[int(s)] = (app.data if app is not None else memoryview(b""),
                           row_bytes(width, code), off, rows)
        return out


def patch_blob(appended: bytes | bytearray | memoryview, size: int, offsets: np.ndarray,
               rows: np.ndarray, trim: bool = False) -> bytes:
    """The ``~`` side operation of the apply script (agents/store/scripts.py): rows (encoded:
    an ``(n, size)`` uint8 matrix) rewritten at byte ``offsets``, then ``appended``
    appended (``trim``: then the segment is copied without its spare room: it is finished)."""
    return ((b"^" if trim else b"~") + struct.pack("<II", len(appended), size) + appended
            + offsets.astype(_U4).tobytes() + np.ascontiguousarray(rows).tobytes())


def index_segments(segments: Sequence[bytes | None], packer: RowPacker | None = None,
                   epoch: int = 0) -> tuple[DeviceIndex, list[int], list[int], list[int]]:
    """The index of a log read back (its segments in order): each device at its last row (with
    ``packer``, the row packed too: the log of ``epoch``); and each segment's length, row width
    (-1 if its chunks differ) and value code."""
    ids: list[np.ndarray] = []
    pos: list[np.ndarray] = []
    packed: list[np.ndarray] = []
    lens, widths, codes = [], [], []
    for s, data in enumerate(segments):
        data = data or b""
        if len(data) > SEG_MAX:
            raise ValueError(f"device state segment {s} holds {len(data)} bytes, more than "
                             f"{SEG_MAX} (a log written whole by an older worker)")
        lens.append(len(data))
        w: int | None = None
        c = 0
        for at, cid, rows, code in log_chunks(data, with_offsets=True,
                                              rows_too=packer is not None):
            n, cols = rows.shape
            if packer is not None:
                packed.append(packer.pack(rows, epoch))
            same = w is None or (w == cols - META and c == code)
            w, c = (cols - META, code) if same else (-1, code)
            ids.append(cid)
            pos.append((s << SEG_BITS) + (at + 16 + 8 * n) // 4
                       + row_bytes(cols - META, code) // 4 * np.arange(n, dtype=np.int64))
        widths.append(-1 if w is None else w)
        codes.append(c)
    if not ids:
        return DeviceIndex(), lens, widths, codes
    all_ids = np.concatenate(ids)
    u, keep = last_of(all_ids)
    return DeviceIndex(u, np.concatenate(pos)[keep].astype(np.uint32),
                       np.concatenate(packed)[keep] if packed else None), lens, widths, codes


def table_of_segments(segments: Sequence[bytes | None],
                      unlogged: Sequence[Chunk] = ()) -> DeviceTable:
    """The full table (each device's last row) of a log read back, with the rows an earlier roll
    placed in it that no delta has written yet (``unlogged``, newer than what is read): at a
    roll only."""
    ids, rows = [], []
    for data in segments:
        for cid, crows in log_chunks(data or b""):
            ids.append(cid)
            rows.append(crows)
    for ch in unlogged:
        ids.append(ch.ids)
        rows.append(ch.rows)
    if not ids:
        return DeviceTable()
    all_ids = np.concatenate(ids)
    u, keep = last_of(all_ids)
    return DeviceTable(u, stack_rows(rows)[keep].astype(ROW), logged=int(all_ids.size))


def encode_segments(ids: np.ndarray, rows: np.ndarray) -> list[bytes]:
    """A whole table as the segments a worker writes (bench and tests write state directly)."""
    log = EpochLog("x", 0.0)
    chunks, _ = log.place(ids, rows)
    out: list[list[bytes]] = [[] for _ in log.seg_len]
    for ch in chunks:
        out[ch.seg].append(ch.encode())
    return [b"".join(parts) for parts in out]
