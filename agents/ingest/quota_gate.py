"""Per-device limits in the ingest worker (the device quota; the daily ε budget of
agents/ingest/budget.py): the counts used so far per window by each poll's devices, read from
the side counters with the stored offset (agents/ingest/intake.py ``Intake.load``), and the
split of each batch into counted reports and the excess (to ``ldp.dlq``). The counting rule
itself is agents/store/quota.py."""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

import numpy as np
from aiokafka.structs import ConsumerRecord

from ldpstream.agents.ingest.clients import RedisGate
from ldpstream.agents.ingest.partition import PartitionState, Pending
from ldpstream.agents.ingest.side_read import SideWant
from ldpstream.agents.store import keys
from ldpstream.agents.store.apply_delta import SideBucketMeta, SideCounter
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.quota import WINDOW_PREFIX, side_name, split_by_quota, window_of
from ldpstream.agents.store.side_buckets import split_buckets
from ldpstream.config import Collection
from ldpstream.producers.codec import ReportBatch, encode_batch


@dataclasses.dataclass(frozen=True)
class QuotaRule:
    """One per-device limit: the collection's ``(reports, window_s)`` (None: no such limit),
    the reason its excess is filed under in ``ldp.dlq`` and its side counters' prefix."""

    reason: str
    prefix: str
    limit: Callable[[Collection], tuple[int, float] | None]
    what: str


DEVICE_QUOTA = QuotaRule(
    "over_quota", WINDOW_PREFIX,
    lambda c: None if c.device_quota is None else (c.device_quota.reports,
                                                   c.device_quota.window_s),
    "the device quota")


class QuotaGate:
    """Per-device limits (``rules``: the device quota, the daily ε budget ...) of the
    collections that have one, each counted in its own side counters."""

    def __init__(self, collections: dict[str, Collection], gate: RedisGate,
                 store: CountStore, rules: Sequence[QuotaRule] = (DEVICE_QUOTA,)) -> None:
        self.collections = collections
        self.gate = gate
        self.store = store
        self.rules = {cid: [(r, lim) for r in rules if (lim := r.limit(c)) is not None]
                      for cid, c in collections.items()}

    def applies(self, cid: str) -> bool:
        return bool(self.rules.get(cid))

    def wanted(self, state: PartitionState, devices: Sequence[int]) -> list[SideWant]:
        """The side counters and fields a poll whose batches carry ``devices`` (distinct ids)
        reads: each limit's window of the worker's clock, never of the producer's record
        timestamp (a device could backdate its records into fresh windows)."""
        now_ms = time.time() * 1000.0
        out: list[SideWant] = []
        for rule, (_, window_s) in self.rules[state.collection]:
            w = window_of(now_ms, window_s)
            state.quota_window[rule.prefix] = w
            out.append(SideWant(side_name(w, rule.prefix), side_name(w - 1, rule.prefix),
                                devices, True))
        return out

    def took(self, state: PartitionState, devices: Sequence[int],
             values: Sequence[Sequence[bytes | None]], unapplied: Sequence[Pending]) -> None:
        """The poll's use per limit and device from what :meth:`wanted` read (``values``: per
        limit, per device) plus the increments of ``unapplied`` deltas (not in Redis yet)."""
        ids = list(devices)
        used: dict[tuple[str, int], dict[int, int]] = {}
        for (rule, _), vals in zip(self.rules[state.collection], values):
            at = (rule.prefix, state.quota_window[rule.prefix])
            have = {d: int(v) for d, v in zip(ids, vals) if v is not None}
            for pend in unapplied:
                more = pend.quota.get(at)
                if more:
                    for d in ids:
                        k = more.get(d)
                        if k:
                            have[d] = have.get(d, 0) + k
            used[at] = have
        state.quota_used = used

    def within(self, state: PartitionState, pend: Pending, m: ConsumerRecord,
               b: ReportBatch) -> ReportBatch | None:
        """The reports of ``b`` within every limit (the excess to the DLQ); None: none."""
        kept: ReportBatch | None = b
        for rule, limit in self.rules[state.collection]:
            if kept is None:
                return None
            kept = self._within(rule, limit, state, pend, m, kept)
        return kept

    def _within(self, rule: QuotaRule, limit: tuple[int, float], state: PartitionState,
                pend: Pending, m: ConsumerRecord, b: ReportBatch) -> ReportBatch | None:
        cid = state.collection
        reports, window_s = limit
        assert state.quota_used is not None
        if b.device_ids is None:
            pend.reject("missing_device_ids", f"collection {cid!r} has {rule.what}: every "
                        f"report needs a device id", m.value, m.offset, b.n)
            return None
        w = state.quota_window[rule.prefix]
        used = state.quota_used[(rule.prefix, w)]
        mask, taken = split_by_quota(b.device_ids, used, reports)
        counted = pend.quota.setdefault((rule.prefix, w), {})
        name = side_name(w, rule.prefix)
        pend.side_buckets[name] = state.side_buckets[name]
        for d, k in taken.items():
            used[d] = used.get(d, 0) + k
            counted[d] = counted.get(d, 0) + k
        if mask.all():
            return b
        over = ~mask
        excess = encode_batch(b.collection, b.version, b.reports[over],
                              device_ids=b.device_ids[over], sent_at=b.sent_at)
        devices = np.unique(b.device_ids[over])
        pend.reject(rule.reason,
                    f"{int(over.sum())} report(s) of {devices.size} device(s) beyond "
                    f"{reports} per device in window {w} ({window_s:g} s) of {rule.what}; "
                    f"first device {int(devices[0])}", excess, m.offset, int(over.sum()))
        if not mask.any():
            return None
        return dataclasses.replace(b, reports=b.reports[mask], device_ids=b.device_ids[mask])

    def side(self, cid: str, pend: Pending) -> dict[str, SideCounter | SideBucketMeta]:
        """The side counters of a delta, bucketed, each window's meta after its buckets (all
        expiring two windows after their own)."""
        windows = {rule.prefix: window_s for rule, (_, window_s) in self.rules.get(cid, [])}
        out: dict[str, SideCounter | SideBucketMeta] = {}
        for (prefix, w), devices in pend.quota.items():
            if devices:
                name, exp = side_name(w, prefix), (w + 2) * windows[prefix]
                b = pend.side_buckets[name]
                for bucket, counts in split_buckets(name, b, devices):
                    out[bucket] = SideCounter(counts, expire_at=exp)
                out[keys.side_meta_name(name)] = SideBucketMeta(b, expire_at=exp)
        return out
