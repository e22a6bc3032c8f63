"""RRBA: privacy audit against the exact channel, sampling, eq. 4, views, consistency, convergence,
independence test, the Mechanism round trip, the simulate CLI, the BN sampler and the bench part."""
from __future__ import annotations

import json
import time
from itertools import combinations

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.stats import chisquare
from threadpoolctl import threadpool_limits
from tolerance import assert_close

from ldpstream.bench.mech_rrba import run_view
from ldpstream.bn import BIFError, parse_bif, read_bif, survey_path
from ldpstream.cli import main as cli_main
from ldpstream.datasets import load_csv
from ldpstream.estimators.families.rrba import (
    RRBA,
    channel_matrix,
    ci_width,
    cumulative,
    epsilon_combination,
    epsilon_view,
    eq4,
    floor_table,
    has_converged,
    paper_epsilon,
    pooled_estimate,
    randomize_cells,
    sample_cells,
    solve_gamma,
    solve_p,
)
from ldpstream.estimators.families.rrba_consistency import consistent_tables, marginal_of, maxent_table
from ldpstream.estimators.families.rrba_independence import independence_test
from ldpstream.estimators.families.rrba_views import make_views, round_robin_pairs, uncovered_pairs
from ldpstream.estimators.kernels import channels
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.mechanism import MECHANISMS, from_state

pytestmark = [pytest.mark.core, pytest.mark.slow]


@pytest.fixture(autouse=True, scope="module")
def _single_blas_thread():
    with threadpool_limits(1):
        yield


# --- privacy -------------------------------------------------------------------------------------

@pytest.mark.parametrize("p,gamma,cells", [(0.4, 0.05, 4), (0.5, 0.05, 9), (0.8, 0.2, 6),
                                           (0.1, 0.9, 2), (0.5, 1.0, 12)])
def test_declared_epsilon_equals_exact_channel_epsilon(p, gamma, cells):
    rng = np.random.default_rng(cells)
    T = rng.dirichlet(np.ones(cells))
    T[rng.integers(cells)] = 0.0           # a table the server can publish (clipped cell)
    T /= T.sum()
    P = channel_matrix(T, p, gamma)
    channels.validate(P)                   # square, row-stochastic, invertible
    np.testing.assert_allclose(P, p * np.eye(cells) + (1 - p) * floor_table(T, gamma)[None, :])
    assert channels.epsilon(P) == pytest.approx(epsilon_combination(p, gamma, cells), rel=1e-12)
    # any other table costs at most the declared ε (the bound is the max over tables)
    for _ in range(20):
        T2 = rng.dirichlet(np.full(cells, 0.3))
        assert channels.epsilon(channel_matrix(T2, p, gamma)) <= epsilon_combination(p, gamma, cells) + 1e-12


def test_mechanism_epsilon_is_composition_of_exact_channels_per_view():
    dom = Domain(("a", "b", "c", "d", "e"), (2, 3, 2, 4, 3))
    mech = RRBA(dom, p=0.45, gamma=0.1, k=2)
    worst = []
    for v in range(len(mech.views)):
        chans = [channel_matrix(np.eye(s)[0], mech.p, mech.gamma) for s in mech.sizes[v]]
        e = channels.epsilon_of_report(chans)
        assert mech.view_epsilon(v) == pytest.approx(e, rel=1e-12)
        worst.append(e)
    assert mech.epsilon == pytest.approx(max(worst), rel=1e-12)
    assert mech.epsilon > 10 * paper_epsilon(0.45)   # Theorem 4.1's claim is far too low


def test_epsilon_grows_without_bound_as_gamma_goes_to_zero():
    gammas = np.geomspace(1.0, 1e-200, 60)
    eps = [epsilon_combination(0.5, g, 6) for g in gammas]
    assert np.all(np.diff(eps) > 0)
    assert eps[-1] > 400
    assert epsilon_combination(0.5, 0.0, 6) == float("inf")
    T = np.array([0.5, 0.5, 0, 0, 0, 0])
    exact = [channels.epsilon(channel_matrix(T, 0.5, g)) for g in gammas[:30]]
    assert np.all(np.diff(exact) > 0)
    # without the floor (the paper's client) a zero cell makes ε infinite
    P0 = 0.5 * np.eye(6) + 0.5 * T[None, :]
    assert channels.epsilon(P0) == float("inf")


def test_solve_p_and_gamma_round_trip_and_errors():
    sizes = [4, 9, 6]
    for eps in (0.5, 3.0, 20.0):
        p = solve_p(eps, 0.05, sizes)
        assert epsilon_view(p, 0.05, sizes) == pytest.approx(eps, rel=1e-9)
    g = solve_gamma(15.0, 0.4, sizes)
    assert 0 < g <= 1 and epsilon_view(0.4, g, sizes) == pytest.approx(15.0, rel=1e-9)
    with pytest.raises(ValueError, match="uniform fakes"):
        solve_gamma(0.1, 0.4, sizes)


# --- sampling ------------------------------------------------------------------------------------

def test_sampled_reports_match_the_channel():
    rng = np.random.default_rng(7)
    p, gamma = 0.4, 0.1
    T = np.array([0.5, 0.3, 0.0, 0.15, 0.05, 0.0])
    P = channel_matrix(T, p, gamma)
    n = 120_000
    for u in (0, 2, 5):
        out = randomize_cells(np.full(n, u), floor_table(T, gamma), p, rng)
        obs = np.bincount(out, minlength=6)
        assert chisquare(obs, n * P[u]).pvalue > 1e-3
    # inverse CDF: cell v exactly on [cum[v-1], cum[v])
    cum = cumulative(np.array([0.25, 0.25, 0.5]))
    assert sample_cells(cum, np.array([0.0, 0.2499, 0.25, 0.7, 0.99999])).tolist() == [0, 0, 1, 2, 2]


def test_mechanism_reports_match_the_channel_of_each_combination():
    dom = Domain(("a", "b", "c", "d"), (2, 3, 2, 2))
    mech = RRBA(dom, p=0.5, gamma=0.2, k=2)
    rng = np.random.default_rng(3)
    n = 80_000
    records = np.tile(np.array([[1, 2, 0, 1]]), (n, 1))
    reps = mech.for_view(0).randomize(records, rng)
    assert (reps[:, 0] == 0).all() and (reps[:, 1] == 0).all()
    assert np.all(reps < mech.report_bounds())
    for j, comb in enumerate(mech.views[0]):
        shape = mech.dims[0][j]
        u = np.ravel_multi_index(tuple(records[0, dom.axes(comb)]), shape)
        P = channel_matrix(np.full(int(np.prod(shape)), 1 / np.prod(shape)), 0.5, 0.2)
        obs = np.bincount(reps[:, 2 + j], minlength=P.shape[0])
        assert chisquare(obs, n * P[u]).pvalue > 1e-3


def test_a_million_reports_in_seconds():
    ds = load_csv()
    mech = RRBA(ds.domain, p=0.5, gamma=0.05)
    rng = np.random.default_rng(0)
    records = ds.records[rng.integers(0, ds.n, 1_000_000)]
    t0 = time.perf_counter()
    reps = mech.randomize(records, rng)
    counts = mech.count(reps, mech.tensors())
    elapsed = time.perf_counter() - t0
    assert elapsed < 15, elapsed
    assert sum(int(counts[s.key].sum()) for s in mech.tensors() if s.key.split(":")[2] == "c0") == 1_000_000


# --- eq. 4 ---------------------------------------------------------------------------------------

def test_eq4_recovers_a_known_table_in_expectation():
    """Seeded Monte Carlo: 400 blocks of 2,000 reports; the mean eq.-4 estimate is within
    4 standard errors (and 0.004 absolute) of the true table in every cell."""
    rng = np.random.default_rng(11)
    pi = np.array([0.4, 0.25, 0.2, 0.1, 0.05, 0.0])
    T = np.array([0.0, 0.1, 0.1, 0.2, 0.3, 0.3])      # a skewed published table
    p, gamma, n, reps = 0.4, 0.05, 2000, 400
    Tt = floor_table(T, gamma)
    cells = rng.choice(6, size=(reps, n), p=pi)
    out = randomize_cells(cells, Tt, p, rng)
    counts = np.stack([np.bincount(r, minlength=6) for r in out])
    est = np.stack([eq4(c, Tt, p) for c in counts])
    mean, se = est.mean(axis=0), est.std(axis=0, ddof=1) / np.sqrt(reps)
    assert np.all(np.abs(mean - pi) < 4 * se + 1e-12)
    assert np.max(np.abs(mean - pi)) < 0.004
    # pooled over versions with different tables is unbiased too
    pooled = pooled_estimate(counts[:2], np.stack([Tt, Tt]), p)
    assert pooled.sum() == pytest.approx(1.0)


# --- views ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("m,k", [(m, k) for k in (2, 3, 4) for m in range(max(3, k), 11)])
def test_views_cover_every_pair(m, k):
    views = make_views(m, k)
    assert uncovered_pairs(views, m) == []
    assert all(len(c) == k for view in views for c in view)
    assert all(len(view) == m // k for view in views)


@pytest.mark.parametrize("m", range(3, 11))
def test_round_robin_uses_each_pair_once(m):
    views = round_robin_pairs(m)
    assert len(views) == (m - 1 if m % 2 == 0 else m)
    pairs = [c for v in views for c in v]
    assert sorted(pairs) == list(combinations(range(m), 2))


# --- consistency ---------------------------------------------------------------------------------

def _noisy_tables(rng, attrs_list, shapes):
    return [(a, rng.dirichlet(np.ones(int(np.prod(s)))).reshape(s) + rng.normal(0, 0.05, s))
            for a, s in zip(attrs_list, shapes)]


def test_consistency_equalizes_shared_marginals_and_sums():
    rng = np.random.default_rng(5)
    dom = {"a": 2, "b": 3, "c": 2, "d": 4}
    combos = [("a", "b"), ("c", "d"), ("a", "c"), ("b", "d"), ("a", "d"), ("b", "c"), ("a", "b")]
    tables = _noisy_tables(rng, combos, [tuple(dom[x] for x in c) for c in combos])
    out = consistent_tables(tables)
    for (a1, _), t1 in zip(tables, out):
        assert t1.sum() == pytest.approx(1.0, rel=1e-9)
        assert t1.min() >= 0
        for (a2, _), t2 in zip(tables, out):
            shared = tuple(x for x in a1 if x in a2)
            if shared:
                assert_close(marginal_of(a1, t1, shared), marginal_of(a2, t2, shared), rel=1e-9)


@pytest.mark.parametrize("nonnegative", [False, True])
def test_consistency_equals_independent_constrained_solver(nonnegative):
    rng = np.random.default_rng(9)
    tables = [(("a", "b"), np.array([[0.5, -0.1], [0.3, 0.2]])),
              (("b", "c"), np.array([[0.1, 0.6, 0.05], [0.15, 0.02, 0.1]])),
              (("a", "c"), np.abs(rng.normal(0.15, 0.1, (2, 3))))]
    out = consistent_tables(tables, nonnegative=nonnegative)
    x_hat = np.concatenate([t.ravel() for _, t in tables])

    def cons(x):  # written out by hand, without redundant rows (sums fix the last category)
        ab, bc, ac = x[:4].reshape(2, 2), x[4:10].reshape(2, 3), x[10:].reshape(2, 3)
        return np.array([ab.sum() - 1, bc.sum() - 1, ac.sum() - 1,
                         ab.sum(1)[0] - ac.sum(1)[0],                  # a
                         ab.sum(0)[0] - bc.sum(1)[0],                  # b
                         bc.sum(0)[0] - ac.sum(0)[0], bc.sum(0)[1] - ac.sum(0)[1]])  # c

    res = minimize(lambda x: np.sum((x - x_hat) ** 2), np.full(len(x_hat), 0.1),
                   jac=lambda x: 2 * (x - x_hat), method="SLSQP",
                   constraints=[{"type": "eq", "fun": cons}],
                   bounds=[(0, None)] * len(x_hat) if nonnegative else None,
                   options={"ftol": 1e-15, "maxiter": 500})
    assert res.success
    assert_close(np.concatenate([t.ravel() for t in out]), res.x, rel=1e-6)
    if not nonnegative:
        assert np.concatenate([t.ravel() for t in out]).min() < 0   # the case needs the repair


def test_consistency_newton_matches_dykstra_on_noisy_views():
    """Medium case (5 attributes, k = 2 round robin, very noisy tables): the semismooth Newton
    projection equals Dykstra's alternating projections run to convergence."""
    from ldpstream.estimators.families.rrba_consistency import _dykstra, consistency_system
    rng = np.random.default_rng(13)
    dims = {"a": 3, "b": 4, "c": 2, "d": 5, "e": 3}
    names = list(dims)
    combos = [tuple(names[i] for i in c) for v in make_views(5, 2) for c in v]
    tables = [(c, rng.dirichlet(np.ones(dims[c[0]] * dims[c[1]])).reshape(dims[c[0]], dims[c[1]])
               + rng.normal(0, 0.08, (dims[c[0]], dims[c[1]]))) for c in combos]
    out = np.concatenate([t.ravel() for t in consistent_tables(tables)])
    A, b, _ = consistency_system(tables)
    x_hat = np.concatenate([t.ravel() for _, t in tables])
    ref = _dykstra(x_hat, A, b, 1e-13, 200000)
    assert_close(out, ref, rel=1e-7)
    assert (x_hat < 0).sum() > 10 and out.min() >= 0


def test_maxent_of_independent_marginals_is_the_product():
    a = np.array([0.2, 0.8])
    b = np.array([0.1, 0.6, 0.3])
    c = np.array([0.5, 0.25, 0.25])
    t, _ = maxent_table(("x", "y", "z"), (2, 3, 3),
                        [(("x", "y"), np.outer(a, b)), (("y", "z"), np.outer(b, c)),
                         (("z", "x"), np.outer(c, a))])
    assert_close(t, np.einsum("i,j,k->ijk", a, b, c), rel=1e-9)


# --- convergence ---------------------------------------------------------------------------------

def test_ci_width_formula():
    n, a = 400, 0.05
    z = 1.959963984540054
    assert ci_width(np.array([0.3]), n, a)[0] == pytest.approx(2 * z * np.sqrt(0.3 * 0.7 / n))
    small = ci_width(np.array([0.005]), n, a)[0]            # n·v = 2 < 5: log-odds interval
    lo, hi = [1 / (1 + np.exp(-(np.log(0.005 / 0.995) + s * z / np.sqrt(n * 0.005 * 0.995))))
              for s in (-1, 1)]
    assert small == pytest.approx(hi - lo)
    assert has_converged(np.array([0.3, 0.7]), np.array([0.31, 0.69]), n)
    assert not has_converged(np.array([0.3, 0.7]), np.array([0.5, 0.5]), n)


def test_convergence_rule_stops_on_a_stationary_stream():
    rng = np.random.default_rng(21)
    pi = np.array([0.3, 0.3, 0.2, 0.1, 0.1])
    cells = rng.choice(5, size=(200_000, 1), p=pi)
    run = run_view(cells, [5], 0.5, 0.05, 1000, 0.05, rng)
    assert run.converged and run.reports < 200_000 and run.blocks >= 2
    est = run.counts[0]
    assert est.shape[0] == run.blocks and est.sum() == run.reports


def test_mechanism_block_loop_converges_and_estimates():
    """The streaming path: randomize → count per (combination, version) → advance."""
    bn = read_bif(survey_path())
    rng = np.random.default_rng(4)
    records = bn.sample(400_000, rng)
    # p = 0.8: the §5 rule ignores eq. 4's 1/p variance inflation, so at small p a view of 27
    # cells rarely passes it (see docs/rrba.md)
    mech = RRBA(bn.domain, p=0.8, gamma=0.05, block_size=5000, max_versions=64)
    specs = mech.tensors([("A", "S")])
    counts = {s.key: np.zeros(s.shape, dtype=np.int64) for s in specs}
    start = 0
    while not all(mech.converged) and start < len(records):
        batch = records[start:start + 5000 * len(mech.views)]
        start += len(batch)
        V = len(mech.views)
        reps = np.concatenate([mech.for_view(v).randomize(batch[v::V], rng) for v in range(V)])
        for k, c in mech.count(reps, specs).items():
            counts[k] += c
        mech = mech.advance(counts)
    assert all(mech.converged), (start, mech.converged)
    joint = bn.joint()
    truth = joint.sum(axis=(2, 3, 4, 5))
    for method in RRBA.estimators:
        est = mech.estimate(counts, ("A", "S"), method)
        assert est.factor.domain.attrs == ("A", "S") and est.epsilon == mech.epsilon
        assert np.abs(est.factor.values - truth).max() < 0.03, method
    est3 = mech.estimate(counts, ("E", "O", "T"), "pooled")
    assert est3.extra["derivation"] == "maxent"
    assert est3.factor.values.sum() == pytest.approx(1.0)


def test_state_round_trip_and_registry():
    dom = Domain(("a", "b", "c"), (2, 3, 2), (("x", "y"), ("1", "2", "3"), ("u", "v")))
    mech = RRBA(dom, p=0.3, gamma=0.1, k=2, block_size=10, max_versions=8)
    assert MECHANISMS["rrba"] is RRBA
    rng = np.random.default_rng(0)
    reps = mech.for_view(0).randomize(rng.integers(0, 2, size=(100, 3)), rng)
    mech2 = mech.advance(mech.count(reps, mech.tensors()))
    assert mech2.version == 1 and mech2.table_version(0) == 1 and mech2.table_version(1) == 0
    state = json.loads(json.dumps(mech2.state()))
    assert state["tables"][0]["version"] == 1 and state["mechanism"] == "rrba"
    back = from_state(state)
    assert back.state() == state and back.epsilon == mech2.epsilon
    assert mech.advance({s.key: np.zeros(s.shape) for s in mech.tensors()}) is mech
    with pytest.raises(ValueError):
        RRBA(dom, p=1.0)


# --- independence test ---------------------------------------------------------------------------

def _noisy_counts(pi, n, p, gamma, rng):
    cells = rng.choice(pi.size, size=n, p=pi.ravel())
    Tt = floor_table(rng.dirichlet(np.ones(pi.size)), gamma)
    rep = randomize_cells(cells, Tt, p, rng)
    return np.bincount(rep, minlength=pi.size).reshape(pi.shape), Tt.reshape(pi.shape)


def test_independence_test_level_and_power():
    rng = np.random.default_rng(2)
    ind = np.outer([0.3, 0.7], [0.2, 0.3, 0.5])
    dep = np.array([[0.25, 0.04, 0.01], [0.05, 0.15, 0.5]])
    rejects = [independence_test(*_noisy_counts(ind, 2000, 0.5, 0.1, rng), 0.5, rng, alpha=0.1,
                                 resamples=19).reject for _ in range(20)]
    assert np.mean(rejects) <= 0.3
    res = [independence_test(*_noisy_counts(dep, 2000, 0.5, 0.1, rng), 0.5, rng, alpha=0.1,
                             resamples=19) for _ in range(5)]
    assert all(r.reject for r in res)
    assert all(r.p_value <= 0.1 for r in res)
    with pytest.raises(ValueError, match="exceed"):
        independence_test(*_noisy_counts(ind, 100, 0.5, 0.1, rng), 0.5, rng, alpha=0.1, resamples=10)


# --- BN ------------------------------------------------------------------------------------------

def test_bif_reader_and_sampler():
    bn = read_bif(survey_path())
    assert bn.variables == ("A", "S", "E", "O", "R", "T") and bn.parents["T"] == ("O", "R")
    assert bn.cpt["E"][0, 0].tolist() == [0.75, 0.25]        # (young, M)
    x = bn.sample(100_000, np.random.default_rng(1))
    J = bn.joint()
    emp = np.bincount(np.ravel_multi_index(tuple(x.T), J.shape), minlength=J.size) / len(x)
    assert chisquare(emp * len(x), J.ravel() * len(x)).pvalue > 1e-3
    with pytest.raises(BIFError, match="X"):
        parse_bif("variable X { type discrete [ 2 ] { a, b }; }\nprobability ( X ) { table 0.5; }")
    with pytest.raises(BIFError, match="sum to 1"):
        parse_bif("variable X { type discrete [ 2 ] { a, b }; }\nprobability ( X ) { table 0.5, 0.6; }")


# --- simulate CLI and bench ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def survey_csv(tmp_path_factory):
    bn = read_bif(survey_path())
    x = bn.sample(6000, np.random.default_rng(0))
    path = tmp_path_factory.mktemp("rrba") / "survey.csv"
    lines = [",".join(bn.variables)] + [",".join(bn.states[v][i] for v, i in zip(bn.variables, r))
                                        for r in x]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_simulate_cli_json(survey_csv, capsys):
    rc = cli_main(["simulate", "--mechanism", "rrba", "--data", str(survey_csv), "--columns",
                   "A,S,E,O,R,T", "--p", "0.5", "--gamma", "0.05", "--block-size", "50",
                   "--block-size", "250", "--ways", "2,3,4", "--json", "--subsets", "4"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    # one row per (block size, estimator, w), metrics under "metrics"
    assert [(r["block_size"], r["estimator"], r["w"]) for r in doc["results"]] == [
        (b, e, w) for b in (50, 250) for e in ("last-two", "pooled") for w in (2, 3, 4)]
    assert doc["epsilon_per_record"] == pytest.approx(
        max(epsilon_view(0.5, 0.05, s) for s in RRBA(load_csv(survey_csv, list("ASEORT")).domain,
                                                     0.5, 0.05).sizes))
    assert doc["epsilon"] is None and doc["parameters"]["p"] == 0.5
    row = doc["results"][6]
    assert row["block_size"] == 250 and row["mechanism"] == "rrba"
    assert 0 < row["metrics"]["tvd"] < 0.3
    assert {"reports", "versions", "seconds", "subsets", "iterations",
            "converged_fraction"} <= set(row)
    assert doc["results"][0]["reports"] <= 6000 and doc["results"][0]["versions"] > 2


@pytest.mark.parametrize("argv,msg", [(["--p", "1.5"], "--p"), (["--gamma", "0"], "--gamma"),
                                      (["--k", "9"], "--k"), (["--block-size", "0"], "--block-size")])
def test_simulate_cli_errors(survey_csv, capsys, argv, msg):
    rc = cli_main(["simulate", "--mechanism", "rrba", "--data", str(survey_csv), "--columns",
                   "A,S,E,O,R,T"] + argv)
    assert rc == 2
    assert msg in capsys.readouterr().err


def test_bench_part_quick():
    from ldpstream.bench import mech_rrba
    out = mech_rrba.run(quick=True, verbose=False)
    rows = [r for r in out["rows"] if r["w"] == 2 and r["p"] == 0.5]
    by = {r["method"]: r for r in rows}
    assert by["rrba pooled"]["l2_counts"] < by["laplace-local @ paper ε"]["l2_counts"]
    assert out["epsilon_rrba_per_record"]["0.5"] > 10 * out["epsilon_paper_claim"]["0.5"]
