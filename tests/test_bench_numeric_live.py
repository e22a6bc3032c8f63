"""Smoke test of ``ldpstream bench numeric --live --quick --json`` (its own embedded broker, Redis
and worker processes): both collections are counted and the document carries each one's
ratio and the numeric ÷ categorical quotient against the target, by rate and by CPU. No rate is asserted (the machine
is shared)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_bench_numeric_live_quick_json():
    res = subprocess.run([sys.executable, "-m", "ldpstream.cli", "bench", "numeric", "--live",
                          "--quick", "--json"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    doc = json.loads(res.stdout)
    assert doc["cat"]["mechanism"] == "rr-ind" and doc["num"]["mechanism"] == "sw-hm"
    assert doc["num"]["cells"] > doc["cat"]["cells"] == 8 * 16
    for cid in ("cat", "num"):
        r = doc[cid]
        assert r["ingest_rate"] > 0 and r["raw_consume_rate"] > 0
        assert math.isclose(r["ratio"], r["ingest_rate"] / r["raw_consume_rate"], rel_tol=1e-12)
        assert {"poll", "decode", "count", "apply"} <= set(r["ingest_timings_s"])
        # by CPU: the raw consumer's seconds ÷ the worker's and Redis's, one per pair
        assert len(r["cpu_ratios"]) == 1 and r["cpu_ratio"] == r["cpu_ratios"][0] > 0
        assert r["ingest_timings_s"]["cpu"] > 0 and r["ingest_timings_s"]["redis_cpu"] > 0
    assert math.isclose(doc["numeric_vs_categorical"], doc["num"]["ratio"] / doc["cat"]["ratio"],
                        rel_tol=1e-12)
    assert doc["pass"] == (doc["numeric_vs_categorical"] >= doc["target"])
    assert math.isclose(doc["numeric_vs_categorical_cpu"],
                        doc["num"]["cpu_ratio"] / doc["cat"]["cpu_ratio"], rel_tol=1e-12)
