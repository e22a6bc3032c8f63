"""Adaptive flushing (docs/pipeline.md "Adaptive flushing"): a quiet stream's report is counted
as soon as the worker's poll returns, not at the batch timer; a busy stream (a backlog) still
batches its applies. Real broker (Tansu, then Apache Kafka), real Redis, worker as a child.

The batch timer is set to 30 s here, so a worker that waits for it cannot pass: the bound on a
quiet report (p99 under 1 s) is generous for a loaded CI machine; `ldpstream bench pipeline`,
`bench mqtt` and `bench gateway` state the 100 ms figure of an idle machine."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from conftest import over_both_brokers, wait_for_n, write_config

pytestmark = pytest.mark.pipeline
kafka_broker = over_both_brokers()

#: the batch timer of the tests' worker: far beyond the bound, so only adaptive flushing meets it
BATCH_SECONDS = 30.0
#: p99 publish → counted of a quiet stream on a loaded CI machine
QUIET_BOUND_S = 1.0


def _single_report(coll, mech, rng) -> bytes:
    from ldpstream.producers.codec import encode_batch

    rec = rng.integers(0, np.array(coll.domain.shape), size=(1, len(coll.domain)))
    return encode_batch(coll.id, mech.version, mech.randomize(rec, rng))


def test_quiet_stream_counted_when_the_poll_returns(tmp_path, kafka_broker, service_env,
                                                    spawn_worker, unique_name):
    from ldpstream.agents.app import make_store
    from ldpstream.bench.ingest_run import publish_to_counted
    from ldpstream.config import load_config
    from ldpstream.producers.publisher import Publisher

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, partitions=2, refresh_interval_s=60.0,
                        ingest={"batch_reports": 1_000_000, "batch_seconds": BATCH_SECONDS})
    coll = load_config(path).collections[cid]
    mech = coll.mechanism()
    worker = spawn_worker(path)
    worker.wait_ready(60)
    rng = np.random.default_rng(7)

    async def run() -> list[float]:
        store = make_store(service_env["REDIS_URL"])
        try:
            async with Publisher(kafka_broker.bootstrap) as pub:
                async def send(_: int) -> None:
                    await pub.send_and_wait(coll.topic, _single_report(coll, mech, rng))

                return await publish_to_counted(store, cid, coll.partitions, send, probes=10,
                                                interval_s=0.5)
        finally:
            await store.close()

    latencies = asyncio.run(run())
    p99 = float(np.percentile(latencies, 99))
    assert p99 < QUIET_BOUND_S, (latencies, worker.log_tail())
    assert worker.stop() == 0


def _applies_for_backlog(tmp_path, kafka_broker, service_env, spawn_worker, cid: str,
                         batch_reports: int, bodies) -> int:
    """Publish ``bodies`` (one collection, one partition) before a worker with a 30 s batch
    timer starts; wait until every report is counted, exactly; the worker's applies."""
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.kafka_admin import create_ldp_topics
    from ldpstream.producers.codec import decode_batch
    from ldpstream.producers.publisher import Publisher

    path = write_config(tmp_path / "c.yaml", cid, partitions=1, refresh_interval_s=60.0,
                        ingest={"batch_reports": batch_reports, "batch_seconds": BATCH_SECONDS})
    coll = load_config(path).collections[cid]
    bodies = bodies(coll, coll.mechanism())
    total = sum(len(decode_batch(b).reports) for b in bodies)

    async def backlog() -> None:
        async with Publisher(kafka_broker.bootstrap) as pub:
            futs = [await pub.send(coll.topic, body) for body in bodies]
            await asyncio.gather(*futs)

    asyncio.run(create_ldp_topics(kafka_broker.bootstrap, (coll,)))
    asyncio.run(backlog())
    worker = spawn_worker(path)
    worker.wait_ready(60)

    async def counted() -> int:
        store = make_store(service_env["REDIS_URL"])
        try:
            await wait_for_n(store, cid, total, timeout=BATCH_SECONDS / 2)
            await asyncio.sleep(0.5)
            return await store.n(cid, 1)
        finally:
            await store.close()

    assert asyncio.run(counted()) == total
    ingest = json.loads(worker.get("/healthz", any_status=True))["checks"]["ingest"]
    assert worker.stop() == 0
    # the worker's CPU seconds from its assignment to its last apply (what `bench pipeline`
    # divides by the reports): counted, and less than the wall time between them by the idle
    span = ingest["last_apply_at"] - ingest["assigned_at"]
    assert 0 < ingest["cpu_s"] <= 2 * span + 0.5, ingest
    return int(ingest["applied_batches"])


def test_busy_stream_still_batches(tmp_path, kafka_broker, service_env, spawn_worker,
                                   unique_name):
    """A backlog of 3,000 single-report messages is counted exactly, in a few applies (full
    polls are never flushed on their own), not one per poll."""
    rng = np.random.default_rng(8)
    applies = _applies_for_backlog(
        tmp_path, kafka_broker, service_env, spawn_worker, unique_name, 1000,
        lambda coll, mech: [_single_report(coll, mech, rng) for _ in range(3000)])
    # polls of 200 messages at first, then up to 4 deltas' worth: 3,000 messages take at least
    # 7 polls; batched, 3 deltas of 1,000 reports and what is left when the worker caught up
    assert 1 <= applies <= 5


def test_a_backlog_beyond_one_fetch_is_not_taken_for_caught_up(tmp_path, kafka_broker,
                                                                service_env, spawn_worker,
                                                                unique_name):
    """A backlog of several fetches (13 MB against the consumer's 4 MiB per partition): every
    poll but the last comes back short, yet none reaches the log's end, so nothing is flushed
    before the backlog is taken: one apply (flushing at every short poll applied the first
    fetch alone, then the rest)."""
    from ldpstream.producers.codec import encode_batch

    def bodies(coll, mech) -> list[bytes]:
        rng = np.random.default_rng(9)
        rec = rng.integers(0, np.array(coll.domain.shape), size=(16_000, len(coll.domain)))
        body = encode_batch(coll.id, mech.version, mech.randomize(rec, rng))
        assert len(body) * 200 > 3 * 4 * 1_048_576   # several fetches of the worker's consumer
        return [body] * 200

    assert _applies_for_backlog(tmp_path, kafka_broker, service_env, spawn_worker, unique_name,
                                100_000_000, bodies) == 1
