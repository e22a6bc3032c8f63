"""Estimate refresh over time windows (real redis-server): estimates equal the estimators on the
window's exact counts, the previous window drives drift, unchanged windows are not re-read or
re-estimated, failures show in the payload and the gauges, and the Redis lease/lock lets one
worker refresh a collection at a time."""
from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from tolerance import assert_close

from ldpstream.agents import metrics
from ldpstream.agents.context import Context
from ldpstream.agents.refresh.bucket_reader import WindowCounts
from ldpstream.agents.refresh.payloads import PREVIOUS, refresh_payloads
from ldpstream.agents.refresh.refresher import LEASE, LOCK, Refresher, tick_safe
from ldpstream.agents.store import keys
from ldpstream.agents.store.apply_delta import PartitionDelta
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.lease import acquire, release
from ldpstream.config import AppConfig, parse_config
from ldpstream.estimators.kernels.metrics import tvd
from ldpstream.estimators.stream.drift import drift_test, null_variances
from ldpstream.estimators.stream.many import EstimateCache
from ldpstream.privacy import WEAK_EPSILON

pytestmark = pytest.mark.pipeline

ATTRS = {"sex": ["F", "M"], "income": ["<=50K", ">50K"], "edu": ["school", "college", "grad"],
         "age": ["<30", "30-50", ">50"]}
MARGINALS = [["sex", "income"], ["income", "edu", "age"], ["edu", "sex"]]


def make_config(cid: str = "t", **kw) -> AppConfig:
    coll = {"id": cid, "schema": {"attributes": ATTRS}, "mechanism": "rr-ind", "epsilon": 1.5,
            "partitions": 2, "marginals": MARGINALS,
            "estimators": ["castell", "truncated", "ibu"], "refresh_interval_s": 1.0,
            "bucket_s": 1, "windows": ["5s", "all"]}
    coll.update(kw)
    return parse_config({"collections": [coll]}, env={})


def correlated_records(n: int, rng: np.random.Generator, shift: float = 0.0) -> np.ndarray:
    sex = rng.integers(0, 2, n)
    income = (rng.random(n) < 0.15 + 0.25 * sex + shift).astype(int)
    edu = np.minimum(2, income + rng.integers(0, 2, n))
    age = rng.integers(0, 3, n)
    return np.stack([sex, income, edu, age], axis=1)


def counts_of(coll, n: int, seed: int, shift: float = 0.0) -> dict[str, np.ndarray]:
    mech = coll.mechanism()
    rng = np.random.default_rng(seed)
    return mech.count(mech.randomize(correlated_records(n, rng, shift), rng), coll.tensors())


def add(a: dict, b: dict) -> dict:
    return {k: a[k] + b[k] for k in a}


def _ctx(config: AppConfig, store: CountStore) -> Context:
    return Context(config=config, redis_url="", kafka_bootstrap="", store=store)


async def _apply(store: CountStore, ctx: Context, cid: str, partition: int, offset: int,
                 expected: int, counts: dict, n: int, bucket: int | None,
                 sent: float | None = None) -> None:
    coll = ctx.config.collections[cid]
    layout = ctx.collections[cid].layout(coll.version)
    d = PartitionDelta(partition, offset, {(layout, bucket): layout.pack(counts, n)}, n,
                       expected, sent)
    (res,) = await store.apply_many(cid, [d], coll.policy)
    assert res.applied


def _wc(counts: dict | None, n: int) -> WindowCounts:
    return WindowCounts({} if counts is None else {0: counts}, n, ())


def test_refresh_payloads_equal_the_estimators_and_the_drift_test():
    config = make_config(windows=["5s", "all"])
    coll = config.collections["t"]
    mech = coll.mechanism()
    old, new = counts_of(coll, 20_000, 1), counts_of(coll, 20_000, 2, shift=0.3)
    reads = {"5s": _wc(new, 20_000), "5s" + PREVIOUS: _wc(old, 20_000),
             "all": _wc(add(old, new), 40_000)}
    payloads, computed = refresh_payloads(coll, mech, reads, 123.0, EstimateCache())
    assert len(payloads) == len(MARGINALS) * 3 * 2 and computed > 0
    for p in payloads:
        counts = new if p["window"] == "5s" else add(old, new)
        est = mech.estimate(counts, p["attrs"], p["method"])
        # castell is served projected onto the simplex, its raw cells alongside
        assert_close(p["cells"], (est.projected or est.factor).values, rel=1e-9)
        if p["projected"]:
            assert_close(p["raw_cells"], est.factor.values, rel=1e-9)
        assert p["n"] == (20_000 if p["window"] == "5s" else 40_000) and p["updated_at"] == 123.0
        # the configured budget and its scope, and what the channels cost, computed
        assert p["epsilon"] == coll.epsilon and p["epsilon_scope"] == coll.epsilon_scope
        assert p["epsilon_per_record"] == pytest.approx(mech.epsilon) and p["versions"] == [0]
        assert p["epsilon_per_attribute"] == pytest.approx(max(mech.epsilons))
        assert (p["privacy_note"] is not None) == (mech.epsilon > WEAK_EPSILON)
        if p["window"] == "all":
            assert p["drift_statistic"] is None and p["drift_alarm"] is False
            continue
        prev = mech.estimate(old, p["attrs"], p["method"]).factor.values
        va, vb = null_variances(mech, {0: new}, {0: old}, p["attrs"], p["method"])
        want = drift_test(est.factor.values, va, prev, vb, alpha=coll.drift_alpha)
        assert p["drift_tvd"] == pytest.approx(tvd(est.factor.values, prev))
        assert p["drift_statistic"] == pytest.approx(want.statistic, rel=1e-6)
        assert p["drift_threshold"] == pytest.approx(want.threshold)
        assert p["drift_alarm"] == want.alarm
    alarms = {(p["method"], tuple(p["attrs"])) for p in payloads if p["drift_alarm"]}
    assert ("castell", ("sex", "income")) in alarms  # the income distribution moved
    # an unchanged table is not estimated again (the cache), an empty window is said so
    cache = EstimateCache()
    refresh_payloads(coll, mech, reads, 1.0, cache)
    _, again = refresh_payloads(coll, mech, reads, 2.0, cache)
    assert again == 0
    empty = {"5s": _wc(None, 0), "5s" + PREVIOUS: _wc(None, 0), "all": _wc(old, 20_000)}
    out, _ = refresh_payloads(coll, mech, empty, 3.0, EstimateCache())
    assert all(p["empty"] and p["cells"] is None for p in out if p["window"] == "5s")
    assert all(p["cells"] is not None for p in out if p["window"] == "all")


def test_failures_are_reported_per_estimate():
    """A tensor missing from the counts (a config changed under a running worker): every
    estimate that needs it fails with its reason, the others are still computed."""
    config = make_config(windows=["all"])
    coll = config.collections["t"]
    counts = counts_of(coll, 20_000, 1)
    broken = {k: v for k, v in counts.items() if "income|edu|age" not in k}
    out, _ = refresh_payloads(coll, coll.mechanism(), {"all": _wc(broken, 20_000)}, 5.0,
                              EstimateCache())
    failed = [p for p in out if p.get("error")]
    assert {tuple(p["attrs"]) for p in failed} == {("income", "edu", "age")}
    assert all(p["cells"] is None and "KeyError" in p["error"] for p in failed)
    assert len(out) - len(failed) == 6


def test_lock_acquire_release_and_expiry(redis_url):
    async def run():
        store = CountStore.from_url(redis_url)
        r = store.redis
        key = keys.collection_key("x", LOCK)
        t1 = await acquire(r, key, 300)
        assert t1 and await acquire(r, key, 300) is None
        assert not await release(r, key, "not-the-owner")
        assert await release(r, key, t1)
        t2 = await acquire(r, key, 150)
        assert t2 and t2 != t1
        await asyncio.sleep(0.25)  # expired: a crashed holder cannot block refreshes forever
        assert await acquire(r, key, 150) is not None
        await store.close()
    asyncio.run(run())


def test_two_workers_one_refresh_per_interval(redis_url):
    config = make_config("lease", estimators=["castell", "truncated"])
    coll = config.collections["lease"]

    async def run():
        store = CountStore.from_url(redis_url)
        await store.reset("lease")
        ctx1, ctx2 = _ctx(config, store), _ctx(config, store)
        await _apply(store, ctx1, "lease", 0, 10, -1, counts_of(coll, 5000, 1), 5000,
                     coll.policy.fine_bucket(time.time()), sent=time.time() - 2)
        w1, w2 = Refresher(ctx1), Refresher(ctx2)
        results = await asyncio.gather(w1.tick("lease"), w2.tick("lease"), w1.tick("lease"))
        done = [r for r in results if r is not None]
        assert len(done) == 1 and len(done[0]) == len(MARGINALS) * 2 * 2  # × 2 windows
        lock = keys.collection_key("lease", LOCK)
        token = await acquire(store.redis, lock, 5000)
        assert await w2.refresh("lease", wait_s=0.2) is None  # another worker holds the lock
        await release(store.redis, lock, token)
        assert await w2.refresh("lease", wait_s=0.2) is not None
        assert await store.redis.get(lock) is None  # released after the refresh
        assert await store.redis.pttl(keys.collection_key("lease", LEASE)) > 0
        for w in (w1, w2):
            w.executor.shutdown(wait=True)
        await store.close()
    asyncio.run(run())


def _gauge(name, **labels):
    return metrics.REGISTRY.get_sample_value(name, labels)


def test_windows_previous_window_drift_and_gauges(redis_url):
    """Reports in the previous 5 s window, then shifted ones in the current: the 5s window's
    estimate is the estimator on the current buckets only, its drift the tvd against the
    estimate on the previous buckets; 'all' sums both."""
    config = make_config("win", estimators=["castell", "truncated"])
    coll = config.collections["win"]
    c_old = counts_of(coll, 20_000, 2)
    c_new = counts_of(coll, 20_000, 3, shift=0.4)  # the income shifts

    async def run():
        store = CountStore.from_url(redis_url)
        await store.reset("win")
        ctx = _ctx(config, store)
        now_b = coll.policy.fine_bucket(time.time())
        sent = time.time() - 1.5
        # previous window: buckets now-9..now-5 (on two partitions); current: now-4..now
        await _apply(store, ctx, "win", 0, 0, -1, c_old, 20_000, now_b - 7, sent)
        await _apply(store, ctx, "win", 1, 0, -1, c_new, 20_000, now_b - 1, sent + 1)
        w = Refresher(ctx)
        payloads = await w.refresh("win")
        mech = coll.mechanism()
        by = {(p["window"], p["method"], tuple(p["attrs"])): p for p in payloads}
        assert len(by) == len(MARGINALS) * 2 * 2
        for (window, method, attrs), p in by.items():
            counts = c_new if window == "5s" else add(c_old, c_new)
            est = mech.estimate(counts, attrs, method)
            np.testing.assert_allclose(p["cells"], (est.projected or est.factor).values,
                                       rtol=1e-12)
            assert p["n"] == (20_000 if window == "5s" else 40_000)
            stored = await store.get_estimate("win", window, method, attrs)
            assert stored == json.loads(json.dumps(p))
            if window == "5s":
                prev = mech.estimate(c_old, attrs, method).factor.values
                assert p["drift_tvd"] == pytest.approx(tvd(est.factor.values, prev))
            else:
                assert p["drift_tvd"] is None  # 'all' has no previous window
        p = by[("5s", "castell", ("sex", "income"))]
        drift = p["drift_tvd"]
        assert drift > 0.05 and p["drift_alarm"]  # the income distribution moved
        assert p["drift_statistic"] > p["drift_threshold"]
        lab = dict(collection="win", marginal="sex|income", method="castell", window="5s")
        assert _gauge("ldp_estimate_cell", **lab, cell="M|>50K") == pytest.approx(p["cells"][1][1])
        assert _gauge("ldp_estimate_drift_tvd", **lab) == pytest.approx(drift)
        assert _gauge("ldp_estimate_drift_statistic", **lab) == pytest.approx(p["drift_statistic"])
        assert _gauge("ldp_estimate_drift_statistic_threshold", **lab) == pytest.approx(
            p["drift_threshold"])
        assert _gauge("ldp_estimate_drift_alarm", **lab) == 1
        assert _gauge("ldp_estimate_error_bound", **lab) == pytest.approx(p["error_bound"])
        assert _gauge("ldp_estimate_failing", **lab) == 0
        assert _gauge("ldp_collection_reports", collection="win") == 40_000
        fresh = _gauge("ldp_estimate_freshness_seconds", collection="win")
        assert fresh == pytest.approx(p["updated_at"] - (sent + 1), rel=1e-6)
        # a worker that did not refresh mirrors the stored estimates into its gauges
        metrics.clear_collection("win")
        assert _gauge("ldp_estimate_cell", **lab, cell="M|>50K") is None
        assert await Refresher(_ctx(config, store)).sync_gauges("win") == len(payloads)
        assert _gauge("ldp_estimate_cell", **lab, cell="M|>50K") == pytest.approx(p["cells"][1][1])
        w.executor.shutdown(wait=True)
        await store.close()
    asyncio.run(run())


def test_unchanged_buckets_are_neither_reread_nor_reestimated(redis_url):
    config = make_config("memo", estimators=["ibu"], windows=["1h", "all"], bucket_s=60)
    coll = config.collections["memo"]

    async def run():
        store = CountStore.from_url(redis_url)
        await store.reset("memo")
        ctx = _ctx(config, store)
        b = coll.policy.fine_bucket(time.time())
        await _apply(store, ctx, "memo", 0, 0, -1, counts_of(coll, 5000, 4), 5000, b - 3)
        w = Refresher(ctx)
        reads: list[int] = []
        real = store.read_cells

        async def counting(cid, layout, where):
            where = list(where)
            reads.append(len(where))
            return await real(cid, layout, where)

        store.read_cells = counting  # count the tensor reads of the real store
        first = await w.refresh("memo")
        assert sum(reads) > 0 and w.health["memo"]["computed"] > 0
        reads.clear()
        second = await w.refresh("memo")   # nothing changed: no tensor read, nothing estimated
        assert sum(reads) == 0 and w.health["memo"]["computed"] == 0
        assert [p["cells"] for p in second] == [p["cells"] for p in first]
        await _apply(store, ctx, "memo", 1, 0, -1, counts_of(coll, 100, 5), 100, b)
        third = await w.refresh("memo")
        assert 0 < sum(reads) <= 4  # only the changed buckets (fine, coarse, all) on 2 partitions
        assert all(p["n"] == 5100 for p in third)
        w.executor.shutdown(wait=True)
        await store.close()
    asyncio.run(run())


def test_a_failed_refresh_is_counted_and_shown(redis_url):
    config = make_config("down")

    async def run():
        store = CountStore.from_url("redis://127.0.0.1:1")  # nothing listens there
        r = Refresher(_ctx(config, store))
        before = _gauge("ldp_refresh_errors_total", collection="down") or 0.0
        await tick_safe(r, "down")
        assert _gauge("ldp_refresh_errors_total", collection="down") == before + 1
        assert "Error" in r.health["down"]["last_error"]
        r.executor.shutdown(wait=True)
        await store.close()
    asyncio.run(run())


def test_static_gauges_from_config():
    config = make_config("static", refresh_interval_s=7.0, expect_traffic=False)
    # never connected: the static gauges come from the config alone
    r = Refresher(_ctx(config, CountStore.from_url("redis://127.0.0.1:1")))
    r.set_static_gauges("static")
    assert _gauge("ldp_refresh_interval_seconds", collection="static") == 7.0
    assert _gauge("ldp_ingest_expected", collection="static") == 0.0
    assert _gauge("ldp_epsilon_per_record", collection="static") == pytest.approx(
        config.collections["static"].mechanism().epsilon)
