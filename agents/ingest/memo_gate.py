"""Memoized collections in the ingest worker: each partition's devices' latest reports, loaded
from their logs at the stored offset, and the moves of each run of reports (the rule is
agents/store/device_memo.py; docs/privacy-over-time.md, "Estimates that count devices")."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
from aiokafka.structs import ConsumerRecord

from ldpstream.agents import metrics
from ldpstream.agents.ingest.clients import RedisGate
from ldpstream.agents.ingest.partition import PartitionState, Pending
from ldpstream.agents.store import device_memo
from ldpstream.agents.store.apply_delta import SideLog
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.layout import Layout
from ldpstream.config import Collection
from ldpstream.credentials.device_keys import FleetSecrets, tag_range
from ldpstream.producers.codec import ReportBatch, encode_batch

#: the DLQ reason of reports of new devices beyond ``device_state_max``
DEVICE_STATE_FULL = "device_state_full"


class MemoGate:
    """The latest report of every device of the assigned partitions of memoized collections."""

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

    def applies(self, cid: str) -> bool:
        return self._memoized.get(cid, False)

    async def load(self, state: PartitionState) -> None:
        """Read the tables of this epoch and the one before (worker's clock) if not in memory;
        tables older than that are dropped from memory (they have expired in Redis too)."""
        policy = self.collections[state.collection].policy
        epoch = device_memo.epoch_of(time.time(), policy)
        if state.memo is not None:
            if state.memo_epoch != epoch:
                state.memo, state.memo_epoch = self._roll(state, state.memo, epoch), epoch
            return
        have: dict[int, device_memo.DeviceTable] = {}
        for e in (epoch - 2, epoch - 1, epoch):
            name = device_memo.side_name(e, self._layout[state.collection])
            raw = await self.gate.retry(
                lambda: self.store.read_side_bytes(state.collection, state.tp.partition, name),
                what=f"read the devices' latest reports of {state.collection}"
                     f"[{state.tp.partition}]")
            if state.memo is not None:  # loaded meanwhile
                return
            have[e] = device_memo.parse_log(raw)
        state.memo, state.memo_epoch = self._roll(state, have, epoch), epoch

    def _roll(self, state: PartitionState, memo: dict[int, device_memo.DeviceTable],
              epoch: int) -> dict[int, device_memo.DeviceTable]:
        """The tables of ``epoch - 1`` and ``epoch`` (agents/store/device_memo.py ``roll``),
        devices silent beyond the collection's retention evicted."""
        coll = self.collections[state.collection]
        return device_memo.roll(memo, epoch, epoch - device_memo.retention_epochs(
            coll.device_retention(), coll.policy))

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
        of the sorted table (two binary searches per table)."""
        assert state.memo is not None
        lo, hi = tag_range(fleet)
        return sum(t.count_between(lo, hi) for t in state.memo.values())

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
        cur = state.memo.get(state.memo_epoch) if state.memo and state.memo_epoch is not None \
            else None
        if cur is not None and bool(cur.holds(b.device_ids[:1])[0]):
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
        cur = state.memo.get(state.memo_epoch) if state.memo_epoch is not None else None
        new = ~cur.holds(ids) if cur is not None else np.ones(ids.size, dtype=bool)
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

    def moves(self, state: PartitionState, pend: Pending, device_ids: np.ndarray,
              reports: np.ndarray, buckets: np.ndarray, version: int) -> device_memo.Moves:
        """The moves of one run of reports of ``version`` (in order), recorded in the partition's
        tables and its pending delta."""
        memo, epoch = state.memo, state.memo_epoch
        assert memo is not None and epoch is not None
        cur = memo.setdefault(epoch, device_memo.DeviceTable())
        prev = memo.setdefault(epoch - 1, device_memo.DeviceTable())
        mv = device_memo.latest_per_device(device_ids, reports, buckets, version, (cur, prev))
        cur.upsert(mv.ids, mv.rows)
        span = device_memo.epoch_length(self.collections[state.collection].policy)
        layout = self._layout[state.collection]
        self._drain_roll(pend, mv, prev, epoch, span, layout)
        write = pend.memo.setdefault(device_memo.side_name(epoch, layout),
                                     device_memo.LogWrite((epoch + 3) * span))
        write.record(cur, mv.ids, mv.rows)
        metrics.MEMO_DEVICES.labels(state.collection, str(state.tp.partition)).set(
            self.entries(state))
        return mv

    @staticmethod
    def _drain_roll(pend: Pending, mv: device_memo.Moves,
                    prev: device_memo.DeviceTable, epoch: int, span: float, layout: str) -> None:
        """What the last roll left for the next delta, all in it (one Lua apply): the devices
        carried into the previous epoch's log, the expired tables' logs emptied and the
        evicted devices' rows in ``mv.evicted`` (subtracted from the all-time counts)."""
        while prev.unlogged:
            ids, rows = prev.unlogged.pop(0)
            pend.memo.setdefault(device_memo.side_name(epoch - 1, layout),
                                 device_memo.LogWrite((epoch + 2) * span)).record(prev, ids, rows)
        while prev.cleared:
            e = prev.cleared.pop(0)
            pend.memo.setdefault(device_memo.side_name(e, layout),
                                 device_memo.LogWrite((e + 3) * span)).clear()
        if prev.evicted:
            mv.evicted = device_memo.stack_rows(prev.evicted)
            prev.evicted.clear()

    @staticmethod
    def side(pend: Pending) -> dict[str, SideLog]:
        """The rows a delta logs, each epoch's log expiring three epochs after it (an emptied
        log: set to nothing)."""
        return {name: SideLog(w.payload(), replace=w.replace, expire_at=w.expire_at)
                for name, w in pend.memo.items() if w.writes()}
