"""Packed (dense) chunk deltas against a real redis-server and a Redis Cluster
(agents/store/packed_delta.py): added inside the apply script by one read and one write of the
count string, they leave every string byte for byte as the ``BITFIELD INCRBY`` of each nonzero cell
does (negative deltas, the carry between the 32-bit halves, int64 wrap-around, several chunks,
three window levels), and the exactly-once guard refuses a replayed or misplaced packed delta
and a malformed one before any write."""
from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest
import redis.asyncio as aioredis
from store_helpers import on_masters, with_stores

from ldpstream.agents.store import keys
from ldpstream.agents.store.apply_delta import ApplyStatus, PartitionDelta, expand_levels
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.layout import Layout
from ldpstream.agents.store.packed_delta import PACKED_MIN_CELLS, packed_blob
from ldpstream.agents.store.scripts import APPLY_LUA
from ldpstream.estimators.mechanism import TensorSpec
from ldpstream.redis_client import connect
from ldpstream.windows import COARSE_FACTOR, BucketPolicy, parse_window

pytestmark = pytest.mark.pipeline

SPECS = [TensorSpec("m:a", ("a",), (259,), (0,)), TensorSpec("m:b", ("b",), (7, 20), (1, 2))]
LAY = Layout.of(0, SPECS)
POLICY = BucketPolicy(60.0, (parse_window("5m"), parse_window("1h"), parse_window("all")))
I64 = 2**63
#: values around the edges of the two 32-bit halves and of int64
EDGES = [2**32 - 1, 2**32, -(2**32), -1, 2**31 - 1, 2**31, -(2**31), I64 - 1, -I64, 2**53 + 1]


def _run(url: str, body, **kw):
    """``body(unpacked, packed)``: two stores, one never packing a delta, one always."""
    return with_stores(url, body, {"packed_fill": math.inf, **kw}, {"packed_fill": 0.0, **kw})


async def _calls(r, command: str) -> int:
    """Calls of ``command`` so far, summed over the masters (scripts' commands included)."""
    total = 0
    for info in await on_masters(r, "INFO", "commandstats"):
        total += int(info.get(f"cmdstat_{command}", {}).get("calls", 0))
    return total


async def _strings(store: CountStore, cid: str, bucket: int, chunks: int) -> dict[str, bytes]:
    """The raw count strings of partition 0 at the three levels (absent: b'')."""
    out = {}
    for level, b in ((keys.LEVEL_FINE, bucket), (keys.LEVEL_COARSE, bucket // COARSE_FACTOR),
                     (keys.LEVEL_ALL, 0)):
        for c in range(chunks):
            k = keys.counts_key(cid, 0, LAY.id, LAY.version, level, b, c)
            out[f"{level}:{c}"] = bytes(await store.redis.get(k) or b"")
    return out


def _deltas(rng: np.random.Generator, k: int) -> list[np.ndarray]:
    """``k`` flat deltas: dense ones with negatives, sparse ones, and ones carrying edge values
    (the first sets cells to the edges, later ones push them across)."""
    out = []
    for i in range(k):
        d = rng.integers(-50, 200, LAY.size).astype(np.int64)
        if i % 3 == 1:   # sparse: a few cells far apart (stays BITFIELD)
            d[rng.random(LAY.size) > 0.01] = 0
        if i < 2:
            d[10:10 + len(EDGES)] = np.array([e % 2**64 for e in EDGES], dtype=np.uint64).view(np.int64)
        out.append(d)
    return out


@pytest.mark.parametrize("chunk_cells", [4_194_304, 97])
def test_packed_equals_bitfield_byte_for_byte(redis_url, chunk_cells):
    """The same deltas through both forms: the same strings, the cells their int64 (wrapping)
    sums, the packed store's dense deltas sent as SETRANGE, its sparse ones as BITFIELD."""
    rng = np.random.default_rng(23)
    bucket = POLICY.fine_bucket(time.time())
    deltas = _deltas(rng, 9)
    chunks = -(-LAY.size // chunk_cells)

    async def body(bits: CountStore, packed: CountStore):
        cids = {"bits": f"pk-bits-{chunk_cells}", "packed": f"pk-packed-{chunk_cells}"}
        for cid in cids.values():
            await bits.reset(cid)
        sr0 = await _calls(bits.redis, "setrange")
        for name, store in (("bits", bits), ("packed", packed)):
            for i, d in enumerate(deltas):
                res = await store.apply_many(cids[name], [PartitionDelta(
                    0, i, {(LAY, bucket): d}, 1, expected=i - 1)], POLICY)
                assert res[0].applied, res
            if name == "bits":  # the BITFIELD store never packs
                assert await _calls(bits.redis, "setrange") == sr0
                sr1, bf1 = await _calls(bits.redis, "setrange"), await _calls(bits.redis, "bitfield")
        assert await _calls(bits.redis, "setrange") > sr1   # the dense ones went packed
        assert await _calls(bits.redis, "bitfield") > bf1   # the sparse ones did not
        a = await _strings(bits, cids["bits"], bucket, chunks)
        b = await _strings(packed, cids["packed"], bucket, chunks)
        assert a == b
        want = np.sum(deltas, axis=0, dtype=np.int64)   # numpy int64 wraps as BITFIELD does
        for level, bk in ((keys.LEVEL_FINE, bucket), (keys.LEVEL_ALL, 0)):
            got = await packed.read_cells(cids["packed"], LAY, [(0, level, bk)])
            np.testing.assert_array_equal(got[(0, level, bk)], want)
        exact = [sum(int(d[c]) for d in deltas) for c in range(10, 10 + len(EDGES))]
        assert any(e != int(w) for e, w in zip(exact, want[10:]))   # some wrapped past int64
        for cid in cids.values():
            await bits.reset(cid)

    _run(redis_url, body, chunk_cells=chunk_cells)


def test_packed_delta_keeps_the_exactly_once_guard(redis_url):
    """A packed delta replayed, or not starting at the stored offset, changes nothing."""
    rng = np.random.default_rng(5)
    d = rng.integers(1, 9, LAY.size).astype(np.int64)
    cid = "pk-guard"

    async def body(_: CountStore, packed: CountStore):
        await packed.reset(cid)

        async def apply(offset: int, expected: int) -> ApplyStatus:
            res = await packed.apply_many(cid, [PartitionDelta(0, offset, {(LAY, None): d}, 5,
                                                               expected=expected)])
            return res[0].status

        assert await apply(0, -1) is ApplyStatus.APPLIED
        assert await apply(1, 0) is ApplyStatus.APPLIED
        assert await apply(1, 0) is ApplyStatus.REPLAYED    # the same delta again
        assert await apply(0, -1) is ApplyStatus.REPLAYED   # an older one
        assert await apply(5, 3) is ApplyStatus.CONFLICT    # a gap
        got = await packed.read_cells(cid, LAY, [(0, keys.LEVEL_ALL, 0)])
        np.testing.assert_array_equal(got[(0, keys.LEVEL_ALL, 0)], 2 * d)
        assert await packed.offset(cid, 0) == 1 and await packed.n(cid, [0]) == 10
        await packed.reset(cid)

    _run(redis_url, body)


def test_malformed_packed_delta_is_refused_before_any_write(redis_server):
    """A packed blob of a torn length, too short, or reaching past Redis' 512 MB string: the
    script errors before its first write (offset, n and the counts stay absent)."""
    cid = "pk-torn"
    off, sent = keys.offsets_key(cid, 0), keys.sent_at_key(cid, 0)
    chunk = keys.counts_key(cid, 0, LAY.id, LAY.version, keys.LEVEL_ALL, 0, 0)
    good = packed_blob(np.ones(PACKED_MIN_CELLS, dtype=np.int64), 0)
    far = packed_blob(np.ones(PACKED_MIN_CELLS, dtype=np.int64), 2**26 - 8)

    async def main():
        r = aioredis.from_url(redis_server.url)
        try:
            await r.delete(off, sent, chunk)
            script = r.register_script(APPLY_LUA)
            for blob in (good[:-3], b"*\x00\x00\x00\x00\x01", far):
                with pytest.raises(Exception, match="ldp-apply: malformed packed delta"):
                    await script(keys=[off, sent, chunk], args=[1000, "", 0, 3, "", 1, 0, "", blob])
                assert await r.exists(off, sent, chunk) == 0
            await script(keys=[off, sent, chunk], args=[1000, "", 0, 3, "", 1, 0, "", good])
            raw = await r.get(chunk)
            np.testing.assert_array_equal(np.frombuffer(raw, ">i8"), np.ones(PACKED_MIN_CELLS))
        finally:
            await r.delete(off, sent, chunk)
            await r.aclose()

    asyncio.run(main())


def test_packed_blobs_of_a_dense_delta_only(redis_server):
    """Which form each chunk delta takes: dense spans packed (only the span from the first to
    the last nonzero cell), sparse ones as increments, small ones always as increments."""
    store = CountStore(connect(redis_server.url))
    try:
        d = np.zeros(LAY.size, dtype=np.int64)
        d[100:300] = 3
        d[0] = 200
        d[350] = -1
        _, args = store._blobs("c", 0, expand_levels({(LAY, None): d}, None))
        blob = args[1]
        assert blob[:1] == b"*" and int.from_bytes(blob[1:5], "little") == 0
        np.testing.assert_array_equal(np.frombuffer(blob[5:], ">i8"), d[:351])
        d[100:300] = 0
        _, args = store._blobs("c", 0, expand_levels({(LAY, None): d}, None))
        assert args[1] == "#0 200 #350 -1 "
    finally:
        asyncio.run(store.close())
