"""Numeric collections live, without services (docs/numeric.md "Live", docs/windows.md "Numeric
attributes"): the drift test of a mean or a quantile is calibrated to the LDP noise and finds a
moved population; what a refresh stores, the page's history and the gauges carry a numeric
estimate's summary instead of its input grid's cells."""
from __future__ import annotations

import numpy as np
import pytest

from ldpstream.estimators.families.numeric import Numeric
from ldpstream.estimators.kernels import numeric as nm
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.stream.drift import sidak_threshold, terms_test
from ldpstream.estimators.stream.many import drift_many, estimate_many

pytestmark = pytest.mark.core

G = 257
MARGINALS = [("battery",), ("fw", "battery"), ("fw",)]


def mechanism(eps: float = 1.0) -> Numeric:
    dom = Domain(("fw", "battery"), (3, G), (("a", "b", "c"), nm.numeric_labels(0, 100, G)),
                 (None, (0.0, 100.0)))
    return Numeric(dom, {"battery": (0.0, 100.0)}, eps)


def window(mech: Numeric, n: int, rng: np.random.Generator, a: float = 5.0, b: float = 2.0):
    """The counts of n reports: fw uniform, battery ~ 100·Beta(a, b)."""
    vals = np.stack([rng.integers(0, 3, n), 100 * rng.beta(a, b, n)], axis=1)
    idx, _ = mech.encode(vals)
    return mech.count(mech.randomize(idx, rng), mech.tensors(MARGINALS))


def report_law(mech: Numeric, n: int = 400_000) -> dict[str, np.ndarray]:
    """Each count tensor's cell probabilities for the stationary population (fw uniform,
    battery ~ 100·Beta(5, 2)): the input distribution through the channels, exactly."""
    rng = np.random.default_rng(0)
    vals = np.stack([rng.integers(0, 3, n), 100 * rng.beta(5, 2, n)], axis=1)
    idx, _ = mech.encode(vals)
    p = np.zeros(mech.domain.shape)
    np.add.at(p, (idx[:, 0], idx[:, 1]), 1.0 / n)
    joint = mech.channel(0).T @ p @ mech.channel(1)
    return {"m:battery": joint.sum(axis=0), "m:fw|battery": joint}


def test_the_drift_of_a_mean_or_a_quantile_is_calibrated_and_finds_a_moved_population():
    """200 pairs of stationary windows (20,000 reports each, ε = 1; each tensor a multinomial
    draw from its exact cell probabilities): every standardized change (the mean; the share
    below each pooled quantile; per firmware) has a standard deviation within 0.8–1.2 of 1 (3
    standard errors), and the alarm rate at α = 0.05 is at most α plus 3 standard errors
    (Šidák over correlated quantities: at most α). A population whose battery moved from
    Beta(5, 2) to Beta(3, 2) (mean 71.4 → 60; reports randomized by the family) alarms at
    α = 0.001 on the mean and the quantiles; the mean's detail says where it went."""
    mech = mechanism(1.0)
    rng = np.random.default_rng(4)
    law = report_law(mech)
    keys = [(m, method) for m in MARGINALS[:2] for method in ("mean", "distribution")]
    zs: dict = {k: [] for k in keys}
    alarms = dict.fromkeys(keys, 0)
    runs = 200

    def draw() -> dict[str, np.ndarray]:
        return {k: rng.multinomial(20_000, p.ravel()).reshape(p.shape) for k, p in law.items()}
    for _ in range(runs):
        cur, prev = draw(), draw()
        for attrs, method in keys:
            t = mech.drift_terms(cur, prev, attrs, method)
            zs[attrs, method].append((t.cur - t.prev) / np.sqrt(t.cur_var + t.prev_var))
            alarms[attrs, method] += terms_test(t, alpha=0.05).alarm
    for k in keys:
        sd = np.std(np.array(zs[k]), axis=0)
        assert np.all((sd > 0.8) & (sd < 1.2)), (k, sd)
        assert alarms[k] / runs <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / runs), (k, alarms[k])
    mech2 = mechanism(2.0)
    before, after = window(mech2, 20_000, rng), window(mech2, 20_000, rng, a=3.0)
    t = mech2.drift_terms(after, before, ("battery",), "mean")
    res = terms_test(t, alpha=0.001)
    assert res.alarm and res.threshold == pytest.approx(sidak_threshold(1, 0.001))
    (d,) = res.detail
    assert d["quantity"] == "mean" and abs(d["previous"] - 71.4) < 1.5 and \
        abs(d["current"] - 60.0) < 1.5 and d["z"] == res.statistic
    assert res.tvd == pytest.approx(abs(d["current"] - d["previous"]) / 100)
    res = terms_test(mech2.drift_terms(after, before, ("battery",), "distribution"), alpha=0.001)
    assert res.alarm and [q["quantity"] for q in res.detail] == ["0.5", "0.9", "0.99"]
    assert res.threshold == pytest.approx(sidak_threshold(3, 0.001))
    # a change below drift_min_effect is no alarm
    assert not terms_test(mech2.drift_terms(after, before, ("battery",), "mean"), alpha=0.001,
                          min_effect=0.2).alarm


def test_a_refresh_tests_numeric_quantities_and_categorical_cells():
    """drift_many on an sw-hm collection: the numeric marginals get the closed-form test of
    their mean (per category for fw × battery), the categorical one (fw alone) the cells' test;
    an estimate's payload carries the summary the API serves and the ε computed."""
    from ldpstream.agents.refresh.payloads import estimate_payload
    from ldpstream.windows import parse_window

    mech = mechanism(2.0)
    rng = np.random.default_rng(9)
    windows = {"1m": ({0: window(mech, 8_000, rng)}, {0: window(mech, 8_000, rng, a=2.0)})}
    counts = {"1m": windows["1m"][0], "1m/previous": windows["1m"][1]}
    methods = {MARGINALS[0]: "mean", MARGINALS[1]: "mean", MARGINALS[2]: "distribution"}
    estimates = {k: e for m, method in methods.items() for k, e in estimate_many(
        mech, counts, [m], [method]).estimates.items()}
    cur = {k: e for k, e in estimates.items() if k[0] == "1m"}
    prev = {("1m", k[1], k[2]): e for k, e in estimates.items() if k[0] == "1m/previous"}
    drift = drift_many(mech, windows, cur, prev, alpha=0.001)
    assert not drift.failures, drift.failures
    mean = drift.results[("1m", ("battery",), "mean")]
    assert mean.alarm and mean.detail[0]["quantity"] == "mean"
    by_fw = drift.results[("1m", ("fw", "battery"), "mean")]
    assert [(q["category"], q["quantity"]) for q in by_fw.detail] == [
        (c, "mean") for c in "abc"] and by_fw.alarm
    assert drift.results[("1m", ("fw",), "distribution")].detail == ()   # cells, as before

    class Coll:   # what the payload reads of a collection
        id = "c"
        domain = mech.domain
        epsilon = 2.0
        epsilon_scope = "attribute"
    p = estimate_payload(Coll, mech, cur[("1m", ("battery",), "mean")], ("battery",), "mean",
                         parse_window("1m"), 0.0, [0])
    assert p["epsilon_per_record"] == pytest.approx(mech.epsilon) == pytest.approx(4.0)
    num = p["numeric"]
    assert num["mean"]["mechanism"] == "points" and num["mean"]["low"] < num["mean"]["value"] < \
        num["mean"]["high"] and (num["min"], num["max"]) == (0.0, 100.0)


def test_history_and_gauges_keep_the_summary_not_the_grid():
    from ldpstream.agents import metrics
    from ldpstream.agents.serve.selection import marginalize_payload
    from ldpstream.agents.serve.ui import History, history_answer

    mech = mechanism(2.0)
    counts = window(mech, 6_000, np.random.default_rng(2))
    est = mech.estimate(counts, ("fw", "battery"), "distribution")
    numeric = mech.summary_fields(est)["numeric"]
    assert [r["category"] for r in numeric["categories"]] == ["a", "b", "c"]
    q = numeric["categories"][0]["quantiles"]["0.5"]
    assert q["low"] <= q["value"] <= q["high"]
    labels = [["a", "b", "c"], list(nm.numeric_labels(0, 100, G))]
    payload = {"collection": "c", "window": "all", "method": "distribution",
               "attrs": ["fw", "battery"], "labels": labels, "updated_at": 1.0, "n": 6000,
               "cells": est.factor.values.tolist(), "numeric": numeric}
    hist = History()
    hist.record([payload])
    (point,) = hist.points(("c", "all", "distribution", ("fw", "battery")))
    assert point["cells"] is None and "histogram" not in point["numeric"]["categories"][0]
    assert point["numeric"]["categories"][0]["quantiles"] == numeric["categories"][0]["quantiles"]
    (ans,) = history_answer([point], ("fw", "battery"), ("battery", "fw"), labels)
    assert ans["numeric"] == point["numeric"]
    sub = marginalize_payload(payload, ("fw",))
    assert "numeric" not in sub and "per-category" in sub["warnings"][0]
    assert np.allclose(sub["cells"], [r["share"] for r in numeric["categories"]])

    labels4 = ("c-gauges", "fw|battery", "distribution", "all")
    metrics.numeric_gauges(labels4, numeric)
    assert metrics.NUMERIC_QUANTILE.labels(*labels4, "b", "0.9")._value.get() == \
        numeric["categories"][1]["quantiles"]["0.9"]["value"]
    assert metrics.NUMERIC_W1_BOUND.labels(*labels4, "c")._value.get() == \
        numeric["categories"][2]["w1_bound"] > 0
    assert point["numeric"]["categories"][2]["w1_bound"] == numeric["categories"][2]["w1_bound"]
    single = mech.summary_fields(mech.estimate(counts, ("battery",), "mean"))["numeric"]
    metrics.numeric_gauges(("c-gauges", "battery", "mean", "all"), single)
    assert metrics.NUMERIC_MEAN_LOW.labels("c-gauges", "battery", "mean", "all",
                                           metrics.ALL_CATEGORIES)._value.get() == \
        single["mean"]["low"]
    metrics.clear_collection("c-gauges")
    assert not [k for k in metrics.NUMERIC_MEAN._metrics if k[0] == "c-gauges"]
