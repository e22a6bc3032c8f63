"""Taking records into a partition's pending delta: decode, validate, apply the device quota,
bucket by time and count with numpy (no per-report Python loop). Refused messages are filed on
the delta for ``ldp.dlq`` with their reason (docs/pipeline.md "Wire format")."""
from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from collections.abc import Mapping

import numpy as np
from aiokafka.structs import ConsumerRecord

from ldpstream.agents import metrics
from ldpstream.agents.control.collection_state import CollectionStates
from ldpstream.agents.ingest.dedupe_gate import DedupeGate
from ldpstream.agents.ingest.identity_gate import IdentityGate, Unauthentic
from ldpstream.agents.ingest.log_identity import mark_of
from ldpstream.agents.ingest.memo_gate import MemoGate
from ldpstream.agents.ingest.partition import Decoded, Partitions, PartitionState, Pending
from ldpstream.agents.ingest.quota_gate import QuotaGate
from ldpstream.agents.ingest.side_read import read_side
from ldpstream.agents.ingest.stats import IngestStats
from ldpstream.agents.store import device_memo
from ldpstream.agents.store.apply_guard import BAD_TIMESTAMP, split_bad_timestamps
from ldpstream.config import Collection
from ldpstream.estimators.mechanism import Mechanism, TensorSpec
from ldpstream.producers.codec import (
    DecodeError,
    ReportBatch,
    decode_batch,
    decode_uniform,
    explain_batch,
    is_keyed,
)

#: how far a batch's ``sent_at`` may be from its Kafka record timestamp (and ahead of now)
SENT_AT_TOLERANCE_S = 300.0

Records = list[ConsumerRecord]


class Intake:
    """Decode, validate and count the records of one partition into its pending delta."""

    def __init__(self, collections: dict[str, Collection], states: CollectionStates,
                 partitions: Partitions, quota: QuotaGate, dedupe: DedupeGate,
                 stats: IngestStats, max_message_bytes: int, memo: MemoGate,
                 identity: IdentityGate | None = None) -> None:
        self.collections = collections
        self.states = states
        self.partitions = partitions
        self.quota = quota
        self.dedupe = dedupe
        self.stats = stats
        self.max_message_bytes = max_message_bytes
        self.memo = memo
        self.identity = identity or IdentityGate(None)

    async def load(self, state: PartitionState, msgs: Records) -> None:
        """Read from Redis what :meth:`take` needs for the records ``msgs``: for a memoized
        collection, its devices' latest reports; and the device quota's counters (if the
        collection has one) and the batch-dedupe state of just this poll's devices and senders,
        read with the stored offset in one atomic call, the partition's own deltas not applied
        yet added (docs/scaling.md "Per-device state"). The records are decoded here
        for it, once: :meth:`take` uses them."""
        cid = state.collection
        if self.memo.applies(cid):
            await self.memo.load(state)
        state.decoded = None
        seen = state.seen
        if seen is None:
            return   # not positioned: the take ignores the records
        quota = self.quota.applies(cid)
        if not quota and not any(is_keyed(m.value) for m in msgs):
            # nothing to read (a keyed batch found all the same is refused loudly by the book)
            self.dedupe.wanted(state, [])
            self.dedupe.took(state, [], [], [])
            return
        fresh, _ = split_bad_timestamps([m for m in msgs if m.offset > seen])
        good, refused = self._decode(cid, fresh)
        decoded = Decoded(state.epoch, tuple(m.offset for m in fresh), good, refused)
        senders = sorted({int(b.key[0]) for _, b in good if b.key is not None})
        devices: list[int] = []
        if quota:
            ids = [b.device_ids for _, b in good if b.device_ids is not None]
            devices = np.unique(np.concatenate(ids)).tolist() if ids else []
        wanted = [*self.dedupe.wanted(state, senders),
                  *(self.quota.wanted(state, devices) if quota else [])]
        # captured before the read: whether one was applied meanwhile the offset read tells
        epoch = state.epoch
        mine = [d for d in (state.flushing, state.pending) if d is not None and d.epoch == epoch]
        stored, values = await self.dedupe.gate.retry(
            lambda: read_side(self.dedupe.store, cid, state.tp.partition, state.side_buckets,
                              wanted, self.collections[cid].expected_senders),
            what=f"read the device state of {cid}[{state.tp.partition}]")
        if state.epoch != epoch or self.partitions.get(state.tp) is not state:
            return   # reset meanwhile: re-sought, the records come again
        unapplied = [d for d in mine
                     if stored is None or d.last_offset is None or d.last_offset > stored]
        split = 2 if senders else 0
        self.dedupe.took(state, senders, values[:split], unapplied)
        if quota:
            self.quota.took(state, devices, values[split:], unapplied)
        state.decoded = decoded

    def _decode(self, cid: str, msgs: Records
                ) -> tuple[list[tuple[ConsumerRecord, ReportBatch]],
                           list[tuple[ConsumerRecord, str, str, int]]]:
        """Decode ``msgs`` (and check their device's MAC): the batches, and for each record
        refused its reason, detail and reports."""
        good: list[tuple[ConsumerRecord, ReportBatch]] = []
        refused: list[tuple[ConsumerRecord, str, str, int]] = []
        for m in msgs:
            try:
                b = decode_batch(m.value if m.value is not None else b"",
                                 max_bytes=self.max_message_bytes)
                good.append((m, self.identity.verify(cid, m, b)))
            except Unauthentic as exc:
                refused.append((m, exc.reason, exc.detail, b.n))
            except DecodeError as exc:
                # the topic names the collection even when the bytes cannot: count and file
                # the reject under it (the DLQ record's topic/offset locate the message)
                refused.append((m, exc.reason, exc.detail, 1))
        return good, refused

    def take(self, state: PartitionState, msgs: Records) -> None:
        """Take the records of ``state``'s partition not taken yet into its pending delta."""
        seen = state.seen
        if seen is None or self.partitions.get(state.tp) is not state:
            return  # not (or no longer) positioned at its Redis offset: the records come again
        cid = state.collection
        quota = self.quota.applies(cid)
        memo = self.memo.applies(cid)
        if (quota and state.quota_used is None) or (memo and state.memo is None) \
                or state.dedupe is None or state.dedupe.epoch != state.epoch:
            return  # reset while its state was read: re-sought, the records come again
        if msgs[0].offset <= seen:
            msgs = [m for m in msgs if m.offset > seen]
            if not msgs:
                return
        # continues from ``seen``; the first record's mark is computed only for a new delta
        pend = state.pending or state.open_pending(mark_of(msgs[0]))
        state.seen = msgs[-1].offset
        known = self.states.known()
        pend.messages += len(msgs)
        pend.covers(msgs[-1].offset)
        metrics.MESSAGES_CONSUMED.labels(cid).inc(len(msgs))
        msgs, bad = split_bad_timestamps(msgs)
        for m in bad:  # agents/store/apply_guard.py: never reaches the apply script
            pend.reject(BAD_TIMESTAMP, f"record timestamp {m.timestamp} ms is out of range",
                        m.value or b"", m.offset, 1)
        if not msgs:
            return
        ahead, state.decoded = state.decoded, None
        if ahead is not None and ahead.epoch == state.epoch \
                and ahead.offsets == tuple(m.offset for m in msgs):
            good, refused = ahead.good, ahead.refused   # decoded by load, for their state
        elif quota:   # Intake.load decodes every record of a quota's collection
            raise RuntimeError(f"device quota state of {state.tp} not read for these records")
        else:
            if self._fast(state, pend, msgs, known, memo):
                return
            good, refused = self._decode(cid, msgs)
        for m, reason, detail, n in refused:
            pend.reject(reason, detail, m.value or b"", m.offset, n)
        valid = self._validated(state, pend, good, known)
        if (quota or memo) and valid:
            # the quota and the devices' latest reports decide in offset order (a function of
            # the log: the same after a crash)
            by_version: dict[int, list[tuple[ConsumerRecord, ReportBatch]]] = defaultdict(list)
            runs: list[tuple[ConsumerRecord, ReportBatch]] = []
            held = 0   # reports in ``runs``: at most as many devices not in the state yet
            for m, b in sorted(valid, key=lambda mb: mb[0].offset):
                kept: ReportBatch | None = self.quota.within(state, pend, m, b) if quota else b
                if kept is not None and memo:
                    if not self.memo.has_room(state, held + kept.n, kept.fleet):
                        # near device_state_max: count what is held so the cap sees its devices
                        self._accept_devices(state, pend, runs)
                        runs, held = [], 0
                    kept = self.memo.admit(state, pend, m, kept)
                if kept is not None:
                    held += kept.n
                    runs.append((m, kept))
                    by_version[kept.version].append((m, kept))
            if memo:
                self._accept_devices(state, pend, runs)
            else:
                for version, accepted in by_version.items():
                    self._accept_batches(pend, cid, version, accepted)

    def _fast(self, state: PartitionState, pend: Pending, msgs: Records,
              known: Mapping[str, Mapping[int, Mechanism]], memo: bool) -> bool:
        """Count ``msgs`` of a collection without a quota (``memo``: memoized) in one run when
        they are uniform (same header, no batch key): True when done, False when they must be
        taken message by message."""
        cid = state.collection
        if len(msgs) >= 16 and not (memo or self.identity.enforced):
            # the fast path drops device ids (and takes only unkeyed, so unauthenticated, ones)
            fast = decode_uniform([m.value for m in msgs], self.max_message_bytes)
            if fast is not None and fast.collection == cid and explain_batch(fast, known) is None:
                per = fast.n // len(msgs)
                self._accept(pend, cid, fast.version, fast.reports,
                             self._buckets(cid, msgs, np.full(len(msgs), per)),
                             clamp_sent_at(fast.sent_at, max(m.timestamp for m in msgs) / 1000.0,
                                           time.time()))
                return True
        if len(msgs) >= 16 and memo and not self.identity.enforced:
            # a memoized collection's fast path: the device ids kept, one run, when there is
            # room for every report's device (else each message is admitted on its own below)
            fast = decode_uniform([m.value for m in msgs], self.max_message_bytes, with_ids=True)
            if fast is not None and fast.device_ids is not None and fast.collection == cid \
                    and explain_batch(fast, known) is None and self.memo.has_room(state, fast.n):
                per = fast.n // len(msgs)
                buckets = np.broadcast_to(self._buckets(cid, msgs, np.full(len(msgs), per)),
                                          (fast.n,))
                self._accept_device_run(state, pend, fast.version, fast.device_ids,
                                        fast.reports, buckets,
                                        clamp_sent_at(fast.sent_at,
                                                      max(m.timestamp for m in msgs) / 1000.0,
                                                      time.time()))
                return True
        return False

    def _validated(self, state: PartitionState, pend: Pending,
                   good: list[tuple[ConsumerRecord, ReportBatch]],
                   known: Mapping[str, Mapping[int, Mechanism]]
                   ) -> list[tuple[ConsumerRecord, ReportBatch]]:
        """Validate decoded batches: one vectorized check for all batches sharing (collection,
        version, width); only when that fails, the bad batches are found one by one. Without a
        quota (or memoization) the valid ones are counted here; else they are returned."""
        cid = state.collection
        gated = self.quota.applies(cid) or self.memo.applies(cid)
        groups: dict[tuple[str, int, int], list[tuple[ConsumerRecord, ReportBatch]]] = \
            defaultdict(list)
        for m, b in good:
            groups[(b.collection, b.version, b.width)].append((m, b))
        valid: list[tuple[ConsumerRecord, ReportBatch]] = []
        for (_, version, _), items in groups.items():
            if len(items) > 1:
                joined = dataclasses.replace(items[0][1], reports=np.concatenate(
                    [b.reports for _, b in items]), device_ids=None)
                ok = explain_batch(joined, known) is None if joined.collection == cid else False
            else:
                ok = False
            accepted: list[tuple[ConsumerRecord, ReportBatch]] = []
            for m, b in items:
                res = None if ok else (
                    explain_batch(b, known) if b.collection == cid else
                    ("unknown_collection",
                     f"batch of collection {b.collection!r} on topic {state.tp.topic}"))
                if res is None:
                    if b.key is None or self.dedupe.first_delivery(state, pend, m, b):
                        accepted.append((m, b))
                else:
                    pend.reject(res[0], res[1], m.value or b"", m.offset, b.n)
            if gated:
                valid += accepted
            elif accepted:
                self._accept_batches(pend, cid, version, accepted)
        return valid

    def _accept_batches(self, pend: Pending, cid: str, version: int,
                        accepted: list[tuple[ConsumerRecord, ReportBatch]]) -> None:
        reports = np.concatenate([b.reports for _, b in accepted]) \
            if len(accepted) > 1 else accepted[0][1].reports
        buckets = self._buckets(cid, [m for m, _ in accepted], np.array([b.n for _, b in accepted]))
        now = time.time()
        self._accept(pend, cid, version, reports, buckets,
                     max(clamp_sent_at(b.sent_at, m.timestamp / 1000.0, now) for m, b in accepted))

    def _accept_devices(self, state: PartitionState, pend: Pending,
                        items: list[tuple[ConsumerRecord, ReportBatch]]) -> None:
        """Count a memoized collection's reports by device (agents/store/device_memo.py): each run of
        one version, in offset order, adds the latest report of each device and subtracts the
        report it supersedes."""
        cid = state.collection
        start = 0
        while start < len(items):
            version = items[start][1].version
            end = start
            while end < len(items) and items[end][1].version == version:
                end += 1
            run = items[start:end]
            start = end
            reports = np.concatenate([b.reports for _, b in run])
            ids = np.concatenate([b.device_ids for _, b in run if b.device_ids is not None])
            sizes = np.array([b.n for _, b in run])
            buckets = np.broadcast_to(self._buckets(cid, [m for m, _ in run], sizes),
                                      (reports.shape[0],))
            now = time.time()
            self._accept_device_run(
                state, pend, version, ids, reports, buckets,
                max(clamp_sent_at(b.sent_at, m.timestamp / 1000.0, now) for m, b in run))

    def _accept_device_run(self, state: PartitionState, pend: Pending, version: int,
                           ids: np.ndarray, reports: np.ndarray, buckets: np.ndarray,
                           sent_at: float) -> None:
        """One run of reports of one version (in offset order) counted by device: the latest
        report of each device added, the one it supersedes subtracted."""
        cid = state.collection
        mv = self.memo.moves(state, pend, ids, reports, buckets, version)
        if mv.keep.size == reports.shape[0]:   # no device twice: all of them, in any order
            kb, kept = buckets, reports
        else:
            kb, kept = buckets[mv.keep], reports[mv.keep]
        self._accept(pend, cid, version, kept,
                     kb[:1] if not kb.size or (kb == kb[0]).all() else kb, sent_at,
                     received=int(reports.shape[0]))
        removed = 0
        for (v, b), rows in mv.removed_rows().items():
            removed += self._remove(pend, cid, v, b, rows)
        for (v, _), rows in device_memo.group_rows(mv.evicted).items():
            metrics.MEMO_DEVICES_EVICTED.labels(cid).inc(self._remove(pend, cid, v, -1, rows))
        superseded = int(reports.shape[0]) - int(mv.keep.size) + removed
        if superseded:
            metrics.REPORTS_SUPERSEDED.labels(cid).inc(superseded)

    async def settle(self, cid: str, pend: Pending) -> None:
        """Before a memoized collection's delta is applied: the applied rows it supersedes, read
        back from Redis (agents/ingest/memo_gate.py ``fetch``), subtracted in it."""
        if not self.memo.applies(cid) or not pend.memo:
            return
        rows = await self.memo.fetch(cid, pend)
        removed = 0
        for (v, b), r in device_memo.group_rows(rows).items():
            removed += self._remove(pend, cid, v, b, r)
        if removed:
            metrics.REPORTS_SUPERSEDED.labels(cid).inc(removed)

    def _remove(self, pend: Pending, cid: str, version: int, bucket: int,
                rows: np.ndarray) -> int:
        """Subtract superseded reports of ``version`` counted in ``bucket`` (-1: all-time
        only); cell 0 still grows by their number (it counts changes, so a refresh re-reads the
        bucket: agents/refresh/bucket_reader.py). Returns how many were subtracted (none when their
        version is no longer known)."""
        state = self.states[cid]
        mech = state.versions().get(version)
        if mech is None:
            return 0
        layout = state.layout(version)
        flat = -layout.pack(count_reports(mech, rows, list(layout.specs)), 0)
        flat[0] = rows.shape[0]
        key = (layout, None if bucket < 0 or not self.collections[cid].policy.bucketed
               else bucket)
        cur = pend.deltas.get(key)
        if cur is None:
            pend.deltas[key] = flat
        else:
            cur += flat
        return int(rows.shape[0])

    def _buckets(self, cid: str, msgs: Records, sizes: np.ndarray) -> np.ndarray:
        """Fine bucket of every report (message i holds ``sizes[i]`` of them) from its message's
        Kafka record timestamp (ldpstream/windows.py); -1: all-time only (no finite window, or late).
        One element when every report falls in the same bucket. Reports whose timestamp was
        moved are counted per reason."""
        now = time.time()
        ts = np.fromiter((m.timestamp if m.timestamp is not None else -1 for m in msgs),
                         dtype=np.float64, count=len(msgs)) / 1000.0
        ts[ts < 0] = now
        buckets, future, late = self.collections[cid].policy.place_many(ts, now)
        for why, mask in (("future", future), ("late", late)):
            if mask.any():
                metrics.REPORTS_CLAMPED.labels(cid, why).inc(int(sizes[mask].sum()))
        if len(buckets) and (buckets == buckets[0]).all():
            return buckets[:1]   # the usual poll: one bucket, no per-report array
        return np.repeat(buckets, sizes)

    def _accept(self, pend: Pending, cid: str, version: int, reports: np.ndarray,
                buckets: np.ndarray, sent_at: float, received: int | None = None) -> None:
        """Count validated reports of one mechanism ``version`` into the partition's running
        delta, per fine bucket (``buckets`` from :meth:`_buckets`: one bucket for all of them, or
        ``buckets[i]`` of report i; -1 = all-time only). Counted per poll, so the arrays stay
        cache-sized and memory is the tensors', not the reports'. ``received``: the reports
        these stand for (a memoized collection counts only each device's latest)."""
        t0 = time.perf_counter()
        state = self.states[cid]
        layout = state.layout(version)
        mech = state.versions()[version]
        specs = list(layout.specs)
        if len(buckets) <= 1:   # _buckets collapsed a single bucket to one element
            parts = [(int(buckets[0]) if len(buckets) else -1, reports)]
        else:
            cuts = np.flatnonzero(buckets[1:] != buckets[:-1]) + 1
            if len(cuts) <= 8:  # a few runs of one bucket (offset order): slices, no copies
                edges = [0, *cuts.tolist(), len(buckets)]
                parts = [(int(buckets[a]), reports[a:z]) for a, z in zip(edges, edges[1:])]
            else:
                parts = [(int(b), reports[buckets == b]) for b in np.unique(buckets)]
        for b, rep in parts:
            if not rep.shape[0]:
                continue   # (every device of a memoized run resent its row: nothing moves)
            flat = layout.pack(count_reports(mech, rep, specs), rep.shape[0])
            key = (layout, None if b < 0 else b)
            cur = pend.deltas.get(key)
            if cur is None:
                pend.deltas[key] = flat
            else:
                cur += flat
        n = int(reports.shape[0]) if received is None else received
        pend.n += n
        self.partitions.pending_reports += n
        if pend.sent_at_max is None or sent_at > pend.sent_at_max:
            pend.sent_at_max = sent_at
        self.stats.timings["count"] += time.perf_counter() - t0


def clamp_sent_at(sent_at: float, record_ts: float, now: float,
                  tolerance: float = SENT_AT_TOLERANCE_S) -> float:
    """A device's ``sent_at`` within ``[record_ts - tolerance, min(record_ts, now) + tolerance]``:
    one report claiming ``sent_at = 1e300`` must not pin the freshness gauge forever."""
    return min(max(sent_at, record_ts - tolerance), min(record_ts, now) + tolerance)


def count_reports(mech: Mechanism, reports: np.ndarray, specs: list[TensorSpec]
                  ) -> dict[str, np.ndarray]:
    """The count tensors of validated reports: the mechanism's own count when it has one
    (``Mechanism.custom_count``); else histograms of ``spec.columns`` computed fast: each used
    column converted once, flat cell indices by multiply-add, one ``bincount`` per tensor (no
    bounds re-check: the batch passed ``check_batch`` against ``report_bounds()``)."""
    if mech.custom_count or any(not s.columns for s in specs):
        return mech.count(reports, specs)
    out = {}
    cols = np.ascontiguousarray(reports.T)  # each column contiguous: one copy, not one per use
    for s in specs:
        size = s.size
        # the cell index in the narrowest dtype that holds it, built in place
        dt = np.uint16 if size <= 1 << 16 else np.uint32 if size <= 1 << 32 else np.intp
        flat = cols[s.columns[0]].astype(dt)
        for c, width in zip(s.columns[1:], s.shape[1:]):
            np.multiply(flat, width, out=flat, casting="unsafe")
            np.add(flat, cols[c], out=flat, casting="unsafe")  # validated: in bounds
        out[s.key] = np.bincount(flat, minlength=size).astype(np.int64, copy=False).reshape(s.shape)
    return out
