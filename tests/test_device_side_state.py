"""Per-device side state read per poll (docs/scaling.md "Per-device state"): the worker
reads the batch-dedupe state and the device quota's counters of just the senders and devices of
each poll, with the stored offset, and adds its own deltas not applied yet (pending, and the one
in flight). So its memory does not grow with the senders in Redis, and a duplicate, a stale
sequence or a report over the quota is refused exactly as when the whole state was in memory,
whether the delta before it is pending, in flight or applied, across a kill -9 and a restart,
and from state written by earlier versions."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import wait_for_n, write_config

pytestmark = pytest.mark.pipeline

QUOTA = 3


def _quota_collection(tmp_path: Path, cid: str, partitions: int) -> str:
    import yaml

    path = write_config(tmp_path / "c.yaml", cid, columns=("sex", "Salary"),
                        partitions=partitions, marginals=[("sex", "Salary")])
    doc = yaml.safe_load(open(path))
    doc["collections"][0]["device_quota"] = {"reports": QUOTA, "window_s": 86400}
    yaml.safe_dump(doc, open(path, "w"))
    return path


def _batch(coll, sender: int, seq: int, n: int = 1) -> bytes:
    from ldpstream.producers.codec import encode_batch

    rep = np.stack([np.arange(n) % 2, (np.arange(n) // 2) % 2], axis=1)
    return encode_batch(coll.id, coll.version, rep, device_ids=np.full(n, sender, np.uint64),
                        key=(sender, seq))


async def _preload(store, cid: str, partition: int, first: int, count: int, step: int,
                   high: int, used: int, single: bool = True) -> None:
    """State for senders ``first + step * i``: dedupe ``"<high>:<bitmap>"`` text, quota counts,
    in the current windows; as earlier versions wrote it (``single``: one hash a window), or
    bucketed as the applies write it now."""
    from ldpstream.bench.device_side import write_side_state

    await write_side_state(store, cid, partition, first, count, step, high, 0, used, 86400,
                           single=single)


@pytest.mark.parametrize("single", [True, False], ids=["earlier-format", "bucketed"])
def test_a_poll_reads_its_senders_only_and_sees_its_unapplied_deltas(tmp_path, redis_target,
                                                                      unique_name, single):
    """In the worker's own parts on a real Redis (one server, then a Redis Cluster: the reads
    and the apply on the shard's slot) holding 20,000 senders (as earlier versions wrote them,
    one hash a window, or in the buckets and meta hash the applies write now): a
    poll's book and quota use hold that poll's senders only; a duplicate of a batch whose delta
    is pending, in flight (handed to the flush, not applied) or applied is refused, and the
    quota's counts of an in-flight delta are added once, before and after its apply."""
    from aiokafka import TopicPartition
    from aiokafka.structs import ConsumerRecord

    from ldpstream.agents.app import make_store
    from ldpstream.agents.control.collection_state import CollectionStates
    from ldpstream.agents.ingest.applier import Applier
    from ldpstream.agents.ingest.clients import Clients, RedisGate
    from ldpstream.agents.ingest.dedupe_gate import DedupeGate
    from ldpstream.agents.ingest.dlq_writer import DlqWriter
    from ldpstream.agents.ingest.intake import Intake
    from ldpstream.agents.ingest.memo_gate import MemoGate
    from ldpstream.agents.ingest.partition import Partitions
    from ldpstream.agents.ingest.quota_gate import QuotaGate
    from ldpstream.agents.ingest.rebalance import Seeker
    from ldpstream.agents.ingest.stats import IngestStats
    from ldpstream.config import load_config

    cid = unique_name
    coll = load_config(_quota_collection(tmp_path, cid, 1)).collections[cid]
    tp = TopicPartition(coll.topic, 0)
    offset = iter(range(1_000_000))

    def records(*values: bytes) -> list[ConsumerRecord]:
        now_ms = int(time.time() * 1000)
        return [ConsumerRecord(tp.topic, 0, next(offset), now_ms, 0, None, v, None, 0, len(v), [])
                for v in values]

    async def run() -> None:
        store = make_store(redis_target.url)
        collections = {cid: coll}
        clients, partitions = Clients(), Partitions()
        gate = RedisGate(clients, partitions)
        quota = QuotaGate(collections, gate, store)
        stats = IngestStats()
        intake = Intake(collections, CollectionStates(collections), partitions, quota,
                        DedupeGate(gate, store), stats, 1 << 20,
                        MemoGate(collections, gate, store))
        applier = Applier(collections, clients, gate, partitions, store, quota,
                          DlqWriter(clients), Seeker(clients, partitions), stats)
        await _preload(store, cid, 0, 1000, 20_000, 1, 100, QUOTA, single)
        state = partitions.assign(tp, cid)
        state.seen = -1

        async def poll(*values: bytes) -> None:
            msgs = records(*values)
            await intake.load(state, msgs)
            intake.take(state, msgs)

        # 1000: seen up to 100, at its quota; 7 new, 5 reports (3 within the quota)
        await poll(_batch(coll, 1000, 100), _batch(coll, 1000, 101), _batch(coll, 7, 1, 5))
        book, used = state.dedupe, state.quota_used
        assert book is not None and used is not None
        assert book.known == {1000, 7}                         # this poll's senders only
        assert sum(len(u) for u in used.values()) == 2         # and devices
        p1 = state.pending
        assert p1 is not None and p1.duplicates == 1 and p1.n == 3
        assert p1.rejected_reports == {"over_quota": 1 + 2}
        # handed to the flush, not applied yet: its state is in no Redis hash
        partitions.take_pending([tp])
        assert state.flushing is p1
        await poll(_batch(coll, 7, 1), _batch(coll, 8, 1, 2))
        p2 = state.pending
        assert p2 is not None and p2.duplicates == 1 and p2.n == 2
        assert p2.rejected_reports == {}
        # applied now (its flush not settled yet): read from Redis, never added twice
        res = await store.apply_many(cid, [applier.delta(cid, p1)], coll.policy)
        assert res[0].applied
        await poll(_batch(coll, 7, 2, 1), _batch(coll, 8, 2, 2), _batch(coll, 7, 1))
        assert state.quota_used is not None
        at = next(iter(state.quota_used))
        assert state.quota_used[at] == {7: 3, 8: 3}   # 7's 3 counted once (applied, in flight)
        assert p2.duplicates == 2 and p2.rejected_reports == {"over_quota": 1 + 1}
        assert p2.n == 3   # 8: 2 + 1 within its quota of 3
        # more than 64 below the highest (101, applied): refused as stale
        await poll(_batch(coll, 1000, 101 - 65), _batch(coll, 1000, 101 - 64))
        assert p2.rejected_reports.get("stale_sequence") == 1 and p2.duplicates == 2
        assert p2.rejected_reports["over_quota"] == 2 + 1   # 37 is new, 1000 at its quota
        await store.close()

    asyncio.run(run())


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise AssertionError("no VmRSS")


def test_worker_memory_does_not_grow_with_the_senders_in_redis(tmp_path, kafka_broker,
                                                             redis_server, spawn_worker,
                                                             unique_name):
    """100,000 senders per partition in Redis (written as by earlier versions), a worker taking
    keyed batches from some of them: its resident memory grows by far less than it would holding
    them (≈ 100 bytes each), duplicates of the stored state are refused, and after a kill -9
    and a restart the same batches again change nothing."""
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.producers.publisher import Publisher

    cid = unique_name
    path = _quota_collection(tmp_path, cid, 2)
    coll = load_config(path).collections[cid]
    per_partition = 100_000

    async def run() -> None:
        store = make_store(redis_server.url)
        for p in range(2):
            await _preload(store, cid, p, 10 + p, per_partition, 2, 5, 1)
        worker = spawn_worker(path)
        worker.wait_ready(60)
        before = _rss_mb(worker.proc.pid)
        # per partition: 200 stored senders re-sending their sequence 5 (duplicates), the same
        # 200 with sequence 6 (new: one report each, 2 of their quota of 3), 300 new senders
        msgs = []
        for p in range(2):
            old = [10 + p + 2 * i for i in range(200)]
            msgs += [(p, _batch(coll, s, 5)) for s in old]
            msgs += [(p, _batch(coll, s, 6)) for s in old]
            msgs += [(p, _batch(coll, 10**9 + 2 * i + p, 1, 2)) for i in range(300)]
        want = 2 * (200 + 300 * 2)
        async with Publisher(kafka_broker.bootstrap) as pub:
            for p, m in msgs:
                await pub.send(coll.topic, m, partition=p)
            await pub.flush()
            assert await wait_for_n(store, cid, want, 30) == want, worker.log_tail()
            grown = _rss_mb(worker.proc.pid) - before
            worker.kill()
            w2 = spawn_worker(path)
            w2.wait_ready(60)
            for p, m in msgs:                  # every batch again: all duplicates now
                await pub.send(coll.topic, m, partition=p)
            await pub.send(coll.topic, _batch(coll, 10**9, 2), partition=0)   # one new
            await pub.flush()
            assert await wait_for_n(store, cid, want + 1, 30) == want + 1, w2.log_tail()
            await asyncio.sleep(1.0)
            assert await store.n(cid, 2) == want + 1
        await store.close()
        # holding 200,000 senders' dedupe and quota state takes ≈ 40 MB (measured: the code
        # before this one)
        assert grown < 15.0, grown

    asyncio.run(run())
