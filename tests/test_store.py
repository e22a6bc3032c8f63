"""CountStore against a real redis-server (EmbeddedRedis): exactly-once apply, chunking, reads,
estimates. Prints the apply time for ~10k nonzero cells."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import redis.asyncio as aioredis

from ldpstream.agents.store import CountStore
from ldpstream.estimators.mechanism import TensorSpec
from ldpstream.services import EmbeddedRedis


@pytest.fixture(scope="module")
def redis_url():
    with EmbeddedRedis() as r:
        yield r.url


def run(coro_fn, url, **store_kw):
    async def main():
        client = aioredis.from_url(url)
        store = CountStore(client, **store_kw)
        try:
            return await coro_fn(store)
        finally:
            await store.close()
    return asyncio.run(asyncio.wait_for(main(), 120))


SPEC_A = TensorSpec("m:a|b", ("a", "b"), (4, 5), (0, 1))
SPEC_B = TensorSpec("m:c", ("c",), (7,), (2,))


def test_apply_is_idempotent_on_replay(redis_url):
    async def body(store: CountStore):
        await store.reset("idem")
        d = {SPEC_A.key: np.arange(20).reshape(4, 5), SPEC_B.key: np.array([0, 0, 3, 0, 0, 0, 1])}
        assert await store.apply("idem", 0, 10, d, 24, sent_at_max=100.5) is True
        assert await store.apply("idem", 0, 10, d, 24) is False      # same offset: replay
        assert await store.apply("idem", 0, 9, d, 24) is False       # older offset
        got = await store.read_all("idem", [SPEC_A, SPEC_B])
        np.testing.assert_array_equal(got[SPEC_A.key], np.arange(20).reshape(4, 5))
        np.testing.assert_array_equal(got[SPEC_B.key], [0, 0, 3, 0, 0, 0, 1])
        assert got[SPEC_A.key].dtype == np.int64
        assert await store.n("idem") == 24
        assert await store.offsets("idem") == {0: 10}
        assert await store.sent_at_max("idem") == 100.5
        assert await store.apply("idem", 0, 11, d, 24, sent_at_max=99.0) is True
        assert await store.n("idem") == 48
        assert await store.sent_at_max("idem") == 100.5             # max, not last
        np.testing.assert_array_equal(await store.read("idem", SPEC_A),
                                      2 * np.arange(20).reshape(4, 5))
        # an empty delta still records the offset (a batch of rejected reports)
        assert await store.apply("idem", 3, 5, {SPEC_A.key: np.zeros((4, 5), int)}, 0) is True
        assert await store.offsets("idem") == {0: 11, 3: 5}
        assert await store.n("idem") == 48
    run(body, redis_url)


def test_missing_tensor_reads_zeros_and_unknown_collection_is_empty(redis_url):
    async def body(store: CountStore):
        z = await store.read("nothing-here", SPEC_A)
        assert z.shape == (4, 5) and not z.any()
        assert await store.n("nothing-here") == 0
        assert await store.offsets("nothing-here") == {}
        assert await store.sent_at_max("nothing-here") is None
        # a short string (only the first cells written) reads as zeros beyond it
        await store.apply("short", 0, 1, {SPEC_B.key: np.array([5, 0, 0, 0, 0, 0, 0])}, 5)
        np.testing.assert_array_equal(await store.read("short", SPEC_B), [5, 0, 0, 0, 0, 0, 0])
    run(body, redis_url)


def test_random_deltas_sum_exactly_across_chunks(redis_url):
    rng = np.random.default_rng(7)
    specs = [TensorSpec("m:x|y|z", ("x", "y", "z"), (9, 8, 7)),   # 504 cells: 16 chunks of 32
             TensorSpec("m:u", ("u",), (3,)),
             TensorSpec("rrba:v2:ab", ("a", "b"), (40, 25))]      # 1000 cells

    async def body(store: CountStore):
        await store.reset("sum")
        total = {s.key: np.zeros(s.shape, np.int64) for s in specs}
        n = 0
        for off in range(25):
            d = {}
            for s in specs:
                x = rng.integers(-3, 50, size=s.shape) * (rng.random(s.shape) < 0.3)
                d[s.key] = x
                total[s.key] += x
            k = int(rng.integers(0, 1000))
            n += k
            assert await store.apply("sum", off % 2, off, d, k) is True
            if off % 5 == 0:  # replays interleaved
                assert await store.apply("sum", off % 2, off, d, k) is False
        got = await store.read_all("sum", specs)
        for s in specs:
            np.testing.assert_array_equal(got[s.key], total[s.key])
        assert await store.n("sum") == n
        keys = [k async for k in store.redis.scan_iter(match="ldp:{sum}:t:m:x|y|z:*")]
        assert len(keys) == 16  # chunked at 32 cells
        # large values and negative totals round-trip through BITFIELD i64
        big = {"m:u": np.array([2**40, -(2**35), 1])}
        await store.apply("sum", 9, 0, big, 0)
        np.testing.assert_array_equal(await store.read("sum", specs[1]), total["m:u"] + big["m:u"])
        assert await store.reset("sum") >= 16 + 4
        assert not (await store.read("sum", specs[0])).any()
    run(body, redis_url, chunk_cells=32)


def test_more_than_1000_ops_in_one_chunk(redis_url):
    spec = TensorSpec("m:big", ("a", "b"), (100, 60))

    async def body(store: CountStore):
        await store.reset("ops")
        d = np.arange(1, 6001).reshape(100, 60)  # 6000 nonzero cells -> 6 BITFIELD calls
        assert await store.apply("ops", 0, 0, {spec.key: d}, 1)
        np.testing.assert_array_equal(await store.read("ops", spec), d)
    run(body, redis_url)


def test_concurrent_partitions_and_replays(redis_url):
    spec = TensorSpec("m:p", ("a", "b"), (16, 16))
    rng = np.random.default_rng(3)
    batches = {p: [rng.integers(0, 5, size=(16, 16)) for _ in range(30)] for p in range(2)}

    async def body(store: CountStore):
        await store.reset("conc")
        store2 = CountStore(aioredis.from_url(redis_url), chunk_cells=64)  # a second worker

        async def partition(st: CountStore, p: int) -> int:
            applied = 0
            for off, d in enumerate(batches[p]):
                applied += await st.apply("conc", p, off, {spec.key: d}, 100)
                # a second worker replays the same delta (rebalance): must be skipped
                applied += await store2.apply("conc", p, off, {spec.key: d}, 100)
            return applied

        try:
            counts = await asyncio.gather(partition(store, 0), partition(store, 1))
        finally:
            await store2.close()
        assert counts == [30, 30]
        expect = sum(batches[0]) + sum(batches[1])
        np.testing.assert_array_equal(await store.read("conc", spec), expect)
        assert await store.offsets("conc") == {0: 29, 1: 29}
        assert await store.n("conc") == 6000
    run(body, redis_url, chunk_cells=64)


def test_estimates_and_history(redis_url):
    async def body(store: CountStore):
        await store.reset("est")
        assert await store.get_estimate("est", "truncated", ("a", "b")) is None
        now = time.time()
        for i in range(30):
            await store.put_estimate("est", "truncated", ("a", "b"),
                                     {"cells": np.full((2, 2), i / 10), "n": i,
                                      "updated_at": now - 300 + 10 * i, "bad": float("nan")})
        latest = await store.get_estimate("est", "truncated", ["a", "b"])
        assert latest["n"] == 29 and latest["cells"] == [[2.9, 2.9], [2.9, 2.9]]
        assert latest["bad"] is None
        hist = await store.estimate_history("est", "truncated", ("a", "b"), 100)
        assert [h["n"] for h in hist] == list(range(21, 30))  # oldest first, within 100 s
        assert len(await store.estimate_history("est", "truncated", ("a", "b"), 1e9)) == 20  # cap
        assert await store.get_estimate("est", "ibu", ("a", "b")) is None
        await store.put_estimate("est", "ibu", ("a", "b"), {"n": 1})
        assert (await store.get_estimate("est", "ibu", ("a", "b")))["updated_at"] >= now
        keys = sorted([k.decode() async for k in store.redis.scan_iter(match="ldp:{est}:*")])
        assert keys == ["ldp:{est}:est:ibu:m:a|b", "ldp:{est}:est:truncated:m:a|b",
                        "ldp:{est}:hist:ibu:m:a|b", "ldp:{est}:hist:truncated:m:a|b"]
    run(body, redis_url, history_cap=20)


def test_history_cap_per_call_and_sized_from_the_drift_window(redis_url):
    from ldpstream.agents.store import history_cap_for

    assert history_cap_for(60, 5) == 28 and history_cap_for(400, 1) == 804
    assert history_cap_for(0.3, 1) == 5  # window shorter than the interval: the previous one
    with pytest.raises(ValueError):
        history_cap_for(60, 0)

    async def body(store: CountStore):
        await store.reset("cap")
        for i in range(40):
            await store.put_estimate("cap", "castell", ("a",), {"n": i}, history_cap=30)
        assert len(await store.estimate_history("cap", "castell", ("a",), 1e9)) == 30  # > 20
        await store.put_estimate("cap", "castell", ("a",), {"n": 40})  # the store's default
        assert len(await store.estimate_history("cap", "castell", ("a",), 1e9)) == 20
        with pytest.raises(ValueError):
            await store.put_estimate("cap", "castell", ("a",), {"n": 41}, history_cap=0)
    run(body, redis_url, history_cap=20)


def test_survives_redis_restart():
    spec = TensorSpec("m:r", ("a",), (4,))

    async def body(url: str, restart) -> None:
        store = CountStore(aioredis.from_url(url))
        await store.apply("rs", 0, 1, {spec.key: np.array([1, 2, 3, 4])}, 10)
        restart()
        # the script cache is empty after a restart: register_script reloads it (NOSCRIPT)
        for _ in range(50):
            try:
                ok = await store.apply("rs", 0, 2, {spec.key: np.array([1, 1, 1, 1])}, 4)
                break
            except (ConnectionError, OSError, aioredis.ConnectionError):
                await asyncio.sleep(0.1)
        assert ok
        assert await store.apply("rs", 0, 1, {spec.key: np.array([1, 2, 3, 4])}, 10) is False
        np.testing.assert_array_equal(await store.read("rs", spec), [2, 3, 4, 5])
        assert await store.n("rs") == 14
        await store.close()

    with EmbeddedRedis() as r:
        asyncio.run(body(r.url, r.restart))


@pytest.mark.parametrize("appendfsync", ["always", "everysec"])
def test_apply_time_10k_cells(appendfsync, capsys):
    """~10k nonzero cells per apply (one 100x100 tensor, dense delta), and a delta shaped like the
    Adult demo (4 marginals, 130 cells); prints client and server (INFO commandstats) timings.
    ``always`` (the embedded default) adds one AOF fsync per apply to the client-side time."""
    spec = TensorSpec("m:t", ("a", "b"), (100, 100))
    demo = [TensorSpec("m:sex|Salary", ("sex", "Salary"), (2, 2)),
            TensorSpec("m:race|sex", ("race", "sex"), (5, 2)),
            TensorSpec("m:education|Salary", ("education", "Salary"), (16, 2)),
            TensorSpec("m:relationship|marital-status|sex", ("r", "m", "s"), (6, 7, 2))]
    rng = np.random.default_rng(11)

    async def evalsha_usec(store: CountStore) -> tuple[int, int]:
        st = (await store.redis.info("commandstats")).get("cmdstat_evalsha", {})
        return int(st.get("calls", 0)), int(st.get("usec", 0))

    async def body(store: CountStore):
        await store.reset("perf")
        d = rng.integers(1, 9, size=(100, 100))
        await store.apply("perf", 0, 0, {spec.key: d}, 10_000)  # warm up (script load)
        times = []
        c0, u0 = await evalsha_usec(store)
        for off in range(1, 11):
            t = time.perf_counter()
            assert await store.apply("perf", 0, off, {spec.key: d}, 10_000)
            times.append(time.perf_counter() - t)
        c1, u1 = await evalsha_usec(store)
        server = (u1 - u0) / max(1, c1 - c0) / 1e6
        t = time.perf_counter()
        assert not await store.apply("perf", 0, 5, {spec.key: d}, 10_000)
        replay = time.perf_counter() - t
        np.testing.assert_array_equal(await store.read("perf", spec), 11 * d)
        t = time.perf_counter()
        for _ in range(10):
            await store.read("perf", spec)
        read = (time.perf_counter() - t) / 10
        small = []
        c0, u0 = await evalsha_usec(store)
        for off in range(20):
            dd = {s.key: rng.multinomial(20_000 // 4, np.ones(s.size) / s.size).reshape(s.shape)
                  for s in demo}
            t = time.perf_counter()
            assert await store.apply("perf", 1, off, dd, 20_000)
            small.append(time.perf_counter() - t)
        c1, u1 = await evalsha_usec(store)
        small_server = (u1 - u0) / max(1, c1 - c0) / 1e6
        return (float(np.median(times)), server, replay, read, float(np.median(small)),
                small_server)

    with EmbeddedRedis(appendfsync=appendfsync) as server_:
        med, server, replay, read, small, small_server = run(body, server_.url)
    with capsys.disabled():
        print(f"\n[store appendfsync={appendfsync}] apply 10,000 nonzero cells: median {med * 1e3:.1f} ms client-side "
              f"({10_000 / med / 1e3:.0f}k cells/s), {server * 1e3:.1f} ms inside Redis; "
              f"skipped replay {replay * 1e3:.1f} ms; read 10,000 cells {read * 1e3:.2f} ms; "
              f"Adult-demo delta (130 cells, 20k reports) {small * 1e3:.2f} ms client-side, "
              f"{small_server * 1e3:.2f} ms inside Redis")
    assert med < 1.0  # generous: shared 2-core machine
