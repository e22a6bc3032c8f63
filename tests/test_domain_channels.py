"""Domain/Factor value objects and channel construction basics."""
import dataclasses

import numpy as np
import pytest

from ldpstream.estimators.kernels.channels import epsilon, epsilon_of_report, grr, validate, warner
from ldpstream.estimators.kernels.domain import Domain, Factor

pytestmark = pytest.mark.core


def test_domain_is_frozen_and_named():
    dom = Domain(("a", "b"), (2, 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        dom.attrs = ("x",)  # type: ignore[misc]  # the write must fail
    assert dom["b"] == 3 and "a" in dom and len(dom) == 2
    with pytest.raises(KeyError, match="'z'"):
        dom.axes(("z",))
    with pytest.raises(ValueError, match="duplicate"):
        Domain(("a", "a"), (2, 2))


def test_factor_project_orders_axes_by_name():
    dom = Domain(("a", "b", "c"), (2, 3, 4))
    vals = np.random.default_rng(0).random((2, 3, 4))
    f = Factor(dom, vals)
    ca = f.project(("c", "a"))
    assert ca.domain.attrs == ("c", "a")
    np.testing.assert_allclose(ca.values, vals.sum(axis=1).T)


def test_epsilon_of_grr_and_warner_and_composition():
    for eps in (0.1, 1.0, np.log(3), 5.0):
        for d in (2, 5, 16):
            assert epsilon(grr(eps, d)) == pytest.approx(eps, rel=1e-12)
    p, d = 0.6, 4
    assert epsilon(warner(p, d)) == pytest.approx(np.log((p + (1 - p) / d) / ((1 - p) / d)))
    assert epsilon_of_report([grr(1.0, 3), grr(0.5, 2)]) == pytest.approx(1.5)


def test_validate_rejects_bad_matrices():
    with pytest.raises(ValueError, match="square"):
        validate(np.ones((2, 3)) / 3)
    with pytest.raises(ValueError, match="sum to 1"):
        validate(np.array([[0.5, 0.4], [0.5, 0.5]]))
    with pytest.raises(ValueError, match="singular"):
        validate(np.array([[0.5, 0.5], [0.5, 0.5]]))
    with pytest.raises(ValueError, match="non-negative"):
        validate(np.array([[1.2, -0.2], [0.3, 0.7]]))
    with pytest.raises(ValueError, match="epsilon"):
        grr(0.0, 3)
