"""Privacy audit of the channels (docs/mechanisms.md §1): the ε a channel was built for equals the ε
computed from its matrix; invalid matrices are rejected with clear messages; ``randomize``
follows every row of P (χ² goodness of fit) on the GRR fast path and the inverse-CDF path."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare
from tolerance import assert_close

from ldpstream.datasets import load_csv
from ldpstream.estimators.kernels import channels
from ldpstream.estimators.kernels.channels import epsilon, epsilon_of_report, grr, grr_pq, randomize, validate, warner

pytestmark = pytest.mark.core


def ldp_epsilon_brute_force(P: np.ndarray) -> float:
    """The LDP definition directly: max over outputs v and input pairs (u, u') of
    ln(P[u,v] / P[u',v])."""
    d = P.shape[0]
    best = 0.0
    for v in range(d):
        for u, u2 in itertools.product(range(d), repeat=2):
            if P[u, v] > 0 and P[u2, v] == 0:
                return float("inf")
            if P[u, v] > 0:
                best = max(best, float(np.log(P[u, v] / P[u2, v])))
    return best


def random_user_channel(rng: np.random.Generator, d: int) -> np.ndarray:
    P = rng.random((d, d)) + 0.3 * np.eye(d)
    return P / P.sum(axis=1, keepdims=True)


def is_grr_shaped(P: np.ndarray) -> bool:
    d = P.shape[0]
    off = ~np.eye(d, dtype=bool)
    return bool(np.allclose(np.diag(P), P[0, 0]) and np.allclose(P[off], P[0, 1]))


@pytest.mark.parametrize("eps", [0.05, 0.5, 1.0, float(np.log(3)), 2.0, 4.0, 8.0])
@pytest.mark.parametrize("d", [2, 3, 7, 16, 100])
def test_grr_declared_epsilon_is_the_computed_epsilon(eps, d):
    P = grr(eps, d)
    assert P.shape == (d, d)
    assert_close(P.sum(axis=1), 1.0, rel=1e-15)
    assert epsilon(P) == pytest.approx(eps, rel=1e-12)
    p, q = grr_pq(eps, d)
    assert p == pytest.approx(np.exp(eps) / (np.exp(eps) + d - 1), rel=1e-15)
    assert q == pytest.approx(1 / (np.exp(eps) + d - 1), rel=1e-15)


@pytest.mark.parametrize("p", [0.01, 0.2, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("d", [2, 5, 12])
def test_warner_declared_epsilon_is_the_computed_epsilon(p, d):
    P = warner(p, d)
    declared = np.log((p + (1 - p) / d) / ((1 - p) / d))
    assert epsilon(P) == pytest.approx(declared, rel=1e-12)
    assert ldp_epsilon_brute_force(P) == pytest.approx(declared, rel=1e-12)


def test_warner_keep_all_is_not_private():
    assert epsilon(warner(1.0, 3)) == float("inf")


def test_user_matrices_epsilon_matches_the_definition():
    rng = np.random.default_rng(0)
    for d in (2, 3, 5, 8):
        for _ in range(5):
            P = random_user_channel(rng, d)
            assert epsilon(P) == pytest.approx(ldp_epsilon_brute_force(P), rel=1e-12)
    P = np.array([[0.8, 0.2], [0.3, 0.7]])  # by hand: max(ln(.8/.3), ln(.7/.2)) = ln 3.5
    assert epsilon(P) == pytest.approx(np.log(3.5), rel=1e-12)
    Z = np.array([[1.0, 0.0], [0.5, 0.5]])  # a zero next to a positive entry: no privacy
    assert epsilon(Z) == float("inf") == ldp_epsilon_brute_force(Z)


def test_sequential_composition():
    chans = [grr(1.0, 3), grr(0.5, 4), warner(0.5, 2)]
    assert epsilon_of_report(chans) == pytest.approx(1.5 + np.log((0.75) / 0.25), rel=1e-12)


@pytest.mark.parametrize("matrix,message", [
    (np.full((2, 3), 1 / 3), "square"),
    (np.array([[0.6, 0.6], [0.5, 0.5]]), "rows must sum to 1"),
    (np.array([[0.5, 0.5], [0.5, 0.5]]), "singular"),
    (np.array([[1.2, -0.2], [0.3, 0.7]]), "non-negative"),
    (np.array([[np.nan, 1.0], [0.3, 0.7]]), "finite"),
    (np.array([[1.0]]), "at least 2"),
])
def test_validate_rejects_with_clear_messages(matrix, message):
    with pytest.raises(ValueError, match=message):
        validate(matrix)


def test_validate_accepts_and_checks_the_domain_size():
    P = np.array([[0.8, 0.2], [0.3, 0.7]])
    np.testing.assert_array_equal(validate(P), P)
    with pytest.raises(ValueError, match="attribute has 3 values"):
        validate(P, d=3)


N_PER_ROW = 20000


@pytest.mark.parametrize("name,P", [
    ("grr", grr(1.0, 5)),
    ("grr-high-eps", grr(6.0, 3)),
    ("warner", warner(0.4, 4)),
    ("user", np.array([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3], [0.25, 0.25, 0.5]])),
    ("user-random", random_user_channel(np.random.default_rng(9), 6)),
])
@pytest.mark.parametrize("dtype", [np.int64, np.uint8])
def test_randomize_follows_every_row_chi_square(name, P, dtype):
    """For each input u, the outputs of N reports with X = u match P[u] (χ², p > 1e-3, fixed
    seed). GRR and Warner matrices take the keep-or-shift fast path, the others inverse-CDF."""
    assert is_grr_shaped(P) == (name in ("grr", "grr-high-eps", "warner"))
    rng = np.random.default_rng(12345)
    d = P.shape[0]
    x = np.repeat(np.arange(d), N_PER_ROW).astype(dtype)
    rng.shuffle(x)
    y = randomize(x, P, rng)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert y.min() >= 0 and y.max() < d
    for u in range(d):
        obs = np.bincount(y[x == u], minlength=d)
        exp = N_PER_ROW * P[u]
        keep = exp > 0
        assert obs[~keep].sum() == 0
        stat, pval = chisquare(obs[keep], exp[keep])
        assert pval > 1e-3, (name, u, obs, exp)


def test_randomize_a_million_records_of_eight_attributes():
    """Vectorized sanity (no timing asserted): 1,000,000 × 8 Adult-shaped records through GRR
    (fast path) and one general channel (inverse-CDF path)."""
    ds = load_csv()
    rng = np.random.default_rng(1)
    n = 1_000_000
    records = ds.records[rng.integers(0, ds.n, size=n)]
    eps = 1.0
    out = np.empty_like(records)
    for i, d in enumerate(ds.domain.shape):
        out[:, i] = randomize(records[:, i], grr(eps, d), rng)
    assert out.shape == (n, 8) and out.dtype == records.dtype
    assert np.all(out.max(axis=0) < np.array(ds.domain.shape))
    for i, d in enumerate(ds.domain.shape):
        kept = np.mean(out[:, i] == records[:, i])
        p, _ = grr_pq(eps, d)
        assert kept == pytest.approx(p, abs=5 * np.sqrt(p * (1 - p) / n))
    general = random_user_channel(rng, ds.domain.shape[-1])
    y = randomize(records[:, -1], general, rng)
    assert y.shape == (n,) and y.max() < ds.domain.shape[-1]


def test_module_doctest():
    import doctest
    assert doctest.testmod(channels).failed == 0


def _inverse_cdf_reference(x, P, rng):
    """The general path written out: one uniform per value against the row's cumulative sums."""
    cum = np.cumsum(P, axis=1)
    cum[:, -1] = 1.0
    u = rng.random(x.shape)
    return (u[:, None] >= cum[x][:, :-1]).sum(axis=1)


def _keep_or_shift_reference(x, p, d, rng):
    keep = rng.random(x.shape) < p
    other = rng.integers(0, d - 1, size=x.shape, dtype=x.dtype)
    return np.where(keep, x, other + (other >= x))


@pytest.mark.parametrize("d", [2, 3, 6])
def test_near_grr_matrix_is_sampled_by_its_own_rows(d):
    """A user matrix within 1e-9 of GRR is not GRR: ``randomize`` must sample it through the
    inverse-CDF path (same seed → the same draws as the written-out general path), while an exact
    GRR keeps the keep-or-shift fast path."""
    x = np.random.default_rng(1).integers(0, d, 5000).astype(np.int64)
    P = grr(1.0, d)
    near = P.copy()
    near[0, 0] += 1e-9
    near[0, 1] -= 1e-9
    near = validate(near)
    assert np.allclose(near, P)  # what the old test (np.allclose) could not tell apart
    got = randomize(x, near, np.random.default_rng(7))
    assert np.array_equal(got, _inverse_cdf_reference(x, near, np.random.default_rng(7)))
    fast = randomize(x, P, np.random.default_rng(7))
    assert np.array_equal(fast, _keep_or_shift_reference(x, P[0, 0], d, np.random.default_rng(7)))
    # perturbing an off-diagonal entry only (the diagonal stays constant) is not GRR either
    off = P.copy()
    off[1, 0] += 1e-9
    off[1, d - 1] -= 1e-9
    got = randomize(x, off, np.random.default_rng(8))
    assert np.array_equal(got, _inverse_cdf_reference(x, off, np.random.default_rng(8)))
