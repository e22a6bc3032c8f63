"""Empirical-Bayes pooling across attributes and the minimax-regret copy table of ``corr-rr``
for one common domain size (docs/mechanisms.md §5; the published copy family of [Corr-RR] §3, p_y
copies, chosen per ordered pair).

**Why pool.** With d values per attribute, write every marginal in the sum-zero coordinates
θ_k = Qᵀ(f_k − u) (Q orthonormal). The GLS estimate U (:class:`.corr_rr.PhaseModel`) satisfies
θ̂ = θ + e, e ~ (0, C) with C = Cov U (known at a plug-in). Copies make the Phase II columns
mixtures of every attribute's report, so C is large in the directions where the attributes
*differ* and small for their common mean: the reports tell the mean marginal μ far better than
each attribute's deviation δ_k = θ_k − μ. The published decode exploits that by ignoring the
deviations (its bias); here they are estimated and shrunk by how large they are.

**Model (random deviations, empirical Bayes).** θ_k = μ + δ_k, δ_k ~ N(0, τ_k²·I), μ flat.
The τ_k² are fitted by restricted maximum likelihood (REML) from θ̂ ~ N(Jμ, C + D_τ) and bounded
by the simplex (no deviation can exceed it: τ² ≤ (1 − 1/min(m, d))/(d − 1)). Model choice
(:func:`fit_pooling`): the pooled model (τ = 0: every attribute gets the pooled GLS estimate of
μ) unless one common τ passes AIC; then one τ per attribute if it passes AIC against the common
τ or the deviations are beyond doubt. (Chosen over hard likelihood-ratio gates at α = 0.05…0.5,
plain three-model AIC and no selection, measured on the synthetic cells: a hard gate pools hub
deviations that are real; per-attribute τ's fitted on noise — Phase I-only deviations at small
ε — are a rare but large loss.) The estimate is the posterior mean

    θ̃ = Jμ̂ + D_τ Σ⁻¹(θ̂ − Jμ̂),   Σ = C + D_τ,   μ̂ = (JᵀΣ⁻¹J)⁻¹JᵀΣ⁻¹θ̂,

a linear smoother θ̃ = S θ̂ for the fitted τ. Its stated MSE is per cell: the variance
diag(S C Sᵀ) plus the bias² ((S − I)θ)² estimated without bias as ((S − I)θ̂)² −
diag((S − I)C(S − I)ᵀ), floored at 0 (for the fitted τ, as if fixed).

**Copy table (minimax regret).** Before Phase II the server knows little about the τ's (Phase I
is SPL at ε/m), so it publishes the per-pair p_y table whose *oracle* risk tr((F + P/τ²)⁻¹)
(F = C⁻¹ of that table, P the deviation projection; the Bayes risk of the estimate above with τ
known) is within the smallest factor of the best common-p_y table at every τ² that Phase I
cannot exclude (a 95 % REML profile interval, capped by the simplex). Tables mixing p_y = 1
(exact copies: pooling) with p_y = 0 or 1/d (columns that differ: deviations) reach a factor of
≈ 1.0 on the settings measured, where any common p_y loses 1.3–1.7× somewhere.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import optimize, stats

from ldpstream.estimators.kernels.linalg import contrast, spd_inv

__all__ = ["PooledFit", "tau_cap", "reml_nll", "fit_pooling", "pooled_smoother", "tau_interval",
           "table_risk", "minimax_table", "pool_estimates"]


def tau_cap(m: int, d: int) -> float:
    """Largest per-coordinate deviation variance the simplex allows: Σ_k ‖f_k − f̄‖² ≤
    m(1 − 1/min(m, d)) over m(d − 1) coordinates."""
    return (1.0 - 1.0 / min(m, d)) / (d - 1)


def _J(m: int, k: int) -> np.ndarray:
    return np.kron(np.ones((m, 1)), np.eye(k))


def reml_nll(theta: np.ndarray, C: np.ndarray, m: int, k: int):
    """−2·(REML log-likelihood) of θ̂ ~ N(Jμ, C + diag(τ²) ⊗ I_k) as a function of log τ²
    (one value: common τ; m values: per attribute)."""
    J = _J(m, k)
    I = np.eye(len(C))

    def nll(logt: np.ndarray) -> float:
        logt = np.atleast_1d(logt)
        t2 = np.exp(logt) if len(logt) == m else np.full(m, np.exp(logt[0]))
        S = C + np.kron(np.diag(t2), np.eye(k))
        try:
            L = np.linalg.cholesky(S)
        except np.linalg.LinAlgError:
            return np.inf
        Li = np.linalg.solve(L, I)
        Si = Li.T @ Li
        JSJ = J.T @ Si @ J
        L2 = np.linalg.cholesky(0.5 * (JSJ + JSJ.T))
        mu = np.linalg.solve(JSJ, J.T @ (Si @ theta))
        r = theta - J @ mu
        return float(2 * np.sum(np.log(np.diag(L))) + 2 * np.sum(np.log(np.diag(L2)))
                     + r @ Si @ r)
    return nll


#: −2·log-likelihood ratio of one common τ against τ = 0 beyond which the deviations are taken as
#: certain (χ²₁ at 10⁻³)
_STRONG = float(stats.chi2.ppf(1 - 1e-3, 1))


@dataclass
class PooledFit:
    """Fitted deviation variances (per attribute), the likelihood-ratio statistic against τ = 0
    and whether it passed the gate."""

    tau2: np.ndarray
    lr: float
    pooled: bool


def fit_pooling(theta: np.ndarray, C: np.ndarray, m: int, k: int,
                alpha: float | str | None = "aic", per_attribute: bool = True) -> PooledFit:
    """REML fit of the deviation variances, bounded by :func:`tau_cap`. ``alpha="aic"``
    (default): pooled (τ = 0) unless one common τ improves the REML −2ℓ by more than 2 (its AIC
    penalty); then one τ per attribute (``per_attribute``) if it improves on the common τ by more
    than 2(m − 1) or the common τ's likelihood ratio against 0 exceeds χ²₁ at 10⁻³. A number: the
    per-attribute (or common) fit unless its likelihood ratio against τ = 0 is below the χ²
    quantile at that level (a hard gate); None: the REML fit as is."""
    cap = tau_cap(m, k + 1)
    nll = reml_nll(theta, C, m, k)
    xs = np.linspace(np.log(cap) - 25.0, np.log(cap), 51)
    v = np.array([nll(np.array([x])) for x in xs])
    i = int(np.argmin(v))
    r = optimize.minimize_scalar(lambda x: nll(np.array([x])),
                                 bounds=(xs[max(i - 1, 0)], xs[min(i + 1, len(xs) - 1)]),
                                 method="bounded", options={"xatol": 1e-3})
    x, best = (np.full(m, r.x), float(r.fun)) if r.fun <= v[i] else (np.full(m, xs[i]), v[i])
    x_iso, v_iso = x.copy(), best
    if per_attribute and m > 1:
        rr = optimize.minimize(nll, x, method="L-BFGS-B", bounds=[(xs[0], xs[-1])] * m,
                               options={"maxiter": 200})
        if np.isfinite(rr.fun) and rr.fun < best:
            x, best = rr.x, float(rr.fun)
    v0 = float(nll(np.full(m, xs[0] - 200.0)))  # τ² ≈ 0: the pooled model
    lr = v0 - best
    if alpha == "aic":
        # pooled unless a common τ passes AIC; then one τ per attribute if that passes AIC
        # against the common τ, or if the deviations are beyond doubt (LR ≥ χ²₁ at 10⁻³; with
        # few coordinates per attribute the per-attribute gain cannot pass AIC even when real)
        if v0 <= v_iso + 2.0:
            return PooledFit(np.zeros(m), lr, True)
        per = per_attribute and m > 1 and (v_iso - best > 2.0 * (m - 1)
                                           or v0 - v_iso >= _STRONG)
        return PooledFit(np.exp(x) if per else np.exp(x_iso), lr, False)
    df = m if per_attribute else 1
    pooled = alpha is not None and lr <= stats.chi2.ppf(1.0 - alpha, df)
    tau2 = np.zeros(m) if pooled else np.exp(x)
    return PooledFit(tau2, lr, bool(pooled))


def pooled_smoother(C: np.ndarray, tau2: np.ndarray, m: int, k: int) -> np.ndarray:
    """S with θ̃ = S θ̂: the posterior mean for deviation variances ``tau2`` (0 → pooled)."""
    J = _J(m, k)
    Dt = np.kron(np.diag(tau2), np.eye(k))
    Si = spd_inv(C + Dt)
    A_mu = np.linalg.solve(J.T @ Si @ J, J.T @ Si)
    return J @ A_mu + Dt @ Si @ (np.eye(len(C)) - J @ A_mu)


def tau_interval(theta1: np.ndarray, C1: np.ndarray, m: int, k: int, level: float = 0.95
                 ) -> tuple[float, float]:
    """The common τ² values that the Phase I estimates cannot exclude: the REML profile interval
    at ``level`` (0 included when τ = 0 is inside), capped by :func:`tau_cap`."""
    cap = tau_cap(m, k + 1)
    nll = reml_nll(theta1, C1, m, k)
    xs = np.linspace(np.log(cap) - 25.0, np.log(cap), 101)
    v = np.array([nll(np.array([x])) for x in xs])
    v0 = nll(np.array([xs[0] - 200.0]))
    top = min(float(v.min()), float(v0))
    crit = stats.chi2.ppf(level, 1)
    ok = v - top <= crit
    hi = float(np.exp(xs[ok].max())) if ok.any() else cap
    lo = 0.0 if v0 - top <= crit else float(np.exp(xs[ok].min()))
    return min(lo, cap), min(hi, cap)


def table_risk(F: np.ndarray, m: int, k: int, taus: Sequence[float]) -> np.ndarray:
    """tr((F + P/τ²)⁻¹) for every τ² (0 → the pooled limit), P = (I − 11ᵀ/m) ⊗ I_k: one
    eigen-decomposition for all τ²."""
    n = len(F)
    P = np.kron(np.eye(m) - np.ones((m, m)) / m, np.eye(k))
    F = 0.5 * (F + F.T)
    L = np.linalg.cholesky(F)
    Li = np.linalg.solve(L, np.eye(n))
    lam, V = np.linalg.eigh(Li @ P @ Li.T)
    lam = np.clip(lam, 0.0, None)
    wts = np.sum((Li.T @ V) ** 2, axis=0)  # ‖L⁻ᵀ v_i‖²
    out = []
    for t in taus:
        s = np.where(lam > 1e-12, (1.0 / (1.0 + lam / t) if t > 0 else 0.0), 1.0)
        out.append(float(wts @ s))
    return np.asarray(out)


def minimax_table(info, m: int, d: int, lo: float, hi: float, npts: int = 10,
                  levels: Sequence[float] | None = None, sweeps: int = 3, starts: int = 4,
                  seed: int = 0) -> tuple[np.ndarray, dict]:
    """The per-pair table (diagonal 1) minimising the maximum over τ² ∈ [lo, hi] of
    risk(table, τ²) / min over common p_y of risk(common, τ²). ``info(T)`` returns the
    information matrix F (sum-zero coordinates) of table T. Coordinate descent over ``levels``
    from the best common table and ``starts`` random 0/1 tables (seeded: a pure function)."""
    k = d - 1
    taus = np.geomspace(max(lo, hi * 1e-5), hi, npts)
    if lo <= 0:
        taus = np.concatenate([[0.0], taus])
    if levels is None:
        levels = [0.0, 1.0 / d, 0.5, 1.0]
    levels = np.unique(np.round(np.asarray(levels, dtype=float), 6))

    def risk(T):
        return table_risk(info(T), m, k, taus)

    common = np.round(np.linspace(0.0, 1.0, 11), 6)
    Rc = np.array([risk(np.full((m, m), t)) for t in common])
    best = Rc.min(axis=0)
    reg_c = (Rc / best).max(axis=1)
    ic = int(np.argmin(reg_c))
    rng = np.random.default_rng(seed)
    inits = [np.full((m, m), common[ic])] + [rng.choice([0.0, 1.0], size=(m, m))
                                            for _ in range(starts)]
    bestT, bestr = None, np.inf
    for T in inits:
        T = T.copy()
        np.fill_diagonal(T, 1.0)
        cur = float((risk(T) / best).max())
        for _ in range(sweeps):
            changed = False
            for j in range(m):
                for l in range(m):
                    if j == l:
                        continue
                    keep = T[j, l]
                    for v in levels:
                        if v == keep:
                            continue
                        T[j, l] = v
                        r = float((risk(T) / best).max())
                        if r < cur - 1e-9:
                            cur, keep, changed = r, v, True
                    T[j, l] = keep
            if not changed:
                break
        if cur < bestr:
            bestT, bestr = T.copy(), cur
    return bestT, {"regret": bestr, "common_t": float(common[ic]),
                   "common_regret": float(reg_c[ic]), "tau2_range": [lo, hi]}


def pool_estimates(est: Sequence[np.ndarray], covs: Sequence[np.ndarray],
                   alpha: float | str | None = "aic", per_attribute: bool = True
                   ) -> tuple[list[np.ndarray], PooledFit]:
    """The same empirical-Bayes pooling applied to any unbiased per-attribute marginals with
    independent blocks (e.g. SMP's): ``est[k]`` with covariance ``covs[k]``, one common d. Used
    as a reference: it shows what pooling alone buys on a mechanism without copies."""
    m = len(est)
    d = len(est[0])
    k = d - 1
    Qd = contrast(d)
    th = np.concatenate([Qd.T @ (np.asarray(e, dtype=float) - 1.0 / d) for e in est])
    C = np.zeros((m * k, m * k))
    for i, c in enumerate(covs):
        C[i * k:(i + 1) * k, i * k:(i + 1) * k] = Qd.T @ c @ Qd
    C = 0.5 * (C + C.T)
    fit = fit_pooling(th, C, m, k, alpha, per_attribute)
    out = pooled_smoother(C, fit.tau2, m, k) @ th
    return [1.0 / d + Qd @ out[i * k:(i + 1) * k] for i in range(m)], fit
