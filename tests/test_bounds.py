"""Error bounds with stated coverage (estimators/kernels/bounds.py, docs/estimators.md "Error bounds"):
seeded Monte Carlo of Pr[TVD(estimate, truth) ≤ error_bound] from n = 10 to 10⁶.

Tolerance: the bound states 95 %; over R = 2,000 replicates per n the coverage's Monte Carlo
standard error is ≈ 0.5 %, so each n must lie in 95 % ± 2 % and the pooled coverage over every
n (12,000 replicates) in 95 % ± 1 %. The projected estimate served by default carries the same
bound and must cover at least 95 % − 2 %; per-cell intervals 95 % ± 3 % from n = 100.
"""
from __future__ import annotations

import numpy as np
import pytest

from ldpstream.estimators.families.partitioned import Partitioned
from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.estimators.kernels.bounds import (
    DRAWS,
    LEVEL,
    Bound,
    coarsened,
    oracle_bound,
    product_channel_bound,
    reference,
)
from ldpstream.estimators.kernels.castell import apply_modes, castell
from ldpstream.estimators.kernels.channels import grr
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.kernels.proper import project_simplex
from ldpstream.estimators.oracles import frequency_oracles as fo

pytestmark = pytest.mark.core

NS = (10, 100, 1_000, 10_000, 100_000, 1_000_000)
R = 2_000
TRUE = np.array([[0.30, 0.10, 0.02], [0.05, 0.25, 0.0], [0.08, 0.0, 0.20]])


def _tvd(p: np.ndarray, q: np.ndarray) -> float:
    return float(0.5 * np.abs(np.asarray(p) - np.asarray(q)).sum())


def _coverage(draw, truth: np.ndarray, seed: int) -> dict[int, dict[str, float]]:
    """Per n: coverage of the raw and projected TVD and mean per-cell coverage."""
    rng = np.random.default_rng(seed)
    out = {}
    for n in NS:
        raw_in = proj_in = 0
        cells = 0.0
        for r in range(R):
            raw, b = draw(n, rng, r)
            raw_in += _tvd(raw, truth) <= b.tvd
            proj_in += _tvd(project_simplex(raw), truth) <= b.tvd
            cells += float(np.mean((b.low <= truth) & (truth <= b.high)))
        out[n] = {"raw": raw_in / R, "projected": proj_in / R, "cells": cells / R}
    return out


def _check(cov: dict[int, dict[str, float]]) -> None:
    for n, c in cov.items():
        assert abs(c["raw"] - LEVEL) <= 0.02, (n, c)
        assert c["projected"] >= LEVEL - 0.02, (n, c)
        if n >= 100:   # per-cell basic bootstrap intervals: calibrated once n ≥ 100
            assert abs(c["cells"] - LEVEL) <= 0.03, (n, c)
    pooled = np.mean([c["raw"] for c in cov.values()])
    assert abs(pooled - LEVEL) <= 0.01, cov


@pytest.mark.slow
def test_castell_bound_covers_95_percent_from_n_10_to_a_million():
    P = [grr(2.0, 3), grr(2.0, 3)]
    lam = apply_modes(TRUE, P).reshape(-1)

    def draw(n, rng, r):
        c = rng.multinomial(n, lam).reshape(TRUE.shape)
        return castell(c, P), product_channel_bound(c, P, draws=DRAWS, seed=r)

    _check(_coverage(draw, TRUE, 1))


@pytest.mark.slow
def test_grr_oracle_bound_covers_95_percent_from_n_10_to_a_million():
    """The population target: users sampled from f, then GRR (the partitioned estimate)."""
    o = fo.make("grr", 1.0, 6)
    f = np.random.default_rng(5).dirichlet(np.full(6, 0.5))
    lam = f @ o.channel()

    def draw(n, rng, r):
        raw = o.estimate(rng.multinomial(n, lam), n)
        return raw, oracle_bound(o, raw, n, draws=DRAWS, seed=r)

    _check(_coverage(draw, f, 2))


def test_olh_bound_covers_at_small_and_large_n():
    """OLH: simulated report by report at n = 100, the normal draws at n = 20,000."""
    o = fo.make("olh", 1.0, 40)
    rng = np.random.default_rng(3)
    f = rng.dirichlet(np.full(40, 0.5))
    for n, reps in ((100, 150), (20_000, 150)):
        hit = 0
        for r in range(reps):
            raw = o.estimate(o.supports(o.randomize(rng.choice(40, size=n, p=f), rng)), n)
            hit += _tvd(raw, f) <= oracle_bound(o, raw, n, draws=DRAWS, seed=r).tvd
        # 150 replicates: standard error 1.8 %, ± 3.5 standard errors
        assert abs(hit / reps - LEVEL) <= 0.06, (n, hit / reps)


def test_one_report_gets_a_wide_bound_not_zero():
    """A single report: the plug-in variance is 0, the bound must not be."""
    P = [grr(1.0, 3), grr(1.0, 3)]
    c = np.zeros((3, 3), dtype=np.int64)
    c[0, 1] = 1
    b = product_channel_bound(c, P)
    assert b.tvd > 0.5 and b.low.min() == 0.0 and b.high.max() >= 0.5
    g = fo.make("grr", 1.0, 4)
    assert oracle_bound(g, g.estimate(np.array([1, 0, 0, 0]), 1), 1).tvd > 0.5


def test_bound_is_seeded_and_reference_is_a_distribution():
    P = [grr(1.0, 2), grr(1.5, 3)]
    c = np.array([[5, 3, 0], [1, 9, 2]])
    a, b = product_channel_bound(c, P), product_channel_bound(c, P)
    assert a.tvd == b.tvd and np.array_equal(a.low, b.low)
    ref = reference(castell(c, P), 20)
    assert ref.min() > 0 and ref.sum() == pytest.approx(1.0, rel=1e-12)


def test_coarsened_bound_keeps_the_tvd_and_widens_cells():
    b = Bound(0.1, np.zeros(4), np.ones(4))
    s = coarsened(b, np.array([0.95, 0.05]))
    assert s.tvd == 0.1 and s.low.tolist() == pytest.approx([0.85, 0.0])
    assert s.high.tolist() == pytest.approx([1.0, 0.15])


def test_mechanisms_serve_the_calibrated_bound():
    """rr-ind castell and partitioned unbiased carry the bootstrap bound, its level, the
    projected estimate and per-cell intervals."""
    dom = Domain(["a", "b"], [3, 2])
    rng = np.random.default_rng(0)
    records = rng.integers(0, [3, 2], size=(3_000, 2))
    for mech, method in ((RRIndependent(dom, 1.0), "castell"),
                         (Partitioned(dom, 2.0, ways=2), "unbiased")):
        counts = mech.count(mech.randomize(records, rng), mech.tensors([("a", "b")]))
        e = mech.estimate(counts, ("a", "b"), method)
        assert e.bound is not None and e.bound.level == LEVEL
        assert e.error_bound == e.bound.tvd > 0
        assert e.bound.low.shape == e.factor.values.shape
        assert e.projected is not None
        np.testing.assert_allclose(e.projected.values, project_simplex(e.factor.values),
                                   rtol=0, atol=1e-15)


def test_large_tables_are_bootstrapped_in_chunks(monkeypatch):
    """Past the memory cap the draws come in chunks (the same stream: the same TVD bound) and
    the cells get the estimate ± the bound."""
    import ldpstream.estimators.kernels.bounds as bounds
    P = [grr(1.0, 4), grr(1.0, 3)]
    c = np.random.default_rng(0).integers(0, 100, (4, 3))
    whole = product_channel_bound(c, P)
    monkeypatch.setattr(bounds, "_CELLS_MAX", 100)
    chunked = product_channel_bound(c, P)
    assert chunked.tvd == pytest.approx(whole.tvd, rel=1e-12)
    raw = castell(c, P)
    np.testing.assert_allclose(chunked.high, np.clip(raw + chunked.tvd, 0, 1), rtol=1e-12)
