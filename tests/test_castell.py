"""Castell (RR-Ind-Joint) estimator: equality with the Kronecker baselines, the [Castell]
Appendix B example, unbiasedness and the closed-form variance by seeded Monte Carlo, and a smoke
run of ``ldpstream bench castell --quick``."""
from __future__ import annotations

import doctest
import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest
from tolerance import assert_close

from ldpstream.estimators.kernels import castell as castell_mod
from ldpstream.estimators.kernels.castell import (
    apply_modes,
    castell,
    castell_naive,
    castell_reduced,
    castell_variance,
    expected_tvd,
    mode_product,
)
from ldpstream.estimators.kernels.channels import grr, randomize
from ldpstream.estimators.mechanism import histogram

pytestmark = pytest.mark.core


def random_channel(rng: np.random.Generator, d: int) -> np.ndarray:
    """A random non-singular row-stochastic matrix that is not GRR-shaped."""
    P = rng.random((d, d)) + 0.5 * np.eye(d)
    return P / P.sum(axis=1, keepdims=True)


def test_doctests():
    assert doctest.testmod(castell_mod).failed == 0


@pytest.mark.parametrize("w", [1, 2, 3, 4, 5])
def test_castell_equals_naive_and_reduced(w):
    rng = np.random.default_rng(100 + w)
    for _ in range(3):
        shape = tuple(int(s) for s in rng.integers(2, 6, size=w))
        counts = rng.integers(0, 50, size=shape)
        counts.flat[0] += 1
        chans = [random_channel(rng, d) for d in shape]
        fast = castell(counts, chans)
        naive = castell_naive(counts, chans)
        reduced = castell_reduced(counts, chans)
        assert fast.shape == shape
        assert_close(fast, naive, rel=1e-9)
        assert_close(reduced, naive, rel=1e-9)
        assert fast.sum() == pytest.approx(1.0, rel=1e-12)


def test_castell_inverts_the_forward_channel_exactly():
    # Λ = n·(Π ×₁ P₁ … ×_w P_w) exactly (no noise) must give back Π.
    rng = np.random.default_rng(7)
    shape = (3, 2, 4, 5)
    pi = rng.dirichlet(np.ones(int(np.prod(shape)))).reshape(shape)
    chans = [random_channel(rng, d) for d in shape]
    lam = pi
    for k, P in enumerate(chans):
        lam = mode_product(lam, P, k)
    assert_close(castell(1000.0 * lam, chans), pi, rel=1e-12)


@pytest.mark.parametrize("shape,axis", [((4,), 0), ((3, 5), 0), ((3, 5), 1), ((2, 3, 4), 1),
                                        ((2, 3, 4, 5), 2), ((2, 3, 4, 5), -1)])
def test_mode_product_matches_einsum(shape, axis):
    rng = np.random.default_rng(3)
    T = rng.normal(size=shape)
    ax = axis % len(shape)
    M = rng.normal(size=(shape[ax], 6))  # not square: output axis has 6 entries
    letters = "abcdefgh"[: len(shape)]
    out_letters = letters[:ax] + "z" + letters[ax + 1:]
    expected = np.einsum(f"{letters},{letters[ax]}z->{out_letters}", T, M)
    assert_close(mode_product(T, M, axis), expected, rel=1e-12)


def test_apply_modes_buffers_scale_and_dtypes():
    rng = np.random.default_rng(5)
    for w in (1, 2, 3, 4):
        shape = tuple(int(s) for s in rng.integers(2, 5, size=w))
        T = rng.normal(size=shape)
        mats = [rng.normal(size=(d, d)) for d in shape]
        ref = T
        for k, M in enumerate(mats):
            ref = mode_product(ref, M, k)
        assert_close(apply_modes(T, mats), ref, rel=1e-12)
        out, buf = np.empty(T.size), np.empty(T.size)
        assert_close(apply_modes(T, mats, out=out, buf=buf), ref, rel=1e-12)
        assert_close(apply_modes(T, mats, scale=0.25), 0.25 * ref, rel=1e-12)
        # non-contiguous float input and integer input go through the blockwise conversion
        Tt = np.asfortranarray(T)
        assert_close(apply_modes(Tt, mats), ref, rel=1e-12)
        C = rng.integers(0, 9, size=shape)
        refc = C.astype(float)
        for k, M in enumerate(mats):
            refc = mode_product(refc, M, k)
        assert_close(apply_modes(C, mats), refc, rel=1e-9)


def test_apply_modes_large_integer_input_spans_several_blocks():
    rng = np.random.default_rng(6)
    shape = (7, 40, 30, 50)  # 420,000 cells: several conversion blocks, BLAS thread limit on
    C = rng.integers(0, 5, size=shape).astype(np.int32)
    mats = [rng.normal(size=(d, d)) for d in shape]
    ref = C.astype(float)
    for k, M in enumerate(mats):
        ref = mode_product(ref, M, k)
    assert_close(apply_modes(C, mats, scale=2.0), 2.0 * ref, rel=1e-8)


def test_appendix_b_worked_example():
    P = grr(np.log(3), 2)
    est = castell(np.array([[3, 1], [3, 3]]), [P, P])
    assert_close(est, [[0.45, -0.15], [0.25, 0.45]], rel=1e-12)


def test_input_errors():
    P = grr(1.0, 2)
    with pytest.raises(ValueError, match="2 axes but 1 channels"):
        castell(np.ones((2, 2)), [P])
    with pytest.raises(ValueError, match="axis 1 of the counts has 3"):
        castell(np.ones((2, 3)), [P, P])
    with pytest.raises(ValueError, match="all zero"):
        castell(np.zeros((2, 2)), [P, P])
    with pytest.raises(ValueError, match="non-negative"):
        castell(np.array([1.0, -1.0]), [P])


def test_variance_matches_the_explicit_kronecker_formula():
    rng = np.random.default_rng(11)
    shape = (2, 3, 4)
    counts = rng.integers(1, 30, size=shape).astype(float)
    chans = [random_channel(rng, d) for d in shape]
    n = counts.sum()
    lam = counts.reshape(-1) / n
    A = np.linalg.inv(chans[0]).T
    for P in chans[1:]:
        A = np.kron(A, np.linalg.inv(P).T)
    cov = (A @ (np.diag(lam) - np.outer(lam, lam)) @ A.T) / n
    assert_close(castell_variance(counts, chans).reshape(-1), np.diag(cov), rel=1e-10)


def test_expected_tvd_hand_value():
    var = np.array([0.01, 0.04, 0.0, -1e-18])
    assert expected_tvd(var) == pytest.approx(0.5 * np.sqrt(2 / np.pi) * (0.1 + 0.2))


REPS = 400


def test_unbiased_for_a_fixed_dataset_by_monte_carlo():
    """Fixed true records, fresh randomization each repetition: every cell's mean estimate is
    within 4 standard errors of the records' empirical distribution."""
    rng = np.random.default_rng(2024)
    shape = (2, 3, 4)
    n = 3000
    records = np.stack([rng.integers(0, d, size=n) for d in shape], axis=1)
    records[: n // 3, 1] = records[: n // 3, 0]  # some dependence between attributes
    truth = histogram(records, (0, 1, 2), shape) / n
    chans = [grr(1.0, 2), random_channel(rng, 3), grr(2.0, 4)]
    ests = np.empty((REPS,) + shape)
    for r in range(REPS):
        y = np.stack([randomize(records[:, i], P, rng) for i, P in enumerate(chans)], axis=1)
        ests[r] = castell(histogram(y, (0, 1, 2), shape), chans)
    se = ests.std(axis=0, ddof=1) / np.sqrt(REPS)
    z = np.abs(ests.mean(axis=0) - truth) / se
    assert z.max() < 4.0, z.max()


def test_variance_formula_matches_monte_carlo():
    """I.i.d. records (so Λ is exactly multinomial): the empirical variance of every cell over
    400 repetitions is within 30% of the mean closed-form (plug-in) variance; the relative standard
    error of a 400-sample variance is about 7%, so 30% is > 4 standard errors."""
    rng = np.random.default_rng(99)
    shape = (3, 2, 3)
    n = 2000
    pi = rng.dirichlet(np.ones(18)).reshape(shape)
    chans = [grr(1.5, 3), random_channel(rng, 2), random_channel(rng, 3)]
    cells = np.array(list(itertools.product(*[range(d) for d in shape])))
    ests = np.empty((REPS,) + shape)
    vars_ = np.empty((REPS,) + shape)
    for r in range(REPS):
        records = cells[rng.choice(len(cells), size=n, p=pi.reshape(-1))]
        y = np.stack([randomize(records[:, i], P, rng) for i, P in enumerate(chans)], axis=1)
        counts = histogram(y, (0, 1, 2), shape)
        ests[r] = castell(counts, chans)
        vars_[r] = castell_variance(counts, chans)
    emp = ests.var(axis=0, ddof=1)
    formula = vars_.mean(axis=0)
    np.testing.assert_allclose(emp, formula, rtol=0.30)
    assert abs(emp.sum() / formula.sum() - 1) < 0.10
    # and unbiased for π (i.i.d. sampling): within 4 standard errors
    z = np.abs(ests.mean(axis=0) - pi) / np.sqrt(emp / REPS)
    assert z.max() < 4.0


def test_bench_quick_smoke(capsys):
    from ldpstream.bench import castell as bench

    rc = bench.main(SimpleNamespace(name="castell", json=True, quick=True))
    assert not rc
    out = json.loads(capsys.readouterr().out)
    rows = out["rows"]
    assert [r["w"] for r in rows] == sorted(r["w"] for r in rows) and rows[0]["w"] == 2
    for r in rows:
        assert set(r) >= {"w", "cells", "castell_s", "reduced_s", "naive_s", "max_abs_diff"}
        assert r["cells"] == 3 ** r["w"]
        if r["max_abs_diff"] is not None:
            assert r["max_abs_diff"] < 1e-9
    large = out["large"]
    assert large["castell_s"] > 0 and large["reference_s"] > 0
    assert large["ratio"] == pytest.approx(large["castell_s"] / large["reference_s"])
