"""Smoke test of ``ldpstream bench pipeline --quick --json --redis-cluster`` (its own embedded
broker, Redis, Redis Clusters and worker child processes): it runs to the end and prints the
documented JSON keys with positive values. No performance target is asserted (the machine is
shared); it takes ≈ 40 s."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

KEYS = {"ingest_rate", "raw_consume_rate", "ratio", "reports_per_message", "single_report_rate",
        "memo_ingest_rate", "memo_ratio", "memo_vs_plain", "memo_redis_bytes_per_device"}
REFRESH_KEYS = {"refresh_seconds", "freshness_seconds", "refresh_interval_s"}
CLUSTER_KEYS = {"cluster_ingest_rate", "cluster_ratio"}
APPLY_KEYS = {"applies_per_s", "reports_per_s", "redis_usec_per_apply", "nonzero_cells_per_apply"}


def test_bench_pipeline_quick_json():
    res = subprocess.run([sys.executable, "-m", "ldpstream.cli", "bench", "pipeline", "--quick",
                          "--json", "--redis-cluster"], capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    doc = json.loads(res.stdout)
    assert KEYS | REFRESH_KEYS <= set(doc), sorted(doc)
    assert "refresh_error" not in doc, doc["refresh_error"]
    values = [(key, doc[key]) for key in KEYS | REFRESH_KEYS | CLUSTER_KEYS]
    assert set(doc["apply"]) == {"single", "cluster_1_master", "cluster_3_masters"}
    values += [(f"{where}.{key}", a[key]) for where, a in doc["apply"].items() for key in APPLY_KEYS]
    for key, v in values:
        assert isinstance(v, (int, float)) and not isinstance(v, bool), (key, v)
        assert math.isfinite(v) and v > 0, (key, v)
    assert doc["reports_per_message"] == 500
    assert doc["ratio"] == doc["ingest_rate"] / doc["raw_consume_rate"]
    assert doc["ratios"] == [doc["ratio"]]   # --quick: one raw/ingest pair
    assert set(doc["ingest_timings_s"]) >= {"poll", "decode", "count", "apply"}
    assert doc["cluster_ratio"] == doc["cluster_ingest_rate"] / doc["raw_consume_rate"]
    assert doc["refresh_interval_s"] == 1.0  # --quick refreshes every second
    assert doc["reports"] == 200_000 and doc["single_reports"] == 20_000
    assert doc["memo_reports"] == 50_000 and doc["memo_devices"] == 100_000
    assert doc["memo_vs_plain"] == doc["memo_ingest_rate"] / doc["ingest_rate"]
    assert len(doc["freshness_samples"]) == 2
    assert set(doc["raw_timings_s"]) == {"poll", "decode", "cpu"}
    # by CPU: the raw consumer's seconds ÷ the worker's and Redis's over the same reports
    assert len(doc["cpu_ratios"]) == 1 and doc["cpu_ratio"] == doc["cpu_ratios"][0] > 0
    assert {k: p["reports_per_message"] for k, p in doc["small_batches"].items()} == \
        {"10": 10, "1": 1}
    assert doc["quiet"]["probes"] == 3 and 0 < doc["quiet"]["p50_s"] <= doc["quiet"]["p99_s"]
    checks = doc["guard"]["checks"]
    assert len(checks) == 4 and doc["guard"]["pass"] == all(c["pass"] for c in checks)
    # Redis memory: every count key is a bucket of some level or the all-time tensor
    assert 0 < doc["redis_bytes_per_bucket"] < doc["redis_bytes_now"]
    assert doc["redis_bytes_all_time"] > 0 and doc["redis_bytes_estimates"] > 0
    assert doc["redis_bytes_steady_state"] > doc["redis_bytes_now"]
    assert doc["buckets_retained"] == (2 * 3600 + doc["bucket_s"]) / doc["bucket_s"]
