"""A report batch whose produce request was answered too late is sent again by the device's
publisher; on Apache Kafka the idempotent producer makes the broker keep one copy, so the worker
counts it once (docs/pipeline.md, "Failover")."""
from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

pytestmark = [pytest.mark.pipeline, pytest.mark.kafka]


async def _values(bootstrap: str, topic: str) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await c.start()
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        await c.seek_to_beginning(tp)
        end = (await c.end_offsets([tp]))[tp]
        out: list[bytes] = []
        while await c.position(tp) < end:
            for msgs in (await c.getmany(timeout_ms=1000)).values():
                out += [bytes(m.value or b"") for m in msgs]
        return out
    finally:
        await c.stop()


def test_batch_sent_again_after_a_lost_answer_is_written_once(apache_kafka, unique_name, caplog):
    """What a leader failover does to a batch in flight, on one broker: the broker is frozen
    (SIGSTOP) with the produce request in its socket, the producer's connection breaks (the
    answer is lost) and the producer sends the batch again on a new one; thawed, the broker
    reads the first request and the retry. The log holds the batch once (without idempotence,
    ``LDP_KAFKA_IDEMPOTENCE=off``, it holds it twice)."""
    from aiokafka.conn import CloseReason

    from ldpstream.kafka_admin import create_topics
    from ldpstream.names import reports_topic
    from ldpstream.producers.publisher import Publisher

    topic = reports_topic(unique_name)
    node = apache_kafka.nodes[0]
    assert node.pid is not None
    caplog.set_level(logging.WARNING, logger="aiokafka")

    async def run() -> list[bytes]:
        await create_topics(apache_kafka.bootstrap, {topic: 1})
        async with Publisher(apache_kafka.bootstrap, request_timeout_ms=20_000,
                             linger_ms=0) as pub:
            assert pub.idempotent
            await pub.send_and_wait(topic, b"first", partition=0)
            os.kill(node.pid, signal.SIGSTOP)
            try:
                fut = await pub.send(topic, b"retried", partition=0)
                await asyncio.sleep(0.5)  # the request is in the broker's socket
                # the answer is lost: break the producer's connections (aiokafka's own)
                assert pub._producer is not None
                for conn in list(pub._producer.client._conns.values()):
                    conn.close(reason=CloseReason.CONNECTION_BROKEN)
                await asyncio.sleep(1.5)  # the producer reconnects and sends the batch again
            finally:
                os.kill(node.pid, signal.SIGCONT)
            await asyncio.wait_for(fut, 60)
            await pub.flush()
        return await _values(apache_kafka.bootstrap, topic)

    values = asyncio.run(run())
    retries = [r for r in caplog.records if "produce response" in r.getMessage()]
    assert retries, "the batch was never sent again: the test did not exercise a retry"
    assert values == [b"first", b"retried"], values
