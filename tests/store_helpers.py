"""Small helpers for tests of the count store: deltas and reads in the layout of one version."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Mapping, Sequence

import numpy as np

from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.layout import Layout
from ldpstream.estimators.mechanism import TensorSpec
from ldpstream.redis_client import connect

#: tests use partitions 0..P-1 of a collection
P = 16


def with_stores(url: str, body: Callable[..., Awaitable], *store_kws: dict,
                timeout: float = 120.0):
    """Run ``body(*stores)``: one :class:`CountStore` on ``url`` per keyword dict, all closed
    after; bounded by ``timeout`` seconds."""
    async def main():
        stores = [CountStore(connect(url), **kw) for kw in store_kws]
        try:
            return await body(*stores)
        finally:
            for s in stores:
                await s.close()
    return asyncio.run(asyncio.wait_for(main(), timeout))


def cells(layout: Layout, counts: Mapping[str, np.ndarray], n: int,
          bucket: int | None = None) -> dict:
    """A PartitionDelta ``cells`` mapping: ``counts`` (and ``n`` reports) in one bucket."""
    return {(layout, bucket): layout.pack(counts, n)}


async def read_all(store: CountStore, cid: str, layout: Layout,
                   partitions: int | Sequence[int] = P) -> dict[str, np.ndarray]:
    """All-time counts of ``layout``'s version summed over ``partitions``."""
    return (await store.read_all_time(cid, partitions, {layout.version: layout}))[layout.version]


async def read(store: CountStore, cid: str, layout: Layout, spec: TensorSpec,
               partitions: int | Sequence[int] = P) -> np.ndarray:
    return (await read_all(store, cid, layout, partitions))[spec.key]


async def read_collection(store: CountStore, coll) -> dict[str, np.ndarray]:
    """All-time counts of a configured collection's tensors (its current version), summed over
    its partitions."""
    layout = Layout.of(coll.version, coll.tensors())
    return await read_all(store, coll.id, layout, coll.partitions)


async def assert_counted(redis_url: str, coll, expected: Mapping[str, np.ndarray], n: int,
                         timeout: float) -> dict[str, np.ndarray]:
    """Wait until ``n`` reports of the configured collection ``coll`` are counted, then assert
    that every one of its tensors (all time, all partitions) equals ``expected``; returns them."""
    from conftest import wait_for_n

    from ldpstream.agents.app import make_store

    store = make_store(redis_url)
    try:
        await wait_for_n(store, coll.id, n, timeout=timeout)
        got = await read_collection(store, coll)
        for s in coll.tensors():
            np.testing.assert_array_equal(got[s.key], expected[s.key], err_msg=s.key)
        assert await store.n(coll.id, coll.partitions) == n
        return got
    finally:
        await store.close()


async def read_fine_buckets(store: CountStore, coll, seconds: float) -> dict[str, np.ndarray]:
    """The sum of a collection's fine time buckets over the last ``seconds`` (all partitions):
    equal to the all-time counts when every report is that recent and counted once per bucket."""
    import time

    layout = Layout.of(coll.version, coll.tensors())
    policy = coll.policy
    end = policy.fine_bucket(time.time())
    first = end - int(seconds // policy.bucket_s)
    where = [(p, "f", b) for p in range(coll.partitions) for b in range(first, end + 1)]
    total = np.zeros(layout.size, dtype=np.int64)
    for flat in (await store.read_cells(coll.id, layout, where)).values():
        total += flat
    return layout.unpack(total)


async def on_masters(r, *command) -> list:
    """``command`` on a single Redis, or on every master of a Redis Cluster client; one reply per
    node (server-wide commands: INFO, CLIENT LIST, CLIENT PAUSE ...)."""
    from redis.asyncio.cluster import RedisCluster

    if isinstance(r, RedisCluster):
        return [await r.execute_command(*command, target_nodes=n) for n in r.get_primaries()]
    return [await r.execute_command(*command)]
