"""The flusher/applier of the ingest worker: pending deltas → ``ldp.dlq`` (their rejects) and
Redis (their counts): per flush and collection one ``CountStore.apply_many``, which sends one
compare-and-set script call per partition with something pending, concurrently
(agents/store/count_store.py).

At most one flush is in flight, in a background task, so the next messages are fetched and
decoded while Redis applies these. Each partition's delta is decided on its own: APPLIED moves
its stored offset; REPLAYED (already counted) is skipped; a CONFLICT (someone else moved the
offset) drops what is pending and re-seeks the partition (agents/ingest/rebalance.py ``Seeker``).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

from aiokafka import TopicPartition

from ldpstream.agents import metrics
from ldpstream.agents.ingest.clients import REDIS_ERRORS, Abandoned, Clients, RedisGate
from ldpstream.agents.ingest.dedupe_gate import DedupeGate
from ldpstream.agents.ingest.dlq_writer import DlqWriter
from ldpstream.agents.ingest.memo_gate import DEVICE_STATE_FULL, MemoGate
from ldpstream.agents.ingest.partition import Partitions, Pending
from ldpstream.agents.ingest.quota_gate import QuotaGate
from ldpstream.agents.ingest.rebalance import Seeker
from ldpstream.agents.ingest.stats import IngestStats
from ldpstream.agents.store.apply_delta import ApplyResult, ApplyStatus, PartitionDelta
from ldpstream.agents.store.count_store import CountStore
from ldpstream.config import Collection

log = logging.getLogger("ldpstream.agents.ingest.service")

#: how often idle partitions' stored offsets are checked (seconds)
OFFSET_AUDIT_S = 5.0


class Applier:
    """Applies pending deltas exactly once; audits idle partitions' stored offsets."""

    def __init__(self, collections: dict[str, Collection], clients: Clients, gate: RedisGate,
                 partitions: Partitions, store: CountStore, quota: QuotaGate, dlq: DlqWriter,
                 seeker: Seeker, stats: IngestStats) -> None:
        self.collections = collections
        self.clients = clients
        self.gate = gate
        self.partitions = partitions
        self.store = store
        self.quota = quota
        self.dlq = dlq
        self.seeker = seeker
        self.stats = stats
        self._task: asyncio.Task[None] | None = None
        #: partitions of the apply attempt in flight (revocation waits for them)
        self.applying: set[TopicPartition] = set()
        #: a flush that failed unexpectedly; ``on_failure`` (the ingest service's crash) is told
        self.failed: BaseException | None = None
        self.on_failure: Callable[[BaseException], Awaitable[None]] | None = None
        #: completes a delta before it is applied (agents/ingest/intake.py ``settle``: the
        #: device rows a memoized collection's delta supersedes, read back and subtracted)
        self.settle: Callable[[str, Pending], Awaitable[None]] | None = None

    def in_flight(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start_flush(self, tps: list[TopicPartition]) -> None:
        """Hand the pending deltas of ``tps`` to a background flush. A new one first waits for
        the previous (which also bounds memory, e.g. while Redis is down)."""
        await self.wait_flushed()
        batch = self.partitions.take_pending(tps)
        if batch:
            self._task = asyncio.create_task(self._flush(batch), name="ldp-ingest-flush")

    async def wait_flushed(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await task

    async def flush(self) -> None:
        """Apply every partition's pending delta now and wait for it."""
        await self.start_flush(self.partitions.with_pending())
        await self.wait_flushed()

    async def stop(self, timeout: float) -> None:
        """Let an apply in flight finish (it is atomic anyway), at most ``timeout`` seconds."""
        task = self._task
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout)
            except Exception:  # noqa: BLE001
                task.cancel()

    async def _flush(self, batch: dict[TopicPartition, Pending]) -> None:
        """DLQ records first, then one apply per collection (collections concurrently).
        Only stale deltas are dropped; an unexpected error stops the worker (it restarts from
        the offsets in Redis) rather than leave consumed-but-uncounted records behind."""
        live = [p for p in batch.values()
                if not self.partitions.is_stale(p) and p.last_offset is not None]
        by_cid: dict[str, list[Pending]] = defaultdict(list)
        for p in live:
            by_cid[self._cid(p)].append(p)
        try:
            await asyncio.gather(*(self.dlq.send(self._cid(p), p) for p in live if p.rejects))
            await asyncio.gather(*(self._apply_collection(cid, parts)
                                   for cid, parts in by_cid.items()))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            log.exception("ingest: flush failed; stopping the worker (it resumes from Redis)")
            self.failed = exc
            if self.on_failure is not None:
                await self.on_failure(exc)
        finally:
            for p in batch.values():
                self.partitions.settled(p)

    def _cid(self, pend: Pending) -> str:
        state = self.partitions.get(pend.tp)
        if state is not None:
            return state.collection
        return next(c for c, coll in self.collections.items() if coll.topic == pend.tp.topic)

    def delta(self, cid: str, p: Pending) -> PartitionDelta:
        """What the apply of ``p`` (of a partition of ``cid``, with messages) carries: its
        counts, offsets and side state."""
        assert p.last_offset is not None
        return PartitionDelta(p.tp.partition, p.last_offset, p.deltas, p.n, expected=p.base,
                              sent_at_max=p.sent_at_max,
                              side={**self.quota.side(cid, p), **DedupeGate.side(p),
                                    **MemoGate.side(p)})

    async def _apply(self, cid: str, live: list[Pending]) -> list[ApplyResult]:
        """THE apply call site: these partitions' deltas to ``CountStore.apply_many`` (one
        compare-and-set script call per partition, sent together)."""
        return await self.store.apply_many(
            cid, [self.delta(cid, p) for p in live if p.last_offset is not None],
            self.collections[cid].policy)

    async def _apply_collection(self, cid: str, parts: list[Pending]) -> None:
        """Apply ``parts`` (partitions of ``cid``), retried while Redis is unreachable (stale
        partitions are left out of every retry), then act on each partition's result."""
        t0 = time.perf_counter()
        settle = self.settle
        if settle is not None:
            async def complete(p: Pending) -> None:
                if not self.partitions.is_stale(p):
                    try:
                        await settle(cid, p)
                    except Abandoned:
                        pass   # revoked meanwhile: left out of the apply below

            await asyncio.gather(*(complete(p) for p in parts))   # their reads sent together

        async def attempt() -> list[tuple[Pending, ApplyResult]]:
            live = [p for p in parts if not self.partitions.is_stale(p)]
            if not live:
                raise Abandoned("all revoked")
            tps = {p.tp for p in live}
            self.applying |= tps
            try:
                res = await self._apply(cid, live)
            finally:
                self.applying -= tps
            return list(zip(live, res))

        try:
            results = await self.gate.retry(
                attempt, what=f"apply {cid}{sorted(p.tp.partition for p in parts)}",
                abandon=lambda: all(self.partitions.is_stale(p) for p in parts))
        except Abandoned:
            log.info("ingest: %s %s revoked while Redis was down; deltas left to the new owner",
                     cid, sorted(p.tp.partition for p in parts))
            return
        elapsed = time.perf_counter() - t0
        metrics.BATCH_APPLY_SECONDS.labels(cid).observe(elapsed)
        self.stats.timings["apply"] += elapsed
        for pend, res in results:
            await self._settle(cid, pend, res)

    async def _settle(self, cid: str, pend: Pending, res: ApplyResult) -> None:
        tp, stats = pend.tp, self.stats
        state = None if self.partitions.is_stale(pend) else self.partitions.get(tp)
        if res.status is ApplyStatus.APPLIED:
            stats.applied_batches += 1
            stats.applied_reports += pend.n
            stats.last_apply_at = time.time()
            stats.last_apply_cpu = time.process_time()
            if pend.n:
                metrics.REPORTS_INGESTED.labels(cid).inc(pend.n)
            if pend.duplicates:
                metrics.DUPLICATE_BATCHES.labels(cid).inc(pend.duplicates)
            for reason, k in pend.rejected_reports.items():
                metrics.REPORTS_REJECTED.labels(cid, reason).inc(k)
            if pend.rejected_reports.get(DEVICE_STATE_FULL):
                stats.device_state_full[cid] = stats.device_state_full.get(cid, 0) + \
                    pend.rejected_reports[DEVICE_STATE_FULL]
            if state is not None:
                state.stored = pend.last_offset
            current = self.partitions.get(tp)
            if pend.mark is not None and current is not None and not current.marked:
                mark = str(pend.mark)
                await self.gate.retry(lambda: self.store.set_log_mark(cid, tp.partition, mark),
                                      what=f"mark the log of {cid}[{tp.partition}]")
                current.marked = True
        elif res.status is ApplyStatus.REPLAYED and res.stored == pend.last_offset:
            # counted up to exactly here already (e.g. our own apply whose reply was lost to a
            # timeout): the position is right, the next delta continues from it
            stats.skipped_batches += 1
            log.info("ingest: %s[%d] offsets (%d, %d] already counted; skipped", cid,
                     tp.partition, pend.base, pend.last_offset)
            if state is not None:
                state.stored = res.stored
        else:
            if res.status is ApplyStatus.REPLAYED:
                stats.skipped_batches += 1
            else:
                stats.conflicts += 1
            log.warning("ingest: %s[%d] delta (%d, %d] %s: stored offset is %s; dropping "
                        "what is pending and re-reading from there", cid, tp.partition,
                        pend.base, pend.last_offset, res.status.value, res.stored)
            if state is not None:
                await self.seeker.resync(state, res.stored)

    async def audit_offsets(self) -> None:
        """Re-read an idle partition whose stored offset went BACK behind the one this worker
        applied: acknowledged writes were lost (a Redis Cluster failover: replication is
        asynchronous, count deltas and offset are lost together). A partition with traffic finds
        out at its next apply (CONFLICT); one with none would stay short until its next report.
        Only when no flush is in flight, for partitions with nothing pending; a read error is
        left to the next apply (which retries and pauses consumption)."""
        if self.clients.consumer is None or self.gate.blocked or self.in_flight():
            return
        ours: dict[str, dict[TopicPartition, int]] = defaultdict(dict)
        assigned = self.clients.assignment()
        for state in self.partitions:
            if state.stored is not None and state.pending is None and state.tp in assigned:
                ours[state.collection][state.tp] = state.stored
        for cid, mine in ours.items():
            try:
                stored = await self.store.offsets(cid, [tp.partition for tp in mine])
            except REDIS_ERRORS:
                return
            for tp, applied in mine.items():
                now_stored = stored.get(tp.partition)
                idle = self.partitions.get(tp)
                if (now_stored is not None and now_stored >= applied) or idle is None \
                        or idle.pending is not None or idle.stored != applied:
                    continue  # as applied (or ahead: another owner), or moved on meanwhile
                self.stats.lost_rereads += 1
                log.warning("ingest: %s[%d] stored offset %s is behind %d, applied by this "
                            "worker: writes were lost (Redis failover?); re-reading from there",
                            cid, tp.partition, now_stored, applied)
                await self.seeker.resync(idle, now_stored)
