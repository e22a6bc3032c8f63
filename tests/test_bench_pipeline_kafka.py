"""Smoke test of the Apache Kafka part of ``ldpstream bench pipeline --broker kafka``
(bench/pipeline_kafka.py): its own Kafka JVM, Redis and worker; 50,000 reports, one raw/ingest
pair; the documented keys come back positive. No rate is asserted (the machine is shared)."""
from __future__ import annotations

import asyncio
import math
import os

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.kafka]


def test_kafka_pairs_report_rates_and_ratio(tmp_path):
    from ldpstream.bench.pipeline import _write_config
    from ldpstream.bench.pipeline_kafka import kafka_pairs
    from ldpstream.config import load_config
    from ldpstream.dev.kafka import KAFKA_VERSION

    cfg = tmp_path / "bench.yaml"
    _write_config(cfg, refresh_interval_s=1.0)
    coll = next(iter(load_config(cfg, env={}).collections.values()))
    env = dict(os.environ, LDP_SESSION_TIMEOUT_S="3", LDP_WEB_BIND="127.0.0.1")
    res = asyncio.run(kafka_pairs(cfg, env, coll, 50_000, 1, tmp_path, lambda msg: None))
    assert res["kafka_version"] == KAFKA_VERSION
    for key in ("kafka_ingest_rate", "kafka_raw_consume_rate", "kafka_ratio"):
        assert math.isfinite(res[key]) and res[key] > 0, (key, res[key])
    assert res["kafka_ratio"] == res["kafka_ingest_rate"] / res["kafka_raw_consume_rate"]
    assert res["kafka_ratios"] == [res["kafka_ratio"]]
