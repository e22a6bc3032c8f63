"""The graphical-model fit of noisy marginals (estimators/kernels/marginal_fit.py) and how
non-convergence is reported (API warnings, the metric, simulate)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from ldpstream.bngen import SHAPES, random_network, shape_network
from ldpstream.estimators.families.partitioned import Partitioned
from ldpstream.estimators.kernels.consistency import max_entropy
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.marginal_fit import fit_marginals
from ldpstream.estimators.kernels.serving import served_fields
from ldpstream.estimators.mechanism import Estimate

pytestmark = pytest.mark.core


def _marginals(p: np.ndarray, dom: Domain, sets) -> list[Factor]:
    f = Factor(dom, p)
    return [f.project(s) for s in sets]


def _loss(p: np.ndarray, dom: Domain, targets: list[Factor]) -> float:
    f = Factor(dom, p)
    return 0.5 * sum(float(np.sum((f.project(t.domain.attrs).values - t.values) ** 2))
                     for t in targets)


def test_consistent_targets_give_the_maximum_entropy_table():
    """Pairs of a real distribution: the fit meets them and equals IPF's maximum-entropy
    table (same family, loss 0)."""
    rng = np.random.default_rng(0)
    dom = Domain(["a", "b", "c"], [3, 4, 2])
    p = rng.dirichlet(np.full(24, 0.7)).reshape(3, 4, 2)
    sets = [("a", "b"), ("b", "c"), ("a", "c")]
    targets = _marginals(p, dom, sets)
    ipf = max_entropy(dom, targets, tol=1e-12, max_iter=5000, refit=False)
    r = fit_marginals(dom, targets, tol=1e-10, max_iter=5000)
    assert r.converged and r.gap < 1e-6
    np.testing.assert_allclose(r.table.values, ipf.table.values, rtol=0, atol=1e-6)


def test_inconsistent_targets_converge_to_the_best_fit():
    """Noisy pairs no distribution has: IPF alone does not converge; the fit does, to the
    maximum-entropy table of the closest realizable marginals: its loss is below where IPF
    stopped and (up to the fit's tolerance) below every nearby distribution's."""
    rng = np.random.default_rng(1)
    dom = Domain(["a", "b", "c"], [3, 3, 3])
    p = rng.dirichlet(np.full(27, 0.5)).reshape(3, 3, 3)
    targets = []
    for t in _marginals(p, dom, [("a", "b"), ("b", "c"), ("a", "c")]):
        noisy = np.maximum(t.values + rng.normal(0, 0.05, t.values.shape), 0)
        targets.append(Factor(t.domain, noisy / noisy.sum()))
    ipf = max_entropy(dom, targets, refit=False)
    assert not ipf.converged
    r = max_entropy(dom, targets)
    assert r.converged and r.gap > 1e-3
    best = _loss(r.table.values, dom, targets)
    assert best < _loss(ipf.table.values, dom, targets)
    for _ in range(20):   # the loss is convex in p: random nearby distributions do worse
        q = r.table.values * np.exp(rng.normal(0, 0.05, r.table.values.shape))
        assert _loss(q / q.sum(), dom, targets) >= best - 1e-6


def test_partitioned_triples_from_pairs_converge_on_generated_networks():
    """The case where IPF converged on 14–66 % of the triples (ε = 0.5, 7 attributes)."""
    for shape in ("chain-skewed", "dag-dense"):
        net = shape_network(shape, 7, 0)
        rec = net.sample(20_000, np.random.default_rng(1))
        mech = Partitioned(net.domain, 0.5, ways=2)
        counts = mech.count(mech.randomize(rec, np.random.default_rng(2)), mech.tensors())
        for a in itertools.combinations(net.domain.attrs, 3):
            e = mech.estimate(counts, a, "consistent")
            assert e.converged, (shape, a, e.extra["gap"])
            assert served_fields(e)["warnings"] == []


def test_non_convergence_is_a_warning_in_the_answer():
    f = Factor(Domain(["a"], [2]), np.array([0.5, 0.5]))
    e = Estimate(f, "consistent", 10, 1.0, iterations=200, converged=False,
                 extra={"gap": 0.069})
    (w,) = served_fields(e)["warnings"]
    assert "did not converge" in w and "200 iterations" in w and "0.069" in w
    assert served_fields(Estimate(f, "ibu", 10, 1.0, converged=True))["warnings"] == []


def test_non_convergence_sets_the_gauge():
    from ldpstream.agents import metrics
    from ldpstream.agents.refresh.refresher import Refresher

    base = {"attrs": ["a", "b"], "method": "consistent", "window": "all",
            "cells": [[0.5, 0.5]], "labels": [["x"], ["u", "v"]], "error_bound": None}
    Refresher._estimate_gauges("fitcheck", [{**base, "converged": False}])
    g = metrics.ESTIMATE_NOT_CONVERGED.labels("fitcheck", "a|b", "consistent", "all")
    assert g._value.get() == 1.0
    Refresher._estimate_gauges("fitcheck", [{**base, "converged": True}])
    assert g._value.get() == 0.0
    metrics.clear_collection("fitcheck")


def test_simulate_prints_a_warning_line(capsys):
    from ldpstream.simulate.driver import print_table

    row = {"mechanism": "partitioned", "estimator": "consistent", "w": 3, "subsets": 4,
           "metrics": {"tvd": 0.1}, "seconds": 0.1, "reports": 10.0, "versions": 1.0,
           "converged_fraction": 0.5,
           "warning": "consistent did not converge on 50% of the 3-way estimates"}
    print_table({"mechanism": "partitioned", "n": 10, "m": 3, "epsilon": 1.0,
                 "epsilon_scope": "record", "epsilon_per_record": 1.0, "results": [row]})
    assert "warning: consistent did not converge on 50% of the 3-way" in capsys.readouterr().out


def test_generated_networks_are_seeded_and_varied():
    a = shape_network("dag-dense", 7, 3)
    b = shape_network("dag-dense", 7, 3)
    assert a.parents == b.parents and all(np.array_equal(a.cpt[v], b.cpt[v]) for v in a.cpt)
    sizes = {len(s) for name in SHAPES for s in shape_network(name, 7, 0).states.values()}
    assert sizes == {2, 3, 4, 5, 6}
    chain = random_network(5, np.random.default_rng(0), structure="chain")
    assert sum(len(p) for p in chain.parents.values()) == 4
    for v in chain.variables:   # every CPT row is a distribution
        np.testing.assert_allclose(chain.cpt[v].sum(axis=-1), 1.0, rtol=1e-12)
    with pytest.raises(ValueError, match="structure"):
        random_network(3, np.random.default_rng(0), structure="star")
