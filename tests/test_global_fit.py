"""The global fit of one distribution to every measured marginal, stopped by SURE
(estimators/kernels/global_fit.py, docs/partitioned.md "Global fit")."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from ldpstream.bngen import shape_network
from ldpstream.estimators.families.partitioned import Partitioned
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.global_fit import (
    MAX_CELLS,
    Noise,
    global_fit,
    query_sets,
    query_sure,
    sure,
)
from ldpstream.estimators.kernels.metrics import tvd
from tests.tolerance import assert_close

pytestmark = pytest.mark.core

DOM = Domain(("a", "b", "c"), (3, 2, 4))


def _truth(seed: int = 0) -> Factor:
    rng = np.random.default_rng(seed)
    return Factor(DOM, rng.dirichlet(np.full(DOM.size(), 0.7)).reshape(DOM.shape))


def test_exact_marginals_are_met():
    """Noise-free pairs of a distribution, with a tiny variance: the kept iterate reproduces
    every pair (the fit runs to the noise level; 1e-3 of the largest cell)."""
    p = _truth()
    pairs = [p.project(s) for s in itertools.combinations(DOM.attrs, 2)]
    r = global_fit(DOM, pairs, [1e-10] * 3, max_iter=300)
    fitted = Factor(DOM, r.table)
    assert r.table.sum() == pytest.approx(1.0, rel=1e-12) and r.table.min() >= 0
    for t in pairs:
        assert_close(fitted.project(t.domain.attrs).values, t.values, rel=1e-3)


def test_sure_of_a_linear_shrinkage_is_exact_in_expectation():
    """For f(y) = c·y the divergence is c·N exactly, and E[SURE] = E[Σ‖f(y) − μ‖²/σ²]; seeded
    Gaussian noise, R = 400 replicates: the mean difference within 4 standard errors."""
    rng = np.random.default_rng(3)
    p = _truth(1)
    tabs = [p.project(s) for s in itertools.combinations(DOM.attrs, 2)]
    var = [4e-4, 1e-4, 9e-4]
    c = 0.7
    diffs = []
    for _ in range(400):
        ys = [Factor(t.domain, t.values + np.sqrt(v) * rng.standard_normal(t.values.shape))
              for t, v in zip(tabs, var)]
        b = [rng.standard_normal(t.values.shape) for t in tabs]
        fit = [c * y.values for y in ys]
        moved = [c * (y.values + 1e-3 * np.sqrt(v) * bb) for y, v, bb in zip(ys, var, b)]
        est = sure(ys, var, fit, moved, b)
        risk = sum(float(((f - t.values) ** 2).sum()) / v for f, t, v in zip(fit, tabs, var))
        diffs.append(est - risk)
    d = np.asarray(diffs)
    assert abs(d.mean()) <= 4 * d.std(ddof=1) / np.sqrt(len(d))


def test_sure_tracks_the_risk_of_the_descent():
    """The descent's SURE at iteration 4 against its true risk (Gaussian noise on the pairs,
    R = 150 seeded replicates): mean difference within 4 standard errors."""
    rng = np.random.default_rng(11)
    p = _truth(2)
    tabs = [p.project(s) for s in itertools.combinations(DOM.attrs, 2)]
    var = [1e-3, 5e-4, 2e-3]
    diffs = []
    for _ in range(150):
        ys = [Factor(t.domain, t.values + np.sqrt(v) * rng.standard_normal(t.values.shape))
              for t, v in zip(tabs, var)]
        seen: dict[int, tuple[np.ndarray, float]] = {}
        global_fit(DOM, ys, var, max_iter=4, patience=100,
                   seed=int(rng.integers(1 << 30)),
                   on_iterate=lambda t, q, s: seen.__setitem__(t, (q.copy(), s)))
        q, s = seen[4]
        f = Factor(DOM, q)
        risk = sum(float(((f.project(t.domain.attrs).values - t.values) ** 2).sum()) / v
                   for t, v in zip(tabs, var))
        diffs.append(s - risk)
    d = np.asarray(diffs)
    assert abs(d.mean()) <= 4 * d.std(ddof=1) / np.sqrt(len(d))


def test_partitioned_global_beats_consistent_at_small_epsilon():
    """A generated 6-attribute network (dag-weak: weak dependence), n = 20,000, ε = 0.5,
    pairs collected, seeded: the global fit's mean pair TVD is below the consistent
    estimate's (measured 0.155 vs 0.352), and it serves proper distributions with its
    account."""
    net = shape_network("dag-weak", 6, 0)
    rec = net.sample(20_000, np.random.default_rng(1))
    mech = Partitioned(net.domain, 0.5, ways=2)
    counts = mech.count(mech.randomize(rec, np.random.default_rng(2)), mech.tensors())
    truth = Factor(net.domain, net.joint())
    pairs = list(itertools.combinations(net.domain.attrs, 2))
    err = {m: np.mean([tvd(mech.estimate(counts, a, m).factor.values,
                           truth.project(a).values) for a in pairs])
           for m in ("consistent", "global")}
    assert err["global"] < 0.95 * err["consistent"]
    est = mech.estimate(counts, ("x0", "x1", "x2"), "global")
    assert est.extra["global_fit"]["chosen"] == est.extra["chosen"] == "global"
    assert est.factor.values.min() >= 0 and est.factor.values.sum() == pytest.approx(1.0)
    assert est.iterations == est.extra["global_fit"]["iterations"] >= 1


def test_partitioned_global_on_a_large_domain_keeps_the_consistent_tables():
    dom = Domain(tuple(f"v{i}" for i in range(8)), (6,) * 8)
    assert dom.size() > MAX_CELLS
    rec = np.random.default_rng(0).integers(0, 6, size=(3_000, 8))
    mech = Partitioned(dom, 2.0, ways=1)
    counts = mech.count(mech.randomize(rec, np.random.default_rng(1)), mech.tensors())
    est = mech.estimate(counts, ("v0", "v1"), "global")
    cons = mech.estimate(counts, ("v0", "v1"), "consistent")
    assert est.extra["global_fit"]["chosen"] == "consistent"
    assert "cells" in est.extra["global_fit"]["reason"]
    assert_close(est.factor.values, cons.factor.values, rel=1e-12)


def test_per_cell_variances_and_smoothed_runs_reduce_to_the_plain_fit():
    """A per-cell variance array equal to the scalar gives the same fit; smoothed tables that
    are the measurements themselves (and the probed measurements) give the same fit too."""
    from ldpstream.estimators.kernels.global_fit import PROBE_SEED, PROBE_STEP, PROBES, probes
    rng = np.random.default_rng(4)
    p = _truth(3)
    ys = [Factor(t.domain, t.values + 0.02 * rng.standard_normal(t.values.shape))
          for t in (p.project(s) for s in itertools.combinations(DOM.attrs, 2))]
    var = [4e-4] * 3
    plain = global_fit(DOM, ys, var)
    cells = global_fit(DOM, ys, [np.full(y.values.shape, 4e-4) for y in ys])
    runs = [[y.values for y in ys]] + [
        [y.values + PROBE_STEP * 0.02 * b for y, b in zip(ys, probes(ys, PROBE_SEED + i))]
        for i in range(PROBES)]
    smooth = global_fit(DOM, ys, var, smoothed=runs)
    for r in (cells, smooth):
        assert r.iterations == plain.iterations
        assert_close(r.table, plain.table, rel=1e-9)
        assert r.risk == pytest.approx(plain.risk, rel=1e-6, abs=1e-6 * DOM.size())


def test_multinomial_noise_draws_have_its_covariance():
    """Noise.unit(b) for b ~ N(0, I) has covariance scale²·(diag(π) − ππᵀ): cells negatively
    correlated, every draw summing to 0; a sum of cells has variance scale²·π_Q(1 − π_Q)
    (projected_var), below the sum of the cells' variances. 40,000 draws: covariances within
    3 % of the largest entry."""
    pi = np.random.default_rng(1).dirichlet(np.ones(12)).reshape(3, 4)
    nz = Noise(np.zeros((3, 4)), pi, 0.5)
    rng = np.random.default_rng(2)
    u = np.stack([nz.unit(rng.standard_normal((3, 4))) for _ in range(40_000)])
    flat = u.reshape(len(u), -1)
    want = 0.25 * (np.diag(pi.ravel()) - np.outer(pi.ravel(), pi.ravel()))
    assert np.abs(np.cov(flat.T) - want).max() <= 0.03 * np.abs(want).max()
    assert np.abs(flat.sum(axis=1)).max() < 1e-12
    rows = u.sum(axis=2)   # the table's second axis summed out
    assert_close(rows.var(axis=0), nz.projected_var((1,)), rel=0.05)
    assert (nz.projected_var((1,)) < 0.25 * (pi * (1 - pi)).sum(axis=1)).all()


def test_query_sure_of_a_linear_shrinkage_is_unbiased_under_correlated_noise():
    """f(y) = c·y + (1 − c)·u (u uniform) on a table whose noise is multinomial-correlated,
    risk on its 1- and 2-way marginals: over 2,000 seeded noise draws per c, the mean of
    query_sure minus the squared error is within 4 standard errors of 0. (With the cells taken
    as independent, the same check is 10 standard errors off at c = 1.)"""
    dom = Domain(("a", "b", "c"), (3, 2, 4))
    mu = _truth(3).values
    nz = Noise(np.zeros(dom.shape), 0.9 * mu + 0.1 / dom.size(), 0.05)
    uni = np.full(dom.shape, 1.0 / dom.size())
    sets = query_sets([Factor(dom, mu)], ways=(1, 2))
    for c in (1.0, 0.3):
        rng = np.random.default_rng(4)
        diffs = []
        for _ in range(2_000):
            y = mu + nz.unit(rng.standard_normal(dom.shape))
            b = [[rng.standard_normal(dom.shape)] for _ in range(2)]
            runs = [[c * y + (1 - c) * uni]] + [
                [c * (y + 1e-3 * nz.unit(bb[0])) + (1 - c) * uni] for bb in b]
            f = Factor(dom, runs[0][0])
            err = sum(float(((f.project(q).values - Factor(dom, mu).project(q).values) ** 2
                             ).sum()) for q in sets)
            diffs.append(query_sure([Factor(dom, y)], [nz], runs, b, sets) - err)
        d = np.asarray(diffs)
        assert abs(d.mean()) <= 4 * d.std(ddof=1) / np.sqrt(len(d)), c


def test_global_keeps_the_consistent_tables_where_they_are_better_at_large_epsilon():
    """The bundled network at ε = 8 collects 5-way tables (ways: auto): the global fit's early
    iterate smooths their high-order cells and loses on the pairs (measured 15 % higher TVD
    when it was served); the choice by the pairs' and triples' risk keeps the consistent
    tables."""
    from ldpstream.bn import read_bif, survey_path
    net = read_bif(survey_path())
    rec = net.sample(50_000, np.random.default_rng(2018))
    mech = Partitioned(net.domain, 8.0, ways=5)
    counts = mech.count(mech.randomize(rec, np.random.default_rng([0, 1])), mech.tensors())
    table, info = mech.global_table(counts)
    assert table is None and info["chosen"] == "consistent"
    assert info["sure_consistent"] < info["sure_global"]


def test_fit_to_the_measurements_converges_to_their_projection_on_the_marginal_polytope():
    """Run long, the descent minimises Private-PGM's loss ½Σ‖p_S − y_S‖²/σ² over the
    distributions of the whole domain: with one σ², its fitted marginals are the closest
    realizable ones in L2, which the non-negative least squares of marginal_fit computes
    exactly (inconsistent measurements: the pairs of two different distributions)."""
    from ldpstream.estimators.kernels.marginal_fit import closest_marginals, plans
    p, q = _truth(0), _truth(1)
    ys = [p.project(("a", "b")), q.project(("b", "c")), p.project(("a", "c"))]
    last: list[np.ndarray] = []
    global_fit(DOM, ys, [1e-3] * 3, max_iter=3000, patience=3000, n_probes=1,
               on_iterate=lambda t, pt, risk: (last.clear(), last.append(pt)))
    want = closest_marginals(DOM, plans(DOM, ys))
    for y, (_, mu, _) in zip(ys, want):
        got = Factor(DOM, last[-1]).project(y.domain.attrs).values
        ax = DOM.axes(y.domain.attrs)
        got = np.transpose(got, np.argsort(np.argsort(ax)))   # to the plan's domain order
        assert_close(got, mu, rel=1e-3)


def test_global_fits_the_measurements_where_consistent_shrinks_skewed_data():
    """A skewed network at ε = 1 (pairs): the consistent tables shrink its strong dependence
    toward independence, the fit to the measurements keeps what the marginal polytope (p ≥ 0
    over the whole domain) reveals; the choice by risk serves that fit, more accurate than
    the consistent tables and than the converged fit (Private-PGM's estimate), on three
    seeds."""
    net = shape_network("skewed", 6, 3)
    truth = Factor(net.domain, net.joint())
    pairs = list(itertools.combinations(net.domain.attrs, 2))
    err: dict[str, list[float]] = {"global": [], "consistent": [], "converged": []}
    for seed in range(3):
        rec = net.sample(30_000, np.random.default_rng([seed, 5]))
        mech = Partitioned(net.domain, 1.0, ways=2)
        counts = mech.count(mech.randomize(rec, np.random.default_rng([seed, 6])),
                            mech.tensors())
        for m in ("global", "consistent"):
            err[m].append(np.mean([tvd(mech.estimate(counts, a, m).factor.values,
                                       truth.project(a).values) for a in pairs]))
        raw = [mech.unbiased(counts, j) for j in range(len(mech.marginals))]
        last: list[np.ndarray] = []
        global_fit(net.domain, [r[0] for r in raw], [r[1] for r in raw], max_iter=1000,
                   patience=1000, n_probes=1,
                   on_iterate=lambda t, pt, risk: (last.clear(), last.append(pt)))
        conv = Factor(net.domain, last[-1])
        err["converged"].append(np.mean([tvd(conv.project(a).values, truth.project(a).values)
                                         for a in pairs]))
        assert mech.global_table(counts)[1]["chosen"] in ("measurements", "global")
    mean = {k: float(np.mean(v)) for k, v in err.items()}
    assert mean["global"] < 0.9 * mean["consistent"], mean
    assert mean["global"] <= mean["converged"], mean


def test_one_step_is_the_first_mirror_descent_step_from_the_uniform_table():
    """Private-PGM's first step (McKenna et al. 2019, Alg. 1, step 2/L with L = max 1/σ²_S)
    from the uniform table u: p ∝ u·exp(−(2/L)·∇L(u)), ∇L(u) = Σ_S (u_S − y_S)/σ²_S broadcast;
    :func:`one_step` writes it as p ∝ exp(2·Σ_S (σ²_min/σ²_S)·y_S), for every run."""
    from ldpstream.estimators.kernels.global_fit import one_step
    p, q = _truth(0), _truth(1)
    ys = [p.project(("a", "b")), q.project(("b", "c")), p.project(("c",))]
    var = [2e-3, 1e-3, 4e-3]
    u = np.full(DOM.shape, 1.0 / DOM.size())
    grad = np.zeros(DOM.shape)
    for y, v in zip(ys, var):
        us = Factor(DOM, u).project(y.domain.attrs).values
        grad = grad + _broadcast(Factor(y.domain, (us - y.values) / v))
    want = u * np.exp(-2.0 * min(var) * grad)
    want /= want.sum()
    moved = [Factor(y.domain, y.values + 1e-3 * np.random.default_rng(i).standard_normal(
        y.values.shape)) for i, y in enumerate(ys)]
    got = one_step(DOM, [ys, moved], var)
    assert got.runs.shape == (2,) + DOM.shape
    assert_close(got.table, want, rel=1e-10)
    assert got.table.sum() == pytest.approx(1.0)
    assert not np.allclose(got.runs[1], got.runs[0], rtol=1e-6, atol=0)


def _broadcast(f: Factor) -> np.ndarray:
    ax = DOM.axes(f.domain.attrs)
    kept = sorted(ax)
    v = np.transpose(f.values, [list(ax).index(i) for i in kept])
    return np.broadcast_to(v.reshape([DOM.shape[i] if i in ax else 1 for i in range(len(DOM))]),
                           DOM.shape)


def _seven_from(kind: str, seed: int, eps: float) -> tuple[Partitioned, dict[str, np.ndarray],
                                                            Factor]:
    net = shape_network(kind, 7, seed)
    rec = net.sample(50_000, np.random.default_rng([seed, 13]))
    mech = Partitioned(net.domain, eps, ways="auto", expected_reports=len(rec))
    counts = mech.count(mech.randomize(rec, np.random.default_rng([0, 1])), mech.tensors())
    return mech, counts, Factor(net.domain, net.joint())


def test_global_serves_the_one_step_where_the_data_are_near_deterministic(monkeypatch):
    """A near-deterministic network at ε = 4 (pairs): the fits' descents stop far from the
    mode the data concentrate on, Private-PGM's first step reaches it; the risk comparison
    serves that step, and its pairs are several times more accurate than what was served
    without it (docs/partitioned.md "Private-PGM's first step")."""
    import ldpstream.estimators.kernels.global_fit as gf
    mech, counts, truth = _seven_from("near-deterministic", 7302, 4.0)
    pairs = list(itertools.combinations(mech.domain.attrs, 2))

    def err(m: Partitioned) -> float:
        return float(np.mean([tvd(m.estimate(counts, a, "global").factor.values,
                                  truth.project(a).values) for a in pairs]))
    fresh = Partitioned.from_state(mech.state())
    info = fresh.global_table(counts)[1]
    assert info["chosen"] == "one-step"
    assert info["sure_one-step"] < min(info["sure_measurements"], info["sure_consistent"])
    with_step = err(fresh)
    monkeypatch.setattr(gf, "ONE_STEP", False)
    without = Partitioned.from_state(mech.state())
    assert without.global_table(counts)[1]["chosen"] != "one-step"
    assert with_step < 0.5 * err(without)


def test_one_step_leaves_the_choice_where_its_risk_is_larger(monkeypatch):
    """On a skewed network (ε = 2, pairs) the step's estimated risk is far above the others',
    and every served pair and triple equals, to the bit, what ``global`` serves without the
    candidate."""
    import ldpstream.estimators.kernels.global_fit as gf
    mech, counts, _ = _seven_from("skewed", 5000, 2.0)
    sets = list(itertools.combinations(mech.domain.attrs, 2)) + list(
        itertools.combinations(mech.domain.attrs, 3))[:10]
    fresh = Partitioned.from_state(mech.state())
    info = fresh.global_table(counts)[1]
    assert info["chosen"] != "one-step"
    assert info["sure_one-step"] > 10 * max(info["sure_consistent"], info["sure_measurements"])
    got = {a: fresh.estimate(counts, a, "global").factor.values for a in sets}
    monkeypatch.setattr(gf, "ONE_STEP", False)
    old = Partitioned.from_state(mech.state())
    assert old.global_table(counts)[1]["chosen"] == info["chosen"]
    for a in sets:
        assert np.array_equal(old.estimate(counts, a, "global").factor.values, got[a])
