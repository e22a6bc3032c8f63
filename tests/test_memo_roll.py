"""The worker's roll of a memoized collection's epoch logs (docs/privacy-over-time.md,
"Retention"): a device silent beyond the retention is evicted at its partition's next report
however late that report comes within the log's life, from the logs in memory or read back
after a restart; what a roll left for a delta survives a second roll before one. Real Redis."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from aiokafka.structs import TopicPartition
from conftest import write_config
from test_memo_devices_live import MEMOIZE

pytestmark = pytest.mark.pipeline

OLD = np.arange(1, 41, dtype=np.uint64)


def _setup(tmp_path, redis_url: str, cid: str):
    from ldpstream.agents.app import make_store
    from ldpstream.agents.ingest.clients import Clients, RedisGate
    from ldpstream.agents.ingest.memo_gate import MemoGate
    from ldpstream.agents.ingest.partition import Partitions
    from ldpstream.agents.store import device_memo
    from ldpstream.config import load_config

    # one-hour windows: a state epoch of 2 h 1 min, the retention one epoch (K = 1)
    path = write_config(tmp_path / "c.yaml", cid, columns=("sex", "Salary"), partitions=1,
                        marginals=[("sex", "Salary")],
                        extra={"params": {"memoize": MEMOIZE}, "bucket_s": 60,
                               "windows": ["1h", "all"], "device_retention_s": 7260})
    coll = load_config(path).collections[cid]
    assert device_memo.retention_epochs(coll.device_retention(), coll.policy) == 1
    store = make_store(redis_url)
    parts = Partitions()
    memo = MemoGate({cid: coll}, RedisGate(Clients(), parts), store)
    state = parts.assign(TopicPartition(coll.topic, 0), cid)
    return coll, store, memo, state, device_memo.epoch_length(coll.policy)


def _rows(n: int) -> np.ndarray:
    from ldpstream.agents.store.device_memo import META, ROW

    rows = np.zeros((n, META + 2), dtype=ROW)
    rows[:, 0], rows[:, 1], rows[:, 2] = 0, 5, 2   # version 0, a fine bucket, two values
    rows[:, META:] = np.arange(2 * n).reshape(n, 2) % 2
    return rows


def test_a_log_three_epochs_back_is_still_read_and_its_devices_evicted(tmp_path, redis_server,
                                                                       unique_name):
    """A partition whose next report comes three epochs after its devices' last one (the worker
    restarted meanwhile, or simply busy): the log of those devices is still in Redis and read,
    so they are evicted (their rows wait in ``evicted`` for the next delta) instead of staying
    counted all time; the logs a worker writes live that long."""
    from ldpstream.agents.store import keys
    from ldpstream.agents.store.device_memo import epoch_of, side_name, stack_rows
    from ldpstream.agents.store.layout import Layout
    from ldpstream.agents.store.memo_log import encode_segments

    cid = unique_name
    coll, store, memo, state, span = _setup(tmp_path, redis_server.url, cid)
    layout = Layout.of(coll.version, coll.tensors()).id

    async def run():
        try:
            epoch = epoch_of(time.time(), coll.policy)
            (seg,) = encode_segments(OLD, _rows(OLD.size))
            await store.redis.set(keys.side_key(cid, 0, side_name(epoch - 3, layout)), seg)
            await memo.load(state)
            return epoch, state.memo
        finally:
            await store.close()

    epoch, held = asyncio.run(run())
    assert sorted(held) == [epoch - 1, epoch]
    gone = stack_rows(held[epoch - 1].evicted)
    assert gone.shape[0] == OLD.size and (gone[:, 1] == -(epoch - 3)).all()
    assert [name for name, _ in held[epoch - 1].cleared] == [side_name(epoch - 3, layout)]
    # a log written at ``epoch`` lives until a device last seen in it is due for eviction
    # (K + 1 epochs on) and has left the (previous, current) pair: epoch + K + 3
    assert held[epoch].expire_at == (epoch + 4) * span


def test_what_a_roll_left_survives_a_second_roll_before_any_delta(tmp_path, redis_server,
                                                                    unique_name):
    """Evictions a roll left in a log that holds no segment (no report came to write them: every
    record of the partition refused, say) are carried by the next roll, not dropped."""
    from ldpstream.agents.store.device_memo import epoch_of, stack_rows
    from ldpstream.agents.store.memo_log import EpochLog

    cid = unique_name
    coll, store, memo, state, _ = _setup(tmp_path, redis_server.url, cid)

    async def run():
        try:
            epoch = epoch_of(time.time(), coll.policy)
            left = EpochLog("a log two epochs old", 0.0)
            left.evicted.append(_rows(OLD.size))
            left.cleared.append(("an expired log", 2))
            state.memo, state.memo_epoch = {epoch - 3: left,
                                            epoch - 2: EpochLog("the last current log", 0.0)}, epoch - 2
            await memo.load(state)   # rolls from epoch - 2 to epoch
            return epoch, state.memo
        finally:
            await store.close()

    epoch, held = asyncio.run(run())
    assert sorted(held) == [epoch - 1, epoch]
    assert stack_rows(held[epoch - 1].evicted).shape[0] == OLD.size
    assert ("an expired log", 2) in held[epoch - 1].cleared
