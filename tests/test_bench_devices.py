"""Smoke test of ``ldpstream bench devices --quick --json`` (its own embedded broker, Redis and
worker child processes): it runs to the end and prints, per step, the documented figures with
positive values, and the churn run stays below the cap with the retention. No performance target
is asserted (the machine is shared); it takes ≈ 2-3 min."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEP_KEYS = {"memo_bytes", "dedupe_bytes", "quota_bytes", "worker_rss_mb", "memo_rate",
             "worker_rss_mb_idle", "memo_again_rate", "plain_again_rate", "memo_vs_plain_again",
             "plain_rate", "memo_vs_plain", "refresh_s", "restart_to_ready_s", "rebalance_s",
             "plain_restart_s", "memo_resend_rate", "plain_resend_rate", "memo_vs_plain_resend",
             "memo_moved_rate", "plain_moved_rate", "memo_vs_plain_moved"}


def test_bench_devices_quick_json():
    try:
        res = subprocess.run([sys.executable, "-m", "ldpstream.cli", "bench", "devices",
                              "--quick", "--json"], capture_output=True, text=True, timeout=540)
    except subprocess.TimeoutExpired as exc:   # its progress says which step was slow
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        pytest.fail(f"bench devices --quick: no result after 540 s; progress:\n{err[-4000:]}")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    doc = json.loads(res.stdout)
    assert [s["devices"] for s in doc["steps"]] == [20_000, 40_000]
    for step in doc["steps"]:
        for key in STEP_KEYS:
            v = step[key]
            assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, (key, v)
        assert step["memo_vs_plain"] == step["memo_rate"] / step["plain_rate"]
        # a log row is 8 + 4 × 3 + 8 = 28 bytes (the 8 values in one byte each); a dedupe or
        # quota field holds more than an id
        assert 28 <= step["memo_bytes"] < 400 and 8 < step["dedupe_bytes"] < 400
    (restart,) = doc["restart_at"]
    assert restart["devices"] == 50_000 and restart["restart_to_ready_s"] > 0
    churn = doc["churn"]
    kept, grown = churn["with_retention"], churn["without_retention"]
    assert len(kept["entries_by_month"]) == 36 and kept["first_month_over_cap"] is None
    # with the retention the state is flat after the first retention span; without, it grows
    late = kept["entries_by_month"][6:]
    assert max(late) <= 1.1 * min(late), late
    assert grown["entries_by_month"][-1] > 1.5 * kept["entries_by_month"][-1]
    assert math.isfinite(doc["rss_growth"]) and math.isfinite(doc["rss_growth_busy"])
    assert kept["peak_index_bytes"] == 16 * kept["max_entries"]
