"""Memoized collections in the ingest worker: each partition's index of its devices (id and the
position of the row of its latest report in Redis and that row packed when it fits, 16 bytes a
device: agents/store/memo_log.py),
loaded from the logs at the stored offset, and the moves of each run of reports (the rule is
agents/store/device_memo.py; docs/privacy-over-time.md, "Estimates that count devices"). The rows
themselves stay in Redis: those a delta supersedes are read back when it is flushed
(:meth:`MemoGate.fetch`), so the worker's memory does not hold them."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiokafka.structs import ConsumerRecord

from ldpstream.agents import metrics
from ldpstream.agents.ingest.clients import RedisGate
from ldpstream.agents.ingest.partition import PartitionState, Pending
from ldpstream.agents.store import device_memo
from ldpstream.agents.store.apply_delta import SideLog, SidePatch, SideStaged
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.layout import Layout
from ldpstream.agents.store.memo_log import (
    STAGE_MIN,
    UNKNOWN,
    EpochLog,
    LogPending,
    RowPacker,
    index_segments,
    patch_blob,
    segment_name,
    table_of_segments,
)
from ldpstream.config import Collection
from ldpstream.credentials.device_keys import FleetSecrets, tag_range
from ldpstream.producers.codec import ReportBatch, encode_batch

#: the DLQ reason of reports of new devices beyond ``device_state_max``
DEVICE_STATE_FULL = "device_state_full"
#: segments a flush reads back at once per partition (sent together; bounds the bytes of
#: segments read whole that it holds beside their rebuilt copies)
FETCH_AHEAD = 8
#: epochs a log lives at most from its own (and so the logs a worker reads when it loads a
#: partition): :meth:`MemoGate._kept`
KEPT_MAX = 8


class _Into:
    """:func:`device_memo.carry`'s ``into`` for an epoch log: the rows it carries are placed
    (appended) now and written with the next delta."""

    def __init__(self, log: EpochLog) -> None:
        self.log = log
        self.unlogged: list[Any] = []       # carry's own record of them: the chunks say it all
        self.evicted = log.evicted
        self.cleared: list[int] = []

    def holds(self, ids: np.ndarray) -> np.ndarray:
        return self.log.index.holds(ids)

    def upsert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        chunks, pos = self.log.place(ids, rows)
        self.log.index.upsert(ids, pos)
        self.log.unlogged += chunks


class MemoGate:
    """The index of the devices of the assigned partitions of memoized collections."""

    def __init__(self, collections: dict[str, Collection], gate: RedisGate,
                 store: CountStore, fleets: FleetSecrets | None = None) -> None:
        self.collections = collections
        #: with per-device identity: each fleet's share of device_state_max (docs/security.md)
        self.fleets = fleets
        self.gate = gate
        self.store = store
        # the switch is the mechanism protocol's: any family whose devices memoize
        self._memoized = {cid: c.mechanism().memoization() is not None
                          for cid, c in collections.items()}
        self._layout = {cid: Layout.of(c.version, c.tensors()).id
                        for cid, c in collections.items() if self._memoized[cid]}
        #: each device's row packed beside its position when it fits (memo_log.RowPacker)
        self._packer = {cid: RowPacker.of(c.mechanism().report_bounds().tolist(),
                                          device_memo.epoch_length(c.policy), c.policy.bucket_s)
                        for cid, c in collections.items() if self._memoized[cid]}
        #: applies everything pending and waits (the applier's flush): a roll reads the expiring
        #: logs as applied (agents/app.py wires it)
        self.flush: Callable[[], Awaitable[None]] | None = None

    def applies(self, cid: str) -> bool:
        return self._memoized.get(cid, False)

    def _span(self, cid: str) -> float:
        return device_memo.epoch_length(self.collections[cid].policy)

    def _kept(self, cid: str) -> int:
        """Epochs a log lives from its own (docs/privacy-over-time.md, "Retention"): until a
        device last seen in it is due for eviction (``K + 1`` epochs on) and its roll out of the
        (previous, current) pair, at most :data:`KEPT_MAX`, so a partition silent that long
        still evicts at its next report (a roll carries the rows it keeps into a newer log and
        deletes the logs it read: this bounds only a partition nobody consumes)."""
        coll = self.collections[cid]
        return min(device_memo.retention_epochs(coll.device_retention(), coll.policy) + 3,
                   KEPT_MAX)

    def _empty(self, cid: str, epoch: int) -> EpochLog:
        return EpochLog(device_memo.side_name(epoch, self._layout[cid]),
                        (epoch + self._kept(cid)) * self._span(cid))

    async def _segments(self, state: PartitionState, name: str,
                        count: int | None = None) -> list[bytes | None]:
        """The segments of log ``name`` (``count`` of them, or until one is missing)."""
        out: list[bytes | None] = []
        while count is None or len(out) < count:
            seg = segment_name(name, len(out))
            raw = await self.gate.retry(
                lambda: self.store.read_side_bytes(state.collection, state.tp.partition, seg),
                what=f"read the devices' latest reports of {state.collection}"
                     f"[{state.tp.partition}]")
            if raw is None and count is None:
                break
            out.append(raw)
        return out

    async def _read_log(self, state: PartitionState, epoch: int) -> EpochLog:
        log = self._empty(state.collection, epoch)
        log.index, log.seg_len, log.seg_width, log.seg_code = index_segments(
            await self._segments(state, log.name), self._packer[state.collection], epoch)
        return log

    async def load(self, state: PartitionState) -> None:
        """Read the indexes of the logs still kept (this epoch's and the ones before it,
        worker's clock: :meth:`_kept`) if not in memory; at a new epoch, roll: the devices of
        the logs that leave the (previous, current) pair are carried or evicted
        (:func:`device_memo.carry`, the expiring rows read back from Redis once everything
        pending is applied)."""
        epoch = device_memo.epoch_of(time.time(), self.collections[state.collection].policy)
        if state.memo is not None:
            if state.memo_epoch == epoch:
                return
            if self.flush is not None:
                await self.flush()
            if state.memo is not None:   # not reset by the flush
                state.memo = await self._roll(state, state.memo, epoch)
                state.memo_epoch = epoch
                return
        have: dict[int, EpochLog] = {}
        for e in range(epoch - self._kept(state.collection) + 1, epoch + 1):
            log = await self._read_log(state, e)
            if state.memo is not None:  # loaded meanwhile
                return
            have[e] = log
        memo = await self._roll(state, have, epoch)
        if state.memo is None:
            state.memo, state.memo_epoch = memo, epoch

    async def _roll(self, state: PartitionState, memo: dict[int, EpochLog],
                    epoch: int) -> dict[int, EpochLog]:
        """The logs of ``epoch - 1`` and ``epoch``, the devices of older ones carried into the
        former as all-time only or, silent beyond the collection's retention, evicted."""
        cid = state.collection
        coll = self.collections[cid]
        keep_from = epoch - device_memo.retention_epochs(coll.device_retention(), coll.policy)
        into = memo.get(epoch - 1) or self._empty(cid, epoch - 1)
        cur = memo.get(epoch) or self._empty(cid, epoch)
        old = sorted(((e, log) for e, log in memo.items() if e < epoch - 1), reverse=True)
        if old:
            adapter = _Into(into)
            tables = []
            for e, log in old:
                # what an earlier roll left without a delta since goes on, segments or not
                into.evicted += log.evicted
                into.cleared += log.cleared
                if log.seg_len:
                    into.cleared.append((log.name, len(log.seg_len)))
                    if len(log):   # its carried rows too, if no delta has written them yet
                        tables.append((e, table_of_segments(
                            await self._segments(state, log.name, len(log.seg_len)),
                            log.unlogged)))
                        log.unlogged = []
            device_memo.carry(tables, adapter, cur.index, keep_from)
        return {epoch - 1: into, epoch: cur}

    @staticmethod
    def entries(state: PartitionState) -> int:
        """The entries the partition keeps (a device that reported in the previous and the
        current epoch holds one in each until the older log expires: what Redis holds)."""
        assert state.memo is not None
        return sum(len(t) for t in state.memo.values())

    def has_room(self, state: PartitionState, reports: int, fleet: str | None = None) -> bool:
        """Whether ``reports`` reports fit under ``device_state_max`` (and under ``fleet``'s
        share of it) even if each is a new device."""
        if fleet is not None and self.fleet_entries(state, fleet) + reports > \
                self.fleet_cap(state.collection, fleet):
            return False
        return self.entries(state) + reports <= \
            self.collections[state.collection].device_state_max

    def fleet_cap(self, cid: str, fleet: str) -> int:
        """The entries ``fleet``'s devices may hold per partition: its share of
        ``device_state_max`` (all of it without per-device identity)."""
        cap = self.collections[cid].device_state_max
        if self.fleets is None:
            return cap
        return int(self.fleets.shares.get(fleet, 0.0) * cap)

    @staticmethod
    def fleet_entries(state: PartitionState, fleet: str) -> int:
        """The entries of ``fleet``'s devices: their server ids share the fleet's tag, a range
        of the sorted index (two binary searches per index)."""
        assert state.memo is not None
        lo, hi = tag_range(fleet)
        return sum(t.index.count_between(lo, hi) for t in state.memo.values())

    @staticmethod
    def _current(state: PartitionState) -> EpochLog | None:
        if state.memo is None or state.memo_epoch is None:
            return None
        return state.memo.get(state.memo_epoch)

    def _over_share(self, state: PartitionState, pend: Pending, m: ConsumerRecord,
                    b: ReportBatch) -> bool:
        """An authenticated batch (one device) of a new device whose fleet holds its share:
        refused whole as ``device_state_full``."""
        if self.fleets is None or b.fleet is None or b.device_ids is None:
            return False
        cid = state.collection
        cap = self.fleet_cap(cid, b.fleet)
        if self.fleet_entries(state, b.fleet) < cap:
            return False
        cur = self._current(state)
        if cur is not None and bool(cur.index.holds(np.asarray(b.device_ids[:1],
                                                                dtype=np.uint64))[0]):
            return False
        pend.reject(DEVICE_STATE_FULL, f"a new device of fleet {b.fleet!r}, whose devices hold "
                    f"its share of partition {state.tp.partition} of {cid!r}: {cap} of "
                    f"device_state_max = {self.collections[cid].device_state_max}",
                    m.value or b"", m.offset, b.n)
        return True

    def admit(self, state: PartitionState, pend: Pending, m: ConsumerRecord,
              b: ReportBatch) -> ReportBatch | None:
        """The reports of ``b`` the worker can count by device: a batch without device ids is
        refused whole (``missing_device_ids``); reports of devices beyond the collection's
        ``device_state_max`` per partition go to the DLQ as ``device_state_full``."""
        cid = state.collection
        if b.device_ids is None:
            pend.reject("missing_device_ids", f"collection {cid!r} is memoized (counted per "
                        f"device): every report needs a device id", m.value, m.offset, b.n)
            return None
        assert state.memo is not None
        if self._over_share(state, pend, m, b):
            return None
        if self.has_room(state, b.n):
            return b   # room for every report's device even if all are new: nothing to check
        room = self.collections[cid].device_state_max - self.entries(state)
        ids = np.asarray(b.device_ids, dtype=np.uint64)
        cur = self._current(state)
        new = ~cur.index.holds(ids) if cur is not None else np.ones(ids.size, dtype=bool)
        uniq_new = np.unique(ids[new])
        if uniq_new.size <= room:
            return b
        refused = np.isin(ids, uniq_new[max(room, 0):])
        pend.reject(DEVICE_STATE_FULL,
                    f"{int(refused.sum())} report(s) of {int(uniq_new.size - max(room, 0))} new "
                    f"device(s): partition {state.tp.partition} of {cid!r} already keeps the "
                    f"latest report of device_state_max = "
                    f"{self.collections[cid].device_state_max} devices",
                    encode_batch(b.collection, b.version, b.reports[refused],
                                 device_ids=b.device_ids[refused], sent_at=b.sent_at),
                    m.offset, int(refused.sum()))
        if refused.all():
            return None
        keep = ~refused
        return dataclasses.replace(b, reports=b.reports[keep], device_ids=b.device_ids[keep])

    @staticmethod
    def _pending(pend: Pending, log: EpochLog) -> LogPending:
        lp = pend.memo.get(log.name)
        if lp is None:
            lp = pend.memo[log.name] = LogPending(log.name, log.expire_at, log.tail())
        return lp

    def _drain(self, pend: Pending, prev: EpochLog) -> np.ndarray:
        """What the last roll left, into this delta: the rows carried into the previous epoch's
        log, the expired logs deleted; returns the evicted devices' rows (to subtract)."""
        if prev.unlogged:
            lp = self._pending(pend, prev)
            lp.start = min(lp.start, min(ch.first for ch in prev.unlogged))
            lp.chunks += prev.unlogged
            prev.unlogged = []
        for name, segs in prev.cleared:
            lp = pend.memo.setdefault(name, LogPending(name, 0.0, 0))
            lp.clear = max(lp.clear, segs)
        prev.cleared = []
        evicted = device_memo.stack_rows(prev.evicted)
        prev.evicted.clear()
        return evicted

    def moves(self, state: PartitionState, pend: Pending, device_ids: np.ndarray,
              reports: np.ndarray, buckets: np.ndarray, version: int) -> device_memo.Moves:
        """The moves of one run of reports of ``version`` (in order): each device's latest row
        rewritten in place (its row in this epoch's log) or appended, its index updated; the
        rows it supersedes that the index holds packed or this delta wrote are returned
        (``old``), the others are read back when the delta is flushed (:meth:`fetch`). A device
        whose row is the one the index holds for it this epoch (a memoized report resent in its
        bucket) moves nothing: not counted, not written, not read (docs/scaling.md "Per-device
        state")."""
        memo, epoch = state.memo, state.memo_epoch
        assert memo is not None and epoch is not None
        cid = state.collection
        cur = memo.setdefault(epoch, self._empty(cid, epoch))
        prev = memo.setdefault(epoch - 1, self._empty(cid, epoch - 1))
        evicted = self._drain(pend, prev)
        ids = np.asarray(device_ids, dtype=np.uint64)
        if ids.size < 2 or bool((ids[1:] > ids[:-1]).all()):
            u, keep = ids, np.arange(ids.size)   # distinct and in order already: no sort
        else:
            u, keep = device_memo.last_of(ids)
        width = int(reports.shape[1])
        rows = np.empty((u.size, device_memo.META + width), dtype=device_memo.ROW)
        rows[:, 0] = int(version)
        one = buckets.size == 1 or (buckets.ndim == 1 and buckets.strides[0] == 0)
        rows[:, 1] = int(buckets.flat[0]) + 1 if one else \
            np.broadcast_to(buckets, ids.shape)[keep] + 1
        rows[:, 2] = width
        rows[:, device_memo.META:] = reports if keep.size == ids.size and u is ids else \
            reports[keep]
        code = device_memo.value_code(reports)   # (contiguous: cheaper than the rows' columns)
        packer = self._packer[cid]
        if packer is None:
            packed = np.full(u.size, UNKNOWN, dtype=np.uint32)
        else:   # from the contiguous reports (cheaper than the rows' columns)
            packed = packer.pack_values(reports, int(version), buckets + 1 if not one else
                                        int(buckets.flat[0]) + 1, epoch)
            packed = packed if keep.size == ids.size and u is ids else \
                np.broadcast_to(packed, ids.shape)[keep]
        fc, pc, cc = cur.index.find_codes(u)
        same = fc & (cc == packed) & (packed != UNKNOWN)
        if same.any():   # resent as held: nothing moves
            moved = ~same
            u, keep, rows, packed, fc, pc, cc = (a[moved] for a in (u, keep, rows, packed, fc,
                                                                    pc, cc))
        old: list[np.ndarray] = []
        placed = np.zeros(u.size, dtype=bool)
        if fc.any():
            at = np.flatnonzero(fc)
            pos = pc[at]
            slot_w, slot_c = cur.slots(pos)
            lp = self._pending(pend, cur)
            self._superseded(packer, lp, cur, epoch, pos, cc[at], old)
            # rewritten in place where the row fits its slot: as wide, values in its code
            rank = device_memo.CODE_RANK[code]
            fits = (slot_w >= width) & (np.asarray(device_memo.CODE_RANK)[slot_c] >= rank)
            lp.write_at(pos[fits], rows[at[fits]], slot_w[fits])
            lp.note_widths(pos[fits], slot_w[fits], slot_c[fits])
            placed[at[fits]] = True
            if fits.any():
                cur.index.upsert(u[at[fits]], pos[fits], packed[at[fits]])
        rest = np.flatnonzero(~fc)
        if rest.size and len(prev):
            fp, pp, cp = prev.index.find_codes(u[rest])
            if fp.any():
                self._superseded(packer, self._pending(pend, prev), prev, epoch - 1, pp[fp], cp[fp], old)
        app = np.flatnonzero(~placed)
        if app.size:
            lp = self._pending(pend, cur)
            au, ar = (u, rows) if app.size == u.size else (u[app], rows[app])
            segs = len(cur.seg_len)
            chunks, pos = cur.place(au, ar, lp.start, code)
            if segs and len(cur.seg_len) > segs and not lp.fresh(segs - 1):
                lp.trim.add(segs - 1)   # finished: its spare room dropped with this apply
            lp.chunks += chunks
            cur.index.upsert(au, pos, packed if app.size == u.size else packed[app])
        metrics.MEMO_DEVICES.labels(cid, str(state.tp.partition)).set(self.entries(state))
        return device_memo.Moves(keep, u, rows, device_memo.stack_rows(old), evicted)

    @staticmethod
    def _superseded(packer: RowPacker | None, lp: LogPending, log: EpochLog, epoch: int,
                    pos: np.ndarray, codes: np.ndarray, old: list[np.ndarray]) -> None:
        """The rows at ``pos`` of ``log`` (of ``epoch``), superseded: those the index holds
        packed (``codes``) or this delta wrote go to ``old``, the others are read back when the
        delta is flushed."""
        lp.note_sizes(pos, log.seg_len)   # (a segment rewritten densely moves whole)
        known = codes != UNKNOWN
        if known.any() and packer is not None:
            old.append(packer.unpack(codes[known], epoch))
            pos = pos[~known]
        if not pos.size:
            return
        mem, mrows = lp.rows_at(pos)
        old.append(mrows)
        lp.fetch_add(pos[~mem], *log.slots(pos[~mem]))

    async def fetch(self, cid: str, pend: Pending) -> np.ndarray:
        """The applied rows ``pend`` supersedes, read back from Redis (one call per segment,
        :data:`FETCH_AHEAD` of them sent together): subtracted with it. Once per delta (the
        positions are consumed)."""
        part = pend.tp.partition
        reads = []
        for lp in pend.memo.values():
            rewrites = lp.rewrites()
            fetch = lp.to_fetch()
            for seg, (width, code, size, off) in fetch.items():
                name = segment_name(lp.name, seg)
                # many rows of it read or rewritten: the segment moved whole
                dense = lp.dense(seg, max(off.size, rewrites.get(seg, 0)))
                call = functools.partial(self.store.read_side_bytes, cid, part, name) if dense \
                    else functools.partial(self.store.read_side_rows, cid, part, name, size,
                                           off.tobytes())
                reads.append((lp, seg, width, code, size, off, dense, call))
            for seg, many in rewrites.items():   # nothing to read back there (rows packed)
                if seg not in fetch and seg not in lp.replaced and lp.dense(seg, many):
                    reads.append((lp, seg, 0, 0, 0, np.empty(0, dtype=np.uint32), True,
                                  functools.partial(self.store.read_side_bytes, cid, part,
                                                    segment_name(lp.name, seg))))
            lp.fetch.clear()
        parts = []
        for at in range(0, len(reads), FETCH_AHEAD):
            group = reads[at:at + FETCH_AHEAD]
            raws = await asyncio.gather(*(
                self.gate.retry(call, what=f"read the superseded reports of {cid}[{part}]")
                for *_, call in group))
            for (lp, seg, width, code, size, off, dense, _), raw in zip(group, raws):
                if dense:
                    rows = lp.rebuild(seg, width, code, off, raw or b"")
                else:
                    rows = device_memo.decode_rows(
                        np.frombuffer(raw or b"", dtype=np.uint8).reshape(-1, size), width,
                        code)
                parts.append(rows[rows[:, 2] != 0])   # a row that is not there reads as zeros
        return device_memo.stack_rows(parts)

    @staticmethod
    def side(pend: Pending) -> dict[str, SideLog | SidePatch | SideStaged]:
        """The segments a delta writes (rows rewritten in place, rows appended), each expiring
        with its log (:meth:`_kept`); the segments of an expired log deleted."""
        out: dict[str, SideLog | SidePatch | SideStaged] = {}
        for name, lp in pend.memo.items():
            if lp.clear:
                for s in range(lp.clear):
                    out[segment_name(name, s)] = SideLog(b"", replace=True)
                continue
            for seg, data in lp.replaced.items():
                out[segment_name(name, seg)] = SideStaged(data, lp.expire_at)
            for seg, (app, size, off, rows) in lp.patches().items():
                trim = seg in lp.trim
                if lp.fresh(seg) and len(app) >= STAGE_MIN and not off.size:
                    out[segment_name(name, seg)] = SideStaged(app, lp.expire_at)
                elif app or off.size or trim:
                    out[segment_name(name, seg)] = SidePatch(
                        patch_blob(app, size, off, rows, trim), lp.expire_at)
        return out
