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

from ldpstream.bench.ingest_run import BATCH, quiet_probes, ratio_pairs, start_worker, stop_worker


async def kafka_pairs(cfg_path: Path, env: dict[str, str], coll: Any, total: int, repeats: int,
                      work: Path, say: Callable[[str], None], probes: int = 0,
                      quiet_cfg: Path | None = None) -> dict[str, Any]:
    """Raw consumption and worker ingest of ``coll`` on Apache Kafka, ``repeats`` pairs; then
    ``probes`` single reports, one per second, timed from publish to counted (by a worker of
    ``quiet_cfg``, default ``cfg_path``)."""
    from ldpstream.agents.app import make_store
    from ldpstream.dev.kafka import KAFKA_VERSION, ApacheKafka
    from ldpstream.dev.process import free_port
    from ldpstream.dev.redis import EmbeddedRedis
    from ldpstream.kafka_admin import create_ldp_topics

    kafka, redis = ApacheKafka(), EmbeddedRedis()
    worker = None
    try:
        say(f"Apache Kafka {KAFKA_VERSION}: start ...")
        bootstrap, url = kafka.start(), redis.start()
        await create_ldp_topics(bootstrap, (coll,))
        kenv = dict(env, KAFKA_BOOTSTRAP_SERVERS=bootstrap, REDIS_URL=url)
        store = make_store(url)
        pairs = await ratio_pairs(bootstrap, store, cfg_path, kenv, coll, total, BATCH, repeats,
                                  work, "Apache Kafka", say)
        quiet = None
        if probes:
            say(f"Apache Kafka: publish -> counted, {probes} single reports one per second ...")
            worker = start_worker(quiet_cfg or cfg_path, kenv, free_port(),
                                  work / "worker-kafka-quiet.log")
            quiet = await quiet_probes(bootstrap, store, coll, probes)
        await store.close()
    finally:
        if worker is not None:
            stop_worker(worker)
        kafka.stop()
        redis.stop()
    out = {"kafka_version": KAFKA_VERSION, "kafka_ingest_rate": pairs["ingest_rate"],
           "kafka_raw_consume_rate": pairs["raw_consume_rate"], "kafka_ratio": pairs["ratio"],
           "kafka_ratios": pairs["ratios"], "kafka_raw_consume_rates": pairs["raw_consume_rates"],
           "kafka_ingest_rates": pairs["ingest_rates"],
           "kafka_ingest_timings_s": pairs["ingest_timings_s"],
           "kafka_raw_timings_s": pairs["raw_timings_s"],
           "kafka_heap": os.environ.get("LDP_KAFKA_HEAP", "256m")}
    if quiet is not None:
        out["kafka_quiet"] = quiet
    return out
