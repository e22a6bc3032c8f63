"""Checking that a worker counted a fleet's reports exactly (the Apache Kafka tests)."""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
from conftest import wait_for_n
from store_helpers import read_collection


async def assert_counted(redis_url: str, coll, counts: Mapping[str, np.ndarray], n: int,
                         log_tail: Callable[[], str], timeout: float = 90.0) -> None:
    """Wait until ``n`` reports of ``coll`` are in Redis, then compare every tensor with
    ``counts`` (the fleet's exact counts), exactly."""
    from ldpstream.agents.app import make_store

    store = make_store(redis_url)
    try:
        assert await wait_for_n(store, coll.id, n, timeout) == n, log_tail()
        got = await read_collection(store, coll)
    finally:
        await store.close()
    for key, want in counts.items():
        np.testing.assert_array_equal(got[key], want, err_msg=key)
