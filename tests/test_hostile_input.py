"""Hostile input on the report topics: a compression bomb (a ~32 KiB zstd batch inflating to
1 GiB) is dead-lettered without the memory being spent, under a memory cap, and the worker keeps
counting exactly; decompression is bounded for every codec; ``sent_at`` is clamped; deep JSON is
a decode error, not a RecursionError."""
from __future__ import annotations

import asyncio
import json
import resource
import struct
import time

import numpy as np
import pytest
from conftest import over_both_brokers, wait_for_n, write_config
from kafka_helpers import read_dlq
from store_helpers import read_collection

from ldpstream.producers import bounded_fetch
from ldpstream.producers.codec import DecodeError, batch_from_json, decode_batch

pytestmark = pytest.mark.pipeline
kafka_broker = over_both_brokers()


def _varint(v: int) -> bytes:
    from aiokafka.record.util import encode_varint

    out = bytearray()
    encode_varint(v, out.append)
    return bytes(out)


def zstd_bomb_batch(inflated: int, chunk: int = 1 << 20) -> bytes:
    """A Kafka v2 record batch of one record whose value is ``inflated`` zero bytes,
    zstd-compressed by streaming (the inflated bytes never exist here)."""
    import cramjam
    from aiokafka.record.util import calc_crc32c

    head = b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(inflated)
    c = cramjam.zstd.Compressor(level=3)
    c.compress(_varint(len(head) + inflated + 1) + head)
    zeros = bytes(chunk)
    for start in range(0, inflated, chunk):
        c.compress(zeros if start + chunk <= inflated else bytes(inflated - start))
    c.compress(_varint(0))  # no headers
    comp = bytes(c.finish())
    now = int(time.time() * 1000)
    after_crc = struct.pack(">hiqqqhii", 4, 0, now, now, -1, -1, -1, 1) + comp
    return struct.pack(">qiibI", 0, 9 + len(after_crc), 0, 2, calc_crc32c(after_crc)) + after_crc


def _batch(codec: int, values: list[bytes], base: int = 0) -> bytes:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 24)
    for i, v in enumerate(values):
        b.append(i, timestamp=None, key=b"k", value=v, headers=[])
    out = bytearray(b.build())
    struct.pack_into(">q", out, 0, base)
    return bytes(out)


def _records(records) -> list[tuple[int, bytes]]:
    """Offsets and values of a message set read as aiokafka's fetcher reads it (every batch's
    CRC checked), from ``MemoryRecords`` or ``BoundedRecords``."""
    out = []
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        out += [(r.offset, bytes(r.value)) for r in batch]
    return out


def _native(raw: bytes) -> list[tuple[int, bytes]]:
    from aiokafka.record.memory_records import MemoryRecords

    return _records(MemoryRecords(raw))


def _bounded(raw: bytes, max_bytes: int) -> list[tuple[int, bytes]]:
    return _records(bounded_fetch.BoundedRecords(raw, max_bytes))


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_bounded_batches_equal_aiokafka_decoding(codec):
    rng = np.random.default_rng(codec)
    values = [rng.integers(0, 4, size=int(rng.integers(1, 3000)), dtype=np.uint8).tobytes()
              for _ in range(40)]
    raw = _batch(codec, values, base=100) + _batch(0, values[:3], base=140)
    raw += _batch(codec, values[:2], base=143)[:-7]  # a partial trailing batch, as fetched
    assert _bounded(raw, 1 << 20) == _native(raw)
    # the same batch over a bound that is too small: one marker record at its last offset
    refused = _bounded(_batch(codec, values, base=7), 1000)
    assert len(refused) == 1 and refused[0][0] == 7 + 39
    with pytest.raises(DecodeError) as exc:
        decode_batch(refused[0][1])
    assert exc.value.reason == "decompression_bomb" and "7..46" in exc.value.detail


def test_bounded_batches_are_read_in_place_and_keep_the_crc_verdict():
    """Each compressed batch is decompressed into its message set's buffer and read there: two
    sets read in turn (as the fetcher reads partitions) each keep their own records; a batch whose
    fetched bytes fail their CRC fails aiokafka's check as it would without the guard."""
    rng = np.random.default_rng(5)
    sets = [[[rng.integers(0, 9, size=700, dtype=np.uint8).tobytes() for _ in range(30)]
             for _ in range(3)] for _ in range(2)]
    readers = [bounded_fetch.BoundedRecords(
        b"".join(_batch(3, vals, base=30 * i) for i, vals in enumerate(batches)), 1 << 20)
        for batches in sets]
    seen: list[list[list[bytes]]] = [[], []]
    for _ in range(3):
        its = []
        for k, reader in enumerate(readers):   # the next batch of each set, then their records
            assert reader.has_next()
            batch = reader.next_batch()
            assert isinstance(batch, bounded_fetch.CheckedBatch) and batch.validate_crc()
            its.append((k, iter(batch)))
        for k, it in its:
            seen[k].append([bytes(r.value) for r in it])
    assert seen == sets and not any(r.has_next() for r in readers)
    corrupt = bytearray(_batch(3, sets[0][0]))
    corrupt[-3] ^= 0xFF     # a flipped bit in the compressed records
    for codec_batch in (bytes(corrupt), _batch(0, sets[0][0])[:-3] + b"\x00\x00\x00"):
        bad = bounded_fetch.BoundedRecords(codec_batch, 1 << 20)
        assert not bad.next_batch().validate_crc()


def test_zstd_bomb_is_refused_without_spending_memory():
    bomb = zstd_bomb_batch(1 << 30)
    assert len(bomb) < 64 * 1024
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = _bounded(bomb, 16 << 20)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 64 * 1024, grown_kib
    assert len(out) == 1 and out[0][1].startswith(bounded_fetch.GUARD_MARKER)


def test_sent_at_is_clamped_and_deep_json_is_malformed():
    from ldpstream.agents.ingest.intake import SENT_AT_TOLERANCE_S, clamp_sent_at

    now = 1_700_000_000.0
    assert clamp_sent_at(1e300, now - 5, now) == now - 5 + SENT_AT_TOLERANCE_S
    assert clamp_sent_at(0.0, now, now) == now - SENT_AT_TOLERANCE_S
    assert clamp_sent_at(now - 1, now, now) == now - 1
    # a record timestamp in the future does not widen the window beyond now
    assert clamp_sent_at(1e300, now + 1e9, now) == now + SENT_AT_TOLERANCE_S
    for text in ("[" * 100_000 + "]" * 100_000,
                 '{"collection": "a", "version": 0, "reports": ' + "[" * 900 + "]" * 900 + "}"):
        with pytest.raises(DecodeError) as exc:
            batch_from_json(text)
        assert exc.value.reason == "malformed"


async def _produce_raw(bootstrap: str, topic: str, partition: int, batch: bytes) -> None:
    """Send a pre-built record batch as it is (a producer that compressed it itself)."""
    from aiokafka import AIOKafkaProducer, TopicPartition
    from aiokafka.protocol.produce import ProduceRequest

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.partitions_for(topic)
        node = producer.client.cluster.leader_for_partition(TopicPartition(topic, partition))
        resp = await producer.client.send(node, ProduceRequest(None, -1, 30_000,
                                                               [(topic, [(partition, batch)])]))
        errors = [p[1] for _, parts in resp.topics for p in parts]
        assert errors == [0], resp
    finally:
        await producer.stop()


def test_zstd_bomb_under_memory_cap_goes_to_dlq_worker_counts_exactly(
        tmp_path, kafka_broker, redis_server, spawn_worker, unique_name):
    """The worker runs under RLIMIT_AS = its own size + 400 MiB; a 1 GiB bomb between two runs
    of valid reports is dead-lettered, the worker stays up and counts every valid report."""
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.producers.fleet import run_fleet

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, partitions=1)
    coll = load_config(path).collections[cid]
    worker = spawn_worker(path)
    worker.wait_ready(60)
    with open(f"/proc/{worker.proc.pid}/status") as fh:
        vm_kib = int(next(l for l in fh if l.startswith("VmSize")).split()[1])
    cap = vm_kib * 1024 + (400 << 20)
    resource.prlimit(worker.proc.pid, resource.RLIMIT_AS, (cap, cap))
    since_ms = int(time.time() * 1000) - 1000

    async def run() -> None:
        first = await run_fleet(kafka_broker.bootstrap, coll, rate=0, total=5000, batch=500,
                                seed=1, keep_counts=True)
        await _produce_raw(kafka_broker.bootstrap, coll.topic, 0, zstd_bomb_batch(1 << 30))
        second = await run_fleet(kafka_broker.bootstrap, coll, rate=0, total=5000, batch=500,
                                 seed=2, keep_counts=True)
        store = make_store(redis_server.url)
        try:
            got = await wait_for_n(store, cid, 10_000, timeout=60)
            await asyncio.sleep(1.0)
            assert await store.n(cid, 1) == 10_000, (got, worker.log_tail())
            counts = await read_collection(store, coll)
            for key, want in first.counts.items():
                np.testing.assert_array_equal(counts[key], want + second.counts[key])
        finally:
            await store.close()

    asyncio.run(run())
    assert worker.proc.poll() is None, worker.log_tail()
    bombs = [r for r in read_dlq(kafka_broker.bootstrap, since_ms=since_ms)
             if r["collection"] == cid]
    assert [(r["reason"], r["offset"]) for r in bombs] == [("decompression_bomb", 10)], bombs
    assert "inflates beyond" in bombs[0]["detail"]
    assert json.loads(worker.get("/healthz"))["status"] == "ok"
