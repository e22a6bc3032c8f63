"""LoPub (docs/mechanisms.md §6): privacy audit, flip channel, EM, co-occurrence, Lasso, junction tree,
synthesis, state, CLI. Seeded; every statistical assertion states its tolerance."""
import itertools
import json

import networkx as nx
import numpy as np
import pytest
from scipy import stats
from tolerance import assert_close

from ldpstream.cli import main as cli_main
from ldpstream.datasets import load_csv
from ldpstream.estimators.families import lopub_bloom as bloom
from ldpstream.estimators.families.lopub import LoPub
from ldpstream.estimators.kernels.channels import epsilon as channel_epsilon
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.kernels.junction_tree import JunctionTree, dependency_graph, is_junction_tree, junction_tree
from ldpstream.estimators.kernels.metrics import tvd
from ldpstream.estimators.kernels.synthesis import synthesize
from ldpstream.estimators.mechanism import MECHANISMS, from_state
from ldpstream.simulate.synthesize import marginal_fidelity, synthesize_dataset, true_joint

pytestmark = [pytest.mark.core, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _one_blas_thread():
    """Small matmuls in EM loops: one BLAS thread is much faster on the shared 2-core box."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1):
        yield


def _sample(joint: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    flat = rng.choice(joint.size, size=n, p=joint.reshape(-1))
    return np.stack(np.unravel_index(flat, joint.shape), axis=1)


def _empirical(x: np.ndarray, shape) -> np.ndarray:
    flat = np.ravel_multi_index(tuple(x.T), shape)
    return np.bincount(flat, minlength=int(np.prod(shape))).reshape(shape) / len(x)


JOINT = np.array([[0.30, 0.02, 0.03], [0.01, 0.20, 0.04], [0.05, 0.02, 0.13], [0.00, 0.10, 0.10]])


# --- privacy audit -------------------------------------------------------------------------------

def _full_channel(B: np.ndarray, f: float) -> np.ndarray:
    """The d × 2^m channel from values to every possible output bit vector (brute force)."""
    m = B.shape[1]
    outs = np.array(list(itertools.product((0, 1), repeat=m)))           # (2^m, m)
    p1 = bloom.expected_bits(B, f).T                                      # (d, m)
    return np.prod(np.where(outs[None, :, :] == 1, p1[:, None, :], 1 - p1[:, None, :]), axis=2)


@pytest.mark.parametrize("f", [0.1, 0.5, 0.9])
def test_exact_epsilon_factorises_per_bit(f):
    """The exact ε (max over all 2^m outputs of the likelihood ratio, [MDRR eq. 4] on the full
    channel) equals the per-bit factorisation ln((2−f)/f)·max Hamming distance."""
    for seed in range(4):
        B = bloom.filters(4, 9, 2, seed)
        full = _full_channel(B, f)
        np.testing.assert_allclose(full.sum(axis=1), 1.0)
        exact = channel_epsilon(full)
        assert bloom.epsilon_from_bit_channels(bloom.bit_channels(B, f)) == pytest.approx(exact)
        assert bloom.epsilon_exact(B, f) == pytest.approx(exact)
        assert exact <= bloom.epsilon_declared(f, 2) + 1e-12


def test_declared_epsilon_is_exact_iff_two_filters_are_disjoint():
    f, h = 0.5, 2
    disjoint = np.array([[1, 1, 0, 0, 0], [0, 0, 1, 1, 0], [1, 0, 0, 0, 1]])
    shared = np.array([[1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [1, 0, 1, 0, 0]])  # every pair shares 1
    assert channel_epsilon(_full_channel(disjoint, f)) == pytest.approx(
        bloom.epsilon_declared(f, h))
    exact = channel_epsilon(_full_channel(shared, f))
    assert exact == pytest.approx(bloom.epsilon_declared(f, h) / 2)        # Hamming 2, not 4
    assert exact < bloom.epsilon_declared(f, h)


def test_mechanism_epsilon_against_actual_filters():
    """For the Adult filters the exact ε per attribute (from per-bit channels) is ≤ eq. 8 and
    equal exactly when some pair of values has disjoint filters of h distinct bits each."""
    ds = load_csv()
    mech = LoPub(ds.domain, f=0.3, seed=0)
    total = 0.0
    for B in mech.blooms:
        exact = bloom.epsilon_from_bit_channels(bloom.bit_channels(B, mech.f))
        assert exact == pytest.approx(bloom.epsilon_exact(B, mech.f))
        ones = B.sum(axis=1)
        disjoint_full = any(ones[u] == mech.hashes and ones[v] == mech.hashes
                            and not (B[u] & B[v]).any()
                            for u, v in itertools.combinations(range(len(B)), 2))
        if disjoint_full:
            assert exact == pytest.approx(mech.epsilon_attribute)
        else:
            assert exact < mech.epsilon_attribute - 1e-9
        total += exact
    assert mech.epsilon_exact == pytest.approx(total)
    assert mech.epsilon_eq8 == pytest.approx(len(ds.domain) * 2 * mech.hashes * np.log(1.7 / 0.3))
    assert mech.epsilon_exact == mech.epsilon <= mech.epsilon_eq8


# --- the flip channel ------------------------------------------------------------------------------

def _bit_chi2(reports: np.ndarray, expected_p1: np.ndarray) -> float:
    """p-value of χ² over every bit's 0/1 counts against the expected Pr(bit = 1)."""
    n = reports.shape[0]
    ones = reports.sum(axis=0)
    e1, e0 = n * expected_p1, n * (1 - expected_p1)
    chi2 = np.sum((ones - e1) ** 2 / e1 + ((n - ones) - e0) ** 2 / e0)
    return float(stats.chi2.sf(chi2, df=len(expected_p1)))


def test_sampled_bits_match_the_flip_channel():
    dom = Domain(("a", "b"), (5, 3))
    mech = LoPub(dom, f=0.4, bits=[24, 12], hashes=3, seed=3)
    rng = np.random.default_rng(11)
    n = 20000
    for va, vb in [(0, 0), (3, 2), (4, 1)]:
        x = np.tile([va, vb], (n, 1))
        r = mech.randomize(x, rng)
        assert r.dtype == np.uint8 and set(np.unique(r)) <= {0, 1}
        p1 = np.concatenate([bloom.expected_bits(mech.blooms[0], 0.4)[:, va],
                             bloom.expected_bits(mech.blooms[1], 0.4)[:, vb]])
        assert _bit_chi2(r, p1) > 1e-3
        # the test can fail: the same samples against f = 0.46 are rejected
        wrong = np.concatenate([bloom.expected_bits(mech.blooms[0], 0.46)[:, va],
                                bloom.expected_bits(mech.blooms[1], 0.46)[:, vb]])
        assert _bit_chi2(r, wrong) < 1e-6
        # bits flip independently: a 2×2 table of two bits of different attributes
        a, b = r[:, 0], r[:, 24]
        table = np.array([[np.sum((a == i) & (b == j)) for j in (0, 1)] for i in (0, 1)])
        assert stats.chi2_contingency(table)[1] > 1e-3


# --- estimators --------------------------------------------------------------------------------------

def test_em_recovers_a_known_two_way_joint_at_small_f():
    """EM JD at f = 0.1 (default m_j, h): tvd to the empirical joint < 0.01 and to the population
    joint < 0.02 (n = 20000; sampling alone is ≈ 0.01)."""
    rng = np.random.default_rng(5)
    x = _sample(JOINT, 20000, rng)
    mech = LoPub(Domain(("a", "b"), JOINT.shape), f=0.1, seed=5)
    r = mech.randomize(x, rng)
    est = mech.estimate_reports(r, ("a", "b"), "em")
    assert est.converged and est.n == 20000
    assert tvd(est.factor.values, _empirical(x, JOINT.shape)) < 0.01
    assert tvd(est.factor.values, JOINT) < 0.02
    # axis order follows the request
    est_t = mech.estimate_reports(r, ("b", "a"), "em")
    assert_close(est_t.factor.values, est.factor.values.T, rel=1e-6)


def test_em_at_large_f_is_still_a_distribution_and_better_than_uniform():
    rng = np.random.default_rng(6)
    x = _sample(JOINT, 20000, rng)
    mech = LoPub(Domain(("a", "b"), JOINT.shape), f=0.7, seed=6)
    est = mech.estimate_reports(mech.randomize(x, rng), ("a", "b"), "em")
    v = est.factor.values
    assert np.all(v >= 0) and v.sum() == pytest.approx(1.0)
    assert tvd(v, JOINT) < 0.5 * tvd(np.full(JOINT.shape, 1 / JOINT.size), JOINT)


def test_cooccurrence_estimator_is_unbiased():
    """Seeded Monte Carlo: 300 randomizations of the same 3000 records at f = 0.5; every cell of
    the mean estimate is within 4 standard errors of the empirical joint (and the estimate is
    not trivially exact: single runs err by > 0.02 tvd)."""
    rng = np.random.default_rng(7)
    x = _sample(JOINT, 3000, rng)
    truth = _empirical(x, JOINT.shape)
    mech = LoPub(Domain(("a", "b"), JOINT.shape), f=0.5, bits=[16, 12], hashes=2, seed=7)
    specs = mech.tensors([("a", "b")])
    ests = np.array([mech.estimate(mech.count(mech.randomize(x, rng), specs), ("a", "b"),
                                   "cooccurrence").factor.values for _ in range(300)])
    mean, se = ests.mean(axis=0), ests.std(axis=0, ddof=1) / np.sqrt(len(ests))
    z = np.abs(mean - truth) / se
    assert z.max() < 4.0, z.round(2)
    assert np.median([tvd(e, truth) for e in ests]) > 0.02
    # the same test flags a biased estimator (the estimate shrunk 5% toward uniform)
    shrunk = 0.95 * ests + 0.05 / JOINT.size
    assert (np.abs(shrunk.mean(axis=0) - truth) / se).max() > 4.0


def test_count_path_equals_report_path_and_counts_add_up():
    rng = np.random.default_rng(8)
    x = _sample(JOINT, 4000, rng)
    mech = LoPub(Domain(("a", "b"), JOINT.shape), f=0.3, seed=8)
    r = mech.randomize(x, rng)
    specs = mech.tensors([("b", "a")])
    assert [s.key for s in specs] == ["n", "b:a", "b:b", "c:a|b"]
    whole = mech.count(r, specs)
    halves = [mech.count(r[:1500], specs), mech.count(r[1500:], specs)]
    for k in whole:
        np.testing.assert_array_equal(whole[k], halves[0][k] + halves[1][k])
    for method in ("cooccurrence", "lasso"):
        a = mech.estimate(whole, ("b", "a"), method).factor.values
        b = mech.estimate_reports(r, ("b", "a"), method).factor.values
        assert_close(a, b, rel=1e-9)
    with pytest.raises(ValueError, match="reports"):
        mech.estimate(whole, ("a", "b"), "em")
    em = mech.estimate(whole, ("a", "b"), "em", reports=r)
    assert em.method == "em" and em.iterations >= 1


def test_three_way_cooccurrence_tensor_matches_the_projection_route():
    """The w-way tensor solved by least squares equals the per-record projection route."""
    dom = Domain(("a", "b", "c"), (3, 2, 2))
    rng = np.random.default_rng(9)
    joint = rng.dirichlet(np.ones(12)).reshape(3, 2, 2)
    x = _sample(joint, 5000, rng)
    mech = LoPub(dom, f=0.4, bits=[10, 8, 8], hashes=2, seed=9)
    r = mech.randomize(x, rng)
    specs = mech.tensors([("a", "b", "c")])
    assert "c:a|b|c" in [s.key for s in specs]
    via_tensor = mech.estimate(mech.count(r, specs), ("c", "a", "b"), "cooccurrence").factor.values
    via_bits = mech.estimate_reports(r, ("c", "a", "b"), "cooccurrence").factor.values
    assert_close(via_tensor, via_bits, rel=1e-9)


def test_lasso_identifies_marginals_only_and_lasso_em_runs():
    """Alg. 2 regresses on per-attribute bit sums: its marginals are right (tvd < 0.02), its
    joint need not be (docs/mechanisms.md §6 note). Alg. 3 prunes Lasso's zero cells."""
    rng = np.random.default_rng(10)
    x = _sample(JOINT, 20000, rng)
    mech = LoPub(Domain(("a", "b"), JOINT.shape), f=0.2, seed=10)
    r = mech.randomize(x, rng)
    lasso = mech.estimate_reports(r, ("a", "b"), "lasso").factor.values
    assert lasso.sum() == pytest.approx(1.0) and np.all(lasso >= 0)
    assert tvd(lasso.sum(axis=1), JOINT.sum(axis=1)) < 0.02
    assert tvd(lasso.sum(axis=0), JOINT.sum(axis=0)) < 0.02
    le = mech.estimate_reports(r, ("a", "b"), "lasso-em")
    support = le.extra["lasso_support"]
    assert np.count_nonzero(le.factor.values > 1e-12) <= support
    assert le.factor.values.sum() == pytest.approx(1.0)


# --- dimension reduction and synthesis ------------------------------------------------------------

def test_junction_tree_on_a_known_graph():
    g = nx.Graph([("a", "b"), ("b", "c"), ("c", "d"), ("d", "e"), ("e", "a"),   # 5-cycle
                  ("c", "f"), ("f", "g"), ("g", "c"), ("h", "i")])
    g.add_node("j")
    jt = junction_tree(g)
    assert is_junction_tree(jt)
    assert nx.is_chordal(nx.Graph([(u, v) for c in jt.cliques for u, v in
                                   itertools.combinations(c, 2)]))
    for u, v in g.edges:                                    # every edge lives in some clique
        assert any(u in c and v in c for c in jt.cliques)
    assert ("c", "f", "g") in jt.cliques and ("j",) in jt.cliques and ("h", "i") in jt.cliques
    assert sum(len(c) == 3 for c in jt.cliques) == 3 + 1   # 5-cycle → 3 triangles, plus c-f-g
    # the check can fail: a tree over cliques that breaks running intersection ("b" is in
    # cliques 0 and 1, but the path between them runs through clique 2), or misses a clique
    cl = (("a", "b"), ("b", "c"), ("c", "d"))
    assert is_junction_tree(JunctionTree(cl, nx.Graph([(0, 1), (1, 2)])))
    assert not is_junction_tree(JunctionTree(cl, nx.Graph([(0, 2), (2, 1)])))
    assert not is_junction_tree(JunctionTree(cl, nx.Graph([(0, 1)])))


def test_dependency_graph_threshold():
    """Edge iff I ≥ min(d−1)·φ²/2: an exact copy has I = ln 3 (edge), independence none."""
    ind = np.full((3, 3), 1 / 9)
    copy = np.eye(3) / 3
    g = dependency_graph(("a", "b", "c"), (3, 3, 3),
                         {("a", "b"): copy, ("a", "c"): ind, ("b", "c"): ind}, phi=0.2)
    assert set(map(frozenset, g.edges)) == {frozenset(("a", "b"))}


def test_synthesis_preserves_marginals_from_true_joints():
    ds = load_csv(columns=("marital-status", "relationship", "sex", "Salary", "race"))
    pairs = {p: true_joint(ds, p) for p in itertools.combinations(ds.domain.attrs, 2)}
    jt = junction_tree(dependency_graph(ds.domain.attrs, ds.domain.shape, pairs, 0.2))
    assert is_junction_tree(jt)
    x = synthesize(ds.domain, jt, [true_joint(ds, c) for c in jt.cliques], ds.n,
                   np.random.default_rng(12))
    fid = marginal_fidelity(ds, x)
    assert fid["tvd_1way"] < 0.01                         # sampling noise only
    for c in jt.cliques:                                  # clique joints are reproduced
        ours = true_joint(type(ds)(ds.domain, x), c)
        assert tvd(ours, true_joint(ds, c)) < 0.03


def test_lopub_end_to_end_synthesis_roughly_preserves_marginals():
    """Reports at f = 0.3 → EM 2-way joints → junction tree → synthetic data: mean 1-way tvd
    < 0.02, mean 2-way tvd < 0.05 (the dependence kept is what the clusters hold)."""
    ds = load_csv(columns=("marital-status", "relationship", "sex", "Salary"))
    mech = LoPub(ds.domain, f=0.3, seed=13)
    rng = np.random.default_rng(13)
    x, info = synthesize_dataset(ds, mech, mech.randomize(ds.records, rng), "em", rng)
    assert x.shape == ds.records.shape
    fid = marginal_fidelity(ds, x)
    assert fid["tvd_1way"] < 0.02 and fid["tvd_2way"] < 0.05, fid
    assert any({"marital-status", "relationship"} <= set(c) for c in info["clusters"])
    # clusters too large for a cell budget: φ is raised until every cluster fits
    x2, info2 = synthesize_dataset(ds, mech, mech.randomize(ds.records, rng), "cooccurrence",
                                   rng, max_clique_cells=14)
    assert all(ds.domain.size(c) <= 14 for c in info2["clusters"])
    assert info2["phi_used"] > info2["phi"] and x2.shape == ds.records.shape


# --- state and CLI -----------------------------------------------------------------------------------

def test_state_round_trips_through_json():
    ds = load_csv(columns=("education", "sex"))
    mech = LoPub(ds.domain, f=0.25, hashes=3, seed=42, version=4)
    state = json.loads(json.dumps(mech.state()))
    assert state["mechanism"] == "lopub" and state["version"] == 4 and state["format"] == 1
    assert MECHANISMS["lopub"] is LoPub
    again = from_state(state)
    assert isinstance(again, LoPub) and again.state() == mech.state()
    for a, b in zip(again.blooms, mech.blooms):
        np.testing.assert_array_equal(a, b)
    assert again.domain.labels == ds.domain.labels
    x = ds.records[:50]
    np.testing.assert_array_equal(again.randomize(x, np.random.default_rng(1)),
                                  mech.randomize(x, np.random.default_rng(1)))
    with pytest.raises(ValueError, match="format"):
        LoPub.from_state({**state, "format": 99})


def test_rejects_bad_parameters():
    dom = Domain(("a", "b"), (3, 2))
    with pytest.raises(ValueError, match="f"):
        LoPub(dom, f=1.0)
    with pytest.raises(ValueError, match="bits"):
        LoPub(dom, bits=[8])
    with pytest.raises(ValueError, match="outside"):
        LoPub(dom, f=0.5, bits=8, hashes=2).randomize(np.array([[3, 0]]), np.random.default_rng(0))
    with pytest.raises(ValueError, match="estimator"):
        LoPub(dom, f=0.5, bits=8, hashes=2).estimate({}, ("a",), "nope")


def test_cli_simulate_json(capsys, tmp_path):
    out = tmp_path / "syn.csv"
    rc = cli_main(["simulate", "--mechanism", "lopub", "--f", "0.3", "--columns",
                   "sex,Salary,race", "--ways", "2", "--subsets", "2", "--estimator",
                   "cooccurrence", "--estimator", "em", "--json", "--synthesize", str(out)])
    assert rc == 0
    res = json.loads(capsys.readouterr().out)
    # the ε per record is the exact ε computed from the filters
    dom = load_csv(None, ["sex", "Salary", "race"]).domain
    assert res["epsilon_per_record"] == pytest.approx(LoPub(dom, f=0.3).epsilon_exact)
    assert {r["estimator"] for r in res["results"]} == {"cooccurrence", "em"}
    assert all(r["metrics"]["tvd"] < 0.05 and "stderr" not in r for r in res["results"])
    lines = out.read_text().splitlines()
    assert lines[0] == "sex,Salary,race" and len(lines) == res["n"] + 1
    assert set(lines[1].split(",")[0:1]) <= {"Female", "Male"}


def test_cli_simulate_user_errors(capsys):
    assert cli_main(["simulate", "--mechanism", "lopub", "--estimator", "castell"]) == 2
    assert "--estimator" in capsys.readouterr().err
    assert cli_main(["simulate", "--mechanism", "lopub", "--f", "1.5"]) == 2
    assert "--f" in capsys.readouterr().err
    assert cli_main(["simulate", "--mechanism", "lopub", "--columns", "sex,nope"]) == 2
    assert "nope" in capsys.readouterr().err
