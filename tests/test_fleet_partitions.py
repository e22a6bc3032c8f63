"""For a memoized (device-counted) collection the simulated fleet sends each device's reports to
one partition (``device_id % partitions``), so that it counts a simulated device once, as it
counts a real device that keys its batches (docs/privacy-over-time.md, "Memoized collections
count devices")."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import write_config

pytestmark = pytest.mark.pipeline


def test_a_simulated_device_lands_in_one_partition(tmp_path, kafka_broker, unique_name):
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from ldpstream.config import load_config
    from ldpstream.kafka_admin import create_ldp_topics
    from ldpstream.producers.codec import decode_batch
    from ldpstream.producers.fleet import run_fleet

    cid = unique_name
    coll = load_config(write_config(tmp_path / "c.yaml", cid, partitions=4, extra={
        "params": {"memoize": {"rotation_s": 86400}}})).collections[cid]
    assert coll.mechanism().memoization() is not None
    devices, total = 500, 20_000

    async def run() -> dict[int, np.ndarray]:
        await create_ldp_topics(kafka_broker.bootstrap, [coll])
        stats = await run_fleet(kafka_broker.bootstrap, coll, rate=0, total=total, batch=200,
                                seed=3, devices=devices, mechanism=coll.mechanism())
        assert stats.sent_reports == total
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=None,
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            tps = [TopicPartition(coll.topic, p) for p in range(4)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            ids: dict[int, list[np.ndarray]] = {p: [] for p in range(4)}
            seen = 0
            while seen < sum(ends.values()):
                for tp, msgs in (await consumer.getmany(timeout_ms=1000)).items():
                    for m in msgs:
                        batch = decode_batch(m.value)
                        assert batch.device_ids is not None
                        ids[tp.partition].append(batch.device_ids)
                    seen += len(msgs)
            return {p: np.concatenate(v) if v else np.zeros(0, np.uint64) for p, v in ids.items()}
        finally:
            await consumer.stop()

    by_part = asyncio.run(run())
    assert sum(len(v) for v in by_part.values()) == total
    for p, ids in by_part.items():
        assert len(ids) and np.all(ids % 4 == p), f"partition {p} holds another partition's device"
    distinct = set().union(*(set(v.tolist()) for v in by_part.values()))
    assert len(distinct) <= devices
