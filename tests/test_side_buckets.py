"""Per-device side state in buckets (agents/store/side_buckets.py, docs/scaling.md "Per-device
state"): each window's dedupe and quota fields spread over hashes small enough to stay
listpack-encoded, at the bytes per sender stated; the buckets of a window chosen from the window
before, recorded by the first apply and checked by every read and apply; state written by earlier
versions (one hash per window) still honoured. On one Redis and on a Redis Cluster."""
from __future__ import annotations

import time

import numpy as np
import pytest
from redis.asyncio.cluster import RedisCluster
from store_helpers import with_stores

from ldpstream.agents.ingest.dedupe_gate import DedupeGate
from ldpstream.agents.ingest.partition import Pending
from ldpstream.agents.ingest.quota_gate import QuotaGate
from ldpstream.agents.ingest.side_read import SideWant, read_side
from ldpstream.agents.metrics import REGISTRY
from ldpstream.agents.store import dedupe, keys, quota
from ldpstream.agents.store.apply_delta import ApplyStatus, PartitionDelta
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.side_buckets import (
    LISTPACK_FIELDS,
    TARGET_FILL,
    bucket_of,
    buckets_for,
)

pytestmark = pytest.mark.pipeline

FLEET = 50_000
STEP = 5_000
#: Redis bytes per sender the buckets stay under (MEMORY USAGE of buckets and meta over the
#: senders; random 64-bit ids): a full 64-bit bitmap's dedupe text, and a quota count; the
#: single hash of earlier versions took 72-81 and 48-57
DEDUPE_BYTES, QUOTA_BYTES = 45.0, 20.0


def _windows() -> tuple[int, int]:
    """The current dedupe and (daily) quota windows of this clock."""
    now = time.time()
    return dedupe.window_of(now), quota.window_of(now * 1000, 86400)


def _pending(cid: str, senders: np.ndarray, dw: int, qw: int, b_dedupe: int,
             b_quota: int) -> Pending:
    """A delta setting every sender's dedupe state (high = id % 1000 + 70, a full bitmap) in
    window ``dw`` and counting 3 reports of each in quota window ``qw``."""
    from aiokafka import TopicPartition

    pend = Pending(TopicPartition(f"ldp.reports.{cid}", 0), epoch=0)
    ids = senders.tolist()
    pend.dedupe[dw] = {d: f"{d % 1000 + 70}:{(1 << 64) - 1}" for d in ids}
    pend.quota[(quota.WINDOW_PREFIX, qw)] = dict.fromkeys(ids, 3)
    pend.side_buckets[dedupe.side_name(dw)] = b_dedupe
    pend.side_buckets[quota.side_name(qw)] = b_quota
    return pend


def _side(store: CountStore, cid: str, pend: Pending) -> dict:
    """The side state of ``pend`` as the worker's gates bucket it."""
    from ldpstream.agents.ingest.clients import Clients, RedisGate
    from ldpstream.agents.ingest.partition import Partitions
    from ldpstream.config import Collection

    coll = Collection.model_validate({
        "id": cid, "schema": {"attributes": {"a": ["x", "y"]}}, "epsilon": 1.0,
        "marginals": [["a"]], "device_quota": {"reports": 5, "window_s": 86400}})
    gate = QuotaGate({cid: coll}, RedisGate(Clients(), Partitions()), store)
    return {**gate.side(cid, pend), **DedupeGate.side(pend)}


async def _apply(store: CountStore, cid: str, offset: int, pend: Pending,
                 expected: int | None = None) -> ApplyStatus:
    res = await store.apply_many(cid, [PartitionDelta(0, offset, {}, 0, expected=expected,
                                                      side=_side(store, cid, pend))])
    return res[0].status


async def _bucket_keys(store: CountStore, cid: str, name: str) -> list[bytes]:
    pattern = keys.glob_escape(keys.side_key(cid, 0, name)) + ":*"
    return [k async for k in store.redis.scan_iter(match=pattern)]


def test_buckets_follow_the_fleet_and_spread_ids_evenly():
    assert buckets_for(0) == 1 and buckets_for(0, 1024) == 22
    assert buckets_for(FLEET) == -(-FLEET // TARGET_FILL) == buckets_for(10, FLEET)
    b = buckets_for(FLEET)
    for ids in (np.arange(FLEET, dtype=np.uint64),                              # sequential
                np.random.default_rng(1).integers(0, 2**64 - 1, FLEET, dtype=np.uint64)):
        fill = np.bincount(bucket_of(ids, b), minlength=b)
        assert fill.max() < LISTPACK_FIELDS and fill.min() > 12, (fill.min(), fill.max())
    with pytest.raises(ValueError, match="buckets"):
        bucket_of(np.arange(3, dtype=np.uint64), 0)


@pytest.mark.parametrize("target", ["redis", "redis-cluster"])
def test_a_fleet_of_50000_stays_listpack_encoded(request, target, unique_name):
    """50,000 senders' dedupe state and quota counts applied in the buckets sized for them:
    every bucket a listpack, the bytes per sender below the bound, read back exactly, and a
    replay changes nothing."""
    url = request.getfixturevalue("redis_server" if target == "redis" else "redis_cluster").url
    cid = unique_name
    dw, qw = _windows()
    # random 64-bit ids, half of them above 2**63 (stored as signed integers)
    senders = np.unique(np.random.default_rng(7).integers(1, 2**64 - 1, FLEET + 100,
                                                          dtype=np.uint64))[:FLEET]
    assert (senders >= 2**63).sum() > FLEET // 3
    b = buckets_for(0, FLEET)

    async def body(store: CountStore) -> None:
        # Redis' default (some builds ship a higher one): a bucket past it is a hashtable
        nodes = {"target_nodes": RedisCluster.ALL_NODES} if target != "redis" else {}
        was = (await store.redis.config_get("hash-max-listpack-entries", **nodes))
        was = next(iter(was.values())) if target != "redis" else was
        await store.redis.config_set("hash-max-listpack-entries", LISTPACK_FIELDS, **nodes)
        try:
            await fleet(store)
        finally:
            await store.redis.config_set("hash-max-listpack-entries",
                                         was["hash-max-listpack-entries"], **nodes)

    async def fleet(store: CountStore) -> None:
        # in deltas of 5,000 senders, as a worker's polls bring them (one script call of all
        # 50,000 would hold a cluster master past its node timeout on a loaded machine)
        pend = _pending(cid, senders, dw, qw, b, b)
        for i in range(0, FLEET, STEP):
            part = _pending(cid, senders[i:i + STEP], dw, qw, b, b)
            assert await _apply(store, cid, i + STEP, part, expected=i or -1) \
                is ApplyStatus.APPLIED
        assert await _apply(store, cid, FLEET, part, expected=FLEET - STEP) \
            is ApplyStatus.REPLAYED
        for name, bound in ((dedupe.side_name(dw), DEDUPE_BYTES),
                            (quota.side_name(qw), QUOTA_BYTES)):
            ks = await _bucket_keys(store, cid, name)
            meta = keys.side_key(cid, 0, keys.side_meta_name(name)).encode()
            assert meta in ks and len(ks) == b + 1
            assert await store.redis.hgetall(meta) == {b"b": str(b).encode(),
                                                       b"n": str(FLEET).encode()}
            used = 0
            for k in ks:
                assert await store.redis.object("encoding", k) == b"listpack", k
                used += int(await store.redis.memory_usage(k, samples=0))
            print(f"{name}: {used / FLEET:.1f} bytes a sender")
            assert used / FLEET < bound, (name, used / FLEET)
        sizes: dict[str, int] = {}
        some = senders[:3000].tolist()
        stored, (prev, cur, used_q) = await read_side(
            store, cid, 0, sizes,
            [SideWant(dedupe.side_name(dw - 1), dedupe.side_name(dw - 2), some, False),
             SideWant(dedupe.side_name(dw), dedupe.side_name(dw - 1), some, False),
             SideWant(quota.side_name(qw), quota.side_name(qw - 1), some, True)])
        assert stored == FLEET and sizes[dedupe.side_name(dw)] == b
        assert prev == [None] * len(some)
        assert cur == [pend.dedupe[dw][d].encode() for d in some]
        assert used_q == [b"3"] * len(some)
        for state in ("dedupe", "quota"):   # the current window's fields per bucket
            assert REGISTRY.get_sample_value("ldp_side_bucket_fill", {
                "collection": cid, "state": state, "partition": "0"}) == FLEET / b

    with_stores(url, body, {})


@pytest.mark.parametrize("target", ["redis", "redis-cluster"])
def test_buckets_are_chosen_from_the_window_before_and_agreed(request, target, unique_name):
    """A window's buckets: from the fields of the window before (bucketed, or one hash written
    by earlier versions); once recorded by an apply, a delta bucketed otherwise is refused as a
    conflict (nothing written) and a reader that sized it otherwise reads again with the
    recorded ones."""
    url = request.getfixturevalue("redis_server" if target == "redis" else "redis_cluster").url
    cid = unique_name
    dw, qw = _windows()
    grown = np.arange(1, 6001, dtype=np.uint64)

    async def body(store: CountStore) -> None:
        # window before: 3,000 senders in 1 bucket (a small first window)
        first = _pending(cid, grown[:3000], dw - 1, qw - 1, 1, 1)
        assert await _apply(store, cid, 1, first, expected=-1) is ApplyStatus.APPLIED
        name = dedupe.side_name(dw)
        assert await store.side_sizing(cid, 0, name, dedupe.side_name(dw - 1)) == (None, 3000)
        # the reader sizes the new window from it (the fleet grew: more buckets)
        sizes: dict[str, int] = {}
        want = [SideWant(name, dedupe.side_name(dw - 1), grown.tolist(), False)]
        await read_side(store, cid, 0, sizes, want, 0)
        assert sizes[name] == buckets_for(3000) == 63
        # an apply bucketed otherwise than the recorded buckets is refused, nothing written
        pend = _pending(cid, grown, dw, qw, sizes[name], buckets_for(3000))
        assert await _apply(store, cid, 2, pend, expected=1) is ApplyStatus.APPLIED
        other = _pending(cid, grown[:10] + 10_000, dw, qw, 40, 40)
        assert await _apply(store, cid, 3, other, expected=2) is ApplyStatus.CONFLICT
        assert await store.offset(cid, 0) == 2
        assert len(await _bucket_keys(store, cid, name)) == 63 + 1
        # a reader holding other buckets for the window reads again with the recorded ones
        sizes[name] = 40
        _, (vals,) = await read_side(store, cid, 0, sizes, want, 0)
        assert sizes[name] == 63 and vals == [pend.dedupe[dw][d].encode()
                                             for d in grown.tolist()]
        # a window after one written by earlier versions (one hash): sized from its fields
        old = keys.side_key(cid, 0, dedupe.side_name(dw + 1))
        await store.redis.hset(old, mapping={str(i): "5:0" for i in range(1, 4801)})
        assert await store.side_sizing(cid, 0, dedupe.side_name(dw + 2),
                                       dedupe.side_name(dw + 1)) == (None, 4800)

    with_stores(url, body, {})


@pytest.mark.parametrize("target", ["redis", "redis-cluster"])
def test_state_of_earlier_versions_is_honoured(request, target, unique_name):
    """The single hash an earlier version wrote for the current window: its dedupe state is
    read while no bucket holds the sender (a bucket's, newer, wins), its quota counts are added
    to the buckets'."""
    url = request.getfixturevalue("redis_server" if target == "redis" else "redis_cluster").url
    cid = unique_name
    dw, qw = _windows()
    ids = np.arange(100, 110, dtype=np.uint64)

    async def body(store: CountStore) -> None:
        await store.redis.hset(keys.side_key(cid, 0, dedupe.side_name(dw)),
                               mapping={str(d): "50:1" for d in ids.tolist()})
        await store.redis.hset(keys.side_key(cid, 0, quota.side_name(qw)),
                               mapping={str(d): "2" for d in ids.tolist()})
        # half of them counted again since the upgrade
        assert await _apply(store, cid, 1, _pending(cid, ids[:5], dw, qw, 4, 4),
                            expected=-1) is ApplyStatus.APPLIED
        sizes: dict[str, int] = {}
        _, (dd, qq) = await read_side(
            store, cid, 0, sizes,
            [SideWant(dedupe.side_name(dw), dedupe.side_name(dw - 1), ids.tolist(), False),
             SideWant(quota.side_name(qw), quota.side_name(qw - 1), ids.tolist(), True)])
        assert sizes == {dedupe.side_name(dw): 4, quota.side_name(qw): 4}
        assert dd == [f"{d % 1000 + 70}:{(1 << 64) - 1}".encode() for d in ids[:5].tolist()] \
            + [b"50:1"] * 5
        assert qq == [b"5"] * 5 + [b"2"] * 5

    with_stores(url, body, {})
