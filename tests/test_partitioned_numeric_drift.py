"""Drift of a numeric attribute inside ``partitioned``'s marginals (docs/windows.md "Numeric
attributes", docs/numeric.md "In partitioned marginals"): the mean and the shares below the
pooled median, p90 and p99 (per category for a by-category marginal) are compared in closed
form from the unbiased tables; the test is calibrated to the LDP noise (GRR and OLH tables, two
declared tables holding the 1-way marginal), finds a moved population, and a refresh serves what
moved under ``drift_detail``."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import betainc

from ldpstream.config import parse_config
from ldpstream.estimators.families import partitioned_numeric as pn
from ldpstream.estimators.families.partitioned import Partitioned, tensor_key
from ldpstream.estimators.oracles import frequency_oracles as fo
from ldpstream.estimators.stream.drift import sidak_threshold, terms_test

pytestmark = pytest.mark.core

BINS = 9
#: the marginals served; (fw,) is categorical: its cells are tested, as before
SERVED = [["battery"], ["fw", "battery"], ["fw"]]
NUMERIC = [("battery",), ("fw", "battery")]


def collection(oracles: list[str] | None = None, **extra) -> dict:
    params = {"marginals": [["battery"], ["fw", "battery"], ["fw"]], "bins": {"battery": BINS},
              **({"oracles": oracles} if oracles else {})}
    return {"id": "c", "schema": {"attributes": {
        "fw": ["a", "b", "c"], "battery": {"numeric": {"min": 0, "max": 100}}}},
        "mechanism": "partitioned", "epsilon": 2.0, "epsilon_scope": "record",
        "params": params, "marginals": SERVED, "estimators": ["global", "unbiased"], **extra}


def mechanism(oracles: list[str] | None = None) -> Partitioned:
    mech = parse_config({"collections": [collection(oracles)]}).collections["c"].mechanism()
    assert isinstance(mech, Partitioned)
    return mech


def cell_law(mech: Partitioned, a: float = 5.0, b: float = 2.0) -> dict[str, np.ndarray]:
    """Each declared table's cell probabilities: fw uniform, battery ~ 100·Beta(a, b) put on
    the nearest grid point, then rounded without bias to the points (exactly)."""
    G = mech.domain["battery"]
    cuts = np.clip((np.arange(G + 1) - 0.5) / (G - 1), 0, 1)
    grid = np.diff(betainc(a, b, cuts))
    pts = grid @ mech.binning.channel(mech.domain.axes(("battery",))[0])
    fw = np.full(3, 1 / 3)
    law = {("battery",): pts, ("fw", "battery"): np.outer(fw, pts).ravel(), ("fw",): fw}
    return {tensor_key(m): law[tuple(m)] for m in mech.marginals}


def draw(mech: Partitioned, law: dict[str, np.ndarray], n: int,
         rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One window's tensors from the exact report probabilities: each report's table uniform,
    then its code multinomial with the oracle's channel (GRR: the code is the support; OLH: the
    code (seed, y) supports every cell hashed to y under its seed)."""
    per_table = rng.multinomial(n, np.full(len(mech.marginals), 1 / len(mech.marginals)))
    out = {}
    for (key, f), o, n_k in zip(law.items(), mech.oracles, per_table):
        codes = rng.multinomial(n_k, f @ o.channel())
        if isinstance(o, fo.OLH):
            H = o.hash(np.arange(o.seeds), np.arange(o.d))
            codes = codes.reshape(o.seeds, o.g)[np.arange(o.seeds)[:, None], H].sum(axis=0)
        out[key] = np.concatenate([codes, [n_k]])
    return out


def reports(mech: Partitioned, n: int, rng: np.random.Generator, a: float = 5.0,
            b: float = 2.0) -> dict[str, np.ndarray]:
    """The counts of n reports randomized by the family (fw uniform, battery ~ 100·Beta(a, b))."""
    G = mech.domain["battery"]
    idx = np.stack([rng.integers(0, 3, n),
                    np.rint(rng.beta(a, b, n) * (G - 1)).astype(np.int64)], axis=1)
    return mech.count(mech.randomize(idx, rng), mech.tensors())


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
    rng = np.random.default_rng(17)
    law = cell_law(mech)
    runs = 300
    zs: dict = {a: [] for a in NUMERIC}
    alarms = dict.fromkeys(NUMERIC, 0)
    for _ in range(runs):
        cur, prev = draw(mech, law, 20_000, rng), draw(mech, law, 20_000, rng)
        for attrs in NUMERIC:
            t = mech.drift_terms(cur, prev, attrs, "global")
            zs[attrs].append((t.cur - t.prev) / np.sqrt(t.cur_var + t.prev_var))
            alarms[attrs] += terms_test(t, alpha=0.05).alarm
    assert t.names == tuple(f"{c}/{q}" for c in "abc" for q in ("mean", "0.5", "0.9", "0.99"))
    se = np.sqrt(0.05 * 0.95 / runs)
    for attrs in NUMERIC:
        z = np.array(zs[attrs])
        assert np.all(np.abs(z.mean(axis=0)) < 0.2), (attrs, z.mean(axis=0))
        sd = z.std(axis=0)
        assert np.all((sd > 0.87) & (sd < 1.13)), (attrs, sd)
        assert 0.01 <= alarms[attrs] / runs <= 0.05 + 3 * se, (attrs, alarms[attrs])


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
