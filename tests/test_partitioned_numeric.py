"""Numeric attributes inside ``partitioned``'s marginals (docs/numeric.md "In partitioned
marginals"): the config accepts them with clear errors for bad fields, the privacy audit of the
channel actually applied (unbiased rounding to the points, then the oracle), unbiasedness of
the binned marginal and its mean by seeded Monte Carlo, and the numeric summaries served."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from tolerance import assert_close

from ldpstream.config import parse_config
from ldpstream.config_errors import ConfigError
from ldpstream.estimators.families import partitioned_numeric as pn
from ldpstream.estimators.families.partitioned import Partitioned
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.kernels.numeric import numeric_labels
from ldpstream.estimators.kernels.serving import served_fields
from ldpstream.estimators.mechanism import from_state

pytestmark = [pytest.mark.core, pytest.mark.slow]


def _domain(G: int = 9) -> Domain:
    """sex (2), fw (3), battery on a G-point grid of [0, 100]."""
    return Domain(("sex", "fw", "battery"), (2, 3, G),
                  (("F", "M"), ("a", "b", "c"), numeric_labels(0, 100, G)),
                  (None, None, (0.0, 100.0)))


def _config(**params) -> dict:
    return {"collections": [{
        "id": "c", "schema": {"attributes": {"sex": ["F", "M"], "fw": ["a", "b", "c"],
                                             "battery": {"numeric": {"min": 0, "max": 100}}}},
        "mechanism": "partitioned", "epsilon": 2.0, "epsilon_scope": "record",
        "params": params, "marginals": [["battery"], ["fw", "battery"], ["sex", "fw"]],
        "estimators": ["global", "unbiased"]}]}


def test_config_accepts_a_numeric_attribute_and_names_bad_fields():
    coll = parse_config(_config(ways=2, expected_reports=20_000)).collections["c"]
    mech = coll.mechanism()
    assert isinstance(mech, Partitioned) and set(mech.bins) == {"battery"}
    assert pn.MIN_BINS <= mech.bins["battery"] <= pn.MAX_BINS
    assert mech.epsilon == pytest.approx(2.0, rel=1e-12)
    # more reports: finer points (chosen from ε and the reports, never the data)
    more = parse_config(_config(ways=2, expected_reports=2_000_000)).collections["c"].mechanism()
    assert more.bins["battery"] > mech.bins["battery"]
    given = parse_config(_config(bins={"battery": 5})).collections["c"].mechanism()
    assert given.bins == {"battery": 5} and given.cell_domain().shape == (2, 3, 5)
    assert given.cell_domain().categories("battery") == ("0", "25", "50", "75", "100")
    for params, field, words in (
            ({"bins": {"sex": 4}}, "params.bins.sex", "not a numeric attribute"),
            ({"bins": {"battery": 65}}, "params.bins.battery", "2…64"),
            ({"bins": {"battery": "many"}}, "params.bins.battery", "integer"),
            ({"bins": [5]}, "params.bins", "numeric attribute: points")):
        with pytest.raises(ConfigError) as exc:
            parse_config(_config(**params))
        assert f"collections[0].{field}: " in str(exc.value) and words in str(exc.value), \
            str(exc.value)


def _channel(mech: Partitioned) -> np.ndarray:
    """P[record on the reported grid (C order), code]: (1/K)·Σ_k (rounding ⊗ …) · oracle_k."""
    dom = mech.domain
    recs = np.array(list(itertools.product(*[range(d) for d in dom.shape])))
    K, T = len(mech.marginals), int(mech.offsets[-1])
    P = np.zeros((len(recs), T))
    for j, (cols, o) in enumerate(zip(mech._cols, mech.oracles)):
        # Pr(cell of marginal j | record): the product over its attributes
        mats = [mech.binning.channel(c)[recs[:, c]] if c in mech.binning.points
                else np.eye(dom.shape[c])[recs[:, c]] for c in cols]
        cell = mats[0]
        for m in mats[1:]:
            cell = (cell[:, :, None] * m[:, None, :]).reshape(len(recs), -1)
        P[:, mech.offsets[j]:mech.offsets[j + 1]] += cell @ o.channel() / K
    return P


@pytest.mark.parametrize("oracles", [("grr",), ("olh",)])
@pytest.mark.parametrize("eps", [0.7, 3.0])
def test_privacy_audit_of_the_rounded_channel(oracles, eps):
    """The channel applied (unbiased rounding of the grid index to the points, then the
    oracle): its ε is the declared one and the family's, and sampled reports follow it."""
    dom = _domain(9)
    mech = Partitioned(dom, eps, ways=2, oracles=oracles, bins={"battery": 3})
    P = _channel(mech)
    assert_close(P.sum(axis=1), 1.0, rel=1e-12)
    assert ch.epsilon(P) == pytest.approx(eps, rel=1e-9)
    assert mech.epsilon == pytest.approx(eps, rel=1e-9)
    rng = np.random.default_rng(3)
    n = 60_000
    for r in (1, len(P) - 2, 4 * 9 + 5):   # grid points between the battery's points
        rec = np.array(np.unravel_index(r, dom.shape))[None, :].repeat(n, axis=0)
        codes = mech.randomize(rec, rng).astype(np.int64)[:, 0]
        freq = np.bincount(codes, minlength=P.shape[1]) / n
        sd = np.sqrt(P[r] * (1 - P[r]) / n)
        assert np.all(np.abs(freq - P[r]) <= 5 * sd + 1e-12), r


@pytest.mark.parametrize("oracles", [("grr",), ("olh",)])
@pytest.mark.parametrize("eps", [0.7, 3.0])
def test_the_description_applies_the_family_channel(oracles, eps):
    """The published description (a ``round`` step, then the partition step): every table's
    channel from a record's values (battery's grid indices) computed from the description alone
    (``record_table_channel``) is the family's to 1e-12, its ε, the description's and the
    declared one are ε to 1e-9, and the Python interpreter's reports of a device assigned to
    the (fw, battery) table (SplitMix64 seed 5, 2,000 per grid row) pass the audit's χ² test
    (α = 1e-4) against it."""
    from test_sdk_audit import check_channel

    from ldpstream.estimators.kernels.device_program import mix64, record_table_channel
    from ldpstream.producers.program import Program, SplitMix64

    dom = _domain(9)
    mech = Partitioned(dom, eps, ways=2, oracles=oracles, bins={"battery": 3})
    doc = mech.device_program()
    assert [s["op"] for s in doc["steps"]] == ["round", "partition"]
    assert doc["steps"][0] == {"op": "round", "in": [2], "points": [0, 4, 8]}
    prog = Program(doc)
    assert prog.epsilon == pytest.approx(eps, rel=1e-9)
    P, K = _channel(mech), len(mech.marginals)
    recs = np.array(list(itertools.product(*[range(d) for d in dom.shape])))
    tables = doc["steps"][1]["tables"]
    for j, (cols, t) in enumerate(zip(mech._cols, tables)):
        D = record_table_channel(doc, t)
        assert ch.epsilon(D) == pytest.approx(eps, rel=1e-9)
        rows = np.ravel_multi_index(tuple(recs[:, c] for c in cols), [dom.shape[c] for c in cols])
        assert_close(D[rows], K * P[:, mech.offsets[j]:mech.offsets[j + 1]], rel=1e-12)
    j = next(j for j, cols in enumerate(mech._cols) if tuple(cols) == (1, 2))
    seed = mix64(int(doc["steps"][1]["seed"]))
    dev = next(d for d in range(1000) if mix64(d ^ seed) % K == j)
    D = record_table_channel(doc, tables[j])
    counts = np.zeros_like(D)
    rng = SplitMix64(5)
    for r in range(len(D)):
        fw, battery = divmod(r, 9)
        for _ in range(2000):
            counts[r, prog.randomize([0, fw, battery], rng, dev)[0] - mech.offsets[j]] += 1
    assert check_channel(f"{oracles} ε={eps}", counts, D) == []


def test_binned_marginal_and_mean_are_unbiased_by_seeded_monte_carlo():
    """R = 100 runs on one dataset (battery ~ 100·Beta(5, 2), its firmware shifting it): every
    cell of the unbiased (fw, battery) table within 4 standard errors of the expected rounded
    table, the mean of every firmware and of all within 4 standard errors of the true mean on
    the grid, and the stated standard error of the mean within 25 % of the measured one."""
    G, n, R = 65, 3000, 100
    dom = _domain(G)
    rng = np.random.default_rng(11)
    fw = rng.integers(0, 3, n)
    x = np.rint(np.clip(rng.beta(5, 2 + fw), 0, 1) * (G - 1)).astype(np.int64)
    recs = np.stack([rng.integers(0, 2, n), fw, x], axis=1)
    mech = Partitioned(dom, 2.0, marginals=[["fw", "battery"], ["sex", "fw"]],
                       oracles=("grr",), bins={"battery": 9})
    R_b = mech.binning.channel(2)
    want = np.stack([np.bincount(x[fw == k], minlength=G) @ R_b for k in range(3)]) / n
    values = x / (G - 1) * 100
    true_means = [values[fw == k].mean() for k in range(3)] + [values.mean()]
    tables, means, ses = [], [], []
    for _ in range(R):
        c = mech.count(mech.randomize(recs, rng), mech.tensors())
        est = mech.estimate(c, ("fw", "battery"), "unbiased")
        tables.append(est.factor.values)
        rows = est.extra["categories"]
        one = mech.estimate(c, ("battery",), "unbiased").extra
        means.append([r["mean"] for r in rows] + [one["mean"]])
        ses.append([r["stderr"] for r in rows] + [one["stderr"]])
    t = np.stack(tables)
    se = t.std(axis=0, ddof=1) / np.sqrt(R)
    assert np.all(np.abs(t.mean(axis=0) - want) <= 4 * se + 1e-12)
    m = np.array(means)
    se_m = m.std(axis=0, ddof=1) / np.sqrt(R)
    assert np.all(np.abs(m.mean(axis=0) - true_means) <= 4 * se_m), (m.mean(axis=0), true_means)
    ratio = np.mean(ses, axis=0) / m.std(axis=0, ddof=1)
    assert np.all((ratio > 0.75) & (ratio < 1.25)), ratio


def test_summaries_state_and_labels():
    dom = _domain(1025)
    mech = Partitioned(dom, 4.0, ways=2, bins={"battery": 17})
    rng = np.random.default_rng(2)
    n = 40_000
    vals = 100 * rng.beta(5, 2, n)
    recs = np.stack([rng.integers(0, 2, n), rng.integers(0, 3, n),
                     np.rint(vals / 100 * 1024).astype(np.int64)], axis=1)
    c = mech.count(mech.randomize(recs, rng), mech.tensors())
    est = mech.estimate(c, ("battery",), "global")
    num = mech.summary_fields(est)["numeric"]
    assert est.factor.values.shape == (17,) and num["resolution"] == pytest.approx(6.25)
    assert num["mean"]["low"] < num["mean"]["value"] < num["mean"]["high"]
    assert abs(num["mean"]["value"] - vals.mean()) < 4 * (num["mean"]["high"] - num["mean"]["low"])
    med = num["quantiles"]["0.5"]
    assert med["low"] <= med["value"] <= med["high"] and med["low"] <= np.median(vals) <= med["high"]
    assert 0 < num["w1_bound"] <= 100 and num["w1_bound"] >= 0.75 * 6.25
    by = mech.summary_fields(mech.estimate(c, ("fw", "battery"), "consistent"))["numeric"]
    assert by["by"] == "fw" and [r["category"] for r in by["categories"]] == ["a", "b", "c"]
    assert all(r["mean"]["low"] < r["mean"]["value"] < r["mean"]["high"] for r in by["categories"])
    # no summary where it is not meaningful: a categorical marginal has none; a triple by
    # maximum entropy has none either, and the answer says so
    assert mech.summary_fields(mech.estimate(c, ("sex", "fw"), "global")) == {}
    triple = mech.estimate(c, ("sex", "fw", "battery"), "consistent")
    assert mech.summary_fields(triple) == {}
    assert any("no numeric summaries" in w for w in served_fields(triple)["warnings"])
    again = from_state(mech.state())
    assert isinstance(again, Partitioned) and again.bins == mech.bins
    assert again.domain == dom and again.cell_domain().shape == (2, 3, 17)
    assert again.offsets.tolist() == mech.offsets.tolist()


def test_simulate_numeric_columns_beside_categorical_ones(capsys):
    """``simulate --numeric age,hours-per-week --columns sex,Salary`` through partitioned:
    Adult's numbers as they are, per attribute the mean (interval), quantile and W1 errors
    against the true data; W1 under its bound."""
    from ldpstream import cli

    assert cli.main(["simulate", "--mechanism", "partitioned", "--numeric",
                     "age,hours-per-week", "--columns", "sex,Salary", "--epsilon", "4",
                     "--epsilon-scope", "record", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mechanism"] == "partitioned" and doc["estimator"] == "global"
    assert doc["epsilon_per_record"] == pytest.approx(4.0, rel=1e-9)
    for a, truth in (("age", 38.58), ("hours-per-week", 40.44)):
        d = doc["attributes"][a]
        assert d["true"]["mean"] == pytest.approx(truth, abs=0.01)
        assert pn.MIN_BINS <= d["bins"] <= pn.MAX_BINS and d["resolution"] > 0
        span = d["range"][1] - d["range"][0]
        assert d["mean_error"] < 0.05 * span and d["w1"] <= d["w1_bound"]
        assert d["w1_range"] < 0.1 and set(d["quantile_error"]) == {"q0.5", "q0.9", "q0.99"}
    # sw-hm reports numeric columns alone: a clear error, not a silent drop
    assert cli.main(["simulate", "--numeric", "age", "--columns", "sex"]) != 0
    assert "--columns: sw-hm reports numeric columns alone" in capsys.readouterr().err


def test_ways_auto_counts_a_numeric_attribute_at_its_points():
    """``ways: auto`` chooses the size with the points fixed first (for pair tables): at ε = 8
    the numeric attributes get 64 points each and the chosen tables still fit the report's 32
    bits (Adult's shape: choosing the size first, then the points, overflowed them)."""
    dom = Domain(("a", "b", "c", "x", "y"), (2, 5, 2, 1025, 1025),
                 (("0", "1"), tuple("vwxyz"), ("0", "1"), numeric_labels(0, 1, 1025),
                  numeric_labels(0, 1, 1025)), (None, None, None, (0.0, 1.0), (0.0, 1.0)))
    mech = Partitioned.from_config(dom, {"ways": "auto", "expected_reports": 32_561},
                                   epsilon=8.0, epsilon_scope="record")
    assert mech.bins == {"x": 64, "y": 64}
    assert mech.offsets[-1] < 2**32 and mech.epsilon == pytest.approx(8.0, rel=1e-9)


def test_a_marginal_with_no_group_estimated_serves_no_summary():
    """80 records at ε = 0.5: in some of 50 seeded runs no report of [battery] is estimated (the
    unbiased group's mass is not positive); its summary then carries the range and no mean
    instead of failing."""
    mech = parse_config({"collections": [{**_config()["collections"][0], "epsilon": 0.5,
                                          "params": {"ways": 2, "bins": {"battery": 9}},
                                          "marginals": [["battery"], ["fw", "battery"]]}]}
                        ).collections["c"].mechanism()
    without = 0
    for s in range(50):
        rng = np.random.default_rng(s)
        recs = np.stack([rng.integers(0, 2, 80), rng.integers(0, 3, 80),
                         rng.integers(0, 1025, 80)], axis=1)
        est = mech.estimate(mech.count(mech.randomize(recs, rng), mech.tensors()),
                            ("battery",), "unbiased")
        num = mech.summary_fields(est)["numeric"]
        assert num["min"] == 0 and num["max"] == 100
        without += "mean" not in est.extra
        assert ("mean" in num) == ("mean" in est.extra)
    assert without > 0
