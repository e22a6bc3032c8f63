"""Where the embedded broker (Tansu) and Apache Kafka answer differently, pinned by a test on each
(docs/pipeline.md, "Apache Kafka next to the embedded broker")."""
from __future__ import annotations

import asyncio

import pytest
from conftest import over_both_brokers

pytestmark = pytest.mark.pipeline
kafka_broker = over_both_brokers()


def test_end_offset_after_a_batch_of_records(kafka_broker, unique_name):
    """Apache Kafka's ListOffsets(latest) is the offset after the last record; Tansu answers the
    base offset of the last record batch + 1 (why agents/ingest/service.py reads the log's last records
    before trusting an end offset)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    from ldpstream.dev.kafka import ApacheKafka
    from ldpstream.kafka_admin import create_topics

    topic = f"ldp.reports.{unique_name}"
    tp = TopicPartition(topic, 0)

    async def run() -> tuple[int, int]:
        await create_topics(kafka_broker.bootstrap, {topic: 1})
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, linger_ms=200)
        await producer.start()
        try:
            futures = [await producer.send(topic, b"r%d" % i, partition=0) for i in range(5)]
            offsets = [(await f).offset for f in futures]
        finally:
            await producer.stop()
        assert offsets == [0, 1, 2, 3, 4]
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=None)
        await consumer.start()
        try:
            return (await consumer.end_offsets([tp]))[tp], len(offsets)
        finally:
            await consumer.stop()

    end, records = asyncio.run(run())
    if isinstance(kafka_broker, ApacheKafka):
        assert end == records
    else:
        assert end == 1   # base offset 0 of the one batch, + 1


def test_idempotent_producer_on_kafka_not_on_tansu(kafka_broker, monkeypatch):
    """The device publisher is idempotent on Apache Kafka; Tansu 0.6 refuses InitProducerId, so
    ``auto`` publishes without and ``on`` fails naming the variable (docs/pipeline.md,
    "Failover")."""
    from ldpstream.dev.kafka import ApacheKafka
    from ldpstream.names import ENV_KAFKA_IDEMPOTENCE
    from ldpstream.producers.publisher import Publisher, PublishError

    async def idempotent(mode: str | None) -> bool | None:
        async with Publisher(kafka_broker.bootstrap, idempotence=mode) as pub:
            return pub.idempotent

    on_kafka = isinstance(kafka_broker, ApacheKafka)
    assert asyncio.run(idempotent(None)) is on_kafka
    assert asyncio.run(idempotent("off")) is False
    if on_kafka:
        assert asyncio.run(idempotent("on")) is True
    else:
        with pytest.raises(PublishError, match=ENV_KAFKA_IDEMPOTENCE):
            asyncio.run(idempotent("on"))
    monkeypatch.setenv(ENV_KAFKA_IDEMPOTENCE, "sometimes")
    with pytest.raises(PublishError, match=ENV_KAFKA_IDEMPOTENCE):
        Publisher(kafka_broker.bootstrap)
