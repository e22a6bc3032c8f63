"""Every estimator's ``error_bound`` states its coverage (estimators/kernels/bounds.py,
docs/estimators.md "Error bounds"): no registered mechanism serves an estimate without a 95 %
bound, the calibrated ones cover 95 % and the ones bounded by construction (the triangle
inequality, the union bound) or served as a proxy at least 95 %.

Tolerances (seeded Monte Carlo): calibrated bounds over R = 2,000 replicates per n (standard
error ≈ 0.5 %) must lie in 95 % ± 2 % at n = 10, 1,000 and 10⁶; the co-occurrence bound of
LoPub, whose reports must be simulated bit by bit, over 200 replicates (standard error ≈ 1.5 %)
in 95 % ± 4.5 % at n = 10, 1,000 and 20,000. "At least" bounds over 200 replicates (LoPub's
lasso and EM: 100) must cover at least 93 % (an exact 95 % less its Monte Carlo error).
Counts are drawn through each family's own channel where it is a channel (a multinomial of the
randomized values), else the reports are randomized.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from ldpstream.estimators.kernels.bounds import AT_LEAST, CALIBRATED, LEVEL
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.kernels.serving import served_fields
from ldpstream.estimators.mechanism import (
    CountBook,
    Mechanism,
    marginal_key,
    mechanism_class,
    mechanism_names,
)

pytestmark = pytest.mark.core

DOM = Domain(("a", "b", "c"), (3, 2, 4))
TRUTH = np.random.default_rng(7).dirichlet(np.full(DOM.size(), 0.8)).reshape(DOM.shape)


def _tvd(p: np.ndarray, q: np.ndarray) -> float:
    return float(0.5 * np.abs(np.asarray(p, dtype=float) - np.asarray(q, dtype=float)).sum())


def _truth(attrs: tuple[str, ...]) -> np.ndarray:
    drop = tuple(i for i, a in enumerate(DOM.attrs) if a not in attrs)
    return TRUTH.sum(axis=drop)


def _records(n: int, rng: np.random.Generator) -> np.ndarray:
    idx = rng.choice(TRUTH.size, size=n, p=TRUTH.reshape(-1))
    return np.stack(np.unravel_index(idx, DOM.shape), axis=1)


def _collect(mech: Mechanism, records: np.ndarray, attrs: tuple[str, ...],
             rng: np.random.Generator) -> tuple[Mechanism, CountBook]:
    """The adaptive loop of estimators/mechanism.py over ``records`` (planned for them)."""
    mech = mech.planned_for(len(records))
    book, i = CountBook(), 0
    while i < len(records):
        block = records[i:i + (mech.reports_until_adapt(book) or len(records))]
        i += len(block)
        book.add(mech.version, mech.count(mech.randomize(block, rng), mech.tensors([attrs])))
        nxt = mech.adapt(book)
        if nxt is not None:
            mech = nxt
    return mech, book


def _attrs_of(name: str) -> tuple[str, ...]:
    one_way = {"spl", "smp", "rs-fd", "rs-rfd", "corr-rr", "corr-rr-paper"}
    return ("c",) if name in one_way else ("a", "c")


def _serve(mech: Mechanism, book: CountBook, records_reports: np.ndarray | None,
           attrs: tuple[str, ...], method: str):
    if method in ("em", "lasso-em") or method in mech.report_estimators:   # whole reports
        return mech.estimate_reports(records_reports, attrs, method)
    return mech.estimate_versions(book, attrs, method)


def test_every_estimator_serves_a_95_percent_bound_with_its_coverage():
    """A new family (or estimator) cannot ship without a bound: every registered mechanism's
    every estimator serves error_bound_quantile 0.95 and says which coverage it has."""
    rng = np.random.default_rng(0)
    records = _records(3_000, rng)
    seen = []
    for name in mechanism_names():
        cls = mechanism_class(name)
        attrs = _attrs_of(name)
        # sw-hm: "c" numeric (its 4 categories a grid on [0, 3]), by category of "a" (its
        # ``ranges`` parameter; partitioned, numeric-capable too, takes ranges from the schema)
        params = {"ranges": {"c": [0, 3]}} if name == "sw-hm" else {}
        mech, book = _collect(cls.from_config(DOM, params, epsilon=2.0, epsilon_scope="record"),
                              records, attrs, rng)
        reports = mech.randomize(records, rng) if cls.report_estimators or name == "lopub" \
            else None
        for method in cls.estimators + cls.report_estimators:
            s = served_fields(_serve(mech, book, reports, attrs, method))
            assert s["error_bound_quantile"] == LEVEL, (name, method, s)
            assert s["error_bound"] is not None and s["error_bound"] > 0, (name, method)
            assert s["error_bound_coverage"] in (CALIBRATED, AT_LEAST), (name, method)
            assert np.shape(s["cells_low"]) == np.shape(s["cells"]), (name, method)
            seen.append((name, method))
    assert len(seen) == sum(len(mechanism_class(n).estimators + mechanism_class(n).report_estimators)
                            for n in mechanism_names())


# --- calibrated: counts through the channel ---------------------------------------------------

NS = (10, 1_000, 1_000_000)
R = 2_000


def _multinomial_column(mech: Any, i: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Reports of attribute i of n users drawn from the population, through its channel."""
    dummy = {marginal_key((a,)): np.ones(d) for a, d in zip(DOM.attrs, DOM.shape)}
    dummy["smp"] = np.ones((len(DOM), max(DOM.shape)))
    _, alpha, beta = mech.column(dummy, i)
    return rng.multinomial(n, alpha * _truth((DOM.attrs[i],)) + beta)


def _spl_like(name: str) -> Callable[[int, np.random.Generator], tuple[Any, dict, str]]:
    mech = mechanism_class(name).from_config(DOM, {}, epsilon=2.0, epsilon_scope="record")

    def counts(n: int, rng: np.random.Generator) -> tuple[Any, dict, str]:
        cols = [_multinomial_column(mech, i, n, rng) for i in range(len(DOM))]
        if name == "smp":   # the users who sampled attribute i: Binomial(n, 1/m) of them
            out = np.zeros((len(DOM), max(DOM.shape)), dtype=np.int64)
            for i, d in enumerate(DOM.shape):
                k = max(1, rng.binomial(n, 1 / len(DOM)))   # the bound is given n_i ≥ 1
                out[i, :d] = _multinomial_column(mech, i, k, rng)
            return mech, {"smp": out}, "unbiased"
        return mech, {marginal_key((a,)): c for a, c in zip(DOM.attrs, cols)}, "unbiased"
    return counts


def _corr_rr_phase1(n: int, rng: np.random.Generator) -> tuple[Any, dict, str]:
    mech = mechanism_class("corr-rr").from_config(DOM, {}, epsilon=2.0, epsilon_scope="record")
    out = {}
    for i, (a, d) in enumerate(zip(DOM.attrs, DOM.shape)):
        t = np.zeros((2, d), dtype=np.int64)
        t[0] = rng.multinomial(n, _truth((a,)) @ mech.P1[i])
        out[f"corr:{a}"] = t
    return mech, out, "phase1"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["spl", "smp", "rs-fd", "corr-rr phase1"])
def test_calibrated_one_way_bounds_cover_95_percent(case):
    draw = _corr_rr_phase1 if case == "corr-rr phase1" else _spl_like(case)
    rng = np.random.default_rng(3)
    want = _truth(("c",))
    for n in NS:
        hit = 0
        for _ in range(R):
            mech, counts, method = draw(n, rng)
            e = mech.estimate(counts, ("c",), method)
            assert e.bound is not None and e.bound.coverage == CALIBRATED
            hit += _tvd(e.factor.values, want) <= e.error_bound
        print(f"coverage {case} n={n}: {hit / R:.3f}")
        assert abs(hit / R - LEVEL) <= 0.02, (case, n, hit / R)


def _corr_rr_columns(mech: Any, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Column counts of a corr-rr collection of n users (the first β·n in Phase I), drawn
    exactly: Phase I users sampled from the joint, every attribute through GRR(ε/m); Phase II
    pivots uniform, the pivot's value from its marginal through GRR(ε), the other columns
    copied from its output through the copy channel."""
    n1 = max(1, int(round(mech.beta * n)))
    n2 = n - n1
    sample = rng.multinomial(n1, TRUTH.reshape(-1)).reshape(TRUTH.shape)
    pivots = rng.multinomial(n2, np.full(len(DOM), 1 / len(DOM)))
    M = mech.copy_channels()
    cols = {a: np.zeros((2, d), dtype=np.int64) for a, d in zip(DOM.attrs, DOM.shape)}
    for j, a in enumerate(DOM.attrs):
        held = sample.sum(axis=tuple(k for k in range(len(DOM)) if k != j))
        cols[a][0] = rng.multinomial(held, mech.P1[j]).sum(axis=0)
        out = rng.multinomial(rng.multinomial(pivots[j], _truth((a,))), mech.P2[j]).sum(axis=0)
        for k, b in enumerate(DOM.attrs):
            rows = out if k == j else rng.multinomial(
                out, M[j][k] / M[j][k].sum(axis=1, keepdims=True)).sum(axis=0)
            cols[b][1] += rows
    return {f"corr:{a}": c for a, c in cols.items()}


@pytest.mark.slow
def test_corr_rr_unbiased_bound_covers_95_percent():
    """The GLS estimate of both phases, with the copy table a collection of 5,000 refined."""
    rng = np.random.default_rng(8)
    mech, _ = _collect(mechanism_class("corr-rr").from_config(
        DOM, {}, epsilon=2.0, epsilon_scope="record"), _records(5_000, rng), ("c",), rng)
    want = _truth(("c",))
    for n in NS:
        hit = 0
        for _ in range(R):
            e = mech.estimate(_corr_rr_columns(mech, n, rng), ("c",), "unbiased")
            assert e.bound is not None and e.bound.coverage == CALIBRATED
            hit += _tvd(e.factor.values, want) <= e.error_bound
        print(f"coverage corr-rr unbiased n={n}: {hit / R:.3f}")
        assert abs(hit / R - LEVEL) <= 0.02, (n, hit / R)


@pytest.mark.slow
def test_rrba_pooled_bound_covers_at_least_95_percent():
    """The pooled eq.-4 estimate over blocks with different published tables: one multinomial
    through the mean channel has at least the blocks' variance, so the bound covers at least
    95 % (measured: more at n = 10, calibrated from n = 1,000)."""
    from ldpstream.estimators.families.rrba import floor_table, pooled_estimate
    from ldpstream.estimators.families.rrba_bounds import pooled_bound
    rng = np.random.default_rng(4)
    f = TRUTH.reshape(-1)
    p, gamma = 0.6, 0.05
    tables = np.stack([floor_table(rng.dirichlet(np.ones(f.size)), gamma) for _ in range(4)])
    share = np.array([0.1, 0.2, 0.3, 0.4])
    for n in NS:
        hit = 0
        for _ in range(R):
            n_t = rng.multinomial(n, share)
            c = np.stack([rng.multinomial(k, p * f + (1 - p) * T) for k, T in zip(n_t, tables)])
            hit += _tvd(pooled_estimate(c, tables, p), f) <= pooled_bound(c, tables, p).tvd
        print(f"coverage rrba pooled (raw) n={n}: {hit / R:.3f}")
        assert LEVEL - 0.02 <= hit / R <= (1.0 if n < 1_000 else LEVEL + 0.02), (n, hit / R)


@pytest.mark.slow
def test_lopub_cooccurrence_bound_covers_95_percent():
    """Simulated fleets at n = 10 and 1,000, the normal approximation at n = 20,000."""
    mech = mechanism_class("lopub").from_config(DOM, {}, epsilon=4.0, epsilon_scope="record")
    rng = np.random.default_rng(5)
    want = _truth(("a", "b"))
    for n in (10, 1_000, 20_000):
        hit = 0
        for _ in range(200):
            reports = mech.randomize(_records(n, rng), rng)
            e = mech.estimate_reports(reports, ("a", "b"), "cooccurrence")
            assert e.bound is not None and e.bound.coverage == CALIBRATED
            hit += _tvd(e.factor.values, want) <= e.error_bound
        print(f"coverage lopub cooccurrence n={n}: {hit / 200:.3f}")
        assert abs(hit / 200 - LEVEL) <= 0.045, (n, hit / 200)


# --- at least 95 %: by construction, or proxies measured -----------------------------------

#: (mechanism, its estimators served with an "at least" bound, the n measured): one collection
#: per replicate serves them all
AT_LEAST_CASES = [
    ("rr-ind", ("rr-independent", "rr-adjustment", "truncated", "ibu"), (50, 5_000)),
    ("rr-clusters", ("rr-independent", "rr-adjustment", "truncated", "ibu"), (50, 5_000)),
    ("rr-joint", ("truncated", "ibu"), (50, 5_000)),
    ("rrba", ("pooled", "last-two"), (50, 5_000)),
    ("corr-rr", ("corr-rr", "decode"), (50, 5_000)),
    ("corr-rr-paper", ("paper",), (50, 5_000)),
    ("rs-rfd", ("unbiased",), (50, 5_000)),
    ("lopub", ("lasso", "em"), (100,)),   # lasso-em: between the two
    ("partitioned", ("consistent", "calm", "norm-sub", "global"), (50, 5_000)),
]
REPS = 200


@pytest.mark.slow
@pytest.mark.parametrize("name,methods,ns", AT_LEAST_CASES, ids=[c[0] for c in AT_LEAST_CASES])
def test_at_least_bounds_cover_at_least_95_percent(name, methods, ns):
    cls = mechanism_class(name)
    attrs = _attrs_of(name)
    rng = np.random.default_rng(6)
    want = _truth(attrs)
    reps = REPS // 2 if name == "lopub" else REPS   # its lasso and EM take ~0.3 s a replicate
    for n in ns:
        hit = dict.fromkeys(methods, 0)
        for _ in range(reps):
            records = _records(n, rng)
            mech, book = _collect(cls.from_config(DOM, {}, epsilon=2.0, epsilon_scope="record"),
                                  records, attrs, rng)
            reports = mech.randomize(records, rng) if name == "lopub" else None
            for method in methods:
                e = _serve(mech, book, reports, attrs, method)
                assert served_fields(e)["error_bound_coverage"] == AT_LEAST, (name, method)
                hit[method] += _tvd(e.factor.values, want) <= e.error_bound
        for method, h in hit.items():
            print(f"coverage {name} {method} n={n}: {h / reps:.3f}")
            assert h / reps >= LEVEL - 0.02, (name, method, n, h / reps)


def test_query_prints_the_quantile_and_its_coverage(capsys):
    from ldpstream.query import print_estimate
    print_estimate({"collection": "c", "attrs": ["a"], "labels": [["x", "y"]], "method": "ibu",
                    "n": 10, "epsilon_per_record": 1.0, "epsilon_per_attribute": 1.0,
                    "error_bound": 0.2, "error_bound_quantile": 0.95,
                    "error_bound_coverage": AT_LEAST, "cells": [0.5, 0.5]})
    assert "error bound=0.2000 (TVD q95, at least)" in capsys.readouterr().out


def test_affine_bound_is_the_channel_bootstrap_without_the_matrix():
    """GRR as α·I + 1·βᵀ: the same draws (the same stream) as the product-channel bootstrap."""
    from ldpstream.estimators.kernels.bounds import affine_bound, product_channel_bound
    from ldpstream.estimators.kernels.channels import grr, grr_pq
    c = np.array([40, 3, 0, 17, 9])
    p, q = grr_pq(1.5, 5)
    a, b = affine_bound(c, p - q, np.full(5, q)), product_channel_bound(c, [grr(1.5, 5)])
    assert a.tvd == pytest.approx(b.tvd, rel=1e-9)
    np.testing.assert_allclose(a.low, b.low, rtol=1e-9, atol=1e-12)


def test_triangle_mixture_and_unbounded():
    from ldpstream.estimators.kernels.bounds import Bound, mixture, split_level, triangle, unbounded
    b = Bound(0.1, np.zeros(3), np.full(3, 0.5))
    t = triangle(np.array([0.5, 0.3, 0.2]), np.array([0.6, 0.3, 0.1]), b)
    assert t.tvd == pytest.approx(0.2, rel=1e-12) and t.coverage == AT_LEAST
    assert triangle(np.array([1.0, 0, 0]), np.array([-2.0, 1.5, 1.5]), b).tvd == 1.0  # capped
    assert split_level(2) == pytest.approx(0.975, rel=1e-12)
    m = mixture([0.25, 0.75], [b, Bound(0.3, np.ones(3), np.ones(3))])
    assert m.tvd == pytest.approx(0.25, rel=1e-12) and m.low.tolist() == pytest.approx([0.75] * 3)
    u = unbounded(np.array([1.2, -0.2]))   # TVD to its projection (0.2) + 1
    assert u.tvd == pytest.approx(1.2, rel=1e-12) and u.coverage == AT_LEAST
