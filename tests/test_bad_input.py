"""Bad input never crashes the worker and never touches a count: random bytes, truncated and
malformed batches, unknown collection or version, wrong width, out-of-domain values and oversized
messages all land in ``ldp.dlq`` with the right reason, ``ldp_reports_rejected_total`` rises, and
good reports sent after them are counted."""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import numpy as np
import pytest
from conftest import over_both_brokers, wait_for_n, write_config
from store_helpers import read_collection

pytestmark = pytest.mark.pipeline
kafka_broker = over_both_brokers()


def _metric(text: str, name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_bad_input_goes_to_dlq_and_counts_stay_exact(tmp_path, kafka_broker, redis_target,
                                                     service_env, spawn_worker, unique_name):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.errors import MessageSizeTooLargeError

    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.dev.kafka import ApacheKafka
    from ldpstream.producers.codec import encode_batch

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, partitions=2, version=2,
                        columns=("sex", "race", "Salary"))
    coll = load_config(path).collections[cid]
    mech = coll.mechanism()
    specs = coll.tensors()
    worker = spawn_worker(path, env=dict(service_env, REDIS_URL=redis_target.url))
    worker.wait_ready(60)
    rng = np.random.default_rng(3)
    shape = np.array(coll.domain.shape)

    def good(n: int) -> np.ndarray:
        return mech.randomize(rng.integers(0, shape, size=(n, len(shape))), rng)

    good_a, good_b = good(400), good(250)
    burst = good(40)  # then 40 single-report messages, one of them out of domain
    burst[17, 0] = shape[0]
    burst_ok = np.delete(burst, 17, axis=0)
    valid = encode_batch(cid, 2, good(10))
    out_of_domain = good(20)
    out_of_domain[7, 1] = shape[1]  # one value just past its attribute's domain
    big = rng.integers(0, 2, size=(400_000, 3), dtype=np.uint8)  # 1.2 MB > 1 MiB limit
    # (payload, reason, reports it counts); every reject is counted and filed under the
    # collection of its topic, undecodable ones (count 1 each) included
    bad = [
        (rng.bytes(300), "bad_magic", 1),
        (valid[:-7], "truncated", 1),
        (valid + b"\x00\x01", "malformed", 1),
        (encode_batch(cid, 2, big), "oversized", 1),
        (encode_batch("no-such-collection", 2, good(5)), "unknown_collection", 5),
        (encode_batch(cid, 99, good(6)), "unknown_version", 6),
        (encode_batch(cid, 2, np.zeros((8, 5), np.uint8)), "wrong_width", 8),
        (encode_batch(cid, 2, out_of_domain), "out_of_domain", 20),
        (b"", "truncated", 1),
    ]
    # Apache Kafka refuses the oversized message itself (message.max.bytes, 1 MiB); Tansu stores
    # it and the worker dead-letters it
    on_kafka = isinstance(kafka_broker, ApacheKafka)
    oversized = [b for b in bad if b[1] == "oversized"]
    if on_kafka:
        bad = [b for b in bad if b[1] != "oversized"]

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap,
                                    max_request_size=8 * 1024 * 1024)
        await producer.start()
        try:
            await producer.send_and_wait(coll.topic, encode_batch(cid, 2, good_a), partition=0)
            for payload, *_ in bad:
                await producer.send_and_wait(coll.topic, payload, partition=0)
            if on_kafka:
                with pytest.raises(MessageSizeTooLargeError):
                    await producer.send_and_wait(coll.topic, oversized[0][0], partition=0)
            # partition 1 gets bad input only, then a good batch
            await producer.send_and_wait(coll.topic, b"LDPB\x07junk", partition=1)
            await producer.send_and_wait(coll.topic, encode_batch(cid, 2, good_b), partition=1)
            for row in burst:
                await producer.send(coll.topic, encode_batch(cid, 2, row[None, :]), partition=1)
            await producer.flush()
        finally:
            await producer.stop()
        store = make_store(redis_target.url)
        total = len(good_a) + len(good_b) + len(burst_ok)
        assert await wait_for_n(store, cid, total, timeout=30) == total, worker.log_tail()
        got = await read_collection(store, coll)
        want = mech.count(np.concatenate([good_a, good_b, burst_ok]), specs)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        offsets = await store.offsets(cid, 16)
        assert offsets == {0: len(bad), 1: 1 + len(burst)}, offsets  # last offsets, rejects included
        await store.close()

        # the dead letters, read from the beginning of ldp.dlq (shared by all tests: filter)
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, group_id=None,
                                    enable_auto_commit=False)
        await consumer.start()
        tp = TopicPartition("ldp.dlq", 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        records = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(records) < len(bad) + 2:
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                for m in msgs:
                    doc = json.loads(m.value)
                    if doc["topic"] == coll.topic:
                        records.append(doc)
        await consumer.stop()
        return records

    records = asyncio.run(run())
    got = Counter((r["partition"], r["reason"]) for r in records)
    want = Counter((0, reason) for _, reason, _ in bad)
    want[(1, "malformed")] += 1  # b"LDPB\x07junk": unknown format version
    want[(1, "out_of_domain")] += 1  # the bad one of the burst
    assert got == want, records
    p0 = sorted((r for r in records if r["partition"] == 0), key=lambda r: r["offset"])
    assert [r["offset"] for r in p0] == list(range(1, len(bad) + 1))
    assert all(r["detail"] and r["received_at"] > 0 for r in records)
    assert all(r["collection"] == cid for r in records), records  # undecodable ones too
    assert "'no-such-collection'" in next(r for r in records
                                          if r["reason"] == "unknown_collection")["detail"]
    assert next(r for r in records if r["partition"] == 1 and r["reason"] == "out_of_domain")[
        "offset"] == 2 + 17
    ood = next(r for r in records if r["reason"] == "out_of_domain" and r["partition"] == 0)
    assert ood["collection"] == cid and ood["payload_bytes"] == len(
        next(payload for payload, reason, _ in bad if reason == "out_of_domain"))

    text = worker.get("/metrics")
    expected = Counter()
    for _, reason, k in bad:
        expected[reason] += k
    expected["malformed"] += 1
    expected["out_of_domain"] += 1
    for reason, k in expected.items():
        assert _metric(text, "ldp_reports_rejected_total", collection=cid, reason=reason) == k, (
            reason, k)
    assert _metric(text, "ldp_reports_rejected_total") == sum(expected.values())  # nothing else
    assert _metric(text, "ldp_reports_ingested_total", collection=cid) == 650 + 39
    assert worker.proc.poll() is None  # still running
    assert worker.stop() == 0
