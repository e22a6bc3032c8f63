"""The ``partitioned`` mechanism: privacy audit from the exact channel, unbiased per-marginal
estimates (seeded Monte Carlo), consistency (agreement to 1e-9, never worse than the raw
estimate on a seeded benchmark), maximum entropy, layout, state and config parameters."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from tolerance import assert_close, close

from ldpstream.agents.ingest.intake import count_reports
from ldpstream.bn import read_bif, survey_path
from ldpstream.estimators.families.partitioned import (
    Partitioned,
    assign_by_device,
    auto_candidates,
    choose_per_report,
    choose_ways,
    tensor_key,
)
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.consistency import (
    disagreement,
    independence,
    make_consistent,
    max_entropy,
    shrink_hierarchical,
    shrink_to_independence,
)
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.metrics import tvd
from ldpstream.estimators.mechanism import ParamError, from_state, histogram, mechanism_class

pytestmark = [pytest.mark.core, pytest.mark.slow]

DOM = Domain(("a", "b", "c"), (2, 3, 2))


def _records(dom: Domain, n: int, seed: int) -> np.ndarray:
    """A dependent dataset: b copies a half the time, c copies b mod 2 half the time."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, dom.shape[0], n)
    b = np.where(rng.random(n) < 0.5, a % dom.shape[1], rng.integers(0, dom.shape[1], n))
    c = np.where(rng.random(n) < 0.5, b % dom.shape[2], rng.integers(0, dom.shape[2], n))
    return np.stack([a, b, c], axis=1)


def _truth(records, dom, attrs):
    cols = dom.axes(attrs)
    t = histogram(records, cols, [dom.shape[c] for c in cols]).astype(float)
    return t / t.sum()


def _channel(mech: Partitioned) -> np.ndarray:
    """P[record (C order over the domain), report (codes of the slots, C order)]: the mean over
    the first marginal k of the product of slot s's oracle channel for marginal k+s."""
    recs = np.array(list(itertools.product(*[range(d) for d in mech.domain.shape])))
    K, T = len(mech.marginals), int(mech.offsets[-1])
    block = []
    for j, (cols, shape, o) in enumerate(zip(mech._cols, mech._shapes, mech.oracles)):
        x = np.ravel_multi_index(tuple(recs[:, c] for c in cols), shape)
        b = np.zeros((len(recs), T))
        b[:, mech.offsets[j]:mech.offsets[j + 1]] = o.channel()[x]
        block.append(b)
    P = np.zeros((len(recs), T ** mech.per_report))
    for k in range(K):
        term = np.ones((len(recs), 1))
        for s in range(mech.per_report):
            term = (term[:, :, None] * block[(k + s) % K][:, None, :]).reshape(len(recs), -1)
        P += term / K
    return P


@pytest.mark.parametrize("oracles,per_report", [(("grr",), 1), (("olh",), 1),
                                               (("grr", "olh"), 1), (("grr",), 2)])
@pytest.mark.parametrize("eps", [0.7, 3.0])
def test_privacy_audit_epsilon_is_the_channels(oracles, per_report, eps):
    mech = Partitioned(DOM, eps, ways=2, oracles=oracles, per_report=per_report)
    P = _channel(mech)
    assert_close(P.sum(axis=1), 1.0, rel=1e-12)
    assert mech.epsilon == pytest.approx(ch.epsilon(P), rel=1e-9)
    assert mech.epsilon == pytest.approx(eps, rel=1e-9)
    # sampled reports of one record follow its row of the channel
    rng = np.random.default_rng(3)
    n = 60_000
    for r in (0, len(P) - 1):
        rec = np.array(np.unravel_index(r, DOM.shape))[None, :].repeat(n, axis=0)
        rep = mech.randomize(rec, rng).astype(np.int64)
        assert rep.shape == (n, per_report) and np.all(rep < mech.report_bounds())
        T = int(mech.offsets[-1])
        codes = rep @ (T ** np.arange(per_report)[::-1])
        freq = np.bincount(codes, minlength=P.shape[1]) / n
        sd = np.sqrt(P[r] * (1 - P[r]) / n)
        assert np.all(np.abs(freq - P[r]) <= 5 * sd + 1e-12)


@pytest.mark.parametrize("oracles,per_report", [(("grr",), 1), (("olh",), 1), (("grr",), 2)])
def test_per_marginal_estimate_is_unbiased_by_seeded_monte_carlo(oracles, per_report):
    """R = 200 runs on one fixed dataset: every cell of every collected marginal's unbiased
    estimate within 4 empirical standard errors of the truth; the empirical variance within
    30% of the stated cell variance (oracle noise + which users report the marginal)."""
    recs = _records(DOM, 3000, 1)
    mech = Partitioned(DOM, 1.0, ways=2, oracles=oracles, per_report=per_report)
    rng = np.random.default_rng(5)
    R = 200
    ests = {m: [] for m in mech.marginals}
    cellvar = {m: [] for m in mech.marginals}
    for _ in range(R):
        c = mech.count(mech.randomize(recs, rng), mech.tensors())
        for j, m in enumerate(mech.marginals):
            f, var, _ = mech.unbiased(c, j)
            ests[m].append(f.values)
            cellvar[m].append(var)
    for m in mech.marginals:
        e = np.stack(ests[m])
        truth = _truth(recs, DOM, m)
        se = e.std(axis=0, ddof=1) / np.sqrt(R)
        assert np.all(np.abs(e.mean(axis=0) - truth) <= 4 * se), m
        ratio = e.var(axis=0, ddof=1).mean() / np.mean(cellvar[m])
        assert 0.7 < ratio < 1.3, (m, ratio)
        # the closed-form per-cell variance (what the drift test uses) of the last run
        closed = mech.analytic_variance(c, m, "unbiased")
        ratio = e.var(axis=0, ddof=1).mean() / closed.mean()
        assert closed.shape == truth.shape and 0.7 < ratio < 1.3, (m, ratio)


def test_cell_variance_includes_the_oracle_f_term_on_a_large_table_at_large_epsilon():
    """A 144-cell GRR table at ε = 6: the oracle's f-dependent term is about a fifth of the
    cell variance. The stated variance (used for the consistency weights and the shrinkage's
    σ²) matches the empirical one within 10% over R = 200 runs; the f-free oracle term plus
    the user sampling alone would fall short of it by more than 10%. Fifteen pairs, so that
    the finite-population correction of the sampling term (14/15) stays small."""
    dom = Domain(("a", "b", "c", "d", "e", "f"), (12, 12, 2, 2, 2, 2))
    rng = np.random.default_rng(3)
    recs = np.concatenate([_records(Domain(("a", "b", "c"), (12, 12, 2)), 30_000, 3),
                           rng.integers(0, 2, (30_000, 3))], axis=1)
    mech = Partitioned(dom, 6.0, ways=2, oracles=("grr",))
    j = mech.marginals.index(("a", "b"))
    rng = np.random.default_rng(7)
    ests, stated, without = [], [], []
    for _ in range(200):
        c = mech.count(mech.randomize(recs, rng), mech.tensors())
        f, var, n = mech.unbiased(c, j)
        noise = float(mech.oracles[j].variance(n)[0])   # the oracle's f-free term alone
        ests.append(f.values)
        stated.append(var)
        p = np.clip(f.values.ravel(), 0, None)
        p = p / p.sum()
        without.append(noise + (1.0 - float(np.sum(p * p))) / (p.size * n))
    emp = np.stack(ests).var(axis=0, ddof=1).mean()
    assert 0.9 < emp / np.mean(stated) < 1.1, emp / np.mean(stated)
    assert emp / np.mean(without) > 1.1, emp / np.mean(without)


@pytest.mark.parametrize("ways", [2, 3])
@pytest.mark.parametrize("method", ["calm", "consistent"])
def test_consistency_agreement_to_1e9(ways, method):
    dom = Domain(("a", "b", "c", "d"), (3, 2, 4, 2))
    rng = np.random.default_rng(2)
    recs = np.stack([rng.integers(0, d, 4000) for d in dom.shape], axis=1)
    mech = Partitioned(dom, 0.5, ways=ways)
    counts = mech.count(mech.randomize(recs, rng), mech.tensors())
    tables, _, _ = mech.consistent_tables(counts, shrink=method == "consistent")
    assert disagreement(tables) <= 1e-9
    raw = [mech.unbiased(counts, j)[0] for j in range(len(mech.marginals))]
    assert disagreement(raw) > 1e-3          # the raw tables did disagree
    # the served sub-marginals agree whichever collected table they come from
    one = [t.project(("a",)).values for t in tables if "a" in t.domain.attrs]
    assert max(float(np.abs(o - one[0]).max()) for o in one) <= 1e-9
    est = mech.estimate(counts, ("a",), method)
    assert_close(est.factor.values, one[0], rel=1e-12)


def test_consistent_never_worse_than_raw_on_a_seeded_benchmark():
    """Bayesian-network sample (6 attributes, n = 20,000), every pair, 8 seeds, ε ∈ {1, 4}:
    mean TVD of calm and consistent ≤ that of norm-sub ≤ that of the unbiased estimate."""
    bn = read_bif(survey_path())
    recs = bn.sample(20_000, np.random.default_rng(0))
    pairs = list(itertools.combinations(bn.domain.attrs, 2))
    truth = {p: _truth(recs, bn.domain, p) for p in pairs}
    for eps in (1.0, 4.0):
        mech = Partitioned(bn.domain, eps)
        err = {m: [] for m in mech.estimators}
        for seed in range(8):
            c = mech.count(mech.randomize(recs, np.random.default_rng([seed, 9])),
                           mech.tensors())
            for m in mech.estimators:
                err[m].append(np.mean([tvd(mech.estimate(c, p, m).factor.values, truth[p])
                                       for p in pairs]))
        mean = {m: float(np.mean(v)) for m, v in err.items()}
        assert mean["calm"] <= mean["norm-sub"] <= mean["unbiased"], (eps, mean)
        assert mean["consistent"] <= mean["norm-sub"], (eps, mean)


def test_make_consistent_weights_by_inverse_variance():
    dom = Domain(("a", "b", "c"), (2, 2, 2))
    t1 = Factor(dom.project(("a", "b")), np.array([[0.4, 0.1], [0.3, 0.2]]))   # a: .5 .5
    t2 = Factor(dom.project(("a", "c")), np.array([[0.6, 0.1], [0.2, 0.1]]))   # a: .7 .3
    out = make_consistent([t1, t2], [1.0, 3.0])
    # var of a-projection: 2·1 and 2·3 → weights 3/4, 1/4 → a = (.55, .45)
    for t in out:
        assert_close(t.project(("a",)).values, [0.55, 0.45], rel=1e-15)
    np.testing.assert_allclose(out[0].values.sum(), 1.0)


def test_max_entropy_from_consistent_pairs_is_the_markov_chain():
    dom = Domain(("a", "b", "c"), (2, 3, 2))
    recs = _records(dom, 50_000, 4)
    p = _truth(recs, dom, ("a", "b", "c"))
    ab = Factor(dom.project(("a", "b")), p.sum(axis=2))
    bc = Factor(dom.project(("b", "c")), p.sum(axis=0))
    r = max_entropy(dom, [ab, bc], tol=1e-12, max_iter=1000)
    assert r.converged
    b = p.sum(axis=(0, 2))
    expect = ab.values[:, :, None] * bc.values[None, :, :] / b[None, :, None]
    assert_close(r.table.values, expect, rel=1e-10)


def test_shrinkage_keeps_one_way_marginals_and_never_expands():
    rng = np.random.default_rng(0)
    x = rng.normal(0.05, 0.02, (4, 5))
    y, lam = shrink_to_independence(x, 1e-4)
    assert 0.0 <= lam <= 1.0
    assert_close(y.sum(axis=0), x.sum(axis=0), rel=1e-14)
    assert_close(y.sum(axis=1), x.sum(axis=1), rel=1e-14)
    assert shrink_to_independence(np.array([[0.3, 0.2], [0.1, 0.4]]), 1.0)[1] == 1.0  # p−r−2 < 0


def test_shrinkage_also_removes_the_user_sampling_at_large_epsilon():
    """At ε = 50 the oracles add no noise; what is left is the sampling of which users report a
    marginal (each sees n/K of them). The target is the population's marginal, so that sampling
    is noise to shrink too: on independent data ``consistent`` beats ``calm`` clearly (with the
    oracle noise alone as σ², λ would be 1 and both equal)."""
    dom = Domain(("a", "b", "c"), (4, 4, 4))
    rng = np.random.default_rng(7)
    rec = rng.integers(0, 4, (3000, 3))
    truth = {p: _truth(rec, dom, p) for p in itertools.combinations(dom.attrs, 2)}
    mech = Partitioned(dom, 50.0, ways=2)
    err = {m: [] for m in ("consistent", "calm")}
    for seed in range(5):
        counts = mech.count(mech.randomize(rec, np.random.default_rng([seed, 1])),
                            mech.tensors())
        for m in err:
            err[m] += [tvd(mech.estimate(counts, p, m).factor.values, t)
                       for p, t in truth.items()]
    assert np.mean(err["consistent"]) < 0.8 * np.mean(err["calm"])


def test_three_way_from_pairs_by_maximum_entropy():
    recs = _records(DOM, 20_000, 6)
    mech = Partitioned(DOM, 8.0, ways=2)
    c = mech.count(mech.randomize(recs, np.random.default_rng(1)), mech.tensors())
    est = mech.estimate(c, ("a", "b", "c"), "consistent")
    assert est.factor.domain.attrs == ("a", "b", "c")
    assert est.factor.values.sum() == pytest.approx(1.0, rel=1e-6)
    assert est.error_bound == pytest.approx(1.0) and est.iterations >= 1   # no table holds it
    assert sorted(est.extra["fitted_from"]) == ["a|b", "a|c", "b|c"]
    assert tvd(est.factor.values, _truth(recs, DOM, ("a", "b", "c"))) < 0.08
    assert mech.check_marginal(("a", "b", "c"), "unbiased") is not None
    with pytest.raises(ValueError, match="use consistent"):
        mech.estimate(c, ("a", "b", "c"), "norm-sub")


def test_layout_count_and_ingest_fast_path():
    mech = Partitioned(DOM, 2.0, ways=2)
    assert mech.report_width == 1
    rep = mech.randomize(_records(DOM, 5000, 0), np.random.default_rng(0))
    assert rep.shape == (5000, 1) and rep.dtype.kind == "u"
    specs = mech.tensors([("a", "b")])
    assert [s.key for s in specs] == [tensor_key(m) for m in mech.marginals]
    counts = mech.count(rep, specs)
    assert sum(int(counts[s.key][-1]) for s in specs) == 5000
    with pytest.raises(ValueError, match="report codes must lie in"):
        mech.count(np.array([[int(mech.offsets[-1])]]), specs)
    got = count_reports(mech, rep, specs)
    for s in specs:
        np.testing.assert_array_equal(got[s.key], counts[s.key])
        assert counts[s.key].shape == s.shape


def test_state_round_trip_and_device_assignment():
    mech = Partitioned(DOM, 1.5, marginals=[["b", "a"], ["c", "b"]], assign_seed=7, version=3)
    assert mech.marginals == [("a", "b"), ("b", "c")]
    back = from_state(mech.state())
    assert back.state() == mech.state() and back.version == 3
    recs = _records(DOM, 100, 0)
    np.testing.assert_array_equal(back.randomize(recs, np.random.default_rng(1)),
                                  mech.randomize(recs, np.random.default_rng(1)))
    ids = np.arange(20_000, dtype=np.uint64)
    k = assign_by_device(ids, 2, 7)
    np.testing.assert_array_equal(k, assign_by_device(ids, 2, 7))
    assert abs(k.mean() - 0.5) < 0.02
    rep = mech.randomize_device(recs, ids[:100], np.random.default_rng(0))
    block = np.searchsorted(mech.offsets, rep[:, 0].astype(np.int64), side="right") - 1
    np.testing.assert_array_equal(block, k[:100])


def test_from_config_params():
    cls = mechanism_class("partitioned")
    m = cls.from_config(DOM, {"ways": 2}, epsilon=0.5, epsilon_scope="attribute")
    assert m.target_epsilon == pytest.approx(1.5)          # record budget: m·ε
    m = cls.from_config(DOM, {"marginals": [["a", "c"]], "oracles": ["grr"]}, epsilon=2.0,
                        epsilon_scope="record")
    assert m.marginals == [("a", "c")] and m.epsilon == pytest.approx(2.0)
    m = cls.from_config(DOM, {"per_report": 3}, epsilon=3.0, epsilon_scope="record")
    assert m.report_width == 3 and m.epsilon == pytest.approx(3.0)
    assert all(o.eps == pytest.approx(1.0) for o in m.oracles)
    for params, field in (({"ways": 9}, "ways"), ({"marginals": [["a", "zz"]]}, "marginals"),
                          ({"oracles": ["oue"]}, "oracles"), ({"bogus": 1}, "bogus"),
                          ({"marginals": [["a", "b"]], "ways": 2}, "ways"),
                          ({"per_report": 4}, "per_report"), ({"per_report": "x"}, "per_report"),
                          ({"per_report": True}, "per_report")):
        with pytest.raises(ParamError) as exc:
            cls.from_config(DOM, params, epsilon=1.0)
        assert exc.value.field == field


def test_hierarchical_shrinkage_limits():
    """σ² = 0 keeps every table; an enormous σ² takes pairs to independence and a triple to
    the max-ent table of its (independent) pairs — the product of its 1-way marginals — and
    keeps every 1-way marginal either way."""
    dom = Domain(("a", "b", "c", "d"), (2, 3, 2, 3))
    rng = np.random.default_rng(5)
    tabs = []
    for attrs in itertools.combinations(dom.attrs, 3):
        t = Factor(dom.project(attrs), rng.random(dom.project(attrs).shape))
        tabs.append(t.normalize())
    tabs = make_consistent(tabs, [1.0] * len(tabs))
    same = shrink_hierarchical(tabs, [0.0] * len(tabs))
    assert all(close(v, t.values, rel=1e-12) for v, t in zip(same, tabs))
    flat = shrink_hierarchical(tabs, [1e6] * len(tabs))
    for v, t in zip(flat, tabs):
        assert close(v, independence(t.values), rel=1e-6)
        for ax in range(3):
            other = tuple(i for i in range(3) if i != ax)
            assert close(v.sum(axis=other), t.values.sum(axis=other), rel=1e-12)


#: (attribute sizes, n) of the bench's datasets: Adult's 8 columns, the network's 6
ADULT_SHAPE, ADULT_N = (9, 16, 7, 15, 6, 5, 2, 2), 32_561
NETWORK_SHAPE, NETWORK_N = (3, 2, 2, 2, 2, 3), 50_000


def test_ways_auto_rule_on_the_bench_shapes():
    eps = (0.5, 1.0, 2.0, 4.0, 8.0)
    assert [choose_ways(ADULT_SHAPE, ADULT_N, e) for e in eps] == [2, 2, 2, 2, 3]
    # at ε = 8 the network's reports carry 5 of its 6 attributes (predicted 0.0051 against
    # 0.0064 for 4; the whole record, 0.0042, is not 20 % below that)
    assert [choose_ways(NETWORK_SHAPE, NETWORK_N, e) for e in eps] == [2, 2, 2, 3, 5]
    # without the margin the network's triples win at ε = 0.5 and 2 (predicted 2 % and 5 %
    # lower), not at ε = 1 (8.6 % higher); at ε = 8 the whole record
    assert [choose_ways(NETWORK_SHAPE, NETWORK_N, e, margin=0.0) for e in eps] == \
        [3, 2, 3, 4, 6]
    assert choose_ways(NETWORK_SHAPE, NETWORK_N, 8.0, candidates=(2, 3)) == 3
    assert choose_ways((3, 4), 1000, 1.0) == 2 and choose_ways((3,), 1000, 1.0) == 1


def test_ways_auto_candidates_go_up_to_the_whole_record_within_the_cell_cap():
    """Every size from 2 to m whose C(m, k) tables hold at most AUTO_MAX_CELLS cells, number at
    most the SDKs' step limit, and whose report codes fit in 32 bits: Adult stops at triples
    (its 4-way tables hold 1.1 M cells); a 7-attribute network of 5–6 values skips its 6-way
    tables (their OLH codes overflow)."""
    assert auto_candidates(NETWORK_SHAPE, 8.0) == [2, 3, 4, 5, 6]
    assert auto_candidates(ADULT_SHAPE, 8.0) == [2, 3]
    # without the cap: not 4 either (C(8, 4) = 70 tables, over the SDKs' 64 steps)
    assert auto_candidates(ADULT_SHAPE, 8.0, max_cells=10**9) == [2, 3, 8]
    assert auto_candidates((5, 5, 5, 6, 5, 5, 3), 8.0, max_cells=10**9) == [2, 3, 4, 5, 7]
    # at ε = 8 the generated networks' reports carry 4 attributes; at ε ≤ 4 pairs
    for shape in ((5, 3, 5, 3, 2, 2, 5), (3, 2, 5, 4, 6, 3, 6), (5, 5, 5, 6, 5, 5, 3)):
        assert choose_ways(shape, 50_000, 8.0) == 4
        assert all(choose_ways(shape, 50_000, e) == 2 for e in (0.5, 1.0, 2.0, 4.0))


def test_ways_auto_chooses_marginals_per_report_on_small_tables_at_large_epsilon():
    """The bundled network (small tables) collecting triples at ε = 8: two per report
    (measured 6 % lower TVD than one); its generated 7-attribute siblings with 2–6 values keep
    one; small ε keeps one; ``ways: auto`` at ε = 8 reports 5 attributes, one table per report
    (two would predict 0.0067 against 0.0051); an explicit per_report is kept."""
    assert choose_per_report(NETWORK_SHAPE, NETWORK_N, 8.0, 3) == 2
    assert choose_per_report((5, 3, 5, 3, 2, 2, 5), 50_000, 8.0, 3) == 1
    assert all(choose_per_report(NETWORK_SHAPE, NETWORK_N, e, 2) == 1 for e in (0.5, 1.0, 2.0))
    cls = mechanism_class("partitioned")
    m = cls.from_config(Domain(list("abcdef"), NETWORK_SHAPE),
                        {"ways": "auto", "expected_reports": NETWORK_N}, epsilon=8.0,
                        epsilon_scope="record")
    assert (m.ways, m.per_report) == (5, 1) and m.epsilon == pytest.approx(8.0)
    m = cls.from_config(Domain(list("abcdef"), NETWORK_SHAPE),
                        {"ways": "auto", "expected_reports": NETWORK_N, "per_report": 1},
                        epsilon=8.0, epsilon_scope="record")
    assert m.per_report == 1


def test_ways_auto_from_config():
    cls = mechanism_class("partitioned")
    m = cls.from_config(DOM, {"ways": "auto", "expected_reports": 10_000}, epsilon=1.0,
                        epsilon_scope="record")
    assert m.ways == choose_ways(DOM.shape, 10_000, 1.0) == 2
    assert m.marginals == list(itertools.combinations(DOM.attrs, 2))
    assert m.state()["ways_auto"] == {"expected_reports": 10_000, "ways": 2, "per_report": 1}
    assert from_state(m.state()).marginals == m.marginals
    for params in ({"ways": "auto"}, {"ways": "auto", "expected_reports": 0},
                   {"ways": "auto", "expected_reports": "many"},
                   {"ways": "auto", "expected_reports": 1.5}, {"expected_reports": 100},
                   {"ways": 2, "expected_reports": 100}):
        with pytest.raises(ParamError) as exc:
            cls.from_config(DOM, params, epsilon=1.0)
        assert exc.value.field == "expected_reports", params
    with pytest.raises(ParamError) as exc:
        cls.from_config(DOM, {"ways": "automatic", "expected_reports": 100}, epsilon=1.0)
    assert exc.value.field == "ways"
    with pytest.raises(ValueError, match="expected_reports"):
        Partitioned(DOM, 1.0, ways="auto")


def test_drift_uses_the_closed_form_variance():
    from ldpstream.estimators.stream.drift import cell_variance, null_variances
    recs = _records(DOM, 4000, 2)
    mech = Partitioned(DOM, 2.0, ways=2)
    c1 = mech.count(mech.randomize(recs, np.random.default_rng(1)), mech.tensors())
    c2 = mech.count(mech.randomize(recs[:3000], np.random.default_rng(2)), mech.tensors())
    for attrs, method in ((("a", "b"), "consistent"), (("b",), "calm"),
                          (("a", "b", "c"), "consistent")):
        est = mech.estimate(c1, attrs, method)
        own = cell_variance(mech, {0: c1}, attrs, method, est)
        np.testing.assert_allclose(own, mech.analytic_variance(c1, attrs, method))
        assert own.shape == est.factor.values.shape and np.all(own >= 0) and own.sum() > 0
        pooled = {k: c1[k] + c2[k] for k in c1}
        v_cur, v_prev = null_variances(mech, {0: c1}, {0: c2}, attrs, method)
        closed = mech.analytic_variance(pooled, attrs, method)
        n1, n2 = (sum(int(round(float(c[k].sum()))) for k in c) for c in (c1, c2))
        np.testing.assert_allclose(v_cur, closed * (n1 + n2) / n1)
        np.testing.assert_allclose(v_prev, closed * (n1 + n2) / n2)


def test_ways_auto_keeps_the_tables_within_the_device_sdks_step_limit():
    """Ten binary attributes at ε = 8: 7-way tables would predict the lowest error, but there
    are C(10, 7) = 120 of them and the device SDKs run at most MAX_STEPS (64) tables; auto
    picks a size whose program every SDK accepts."""
    from ldpstream.estimators.kernels.device_program import MAX_STEPS
    from ldpstream.producers.program import Program
    dom = Domain([f"a{i}" for i in range(10)], [2] * 10)
    assert 7 not in auto_candidates(dom.shape, 8.0)
    k = choose_ways(dom.shape, 50_000, 8.0)
    mech = Partitioned(dom, 8.0, ways=k)
    assert k > 2 and len(mech.marginals) <= MAX_STEPS
    Program(mech.device_program())   # accepted


def test_a_marginal_no_table_holds_serves_the_bound_that_always_holds():
    """A triple from collected pairs (maximum entropy, or the global fit's projection) has no
    unbiased estimate to bound it by: it serves the 95 % bound that always holds (TVD ≤ 1 for a
    distribution), labelled ``at least``, never a null bound."""
    from ldpstream.estimators.kernels.bounds import AT_LEAST
    from ldpstream.estimators.kernels.serving import served_fields
    mech = Partitioned(DOM, 2.0, ways=2)
    counts = mech.count(mech.randomize(_records(DOM, 5000, 0), np.random.default_rng(0)),
                        mech.tensors())
    for method in ("consistent", "calm", "global"):
        s = served_fields(mech.estimate(counts, DOM.attrs, method))
        assert s["error_bound_quantile"] == 0.95 and s["error_bound_coverage"] == AT_LEAST
        assert s["error_bound"] == pytest.approx(1.0, rel=1e-9), method
