"""The worker's state of a memoized collection (agents/ingest/memo_gate.py). The roll of its
epoch logs (docs/privacy-over-time.md, "Retention"): a device silent beyond the retention is
evicted at its partition's next report however late that report comes within the log's life,
from the logs in memory or read back after a restart; what a roll left for a delta survives a
second roll before one. The rows the index holds packed (docs/scaling.md, "Per-device state"):
a device resending its row moves nothing, one whose row changed has the previous one subtracted
exactly without a read back. Real Redis."""
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


def _setup(tmp_path, redis_url: str, cid: str, retention_epochs: int = 1):
    from ldpstream.agents.app import make_store
    from ldpstream.agents.ingest.clients import Clients, RedisGate
    from ldpstream.agents.ingest.memo_gate import MemoGate
    from ldpstream.agents.ingest.partition import Partitions
    from ldpstream.agents.store import device_memo
    from ldpstream.config import load_config

    # one-hour windows: a state epoch of 2 h 1 min, the retention one epoch (K = 1) unless asked
    path = write_config(tmp_path / "c.yaml", cid, columns=("sex", "Salary"), partitions=1,
                        marginals=[("sex", "Salary")],
                        extra={"params": {"memoize": MEMOIZE}, "bucket_s": 60,
                               "windows": ["1h", "all"], "device_retention_s": 7260 * retention_epochs})
    coll = load_config(path).collections[cid]
    assert device_memo.retention_epochs(coll.device_retention(), coll.policy) == retention_epochs
    store = make_store(redis_url)
    parts = Partitions()
    memo = MemoGate({cid: coll}, RedisGate(Clients(), parts), store)
    state = parts.assign(TopicPartition(coll.topic, 0), cid)
    return coll, store, memo, state, device_memo.epoch_length(coll.policy)


def _rolled(coll, store, memo, state, left) -> tuple[int, dict]:
    """(the current epoch, the partition's logs) after ``memo.load`` rolls what a worker left in
    memory, ``left(epoch)`` = (its logs, their epoch), to the current epoch."""
    from ldpstream.agents.store.device_memo import epoch_of

    async def run():
        try:
            epoch = epoch_of(time.time(), coll.policy)
            state.memo, state.memo_epoch = left(epoch)
            await memo.load(state)
            return epoch, state.memo
        finally:
            await store.close()

    return asyncio.run(run())


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
    from ldpstream.agents.store.device_memo import stack_rows
    from ldpstream.agents.store.memo_log import EpochLog

    cid = unique_name
    coll, store, memo, state, _ = _setup(tmp_path, redis_server.url, cid)

    def left(epoch: int) -> tuple[dict, int]:
        old = EpochLog("a log two epochs old", 0.0)
        old.evicted.append(_rows(OLD.size))
        old.cleared.append(("an expired log", 2))
        return {epoch - 3: old, epoch - 2: EpochLog("the last current log", 0.0)}, epoch - 2

    epoch, held = _rolled(coll, store, memo, state, left)   # from epoch - 2 to epoch
    assert sorted(held) == [epoch - 1, epoch]
    assert stack_rows(held[epoch - 1].evicted).shape[0] == OLD.size
    assert ("an expired log", 2) in held[epoch - 1].cleared


@pytest.mark.parametrize("retention_epochs", [1, 3])
def test_rows_a_roll_carried_survive_a_second_roll_before_any_delta(tmp_path, redis_server,
                                                                     unique_name,
                                                                     retention_epochs):
    """Rows a roll carried into a log, not written yet (no delta came since), are read from
    memory by the next roll: evicted if silent beyond the retention (K = 1), carried on (K = 3),
    never dropped (dropped, their devices would stay counted all time for good)."""
    from ldpstream.agents.store.device_memo import stack_rows
    from ldpstream.agents.store.memo_log import EpochLog

    cid = unique_name
    coll, store, memo, state, _ = _setup(tmp_path, redis_server.url, cid, retention_epochs)

    def left(epoch: int) -> tuple[dict, int]:
        carried = EpochLog("the log a roll carried into", 0.0)
        rows = _rows(OLD.size)
        rows[:, 1] = -(epoch - 2)     # all-time only, last seen in epoch - 2
        chunks, pos = carried.place(OLD, rows)
        carried.index.upsert(OLD, pos)
        carried.unlogged += chunks
        return {epoch - 2: carried, epoch - 1: EpochLog("the current log", 0.0)}, epoch - 1

    epoch, held = _rolled(coll, store, memo, state, left)   # from epoch - 1 to epoch
    into = held[epoch - 1]
    if retention_epochs == 1:
        assert stack_rows(into.evicted).shape[0] == OLD.size
        assert len(into) == 0
    else:
        assert not into.evicted and len(into) == OLD.size
        assert sum(ch.ids.size for ch in into.unlogged) == OLD.size
    assert ("the log a roll carried into", 1) in into.cleared


def _bounds() -> np.ndarray:
    from ldpstream.config import default_config_path, load_config

    coll = next(iter(load_config(default_config_path().with_name("adult-fast.yaml"))
                     .collections.values()))
    return coll.mechanism().report_bounds()


def test_packed_rows_are_exact_and_what_does_not_fit_is_unknown():
    """A row packs into 32 bits exactly (unpacked, it is the same row; distinct rows, distinct
    codes) when its version, bucket and values fit; anything else is UNKNOWN, never a code."""
    from ldpstream.agents.store.device_memo import META, ROW
    from ldpstream.agents.store.memo_log import UNKNOWN, RowPacker

    bounds = _bounds()          # the 8 attributes of the demo: 1.8 M value combinations
    packer = RowPacker.of(bounds.tolist(), 7210.0, 10.0)
    assert packer is not None and packer.slots == 723 and packer.versions >= 2
    rng = np.random.default_rng(5)
    n, epoch = 50_000, 240_000
    rows = np.zeros((n, META + bounds.size), dtype=ROW)
    rows[:, 0] = rng.integers(0, packer.versions, n)
    base = int(np.floor(epoch * 721.0))
    rows[:, 1] = np.where(rng.random(n) < 0.2, 0, base + rng.integers(1, 723, n))
    rows[:, 2] = bounds.size
    rows[:, META:] = rng.integers(0, bounds, (n, bounds.size))
    codes = packer.pack(rows, epoch)
    assert (codes != UNKNOWN).all()
    np.testing.assert_array_equal(packer.unpack(codes, epoch), rows)
    distinct_rows = np.unique(rows, axis=0).shape[0]
    assert np.unique(codes).size == distinct_rows
    bad = np.repeat(rows[:1], 6, axis=0)
    bad[0, META] = bounds[0]                  # a value out of its bound
    bad[5, META + 3] = -1                     # a negative one
    bad[1, 1] = base                          # a bucket of the epoch before
    bad[2, 1] = -3                            # a carried row (all-time only, epoch 3)
    bad[3, 0] = packer.versions               # a version beyond those packed
    bad[4, 2] = bounds.size - 1               # another width
    assert (packer.pack(bad, epoch) == UNKNOWN).all()
    assert (packer.pack(bad[:, :-1], epoch) == UNKNOWN).all()
    # a worker loading the log finds the same codes beside the positions
    from ldpstream.agents.store.memo_log import encode_segments, index_segments

    ids = np.arange(1, 2001, dtype=np.uint64) * 7
    index = index_segments(encode_segments(ids, rows[:ids.size]), packer, epoch)[0]
    found, _, held = index.find_codes(ids)
    assert found.all()
    np.testing.assert_array_equal(held, codes[:ids.size])
    assert (index_segments(encode_segments(ids, rows[:ids.size]))[0].find_codes(ids)[2]
            == UNKNOWN).all()
    # a domain too large for 32 bits: nothing packed
    assert RowPacker.of([1 << 16, 1 << 16], 7210.0, 10.0) is None


def test_a_resent_row_moves_nothing_and_a_changed_one_needs_no_read(tmp_path, redis_server,
                                                                    unique_name):
    """Devices resending their row (same version, bucket and values) in the epoch: no report
    counted, no row written, none read back; a device whose values changed: its previous row
    subtracted exactly, from the index, nothing left to read from Redis."""
    from ldpstream.agents.store.device_memo import META, epoch_of

    cid = unique_name
    coll, store, memo, state, _ = _setup(tmp_path, redis_server.url, cid)
    bounds = coll.mechanism().report_bounds()
    rng = np.random.default_rng(9)
    ids = np.arange(100, 400, dtype=np.uint64)
    reports = rng.integers(0, bounds, (ids.size, bounds.size))

    async def run():
        try:
            await memo.load(state)
        finally:
            await store.close()

    asyncio.run(run())
    epoch = epoch_of(time.time(), coll.policy)
    assert state.memo_epoch == epoch
    state.seen = -1
    pend = state.open_pending(None)
    bucket = np.array([int(np.floor(epoch * 7260.0 / 60)) + 3])
    first = memo.moves(state, pend, ids, reports, bucket, coll.version)
    assert first.keep.size == ids.size and not first.old.shape[0]
    lp = pend.memo[next(iter(pend.memo))]
    chunks = len(lp.chunks)
    again = memo.moves(state, pend, ids[::-1].copy(), reports[::-1].copy(), bucket,
                       coll.version)
    assert again.keep.size == 0 and again.ids.size == 0 and not again.old.shape[0]
    assert len(lp.chunks) == chunks and not len(lp.inplace) and not lp.fetch
    changed = reports.copy()
    changed[7] = (changed[7] + 1) % bounds
    moved = memo.moves(state, pend, ids, changed, bucket, coll.version)
    assert moved.ids.tolist() == [int(ids[7])] and moved.keep.tolist() == [7]
    assert moved.old[:, META:].tolist() == [reports[7].tolist()]
    assert moved.old[:, 1].tolist() == [int(bucket[0]) + 1] and not lp.fetch
    # a later bucket is a change (the device moves to it in the windows): counted again
    later = memo.moves(state, pend, ids[:3], changed[:3], bucket + 1, coll.version)
    assert later.keep.size == 3 and later.old.shape[0] == 3


def test_a_segment_rewritten_densely_moves_whole_though_nothing_is_read_back(
        tmp_path, redis_server, unique_name):
    """A delta rewriting most rows of an applied segment whose predecessors the index holds
    packed reads nothing back to subtract, yet writes the segment whole (read, rebuilt, staged)
    rather than row by row in Lua; the rebuilt segment holds every device's new row."""
    from ldpstream.agents.store import keys
    from ldpstream.agents.store.device_memo import META
    from ldpstream.agents.store.memo_log import segment_name, table_of_segments

    cid = unique_name
    coll, store, memo, state, _ = _setup(tmp_path, redis_server.url, cid)
    bounds = coll.mechanism().report_bounds()
    rng = np.random.default_rng(11)
    ids = np.arange(1, 301, dtype=np.uint64)
    reports = rng.integers(0, bounds, (ids.size, bounds.size))
    changed = (reports + 1) % bounds

    async def run():
        try:
            await memo.load(state)
            state.seen = -1
            bucket = np.array([-1])
            first = state.open_pending(None)
            memo.moves(state, first, ids, reports, bucket, coll.version)
            (lp,) = first.memo.values()
            # the first delta applied: its segment in Redis as the apply writes it
            await store.redis.set(keys.side_key(cid, 0, segment_name(lp.name, 0)),
                                  b"".join(ch.encode() for ch in lp.chunks))
            state.pending = None
            second = state.open_pending(None)
            moved = memo.moves(state, second, ids, changed, bucket, coll.version)
            (lp2,) = second.memo.values()
            back = await memo.fetch(cid, second)
            return moved, lp2, back
        finally:
            await store.close()

    moved, lp2, back = asyncio.run(run())
    assert moved.old[:, META:].tolist() == reports.tolist()   # from the index
    assert not back.shape[0]                                   # nothing read back to subtract
    assert list(lp2.replaced) == [0]
    table = table_of_segments([bytes(lp2.replaced[0])])
    assert table.ids.tolist() == ids.tolist()
    assert table.rows[:, META:].tolist() == changed.tolist()
