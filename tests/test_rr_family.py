"""The [MDRR] RR family's building blocks: dependence, RR-Joint, Alg. 1 clustering, Alg. 2
adjustment, and the block-channel estimators behind RR-Joint / RR-Clusters."""
import numpy as np
import pytest
from scipy import stats
from tolerance import close

from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.castell import castell, castell_variance
from ldpstream.estimators.kernels.dependence import (
    contingency,
    cramers_v,
    cramers_v_table,
    dependence_matrix,
    pearson_abs,
    pearson_abs_table,
)
from ldpstream.estimators.kernels.joint_grr import (
    decode,
    encode,
    estimate_joint,
    estimate_submarginal,
    joint_channel,
    joint_channel_epsilon,
    joint_pq,
    randomize_joint,
    submarginal_pq,
)
from ldpstream.estimators.kernels.rr_adjustment import (
    adjusted_marginal,
    distinct_patterns,
    rr_adjustment,
    rr_adjustment_table,
)
from ldpstream.estimators.kernels.rr_clusters import (
    Block,
    castell_blocks,
    castell_blocks_variance,
    cluster_attributes,
    clusters_from_randomized,
    ibu_blocks,
    independent_blocks,
    truncated_blocks,
)

pytestmark = pytest.mark.core


# --- dependence ---------------------------------------------------------------------------------

def test_cramers_v_known_tables():
    assert cramers_v_table(np.array([[10, 0], [0, 10]])) == pytest.approx(1.0)
    assert cramers_v_table(np.outer([1, 2, 3], [4, 5])) == pytest.approx(0.0, abs=1e-12)
    t = np.array([[10, 20, 5], [30, 40, 25]])
    chi2 = stats.chi2_contingency(t, correction=False)[0]
    assert cramers_v_table(t) == pytest.approx(np.sqrt(chi2 / (t.sum() * 1)))
    # hand value: 2x2 [[10,20],[30,40]]: phi = (10*40-20*30)/sqrt(30*70*40*60)
    phi = (10 * 40 - 20 * 30) / np.sqrt(30 * 70 * 40 * 60)
    assert cramers_v_table(np.array([[10, 20], [30, 40]])) == pytest.approx(abs(phi))
    # empty rows/columns are ignored
    assert cramers_v_table(np.array([[10, 0, 0], [0, 0, 10], [0, 0, 0]])) == pytest.approx(1.0)


def test_pearson_matches_corrcoef():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 5, 5000)
    y = np.clip(x + rng.integers(-1, 2, 5000), 0, 5)
    assert pearson_abs(x, y) == pytest.approx(abs(np.corrcoef(x, y)[0, 1]), rel=1e-9)
    assert pearson_abs_table(np.array([[5, 0], [0, 5]])) == pytest.approx(1.0)
    assert pearson_abs_table(np.array([[5, 5], [0, 0]])) == 0.0  # constant row variable


def test_dependence_matrix_symmetric_and_kinds():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 4, 3000)
    X = np.stack([a, (a + (rng.random(3000) < 0.2)) % 4, rng.integers(0, 3, 3000)], axis=1)
    dn = dependence_matrix(X, (4, 4, 3))
    do = dependence_matrix(X, (4, 4, 3), kinds=["ordinal", "ordinal", "nominal"])
    assert np.allclose(dn, dn.T) and np.allclose(np.diag(dn), 1)
    assert dn[0, 1] == pytest.approx(cramers_v(X[:, 0], X[:, 1]))
    assert do[0, 1] == pytest.approx(pearson_abs(X[:, 0], X[:, 1]))
    assert do[0, 2] == pytest.approx(dn[0, 2])  # a mixed pair uses Cramér's V
    assert dn[0, 1] > 0.5 > 0.1 > dn[0, 2]
    assert contingency(X[:, 0], X[:, 2], 4, 3).sum() == 3000


# --- RR-Joint -----------------------------------------------------------------------------------

def test_joint_epsilon_and_channel_formula():
    eps = [0.5, 1.0, 2.0]
    shape = (2, 3, 2)
    assert joint_channel_epsilon(eps) == pytest.approx(3.5)
    p, q = joint_pq(eps, shape)
    size = 12
    assert p == pytest.approx(1 / (1 + (size - 1) * np.exp(-3.5)))
    assert q == pytest.approx(p * np.exp(-3.5))
    P = joint_channel(eps, shape)
    assert np.allclose(np.diag(P), p) and np.allclose(P[~np.eye(size, dtype=bool)], q)
    assert np.allclose(P.sum(axis=1), 1)
    assert ch.epsilon(P) == pytest.approx(sum(eps))  # computed from the entries = Σ ε
    with pytest.raises(ValueError):
        joint_channel_epsilon([1.0, 0.0])


def test_encode_decode_and_randomize_distribution():
    shape = (3, 2, 4)
    recs = np.array([[2, 1, 3], [0, 0, 0], [1, 1, 2]], dtype=np.uint8)
    assert np.array_equal(decode(encode(recs, shape), shape), recs)
    rng = np.random.default_rng(11)
    n = 120_000
    x = np.tile(recs[:1], (n, 1))
    y = randomize_joint(x, shape, 2.0, rng)
    assert y.dtype == np.uint8 and y.shape == x.shape
    freq = np.bincount(encode(y, shape), minlength=24)
    P = joint_channel(2.0, shape)
    expected = P[encode(recs[:1], shape)[0]] * n
    assert stats.chisquare(freq, expected).pvalue > 1e-4


def test_submarginal_is_induced_grr_and_estimates_agree():
    shape = (3, 2, 4)
    eps = [1.0, 0.5, 1.5]
    P = joint_channel(eps, shape)
    p, q = joint_pq(eps, shape)
    # induced channel on axes (0, 2): sum the joint channel's output columns over axis 1, any input
    ind = P.reshape(24, 3, 2, 4).sum(axis=2).reshape(24, 12)
    ps, qs = submarginal_pq(p, q, 24, 12)
    rows = encode(np.array([[u // 4, 0, u % 4] for u in range(12)]), shape)
    assert np.allclose(ind[rows], (ps - qs) * np.eye(12) + qs)
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 40, size=shape)
    full = estimate_joint(counts, p, q)
    assert full.sum() == pytest.approx(1.0)
    sub_a = estimate_submarginal(counts, eps, shape, keep=(2, 0))
    sub_b = estimate_submarginal(counts.sum(axis=1).T, eps, shape)
    assert np.allclose(sub_a, full.sum(axis=1).T) and np.allclose(sub_b, sub_a)


# --- Alg. 1 -------------------------------------------------------------------------------------

def test_clustering_merges_dependent_pair_only():
    rng = np.random.default_rng(5)
    n = 30_000
    a = rng.integers(0, 3, n)
    b = np.where(rng.random(n) < 0.8, a, rng.integers(0, 3, n))
    X = np.stack([a, rng.integers(0, 4, n), b, rng.integers(0, 2, n)], axis=1)
    sizes = (3, 4, 3, 2)
    # dependence is measured on RR-Independent randomized data
    Y = np.stack([ch.randomize(X[:, j], ch.grr(1.5, d), rng) for j, d in enumerate(sizes)], 1)
    clusters, dep = clusters_from_randomized(Y, sizes, max_cells=100, min_dependence=0.1)
    assert clusters == [(0, 2), (1,), (3,)]
    assert dep[0, 2] < dependence_matrix(X, sizes)[0, 2]  # RR attenuates dependence ...
    assert np.argmax(dep[0, 1:]) + 1 == 2  # ... but keeps its ranking
    assert clusters_from_randomized(Y, sizes, max_cells=8, min_dependence=0.1)[0] == \
        [(0,), (1,), (2,), (3,)]  # 3·3 = 9 cells > T_v
    assert clusters_from_randomized(Y, sizes, max_cells=100, min_dependence=0.9)[0] == \
        [(0,), (1,), (2,), (3,)]  # below T_d


def test_clustering_walk_and_recompute():
    dep = np.array([[1, .9, .1, .0], [.9, 1, .5, .0], [.1, .5, 1, .3], [.0, .0, .3, 1]])
    # after merging {0,1}, its dependence with 2 is max(.1, .5) = .5 -> merged next
    assert cluster_attributes(dep, (2, 2, 2, 2), 8, 0.2) == [(0, 1, 2), (3,)]
    # T_v = 4 forbids the triple; the walk goes on to the next qualifying pair (2, 3)
    assert cluster_attributes(dep, (2, 2, 2, 2), 4, 0.2) == [(0, 1), (2, 3)]
    # the top pair is too large (3·3 > 8) but (1, 2) fits
    assert cluster_attributes(dep, (3, 3, 2, 2), 8, 0.2) == [(0,), (1, 2), (3,)]


# --- Alg. 2 -------------------------------------------------------------------------------------

def test_rr_adjustment_example_1():
    """A constructed stand-in for [MDRR] Example 1 (NOT the paper's numbers, which were not
    available here): two binary attributes, randomized records 3×(0,0) and 1×(1,1), both through
    P = [[0.9, 0.1], [0.6, 0.4]] (ε = ln 4). The RR-Independent marginal estimates solve
    Pᵀπ = (¾, ¼): π = (½, ½) exactly. Alg. 2 gives each (0,0) record ⅙ and the (1,1) record ½:
    the adjusted joint is exactly [[½, 0], [0, ½]] (perfect dependence recovered, where the
    independence estimate would say ¼ everywhere)."""
    from fractions import Fraction as Fr
    P = np.array([[0.9, 0.1], [0.6, 0.4]])
    assert ch.epsilon(P) == pytest.approx(np.log(4))
    # the targets in exact arithmetic: Pᵀπ = (3/4, 1/4) with P in tenths → π = (1/2, 1/2)
    a, b, c, d, y0, y1 = Fr(9, 10), Fr(6, 10), Fr(1, 10), Fr(4, 10), Fr(3, 4), Fr(1, 4)
    det = a * d - b * c
    assert ((d * y0 - b * y1) / det, (a * y1 - c * y0) / det) == (Fr(1, 2), Fr(1, 2))
    records = np.array([[0, 0]] * 3 + [[1, 1]])
    patterns, counts, inverse = distinct_patterns(records, (2, 2))
    assert patterns.tolist() == [[0, 0], [1, 1]] and counts.tolist() == [3, 1]
    # the float inversion lands on ½ to the last bit (1 ulp)
    targets = [castell(np.bincount(records[:, j], minlength=2), [P]) for j in range(2)]
    assert np.abs(np.array(targets) - 0.5).max() <= 2 ** -53
    # Alg. 2 on the exact targets: exactly ⅙ per (0,0) record, ½ for the (1,1) record, joint
    # exactly ½, 0, 0, ½
    half = [np.array([0.5, 0.5])] * 2
    res = rr_adjustment(patterns, counts, half)
    assert res.converged and res.iterations == 1 and res.gap == 0.0
    assert (res.weights / counts).tolist() == [1 / 6, 1 / 2]
    joint = adjusted_marginal(patterns, res.weights, [0, 1], (2, 2))
    assert joint.tolist() == [[0.5, 0.0], [0.0, 0.5]]
    table, _ = rr_adjustment_table(np.array([[3, 0], [0, 1]]), half)
    assert table.tolist() == [[0.5, 0.0], [0.0, 0.5]]
    # and on the float targets: the zeros stay exact, the diagonal is ½ to 1 ulp
    res = rr_adjustment(patterns, counts, targets)
    assert res.converged and res.iterations == 1
    joint = adjusted_marginal(patterns, res.weights, [0, 1], (2, 2))
    assert joint[0, 1] == 0.0 and joint[1, 0] == 0.0
    assert np.abs(np.diag(joint) - 0.5).max() <= 2 ** -53


def test_rr_adjustment_matches_targets_and_joint_targets():
    rng = np.random.default_rng(2)
    X = rng.integers(0, [3, 4, 2], size=(5000, 3))
    patterns, counts, inv = distinct_patterns(X, (3, 4, 2))
    p2, c2, _ = distinct_patterns(X)  # np.unique(axis=0) path gives the same
    assert np.array_equal(patterns, p2) and np.array_equal(counts, c2)
    assert np.array_equal(patterns[inv], X)
    t = [np.array([.2, .3, .5]), np.array([.1, .2, .3, .4]), np.array([.6, .4])]
    res = rr_adjustment(patterns, counts, t, tol=1e-11)
    assert res.converged
    for j in range(3):
        assert close(adjusted_marginal(patterns, res.weights, [j], [len(t[j])]), t[j], rel=1e-10)
    joint = np.array([[.1, .1], [.2, .1], [.3, .2]])
    res2 = rr_adjustment(patterns, counts, [((0, 2), joint), ((1,), t[1])], tol=1e-11)
    assert res2.converged
    assert close(adjusted_marginal(patterns, res2.weights, [0, 2], (3, 2)), joint, rel=1e-10)
    with pytest.raises(ValueError):
        rr_adjustment(patterns, counts, [np.array([1.2, -0.2, 0.0]), t[1], t[2]])


def test_rr_adjustment_infeasible_targets_stop_at_fixed_point():
    # y1 = 1 only occurs with y0 = 1, which the first target sets to 0: the second target's
    # (½, ½) cannot be met; the raking stops at its fixed point and reports the gap
    res = rr_adjustment(np.array([[0, 0], [1, 1]]), np.array([5, 5]),
                        [np.array([1.0, 0.0]), np.array([0.5, 0.5])])
    assert res.converged and res.iterations <= 3
    assert res.weights.tolist() == [1.0, 0.0] and res.gap == pytest.approx(0.5)


# --- block channels (RR-Joint / RR-Clusters estimation) ----------------------------------------

def _blocks_and_dense(rng):
    b1 = Block.grr(*joint_pq(1.0, 6), 6)           # a 6-cell block of a product GRR
    b2 = Block.dense(ch.warner(0.6, 3))            # a singleton with its own matrix
    counts = rng.integers(0, 60, size=(6, 3)).astype(float)
    return [b1, b2], [b1.to_matrix(), b2.to_matrix()], counts


def test_block_castell_and_variance_equal_dense_castell():
    rng = np.random.default_rng(8)
    blocks, dense, counts = _blocks_and_dense(rng)
    assert np.allclose(castell_blocks(counts, blocks), castell(counts, dense))
    assert np.allclose(castell_blocks_variance(counts, blocks), castell_variance(counts, dense))


def test_block_truncated_and_independent():
    rng = np.random.default_rng(9)
    blocks, dense, counts = _blocks_and_dense(rng)
    raw = castell_blocks(counts, blocks)
    tr = truncated_blocks(raw)
    assert np.all(tr >= 0) and np.all(tr <= np.clip(raw, 0, None) + 1e-15)
    from ldpstream.estimators.kernels.truncated import truncated
    assert np.allclose(tr, truncated(counts, dense))
    ind = independent_blocks(counts, blocks)
    assert ind.sum() == pytest.approx(1.0) and np.all(ind >= 0)
    from ldpstream.estimators.kernels.rr_independent import rr_independent
    assert np.allclose(ind, rr_independent(counts, dense))


def test_block_ibu_is_a_fixed_point_of_em():
    rng = np.random.default_rng(10)
    blocks, dense, counts = _blocks_and_dense(rng)
    r = ibu_blocks(counts, blocks, tol=1e-14, max_iter=200000)
    assert r.converged and r.estimate.sum() == pytest.approx(1.0) and np.all(r.estimate >= 0)
    K = np.kron(dense[0], dense[1])
    lam = counts.ravel() / counts.sum()
    pi = r.estimate.ravel()
    step = pi * (K @ (lam / (K.T @ pi)))
    assert close(step, pi, rel=1e-6)
    # the dense-matrix IBU (SQUAREM) reaches the same maximum likelihood
    from ldpstream.estimators.kernels.ibu import ibu
    assert np.allclose(ibu(counts, dense, tol=1e-14, max_iter=200000).estimate, r.estimate,
                       atol=1e-4)
    # when the unbiased estimate is already proper, the MLE is that estimate
    truth = np.full((6, 3), 1 / 18)
    exact = (K.T @ truth.ravel()).reshape(6, 3) * 1e6
    assert close(ibu_blocks(exact, blocks, tol=1e-15).estimate, truth, rel=1e-6)
