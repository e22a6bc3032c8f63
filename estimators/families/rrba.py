"""RRBA — Randomized Response Block Aggregation [RRBA], with the privacy correction of
docs/mechanisms.md §4.

Client (per combination S of its view): with probability p report the true cell of Ω_S, else a
fake cell drawn from the published table floored at γ, T̃ = (1−γ)·T + γ·uniform (inverse-CDF on
the cumulative cell probabilities, vectorized over clients).

Server (eq. 4 with T̃), per block of n reports that used the same table version:
T'[v] = (o_v/n − (1−p)·T̃[v]) / p, clipped at 0 and renormalised before it is published.
Convergence (§5): stop when every cell moved less than the width δ* of the 1−α confidence
interval of a Bernoulli proportion; the estimate is the average of the last two blocks.

**Privacy — correction of the paper's Theorem 4.1.** The theorem claims ε = ln(1/(1−p)). The
channel of one combination is P[u, v] = p·1[u=v] + (1−p)·T̃[v], so its ε is
ln(1 + p/((1−p)·min_v T̃[v])) — unbounded as a cell of the (unfloored) table approaches 0. With
the floor, min T̃ ≥ γ/|Ω_S| for every table the server can publish, hence the declared
ε_S = ln(1 + p·|Ω_S|/((1−p)·γ)) (tight: reached when T has a zero cell), summed over the
combinations of a view (sequential composition over disjoint attributes).

>>> round(epsilon_combination(0.5, 0.05, 4), 4)
4.3944
>>> round(paper_epsilon(0.5), 4)            # what Theorem 4.1 would have claimed
0.6931
>>> round(solve_p(epsilon_view(0.3, 0.1, [4, 6]), 0.1, [4, 6]), 6)
0.3
>>> T = np.array([0.5, 0.5, 0.0, 0.0])
>>> eq4(np.array([30, 40, 20, 10]), floor_table(T, 0.2), 0.5).round(3).tolist()
[0.15, 0.35, 0.35, 0.15]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit, logit, ndtri  # ndtri: the normal quantile, without scipy.stats

from ldpstream.estimators.families.rrba_bounds import pooled_bound
from ldpstream.estimators.families.rrba_consistency import consistent_tables, marginal_of, maxent_table
from ldpstream.estimators.families.rrba_views import make_views
from ldpstream.estimators.kernels import device_program as dp
from ldpstream.estimators.kernels.bounds import Bound, coarsened, triangle, unbounded
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.proper import clip_rescale
from ldpstream.estimators.mechanism import (
    Estimate,
    Mechanism,
    ParamError,
    Params,
    TensorSpec,
    VersionedCounts,
    histogram,
    record_budget,
    register,
)

__all__ = [
    "floor_table", "cumulative", "sample_cells", "randomize_cells", "channel_matrix",
    "epsilon_combination", "epsilon_view", "paper_epsilon", "solve_p", "solve_gamma",
    "eq4", "publish", "ci_width", "has_converged", "pooled_estimate", "last_two_estimate",
    "BlockResult", "block_step", "RRBA", "solve_p_gamma",
]


# --- client side -----------------------------------------------------------------------------
def floor_table(T: np.ndarray, gamma: float) -> np.ndarray:
    """T̃ = (1−γ)·T + γ·uniform (docs/mechanisms.md §4 (a)); every cell ≥ γ/|Ω_S|."""
    T = np.asarray(T, dtype=float)
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
    return (1.0 - gamma) * T + gamma / T.size


def cumulative(T: np.ndarray) -> np.ndarray:
    """Cumulative cell probabilities of a raveled table, last entry forced to exactly 1."""
    cum = np.cumsum(np.asarray(T, dtype=float).ravel())
    cum /= cum[-1]
    cum[-1] = 1.0
    return cum


def sample_cells(cum: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling: the cell v with cum[v−1] ≤ u < cum[v] for uniforms ``u``."""
    return np.minimum(np.searchsorted(cum, u, side="right"), len(cum) - 1)


def randomize_cells(cells: np.ndarray, T_tilde: np.ndarray, p: float,
                    rng: np.random.Generator) -> np.ndarray:
    """One combination: keep each true cell with probability p, else a fake cell ~ T̃."""
    cells = np.asarray(cells)
    keep = rng.random(cells.shape) < p
    fake = sample_cells(cumulative(T_tilde), rng.random(cells.shape))
    return np.where(keep, cells, fake).astype(np.int64)


# --- privacy ---------------------------------------------------------------------------------
def channel_matrix(T: np.ndarray, p: float, gamma: float) -> np.ndarray:
    """Exact channel of one combination, P[u, v] = p·1[u=v] + (1−p)·T̃[v]."""
    Tt = floor_table(np.asarray(T).ravel(), gamma)
    return p * np.eye(Tt.size) + (1.0 - p) * np.tile(Tt, (Tt.size, 1))


def epsilon_combination(p: float, gamma: float, cells: int) -> float:
    """Declared ε of one combination: ln(1 + p·|Ω_S|/((1−p)·γ)) (∞ for γ = 0 or p = 1)."""
    if not 0 <= p <= 1:
        raise ValueError(f"p must be in [0, 1], got {p!r}")
    if gamma < 0:
        raise ValueError(f"gamma must be ≥ 0, got {gamma!r}")
    if p == 0:
        return 0.0
    if gamma == 0 or p == 1:
        return float("inf")
    return float(np.log1p(p * cells / ((1.0 - p) * gamma)))


def epsilon_view(p: float, gamma: float, sizes: Sequence[int]) -> float:
    """ε of one report: the sum over the view's combinations (cell counts ``sizes``)."""
    return float(sum(epsilon_combination(p, gamma, s) for s in sizes))


def paper_epsilon(p: float) -> float:
    """The (incorrect) ε = ln(1/(1−p)) of [RRBA] Theorem 4.1, for comparison only."""
    return float(-np.log1p(-p))


def solve_p(epsilon: float, gamma: float, sizes: Sequence[int]) -> float:
    """The p whose view ε (summed over ``sizes``) equals ``epsilon`` at floor γ."""
    if not (np.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    f = lambda p: epsilon_view(p, gamma, sizes) - epsilon
    return float(brentq(f, 1e-15, 1 - 1e-15, xtol=1e-15, rtol=1e-13))


def solve_gamma(epsilon: float, p: float, sizes: Sequence[int]) -> float:
    """The floor γ ∈ (0, 1] whose view ε at keep probability p equals ``epsilon``."""
    lo_eps = epsilon_view(p, 1.0, sizes)
    if epsilon < lo_eps:
        raise ValueError(f"epsilon {epsilon:g} is below {lo_eps:.4g}, the ε of p = {p:g} even "
                         "with uniform fakes (γ = 1); lower p instead")
    f = lambda g: epsilon_view(p, g, sizes) - epsilon
    return 1.0 if f(1.0) == 0 else float(brentq(f, 1e-300, 1.0, xtol=1e-300, rtol=1e-13))


# --- server side (pure functions over counts) -------------------------------------------------
def eq4(counts: np.ndarray, T_tilde: np.ndarray, p: float) -> np.ndarray:
    """[RRBA] eq. 4 with T̃: (o/n − (1−p)·T̃)/p (raw; may leave [0, 1])."""
    counts = np.asarray(counts, dtype=float)
    n = counts.sum()
    if n <= 0:
        raise ValueError("eq4: block has no reports")
    return (counts / n - (1.0 - p) * np.asarray(T_tilde, dtype=float)) / p


def publish(raw: np.ndarray) -> np.ndarray:
    """Clip at 0 and renormalise (the table published to the next block)."""
    return clip_rescale(raw)


def ci_width(v: np.ndarray, n: int, alpha: float = 0.05) -> np.ndarray:
    """δ*: width of the 1−α CI of a Bernoulli proportion v from n trials (§5): Wald
    2·z·√(v(1−v)/n), or the back-transformed log-odds interval where n·v < 5."""
    v = np.asarray(v, dtype=float)
    z = ndtri(1 - alpha / 2)
    wald = 2 * z * np.sqrt(np.clip(v * (1 - v), 0, None) / n)
    vv = np.clip(v, 0.5 / n, 1 - 0.5 / n)
    half = z / np.sqrt(n * vv * (1 - vv))
    lo_odds = expit(logit(vv) - half)
    hi_odds = expit(logit(vv) + half)
    return np.where(n * v < 5, hi_odds - lo_odds, wald)


def has_converged(T_new: np.ndarray, T_old: np.ndarray, n: int, alpha: float = 0.05) -> bool:
    """|T^{B_k} − T^{B_{k−1}}| < δ* in every cell (δ* evaluated at T^{B_k})."""
    return bool(np.all(np.abs(np.asarray(T_new) - np.asarray(T_old)) < ci_width(T_new, n, alpha)))


def pooled_estimate(counts: np.ndarray, T_tildes: np.ndarray, p: float) -> np.ndarray:
    """eq. 4 pooled over every table version (rows of ``counts`` / ``T_tildes``):
    (Σ_t o_t − (1−p)·Σ_t n_t·T̃_t) / (p·Σ_t n_t). Unbiased; uses every report."""
    counts = np.asarray(counts, dtype=float)
    n_t = counts.sum(axis=1)
    N = n_t.sum()
    if N <= 0:
        raise ValueError("pooled_estimate: no reports")
    return (counts.sum(axis=0) - (1 - p) * (n_t[:, None] * T_tildes).sum(axis=0)) / (p * N)


def last_two_estimate(counts: np.ndarray, T_tildes: np.ndarray, p: float,
                      min_block: int = 1) -> tuple[np.ndarray, int]:
    """The paper's estimate (§5): average of the published eq.-4 tables of the last two blocks
    (versions with ≥ ``min_block`` reports, else any with reports). Returns (table, blocks)."""
    n_t = np.asarray(counts).sum(axis=1)
    idx = np.nonzero(n_t >= min_block)[0]
    if len(idx) == 0:
        idx = np.nonzero(n_t > 0)[0]
    if len(idx) == 0:
        raise ValueError("last_two_estimate: no reports")
    tabs = [publish(eq4(counts[t], T_tildes[t], p)) for t in idx[-2:]]
    return np.mean(tabs, axis=0), int(len(idx))


@dataclass(frozen=True)
class BlockResult:
    """Outcome of one server block update for one view."""

    tables: list[np.ndarray]   # T^{t+1} per combination (published: clipped, renormalised)
    converged: bool            # the §5 rule held between T^{t+1} and T^t (needs t ≥ 1)


def block_step(block_counts: Sequence[np.ndarray], current: Sequence[np.ndarray],
               p: float, gamma: float, alpha: float, is_estimate: bool) -> BlockResult:
    """One block of one view (pure): eq. 4 with T̃ per combination, then the convergence rule
    against the current tables when those are themselves block estimates (``is_estimate``)."""
    new, conv = [], is_estimate
    for o, T in zip(block_counts, current):
        Tn = publish(eq4(o, floor_table(T, gamma), p))
        n = int(np.sum(o))
        if is_estimate:
            conv = conv and has_converged(Tn, T, n, alpha)
        new.append(Tn)
    return BlockResult(new, bool(conv))


def solve_p_gamma(domain: Domain, k: int, epsilon: float, p: float | None = None,
                  gamma: float | None = None) -> tuple[float, float]:
    """(p, γ) whose per-record ε (max over the views of ``k``-combinations) is ``epsilon``:
    without ``p``, p solved at γ (default 0.05); with ``p``, the largest γ within ε in every
    view. ValueError when ε is below what ``p`` costs even at γ = 1."""
    probe = RRBA(domain, 0.5, 0.05, k)
    sizes = [probe.sizes[v] for v in range(len(probe.views))]
    if p is None:
        gamma = 0.05 if gamma is None else gamma
        return min(solve_p(epsilon, gamma, s) for s in sizes), gamma
    return p, max(solve_gamma(epsilon, p, s) for s in sizes)


def _clean(table: np.ndarray, tiny: float = 1e-15) -> np.ndarray:
    """Zero the cells below ``tiny`` (IPF leaves denormals) and renormalise."""
    t = np.where(table < tiny, 0.0, table)
    s = t.sum()
    return t / s if s > 0 else t


# --- the Mechanism ---------------------------------------------------------------------------
@register
class RRBA(Mechanism):
    """RRBA as a :class:`Mechanism`.

    Reports: ``[view, version, cell_0, …, cell_{C−1}]`` — the view asked, the version of that
    view's tables the client used, and the reported cell (raveled over Ω_S) of each combination.
    Count tensors: one per combination (view v, slot j), axes ``("version", "cell")``, shape
    ``(max_versions, |Ω_S|)``: counts per (combination, table version).
    """

    name = "rrba"
    estimators = ("last-two", "pooled")
    default_estimators = ("last-two", "pooled")
    adaptive = True

    def __init__(self, domain: Domain, p: float, gamma: float = 0.05, k: int = 2,
                 views: Sequence[Sequence[Sequence[str]]] | None = None, block_size: int = 250,
                 alpha: float = 0.05, max_versions: int = 64,
                 history: Sequence[Sequence[Sequence[Sequence[float]]]] | None = None,
                 converged: Sequence[bool] | None = None, version: int = 0,
                 view: int | None = None, history_from: Sequence[int] | None = None) -> None:
        """``view``: the view every device of this state answers (None: each picks one
        uniformly at random). ``history_from``: per view, the table version of the first table
        kept in ``history`` (a device state keeps only the current tables)."""
        super().__init__(domain, version)
        if not 0 < p < 1:
            raise ValueError(f"p must be in (0, 1), got {p!r}")
        if not 0 < gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
        if block_size < 1 or max_versions < 2:
            raise ValueError("block_size must be ≥ 1 and max_versions ≥ 2")
        self.p, self.gamma, self.k = float(p), float(gamma), int(k)
        self.block_size, self.alpha, self.max_versions = int(block_size), float(alpha), int(max_versions)
        if views is None:
            views = [[tuple(domain.attrs[i] for i in comb) for comb in view]
                     for view in make_views(len(domain), self.k)]
        self.views = [[tuple(str(a) for a in comb) for comb in view] for view in views]
        self.slots = max(len(v) for v in self.views)
        self.dims = [[tuple(domain.project(c).shape) for c in view] for view in self.views]
        self.sizes = [[int(np.prod(d)) for d in view] for view in self.dims]
        if history is None:
            history = [[[np.full(s, 1.0 / s)] for s in view] for view in self.sizes]
        self.history = [[[np.asarray(t, dtype=float) for t in h] for h in view] for view in history]
        self.history_from = [0] * len(self.views) if history_from is None else \
            [int(b) for b in history_from]
        self.converged = list(converged) if converged is not None else [False] * len(self.views)
        self._keys = {self._key(v, j): (v, j) for v in range(len(self.views))
                      for j in range(len(self.views[v]))}
        if view is not None and not 0 <= int(view) < len(self.views):
            raise ValueError(f"view must be in 0..{len(self.views) - 1}, got {view!r}")
        self.view = None if view is None else int(view)

    # -- helpers
    def _key(self, v: int, j: int) -> str:
        return f"rrba:v{v}:c{j}:" + "|".join(self.views[v][j])

    def table_version(self, v: int) -> int:
        """Current (open-block) table version of view v."""
        return self.history_from[v] + len(self.history[v][0]) - 1

    def combinations(self) -> list[tuple[int, int, tuple[str, ...]]]:
        return [(v, j, c) for v, view in enumerate(self.views) for j, c in enumerate(view)]

    # -- privacy
    def view_epsilon(self, v: int) -> float:
        return epsilon_view(self.p, self.gamma, self.sizes[v])

    @property
    def epsilon(self) -> float:
        """ε per record (one report answers one view): max over views of the view's sum."""
        return max(self.view_epsilon(v) for v in range(len(self.views)))

    # -- device side
    @property
    def report_width(self) -> int:
        return 2 + self.slots

    def report_bounds(self) -> np.ndarray:
        cells = [max((s[j] for s in self.sizes if j < len(s)), default=1) for j in range(self.slots)]
        return np.array([len(self.views), self.max_versions] + cells, dtype=np.int64)

    def for_view(self, view: int | None) -> "RRBA":
        """This state with every device answering ``view`` (same version)."""
        return RRBA(self.domain, self.p, self.gamma, self.k, self.views, self.block_size,
                    self.alpha, self.max_versions, self.history, self.converged, self.version,
                    view, self.history_from)

    def randomize(self, records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Each client answers one view (:attr:`view`, else uniform at random) with the view's
        current tables. Vectorized per (view, combination)."""
        records = np.asarray(records)
        n = len(records)
        if self.view is not None:
            views = np.full(n, self.view, dtype=np.int64)
        else:   # a view still collecting, uniformly (any view once all have converged)
            open_ = np.flatnonzero(~np.asarray(self.converged)) if self.collecting() else \
                np.arange(len(self.views))
            views = open_[rng.integers(0, len(open_), size=n)]
        out = np.zeros((n, self.report_width), dtype=np.int64)
        out[:, 0] = views
        for v, view in enumerate(self.views):
            rows = np.nonzero(views == v)[0]
            if len(rows) == 0:
                continue
            out[rows, 1] = self.table_version(v)
            for j, comb in enumerate(view):
                cols = self.domain.axes(comb)
                cells = np.ravel_multi_index(tuple(records[rows, c].astype(np.intp) for c in cols),
                                             self.dims[v][j])
                Tt = floor_table(self.history[v][j][-1], self.gamma)
                out[rows, 2 + j] = randomize_cells(cells, Tt, self.p, rng)
        return out

    # -- server side
    def tensors(self, marginals: Sequence[Sequence[str]] = ()) -> list[TensorSpec]:
        """Every combination's (version × cell) count tensor (all are used by the consistency
        step, whatever marginals are asked)."""
        for m in marginals:
            self.domain.axes(m)  # KeyError names an unknown attribute
        return [TensorSpec(self._key(v, j), ("version", "cell"), (self.max_versions, self.sizes[v][j]),
                           (1, 2 + j)) for v, j, _ in self.combinations()]

    def count(self, reports: np.ndarray, specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
        """Histogram of (version, cell_j) over the reports of the spec's view."""
        out = {}
        for s in specs:
            v, _ = self._keys[s.key]
            out[s.key] = histogram(reports[reports[:, 0] == v], s.columns, s.shape)
        return out

    def advance(self, counts: Mapping[str, np.ndarray]) -> "RRBA":
        """The block loop (pure; returns a new mechanism): every view whose open version has
        ≥ block_size reports gets eq. 4 tables as its next version, unless it has converged or
        run out of versions. Convergence (§5) is checked between two block estimates."""
        history = [[list(h) for h in view] for view in self.history]
        conv = list(self.converged)
        changed = False
        for v, view in enumerate(self.views):
            t = self.table_version(v)
            if conv[v] or t + 1 >= self.max_versions:
                continue
            block = [np.asarray(counts[self._key(v, j)])[t] for j in range(len(view))]
            if block[0].sum() < self.block_size:
                continue
            res = block_step(block, [h[-1] for h in history[v]], self.p, self.gamma, self.alpha,
                             is_estimate=t >= 1)
            for j, T in enumerate(res.tables):
                history[v][j].append(T)
            conv[v] = res.converged
            changed = True
        if not changed:
            return self
        return RRBA(self.domain, self.p, self.gamma, self.k, self.views, self.block_size, self.alpha,
                    self.max_versions, history, conv, self.version + 1, self.view,
                    self.history_from)

    # -- the adaptive protocol
    @classmethod
    def from_config(cls, domain: Domain, params: Mapping[str, Any] | None, *,
                    epsilon: float | None, epsilon_scope: str = "attribute", version: int = 0) -> "RRBA":
        """``params``: ``k`` (combination size, 2), ``block_size`` B (250), ``alpha`` (the §5
        rule's 1 − confidence, 0.05), ``max_versions`` (table versions per view, 64), and at most
        one of ``p`` / ``gamma`` (γ defaults to 0.05): ε (the corrected per-record ε of every
        view, :func:`~.mechanism.record_budget`) fixes the other — p solved at γ, or γ at the
        given p."""
        pr = Params(cls.name, params)
        k = pr.integer("k", 2, ge=2, le=max(2, len(domain)))
        if len(domain) < 2:
            raise ParamError("k", f"rrba needs at least 2 attributes (got {len(domain)})")
        block = pr.integer("block_size", 250, ge=1)
        alpha = pr.number("alpha", 0.05, gt=0.0, lt=1.0)
        max_versions = pr.integer("max_versions", 64, ge=2, le=1 << 16)
        p = pr.number("p", None, gt=0.0, lt=1.0)
        gamma = pr.number("gamma", None, gt=0.0, le=1.0)
        pr.done()
        if p is not None and epsilon is None:   # ε follows from p and γ
            return cls(domain, p, 0.05 if gamma is None else gamma, k, block_size=block,
                       alpha=alpha, max_versions=max_versions, version=version)
        if p is not None and gamma is not None:
            have = RRBA(domain, p, gamma, k).epsilon
            raise ParamError("gamma", f"rrba's ε follows from p and gamma (here {have:.4g} per "
                                      "record) and epsilon fixes one of them: give at most two "
                                      "of epsilon, p, gamma")
        eps = record_budget(epsilon, epsilon_scope, len(domain))
        try:
            p, gamma = solve_p_gamma(domain, k, eps, p, gamma)
        except ValueError as exc:
            raise ParamError("p", str(exc)) from None
        return cls(domain, p, gamma, k, block_size=block, alpha=alpha,
                   max_versions=max_versions, version=version)

    def planned_for(self, n: int) -> "RRBA":
        """Table versions for ``n`` devices: twice the blocks a view gets on average, plus 4
        (a view that runs out stops updating; its reports still count)."""
        if self.version != 0:
            return self
        per_view = -(-n // (len(self.views) * self.block_size))
        return RRBA(self.domain, self.p, self.gamma, self.k, self.views, self.block_size,
                    self.alpha, max(2, 2 * per_view + 4), self.history, self.converged,
                    self.version, self.view, self.history_from)

    def collecting(self) -> bool:
        """Until every view has converged (§5)."""
        return not all(self.converged)

    def accepted_versions(self) -> tuple[int, ...]:
        """Every version so far: a report names the table version it used (column 1) and the
        state keeps every table, so each version's reports stay valid."""
        return tuple(range(self.version + 1))

    def reports_until_adapt(self, counts: VersionedCounts) -> int | None:
        """Reports until some open view's block is full, if devices pick views uniformly."""
        comb = self.combined_counts(counts) if any(v in counts for v in
                                                   self.accepted_versions()) else {}
        need = []
        for v in ([self.view] if self.view is not None else range(len(self.views))):
            t = self.table_version(v)
            if self.converged[v] or t + 1 >= self.max_versions:
                continue
            have = int(np.asarray(comb[self._key(v, 0)])[t].sum()) if comb else 0
            need.append(max(1, self.block_size - have))
        if not need:
            return None
        return min(need) * len(need)

    def adapt(self, counts: VersionedCounts) -> "RRBA | None":
        """:meth:`advance` on the counts of every version: eq. 4 for each view whose block is
        full, the §5 rule stopping a view."""
        new = self.advance(self.combined_counts(counts))
        return None if new is self else new

    def combination_estimates(self, counts: Mapping[str, np.ndarray], method: str = "last-two",
                              ) -> list[tuple[tuple[str, ...], np.ndarray]]:
        """Per-combination tables (attrs, array shaped by Ω_S) from the count tensors."""
        if method not in self.estimators:
            raise ValueError(f"method {method!r} is not one of {self.estimators}")
        if any(self.history_from):
            raise ValueError("rrba: a device state keeps no table history to estimate from")
        out = []
        for v, j, comb in self.combinations():
            c = np.asarray(counts[self._key(v, j)], dtype=float)
            Tt = self._tildes(v, j, c.shape[0])
            if c.sum() == 0:
                est = np.full(self.sizes[v][j], 1.0 / self.sizes[v][j])
            elif method == "pooled":
                est = clip_rescale(pooled_estimate(c, Tt, self.p))
            else:
                est, _ = last_two_estimate(c, Tt, self.p, self.block_size)
            out.append((comb, est.reshape(self.dims[v][j])))
        return out

    def _tildes(self, v: int, j: int, blocks: int) -> np.ndarray:
        """The floored table T̃ every block (table version) of combination j of view v used."""
        hist = self.history[v][j]
        return np.stack([floor_table(hist[min(t, len(hist) - 1)], self.gamma)
                         for t in range(blocks)])

    def bound(self, counts: Mapping[str, np.ndarray], attrs: Sequence[str],
              values: np.ndarray) -> Bound:
        """The bound of the served ``values`` of ``attrs``: the calibrated bound of the pooled
        eq.-4 estimate of the first combination holding ``attrs`` (:func:`.rrba_bounds.
        pooled_bound`, summed down to ``attrs``) plus the TVD of ``values`` to it
        (:func:`~.bounds.triangle`); a maximum-entropy marginal, which no combination holds,
        gets :func:`~.bounds.unbounded`."""
        for v, j, comb in self.combinations():
            c = np.asarray(counts[self._key(v, j)], dtype=float)
            if not set(attrs) <= set(comb) or c.sum() == 0:
                continue
            Tt = self._tildes(v, j, c.shape[0])
            dims = self.dims[v][j]
            b = pooled_bound(c, Tt, self.p)
            u = marginal_of(comb, pooled_estimate(c, Tt, self.p).reshape(dims), attrs)
            if set(attrs) == set(comb):
                b = Bound(b.tvd, marginal_of(comb, b.low.reshape(dims), attrs),
                          marginal_of(comb, b.high.reshape(dims), attrs), b.level, b.coverage,
                          b.method)
            else:
                b = coarsened(b, u)
            return triangle(values, u, b)
        return unbounded(values)

    def marginal(self, tables: Sequence[tuple[tuple[str, ...], np.ndarray]],
                 attrs: Sequence[str]) -> tuple[np.ndarray, str]:
        """The marginal over ``attrs`` from (consistent) combination tables: the mean of the
        projections of the tables that contain ``attrs``, else the maximum-entropy (IPF) table
        matching every table's marginal on its overlap with ``attrs``. Returns (table, how)."""
        attrs = tuple(attrs)
        inside = [marginal_of(a, t, attrs) for a, t in tables if set(attrs) <= set(a)]
        if inside:
            return _clean(np.mean(inside, axis=0)), "direct"
        cons = {}
        for a, t in tables:
            sub = tuple(x for x in attrs if x in a)
            if len(sub) >= 1:
                cons.setdefault(sub, []).append(marginal_of(a, t, sub))
        subs = [s for s in cons if not any(set(s) < set(o) for o in cons)]
        margs = [(s, np.mean(cons[s], axis=0)) for s in subs]
        table, _ = maxent_table(attrs, self.domain.project(attrs).shape, margs)
        return _clean(table), "maxent"

    def estimate(self, counts: Mapping[str, np.ndarray], attrs: Sequence[str], method: str = "last-two",
                 **options: Any) -> Estimate:
        """Marginal over ``attrs``: per-combination estimates (``method``), least-squares
        consistency across views (``consistent=True``), then direct projection or max-entropy."""
        tables = self.combination_estimates(counts, method)
        if options.get("consistent", True):
            cons = consistent_tables(tables)
            tables = [(a, t) for (a, _), t in zip(tables, cons)]
        values, how = self.marginal(tables, attrs)
        n = int(sum(np.asarray(counts[self._key(v, 0)]).sum() for v in range(len(self.views))))
        blocks = sum(self.table_version(v) for v in range(len(self.views)))
        b = self.bound(counts, attrs, values)
        return Estimate(Factor(self.domain.project(attrs), values), method, n, self.epsilon,
                        error_bound=b.tvd, bound=b, iterations=blocks, converged=all(self.converged),
                        extra={"derivation": how, "p": self.p, "gamma": self.gamma,
                               "paper_epsilon": paper_epsilon(self.p)})

    # -- state
    def state(self) -> dict[str, Any]:
        tables = [{"view": v, "slot": j, "attrs": list(c), "version": self.table_version(v),
                   "cells": self.history[v][j][-1].tolist()} for v, j, c in self.combinations()]
        return {
            "mechanism": self.name, "version": self.version,
            "domain": self.domain.to_dict(),
            "p": self.p, "gamma": self.gamma, "k": self.k, "block_size": self.block_size,
            "alpha": self.alpha, "max_versions": self.max_versions,
            "views": [[list(c) for c in view] for view in self.views],
            "epsilon": self.epsilon,
            "view_epsilon": [self.view_epsilon(v) for v in range(len(self.views))],
            "tables": tables,
            "history": [[[t.tolist() for t in h] for h in view] for view in self.history],
            "converged": list(self.converged), "view": self.view,
            "history_from": list(self.history_from),
        }

    def device_state(self) -> dict[str, Any]:
        """:meth:`state` with only the current table of every combination (the history is
        the server's, for the estimates), and the :meth:`device_program`."""
        st = self.state()
        st["history"] = [[[t.tolist()] for t in (h[-1] for h in view)] for view in self.history]
        st["history_from"] = [self.table_version(v) for v in range(len(self.views))]
        prog = self.device_program()
        if prog is not None:
            st["device"] = prog
        return st

    def device_program(self) -> dict[str, Any] | None:
        """A hidden uniform open view (or :attr:`view`): its index and table version as
        ``const`` columns, every combination's cell kept with p or faked from its floored table
        (docs/device-protocol.md). None when the tables exceed the description's 4,096
        entries."""
        if self.view is not None:
            views = [int(self.view)]
        elif self.collecting():
            views = [int(v) for v in np.flatnonzero(~np.asarray(self.converged))]
        else:
            views = list(range(len(self.views)))
        if sum(self.sizes[v][j] for v in views for j in range(len(self.views[v]))) > 4096:
            return None
        return dp.program(self.name, self.domain, self.report_width, [dp.select_step(None, [
            [dp.const_step(0, v), dp.const_step(1, self.table_version(v))]
            + [dp.keep_step(self.domain.axes(comb), 2 + j, self.p,
                            floor_table(self.history[v][j][-1], self.gamma))
               for j, comb in enumerate(self.views[v])] for v in views])])

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "RRBA":
        dom = Domain.from_dict(state["domain"])
        return cls(dom, state["p"], state["gamma"], state["k"], state["views"], state["block_size"],
                   state["alpha"], state["max_versions"], state.get("history"),
                   state.get("converged"), state["version"], state.get("view"),
                   state.get("history_from"))
