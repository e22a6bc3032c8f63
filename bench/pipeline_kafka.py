"""``ldpstream bench pipeline --broker kafka``: the ingest/raw pairs of bench/pipeline.py again on
Apache Kafka (one KRaft broker+controller, ldpstream/dev/kafka.py), next to the Tansu numbers of
the same run (docs/pipeline.md, "Measured").

Same collection, same prefill (``total`` reports, 500 per message), a fresh Redis (so no offset or
log mark of the Tansu run is seen), ``repeats`` raw/ingest pairs; the median pair's ratio is
``kafka_ratio``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from ldpstream.bench.ingest_run import BATCH, ingest_rate, prefill, raw_consume, start_worker, stop_worker


async def kafka_pairs(cfg_path: Path, env: dict[str, str], coll: Any, total: int, repeats: int,
                      work: Path, say: Callable[[str], None]) -> dict[str, Any]:
    """Raw consumption and worker ingest of ``coll`` on Apache Kafka, ``repeats`` pairs."""
    from ldpstream.agents.app import make_store
    from ldpstream.dev.kafka import KAFKA_VERSION, ApacheKafka
    from ldpstream.dev.process import free_port
    from ldpstream.dev.redis import EmbeddedRedis
    from ldpstream.kafka_admin import create_ldp_topics

    kafka, redis = ApacheKafka(), EmbeddedRedis()
    worker = None
    try:
        say(f"Apache Kafka {KAFKA_VERSION}: start, prefill {total:,} reports ...")
        bootstrap, url = kafka.start(), redis.start()
        await create_ldp_topics(bootstrap, (coll,))
        kenv = dict(env, KAFKA_BOOTSTRAP_SERVERS=bootstrap, REDIS_URL=url)
        stats = await prefill(bootstrap, coll, total, BATCH)
        store = make_store(url)
        port = free_port()
        raws, ingests = [], []
        for rep in range(repeats):
            say(f"Apache Kafka [{rep + 1}/{repeats}] raw consumption, then ingest ...")
            raw, got = await raw_consume(bootstrap, coll, stats.sent_messages)
            assert got == total, (got, total)
            await store.reset(coll.id)
            worker = start_worker(cfg_path, kenv, port, work / f"worker-kafka-{rep}.log")
            ingest, _ = await ingest_rate(store, coll.id, coll.partitions, total, port)
            stop_worker(worker)
            worker = None
            raws.append(raw)
            ingests.append(ingest)
        await store.close()
    finally:
        if worker is not None:
            stop_worker(worker)
        kafka.stop()
        redis.stop()
    ratios = [i / r for i, r in zip(ingests, raws)]
    mid = sorted(range(repeats), key=lambda k: ratios[k])[(repeats - 1) // 2]
    return {"kafka_version": KAFKA_VERSION, "kafka_ingest_rate": ingests[mid],
            "kafka_raw_consume_rate": raws[mid], "kafka_ratio": ratios[mid],
            "kafka_ratios": ratios, "kafka_raw_consume_rates": raws,
            "kafka_ingest_rates": ingests, "kafka_heap": os.environ.get("LDP_KAFKA_HEAP", "256m")}
