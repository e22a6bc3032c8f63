"""Drift of a numeric attribute inside ``partitioned``'s marginals (docs/windows.md "Numeric
attributes", docs/numeric.md "In partitioned marginals"): the mean and the shares below the
pooled median, p90 and p99 (per category for a by-category marginal) are compared in closed
form from the unbiased tables; the test is calibrated to the LDP noise (GRR and OLH tables, two
declared tables holding the 1-way marginal), finds a moved population, and a refresh serves what
moved under ``drift_detail``."""
from __future__ import annotations

import numpy as np
import pytest

from ldpstream.bench.numeric_drift import (
    BINS,
    NUMERIC,
    calibration,
    cell_law,
    collection,
    draw,
    mechanism,
    reports,
)
from ldpstream.config import parse_config
from ldpstream.estimators.families import partitioned_numeric as pn
from ldpstream.estimators.families.partitioned import tensor_key
from ldpstream.estimators.stream.drift import sidak_threshold, terms_test

pytestmark = pytest.mark.core


@pytest.mark.parametrize("oracle", ["grr", "olh"])
def test_the_drift_of_the_mean_and_quantiles_is_calibrated(oracle):
    """300 pairs of stationary windows (20,000 reports each, ε = 2, each table's codes drawn
    from their exact probabilities): every standardized change (the mean and the share below
    each pooled quantile; per firmware; the 1-way one combined over the two declared tables
    holding it) has mean 0 within 0.2 and standard deviation within 0.87–1.13 (3 standard
    errors of a standard deviation over 300), and the alarm rate at α = 0.05 lies between 0.01
    and α plus 3 binomial standard errors (Šidák over correlated quantities: at most α)."""
    mech = mechanism([oracle])
    assert {o.name for o in mech.oracles} == {oracle}
    runs = 300
    res = calibration(mech, runs, np.random.default_rng(17))
    assert res["fw", "battery"]["names"] == tuple(
        f"{c}/{q}" for c in "abc" for q in ("mean", "0.5", "0.9", "0.99"))
    se = np.sqrt(0.05 * 0.95 / runs)
    for attrs in NUMERIC:
        z, sd = res[attrs]["z"], res[attrs]["sd"]
        assert np.all(np.abs(z.mean(axis=0)) < 0.2), (attrs, z.mean(axis=0))
        assert np.all((sd > 0.87) & (sd < 1.13)), (attrs, sd)
        assert 0.01 <= res[attrs]["alarm_rate"][0.05] <= 0.05 + 3 * se, (attrs, res[attrs])


def test_olh_covariance_is_the_codes_multinomial():
    """The OLH table's covariance (:class:`~.partitioned_numeric.CodeCov`) against 2,000 tables
    drawn from the exact code probabilities (27 cells, ε = 2): the mean's and the median share's
    standard errors within 10 % of the measured ones (the standard error of a measured standard
    deviation over 2,000: 1.6 %), where the per-cell variance (eq. 4, no covariance between
    cells) is off by more than that."""
    mech = mechanism(["olh"])
    j = mech.marginals.index(("fw", "battery"))
    o = mech.oracles[j]
    key = tensor_key(mech.marginals[j])
    law = cell_law(mech)
    rng = np.random.default_rng(3)
    tabs = [draw(mech, law, 30_000, rng)[key] for _ in range(2_000)]
    raws = np.array([o.estimate(t[:-1], t[-1]) for t in tabs])
    n = int(np.mean([t[-1] for t in tabs]))
    f = law[key]
    cov = pn.cell_cov(o, (f @ o.channel()) * n, n, f)   # supports unused by OLH
    assert isinstance(cov, pn.CodeCov)
    point = np.tile(np.arange(BINS), 3)
    pos = mech.binning.points[1] / (mech.domain["battery"] - 1)
    U = np.stack([pos[point], (point < BINS // 2).astype(float)])
    measured = (raws @ U.T).std(axis=0)
    stated = np.sqrt(np.diag(cov.of(U)))
    assert np.all(np.abs(stated / measured - 1) < 0.1), (stated, measured)
    per_cell = np.sqrt((U ** 2) @ (o.variance(n, f, fixed_data=True) + f / n))
    assert np.any(np.abs(per_cell / measured - 1) > 0.1), (per_cell, measured)


def test_a_moved_mean_alarms_and_says_where_it_went():
    """Reports randomized by the family (the oracles it chooses at ε = 2), 20,000 per window:
    battery moving from 100·Beta(5, 2) to 100·Beta(3, 2) (mean 71.4 → 60) alarms at α = 0.001
    on the mean, whose detail gives both windows' means within 3 of the truth (about 3 of its
    standard errors); a minimum effect above the change silences it; per firmware, a larger
    move alarms on each firmware's mean."""
    mech = mechanism()
    rng = np.random.default_rng(11)
    before, after = reports(mech, 20_000, rng), reports(mech, 20_000, rng, a=3.0)
    res = terms_test(mech.drift_terms(after, before, ("battery",), "global"), alpha=0.001)
    assert res.alarm and res.threshold == pytest.approx(sidak_threshold(4, 0.001))
    mean = res.detail[0]
    assert mean["quantity"] == "mean" and mean["z"] > res.threshold
    assert abs(mean["previous"] - 500 / 7) < 3 and abs(mean["current"] - 60) < 3, mean
    assert mean["effect"] == pytest.approx(abs(mean["current"] - mean["previous"]) / 100)
    assert [q["quantity"] for q in res.detail] == ["mean", "0.5", "0.9", "0.99"]
    med = res.detail[1]   # the share below the pooled median rose (the values moved down)
    assert 0 < med["at"] < 100 and med["current"] > med["previous"]
    assert res.tvd == pytest.approx(max(q["effect"] for q in res.detail))
    # per firmware a third of a table's reports each: a move to 100·Beta(2, 5) (mean 28.6)
    # alarms on every firmware's mean
    down = reports(mech, 20_000, rng, a=2.0, b=5.0)
    by = terms_test(mech.drift_terms(down, before, ("fw", "battery"), "unbiased"), alpha=0.001)
    assert by.alarm and by.threshold == pytest.approx(sidak_threshold(12, 0.001))
    assert [(q["category"], q["quantity"]) for q in by.detail] == [
        (c, q) for c in "abc" for q in ("mean", "0.5", "0.9", "0.99")]
    assert all(q["z"] > by.threshold for q in by.detail if q["quantity"] == "mean"), by.detail
    assert not terms_test(mech.drift_terms(after, before, ("battery",), "global"), alpha=0.001,
                          min_effect=0.3).alarm
    # no change: no alarm at α = 0.001
    again = reports(mech, 20_000, rng, a=3.0)
    assert not terms_test(mech.drift_terms(again, after, ("battery",), "global"),
                          alpha=0.001).alarm
    # a categorical marginal keeps the cells' test
    assert mech.drift_terms(after, before, ("fw",), "global") is None


def test_a_refresh_serves_the_numeric_drift_detail():
    """refresh_payloads (the refresher's code path) on a partitioned collection with a 1m
    window whose previous window held the other population (mean 71.4, now 28.6): the numeric marginals' payloads
    carry the alarm and ``drift_detail`` (mean and quantiles, per firmware), fw alone the cells'
    test (no detail)."""
    from ldpstream.agents.refresh.bucket_reader import WindowCounts
    from ldpstream.agents.refresh.payloads import PREVIOUS, refresh_payloads
    from ldpstream.estimators.stream.many import EstimateCache

    coll = parse_config({"collections": [collection(windows=["1m"], drift_alpha=0.001)]}
                        ).collections["c"]
    mech = coll.mechanism()
    rng = np.random.default_rng(5)
    before, after = reports(mech, 20_000, rng), reports(mech, 20_000, rng, a=2.0, b=5.0)
    reads = {"1m": WindowCounts({0: after}, 20_000, ()),
             "1m" + PREVIOUS: WindowCounts({0: before}, 20_000, ())}
    payloads, _ = refresh_payloads(coll, mech, reads, 1.0, EstimateCache())
    got = {(tuple(p["attrs"]), p["method"]): p for p in payloads}
    for method in ("global", "unbiased"):
        p = got[("battery",), method]
        assert p["drift_alarm"] and "error" not in p and "drift_error" not in p
        assert [q["quantity"] for q in p["drift_detail"]] == ["mean", "0.5", "0.9", "0.99"]
        assert p["drift_statistic"] == max(q["z"] for q in p["drift_detail"])
        # the served mean and the drift's (the same tables, weighted for the two windows)
        mean = p["numeric"]["mean"]
        assert abs(mean["value"] - p["drift_detail"][0]["current"]) < \
            (mean["high"] - mean["low"]) / 4, (mean, p["drift_detail"][0])
        by = got[("fw", "battery"), method]
        assert by["drift_alarm"] and len(by["drift_detail"]) == 12
    fw = got[("fw",), "global"]
    assert fw["drift_detail"] is None and fw["drift_statistic"] is not None


def test_bench_numeric_drift_quick_json():
    """``ldpstream bench numeric --drift --quick --json`` (100 pairs, 3 seeds): a row per oracle
    and numeric marginal with standard deviations near 1 (within 0.75–1.25: 3.5 standard errors
    over 100) and alarm rates at most α plus 3 standard errors; the power rows."""
    import json
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "ldpstream.cli", "bench", "numeric", "--drift",
                          "--quick", "--json"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["runs"] == 100
    assert [(r["oracle"], r["marginal"]) for r in out["rows"]] == [
        (o, m) for o in ("grr", "olh") for m in ("battery", "fw|battery")]
    for r in out["rows"]:
        assert 0.75 < r["sd_min"] <= r["sd_max"] < 1.25, r
        assert r["alarm_0.05"] <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 100), r
    # power over 3 seeds: both moves alarm on battery, the larger one per firmware too
    moved, far = out["power"]
    assert moved["later"] == [3.0, 2.0] and moved["alarm"] == 1.0 and far["by_alarm"] == 1.0
