"""One distribution fitted to every measured marginal, stopped where its predicted error is
smallest (docs/partitioned.md "Global fit").

Measurements: tables y_S (unbiased, noisy) of the attribute sets S with known cell variances
σ²_S (one per table, or one per cell). The fit is the loss Private-PGM minimises (McKenna,
Sheldon & Miklau, ICML 2019, §3),
L(p) = ½ Σ_S ‖p_S − y_S‖² / σ²_S over distributions p of the whole domain (a dense table here),
by entropic mirror descent from the uniform table with a backtracking step (ibid. Alg. 1).
Run to convergence it fits the noise; the iterates in between are smoother (closer to the
uniform, maximum-entropy start). The iterate kept is the one of smallest Stein's unbiased risk
estimate (Stein 1981) of its fitted marginals,

    SURE_t = Σ_S ‖y_S − p_t,S‖² / σ²_S − N + 2·div_t,

(N measured cells), an unbiased estimate of Σ_S ‖p_t,S − μ_S‖² / σ²_S (μ: the true marginals)
for Gaussian noise. The divergence div_t = Σ ∂(p_t,S/σ_S)/∂(y_S/σ_S) is estimated by Monte Carlo
(Ramani, Blu & Unser 2008): seeded probes b ~ N(0, I) (:data:`PROBES`), each a run on
y + h·σ·b with the same steps, div_t ≈ mean of bᵀ(p'_t − p_t)/(h·σ) (:func:`sure`: the same
estimate for any estimator's fitted tables). The kept iterate and another estimator (the
consistent tables) are then compared on the risk of the 2- and 3-way marginals
(:func:`query_sure`, :func:`choose_fit`), not of the measured tables' cells.

The descent may fit smoothed tables instead of y (``smoothed``: an estimator's tables at y and
at each probe's y + h·σ·b, e.g. the shrunk consistent tables of ``partitioned``): its iterates
then start from the uniform table toward the smoothed tables, and SURE is that of the
composition (residual to y, divergence through both).

>>> from ldpstream.estimators.kernels.domain import Domain, Factor
>>> dom = Domain(["a", "b"], [2, 2])
>>> y = [Factor(Domain(["a"], [2]), np.array([0.7, 0.3])),
...      Factor(Domain(["b"], [2]), np.array([0.4, 0.6]))]
>>> r = global_fit(dom, y, [1e-6, 1e-6])
>>> np.round(r.table, 3).tolist()       # exact measurements: their product
[[0.28, 0.42], [0.12, 0.18]]
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ldpstream.estimators.kernels.domain import Domain, Factor

__all__ = ["GlobalFit", "Noise", "global_fit", "choose_fit", "sure", "query_sure", "query_sets", "probes",
           "one_step", "ONE_STEP", "ONE_STEP_SCALE", "MAX_CELLS", "MAX_ITER", "PATIENCE",
           "DIRECT_PATIENCE", "PROBE_STEP", "PROBE_SEED", "PROBES", "GROWTH", "QUERY_WAYS"]

#: largest domain (cells of the full table) fitted; larger ones keep the consistent tables
MAX_CELLS = 400_000
#: mirror-descent iterations at most
MAX_ITER = 300
#: iterations without a new smallest SURE after which the descent stops
PATIENCE = 10
#: the same for the fit to the measurements themselves (:func:`choose_fit`'s ``direct``): it
#: converges more slowly where the data are near-deterministic, and its SURE is flatter
DIRECT_PATIENCE = 30
#: the probe's size in units of each cell's standard deviation
PROBE_STEP = 1e-3
#: probes averaged in the divergence's Monte Carlo estimate
PROBES = 4
#: the step's growth after an accepted step (backtracking halves it when needed)
GROWTH = 1.2
#: seed of the probe (the fit is a function of the measurements)
PROBE_SEED = 20_190_611
#: :func:`choose_fit` also weighs Private-PGM's first mirror-descent step (:func:`one_step`)
ONE_STEP = True
#: that step's size in units of σ²_min (``mbi``'s initial step 2/L)
ONE_STEP_SCALE = 2.0
#: the marginal sizes :func:`choose_fit` compares the two estimators on
QUERY_WAYS = (2, 3)


@dataclass(frozen=True)
class GlobalFit:
    """``table``: the kept iterate (the domain's shape, sums to 1); ``iterations``: its index;
    ``risk``: its SURE; ``ran``: iterations run; ``runs``: the kept iterate of every run (the
    measurements', then each probe's: leading axis), for :func:`query_sure`."""

    table: np.ndarray
    iterations: int
    risk: float
    ran: int
    runs: np.ndarray


@dataclass(frozen=True)
class _Target:
    drop: tuple[int, ...]        # axes summed out of the full table
    perm: tuple[int, ...]        # the measurement's axes → domain order
    shape: tuple[int, ...]       # broadcast shape in the full table
    y: np.ndarray                # measurement, domain axis order
    sd: np.ndarray               # σ_S per cell, domain axis order


Variance = float | np.ndarray


def _sd(table: Factor, variance: Variance) -> np.ndarray:
    """σ per cell of ``table`` (a scalar variance broadcast)."""
    v = np.broadcast_to(np.asarray(variance, dtype=float), np.shape(table.values))
    return np.sqrt(np.maximum(v, 1e-300))


@dataclass(frozen=True)
class Noise:
    """The noise of one measured table around its expectation, for the risk estimates.
    ``pi`` None: independent cells of variances ``var``. Else a multinomial: the table is
    ``(C/n − q)/(p − q)`` with C ~ Multinomial(n, π) (GRR's report counts, the users drawn
    iid), Cov = ``scale``²·(diag(π) − ππᵀ), ``scale`` = 1/(√n·(p − q)): the cells are
    negatively correlated, and a sum of many of them (a pair from a 4-way table) has variance
    scale²·π_Q(1 − π_Q), not the sum of the cells' variances (too large by 1/(1 − π_Q))."""

    var: np.ndarray
    pi: np.ndarray | None = None
    scale: float = 0.0

    def unit(self, b: np.ndarray) -> np.ndarray:
        """A draw of the noise's shape from standard normal ``b``: L·b with L·Lᵀ = Cov."""
        if self.pi is None:
            return np.sqrt(self.var) * b
        r = np.sqrt(self.pi) * b
        return self.scale * (r - self.pi * float(r.sum()))

    def projected_var(self, drop: tuple[int, ...]) -> np.ndarray:
        """Variance of every cell of the table summed over the axes ``drop``."""
        def a(x: np.ndarray) -> np.ndarray:
            return x.sum(axis=drop) if drop else x
        if self.pi is None:
            return a(self.var)
        pq = a(self.pi)
        return self.scale ** 2 * pq * (1.0 - pq)


def _noise(t: Factor, n: Noise | Variance) -> Noise:
    if isinstance(n, Noise):
        return n
    return Noise(np.broadcast_to(np.asarray(n, dtype=float), np.shape(t.values)))


def _placement(domain: Domain, table: Factor
               ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Where ``table`` sits in the full table of ``domain``: the axes summed out of it, the
    permutation of its axes to domain order, and its broadcast shape (size 1 where summed)."""
    ax = domain.axes(table.domain.attrs)
    perm = tuple(list(ax).index(i) for i in sorted(ax))
    return (tuple(i for i in range(len(domain)) if i not in ax), perm,
            tuple(domain.shape[i] if i in ax else 1 for i in range(len(domain))))


def _targets(domain: Domain, tables: Sequence[Factor], variances: Sequence[Variance]
             ) -> list[_Target]:
    out = []
    for t, v in zip(tables, variances):
        drop, perm, shape = _placement(domain, t)
        out.append(_Target(drop, perm, shape, np.transpose(np.asarray(t.values, dtype=float), perm),
                           np.transpose(_sd(t, v), perm)))
    return out


def probes(tables: Sequence[Factor], seed: int = PROBE_SEED) -> list[np.ndarray]:
    """The seeded standard-normal probe, one array per table (the table's shape)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(np.shape(t.values)) for t in tables]


def sure(tables: Sequence[Factor], variances: Sequence[Variance], fitted: Sequence[np.ndarray],
         perturbed: Sequence[np.ndarray], probe: Sequence[np.ndarray],
         step: float = PROBE_STEP) -> float:
    """SURE (module docstring) of an estimator whose fitted tables are ``fitted`` at the
    measurements and ``perturbed`` at y + ``step``·σ·``probe`` (each in its table's axes)."""
    res = div = 0.0
    n = 0
    for t, v, f, g, b in zip(tables, variances, fitted, perturbed, probe):
        sd = _sd(t, v)
        res += float((((np.asarray(t.values) - f) / sd) ** 2).sum())
        div += float((b * (g - f) / sd).sum()) / step
        n += b.size
    return res - n + 2.0 * div


@dataclass(frozen=True)
class _Tree:
    """How every target's marginal is summed from the full table, sharing partial sums: node 0
    is the full table; node i > 0 is node ``parent[i]`` summed over its axis ``axis[i]`` (a
    position among the parent's kept domain axes); ``node[k]`` is target k's node. Each target
    drops the smallest absent domain axis first, so the targets' chains share their prefixes
    and at most one full-size sum per first dropped axis is computed (not one per target);
    the gradient's broadcasts are accumulated back along the same tree. Smallest first: a sum
    over a leading axis adds long contiguous blocks, where one over the short trailing axes of
    a large table is several times slower (the order changes the sums by rounding only)."""

    parent: tuple[int, ...]
    axis: tuple[int, ...]
    node: tuple[int, ...]


def _tree(ndim: int, targets: Sequence[_Target]) -> _Tree:
    index = {tuple(range(ndim)): 0}
    parent, axis, node = [-1], [-1], []
    for t in targets:
        kept = list(range(ndim))
        cur = 0
        for a in sorted(t.drop):
            pos = kept.index(a)
            kept.pop(pos)
            key = tuple(kept)
            if key not in index:
                index[key] = len(parent)
                parent.append(cur)
                axis.append(pos)
            cur = index[key]
        node.append(cur)
    return _Tree(tuple(parent), tuple(axis), tuple(node))


@dataclass(frozen=True)
class _Fit:
    """What :func:`_loss_grad` needs of a fit, computed once per fit (not per iteration): the
    summing tree and, for the targets' cells laid end to end (``edges``: where each target's
    cells start and end), their goals y + shift (runs × cells) and cell variances σ²; per node
    of the tree, whether its sum adds slices (:func:`_sum_axis`) or is one reduction
    (``sliced``), and its shape (``shapes``, runs first)."""

    tree: _Tree
    edges: tuple[int, ...]
    goal: np.ndarray
    var: np.ndarray
    sliced: tuple[bool, ...]
    shapes: tuple[tuple[int, ...], ...]


def _fit(shape: tuple[int, ...], targets: Sequence[_Target], shift: Sequence[np.ndarray]
         ) -> _Fit:
    """:class:`_Fit` for stacked tables of ``shape`` (leading axis: the runs)."""
    runs = shape[0]
    edges = tuple(int(e) for e in np.cumsum([0] + [t.y.size for t in targets]))
    goal = np.concatenate([np.broadcast_to(t.y + d, (runs,) + t.y.shape).reshape(runs, -1)
                           for t, d in zip(targets, shift)], axis=1)
    var = np.concatenate([(t.sd ** 2).reshape(-1) for t in targets])
    tree = _tree(len(shape) - 1, targets)
    shapes = [tuple(shape)]
    for par, ax in zip(tree.parent[1:], tree.axis[1:]):
        s = shapes[par]
        shapes.append(s[:ax + 1] + s[ax + 2:])
    sliced = tuple(_sliced(shapes[par], ax + 1) for par, ax in zip(tree.parent, tree.axis))
    return _Fit(tree, edges, goal, var, sliced, tuple(shapes))


def _cells(x: np.ndarray, targets: Sequence[_Target], fit: _Fit) -> list[np.ndarray]:
    """Each target's table of ``x`` (runs × the targets' cells end to end), runs first."""
    return [x[:, a:b].reshape((len(x),) + t.y.shape)
            for t, a, b in zip(targets, fit.edges[:-1], fit.edges[1:])]


#: :func:`_sum_axis` adds slices when the cells after the summed axis are fewer than this
#: (each slice a run of short blocks that the reduction's inner loop handles poorly) ...
SLICE_INNER = 32
#: ... and the cells before it at least this many (below, the calls' overhead dominates)
SLICE_OUTER = 256


def _sliced(shape: tuple[int, ...], axis: int) -> bool:
    """Whether :func:`_sum_axis` adds the slices of a table of ``shape`` over ``axis``."""
    n = shape[axis]
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    return not (n < 2 or n >= 8 or inner >= SLICE_INNER or outer < SLICE_OUTER)


def _sum_axis(x: np.ndarray, axis: int) -> np.ndarray:
    """``x`` summed over ``axis``, equal to ``np.add.reduce`` to the bit: over a short axis
    (fewer than 8 entries, where the reduction adds them one after the other, x₀ + x₁ + …, not
    pairwise) followed by few cells (:data:`SLICE_INNER`) of a large table
    (:data:`SLICE_OUTER`), the slices are added in that order, two to four times faster than
    the reduction, whose inner loop runs over the short trailing axes (or over the short axis
    itself); elsewhere the reduction is as fast or faster."""
    return _add_slices(x, axis) if _sliced(x.shape, axis) else np.add.reduce(x, axis=axis)


def _add_slices(x: np.ndarray, axis: int) -> np.ndarray:
    """``x`` summed over ``axis`` slice by slice, in the order the reduction adds them (what
    :func:`_sum_axis` does where :func:`_sliced`; the descent decides that once per fit)."""
    n = x.shape[axis]
    outer, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1:])
    v = x.reshape(outer, n, inner)
    out = v[:, 0] + v[:, 1]
    for k in range(2, n):
        np.add(out, v[:, k], out=out)
    return out.reshape(x.shape[:axis] + x.shape[axis + 1:])


def _loss_grad(p: np.ndarray, targets: Sequence[_Target], shift: Sequence[np.ndarray],
               fit: _Fit | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Loss, gradient and fitted marginals of a stack of tables ``p`` (leading axis: the
    run at the measurements, then one per probe; ``shift[k]``: the measurements' offset per
    run, shape (runs, …)); the marginals summed along the tree of ``fit`` (:class:`_Fit`; built
    here if not given), returned end to end (runs × cells; :func:`_cells` splits them), so
    that the residuals, the loss and the risk estimate are a few operations on one array
    rather than a few per target."""
    if fit is None:
        fit = _fit(p.shape, targets, shift)
    tree = fit.tree
    add = np.add.reduce
    runs = len(p)
    vals = [p]
    for par, ax, cut in zip(tree.parent[1:], tree.axis[1:], fit.sliced[1:]):
        vals.append(_add_slices(vals[par], ax + 1) if cut else add(vals[par], axis=ax + 1))
    fitted = np.concatenate([vals[i].reshape(runs, -1) for i in tree.node], axis=1)
    r = (fitted - fit.goal) / fit.var
    loss = 0.5 * add(r * r * fit.var, axis=1)
    acc: list[np.ndarray | None] = [None] * len(vals)
    # acc[i] is the gradient summed onto node i so far, of node i's shape but for size-1 axes
    # still to broadcast; ``own[i]``: acc[i] is an array made here, of node i's full shape,
    # that further terms are added into in place (b + up and np.add(b, up, out=b) are equal)
    own = [False] * len(vals)
    shapes = fit.shapes
    for i, rk in zip(tree.node, _cells(r, targets, fit)):
        a = acc[i]
        acc[i] = rk if a is None else a + rk
    for i in range(len(vals) - 1, 0, -1):   # children after their parents: push back up
        a = acc[i]
        if a is None:
            continue
        ax = tree.axis[i] + 1   # the summed axis restored (np.expand_dims, without its checks)
        up = a.reshape(a.shape[:ax] + (1,) + a.shape[ax:])
        j = tree.parent[i]
        b = acc[j]
        if b is None:
            acc[j] = up
        elif own[j]:
            np.add(b, up, out=b)
        else:
            acc[j] = b = b + up
            own[j] = b.shape == shapes[j]
    top = acc[0]
    if top is None:
        return loss, np.zeros(p.shape), fitted
    if top.shape != p.shape:
        top = np.array(np.broadcast_to(top, p.shape))
    return loss, top, fitted


def _step(p: np.ndarray, grad: np.ndarray, eta: float) -> np.ndarray:
    axes = tuple(range(1, p.ndim))
    q = grad - grad.max(axis=axes, keepdims=True)
    np.multiply(-eta, q, out=q)
    np.exp(q, out=q)
    np.multiply(p, q, out=q)
    return np.divide(q, q.sum(axis=axes, keepdims=True), out=q)


def global_fit(domain: Domain, tables: Sequence[Factor], variances: Sequence[Variance], *,
               max_iter: int = MAX_ITER, patience: int = PATIENCE, n_probes: int = PROBES,
               seed: int = PROBE_SEED, smoothed: Sequence[Sequence[np.ndarray]] | None = None,
               noise: Sequence[Noise | Variance] | None = None,
               on_iterate: Callable[[int, np.ndarray, float], None] | None = None) -> GlobalFit:
    """The fit of the module docstring, the divergence averaged over ``n_probes`` probes.
    ``smoothed``: the descent fits these tables instead of the measurements — ``smoothed[0]``
    an estimator's tables at the measurements, ``smoothed[i]`` its tables at the i-th probe's
    (y + :data:`PROBE_STEP`·σ·:func:`probes` ``(tables, seed + i − 1)``) — and SURE is that of
    the composition (the residual still to the measurements). ``noise``: the measurements'
    noise when it is not independent cells of ``variances`` (:class:`Noise`; the probes are
    then y + :data:`PROBE_STEP`·L·b, and SURE = Σ‖(y − p)/σ‖² − tr(W·Cov) + 2·tr(W·J·Cov), W =
    diag(1/σ²)). ``on_iterate(t, p_t, SURE_t)``: called every iteration (tests, benchmarks)."""
    if domain.size() > MAX_CELLS:
        raise ValueError(f"global fit: the domain has {domain.size():,} cells, more than "
                         f"{MAX_CELLS:,}")
    targets = _targets(domain, tables, variances)
    runs = 1 + n_probes
    nz = [_noise(t, v) for t, v in zip(tables, variances if noise is None else noise)]
    # the probes' noise draws L·b per run (0 for the run at the measurements), domain axes
    unit = [np.stack([np.zeros(t.y.shape)] + [np.transpose(z.unit(b), t.perm) for b in bs])
            for t, z, bs in zip(targets, nz, zip(*[probes(tables, seed + i)
                                                  for i in range(n_probes)]))]
    trace = sum(float((np.transpose(z.projected_var(()), t.perm) / t.sd ** 2).sum())
                for t, z in zip(targets, nz))
    shift = [PROBE_STEP * u for u in unit]
    if smoothed is not None:   # the fitted tables' offsets from the measurements, per run
        shift = [np.stack([np.transpose(np.asarray(run[k], dtype=float), t.perm) for run in
                           smoothed]) - t.y for k, t in enumerate(targets)]
    p = np.full((runs,) + tuple(domain.shape), 1.0 / domain.size())
    plan = _fit(p.shape, targets, shift)
    loss, grad, fit = _loss_grad(p, targets, shift, plan)
    # the risk's terms end to end as the fitted cells: the probes' draws over σ², y, σ
    weight = np.concatenate([u[1:].reshape(n_probes, -1) for u in unit], axis=1) / plan.var
    y = np.concatenate([t.y.reshape(-1) for t in targets])
    sd = np.concatenate([t.sd.reshape(-1) for t in targets])
    eta = min(float(t.sd.min()) for t in targets) ** 2
    best = (np.inf, 0, p)
    it = 0
    for it in range(1, max_iter + 1):
        while True:   # backtracking on the run at the measurements (mirror-descent bound)
            q = _step(p, grad, eta)
            lq, gq, fq = _loss_grad(q, targets, shift, plan)
            d = q[0] - p[0]
            bound = loss[0] + float((grad[0] * d).sum()) + float(
                np.abs(d, out=d).sum()) ** 2 / (2 * eta)
            if lq[0] <= bound or eta < 1e-300:
                break
            eta *= 0.5
        p, loss, grad, fit = q, lq, gq, fq   # the probes' runs take the same steps
        div = float((weight * (fit[1:] - fit[0])).sum()) / PROBE_STEP / n_probes
        res = float((((fit[0] - y) / sd) ** 2).sum())
        risk = res - trace + 2.0 * div
        if on_iterate is not None:
            on_iterate(it, p[0], risk)
        if risk < best[0]:
            best = (risk, it, p)
        elif it - best[1] >= patience:
            break
        eta *= GROWTH
    return GlobalFit(best[2][0], best[1], float(best[0]), it, best[2])


def one_step(domain: Domain, runs: Sequence[Sequence[Factor]], variances: Sequence[Variance],
             scale: float = ONE_STEP_SCALE) -> GlobalFit:
    """Private-PGM's first mirror-descent step from the uniform table (McKenna, Sheldon &
    Miklau, ICML 2019, §3 and Alg. 1 with ``mbi``'s initial step 2/L, L = max_S 1/σ²_S):
    p ∝ exp(``scale``·Σ_S (σ²_min/σ²_S)·y_S) (the gradient at the uniform table is constant on
    each table but for −y_S/σ²_S), for every run (``runs[0]`` the measurements, ``runs[i]``
    the i-th probe's), so that its SURE is that of a smooth map of y. One variance per table."""
    v = [float(np.max(np.asarray(x, dtype=float))) for x in variances]
    vmin = min(v)
    out = np.zeros((len(runs),) + tuple(domain.shape))
    for k, t in enumerate(runs[0]):
        _, perm, shape = _placement(domain, t)
        y = np.stack([np.transpose(np.asarray(r[k].values, dtype=float), perm) for r in runs])
        out += (scale * vmin / v[k]) * y.reshape((len(runs),) + shape)
    axes = tuple(range(1, out.ndim))
    out -= out.max(axis=axes, keepdims=True)
    np.exp(out, out=out)
    out /= out.sum(axis=axes, keepdims=True)
    return GlobalFit(out[0], 1, float("nan"), 1, out)


def query_sets(tables: Sequence[Factor], ways: Sequence[int] = QUERY_WAYS
               ) -> list[tuple[str, ...]]:
    """Every attribute set of ``ways`` attributes held by some table (once each)."""
    seen: dict[frozenset[str], tuple[str, ...]] = {}
    for t in tables:
        for w in ways:
            for sub in itertools.combinations(t.domain.attrs, w):
                seen.setdefault(frozenset(sub), sub)
    return list(seen.values())


def query_sure(tables: Sequence[Factor], noise: Sequence[Noise | Variance],
               runs: Sequence[Sequence[np.ndarray]], probe: Sequence[Sequence[np.ndarray]],
               sets: Sequence[Sequence[str]], step: float = PROBE_STEP) -> float:
    """SURE of Σ_Q ‖p̂_Q − μ_Q‖² over the marginals ``sets`` (plain squared error, each Q read
    from the first table holding it): ``runs[0][k]`` the estimator's table k at the
    measurements, ``runs[i + 1][k]`` at y + ``step``·L·``probe[i]`` (L·Lᵀ the noise covariance,
    :meth:`Noise.unit`), so SURE_Q = ‖A(p̂ − y)‖² − tr(A Cov Aᵀ) + 2·mean_i (A L b_i)ᵀ
    A(p̂_i − p̂)/h, A the sum onto Q (Stein's identity with a general covariance). The tables'
    own SURE (:func:`sure`) weighs every cell of the measured tables; this one weighs what is
    asked of them, the small marginals (docs/partitioned.md "Global fit")."""
    risk = 0.0
    for q in sets:
        k = next(i for i, t in enumerate(tables) if set(q) <= set(t.domain.attrs))
        t = tables[k]
        nz = _noise(t, noise[k])
        drop = tuple(i for i, a in enumerate(t.domain.attrs) if a not in q)

        def a(x: np.ndarray) -> np.ndarray:
            return x.sum(axis=drop) if drop else x

        risk += float(((a(runs[0][k]) - a(np.asarray(t.values, dtype=float))) ** 2).sum())
        risk -= float(nz.projected_var(drop).sum())
        div = [float((a(nz.unit(b[k])) * a(r[k] - runs[0][k])).sum()) / step
               for b, r in zip(probe, runs[1:])]
        risk += 2.0 * float(np.mean(div))
    return risk


def choose_fit(domain: Domain, tables: Sequence[Factor], variances: Sequence[Variance],
               smoothed: Sequence[np.ndarray] | None,
               smoother: Callable[[list[list[Factor]]], list[list[np.ndarray]]],
               noise: Sequence[Noise | Variance] | None = None,
               direct: Sequence[Variance] | None = None
               ) -> tuple[np.ndarray | None, dict[str, Any]]:
    """A smoothing estimator's tables (``smoothed``; ``smoother`` maps many sets of tables,
    the probes', to theirs in one call, so that it may smooth them together; ``smoothed``
    None: the smoother's first set is the measurements, smoothed with the probes), the global fit
    to them (its iterate chosen likewise) or, with ``direct`` (one loss variance per table,
    Private-PGM's weights), the global fit to the measurements themselves and (with
    :data:`ONE_STEP`) Private-PGM's first mirror-descent step from the uniform table
    (:func:`one_step`, ibid. Alg. 1), whichever has the
    smallest :func:`query_sure` on the 2- and 3-way marginals the tables hold (the same
    :data:`PROBES` probes for all), under the noise ``noise`` (default: ``variances``, the
    loss's): (the chosen fit's table, or None for the smoothed tables; ``{"chosen": "global" |
    "measurements" | "one-step" | "consistent", "sure_global", "sure_measurements",
    "sure_one-step", "sure_consistent", "iterations"}`` or, above :data:`MAX_CELLS` cells,
    ``{"chosen": "consistent", "reason"}``). The step is a smooth map of the measurements (a
    softmax of a weighted sum of them), so its risk is estimated as reliably as the others';
    it wins where the data concentrate on a few cells of the domain (near-deterministic
    networks), which the descents, stopped early, approach slowly. The risk is that of the
    small marginals, not of the measured tables' cells:
    where the tables are large (4 to 6 attributes at large ε), the iterate of smallest SURE on
    their cells smooths the many high-order cells and loses on the pairs. The fit to the
    measurements keeps the dependence that the marginal polytope (p ≥ 0 over the whole domain)
    reveals in skewed data, where the smoothed tables shrink it toward independence
    (docs/partitioned.md "Global fit")."""
    info: dict[str, Any] = {"chosen": "consistent"}
    if domain.size() > MAX_CELLS:
        info["reason"] = (f"the domain has {domain.size():,} cells, more than the global "
                          f"fit's {MAX_CELLS:,}")
        return None, info
    noise = variances if noise is None else noise
    bs = [probes(tables, PROBE_SEED + i) for i in range(PROBES)]
    moved = [[Factor(t.domain, np.asarray(t.values) + PROBE_STEP * _noise(t, v).unit(bb))
              for t, v, bb in zip(tables, noise, b)] for b in bs]
    if smoothed is None:   # the measurements' smoothed tables with the probes', in one call
        runs = smoother([list(tables)] + moved)
    else:
        runs = [list(smoothed)] + smoother(moved)
    sets = query_sets(tables)
    fits = {"global": global_fit(domain, tables, variances, smoothed=runs, noise=noise)}
    if direct is not None:
        fits["measurements"] = global_fit(domain, tables, direct, noise=noise,
                                          patience=DIRECT_PATIENCE)
        if ONE_STEP:
            fits["one-step"] = one_step(domain, [list(tables)] + moved, direct)
    risks = {"consistent": query_sure(tables, noise, runs, bs, sets)}
    for name, fit in fits.items():
        fitted = [[Factor(domain, p).project(t.domain.attrs).values for t in tables]
                  for p in fit.runs]
        risks[name] = query_sure(tables, noise, fitted, bs, sets)
        info[f"iterations_{name}"] = fit.iterations
    info.update({f"sure_{k}": float(v) for k, v in risks.items()})
    info["iterations"] = fits["global"].iterations
    best = min(risks, key=lambda k: risks[k])
    info["chosen"] = best
    if best == "consistent":
        return None, info
    info["iterations"] = fits[best].iterations
    return fits[best].table, info
