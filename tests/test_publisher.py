"""The device-side publisher compresses report batches with lz4 when cramjam is installed (it is a
dependency): checked on the record batches the broker stores, not only on the setting."""
from __future__ import annotations

import asyncio
import struct

import numpy as np
import pytest

pytestmark = pytest.mark.pipeline

CODEC_LZ4 = 3  # Kafka record batch v2: attributes bits 0-2 = compression codec


async def _raw_batches(bootstrap: str, topic: str) -> list[bytes]:
    """The record batches of partition 0 exactly as the broker returns them (a Fetch request
    through aiokafka's client, no consumer-side decompression)."""
    from aiokafka.client import AIOKafkaClient
    from aiokafka.protocol.fetch import FetchRequest
    from aiokafka.structs import TopicPartition

    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        await client.force_metadata_update()
        node = client.cluster.leader_for_partition(TopicPartition(topic, 0))
        resp = await client.send(node, FetchRequest(1000, 1, 4 << 20, 0,
                                                    [(topic, [(0, 0, 4 << 20)])]))
        (_, parts), = resp.topics
        (part,) = parts
        assert part[1] == 0, f"fetch error code {part[1]}"
        data = part[-1]
    finally:
        await client.close()
    out, pos = [], 0
    while pos + 12 <= len(data):  # baseOffset i64, batchLength i32, then batchLength bytes
        (length,) = struct.unpack_from(">i", data, pos + 8)
        out.append(data[pos:pos + 12 + length])
        pos += 12 + length
    return out


def test_publisher_default_compression_is_lz4_on_the_wire(kafka_broker, unique_name):
    import cramjam  # noqa: F401 - a dependency: lz4 must be available
    from aiokafka.record.memory_records import MemoryRecords

    from ldpstream.kafka_admin import create_topics
    from ldpstream.producers.codec import decode_batch, encode_batch
    from ldpstream.producers.publisher import Publisher, default_compression

    assert default_compression() == "lz4"
    topic = f"ldp.reports.{unique_name}"
    rng = np.random.default_rng(5)
    sent = [encode_batch(unique_name, 0, rng.integers(0, 4, size=(500, 8)), sent_at=float(i))
            for i in range(20)]

    async def run():
        await create_topics(kafka_broker.bootstrap, {topic: 1})
        async with Publisher(kafka_broker.bootstrap) as pub:  # compression="auto", the default
            assert pub.compression == "lz4"
            for value in sent:
                await pub.send(topic, value, partition=0)
            await pub.flush()
        return await _raw_batches(kafka_broker.bootstrap, topic)

    batches = asyncio.run(run())
    assert batches
    got = []
    for raw in batches:
        magic, = struct.unpack_from(">b", raw, 16)
        attributes, = struct.unpack_from(">h", raw, 21)  # after leader epoch, magic, crc
        assert magic == 2 and attributes & 0x07 == CODEC_LZ4, (magic, attributes)
        batch = MemoryRecords(raw).next_batch()
        assert batch.compression_type == CODEC_LZ4
        got += [bytes(r.value) for r in batch]
    assert got == sent  # and it decompresses to exactly what was sent
    assert sum(len(b) for b in batches) < sum(len(v) for v in sent) / 2  # it did compress
    assert decode_batch(got[3]).sent_at == 3.0
