"""Post-processing of noisy marginal tables that share attributes (CALM, Zhang, Wang, Li, He &
Chen, CCS 2018, §4.3–4.4; after PriView, Qardaji et al., SIGMOD 2014):

* :func:`make_consistent` — every attribute set shared by two or more tables (the closure of their
  pairwise intersections, ∅ included) gets one common sub-marginal, the inverse-variance weighted
  mean of the tables' projections; each table is shifted uniformly within the cells of that
  sub-marginal to match it. Sets are processed smallest first, so a later step never undoes an
  earlier one (its correction sums to zero on every already-consistent subset).
* :func:`norm_sub` — Norm-Sub [CALM §4.4]: zero the negative cells and shift the positive ones
  by a common δ until the table sums to its total; the Euclidean projection onto the simplex.
* :func:`shrink_to_independence` — positive-part James–Stein shrinkage (Efron & Morris 1973,
  shrinking toward a fitted sub-model) of a noisy table toward the product of its own 1-way
  marginals, with the noise variance known (oracle noise plus user sampling). Not part of
  CALM: it keeps every 1-way marginal (so consistency on single attributes survives it) and
  removes much of the noise of large tables at small ε, where the tables' dependence is below
  the noise, and of the user sampling at large ε.
* :func:`shrink_hierarchical` — the same shrinkage level by level: every pair toward
  independence with the variance of its consistent estimate, every larger attribute set's
  top-order interaction toward the maximum-entropy table with its shrunk sub-marginals
  (pooled James–Stein where a set alone has too few dimensions); not part of CALM.
* :func:`postprocess` — CALM's alternation of the two, ending with consistency (optionally with
  the shrinkage after the first consistency step).
* :func:`max_entropy` — a marginal not collected directly, as the maximum-entropy table with the
  given sub-marginals (iterative proportional fitting from the uniform table; Deming & Stephan
  1940, CALM §4.5).

Tables are :class:`~.domain.Factor` objects (axes named by attribute).
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.proper import project_simplex, project_simplex_rows

__all__ = ["Consistency", "expand", "make_consistent", "norm_sub", "postprocess",
           "postprocess_stacked",
           "shrink_to_independence", "shrink_hierarchical", "independence", "interaction",
           "max_entropy", "MaxEntResult", "shared_sets", "disagreement"]


def _ordered(attrs: frozenset[str], like: Sequence[str]) -> tuple[str, ...]:
    return tuple(a for a in like if a in attrs)


def shared_sets(attr_sets: Sequence[frozenset[str]]) -> list[frozenset[str]]:
    """Every attribute set contained in two or more of ``attr_sets`` that matters for
    consistency: the closure of pairwise intersections under intersection (∅ included),
    smallest first."""
    found = {a & b for a, b in itertools.combinations(attr_sets, 2)}
    while True:
        more = {a & b for a, b in itertools.combinations(found, 2)} - found
        if not more:
            break
        found |= more
    return sorted(found, key=lambda s: (len(s), sorted(s)))


def expand(delta: np.ndarray, sub: tuple[str, ...], axes: tuple[str, ...]) -> np.ndarray:
    """``delta`` over ``sub`` broadcastable against a table over ``axes`` (⊇ sub)."""
    order = [a for a in axes if a in sub]
    d = np.transpose(delta, [sub.index(a) for a in order]) if sub else delta
    shape = [delta.shape[sub.index(a)] if a in sub else 1 for a in axes]
    return np.reshape(d, shape)


@dataclass(frozen=True)
class _Step:
    """One shared set A: for each member table k, the axes summed out to get its projection
    onto A (in the order of A as it appears in ``ref``), the transpose into that order, and
    the reshape broadcasting a correction back, plus c_k = cells per A-cell."""

    members: tuple[int, ...]
    drop: tuple[tuple[int, ...], ...]
    perm: tuple[tuple[int, ...], ...]
    back: tuple[tuple[int, ...], ...]
    unperm: tuple[tuple[int, ...], ...]
    cells: tuple[float, ...]


def _plan(axes: Sequence[tuple[str, ...]], shapes: Sequence[tuple[int, ...]]) -> list[_Step]:
    sets = [frozenset(a) for a in axes]
    steps = []
    for A in shared_sets(sets):
        members = tuple(k for k, s in enumerate(sets) if A <= s)
        if len(members) < 2:
            continue
        ref = _ordered(A, axes[members[0]])
        drop, perm, back, unperm, cells = [], [], [], [], []
        for k in members:
            ax = axes[k]
            kept = [a for a in ax if a in A]                       # A in table k's order
            drop.append(tuple(i for i, a in enumerate(ax) if a not in A))
            perm.append(tuple(kept.index(a) for a in ref))          # kept order → ref order
            unperm.append(tuple(ref.index(a) for a in kept))        # ref order → kept order
            back.append(tuple(shapes[k][i] if a in A else 1 for i, a in enumerate(ax)))
            size_a = int(np.prod([shapes[k][ax.index(a)] for a in ref], dtype=np.int64))
            cells.append(float(np.prod(shapes[k], dtype=np.int64)) / size_a)
        steps.append(_Step(members, tuple(drop), tuple(perm), tuple(back), tuple(unperm),
                           tuple(cells)))
    return steps


def _stacked(st: _Step) -> _Step:
    """``st`` for tables stacked along a new leading axis (one consistency problem each)."""
    def up(t: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(i + 1 for i in t)
    return _Step(st.members, tuple(up(d) for d in st.drop), tuple((0,) + up(p) for p in st.perm),
                 tuple((-1,) + b for b in st.back), tuple((0,) + up(u) for u in st.unperm),
                 st.cells)


@functools.lru_cache(maxsize=64)
def _cached_plan(axes: tuple[tuple[str, ...], ...], shapes: tuple[tuple[int, ...], ...]
                 ) -> tuple[tuple[_Step, ...], tuple[_Step, ...]]:
    """:func:`_plan`, memoized, and the same steps for stacked tables: a refresh plans the
    same tables once per level of the shrinkage and for the ``global`` estimator's risk
    probes, and the steps are immutable."""
    steps = tuple(_plan(axes, shapes))
    return steps, tuple(_stacked(st) for st in steps)


class Consistency:
    """CALM's consistency step for a fixed set of tables (attribute tuples and shapes), planned
    once: afterwards every two tables agree on the marginal of every attribute set they share
    (to rounding). ``cell_variance[k]`` is the variance of one cell of table k; the projection
    of table k onto A (c_k = |dom(k)|/|dom(A)| cells summed) has variance c_k·var_k per cell,
    and the common value is Σ_k w_k·proj_k / Σ_k w_k with w_k = 1/(c_k·var_k). Each table is
    then shifted by (common − proj_k)/c_k in every cell of the same A-cell."""

    def __init__(self, axes: Sequence[tuple[str, ...]], shapes: Sequence[tuple[int, ...]]) -> None:
        self.axes = [tuple(a) for a in axes]
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        self.steps, self.stacked_steps = _cached_plan(tuple(self.axes), tuple(self.shapes))

    def weights(self, cell_variance: Sequence[float]) -> list[np.ndarray]:
        """Per step, the members' normalised weights w_k = 1/(c_k·var_k) / Σ_j w_j."""
        out = []
        for st in self.steps:
            w = np.array([1.0 / (c * max(float(cell_variance[k]), 1e-300))
                          for k, c in zip(st.members, st.cells)])
            w /= w.sum()
            out.append(w)
        return out

    def apply(self, values: Sequence[np.ndarray], cell_variance: Sequence[float],
              weights: Sequence[np.ndarray] | None = None, stacked: bool = False
              ) -> list[np.ndarray]:
        """The consistent tables; ``weights``: :meth:`weights` of ``cell_variance``, when the
        caller applies the same variances many times (Norm-Sub's passes). ``stacked``: every
        ``values[k]`` has a leading axis, one independent set of tables per index along it
        (the probes of the ``global`` estimator, docs/partitioned.md "Global fit")."""
        vals = [np.array(v, dtype=float) for v in values]
        add = np.add.reduce
        for st, w in zip(self.stacked_steps if stacked else self.steps,
                         self.weights(cell_variance) if weights is None else weights):
            projs = [(add(vals[k], axis=d) if d else vals[k]).transpose(p)
                     for k, d, p in zip(st.members, st.drop, st.perm)]
            common = sum(wk * p for wk, p in zip(w, projs))
            for k, p, c, b, u in zip(st.members, projs, st.cells, st.back, st.unperm):
                vals[k] += ((common - p) / c).transpose(u).reshape(b)
        return vals


def make_consistent(tables: Sequence[Factor], cell_variance: Sequence[float]) -> list[Factor]:
    """:class:`Consistency` on :class:`~.domain.Factor` tables."""
    plan = Consistency([t.domain.attrs for t in tables], [t.domain.shape for t in tables])
    return [Factor(t.domain, v)
            for t, v in zip(tables, plan.apply([t.values for t in tables], cell_variance))]


def disagreement(tables: Sequence[Factor]) -> float:
    """Largest absolute difference between two tables' marginals on a set they share."""
    worst = 0.0
    for a, b in itertools.combinations(tables, 2):
        shared = frozenset(a.domain.attrs) & frozenset(b.domain.attrs)
        sub = _ordered(shared, a.domain.attrs)
        pa = a.project(sub).values
        pb = b.project(sub).values
        worst = max(worst, float(np.max(np.abs(pa - pb))))
    return worst


def norm_sub(table: Factor, total: float = 1.0) -> Factor:
    """Norm-Sub [CALM §4.4]: negative cells to 0 and a common shift of the others so the table
    sums to ``total`` — exactly the Euclidean projection onto {x ≥ 0, Σx = total}."""
    if total <= 0:
        return Factor(table.domain, np.zeros_like(table.values, dtype=float))
    return Factor(table.domain, total * project_simplex(np.asarray(table.values) / total))


def independence(values: np.ndarray) -> np.ndarray:
    """The product of a table's 1-way marginals, scaled to its total (uniform 1-way
    marginals where the total is 0)."""
    return _independence(np.asarray(values, dtype=float)[None])[0]


def _independence(x: np.ndarray) -> np.ndarray:
    """:func:`independence` of each table of a stack (leading axis)."""
    lead = (len(x),) + (1,) * (x.ndim - 1)
    total = np.add.reduce(x, axis=tuple(range(1, x.ndim))).reshape(lead)
    some = total != 0
    nu = np.broadcast_to(total, x.shape)
    for i in range(1, x.ndim):
        m = np.add.reduce(x, axis=tuple(j for j in range(1, x.ndim) if j != i))
        shape = [len(x)] + [1] * (x.ndim - 1)
        shape[i] = m.shape[1]
        m = m.reshape(shape)
        nu = nu * np.where(some, m / np.where(some, total, 1.0), 1.0 / m.shape[i])
    return np.array(nu)


def shrink_to_independence(values: np.ndarray, noise_variance: float) -> tuple[np.ndarray,
                                                                               float]:
    """Positive-part James–Stein: ν + λ(x − ν), ν = total·Π_a (m_a/total) the product of the
    table's 1-way marginals m_a, λ = clip(1 − (p − r − 2)·σ²/‖x − ν‖², 0, 1) with p cells,
    r = Σ_a (d_a − 1) + 1 parameters of ν, σ² the per-cell noise variance. x − ν sums to zero
    along every axis, so every 1-way marginal is kept exactly. Returns (table, λ).

    One λ for the whole table: for a w ≥ 3 table it shrinks its pairwise dependence together
    with its (noisier) higher-order interaction. Measured: on the Bayesian-network sample
    (weak dependence) that helps collected triples a lot; on six Adult columns (strong
    pairwise dependence, large triples) it hurts them (2-way TVD from triples 0.21 vs 0.18
    without it at ε = 1) — collecting pairs is the better choice there anyway
    (docs/partitioned.md)."""
    x = np.asarray(values, dtype=float)
    if x.ndim < 2:
        return x.copy(), 1.0
    nu = independence(x)
    r = sum(d - 1 for d in x.shape) + 1
    k = max(x.size - r - 2, 0)
    dev = float(((x - nu) ** 2).sum())
    lam = 1.0 if dev <= 0 else min(1.0, max(0.0, 1.0 - k * float(noise_variance) / dev))
    return nu + lam * (x - nu), lam


def _residual_dims(shape: Sequence[int]) -> int:
    """Dimension of the top-order interaction of a table: Π_a (d_a − 1)."""
    return int(np.prod([d - 1 for d in shape], dtype=np.int64))


def _js_factor(q: int, dev: float, noise_variance: float) -> float:
    """Positive-part James–Stein factor clip(1 − (q − 2)·σ²/dev, 0, 1)."""
    if dev <= 0:
        return 1.0
    return min(1.0, max(0.0, 1.0 - max(q - 2, 0) * float(noise_variance) / dev))


def interaction(values: np.ndarray) -> np.ndarray:
    """The top-order interaction of a table: the table centred along every axis
    (x ×_a (I − J/d_a) for every axis a), the orthogonal projection onto the Π_a (d_a − 1)
    dimensions that no marginal of fewer attributes sees; x minus it keeps every marginal of
    the other attributes' subsets exactly."""
    return _interaction(np.asarray(values, dtype=float)[None])[0]


def _interaction(r: np.ndarray) -> np.ndarray:
    """:func:`interaction` of each table of a stack (leading axis)."""
    for i in range(1, r.ndim):
        r = r - r.mean(axis=i, keepdims=True)
    return r


#: a shrinkage target of more cells than this is IPF's last sweep, not refitted to the closest
#: realizable marginals (a dense least-squares solve, cubic in the cells: minutes for the 5- and
#: 6-way tables of ``ways: auto`` at large ε); any target keeps the sub-marginals exact
#: (:func:`shrink_hierarchical`), a closer one only shrinks better
REFIT_CELLS = 512


def _maxent_below(domain: Domain, x: np.ndarray) -> np.ndarray:
    """The maximum-entropy table with the (w−1)-way sub-marginals of each table of the stack
    ``x`` (leading axis; negative cells clipped), scaled to its total (IPF alone above
    :data:`REFIT_CELLS` cells)."""
    attrs = domain.attrs
    subs = [_project(domain, x, tuple(b for b in attrs if b != a)) for a in attrs]
    vals = _max_entropy_stacked(domain, subs, refit=domain.size() <= REFIT_CELLS)[0]
    total = np.add.reduce(x, axis=tuple(range(1, x.ndim)))
    return total.reshape((len(x),) + (1,) * (x.ndim - 1)) * vals


#: a set whose interaction has fewer dimensions than this cannot be shrunk by James–Stein on
#: its own (the factor needs q − 2 > 0); such pairs share one pooled λ
POOL_BELOW = 3


def shrink_hierarchical(tables: Sequence[Factor], noise_variance: Sequence[float]
                        ) -> list[np.ndarray]:
    """Hierarchical positive-part James–Stein shrinkage of consistent tables, level by level
    (not in CALM; Efron & Morris 1973: shrinkage toward a fitted sub-model, and across
    related tables).

    Level w = 2, 3, … up to the largest table: every attribute set S of w attributes inside
    some table is projected from the current tables, x_S, and its top-order part R_S (the part
    no marginal of fewer attributes sees; q_S = Π(d_a − 1) dimensions) shrunk: x_S − (1 − λ)R_S,
    which keeps every (w−1)-way sub-marginal of x_S. For a pair R_S = x_S − the product of its
    1-way marginals (:func:`shrink_to_independence`); for w ≥ 3 R_S = the :func:`interaction`
    of x_S minus that of the maximum-entropy table with x_S's (w−1)-way sub-marginals (the
    target keeps the log-linear model without a w-way term, e.g. a Markov chain's triple,
    while the linear interaction keeps the sub-marginals exact even with negative cells).
    λ = clip(1 − (q − 2)σ²/‖R‖², 0, 1) per set where q_S ≥ :data:`POOL_BELOW`; the smaller
    pairs, and all sets of a level w ≥ 3, share one λ (James–Stein on the residuals scaled by
    σ_S, q = Σ q_S). σ²_S, the noise variance of one cell of x_S, is the inverse-variance
    combination over the tables containing S (c cells summed in each): a pair inside m − 2
    collected triples is shrunk with the smaller variance of its consistent estimate. Every
    table is then shifted to agree with the shrunk sets (the consistency step with them as
    exact tables: the minimum-norm additive lift) before the next level. Returns each table's
    new values; a
    table of q ≥ 3 collected alone (pairs of Adult) gets :func:`shrink_to_independence`."""
    return [v[0] for v in _shrink_stacked([t.domain for t in tables],
                                          [np.asarray(t.values, dtype=float)[None]
                                           for t in tables], noise_variance)]


def _project(domain: Domain, x: np.ndarray, attrs: tuple[str, ...]
             ) -> tuple[Domain, np.ndarray]:
    """:meth:`~.domain.Factor.project` of each table of a stack (leading axis): (the domain of
    one projected table, the projected stack)."""
    keep = domain.axes(attrs)
    drop = tuple(i + 1 for i in range(len(domain)) if i not in keep)
    vals = np.add.reduce(x, axis=drop) if drop else x
    remaining = [i for i in range(len(domain)) if i in keep]
    return (domain.project(attrs),
            vals.transpose((0,) + tuple(remaining.index(i) + 1 for i in keep)))


def _squares(r: np.ndarray) -> np.ndarray:
    """Σ r² of each table of a stack (leading axis)."""
    return np.add.reduce(r ** 2, axis=tuple(range(1, r.ndim)))


def _shrink_stacked(domains: Sequence[Domain], stacked: Sequence[np.ndarray],
                    noise_variance: Sequence[float]) -> list[np.ndarray]:
    """:func:`shrink_hierarchical` of each set of tables of a stack (``stacked[k]``: table k,
    leading axis the sets; one λ per set of tables)."""
    axes = [tuple(d.attrs) for d in domains]
    vals = [np.array(v, dtype=float) for v in stacked]
    var = [max(float(v), 1e-300) for v in noise_variance]
    cells = [d.size() for d in domains]
    runs = len(vals[0]) if vals else 0
    top = max((len(a) for a in axes), default=0)
    for w in range(2, top + 1):
        level: dict[frozenset[str], list[int]] = {}
        for k, ax in enumerate(axes):
            for sub in itertools.combinations(ax, w):
                level.setdefault(frozenset(sub), []).append(k)
        sets = list(level)
        xs, s2 = [], []
        for S in sets:
            k0 = level[S][0]
            d, x = _project(domains[k0], vals[k0], _ordered(S, axes[k0]))
            xs.append((d, x))
            s2.append(1.0 / sum(d.size() / (cells[k] * var[k]) for k in level[S]))
        if w == 2:
            res = [x - _independence(x) for d, x in xs]
        else:
            res = [_interaction(x) - _interaction(_maxent_below(d, x)) for d, x in xs]
        qs = [_residual_dims(d.shape) for d, x in xs]
        ss = [_squares(r) for r in res]
        lam = [[_js_factor(q, float(d[b]), v) for q, d, v in zip(qs, ss, s2)]
               for b in range(runs)]
        group = [i for i, q in enumerate(qs) if w >= 3 or q < POOL_BELOW]
        for b in range(runs):
            if group:
                common = _js_factor(sum(qs[i] for i in group),
                                    sum(float(ss[i][b]) / s2[i] for i in group), 1.0)
                for i in group:
                    lam[b][i] = common
        new = [x - (1.0 - np.array([lam[b][i] for b in range(runs)]).reshape(
            (runs,) + (1,) * (r.ndim - 1))) * r for i, ((d, x), r) in enumerate(zip(xs, res))]
        lift = Consistency(axes + [d.attrs for d, x in xs],
                           [d.shape for d in domains] + [d.shape for d, x in xs])
        vals = lift.apply(vals + new, var + [0.0] * len(new), stacked=True)[:len(vals)]
    return vals


def postprocess(tables: Sequence[Factor], cell_variance: Sequence[float], rounds: int = 30,
                tol: float = 1e-6, noise_variance: Sequence[float] | None = None,
                hierarchical: bool = True) -> tuple[list[Factor], int]:
    """CALM's post-processing: consistency, then alternately Norm-Sub and consistency until no
    cell is below −``tol`` (or ``rounds`` Norm-Sub passes); ends with consistency, so the tables
    agree exactly on shared sets and may keep cells slightly below 0. With ``noise_variance``
    (per-cell variance of each table around its target), the tables are shrunk after the first
    consistency step: by :func:`shrink_hierarchical` (default), or with ``hierarchical=False``
    each toward the product of its own 1-way marginals (:func:`shrink_to_independence`, one λ
    per table). Returns (tables, Norm-Sub passes)."""
    vals, passes = postprocess_stacked([t.domain for t in tables],
                                       [np.asarray(t.values, dtype=float)[None] for t in tables],
                                       cell_variance, rounds, tol, noise_variance, hierarchical)
    return [Factor(t.domain, v[0]) for t, v in zip(tables, vals)], passes[0]


def _norm_sub_stacked(x: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """:func:`norm_sub` of each table of a stack (leading axis) to its total (0 where the
    total is not positive)."""
    t = totals.reshape((len(x),) + (1,) * (x.ndim - 1))
    some = t > 0
    flat = (x / np.where(some, t, 1.0)).reshape(len(x), -1)
    return np.where(some, t * project_simplex_rows(flat).reshape(x.shape), 0.0)


def postprocess_stacked(domains: Sequence[Domain], stacked: Sequence[np.ndarray],
                        cell_variance: Sequence[float], rounds: int = 30, tol: float = 1e-6,
                        noise_variance: Sequence[float] | None = None,
                        hierarchical: bool = True) -> tuple[list[np.ndarray], list[int]]:
    """:func:`postprocess` of many sets of tables of the same domains at once (``stacked[k]``:
    table k of every set, stacked along a leading axis), each set as if alone (its own
    shrinkage factors and Norm-Sub passes): the ``global`` estimator's risk probes
    (docs/partitioned.md "Global fit"). Returns (stacked tables, passes per set)."""
    plan = Consistency([d.attrs for d in domains], [d.shape for d in domains])
    w = plan.weights(cell_variance)
    vals = plan.apply(stacked, cell_variance, w, stacked=True)
    runs = len(vals[0]) if vals else 0
    if noise_variance is not None:
        if hierarchical:
            shrunk = _shrink_stacked(domains, vals, noise_variance)
        else:
            shrunk = [np.stack([shrink_to_independence(x, s2)[0] for x in v])
                      for v, s2 in zip(vals, noise_variance)]
        vals = plan.apply(shrunk, cell_variance, w, stacked=True)
    passes = [0] * runs
    while True:
        live = [b for b in range(runs) if passes[b] < rounds
                and min(float(v[b].min()) for v in vals) < -tol]
        if not live:
            break
        totals = np.array([float(np.mean([v[b].sum() for v in vals])) for b in live])
        moved = plan.apply([_norm_sub_stacked(v[live], totals) for v in vals], cell_variance,
                           w, stacked=True)
        for v, m in zip(vals, moved):
            v[live] = m
        for b in live:
            passes[b] += 1
    return vals, passes


@dataclass(frozen=True)
class MaxEntResult:
    table: Factor
    iterations: int
    converged: bool
    gap: float


#: :func:`max_entropy`'s defaults: IPF's tolerance, sweeps at most, and stall ratio
MAXENT_TOL, MAXENT_SWEEPS, MAXENT_STALL = 1e-7, 200, 1e-4


def max_entropy(domain: Domain, constraints: Sequence[Factor], *, tol: float = MAXENT_TOL,
                max_iter: int = MAXENT_SWEEPS, stall: float = MAXENT_STALL, refit: bool = True
                ) -> MaxEntResult:
    """The maximum-entropy distribution over ``domain`` whose marginals on the constraint
    tables' attributes equal them (negatives clipped, each rescaled to sum 1), by iterative
    proportional fitting from the uniform table. ``gap`` is the largest |marginal − target|
    seen in the last sweep. Targets that are not exactly consistent cannot all be met and IPF
    cycles close to them: it stops once a sweep changes the gap by less than ``stall`` × gap;
    then, with ``refit`` (default), the fit is redone toward the closest realizable marginals
    (:func:`~.marginal_fit.fit_marginals`), where IPF converges, and ``gap`` is their distance
    to the targets. ``converged=False`` only when that IPF does not come within
    :data:`~.marginal_fit.TOL` of them in :data:`~.marginal_fit.MAX_SWEEPS` sweeps."""
    vals, its, conv, gaps = _max_entropy_stacked(
        domain, [(c.domain, np.asarray(c.values, dtype=float)[None]) for c in constraints],
        tol=tol, max_iter=max_iter, stall=stall, refit=refit)
    return MaxEntResult(Factor(domain, vals[0]), its[0], conv[0], gaps[0])


def _max_entropy_stacked(domain: Domain, constraints: Sequence[tuple[Domain, np.ndarray]], *,
                         tol: float = MAXENT_TOL, max_iter: int = MAXENT_SWEEPS,
                         stall: float = MAXENT_STALL, refit: bool = True
                         ) -> tuple[np.ndarray, list[int], list[bool], list[float]]:
    """:func:`max_entropy` of many sets of constraints at once (``constraints[k]``: the domain
    of constraint k, its table in every set stacked along a leading axis), each as if alone:
    (tables stacked, iterations, converged, gap), per set."""
    from ldpstream.estimators.kernels.marginal_fit import fit_stacked, ipf_stacked, plans_stacked
    targets = plans_stacked(domain, constraints)
    vals, its, gaps = ipf_stacked(domain, targets, tol=tol, max_iter=max_iter, stall=stall)
    conv = [g <= tol for g in gaps]
    redo = [b for b, g in enumerate(gaps) if g > tol] if refit else []
    if redo:
        again, more, ok, off = fit_stacked(domain, [(d, t[redo], s) for d, t, s in targets])
        for i, b in enumerate(redo):
            vals[b], its[b], conv[b], gaps[b] = again[i], its[b] + more[i], ok[i], off[i]
    return vals, its, conv, gaps
