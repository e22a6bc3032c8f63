"""Reset is atomic per shard (agents/store/count_store.py ``CountStore.reset``): resetting a collection while
applies keep landing leaves every partition with ``n`` equal to the reports in its all-time
tensor. Before, keys were deleted one by one while applies continued, and a partition could keep
counts without their ``n`` (or ``n`` without its counts) for good."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ldpstream.agents.store import keys
from ldpstream.agents.store.apply_delta import PartitionDelta, SideCounter
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.layout import Layout
from ldpstream.estimators.mechanism import TensorSpec
from ldpstream.redis_client import TRANSIENT_ERRORS, connect
from ldpstream.windows import BucketPolicy, parse_window

pytestmark = pytest.mark.pipeline

SPEC = TensorSpec("m:a|b", ("a", "b"), (4, 5), (0, 1))
LAY = Layout.of(0, [SPEC])
POLICY = BucketPolicy(60.0, (parse_window("5m"), parse_window("all")))
PARTS = 8


def test_reset_under_load_keeps_n_equal_to_the_tensors(redis_target):
    rng = np.random.default_rng(11)

    async def main() -> tuple[dict, dict, int]:
        store = CountStore(connect(redis_target.url))
        cid = f"reset-{rng.integers(1 << 30)}"
        stop = asyncio.Event()

        async def applier(p: int) -> None:
            """Applies one delta after another, like a worker: after a refusal (a CONFLICT while
            a reset holds the shard) it continues from the stored offset."""
            base = -1
            while not stop.is_set():
                i = base + 1
                d = LAY.pack({SPEC.key: rng.integers(0, 3, size=(4, 5))}, 0)
                d[0] = int(d[1:].sum())
                side = {f"quota:{k}": SideCounter({str(i): 1}) for k in range(4)}
                try:
                    res = (await store.apply_many(cid, [PartitionDelta(
                        p, i, {(LAY, 1000 + i % 3): d}, int(d[0]), expected=base, side=side,
                        sent_at_max=float(i))], POLICY))[0]
                except TRANSIENT_ERRORS:  # retried, as the worker does (the next call decides)
                    continue
                base = i if res.applied else (-1 if res.stored is None else res.stored)

        tasks = [asyncio.create_task(applier(p)) for p in range(PARTS)]
        try:
            resets = attempts = 0
            while resets < 40 and attempts < 80:
                attempts += 1
                try:
                    await store.reset(cid, keep_offsets=True)
                except TRANSIENT_ERRORS:  # the API answers 503; the operator resets again
                    continue
                resets += 1
                await asyncio.sleep(0.005)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        n = {p: await store.n(cid, [p]) for p in range(PARTS)}
        heads = await store.read_heads(cid, LAY, [(p, keys.LEVEL_ALL, 0) for p in range(PARTS)])
        await store.reset(cid)
        await store.close()
        return n, {p: heads[(p, keys.LEVEL_ALL, 0)] for p in range(PARTS)}, resets

    n, tensors, resets = asyncio.run(asyncio.wait_for(main(), 120))
    assert resets == 40 and sum(n.values()) > 0
    assert n == tensors
