"""truncated [Castell Alg. 4], rr-independent [Alg. 2], hybrid (bound rule) and hybrid-auto."""
from __future__ import annotations

import doctest

import numpy as np
import pytest
from tolerance import assert_close

from ldpstream.estimators.kernels import hybrid as hybrid_mod
from ldpstream.estimators.kernels import rr_independent as rri_mod
from ldpstream.estimators.kernels import truncated as truncated_mod
from ldpstream.estimators.kernels.castell import castell
from ldpstream.estimators.kernels.channels import grr, randomize
from ldpstream.estimators.kernels.hybrid import auto_errors, hybrid, hybrid_auto, hybrid_bounds
from ldpstream.estimators.kernels.proper import clip_rescale
from ldpstream.estimators.kernels.rr_independent import marginal_estimates, rr_independent
from ldpstream.estimators.kernels.truncated import lower_level, truncated
from ldpstream.estimators.mechanism import histogram

pytestmark = pytest.mark.core

APPENDIX_B = np.array([[3, 1], [3, 3]])


def test_doctests():
    for mod in (truncated_mod, rri_mod, hybrid_mod):
        assert doctest.testmod(mod).failed == 0


def test_appendix_b_truncated_and_rr_independent():
    P = grr(np.log(3), 2)
    assert_close(castell(APPENDIX_B, [P, P]), [[0.45, -0.15], [0.25, 0.45]], rel=1e-12)
    t = truncated(APPENDIX_B, [P, P])
    assert_close(t, [[0.3, 0.0], [0.25, 0.3]], rel=1e-12)
    assert t.sum() == pytest.approx(0.85)  # not renormalised
    # marginals: A = (0.3, 0.7), B = (0.7, 0.3)
    assert_close(rr_independent(APPENDIX_B, [P, P]), np.outer([0.3, 0.7], [0.7, 0.3]), rel=1e-12)


def random_case(rng, shape, n=300, eps=0.7):
    chans = [grr(eps, d) for d in shape]
    records = np.stack([rng.integers(0, d, size=n) for d in shape], axis=1)
    y = np.stack([randomize(records[:, i], P, rng) for i, P in enumerate(chans)], axis=1)
    return histogram(y, tuple(range(len(shape))), shape), chans


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (3, 2, 2, 3)])
def test_truncated_never_above_the_lower_level_nor_the_clipped_estimate(shape):
    rng = np.random.default_rng(sum(shape))
    for _ in range(5):
        counts, chans = random_case(rng, shape)
        t = truncated(counts, chans)
        assert t.shape == shape
        assert np.all(t >= 0)
        assert np.all(t <= np.maximum(castell(counts, chans), 0) + 1e-15)
        for i in range(len(shape)):
            low = lower_level(counts, chans, i)
            assert low.shape[i] == 1 and np.all(low >= 0)
            assert np.all(t <= low + 1e-15)
        # and it is exactly the min of those caps (Alg. 4 in one expression)
        caps = [np.maximum(castell(counts, chans), 0)] + [np.broadcast_to(
            lower_level(counts, chans, i), shape) for i in range(len(shape))]
        np.testing.assert_array_equal(t, np.minimum.reduce(caps))


def test_truncated_w1_is_the_clipped_estimate():
    P = grr(0.5, 4)
    counts = np.array([10, 0, 0, 1])
    np.testing.assert_array_equal(truncated(counts, [P]), np.maximum(castell(counts, [P]), 0))
    assert np.any(castell(counts, [P]) < 0)


def test_rr_independent_is_a_product_of_repaired_marginals():
    rng = np.random.default_rng(8)
    counts, chans = random_case(rng, (3, 4, 2), n=200, eps=0.3)
    est = rr_independent(counts, chans)
    assert np.all(est >= 0) and est.sum() == pytest.approx(1.0)
    margins = marginal_estimates(counts, chans)
    for i, m in enumerate(margins):
        axes = tuple(k for k in range(3) if k != i)
        assert_close(est.sum(axis=axes), m, rel=1e-12)
        raw = castell(counts.sum(axis=axes), [chans[i]])
        assert_close(m, clip_rescale(raw), rel=1e-15)


def test_hybrid_bounds_hand_values():
    # d = 2, w = 2, ε = ln 3 per attribute: (1 + 1/3)² · 4 / 10 and max(1/4, 1/2 − 1/4)
    cb, rb = hybrid_bounds((2, 2), 10, [np.log(3)] * 2)
    assert cb == pytest.approx((4 / 3) ** 2 * 4 / 10)
    assert rb == pytest.approx(0.25)
    # mixed sizes use d = max d_i; unequal ε enter as a product of per-attribute factors
    cb, rb = hybrid_bounds((2, 5), 1000, [1.0, 2.0])
    assert cb == pytest.approx((1 + 4 * np.exp(-1)) * (1 + 4 * np.exp(-2)) * 25 / 1000)
    assert rb == pytest.approx(max(1 / 25, 1 / 5 - 1 / 25))
    with pytest.raises(ValueError, match="2 attributes but 1 epsilons"):
        hybrid_bounds((2, 2), 10, [1.0])
    with pytest.raises(ValueError, match="finite number > 0"):
        hybrid_bounds((2, 2), 10, [1.0, 0.0])


def test_hybrid_bound_rule_switches_with_n():
    P = grr(2.0, 3)
    small = np.full((3, 3), 2)
    big = np.full((3, 3), 20000)
    est, name = hybrid(small, [P, P], [2.0, 2.0])
    assert name == "rr-independent"
    np.testing.assert_allclose(est, rr_independent(small, [P, P]))
    est, name = hybrid(big, [P, P], [2.0, 2.0])
    assert name == "castell"
    np.testing.assert_allclose(est, castell(big, [P, P]))


def _records(rng, n, dependent):
    a = rng.integers(0, 3, size=n)
    b = a.copy() if dependent else rng.integers(0, 3, size=n)
    return np.stack([a, b], axis=1)


def test_hybrid_auto_prefers_castell_on_strong_dependence_and_many_reports():
    rng = np.random.default_rng(21)
    chans = [grr(3.0, 3), grr(3.0, 3)]
    x = _records(rng, 50000, dependent=True)
    y = np.stack([randomize(x[:, i], chans[i], rng) for i in range(2)], axis=1)
    counts = histogram(y, (0, 1), (3, 3))
    est, name = hybrid_auto(counts, chans)
    assert name == "castell"
    e = auto_errors(counts, chans)
    assert e["bias2"] > 10 * e["castell_err"]  # independence is far off: A = B


def test_hybrid_auto_prefers_rr_independent_on_independent_noisy_data():
    rng = np.random.default_rng(22)
    chans = [grr(0.3, 3), grr(0.3, 3)]
    x = _records(rng, 500, dependent=False)
    y = np.stack([randomize(x[:, i], chans[i], rng) for i in range(2)], axis=1)
    counts = histogram(y, (0, 1), (3, 3))
    est, name = hybrid_auto(counts, chans)
    assert name == "rr-independent"
    np.testing.assert_allclose(est, rr_independent(counts, chans))


def test_hybrid_auto_error_estimate_tracks_the_real_error():
    """Over seeded runs, the estimated castell error (Σ var) is within 30% of the mean real
    squared error, and hybrid-auto's real error is not worse than the worse of the two."""
    rng = np.random.default_rng(23)
    chans = [grr(1.0, 3), grr(1.0, 4)]
    n = 4000
    a = rng.integers(0, 3, size=n)
    b = np.where(rng.random(n) < 0.5, a, rng.integers(0, 4, size=n))
    x = np.stack([a, b], axis=1)
    truth = histogram(x, (0, 1), (3, 4)) / n
    est_err, real_c, real_i, real_auto = [], [], [], []
    for _ in range(60):
        y = np.stack([randomize(x[:, i], chans[i], rng) for i in range(2)], axis=1)
        counts = histogram(y, (0, 1), (3, 4))
        e = auto_errors(counts, chans)
        est_err.append(e["castell_err"])
        real_c.append(np.square(e["castell"] - truth).sum())
        real_i.append(np.square(e["rr-independent"] - truth).sum())
        real_auto.append(np.square(hybrid_auto(counts, chans)[0] - truth).sum())
    assert np.mean(est_err) == pytest.approx(np.mean(real_c), rel=0.3)
    assert np.mean(real_auto) <= max(np.mean(real_c), np.mean(real_i))
