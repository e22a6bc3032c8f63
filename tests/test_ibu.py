"""IBU / EM with SQUAREM: proper output, monotone log-likelihood, convergence to the MLE, the
consistent support (docs/estimators.md, "IBU over the consistent support")."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from tolerance import assert_close

from ldpstream.datasets import load_csv
from ldpstream.estimators.kernels.castell import castell, mode_product
from ldpstream.estimators.kernels.channels import grr, randomize
from ldpstream.estimators.kernels.ibu import (
    MAX_AMPLIFICATION,
    IBUResult,
    amplification,
    consistent_support,
    ibu,
)
from ldpstream.estimators.kernels.metrics import tvd
from ldpstream.estimators.kernels.truncated import truncated
from ldpstream.estimators.mechanism import histogram

pytestmark = pytest.mark.core


def loglik(pi, counts, chans):
    q = pi
    for k, P in enumerate(chans):
        q = mode_product(q, P, k)
    m = counts > 0
    return float(np.sum(counts[m] * np.log(q[m])))


def sparse_case(seed=0, shape=(4, 5, 3, 4), n=400, eps=0.8):
    rng = np.random.default_rng(seed)
    chans = [grr(eps, d) for d in shape]
    # concentrated truth: few distinct records, many empty cells
    support = np.stack([rng.integers(0, d, size=12) for d in shape], axis=1)
    x = support[rng.integers(0, 12, size=n)]
    y = np.stack([randomize(x[:, i], P, rng) for i, P in enumerate(chans)], axis=1)
    return histogram(y, tuple(range(len(shape))), shape), chans


def assert_monotone(trace):
    assert np.all(np.diff(trace) >= -1e-12 * np.abs(trace[:-1]))


@pytest.mark.parametrize("accelerate", [True, False])
@pytest.mark.parametrize("init", ["castell", "uniform"])
def test_proper_and_monotone(accelerate, init):
    counts, chans = sparse_case(seed=1)
    res = ibu(counts, chans, accelerate=accelerate, init=init, max_iter=3000)
    assert isinstance(res, IBUResult)
    assert res.estimate.shape == counts.shape
    assert np.all(res.estimate >= 0)
    assert res.estimate.sum() == pytest.approx(1.0, rel=1e-12)
    assert len(res.loglik) >= 2
    assert_monotone(res.loglik)
    # the recorded trace is the true log-likelihood, and the estimate is at least as good
    assert loglik(res.estimate, counts, chans) >= res.loglik[-1] - 1e-9 * abs(res.loglik[-1])


def test_every_iteration_is_monotone_even_when_capped():
    counts, chans = sparse_case(seed=2, n=150, eps=0.3)
    for cap in (1, 2, 3, 5, 8, 13):
        res = ibu(counts, chans, max_iter=cap, tol=1e-30)
        assert res.iterations <= cap and not res.converged
        assert_monotone(res.loglik)


def test_result_is_frozen():
    counts, chans = sparse_case(seed=3)
    res = ibu(counts, chans)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.iterations = 0  # type: ignore[misc]  # the write must fail


def test_converges_to_castell_when_castell_is_interior():
    """With many reports and a full-support truth the Castell estimate is positive, so it is the
    unconstrained maximiser of the likelihood: IBU must land on it."""
    rng = np.random.default_rng(4)
    shape = (3, 4)
    chans = [grr(2.0, 3), grr(2.0, 4)]
    pi = rng.dirichlet(np.full(12, 5.0)).reshape(shape)
    cells = np.array([(a, b) for a in range(3) for b in range(4)])
    x = cells[rng.choice(12, size=200000, p=pi.reshape(-1))]
    y = np.stack([randomize(x[:, i], chans[i], rng) for i in range(2)], axis=1)
    counts = histogram(y, (0, 1), shape)
    c = castell(counts, chans)
    assert np.all(c > 0)
    for accelerate in (True, False):
        res = ibu(counts, chans, tol=1e-13, accelerate=accelerate)
        assert res.converged
        assert_close(res.estimate, c, rel=2e-5)


def test_squarem_reaches_a_higher_likelihood_with_fewer_evaluations():
    counts, chans = sparse_case(seed=5, shape=(5, 6, 4, 3), n=600, eps=1.0)
    fast = ibu(counts, chans, tol=1e-10, max_iter=20000)
    slow = ibu(counts, chans, tol=1e-10, max_iter=20000, accelerate=False)
    assert fast.converged
    assert fast.iterations < slow.iterations
    assert fast.loglik[-1] >= slow.loglik[-1] - 1e-9 * abs(slow.loglik[-1])
    # both found (nearly) the same maximum
    assert tvd(fast.estimate, slow.estimate) < 0.05


def test_array_init_and_errors():
    counts, chans = sparse_case(seed=6)
    start = castell(counts, chans)
    res = ibu(counts, chans, init=start)
    assert res.converged and np.all(res.estimate >= 0)
    with pytest.raises(ValueError, match="init must be"):
        ibu(counts, chans, init="random")
    with pytest.raises(ValueError, match="init has shape"):
        ibu(counts, chans, init=np.ones(3))
    with pytest.raises(ValueError, match="all zero"):
        ibu(np.zeros_like(counts), chans)
    with pytest.raises(ValueError, match="max_iter"):
        ibu(counts, chans, max_iter=0)


def test_adult_high_way_marginals_converge():
    """Adult, ε = 4 and ε = 4/8 per attribute: a 5-way and a 6-way marginal converge within the
    default cap (the full measurement is in docs/estimators.md)."""
    ds = load_csv()
    rng = np.random.default_rng(0)
    for eps in (4.0, 0.5):
        chans = [grr(eps, d) for d in ds.domain.shape]
        y = np.stack([randomize(ds.records[:, i], chans[i], rng) for i in range(len(chans))],
                     axis=1)
        for attrs in ((0, 2, 4, 6, 7), (2, 4, 5, 6, 7, 0)):
            shape = tuple(ds.domain.shape[i] for i in attrs)
            counts = histogram(y, attrs, shape)
            res = ibu(counts, [chans[i] for i in attrs])
            assert res.converged, (eps, attrs, res.iterations)
            assert_monotone(res.loglik)
            truth = histogram(ds.records, attrs, shape) / ds.n
            if eps == 4.0:  # far better than the clipped inverse at this w
                c = np.maximum(castell(counts, [chans[i] for i in attrs]), 0)
                assert tvd(res.estimate, truth) < tvd(c / c.sum(), truth)


def sparse_truth_case(seed, shape=(4, 5, 3, 4), n=2000, eps=4.0, k=12):
    """Reports of a sparse truth (k occupied cells of 240) through GRR(ε) channels, and the
    truth itself."""
    rng = np.random.default_rng(seed)
    chans = [grr(eps, d) for d in shape]
    support = np.stack([rng.integers(0, d, size=k) for d in shape], axis=1)
    x = support[rng.choice(k, size=n, p=rng.dirichlet(np.ones(k)))]
    axes = tuple(range(len(shape)))
    y = np.stack([randomize(x[:, i], P, rng) for i, P in enumerate(chans)], axis=1)
    return histogram(y, axes, shape), chans, histogram(x, axes, shape) / n


@pytest.mark.parametrize("seed", range(4))
def test_consistent_support_beats_the_plain_mle_on_a_sparse_table(seed):
    counts, chans, truth = sparse_truth_case(seed)
    new, plain = ibu(counts, chans), ibu(counts, chans, support="all")
    assert tvd(new.estimate, truth) < tvd(plain.estimate, truth)
    # still a distribution, a converged MLE over its support, with an honest trace
    assert np.all(new.estimate >= 0)
    assert new.estimate.sum() == pytest.approx(1.0, rel=1e-12)
    assert new.converged
    assert_monotone(new.loglik)
    keep = truncated(counts, chans) > 0
    assert new.cells == int(keep.sum()) < counts.size == plain.cells
    assert np.all(new.estimate[~keep] == 0)


def test_noisy_channels_leave_every_cell_free():
    """At ε = 0.5 per attribute the channels amplify noise far beyond the limit: the default is
    the plain MLE, to the last bit."""
    counts, chans, _ = sparse_truth_case(0, eps=0.5)
    assert amplification(chans) > MAX_AMPLIFICATION
    assert consistent_support(counts, chans) is None
    new, plain = ibu(counts, chans), ibu(counts, chans, support="all")
    assert new.cells == plain.cells == counts.size
    assert np.array_equal(new.estimate, plain.estimate)


def test_amplification_of_grr_is_the_product_of_one_over_p_minus_q():
    eps, ds = (4.0, 1.0, 0.5), (16, 2, 7)
    expected = np.prod([(np.exp(e) + d - 1) / (np.exp(e) - 1) for e, d in zip(eps, ds)])
    assert amplification([grr(e, d) for e, d in zip(eps, ds)]) == pytest.approx(expected,
                                                                                 rel=1e-9)


def test_support_errors():
    counts, chans = sparse_case(seed=7)
    with pytest.raises(ValueError, match="support must be one of consistent, all, got 'cells'"):
        ibu(counts, chans, support="cells")
