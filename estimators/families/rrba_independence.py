"""χ² test of independence on a noisy RRBA two-way table ([RRBA] §6 and §7.3, docs/mechanisms.md §4).

The reports of a combination (a, b) are counts ``o[t]`` per table version t, drawn from
λ_t = p·π + (1−p)·T̃_t (T̃_t the floored fake-cell table of version t). The test:

1. **Two-step MLE.** (i) The unrestricted MLE π̂ of the true table through the channel (EM on
   the keep/fake mixture — the de-noising step); (ii) the log-linear refit
   π ∝ exp(η⁰ + θ) started from π̂, maximising the likelihood minus the elastic-net penalty
   γ·(½‖θ‖₁ + ¼‖θ‖₂²) on the interaction θ (γ = 0.01, objective per report), which keeps the
   fit finite where π̂ has empty cells. η⁰ = log of the null fit below.
2. **Null fit**: π⁰ = r ⊗ c maximising the channel likelihood (started from π̂'s marginals).
3. Statistic X² = N·Σ (π̂_γ − π⁰)²/π⁰ (N reports). Its null distribution is not χ² (the channel
   adds variance), so the critical value is the (1−α)-quantile of X² over l > 1/α
   **parametric bootstrap** tables drawn from the null fit through the same channel, each
   refitted the same way; reject when the bootstrap p-value (1 + #{X²* ≥ X²})/(l + 1) ≤ α.

This is our reading of the paper's procedure (the paper's text was not available to us); the
parts named above are those docs/mechanisms.md §4 fixes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import softmax

__all__ = ["IndependenceResult", "em_table", "fit_null", "fit_full", "statistic",
           "independence_test"]


@dataclass(frozen=True)
class IndependenceResult:
    statistic: float
    critical: float
    p_value: float
    reject: bool
    alpha: float
    resamples: int
    null_table: np.ndarray
    full_table: np.ndarray


def _prep(counts: np.ndarray, T_tilde: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    counts = np.asarray(counts, dtype=float)
    T_tilde = np.asarray(T_tilde, dtype=float)
    if counts.ndim == 2:
        counts, T_tilde = counts[None], T_tilde.reshape((1,) + counts.shape)
    if counts.ndim != 3 or T_tilde.shape != counts.shape:
        raise ValueError("counts must be (versions, d1, d2) with T_tilde of the same shape")
    return counts.reshape(len(counts), -1), T_tilde.reshape(len(counts), -1), counts.shape[1:]


def _nll_grad_pi(pi: np.ndarray, o: np.ndarray, Tt: np.ndarray, p: float, N: float):
    lam = np.maximum(p * pi[None, :] + (1 - p) * Tt, 1e-300)
    nll = -np.sum(o * np.log(lam)) / N
    g_pi = -p * np.sum(o / lam, axis=0) / N
    return nll, g_pi


def em_table(o: np.ndarray, Tt: np.ndarray, p: float, tol: float = 1e-9,
             max_iter: int = 3000) -> np.ndarray:
    """Unrestricted MLE of the true (raveled) table from counts ``o`` (versions × cells) through
    the channel λ_t = p·π + (1−p)·T̃_t: EM on "this report was kept / was a fake"."""
    N = o.sum()
    pi = np.full(o.shape[1], 1.0 / o.shape[1])
    for _ in range(max_iter):
        lam = p * pi[None, :] + (1 - p) * Tt
        new = pi * (p * (o / lam).sum(axis=0)) / N
        new /= new.sum()
        if np.max(np.abs(new - pi)) < tol:
            return new
        pi = new
    return pi


def fit_null(o: np.ndarray, Tt: np.ndarray, p: float, shape: tuple[int, int],
             start: np.ndarray | None = None) -> np.ndarray:
    """The independence table r ⊗ c maximising the channel likelihood (from ``start``'s
    marginals, default the observed ones)."""
    d1, d2 = shape
    N = o.sum()

    def f(x):
        r, c = softmax(x[:d1]), softmax(x[d1:])
        pi = np.outer(r, c).ravel()
        nll, g = _nll_grad_pi(pi, o, Tt, p, N)
        G = g.reshape(d1, d2)
        gr, gc = G @ c, G.T @ r
        return nll, np.concatenate([r * (gr - r @ gr), c * (gc - c @ gc)])

    marg = (o.sum(axis=0) / N if start is None else start.ravel()).reshape(d1, d2) + 1e-6
    x0 = np.concatenate([np.log(marg.sum(1)), np.log(marg.sum(0))])
    res = minimize(f, x0, jac=True, method="L-BFGS-B")
    return np.outer(softmax(res.x[:d1]), softmax(res.x[d1:]))


def fit_full(o: np.ndarray, Tt: np.ndarray, p: float, shape: tuple[int, int],
             null: np.ndarray, penalty: float = 0.01, start: np.ndarray | None = None) -> np.ndarray:
    """Step 1 (ii): log-linear fit around ``null`` with the elastic-net penalty on the
    interaction θ (θ = θ⁺ − θ⁻, θ± ≥ 0, so the L1 part is smooth under L-BFGS-B bounds),
    started from ``start`` (the EM table)."""
    d1, d2 = shape
    D = d1 * d2
    N = o.sum()
    base = np.log(np.maximum(null, 1e-300)).ravel()

    def f(x):
        th = x[:D] - x[D:]
        eta = base + th
        pi = softmax(eta)
        nll, g = _nll_grad_pi(pi, o, Tt, p, N)
        g_eta = pi * (g - pi @ g)
        pen = penalty * (0.5 * x.sum() + 0.25 * np.sum(th ** 2))
        g_th = g_eta + penalty * 0.5 * th
        return nll + pen, np.concatenate([g_th + 0.5 * penalty, -g_th + 0.5 * penalty])

    th0 = np.zeros(D) if start is None else np.log(np.maximum(start.ravel(), 1e-8)) - base
    th0 -= np.median(th0)  # softmax is shift-invariant: centre θ to keep the L1 part small
    x0 = np.concatenate([np.maximum(th0, 0), np.maximum(-th0, 0)])
    res = minimize(f, x0, jac=True, method="L-BFGS-B", bounds=[(0, None)] * (2 * D))
    th = res.x[:D] - res.x[D:]
    th[np.abs(th) < 1e-6] = 0.0   # optimizer residue: the L1 part zeroes these exactly
    return softmax(base + th).reshape(d1, d2)


def statistic(full: np.ndarray, null: np.ndarray, n: float) -> float:
    """X² = n·Σ (π̂ − π⁰)²/π⁰ (values below 1e-9, numerical residue, count as 0)."""
    x2 = float(n * np.sum((full - null) ** 2 / np.maximum(null, 1e-300)))
    return x2 if x2 > 1e-9 else 0.0


def independence_test(counts: np.ndarray, T_tilde: np.ndarray, p: float,
                      rng: np.random.Generator, alpha: float = 0.05, resamples: int | None = None,
                      penalty: float = 0.01) -> IndependenceResult:
    """Test H0 "the two attributes are independent" from noisy RRBA counts.

    ``counts``: (d1, d2) or (versions, d1, d2); ``T_tilde``: the floored fake tables of the
    same shape; ``resamples`` l must exceed 1/α (default: the smallest l ≥ 99 with
    (l+1)·α an integer, at least ⌈1/α⌉+1)."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if resamples is None:
        resamples = max(99, int(np.ceil(1 / alpha)) + 1)
    if resamples <= 1 / alpha:
        raise ValueError(f"resamples must exceed 1/alpha = {1 / alpha:g}, got {resamples}")
    o, Tt, shape = _prep(counts, T_tilde)
    n_t = o.sum(axis=1).astype(np.int64)
    N = float(n_t.sum())
    null, full = _fits(o, Tt, p, shape, penalty)
    x2 = statistic(full, null, N)
    boot = np.empty(resamples)
    pi0 = null.ravel()
    for b in range(resamples):
        lam = p * pi0[None, :] + (1 - p) * Tt
        lam /= lam.sum(axis=1, keepdims=True)
        ob = np.stack([rng.multinomial(n, l) for n, l in zip(n_t, lam)]).astype(float)
        nb, fb = _fits(ob, Tt, p, shape, penalty)
        boot[b] = statistic(fb, nb, N)
    critical = float(np.quantile(boot, 1 - alpha))
    p_value = float((1 + np.sum(boot >= x2)) / (resamples + 1))
    return IndependenceResult(x2, critical, p_value, bool(p_value <= alpha), alpha, resamples,
                              null, full)


def _fits(o, Tt, p, shape, penalty):
    em = em_table(o, Tt, p)
    null = fit_null(o, Tt, p, shape, start=em)
    return null, fit_full(o, Tt, p, shape, null, penalty, start=em)
