"""Metrics (docs/mechanisms.md §7) on hand-computed values; proper-distribution repairs (§1)."""
from __future__ import annotations

import doctest

import numpy as np
import pytest
from scipy.optimize import minimize
from tolerance import assert_close

from ldpstream.estimators.kernels import metrics as metrics_mod
from ldpstream.estimators.kernels import proper as proper_mod
from ldpstream.estimators.kernels.metrics import jsd, l2_counts, mae, max_abs, mse, tvd
from ldpstream.estimators.kernels.proper import clip_rescale, project_simplex

pytestmark = pytest.mark.core


def test_doctests():
    assert doctest.testmod(metrics_mod).failed == 0
    assert doctest.testmod(proper_mod).failed == 0


def test_metrics_hand_values():
    p = np.array([[0.1, 0.2], [0.3, 0.4]])
    q = np.array([[0.4, 0.2], [0.1, 0.3]])
    # |p − q| = 0.3, 0, 0.2, 0.1
    assert tvd(p, q) == pytest.approx(0.3)
    assert max_abs(p, q) == pytest.approx(0.3)
    assert mae(p, q) == pytest.approx(0.15)
    assert mse(p, q) == pytest.approx((0.09 + 0 + 0.04 + 0.01) / 4)
    assert l2_counts(p, q, 100) == pytest.approx(np.sqrt(900 + 400 + 100))
    # estimates may be negative: the distances still apply
    assert tvd(np.array([1.2, -0.2]), np.array([1.0, 0.0])) == pytest.approx(0.2)


def test_jsd_hand_values_natural_log():
    assert jsd(np.array([0.5, 0.5]), np.array([0.5, 0.5])) == 0.0
    assert jsd(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(np.log(2))
    p, q = np.array([1.0, 0.0]), np.array([0.5, 0.5])
    m = 0.5 * (p + q)
    assert np.allclose(m, [0.75, 0.25])
    expected = 0.5 * (1.0 * np.log(1 / 0.75)) + 0.5 * (0.5 * np.log(0.5 / 0.75)
                                                        + 0.5 * np.log(0.5 / 0.25))
    assert jsd(p, q) == pytest.approx(expected)
    assert jsd(q, p) == pytest.approx(expected)  # symmetric
    # agrees with scipy (which returns the square root, the JS *distance*)
    from scipy.spatial.distance import jensenshannon
    rng = np.random.default_rng(0)
    a, b = rng.dirichlet(np.ones(7)), rng.dirichlet(np.ones(7))
    assert jsd(a, b) == pytest.approx(jensenshannon(a, b) ** 2)


def test_metric_errors():
    with pytest.raises(ValueError, match="shapes differ"):
        tvd(np.ones(2), np.ones(3))
    with pytest.raises(ValueError, match="non-negative"):
        jsd(np.array([1.2, -0.2]), np.array([0.5, 0.5]))


def qp_projection(v: np.ndarray):
    """Reference: argmin ‖x − v‖² s.t. x ≥ 0, Σx = 1 by scipy's SLSQP (a generic QP solver)."""
    k = v.size
    return minimize(lambda x: np.sum((x - v) ** 2), np.full(k, 1.0 / k),
                    jac=lambda x: 2 * (x - v), method="SLSQP", bounds=[(0, None)] * k,
                    constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1,
                                  "jac": lambda x: np.ones(k)}],
                    options={"ftol": 1e-12, "maxiter": 1000})


def test_projection_is_the_euclidean_projection():
    rng = np.random.default_rng(1)
    compared = 0
    for k in (2, 3, 5, 9, 16):
        for scale in (0.3, 1.0, 3.0):
            v = rng.normal(size=k) * scale + 1.0 / k
            x = project_simplex(v)
            # feasibility and the KKT conditions of the projection: v − x = θ on the support,
            # v ≤ θ off it
            assert np.all(x >= 0) and x.sum() == pytest.approx(1.0, rel=1e-12)
            theta = (v - x)[x > 0]
            assert np.ptp(theta) < 1e-12
            assert np.all(v[x == 0] <= theta[0] + 1e-12)
            # no generic QP solution is closer to v
            ref = qp_projection(v)
            feasible = np.all(ref.x >= -1e-9) and abs(ref.x.sum() - 1) < 1e-9
            if feasible:
                assert np.sum((x - v) ** 2) <= np.sum((ref.x - v) ** 2) + 1e-9
            if ref.success:
                assert_close(x, ref.x, rel=1e-5)
                compared += 1
    assert compared >= 10


def test_projection_known_cases_and_shapes():
    np.testing.assert_allclose(project_simplex(np.array([2.0, 0.0])), [1.0, 0.0])
    np.testing.assert_allclose(project_simplex(np.array([0.0, 0.0, 0.0])), [1 / 3] * 3)
    np.testing.assert_allclose(project_simplex(np.array([0.5, 0.5, 1.0])), [1 / 6, 1 / 6, 2 / 3])
    inside = np.array([[0.1, 0.2], [0.3, 0.4]])
    np.testing.assert_allclose(project_simplex(inside), inside)  # already proper: unchanged
    np.testing.assert_allclose(clip_rescale(inside), inside)
    est = np.array([[0.45, -0.15], [0.25, 0.45]])  # [Castell] Appendix B RR-Ind-Joint
    proj = project_simplex(est)
    assert proj.shape == (2, 2)
    assert_close(proj, [[0.4, 0.0], [0.2, 0.4]], rel=1e-12)
    np.testing.assert_allclose(clip_rescale(est), np.array([[0.45, 0.0], [0.25, 0.45]]) / 1.15)


def test_clip_rescale_differs_from_projection():
    v = np.array([0.9, 0.3, -0.2])
    np.testing.assert_allclose(clip_rescale(v), [0.75, 0.25, 0.0])
    np.testing.assert_allclose(project_simplex(v), [0.8, 0.2, 0.0])
    # the projection is the closer of the two, as it must be
    assert np.linalg.norm(project_simplex(v) - v) < np.linalg.norm(clip_rescale(v) - v)


def test_repairs_are_proper_on_random_estimates():
    rng = np.random.default_rng(2)
    for _ in range(20):
        v = rng.normal(size=(3, 4, 2)) * 0.2 + 1 / 24
        for f in (clip_rescale, project_simplex):
            r = f(v)
            assert r.shape == v.shape and np.all(r >= 0)
            assert r.sum() == pytest.approx(1.0)


def test_clip_rescale_all_negative_gives_uniform_and_nonfinite_rejected():
    np.testing.assert_allclose(clip_rescale(np.array([-1.0, -2.0])), [0.5, 0.5])
    with pytest.raises(ValueError, match="non-finite"):
        clip_rescale(np.array([np.nan, 1.0]))
    with pytest.raises(ValueError, match="non-finite"):
        project_simplex(np.array([np.inf, 1.0]))


def test_jsd_finite_with_subnormal_cells():
    """A subnormal cell halves to 0 in m = (p+q)/2; jsd must stay finite (and ≈ 0 here)."""
    tiny = np.nextafter(0.0, 1.0)
    p = np.array([0.5, 0.5 - tiny, tiny])
    q = np.array([0.5, 0.5, 0.0])
    val = jsd(p, q)
    assert np.isfinite(val) and val < 1e-300
