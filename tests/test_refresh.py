"""Estimate refresh: equal to the estimators called directly, drift on a known history, and the
Redis lease/lock that lets one worker refresh a collection at a time (real redis-server)."""
from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

import numpy as np
import pytest

from ldpstream.agents import metrics
from ldpstream.agents.context import Context
from ldpstream.agents.refresh import (LEASE_KEY, LOCK_KEY, Refresher, acquire, drift_tvd,
                                      refresh_collection, release)
from ldpstream.agents.store import CountStore
from ldpstream.estimators.domain import Domain
from ldpstream.estimators.metrics import tvd
from ldpstream.estimators.rr_ind import RRIndependent
from ldpstream.services import EmbeddedRedis

DOMAIN = Domain.from_categories({
    "sex": ["F", "M"],
    "income": ["<=50K", ">50K"],
    "edu": ["school", "college", "grad"],
    "age": ["<30", "30-50", ">50"],
})
MARGINALS = [("sex", "income"), ("income", "edu", "age"), ("edu", "sex")]
ESTIMATORS = list(RRIndependent.estimators)


def make_collection(cid="t", marginals=MARGINALS, estimators=ESTIMATORS, **kw):
    """The collection fields refresh reads (the config loader's Collection has these and more)."""
    mech = RRIndependent(DOMAIN, epsilon=1.5)
    fields = dict(id=cid, domain=DOMAIN, mechanism_name="rr-ind", epsilon=1.5,
                  epsilon_scope="attribute", marginals=[tuple(m) for m in marginals],
                  estimators=list(estimators), refresh_interval_s=1.0, drift_window_s=0.3,
                  drift_threshold=0.05, expect_traffic=True, version=0)
    fields.update(kw)
    coll = SimpleNamespace(**fields)
    coll.mechanism = lambda: mech
    coll.tensors = lambda: mech.tensors(coll.marginals)
    return coll, mech


def correlated_records(n: int, rng: np.random.Generator, shift: float = 0.0) -> np.ndarray:
    sex = rng.integers(0, 2, n)
    income = (rng.random(n) < 0.15 + 0.25 * sex + shift).astype(int)
    edu = np.minimum(2, income + rng.integers(0, 2, n))
    age = rng.integers(0, 3, n)
    return np.stack([sex, income, edu, age], axis=1)


def reports_and_counts(mech, coll, n=20_000, seed=0, shift=0.0):
    rng = np.random.default_rng(seed)
    reports = mech.randomize(correlated_records(n, rng, shift), rng)
    return reports, mech.count(reports, coll.tensors())


# --- the pure function -------------------------------------------------------------------------

def test_refresh_collection_equals_direct_estimator_calls():
    coll, mech = make_collection()
    _, counts = reports_and_counts(mech, coll)
    payloads = refresh_collection(coll, mech, counts, now=1234.5)
    assert len(payloads) == len(MARGINALS) * len(ESTIMATORS)
    for p in payloads:
        est = mech.estimate(counts, p["attrs"], p["method"])
        np.testing.assert_array_equal(np.asarray(p["cells"]), est.factor.values)
        assert tuple(p["attrs"]) in MARGINALS and p["collection"] == "t"
        assert p["n"] == 20_000 == est.n
        assert p["epsilon"] == pytest.approx(mech.epsilon) and p["epsilon"] == pytest.approx(6.0)
        assert p["epsilon_scope"] == "attribute" and p["updated_at"] == 1234.5
        assert p["labels"] == [list(DOMAIN.labels[DOMAIN.axes([a])[0]]) for a in p["attrs"]]
        assert p["error_bound"] == (None if est.error_bound is None else pytest.approx(est.error_bound))
        assert p["iterations"] == est.iterations and p["converged"] == est.converged
        if p["method"].startswith("hybrid"):
            assert p["chosen"] == est.extra["chosen"] and p["chosen"]
        else:
            assert p["chosen"] is None
        json.dumps(p, allow_nan=False)  # storable as strict JSON
    castell = {tuple(p["attrs"]): p for p in payloads if p["method"] == "castell"}
    # sanity on the data: an unbiased estimate sums to 1 and is close to the truth
    truth = np.zeros((2, 2))
    rec = correlated_records(20_000, np.random.default_rng(0))
    np.add.at(truth, (rec[:, 0], rec[:, 1]), 1)
    assert np.sum(castell[("sex", "income")]["cells"]) == pytest.approx(1.0)
    assert tvd(np.asarray(castell[("sex", "income")]["cells"]), truth / truth.sum()) < 0.03


def test_refresh_skips_empty_collections_and_failing_estimators(caplog):
    coll, mech = make_collection(estimators=["castell", "no-such-method"])
    zero = {s.key: np.zeros(s.shape, np.int64) for s in coll.tensors()}
    assert refresh_collection(coll, mech, zero, now=1.0) == []
    _, counts = reports_and_counts(mech, coll, n=2000)
    payloads = refresh_collection(coll, mech, counts, now=1.0)
    assert [p["method"] for p in payloads] == ["castell"] * len(MARGINALS)
    assert "no-such-method" in caplog.text


# --- drift ---------------------------------------------------------------------------------------

def _p(t, cells):
    return {"updated_at": float(t), "cells": cells}


def test_drift_uses_the_newest_estimate_at_least_a_window_older():
    a, b, c = [[0.5, 0.5], [0, 0]], [[0.4, 0.4], [0.1, 0.1]], [[0.1, 0.2], [0.3, 0.4]]
    history = [_p(0, a), _p(10, b), _p(20, a), _p(30, c)]  # any order is fine
    newest = _p(30, c)
    # window 15 s: reference is t=10 (newest at or before 15)
    assert drift_tvd(newest, history[::-1], 15) == pytest.approx(tvd(np.array(c), np.array(b)))
    assert drift_tvd(newest, history, 10) == pytest.approx(tvd(np.array(c), np.array(a)))  # t=20
    assert drift_tvd(newest, history, 30) == pytest.approx(0.5 * (0.4 + 0.3 + 0.3 + 0.4))  # t=0
    assert drift_tvd(newest, history, 31) is None  # history not long enough yet
    assert drift_tvd(newest, [_p(0, [0.5, 0.5])], 15) is None  # shape changed
    # None cells (NaN in an estimate) count as 0 rather than poisoning the gauge
    assert drift_tvd(_p(30, [None, 1.0]), [_p(0, [0.0, 1.0])], 15) == 0.0


# --- with a real Redis ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def redis_url():
    with EmbeddedRedis() as r:
        yield r.start()


def _ctx(coll, store):
    return Context(config=SimpleNamespace(collections={coll.id: coll}, api_token=None),
                   redis_url="", kafka_bootstrap="", store=store,
                   mechanisms={coll.id: coll.mechanism()})


async def _fresh_store(url):
    store = CountStore.from_url(url)
    await store.redis.flushdb()
    return store


def test_lock_acquire_release_and_expiry(redis_url):
    async def run():
        store = await _fresh_store(redis_url)
        r = store.redis
        key = LOCK_KEY % "x"
        t1 = await acquire(r, key, 300)
        assert t1 and await acquire(r, key, 300) is None
        assert not await release(r, key, "not-the-owner")
        assert await acquire(r, key, 300) is None
        assert await release(r, key, t1)
        t2 = await acquire(r, key, 150)
        assert t2 and t2 != t1
        await asyncio.sleep(0.25)  # expired: a crashed holder cannot block refreshes forever
        assert await acquire(r, key, 150) is not None
        await store.close()
    asyncio.run(run())


def test_two_workers_one_refresh_per_interval(redis_url):
    coll, mech = make_collection(cid="lease", estimators=["castell", "truncated"])
    reports, counts = reports_and_counts(mech, coll, n=5000, seed=1)

    async def run():
        store = await _fresh_store(redis_url)
        assert await store.apply("lease", 0, 10, counts, len(reports), sent_at_max=time.time() - 2)
        w1, w2 = Refresher(_ctx(coll, store)), Refresher(_ctx(coll, store))
        results = await asyncio.gather(w1.tick("lease"), w2.tick("lease"), w1.tick("lease"))
        done = [r for r in results if r is not None]
        assert len(done) == 1 and len(done[0]) == len(MARGINALS) * 2
        hist = await store.estimate_history("lease", "castell", ("sex", "income"), 60)
        assert len(hist) == 1
        # a forced refresh waits for the lock, gives up when another worker holds it
        token = await acquire(store.redis, LOCK_KEY % "lease", 5000)
        assert await w2.refresh("lease", wait_s=0.2) is None
        await release(store.redis, LOCK_KEY % "lease", token)
        assert await w2.refresh("lease", wait_s=0.2) is not None
        assert await store.redis.get(LOCK_KEY % "lease") is None  # released after refresh
        assert await store.redis.pttl(LEASE_KEY % "lease") > 0  # lease stays until it expires
        w1.executor.shutdown(wait=True)
        w2.executor.shutdown(wait=True)
        await store.close()
    asyncio.run(run())


def test_drift_with_a_window_longer_than_256_intervals(redis_url):
    """drift_window_s = 400 refresh intervals: the history must keep an estimate that old. With a
    fixed 256-entry cap every refresh trimmed it below the window, so drift stayed None forever
    and EstimateDrift could never fire."""
    coll, mech = make_collection(cid="longwin", marginals=[("sex", "income")],
                                 estimators=["castell"], refresh_interval_s=1.0,
                                 drift_window_s=400.0)
    reports, counts = reports_and_counts(mech, coll, n=5000, seed=4)
    old = refresh_collection(coll, mech, counts, now=0.0)[0]
    old["cells"] = [[0.25, 0.25], [0.25, 0.25]]

    async def run():
        store = await _fresh_store(redis_url)
        await store.apply("longwin", 0, 1, counts, len(reports))
        # the history of a steady refresh every interval for the last 450 s (oldest pushed first)
        key = "ldp:{longwin}:hist:castell:m:sex|income"
        now = time.time()
        await store.redis.lpush(key, *[json.dumps(dict(old, updated_at=now - 450 + i))
                                       for i in range(450)])
        w = Refresher(_ctx(coll, store))
        for _ in range(3):  # steady state: every refresh still finds an entry 400 s old
            (p,) = await w.refresh("longwin")
            assert p["drift_tvd"] is not None
            assert p["drift_tvd"] == pytest.approx(tvd(np.asarray(p["cells"]),
                                                       np.asarray(old["cells"])))
        assert await store.redis.llen(key) == 453  # under the collection's cap (804): all kept
        w.executor.shutdown(wait=True)
        await store.close()
    asyncio.run(run())


def _gauge(name, **labels):
    return metrics.REGISTRY.get_sample_value(name, labels)


def test_refresh_loop_stores_estimates_drift_and_gauges(redis_url):
    coll, mech = make_collection(cid="loop", estimators=["castell", "hybrid"], drift_window_s=0.3)
    r1, c1 = reports_and_counts(mech, coll, n=20_000, seed=2)
    r2, c2 = reports_and_counts(mech, coll, n=20_000, seed=3, shift=0.4)  # the income shifts

    async def run():
        store = await _fresh_store(redis_url)
        w = Refresher(_ctx(coll, store))
        sent = time.time() - 1.5
        await store.apply("loop", 0, 1, c1, len(r1), sent_at_max=sent)
        first = await w.refresh("loop")
        assert all(p["drift_tvd"] is None for p in first)  # no history a window old yet
        await asyncio.sleep(0.35)
        await store.apply("loop", 0, 2, c2, len(r2), sent_at_max=sent + 1)
        second = await w.refresh("loop")
        both = {k: c1[k] + c2[k] for k in c1}
        for p in second:
            est = mech.estimate(both, p["attrs"], p["method"])
            np.testing.assert_allclose(p["cells"], est.factor.values)
            prev = [q for q in first if q["attrs"] == p["attrs"] and q["method"] == p["method"]][0]
            assert p["drift_tvd"] == pytest.approx(tvd(np.array(p["cells"]), np.array(prev["cells"])))
            stored = await store.get_estimate("loop", p["method"], p["attrs"])
            assert stored == json.loads(json.dumps(p))
        drift = {tuple(p["attrs"]): p["drift_tvd"] for p in second if p["method"] == "castell"}
        assert drift[("sex", "income")] > 0.05  # the income distribution moved
        # gauges of this worker
        p = [q for q in second if q["method"] == "castell" and q["attrs"] == ["sex", "income"]][0]
        assert _gauge("ldp_estimate_cell", collection="loop", marginal="sex|income",
                      method="castell", cell="M|>50K") == pytest.approx(p["cells"][1][1])
        assert _gauge("ldp_estimate_drift_tvd", collection="loop", marginal="sex|income",
                      method="castell") == pytest.approx(drift[("sex", "income")])
        assert _gauge("ldp_estimate_error_bound", collection="loop", marginal="sex|income",
                      method="castell") == pytest.approx(p["error_bound"])
        assert _gauge("ldp_collection_reports", collection="loop") == 40_000
        assert _gauge("ldp_epsilon_per_record", collection="loop") == pytest.approx(6.0)
        fresh = _gauge("ldp_estimate_freshness_seconds", collection="loop")
        assert fresh == pytest.approx(p["updated_at"] - (sent + 1), abs=1e-6) and fresh > 0.4
        assert _gauge("ldp_estimate_last_refresh_timestamp_seconds", collection="loop") == p["updated_at"]
        assert _gauge("ldp_estimate_refresh_seconds_count", collection="loop") == 2
        # a worker that did not refresh mirrors the stored estimates into its gauges
        metrics.clear_collection("loop")
        assert _gauge("ldp_estimate_cell", collection="loop", marginal="sex|income",
                      method="castell", cell="M|>50K") is None
        assert await Refresher(_ctx(coll, store)).sync_gauges("loop") == len(second)
        assert _gauge("ldp_estimate_cell", collection="loop", marginal="sex|income",
                      method="castell", cell="M|>50K") == pytest.approx(p["cells"][1][1])
        w.executor.shutdown(wait=True)
        await store.close()
    asyncio.run(run())


def test_static_gauges_from_config():
    coll, mech = make_collection(cid="static", refresh_interval_s=7.0, drift_threshold=0.08,
                                 expect_traffic=False)
    Refresher(_ctx(coll, None)).set_static_gauges("static")
    assert _gauge("ldp_refresh_interval_seconds", collection="static") == 7.0
    assert _gauge("ldp_drift_threshold", collection="static") == 0.08
    assert _gauge("ldp_ingest_expected", collection="static") == 0.0
    assert _gauge("ldp_epsilon_per_record", collection="static") == pytest.approx(mech.epsilon)
