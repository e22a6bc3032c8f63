"""Longitudinal privacy, the functional core: memoized (permanent) + instantaneous randomized
response as one composed channel, what it costs over time, the estimators inverting the channel
actually applied (unbiased by seeded Monte Carlo), the privacy audit of the composed channel, the
``memoize`` config block, labels → indices, and the device's SQLite ε ledger."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from scipy.stats import chisquare
from tolerance import assert_close

from ldpstream import cli
from ldpstream.config import ConfigError, parse_config
from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.castell import castell, castell_variance
from ldpstream.estimators.kernels.domain import Domain, SchemaError
from ldpstream.estimators.mechanism import from_state, histogram
from ldpstream.estimators.stream.longitudinal import Guarantee, Memoize, periods_per_window
from ldpstream.producers.ledger import Budget, Ledger, channel_fingerprint
from ldpstream.simulate.driver import build, drive, estimate_run, plan_from_args

pytestmark = [pytest.mark.core, pytest.mark.slow]

DOM = Domain.from_categories({"os": ["android", "ios", "other"], "plan": ["free", "pro"],
                              "region": ["eu", "us", "asia", "latam"]})


def brute_force_epsilon(P: np.ndarray) -> float:
    """The LDP definition: max over outputs and input pairs of ln(P[u,v] / P[u',v])."""
    return max(float(np.log(P[u, v] / P[w, v]))
               for v in range(P.shape[1]) for u, w in itertools.product(range(P.shape[0]), repeat=2))


def memoized(eps=2.0, inst=1.0, rotation=3600.0) -> RRIndependent:
    return RRIndependent(DOM, epsilon=eps, memoize=Memoize(
        rotation, None if inst is None else (inst,) * len(DOM)))


# --- the composed channel and its guarantee ------------------------------------------------------

def test_composed_channel_is_the_matrix_product_and_grr_shaped():
    mech = memoized(2.0, 1.0)
    for j, d in enumerate(DOM.shape):
        P, Q = ch.grr(2.0, d), ch.grr(1.0, d)
        assert_close(mech.permanent[j], P, rel=1e-15)
        assert_close(mech.instantaneous[j], Q, rel=1e-15)
        assert_close(mech.channels[j], P @ Q, rel=1e-15)
        # GRR ∘ GRR is GRR-shaped: keep p1·p2 + (d−1)·q1·q2, and its ε is below both
        p1, q1 = ch.grr_pq(2.0, d)
        p2, q2 = ch.grr_pq(1.0, d)
        keep = p1 * p2 + (d - 1) * q1 * q2
        assert_close(np.diag(mech.channels[j]), keep, rel=1e-15)
        assert_close(mech.channels[j].sum(axis=1), 1.0, rel=1e-15)
        assert mech.epsilons[j] == pytest.approx(np.log(keep / ((1 - keep) / (d - 1))), rel=1e-12)
        assert mech.epsilons[j] < 1.0 < 2.0


def test_declared_epsilons_are_computed_from_the_applied_channels():
    """Privacy audit: ε per report = Σ ε(P_j @ Q_j) by the LDP definition (brute force), ε per
    rotation = Σ ε(P_j), per any 24 h = (ceil(86400 / r) + 1) × that."""
    mech = memoized(2.0, 1.0, rotation=3600.0)
    per_report = sum(brute_force_epsilon(P @ Q) for P, Q in zip(mech.permanent, mech.instantaneous))
    per_rotation = sum(brute_force_epsilon(P) for P in mech.permanent)
    assert mech.epsilon == pytest.approx(per_report, rel=1e-12)
    g = mech.guarantee()
    assert g.memoized and g.rotation_s == 3600.0
    assert g.per_report == pytest.approx(per_report, rel=1e-12)
    assert g.per_rotation == pytest.approx(per_rotation, rel=1e-12) == pytest.approx(6.0)
    assert g.per_day == pytest.approx(25 * per_rotation, rel=1e-9)
    # memoized without instantaneous randomization: a report is the permanent response itself
    plain = memoized(2.0, None, rotation=None)
    assert plain.epsilon == pytest.approx(6.0, rel=1e-12)
    assert plain.guarantee().to_dict()["epsilon_per_day"] == pytest.approx(6.0)  # never rotated
    # not memoized: only the per-report ε is bounded
    fresh = RRIndependent(DOM, epsilon=2.0).guarantee()
    assert fresh == Guarantee.fresh(6.0) and fresh.per_day is None
    assert periods_per_window(86400, 86400) == 2 and periods_per_window(86400, 1e9) == 2
    assert periods_per_window(3600, 7200) == 2 and periods_per_window(7200, 3600) == 3


def test_randomize_samples_the_composed_channel():
    """χ² goodness of fit of every input value's outputs (permanent then instantaneous, as the
    device does) against the row of P @ Q."""
    mech = memoized(1.5, 1.0)
    rng = np.random.default_rng(11)
    n = 20_000
    for j, d in enumerate(DOM.shape):
        for u in range(d):
            recs = np.zeros((n, len(DOM)), dtype=np.int64)
            recs[:, j] = u
            out = mech.randomize(recs, rng)[:, j]
            obs = np.bincount(out, minlength=d)
            assert chisquare(obs, n * mech.channels[j][u]).pvalue > 1e-4, (j, u, obs)


def test_state_round_trip_keeps_the_composition():
    mech = memoized(2.0, 1.0)
    again = from_state(mech.state())
    assert isinstance(again, RRIndependent) and again.memoize == mech.memoize
    for a, b in zip(again.channels, mech.channels):
        assert_close(a, b, rel=1e-15)
    assert again.epsilon == pytest.approx(mech.epsilon, rel=1e-12)
    assert channel_fingerprint(again.permanent) == channel_fingerprint(mech.permanent)
    assert "memoize" not in RRIndependent(DOM, epsilon=1.0).state()
    with pytest.raises(ValueError, match="needs memoize"):
        RRIndependent(DOM, epsilon=1.0, instantaneous=[ch.grr(1, d) for d in DOM.shape])


# --- estimation: unbiased, and the same numbers as the offline path ------------------------------

def test_castell_on_memoized_reports_is_unbiased_monte_carlo():
    """400 seeded runs of 3,000 devices, each reporting its memoized response once through the
    instantaneous channel: the mean castell estimate of the (os, plan) joint is within 4 standard
    errors of the truth in every cell (and the mean of castell_variance matches the empirical
    variance within 25 %)."""
    mech = memoized(1.5, 2.0)
    rng = np.random.default_rng(2024)
    truth = np.array([[0.30, 0.10], [0.25, 0.15], [0.15, 0.05]])
    n, runs = 3000, 400
    cells = rng.choice(truth.size, size=n, p=truth.ravel())
    recs = np.zeros((n, len(DOM)), dtype=np.int64)
    recs[:, 0], recs[:, 1] = np.unravel_index(cells, truth.shape)
    exact = np.bincount(cells, minlength=truth.size).reshape(truth.shape) / n
    P = mech.channels_of(("os", "plan"))
    est, var = [], []
    for _ in range(runs):
        counts = mech.count(mech.randomize(recs, rng), mech.tensors([("os", "plan")]))
        c = counts["m:os|plan"].astype(float)
        est.append(castell(c, P))
        var.append(castell_variance(c, P))
    est = np.array(est)
    se = est.std(axis=0, ddof=1) / np.sqrt(runs)
    assert np.all(np.abs(est.mean(axis=0) - exact) < 4 * se), (est.mean(axis=0), exact, se)
    ratio = np.asarray(var).mean(axis=0) / est.var(axis=0, ddof=1)
    assert np.all(np.abs(ratio - 1) < 0.25), ratio


def test_estimate_equals_the_offline_path_on_the_same_reports():
    """The collection's estimate on memoized reports = castell on the composed channel = what
    ``simulate`` runs (mech.count + mech.estimate) for an rr-ind with those channels as user
    matrices, on the same reports."""
    mech = memoized(2.0, 1.0)
    rng = np.random.default_rng(3)
    reports = mech.randomize(rng.integers(0, np.array(DOM.shape), size=(5000, len(DOM))), rng)
    user = RRIndependent(DOM, channels=mech.channels)
    assert user.epsilon == pytest.approx(mech.epsilon, rel=1e-12)
    for attrs in (("os", "plan"), ("plan", "region"), ("os", "plan", "region")):
        counts = mech.count(reports, mech.tensors([attrs]))
        for method in ("castell", "truncated", "ibu"):
            a = mech.estimate(counts, attrs, method)
            b = user.estimate(user.count(reports, user.tensors([attrs])), attrs, method)
            assert_close(a.factor.values, b.factor.values, rel=1e-12)
            assert a.epsilon == pytest.approx(mech.epsilon, rel=1e-12)
        table = counts[f"m:{'|'.join(attrs)}"].astype(float)
        assert_close(mech.estimate(counts, attrs, "castell").factor.values,
                     castell(table, mech.channels_of(attrs)), rel=1e-12)


# --- config ---------------------------------------------------------------------------------------

def _config(**extra):
    coll = {"id": "t", "schema": {"attributes": {"a": ["x", "y", "z"], "b": ["u", "v"]}},
            "epsilon": 2, "marginals": [["a", "b"]]}
    coll.update(extra)
    return {"collections": [coll]}


def test_config_memoize_parameter():
    def mech(memoize, **extra):
        return parse_config(_config(params={"memoize": memoize}, **extra)
                            ).collections["t"].mechanism()

    m1 = mech({"rotation_s": 600, "instantaneous_epsilon": 1})
    assert m1.memoize == Memoize(600.0, (1.0, 1.0))
    assert m1.guarantee().per_rotation == pytest.approx(4.0)
    m2 = mech({"instantaneous_epsilon": 1}, epsilon_scope="record")
    assert m2.memoize == Memoize(86400.0, (0.5, 0.5))  # defaults: daily rotation; record scope
    assert m2.guarantee().per_rotation == pytest.approx(2.0)
    never = mech({"rotation_s": None})
    assert never.memoize == Memoize(None, None) and never.epsilon == pytest.approx(4.0)
    with pytest.raises(ConfigError, match=r"collections\[0\]\.params\.memoize\.rotation_s: "
                                          r"must be > 0 \(got 0\)"):
        mech({"rotation_s": 0})
    with pytest.raises(ConfigError, match=r"params\.memoize\.every: unknown parameter for "
                                          r"memoize \(allowed: rotation_s, instantaneous_epsilon\)"):
        mech({"every": 3})
    with pytest.raises(ConfigError, match=r"params\.memoize: must be a mapping"):
        mech(600)
    with pytest.raises(ConfigError, match=r"params\.memoize: unknown parameter for rs-fd"):
        mech({"rotation_s": 60}, mechanism="rs-fd")   # its fake columns must stay fresh


# --- labels → indices ---------------------------------------------------------------------------

def test_encode_labels_with_clear_errors():
    rows = [{"os": "ios", "plan": "pro", "region": "asia"},
            {"region": "eu", "plan": "free", "os": "android"}]
    np.testing.assert_array_equal(DOM.encode(rows), [[1, 1, 2], [0, 0, 0]])
    cols = {"os": ["other", "ios"], "plan": ["pro", "pro"], "region": ["latam", "us"]}
    np.testing.assert_array_equal(DOM.encode(cols), [[2, 1, 3], [1, 1, 1]])
    with pytest.raises(SchemaError, match=r"record 1: attribute 'os' has unknown category 'mac' "
                                          r"\(allowed: 'android', 'ios', 'other'\)") as exc:
        DOM.encode([rows[0], {"os": "mac", "plan": "pro", "region": "eu"}])
    assert exc.value.attribute == "os"
    with pytest.raises(SchemaError, match=r"record 0: unknown attribute 'browser' \(attributes: "
                                          r"os, plan, region\)"):
        DOM.encode([{**rows[0], "browser": "x"}])
    with pytest.raises(SchemaError, match="record 0: missing attribute 'plan'"):
        DOM.encode([{"os": "ios", "region": "eu"}])
    with pytest.raises(SchemaError, match="columns: missing attribute 'region'"):
        DOM.encode({"os": ["ios"], "plan": ["pro"]})
    with pytest.raises(SchemaError, match="expected a mapping"):
        DOM.encode([["ios", "pro", "eu"]])
    nums = Domain.from_categories({"n": ["1", "2"], "m": ["a", "b"]})
    np.testing.assert_array_equal(nums.encode([{"n": 2, "m": "a"}]), [[1, 0]])
    assert DOM.encode([]).shape == (0, 3)


# --- the ledger -------------------------------------------------------------------------------

def test_ledger_budget_window_and_restart(tmp_path):
    path = tmp_path / "ledger.sqlite"
    with Ledger(path, budget=Budget(5.0, window_s=100.0)) as led:
        assert led.refusal(5.0, now=1000.0) is None
        led.commit("c", 1000.0, 3.0)
        led.commit("c", 1050.0, 2.0, channel="f", period=7, memos={(0, 2): 1, (1, 0): 0},
                   record="f:2,0")
        assert led.spent(1050.0, 100.0) == pytest.approx(5.0)
        reason = led.refusal(0.5, now=1099.0)
        assert reason is not None and "budget exceeded" in reason and "5 already spent" in reason
        assert led.refusal(0.0, now=1099.0) is None  # memoized re-reports cost nothing
        assert led.refusal(3.0, now=1100.0) is None  # the first spend left the window
    with Ledger(path, budget=Budget(5.0, window_s=100.0)) as led:  # a restart keeps everything
        assert led.spent(1050.0, 100.0) == pytest.approx(5.0) and led.spent(0) == pytest.approx(5.0)
        assert led.refusal(0.5, now=1099.0) is not None
        assert led.memos("c", "f", 7, [(0, 2), (1, 0), (1, 1)]) == {(0, 2): 1, (1, 0): 0}
        assert led.memos("c", "f", 8, [(0, 2)]) == {} and led.memos("c", "g", 7, [(0, 2)]) == {}
        assert led.last_sent("c", 7, "f:2,0") == 1050.0 and led.last_sent("c", 7, "f:0,0") is None
        led.commit("c", 1200.0, 0.0, channel="f", period=8, record="f:2,0")
        assert led.last_sent("c", 7, "f:2,0") is None  # past periods are dropped
        assert led.memos("c", "f", 7, [(0, 2)]) == {} and led.last_sent("c", 8, "f:2,0") == 1200.0
    with pytest.raises(ValueError, match="Budget.epsilon"):
        Budget(0.0)


def test_docs_example_collection_states_its_guarantee():
    """docs/devices.md: the copy-paste schema parses and its table's numbers are the computed
    ones."""
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).resolve().parents[1] / "docs" / "devices.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    mech = parse_config(yaml.safe_load(block)).collections["app-usage"].mechanism()
    g = mech.guarantee().to_dict()
    assert round(g["epsilon_per_report"], 2) == 2.11 and "= 2.11 (`epsilon_per_report`)" in text
    assert g["epsilon_per_rotation"] == pytest.approx(3.0) and g["epsilon_per_day"] == pytest.approx(6.0)
    assert [round(e, 2) for e in mech.epsilons] == [0.69, 0.74, 0.69]


def test_collections_api_states_the_guarantee():
    from ldpstream.agents.serve.web import collection_info

    coll = parse_config(_config(params={"memoize": {"rotation_s": 3600,
                                                    "instantaneous_epsilon": 1}})
                        ).collections["t"]
    mech = coll.mechanism()
    info = collection_info(coll, mech, 0)["longitudinal"]
    assert info == mech.guarantee().to_dict()
    assert info["memoized"] and info["rotation_s"] == 3600.0
    assert info["epsilon_per_rotation"] == pytest.approx(4.0)
    assert info["epsilon_per_day"] == pytest.approx(25 * 4.0)
    assert info["epsilon_per_report"] == pytest.approx(mech.epsilon)
    fresh = parse_config(_config()).collections["t"]
    info = collection_info(fresh, fresh.mechanism(), 0)["longitudinal"]
    assert not info["memoized"] and info["epsilon_per_day"] is None


# --- simulate with memoize ------------------------------------------------------------------------

def test_simulate_with_memoize_is_unbiased_and_states_the_guarantee(capsys):
    """``ldpstream simulate --param memoize=...`` builds the composed channel: its JSON states
    the guarantee the collection states (ε per report, rotation, day), and over 200 seeded runs
    on one dataset (3 attributes × 3 categories, n = 4,000) the mean castell estimate of every
    2-way marginal is within 4 standard errors of the dataset's own marginal in every cell."""
    argv = ["simulate", "--mechanism", "rr-ind", "--epsilon", "1.5", "--param",
            "memoize={rotation_s: 3600, instantaneous_epsilon: 2.0}",
            "--generator", "corr:m=3,d=3,rho=0.6,n=4000", "--ways", "2", "--runs", "2"]
    assert cli.main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    plan = plan_from_args(cli.build_parser().parse_args(argv))
    mech = build(plan)
    assert mech.memoize == Memoize(3600.0, (2.0, 2.0, 2.0))
    g = mech.guarantee()
    assert doc["longitudinal"] == pytest.approx(g.to_dict())
    assert doc["epsilon_per_record"] == pytest.approx(g.per_report, rel=1e-12)
    assert g.per_rotation == pytest.approx(4.5, rel=1e-12)
    assert g.per_day == pytest.approx(25 * 4.5, rel=1e-9)
    assert g.per_report == pytest.approx(sum(brute_force_epsilon(P @ Q) for P, Q in
                                             zip(mech.permanent, mech.instantaneous)), rel=1e-12)

    ds = plan.dataset
    marginals = [tuple(ds.domain.attrs[i] for i in ij) for ij in ((0, 1), (0, 2), (1, 2))]
    truth = {a: histogram(ds.records, ds.domain.axes(a), ds.domain.project(a).shape) / ds.n
             for a in marginals}
    runs = 200
    est = {a: [] for a in marginals}
    for r in range(runs):
        run = drive(mech, ds.records, np.random.default_rng([5, r]), marginals)
        for a in marginals:
            est[a].append(estimate_run(run, a, "castell", {}).factor.values)
    for a in marginals:
        e = np.array(est[a])
        se = e.std(axis=0, ddof=1) / np.sqrt(runs)
        assert np.all(np.abs(e.mean(axis=0) - truth[a]) < 4 * se), (a, e.mean(axis=0), truth[a])
