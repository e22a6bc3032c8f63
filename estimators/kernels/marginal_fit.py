"""The fit of a table to noisy, possibly inconsistent marginals (docs/partitioned.md
"Maximum-entropy fit"): the maximum-entropy table whose marginals on the constraint sets S are
the closest realizable ones to the targets y_S in L2.

Noisy marginals, even made consistent on shared attributes, are often the marginals of no
distribution; iterative proportional fitting (IPF) toward them then cycles and never converges.
The fit has two exact steps:

1. the closest realizable marginals μ* = argmin ½·Σ_S ‖p_S − y_S‖² over distributions p of the
   table — a non-negative least-squares problem in p (Lawson–Hanson active set,
   ``scipy.optimize.nnls``, with Σp = 1 as a heavily weighted row); μ* is unique (the loss is
   strictly convex in the marginals) even where p is not;
2. IPF from the uniform table toward μ*, which are realizable, so it converges: the result is
   the maximum-entropy table with marginals μ*, the member of the graphical model
   p ∝ exp(Σ_S θ_S(x_S)) (or its closure) that Private-PGM fits with the same loss (McKenna,
   Sheldon & Miklau, ICML 2019, §3).

With consistent targets μ* = y and the fit is IPF's maximum-entropy table. ``converged`` refers
to step 2: its largest |p_S − μ*_S| ≤ ``tol`` (default :data:`TOL`, 1e-4: IPF approaches a μ* on
the boundary of the realizable set at rate 1/sweeps, within :data:`MAX_SWEEPS`; measured on
generated networks, the table then moves by less than 1e-3 in TVD over 4,000 more sweeps); ``gap`` is the largest
|μ*_S − y_S|, the targets' inconsistency, which no table can remove.

>>> from ldpstream.estimators.kernels.domain import Domain, Factor
>>> dom = Domain(["a", "b", "c"], [2, 2, 2])
>>> ab = Factor(Domain(["a", "b"], [2, 2]), np.array([[0.4, 0.1], [0.1, 0.4]]))
>>> bc = Factor(Domain(["b", "c"], [2, 2]), np.array([[0.4, 0.1], [0.1, 0.4]]))
>>> ac = Factor(Domain(["a", "c"], [2, 2]), np.array([[0.1, 0.4], [0.4, 0.1]]))  # contradicts
>>> r = fit_marginals(dom, [ab, bc, ac])
>>> r.converged, r.gap > 0.01, round(float(r.table.values.sum()), 12)
(True, True, 1.0)
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.optimize import nnls

from ldpstream.estimators.kernels.blas import blas_limit
from ldpstream.estimators.kernels.domain import Domain, Factor

__all__ = ["fit_marginals", "fit_stacked", "FitResult", "ipf", "ipf_stacked",
           "closest_marginals", "plans", "plans_stacked", "TOL", "MAX_SWEEPS"]

#: how close IPF must come to the closest realizable marginals (largest cell difference)
TOL = 1e-4
#: IPF sweeps toward them at most
MAX_SWEEPS = 10_000
#: weight of the Σp = 1 row in the least-squares problem (relative to a marginal cell's)
_SUM_WEIGHT = 1e3


@dataclass(frozen=True)
class FitResult:
    """``table``; IPF ``iterations``; ``converged`` (IPF met μ*); ``gap`` (largest
    |μ* − y|)."""

    table: Factor
    iterations: int
    converged: bool
    gap: float


Plan = tuple[tuple[int, ...], np.ndarray, tuple[int, ...]]


def plans(domain: Domain, constraints: Sequence[Factor]) -> list[Plan]:
    """Per constraint: (axes summed out, target in domain axis order — clipped at 0 and
    rescaled to sum 1, broadcast shape)."""
    return [(d, t[0], s) for d, t, s in plans_stacked(
        domain, [(c.domain, np.asarray(c.values, dtype=float)[None]) for c in constraints])]


def plans_stacked(domain: Domain, constraints: Sequence[tuple[Domain, np.ndarray]]
                  ) -> list[Plan]:
    """:func:`plans` of many sets of constraints at once: ``constraints[k]`` = (the domain of
    constraint k, its table in every set, stacked along a leading axis); the targets keep that
    axis (each set clipped and rescaled on its own)."""
    out = []
    for dom, c in constraints:
        t = np.maximum(c, 0.0)
        lead = (len(t),) + (1,) * (t.ndim - 1)
        s = np.add.reduce(t, axis=tuple(range(1, t.ndim))).reshape(lead)
        some = s > 0
        t = np.where(some, t / np.where(some, s, 1.0), 1.0 / dom.size())
        ax = domain.axes(dom.attrs)
        kept = sorted(ax)
        t = t.transpose((0,) + tuple(list(ax).index(i) + 1 for i in kept))
        drop = tuple(i for i in range(len(domain)) if i not in ax)
        shape = tuple(domain.shape[i] if i in ax else 1 for i in range(len(domain)))
        out.append((drop, t, shape))
    return out


def _marginal(p: np.ndarray, drop: tuple[int, ...]) -> np.ndarray:
    return p.sum(axis=drop) if drop else p


def ipf(domain: Domain, targets: Sequence[Plan], *, tol: float, max_iter: int,
        stall: float = 0.0, start: np.ndarray | None = None) -> tuple[np.ndarray, int, float]:
    """Iterative proportional fitting (Deming & Stephan 1940) from ``start`` (uniform):
    (table, sweeps, largest |marginal − target| of the last sweep). Stops at ``tol``, after
    ``max_iter`` sweeps, or once a sweep changes that gap by at most ``stall`` × gap."""
    vals, its, gaps = ipf_stacked(domain, [(d, t[None], s) for d, t, s in targets], tol=tol,
                                  max_iter=max_iter, stall=stall,
                                  start=None if start is None else np.asarray(start)[None])
    return vals[0], its[0], gaps[0]


def ipf_stacked(domain: Domain, targets: Sequence[Plan], *, tol: float, max_iter: int,
                stall: float = 0.0, start: np.ndarray | None = None
                ) -> tuple[np.ndarray, list[int], list[float]]:
    """:func:`ipf` of many sets of targets at once (every target with a leading axis, one set
    per index; :func:`plans_stacked`), each set stopped by its own gap as if alone: (tables
    stacked, sweeps per set, gap per set)."""
    runs = len(targets[0][1]) if targets else 1
    out = np.empty((runs,) + tuple(domain.shape))
    its = [0] * runs
    gaps = [float(np.inf)] * runs
    live = list(range(runs))
    vals = (np.full(out.shape, 1.0 / domain.size()) if start is None
            else np.array(start, dtype=float))
    goal = list(targets)
    add, top = np.add.reduce, np.maximum.reduce
    prev = np.full(runs, np.inf)
    for it in range(1, max_iter + 1):
        gap = np.zeros(len(live))
        for drop, t, shape in goal:
            cur = add(vals, axis=tuple(i + 1 for i in drop)) if drop else vals
            gap = np.maximum(gap, top(np.abs(cur - t), axis=tuple(range(1, cur.ndim))))
            ratio = np.divide(t, cur, out=np.zeros_like(t), where=cur > 0)
            np.multiply(vals, ratio.reshape((len(live),) + shape), out=vals)   # ours: in place
        stop = (gap <= tol) | (np.abs(prev - gap) <= stall * gap)
        if it == max_iter:
            stop[:] = True
        for i in np.nonzero(stop)[0]:
            out[live[i]] = vals[i]
            its[live[i]] = it
            gaps[live[i]] = float(gap[i])
        if stop.all():
            return out, its, gaps
        keep = np.nonzero(~stop)[0]
        if len(keep) < len(live):   # drop the stopped sets from the stack
            live = [live[i] for i in keep]
            vals = vals[keep]
            goal = [(d, t[keep], s) for d, t, s in goal]
            gap = gap[keep]
        prev = gap
    out[live] = vals   # max_iter = 0: the start
    return out, its, gaps


def _design(domain: Domain, targets: Sequence[Plan]) -> np.ndarray:
    """The matrix mapping a flat table to its stacked marginals."""
    size = domain.size()
    eye = np.eye(size).reshape((size,) + tuple(domain.shape))
    return np.vstack([_marginal(eye, tuple(d + 1 for d in drop)).reshape(size, -1).T
                      for drop, t, shape in targets])


@functools.lru_cache(maxsize=256)
def _system(shape: tuple[int, ...], drops: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """The least-squares matrix of :func:`closest_marginals` (the design and the Σp row) for
    a domain's shape and the constraints' summed axes, built once per layout (read-only): the
    hierarchical shrinkage refits tables of the same layouts at every refresh and probe."""
    dom = Domain([f"a{i}" for i in range(len(shape))], list(shape))
    size = dom.size()
    A = np.vstack([_design(dom, [(d, np.empty(0), ()) for d in drops]),
                   np.full((1, size), _SUM_WEIGHT)])
    A.setflags(write=False)
    return A


#: how far the gradient Aᵀ(b − Ap) may exceed 0 at a zero cell for a hinted least-squares
#: solution to count as the non-negative one (:func:`_nnls_hinted`; A's entries are 0, 1 and
#: :data:`_SUM_WEIGHT`, b's the targets' cells and :data:`_SUM_WEIGHT`: rounding alone leaves
#: a few 1e-10 there)
KKT_TOL = 1e-9


def _nnls_hinted(A: np.ndarray, b: np.ndarray, hint: np.ndarray | None) -> np.ndarray:
    """argmin ‖Ap − b‖ over p ≥ 0. With ``hint`` (the cells positive in the solution of a
    nearby b, e.g. a risk probe's y + 1e-3·σ·noise): the least-squares solution on those cells
    alone, kept when it is that of the whole problem — positive on them and no zero cell
    whose gradient would lower the loss (the Karush–Kuhn–Tucker conditions, within
    :data:`KKT_TOL`): then its fitted Ap, the only part the fit uses, is the unique one of
    Lawson–Hanson's ``scipy.optimize.nnls`` (to rounding). Otherwise that solve."""
    if hint is not None and hint.size:
        sub = A[:, hint]
        # the normal equations and one step of iterative refinement (the corrected
        # semi-normal equations: measured within 1e-13 of the marginals of the solve below,
        # ten times faster than it; one BLAS thread: the caller's blas_limit)
        gram = sub.T @ sub
        try:
            z = np.linalg.solve(gram, sub.T @ b)
            z += np.linalg.solve(gram, sub.T @ (b - sub @ z))
        except np.linalg.LinAlgError:   # dependent cells: not a solution's positive set
            z = np.zeros(0)
        if z.size and bool(np.all(z > 0.0)):
            p = np.zeros(A.shape[1])
            p[hint] = z
            w = A.T @ (b - sub @ z)
            w[hint] = 0.0
            if float(w.max()) <= KKT_TOL:
                return p
    return nnls(A, b, maxiter=50 * A.shape[1])[0]


def closest_marginals(domain: Domain, targets: Sequence[Plan]) -> list[Plan]:
    """Step 1 of the module docstring: the realizable marginals closest to the targets in L2,
    as plans (same axes)."""
    return _closest(domain, targets)[0]


def _closest(domain: Domain, targets: Sequence[Plan], hint: np.ndarray | None = None
             ) -> tuple[list[Plan], np.ndarray]:
    """:func:`closest_marginals` and the cells positive in its solution; ``hint``: the cells
    likely positive (:func:`_nnls_hinted`)."""
    A = _system(tuple(domain.shape), tuple(drop for drop, t, shape in targets))
    b = np.concatenate([t.reshape(-1) for drop, t, shape in targets] + [[_SUM_WEIGHT]])
    p = _nnls_hinted(A, b, hint)
    positive = np.flatnonzero(p > 0.0)
    p = p.reshape(domain.shape) / p.sum()
    return [(drop, _marginal(p, drop), shape) for drop, t, shape in targets], positive


def fit_marginals(domain: Domain, constraints: Sequence[Factor], *, tol: float = TOL,
                  max_iter: int = MAX_SWEEPS, start: np.ndarray | None = None) -> FitResult:
    """The fit of the module docstring; ``start``: IPF's starting table (uniform)."""
    targets = plans_stacked(domain, [(c.domain, np.asarray(c.values, dtype=float)[None])
                                     for c in constraints])
    vals, its, conv, gaps = fit_stacked(domain, targets, tol=tol, max_iter=max_iter,
                                        start=None if start is None else np.asarray(start)[None])
    return FitResult(Factor(domain, vals[0]), its[0], conv[0], gaps[0])


def fit_stacked(domain: Domain, targets: Sequence[Plan], *, tol: float = TOL,
                max_iter: int = MAX_SWEEPS, start: np.ndarray | None = None
                ) -> tuple[np.ndarray, list[int], list[bool], list[float]]:
    """:func:`fit_marginals` of many sets of targets at once (:func:`plans_stacked`), each as
    if alone (its own least-squares solve, the later sets' tried first on the first set's
    positive cells, :func:`_nnls_hinted`; one stacked IPF): (tables stacked, IPF sweeps,
    converged, gap), per set."""
    runs = len(targets[0][1]) if targets else 1
    mus = []
    hint = None   # the first set's positive cells: the others (probes) are near it
    # the hinted solves are small dense products, on which a multi-threaded BLAS only spins
    with blas_limit() if runs > 1 else contextlib.nullcontext():
        for b in range(runs):
            mu, positive = _closest(domain, [(d, t[b], s) for d, t, s in targets], hint)
            mus.append(mu)
            hint = positive if hint is None else hint
    gaps = [max((float(np.max(np.abs(m[1] - t[b]))) for m, (d, t, s) in zip(mu, targets)),
                default=0.0) for b, mu in enumerate(mus)]
    vals, its, left = ipf_stacked(domain, [(d, np.stack([mu[j][1] for mu in mus]), s)
                                           for j, (d, t, s) in enumerate(targets)],
                                  tol=tol, max_iter=max_iter, start=start)
    return vals, its, [x <= tol for x in left], gaps
