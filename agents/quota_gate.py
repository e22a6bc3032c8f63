"""Per-device quotas in the ingest worker: the counts used so far per quota window, loaded from
the side counters at the stored offset, and the split of each batch into counted reports and
the excess (to ``ldp.dlq``). The rule itself is agents/quota.py."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
from aiokafka.structs import ConsumerRecord

from ldpstream.agents.apply_delta import SideCounter
from ldpstream.agents.clients import RedisGate
from ldpstream.agents.partition import PartitionState, Pending
from ldpstream.agents.quota import side_name, split_by_quota, window_of
from ldpstream.agents.store import CountStore
from ldpstream.config import Collection
from ldpstream.producers.codec import ReportBatch, encode_batch


class QuotaGate:
    """Device quotas of the collections that have one."""

    def __init__(self, collections: dict[str, Collection], gate: RedisGate,
                 store: CountStore) -> None:
        self.collections = collections
        self.gate = gate
        self.store = store

    def applies(self, cid: str) -> bool:
        return self.collections[cid].device_quota is not None

    async def load(self, state: PartitionState) -> None:
        """Read the side counters of this poll's quota window if not in memory yet: the window
        of the worker's clock, never of the producer's record timestamp (a device could backdate
        its records into fresh windows)."""
        quota = self.collections[state.collection].device_quota
        assert quota is not None
        if state.quota_used is None:
            state.quota_used = {}
        have = state.quota_used
        state.quota_window = window_of(time.time() * 1000.0, quota.window_s)
        for w in {state.quota_window} - set(have):
            name = side_name(w)
            raw = await self.gate.retry(
                lambda: self.store.read_side(state.collection, state.tp.partition, name),
                what=f"read the quota of {state.collection}[{state.tp.partition}]")
            if state.quota_used is not have:  # dropped meanwhile (reset): reloaded next time
                return
            have[w] = {int(k): v for k, v in raw.items()}

    def within(self, state: PartitionState, pend: Pending, m: ConsumerRecord,
               b: ReportBatch) -> ReportBatch | None:
        """The reports of ``b`` within the device quota (the excess to the DLQ); None: none."""
        cid = state.collection
        quota = self.collections[cid].device_quota
        assert quota is not None and state.quota_used is not None \
            and state.quota_window is not None
        if b.device_ids is None:
            pend.reject("missing_device_ids", f"collection {cid!r} has a device quota: every "
                        f"report needs a device id", m.value, m.offset, b.n)
            return None
        w = state.quota_window
        used = state.quota_used[w]
        mask, taken = split_by_quota(b.device_ids, used, quota.reports)
        counted = pend.quota.setdefault(w, {})
        for d, k in taken.items():
            used[d] = used.get(d, 0) + k
            counted[d] = counted.get(d, 0) + k
        if mask.all():
            return b
        over = ~mask
        excess = encode_batch(b.collection, b.version, b.reports[over],
                              device_ids=b.device_ids[over], sent_at=b.sent_at)
        devices = np.unique(b.device_ids[over])
        pend.reject("over_quota",
                    f"{int(over.sum())} report(s) of {devices.size} device(s) beyond "
                    f"{quota.reports} per device in quota window {w} ({quota.window_s:g} s); "
                    f"first device {int(devices[0])}", excess, m.offset, int(over.sum()))
        if not mask.any():
            return None
        return dataclasses.replace(b, reports=b.reports[mask], device_ids=b.device_ids[mask])

    def side(self, cid: str, pend: Pending) -> dict[str, SideCounter]:
        """The quota side counters of a delta (expiring two windows after theirs)."""
        quota = self.collections[cid].device_quota
        if quota is None:
            return {}
        return {side_name(w): SideCounter({str(d): k for d, k in devices.items()},
                                          expire_at=(w + 2) * quota.window_s)
                for w, devices in pend.quota.items() if devices}
