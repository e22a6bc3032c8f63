"""The ``global`` estimator's speed-ups change no result (docs/benchmarks.md "Held-out
accuracy", the cost paragraph): the risk probes' consistent tables computed in one stacked pass
equal each probe's alone, the descent's loss and gradient equal the plain sums and broadcasts
they replace, and the served estimates of seeded held-out-style networks equal those recorded
before the speed-ups."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from ldpstream.bench.heldout import _sets as heldout_sets
from ldpstream.bngen import shape_network
from ldpstream.estimators.families.partitioned import Partitioned
from ldpstream.estimators.kernels.consistency import postprocess, postprocess_stacked
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.global_fit import (
    PROBE_STEP,
    SLICE_INNER,
    SLICE_OUTER,
    _cells,
    _fit,
    _loss_grad,
    _sum_axis,
    _targets,
    global_fit,
    probes,
)
from ldpstream.estimators.kernels.marginal_fit import _design, _system, plans
from ldpstream.estimators.kernels.proper import project_simplex_rows
from tests.tolerance import assert_close

pytestmark = pytest.mark.core


def _sample(kind: str, seed: int, eps: float) -> tuple[Partitioned, dict[str, np.ndarray]]:
    """A held-out-style collection (bench/heldout.py): 7 attributes, 50,000 records, ``ways:
    auto``, one seeded randomization."""
    net = shape_network(kind, 7, seed)
    records = net.sample(50_000, np.random.default_rng([seed, 13]))
    mech = Partitioned(net.domain, eps, ways="auto", expected_reports=len(records))
    return mech, mech.count(mech.randomize(records, np.random.default_rng([0, 1])),
                            mech.tensors())


def _noisy_tables(mech: Partitioned, counts: dict[str, np.ndarray]
                  ) -> tuple[list[Factor], list[float]]:
    raw = [mech.unbiased(counts, j) for j in range(len(mech.marginals))]
    return [r[0] for r in raw], [r[1] for r in raw]


@pytest.mark.parametrize("kind,seed,eps", [("skewed", 5003, 4.0), ("near-deterministic", 5001, 8.0)])
def test_stacked_probes_equal_each_probe_alone(kind, seed, eps):
    """postprocess_stacked on the four probes' tables (triples at ε = 4, 4-way tables at
    ε = 8: the maximum-entropy refits and Norm-Sub passes differ per probe) equals postprocess
    of each probe alone, to 1e-12 of each table's largest cell (bit-identical in practice)."""
    mech, counts = _sample(kind, seed, eps)
    ys, var = _noisy_tables(mech, counts)
    runs = [[Factor(t.domain, t.values + PROBE_STEP * np.sqrt(v) * b)
             for t, v, b in zip(ys, var, bs)] for bs in (probes(ys, 11 + i) for i in range(4))]
    stacked, passes = postprocess_stacked([t.domain for t in ys],
                                          [np.stack([r[k].values for r in runs])
                                           for k in range(len(ys))], var, noise_variance=var)
    for i, run in enumerate(runs):
        alone, n = postprocess(run, var, noise_variance=var)
        assert passes[i] == n
        for k, t in enumerate(alone):
            assert_close(stacked[k][i], t.values, rel=1e-12)


def _plain_loss_grad(p: np.ndarray, targets, shift) -> tuple[np.ndarray, np.ndarray, list]:
    """The descent's loss, gradient and fitted marginals computed plainly: each target's
    marginal summed from the full stack, its residual broadcast back."""
    loss = np.zeros(len(p))
    grad = np.zeros(p.shape)
    fitted = []
    for t, d in zip(targets, shift):
        mu = p.sum(axis=tuple(i + 1 for i in t.drop)) if t.drop else p
        r = (mu - (t.y + d)) / t.sd ** 2
        loss += 0.5 * (r * r * t.sd ** 2).reshape(len(p), -1).sum(axis=1)
        grad += r.reshape((len(p),) + t.shape)
        fitted.append(mu)
    return loss, grad, fitted


def test_loss_and_gradient_equal_the_plain_sums():
    """The shared-partial-sum tree with per-fit goals and variances, the targets' cells laid end
    to end, gives the plain loss, gradient and marginals (5 stacked random tables, pairs and
    triples of a 5-attribute domain, per-cell variances and shifts), to 1e-12 relative."""
    rng = np.random.default_rng(4)
    dom = Domain(tuple("abcde"), (3, 2, 4, 2, 3))
    sets = list(itertools.combinations(dom.attrs, 2)) + [("a", "c", "e"), ("b", "d", "e")]
    tables = [Factor(dom.project(s), rng.random(dom.project(s).shape)) for s in sets]
    variances = [rng.uniform(1e-4, 1e-3, t.values.shape) for t in tables]
    targets = _targets(dom, tables, variances)
    p = rng.dirichlet(np.ones(dom.size()), 5).reshape((5,) + dom.shape)
    shift = [rng.normal(0, 1e-3, (5,) + t.y.shape) for t in targets]
    plan = _fit(p.shape, targets, shift)
    loss, grad, fitted = _loss_grad(p, targets, shift, plan)
    want_loss, want_grad, want_fitted = _plain_loss_grad(p, targets, shift)
    assert_close(loss, want_loss, rel=1e-12)
    assert_close(grad, want_grad, rel=1e-12)
    for f, w in zip(_cells(fitted, targets, plan), want_fitted, strict=True):
        assert_close(f, w, rel=1e-12)


def test_the_cached_least_squares_matrix_is_the_design():
    """The least-squares matrix built once per layout is the design of the constraints plus the
    Σp row, and cannot be written to (it is shared)."""
    dom = Domain(("a", "b", "c"), (2, 3, 2))
    cons = [Factor(dom.project(s), np.full(dom.project(s).shape, 1.0 / dom.project(s).size()))
            for s in (("a", "b"), ("b", "c"))]
    targets = plans(dom, cons)
    A = _system(dom.shape, tuple(d for d, t, s in targets))
    assert np.array_equal(A[:-1], _design(dom, targets))
    assert np.all(A[-1] == A[-1, 0]) and A[-1, 0] > 1
    assert not A.flags.writeable


def test_row_projections_equal_one_at_a_time():
    """Every row's projection onto the simplex (Norm-Sub of the stacked probes) equals the
    plain sort-and-threshold of that row alone, exactly: rows with and without negative cells,
    one already on the simplex."""
    rng = np.random.default_rng(9)
    rows = np.vstack([rng.normal(0.05, 0.1, (6, 20)), np.full((1, 20), 0.05)])
    got = project_simplex_rows(rows)
    for v, g in zip(rows, got):
        u = np.sort(v)[::-1]
        css = np.cumsum(u) - 1.0
        rho = np.nonzero(u - css / np.arange(1, u.size + 1) > 0)[0][-1]
        assert np.array_equal(g, np.maximum(v - css[rho] / (rho + 1), 0.0))
        assert g.sum() == pytest.approx(1.0, rel=1e-12)


#: recorded before the speed-ups (the code of docs/benchmarks.md's held-out table): per case,
#: (the chosen candidate, the iterations kept of each fit, the three risk estimates, a seeded
#: weighted sum of every served pair and triple)
RECORDED = {
    ("dense", 5005, 4.0): ("global", 21, 20, 0.005811770443900059, 0.005783379831443968,
                           0.006696475938871907, 21.828250952845757),
    ("skewed", 5003, 2.0): ("measurements", 66, 48, 0.009033393606373731,
                            0.009861325725942952, 0.008033476535660621, 23.154694586266157),
    ("near-deterministic", 5001, 2.0): ("measurements", 89, 82, 0.01644476372952385,
                                        0.01127934660954506, 0.004831215625639454,
                                        20.570976953451197),
    ("dense", 5002, 8.0): ("global", 29, 19, 0.0013437354932914513, 0.0010001356017769604,
                           0.0015197490578519786, 20.905784515266227),
}


@pytest.mark.parametrize("case", list(RECORDED))
def test_global_serves_what_it_served_before_the_speedups(case):
    """Every pair and triple ``global`` serves on seeded held-out-style networks (pairs at
    ε = 2 and 4, 4-way tables at ε = 8), its choice, iterations and risk estimates, as recorded
    before the speed-ups: equal iterations and choice, risks and served cells to 1e-9 relative
    (a weighted sum with seeded weights: one changed cell moves it)."""
    kind, seed, eps = case
    chosen, it_global, it_meas, sure_c, sure_g, sure_m, digest = RECORDED[case]
    mech, counts = _sample(kind, seed, eps)
    pairs, triples = heldout_sets(mech.cells)
    sets = pairs + triples
    est = {a: mech.estimate(counts, a, "global") for a in sets}
    info = est[sets[0]].extra["global_fit"]
    assert (info["chosen"], info["iterations_global"], info["iterations_measurements"]) == (
        chosen, it_global, it_meas)
    assert_close([info["sure_consistent"], info["sure_global"], info["sure_measurements"]],
                 [sure_c, sure_g, sure_m], rel=1e-9)
    total = 0.0
    for a in sets:
        v = np.asarray(est[a].factor.values, dtype=float).ravel()
        total += float(np.random.default_rng(7).random(v.size) @ v)
    assert total == pytest.approx(digest, rel=1e-9)



def test_hinted_least_squares_equal_the_non_negative_solve(monkeypatch):
    """The probes' least-squares solves started from the first probe's positive cells give the
    marginals of scipy's non-negative solve (to 1e-10 relative): 4-way tables of skewed seeded
    distributions, noise at a probe's scale (1e-3 of the cells' noise: the hint is kept, no
    full solve) and at the noise's own scale (where it may be wrong and the full solve runs);
    a hint that cannot be right (every cell, or a single one) falls back to that solve."""
    from scipy.optimize import nnls

    import ldpstream.estimators.kernels.marginal_fit as mf
    full = []
    monkeypatch.setattr(mf, "nnls", lambda *a, **k: full.append(1) or nnls(*a, **k))
    rng = np.random.default_rng(21)
    shape = (3, 4, 2, 4)
    A = mf._system(shape, ((0,), (1,), (2,), (3,)))
    for trial in range(6):
        p = rng.dirichlet(np.full(int(np.prod(shape)), 0.3))
        y = A @ p + np.r_[rng.normal(0, 3e-3, A.shape[0] - 1), 0.0]
        hint = np.flatnonzero(nnls(A, y, maxiter=5000)[0] > 0)
        for scale in (3e-6, 3e-3):
            b = y + np.r_[rng.normal(0, scale, A.shape[0] - 1), 0.0]
            want = A @ nnls(A, b, maxiter=5000)[0]
            for h in (hint, np.arange(A.shape[1]), np.array([trial])):
                full.clear()
                got = A @ mf._nnls_hinted(A, b, h)
                assert_close(got, want, rel=1e-10)
                if scale < 1e-4 and h is hint:
                    assert not full   # the hint was kept


def test_sliced_sums_equal_the_reduction_to_the_bit():
    """The descent's sums over one axis (slice by slice on large tables) equal np.add.reduce
    exactly, over every axis of stacked tables of short and long axes, with cells of very
    different sizes (where another order of the additions would round differently)."""
    rng = np.random.default_rng(3)
    for shape in [(5, 3, 4, 4, 5, 3, 3, 5), (60, 3, 4, 2, 3, 2), (5, 2, 7, 3, 6),
                  (5, 9, 4, 30), (2, 3, 4)]:
        x = rng.random(shape) * np.exp(rng.normal(0, 6, shape))
        for axis in range(1, len(shape)):
            got = _sum_axis(x, axis)
            want = np.add.reduce(x, axis=axis)
            assert got.shape == want.shape and np.array_equal(got, want), (shape, axis)
    # the sliced path ran (the first shape's axis 6: 3,600 cells before it, 5 after)
    assert 5 * 3 * 4 * 4 * 5 * 3 >= SLICE_OUTER and 5 < SLICE_INNER


@pytest.mark.parametrize("kind,seed,eps", [("skewed", 5003, 4.0), ("dense", 5002, 8.0)])
def test_descent_equals_the_one_of_plain_reductions(kind, seed, eps, monkeypatch):
    """The fit to the measurements of seeded held-out-style tables (triples at ε = 4, 4-way
    tables at ε = 8) with the sliced sums equals the one with every sum a plain
    np.add.reduce: the same iterate kept after the same iterations, its SURE and every run's
    table equal to 1e-12 (bit-identical in practice)."""
    import ldpstream.estimators.kernels.global_fit as gf
    mech, counts = _sample(kind, seed, eps)
    ys, var = _noisy_tables(mech, counts)
    noise = [mech.noise(counts, j) for j in range(len(ys))]
    got = global_fit(mech.cells, ys, var, noise=noise, patience=gf.DIRECT_PATIENCE)
    monkeypatch.setattr(gf, "_add_slices", lambda x, axis: np.add.reduce(x, axis=axis))
    want = global_fit(mech.cells, ys, var, noise=noise, patience=gf.DIRECT_PATIENCE)
    assert (got.iterations, got.ran) == (want.iterations, want.ran)
    assert got.risk == pytest.approx(want.risk, rel=1e-12)
    assert_close(got.runs, want.runs, rel=1e-12)


@pytest.mark.parametrize("kind,seed,eps", [("skewed", 5003, 2.0), ("near-deterministic", 5001, 8.0)])
def test_consistent_tables_stacked_with_the_probes_equal_them_alone(kind, seed, eps):
    """With a cold memo, ``global`` computes the measurements' consistent tables in the probes'
    stacked pass (and memoizes them): its choice, iterations and served table equal those with
    the consistent tables computed alone first (the previous path), its risk estimates to 1e-9
    (the probes' least squares then start from the measurements' positive cells: equal to
    1e-10), and the memoized tables equal :meth:`consistent_tables` alone to 1e-12 (pairs at
    ε = 2; 4-way tables at ε = 8, where the shrinkage refits by least squares)."""
    mech, counts = _sample(kind, seed, eps)
    stacked = Partitioned.from_state(mech.state())
    table, info = stacked.global_table(counts)
    memo = stacked.consistent_tables(counts)
    alone = Partitioned.from_state(mech.state())
    want_memo = alone.consistent_tables(counts)
    want_table, want_info = alone.global_table(counts)
    assert {k: v for k, v in info.items() if not k.startswith("sure_")} == {
        k: v for k, v in want_info.items() if not k.startswith("sure_")}
    assert_close([info[k] for k in sorted(info) if k.startswith("sure_")],
                 [want_info[k] for k in sorted(want_info) if k.startswith("sure_")], rel=1e-9)
    if want_table is None:
        assert table is None
    else:
        assert_close(table.values, want_table.values, rel=1e-12)
    assert memo[1:] == want_memo[1:]
    for got, want in zip(memo[0], want_memo[0], strict=True):
        assert got.domain == want.domain
        assert_close(got.values, want.values, rel=1e-12)


def _previous_loss_grad(p: np.ndarray, targets, shift, fit) -> tuple[np.ndarray, ...]:
    """The descent's loss and gradient before the per-fit summing plan and the in-place
    gradient: every sum through :func:`_sum_axis`, every broadcast added into a new array."""
    tree = fit.tree
    vals = [p]
    for par, ax in zip(tree.parent[1:], tree.axis[1:]):
        vals.append(_sum_axis(vals[par], ax + 1))
    fitted = np.concatenate([vals[i].reshape(len(p), -1) for i in tree.node], axis=1)
    r = (fitted - fit.goal) / fit.var
    acc: list = [None] * len(vals)
    for i, rk in zip(tree.node, _cells(r, targets, fit)):
        acc[i] = rk if acc[i] is None else acc[i] + rk
    for i in range(len(vals) - 1, 0, -1):
        if acc[i] is not None:
            a, ax, j = acc[i], tree.axis[i] + 1, tree.parent[i]
            up = a.reshape(a.shape[:ax] + (1,) + a.shape[ax:])
            acc[j] = up if acc[j] is None else acc[j] + up
    grad = np.array(np.broadcast_to(acc[0], p.shape))
    return 0.5 * np.add.reduce(r * r * fit.var, axis=1), grad, fitted


@pytest.mark.parametrize("kind,seed,eps", [("skewed", 5003, 4.0), ("dense", 5005, 8.0),
                                           ("near-deterministic", 5001, 4.0)])
def test_planned_sums_and_in_place_gradient_equal_the_previous_to_the_bit(kind, seed, eps,
                                                                           monkeypatch):
    """The descent's loss, gradient and marginals with the summing plan made once per fit and
    the gradient accumulated in place equal the previous computation exactly, and so do both
    fits of :func:`choose_fit` (the smoothed tables' and the measurements': iterations, SURE and
    every run's kept table, bit for bit) on seeded held-out-style networks (triples at ε = 4,
    4-way tables at ε = 8)."""
    import ldpstream.estimators.kernels.global_fit as gf
    mech, counts = _sample(kind, seed, eps)
    ys, var = _noisy_tables(mech, counts)
    targets = _targets(mech.cells, ys, var)
    p = np.random.default_rng(2).dirichlet(np.ones(mech.cells.size()), 5)
    p = p.reshape((5,) + tuple(mech.cells.shape))
    shift = [np.random.default_rng(3).normal(0, 1e-3, (5,) + t.y.shape) for t in targets]
    plan = _fit(p.shape, targets, shift)
    for got, want in zip(_loss_grad(p, targets, shift, plan),
                         _previous_loss_grad(p, targets, shift, plan), strict=True):
        assert np.array_equal(got, want)
    fits = []
    real = gf.global_fit
    monkeypatch.setattr(gf, "global_fit", lambda *a, **k: fits.append(real(*a, **k)) or fits[-1])
    Partitioned.from_state(mech.state()).global_table(counts)
    monkeypatch.setattr(gf, "_loss_grad", lambda p, t, s, f=None: _previous_loss_grad(p, t, s, f))
    before = fits[:]
    Partitioned.from_state(mech.state()).global_table(counts)
    assert len(fits) == 2 * len(before) == 4
    for got, want in zip(before, fits[len(before):]):
        assert (got.iterations, got.ran, got.risk) == (want.iterations, want.ran, want.risk)
        assert np.array_equal(got.runs, want.runs)
