"""``corr-rr``: the Corr-RR device protocol ([Corr-RR] §3, :mod:`.corr_rr_paper`) with an unbiased
GLS estimate, variance-weighted combinations and a copy table chosen for the final estimator
(docs/mechanisms.md §5).

**Linear model.** With g_j = P2_jᵀ f_j the distribution of the pivot's GRR_ε output and M_jk the
published copy channel, the expected frequency of Phase II column k is

    λ_k = (1/m)·[ g_k + Σ_{j≠k} M_jkᵀ g_j ] = Σ_j H_kj f_j,   H_kk = P2_kᵀ/m, H_kj = M_jkᵀ P2_jᵀ/m,

linear in *all* the marginals. The covariance of one Phase II user's column indicators is exact
from the marginals alone (only the pivot is randomized; given the pivot's output the copies are
independent): diagonal blocks diag(λ_k) − λ_kλ_kᵀ, off-diagonal blocks (1/m)[D(g_k)M_kl +
(D(g_l)M_lk)ᵀ + Σ_{j∉{k,l}} M_jkᵀ D(g_j) M_jl] − λ_kλ_lᵀ (checked against the exact channel in
the tests).

**Unbiased estimate (GLS).** In the sum-zero coordinates f_k = 1/d_k + Q_k θ_k (Q_k orthonormal),
Phase I gives z₁ = Qᵀ(f̂ᴵ − u) = θ + e₁ (Cov R₁, SPL decode, per attribute) and Phase II gives
z₂ = Qᵀ(λ̂ − Hu) = Gθ + e₂ (G = QᵀHQ, Cov R₂ = QᵀΣᴵᴵQ/n₂). Then

    θ̂ = C (R₁⁻¹ z₁ + Gᵀ R₂⁻¹ z₂),   C = (R₁⁻¹ + Gᵀ R₂⁻¹ G)⁻¹,   Cov(f̂) = Q C Qᵀ,

with the weights evaluated at a plug-in estimate (two passes): Phase I and Phase II are weighted
by their inverse covariances, never by their counts. Phase I's cross-attribute covariance is
left out of R₁: on a fixed dataset it is exactly zero (the attributes are randomized
independently), for i.i.d. users it is (F_kl − f_k f_lᵀ)/n₁ against diagonal blocks of order
1/(n₁Δ²) — without the 1/Δ² amplification, and it would need the Phase I pair counts.

**Final estimate.**

* One common domain size (:meth:`PhaseModel.combine_pooled`, :mod:`.corr_rr_eb`): U pooled
  across attributes by empirical Bayes — each attribute's deviation from the mean marginal shrunk
  by its REML-fitted variance, to the pooled GLS mean when the deviations are not significant.
  The copy table is the per-pair p_y table whose oracle risk for that estimate is closest to the
  best common p_y at every deviation size Phase I cannot exclude (:func:`pooling_table`).
* Different domain sizes (Cond-RR; :meth:`PhaseModel.combine`): per attribute, the non-negative
  weights on P = f̂ᴵ, D = the Phase II GRR decode and U that minimise the estimated MSE, D's bias
  (exactly A f + a0 for a known A) estimated from U and acted on only when significant. The
  table comes from :func:`optimal_table`.

The copies are post-processing of the pivot's report: an unbiased corr-rr cannot carry more
information than SMP's (index, value) report; its gains over SMP come from pooling what the
attributes share.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from scipy import optimize

from ldpstream.estimators.families.corr_rr_bounds import unbiased_bounds
from ldpstream.estimators.families.corr_rr_model import Combined, PhaseModel
from ldpstream.estimators.families.corr_rr_paper import TwoPhase, grr_copy_channel, phase1_estimates
from ldpstream.estimators.families.multi_baselines import one_way_axis
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.bounds import Bound, triangle
from ldpstream.estimators.kernels.domain import Factor
from ldpstream.estimators.kernels.proper import clip_rescale, repair
from ldpstream.estimators.mechanism import Estimate, register

__all__ = ["CorrRR", "PhaseModel", "Combined", "optimal_table", "decode_optimal_table",
           "shrunk_plugin", "pooling_table"]


def _channels(affine, table: np.ndarray, m: int):
    return [[None if j == k else np.clip(affine[j][k][0] + table[j, k] * affine[j][k][1], 0, None)
             for k in range(m)] for j in range(m)]


def _box_qp(A: np.ndarray, g: np.ndarray, sweeps: int = 500, tol: float = 1e-12) -> np.ndarray:
    """argmin tᵀAt + gᵀt over [0, 1]^k for a small PSD A (cyclic coordinate descent, exact on
    each coordinate; converges for convex quadratics)."""
    k = len(g)
    t = np.full(k, 0.5)
    for _ in range(sweeps):
        prev = t.copy()
        for i in range(k):
            r = g[i] + 2 * (A[i] @ t - A[i, i] * t[i])
            if A[i, i] > 1e-300:
                t[i] = min(1.0, max(0.0, -r / (2 * A[i, i])))
            else:
                t[i] = 0.0 if r > 0 else 1.0
        if np.max(np.abs(t - prev)) < tol:
            break
    return t


def decode_optimal_table(f: Sequence[np.ndarray], eps: float, n2: float, affine) -> np.ndarray:
    """Per column k, the t_jk ∈ [0,1] (j ≠ k) minimising the exact MSE of the GRR decode of Phase II
    column k: E[D_k] = e0 + Σ_j t_jk s_jk with s_jk = M1_jkᵀ g_j/(mΔ_k) (the pivot's marginal), and
    Var D_k = λ(1−λ)/(n₂Δ_k²), λ = q + Δ_k E[D_k]: a convex quadratic on a box (:func:`_box_qp`)."""
    m = len(f)
    shape = [len(x) for x in f]
    P2 = [ch.grr(eps, d) for d in shape]
    g = [P.T @ x for P, x in zip(P2, f)]
    T = np.ones((m, m))
    for k in range(m):
        p, q = ch.grr_pq(eps, shape[k])
        dl = p - q
        others = [j for j in range(m) if j != k]
        base = g[k].copy()
        S = np.empty((shape[k], m - 1))
        for i, j in enumerate(others):
            M0, M1 = affine[j][k]
            base += M0.T @ g[j]
            S[:, i] = M1.T @ g[j] / (m * dl)
        e0 = (base / m - q) / dl
        beta = e0 - f[k]
        ell = q + dl * e0
        nn = max(float(n2), 1.0)
        # Σ_v bias² + Var = tᵀAt + gᵀt + const on the box [0, 1]^(m−1)
        A = (1.0 - 1.0 / nn) * (S.T @ S)
        lin = 2 * S.T @ beta + S.T @ (1 - 2 * ell) / (nn * dl)
        T[others, k] = _box_qp(A, lin)
    return T


def shrunk_plugin(f1: Sequence[np.ndarray], eps: float, n1: float, z: float = 2.0
                  ) -> tuple[list[np.ndarray], np.ndarray]:
    """The plug-in marginals for planning and their uncertainty: every raw Phase I (SPL)
    estimate shrunk by the factor s_k = 1 − tr Var·(1 + z·√(2/dof))/‖f̂_k − c‖² (positive part;
    James–Stein with a z-σ margin, so pure noise is not taken for a difference) toward a centre c,
    then made proper. With one common domain size c is the mean of the m estimates
    (Efron–Morris: believe the marginals differ only as far as Phase I shows it), else uniform.
    The returned covariance, blocks s_k·Σᴵ_k + (1 − s_k)(1 − s_l)·Σ̄/m (the centre's noise), is
    what the plan charges for not knowing f."""
    m = len(f1)
    f1 = [np.asarray(f, dtype=float) for f in f1]
    shape = [len(f) for f in f1]
    same = len(set(shape)) == 1
    centre = np.mean(f1, axis=0) if same else None
    out, svals, covs, trs, dists = [], [], [], [], []
    for f in f1:
        d = len(f)
        c = centre if same else np.full(d, 1.0 / d)
        p, q = ch.grr_pq(eps / m, d)
        lam = q + (p - q) * np.clip(f, 0, 1)
        cov = (np.diag(lam) - np.outer(lam, lam)) / (max(n1, 1.0) * (p - q) ** 2)
        covs.append(cov)
        trs.append(float(np.trace(cov)) * ((m - 1) / m if same else 1.0))
        dists.append(float(np.sum((f - c) ** 2)))
    def factor(tr: float, dist: float, dof: int) -> float:
        # believe a difference only beyond `z` standard deviations of its noise (χ²_dof / dof)
        if n1 <= 0 or dist <= 0:
            return 0.0
        return max(0.0, 1.0 - tr * (1.0 + z * np.sqrt(2.0 / max(dof, 1))) / dist)

    if same:  # one pooled factor: m·d cells estimate it far better than d
        sp = factor(sum(trs), sum(dists), (m - 1) * (shape[0] - 1))
        svals = [sp] * m
    else:
        svals = [factor(t, dd, d - 1) for t, dd, d in zip(trs, dists, shape)]
    for f, sk in zip(f1, svals):
        c = centre if same else np.full(len(f), 1.0 / len(f))
        out.append(clip_rescale(c + sk * (f - c)))
    D = sum(shape)
    off = np.concatenate([[0], np.cumsum(shape)])
    post = np.zeros((D, D))
    for k in range(m):
        sl = slice(off[k], off[k + 1])
        post[sl, sl] += svals[k] * covs[k]
    if same:
        cbar = np.mean(covs, axis=0) / m
        for k in range(m):
            for l in range(m):
                post[off[k]:off[k + 1], off[l]:off[l + 1]] += (1 - svals[k]) * (1 - svals[l]) * cbar
    return out, post


def optimal_table(f: Sequence[np.ndarray], eps: float, n1: float, n2: float, affine,
                  post: np.ndarray | None = None, grid: int = 9,
                  candidates: Sequence[np.ndarray] = (), margin: float = 0.0
                  ) -> tuple[np.ndarray, dict[str, Any]]:
    """The Cond-RR table corr-rr publishes (different domain sizes): a pure function of the
    plug-in marginals ``f`` (proper; see :func:`shrunk_plugin`), ε, the planned n₁, n₂ and the
    copy family ``affine[j][k] = (M0, M1)``: of (a) the per-column decode-optimal table, (b) the
    common t minimising Var U and their mixtures, the one with the smallest predicted MSE of the
    three-source estimate (:meth:`PhaseModel.predicted`). ``candidates``: further tables to consider; the first (the
    published one) is kept unless another is predicted better by more than ``margin`` (relative),
    since the prediction rests on a noisy plug-in. Returns (table, info)."""
    m = len(f)
    shape = [len(x) for x in f]
    fvec = np.concatenate([np.asarray(x, dtype=float) for x in f])

    def model(T):
        return PhaseModel(shape, eps, n1, n2, _channels(affine, T, m))

    TB = decode_optimal_table(f, eps, n2, affine)
    # (b) the common t minimising Var U
    ts = np.linspace(0.0, 1.0, grid)
    var_u = []
    for t in ts:
        T = np.full((m, m), t)
        var_u.append(model(T).predicted(fvec)["unbiased"])
    i = int(np.argmin(var_u))
    lo, hi = ts[max(i - 1, 0)], ts[min(i + 1, grid - 1)]
    res = optimize.minimize_scalar(lambda t: model(np.full((m, m), t)).predicted(fvec)["unbiased"],
                                   bounds=(lo, hi), method="bounded", options={"xatol": 1e-3})
    tU = float(res.x) if res.fun <= var_u[i] else float(ts[i])
    TU = np.full((m, m), tU)
    best = None
    tried = []
    cands = [(f"mix{s:g}", s * TB + (1 - s) * TU) for s in (0.0, 0.25, 0.5, 0.75, 1.0)]
    cands += [(f"candidate{i}", np.asarray(T, dtype=float)) for i, T in enumerate(candidates)]
    for label, T in cands:
        pr = model(T).predicted(fvec, post)
        tried.append({"table": label, **pr})
        if best is None or pr["combined"] < best[1]["combined"]:
            best = (T, pr)
    T, pr = best
    if candidates:
        first = tried[len(cands) - len(candidates)]
        if first["combined"] <= (1 + margin) * pr["combined"]:
            T, pr = np.asarray(candidates[0], dtype=float), first
    T = T.copy()
    np.fill_diagonal(T, 1.0)
    return T, {"t_unbiased": tU, "predicted": pr, "tried": tried}


def pooling_table(f1: Sequence[np.ndarray], eps: float, n1: float, n2: float
                  ) -> tuple[np.ndarray, dict[str, Any]]:
    """The p_y table for one common domain size (:mod:`.corr_rr_eb`): the per-pair table whose
    oracle risk under the pooled estimate is closest to the best common p_y at every
    deviation variance τ² the Phase I estimates ``f1`` (raw SPL) cannot exclude. A pure function
    of the Phase I estimates; information at the proper mean Phase I marginal."""
    from ldpstream.estimators.families.corr_rr_eb import minimax_table, tau_interval
    m = len(f1)
    d = len(f1[0])
    k = d - 1
    shape = (d,) * m
    fbar = clip_rescale(np.mean(np.asarray(f1, dtype=float), axis=0))
    fv = np.tile(fbar, m)

    def model(T):
        return PhaseModel(shape, eps, n1, n2, [[None if j == l else grr_copy_channel(T[j, l], d)
                                                for l in range(m)] for j in range(m)])

    base = model(np.ones((m, m)))
    Q = base.Q
    th1 = Q.T @ (np.concatenate(f1) - base.u)
    C1 = Q.T @ base.cov1(fv) @ Q
    if n1 > 0:
        lo, hi = tau_interval(th1, 0.5 * (C1 + C1.T), m, k)
    else:
        from ldpstream.estimators.families.corr_rr_eb import tau_cap
        lo, hi = 0.0, tau_cap(m, d)
    T, info = minimax_table(lambda T: model(T).information(fv), m, d, lo, hi)
    return T, info


# --- the mechanism ------------------------------------------------------------------------------------

@register
class CorrRR(TwoPhase):
    """``corr-rr``: the Corr-RR device protocol (p_y copies for one common d, Cond-RR copies for
    different domain sizes) with a table planned for the final estimate, the unbiased GLS and the
    pooled (one d) or three-source (different d) combination.

    Estimators: ``corr-rr`` (default), ``unbiased`` (GLS), ``decode`` (the published decode under
    this table, count-weighted with Phase I), ``phase1`` (SPL on Phase I only)."""

    name = "corr-rr"
    estimators = ("corr-rr", "unbiased", "decode", "phase1")

    def affine_all(self):
        m = len(self.domain)
        return [[None if j == k else self.affine(j, k) for k in range(m)] for j in range(m)]

    def refine(self, counts: Mapping[str, np.ndarray], n_plan: int | None = None) -> "CorrRR":
        n1, n2 = self.plan(counts, n_plan)
        raw = self.phase1(counts)
        if self.copy == "py":
            table, _ = pooling_table(raw, self.target_epsilon, n1, n2)
            return self._with(table, None, n1 + n2)
        # Cond-RR: the weight of each Phase I conditional against the uniform copy
        f1, post = shrunk_plugin(raw, self.target_epsilon, n1)
        from ldpstream.estimators.families.corr_rr_cond import conditional_channels
        cond = conditional_channels(self.phase1_pairs(counts), self.P1, self.P2)
        tmp = type(self)(self.domain, self.target_epsilon, self.beta, "cond", self.table, cond)
        cands = [np.ones((len(self.domain),) * 2)]  # the plain conditional (published)
        table, _ = optimal_table(f1, self.target_epsilon, n1, n2, tmp.affine_all(), post,
                                 candidates=cands)
        return self._with(table, cond, n1 + n2)

    def model(self, n1: float, n2: float) -> PhaseModel:
        return PhaseModel(self.domain.shape, self.target_epsilon, n1, n2, self.copy_channels())

    #: (the column counts' bytes, their Combined): every marginal of one refresh (or simulate
    #: run) is a part of the same combination, computed once
    _memo: tuple[bytes, Combined] | None = None
    #: (the Combined, the bounds of its unbiased estimate of every attribute)
    _bounds: tuple[Combined, list[Bound]] | None = None

    def combined(self, counts: Mapping[str, np.ndarray]) -> Combined:
        """The estimate of every marginal from the column counts (memoized on their values)."""
        c1, c2 = self.column_counts(counts)
        key = b"".join(np.ascontiguousarray(c, dtype=np.float64).tobytes() for c in c1 + c2)
        if self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        out = self._combine(c1, c2)
        self._memo = (key, out)
        return out

    def _combine(self, c1: list[np.ndarray], c2: list[np.ndarray]) -> Combined:
        n1, n2 = float(c1[0].sum()), float(c2[0].sum())
        if n2 <= 0:
            raise ValueError("corr-rr: no Phase II reports counted")
        f1 = np.concatenate(phase1_estimates(c1, self.target_epsilon, self.domain.shape)) \
            if n1 > 0 else None
        lam = np.concatenate([c / n2 for c in c2])
        pm = self.model(n1, n2)
        if len(set(self.domain.shape)) == 1:
            return pm.combine_pooled(f1, lam)
        return pm.combine(f1, lam)

    def bound(self, counts: Mapping[str, np.ndarray], i: int, method: str,
              values: np.ndarray) -> Bound:
        """phase1: :meth:`TwoPhase.bound`; unbiased: its calibrated bootstrap bound
        (:func:`.corr_rr_bounds.unbiased_bounds`); corr-rr and decode: that bound plus their
        TVD to the unbiased estimate (:func:`~.bounds.triangle`)."""
        if method == "phase1":
            return super().bound(counts, i, method, values)
        n1, n2 = self.phase_sizes(counts)
        cb = self.combined(counts)
        pm = self.model(n1, n2)
        if self._bounds is None or self._bounds[0] is not cb:   # once per combination
            c1, c2 = self.column_counts(counts)
            self._bounds = (cb, unbiased_bounds(pm, cb, c1 + c2))
        b = self._bounds[1][i]
        return b if method == "unbiased" else triangle(values, pm.split(cb.unbiased)[i], b)

    def estimate_all(self, counts: Mapping[str, np.ndarray], method: str | None = "corr-rr"
                     ) -> list[np.ndarray]:
        method = method or "corr-rr"
        if method == "phase1":
            c1, _ = self.column_counts(counts)
            if c1[0].sum() <= 0:
                raise ValueError("no Phase I reports counted")
            return phase1_estimates(c1, self.target_epsilon, self.domain.shape)
        cb = self.combined(counts)
        v = {"corr-rr": cb.estimate, "unbiased": cb.unbiased, "decode": cb.decode}[method]
        off = np.concatenate([[0], np.cumsum(self.domain.shape)])
        return [v[off[k]:off[k + 1]] for k in range(len(self.domain))]

    def estimate(self, counts: Mapping[str, np.ndarray], attrs: Sequence[str],
                 method: str = "corr-rr", **options: Any) -> Estimate:
        """Options: ``proper`` ('clip' | 'simplex'). ``error_bound``: :meth:`bound`."""
        i = one_way_axis(self, attrs, method)
        n1, n2 = self.phase_sizes(counts)
        off = np.concatenate([[0], np.cumsum(self.domain.shape)])
        s = slice(off[i], off[i + 1])
        extra: dict[str, Any] = {"n1": n1, "n2": n2, "version": self.version}
        if method == "phase1":
            vals = self.estimate_all(counts, "phase1")[i]
        else:
            cb = self.combined(counts)
            vals = {"corr-rr": cb.estimate, "unbiased": cb.unbiased, "decode": cb.decode}[method][s]
            var = np.diag(cb.cov_unbiased)[s]
            extra.update(weight=cb.weight.tolist(), variance_unbiased=var.tolist(),
                         mse_estimate=cb.mse_estimate,
                         **{k: v for k, v in cb.extra.items() if k in ("tau2", "weights")})
        vals = repair(np.asarray(vals, dtype=float), options.get("proper"))
        b = self.bound(counts, i, method, vals)
        return Estimate(Factor(self.domain.project(tuple(attrs)), vals), method, n1 + n2,
                        self.epsilon, error_bound=b.tvd, bound=b, extra=extra)
