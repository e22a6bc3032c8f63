"""Hybrid: per marginal, RR-Ind-Joint (castell) or RR-Independent [Castell §III-D, Appendix C].

Two selection rules:

* :func:`hybrid` — the paper's bound rule. RR-Independent's error is bounded by Theorem 5,
  ``max(d^{−w}, 1/d − d^{−w})``; castell's by Theorem 6,
  ``(1 + (d−1)/e^{ε/w})^w · d^w / n``, with d = max d_i. Here ε is given per attribute, so the
  factor ``(1 + (d−1)/e^{ε/w})^w`` is written ``∏_i (1 + (d−1)·e^{−ε_i})`` (identical when every
  attribute gets ε/w). Castell is chosen when its bound is the smaller. The paper notes the bounds
  are loose (they predict w* = 1.37 where Adult says 4).
* :func:`hybrid_auto` — a data-driven rule: pick the estimate with the smaller *estimated*
  squared L2 error E‖Π̂ − Π‖²:

  - castell: unbiased, so its error is its variance, ``Σ_c Var(Π̂_c)`` from
    :func:`~ldpstream.estimators.kernels.castell.castell_variance` (plug-in multinomial covariance);
  - RR-Independent (Π̃ = ⊗ m_i): bias² + variance. ``‖Π̂ − Π̃‖²`` has expectation
    ≈ bias² + Var(Π̂) + Var(Π̃) − 2 Cov, so bias² is estimated by ``max(‖Π̂ − Π̃‖² − ΣVar(Π̂), 0)``
    (Var(Π̃) and the covariance are left in, which errs towards calling the product biased);
    the variance of the product is the first-order (delta-method) one, treating the w marginal
    estimates as independent: ``Σ_i (Σ_x Var(m̂_i(x))) · ∏_{j≠i} Σ_x m_j(x)²``, with Var(m̂_i)
    the 1-way castell variance and m_j the clip-rescaled marginals.

Both return ``(estimate, name)`` with name ``"castell"`` or ``"rr-independent"``.

Error bound of a chosen RR-Independent estimate: the product is biased, so castell's bound says
nothing about it alone; the family serves castell's bound plus the product's TVD to castell
(:func:`~.bounds.triangle`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ldpstream.estimators.kernels.castell import castell, castell_variance, check_inputs
from ldpstream.estimators.kernels.rr_independent import marginal_estimates, outer

__all__ = ["hybrid", "hybrid_auto", "hybrid_bounds", "auto_errors"]


def hybrid_bounds(shape: Sequence[int], n: float, epsilons: Sequence[float]) -> tuple[float, float]:
    """(castell bound [Theorem 6], RR-Independent bound [Theorem 5]) for a marginal of ``shape``
    over ``n`` reports with per-attribute ``epsilons``."""
    shape = tuple(int(s) for s in shape)
    eps = [float(e) for e in epsilons]
    if len(eps) != len(shape):
        raise ValueError(f"hybrid: {len(shape)} attributes but {len(eps)} epsilons")
    if any(not np.isfinite(e) or e <= 0 for e in eps):
        raise ValueError(f"hybrid: every epsilon must be a finite number > 0, got {eps}")
    if n <= 0:
        raise ValueError("hybrid: counts are all zero")
    w = len(shape)
    d = float(max(shape))
    castell_bound = float(np.prod([1.0 + (d - 1.0) * np.exp(-e) for e in eps]) * d ** w / n)
    rr_bound = float(max(d ** -w, 1.0 / d - d ** -w))
    return castell_bound, rr_bound


def hybrid(counts: np.ndarray, channels: Sequence[np.ndarray],
           epsilons: Sequence[float]) -> tuple[np.ndarray, str]:
    """Bound rule [Castell §III-D, Appendix C]: castell if its Theorem 6 bound is below
    RR-Independent's Theorem 5 bound, else RR-Independent."""
    counts, channels = check_inputs(counts, channels)
    cb, rb = hybrid_bounds(counts.shape, counts.sum(), epsilons)
    if cb < rb:
        return castell(counts, channels), "castell"
    return outer(marginal_estimates(counts, channels)), "rr-independent"


def auto_errors(counts: np.ndarray, channels: Sequence[np.ndarray]) -> dict[str, object]:
    """The quantities :func:`hybrid_auto` compares: both estimates and their estimated
    E‖error‖² (keys ``castell``, ``rr-independent``, ``castell_err``, ``rr-independent_err``,
    ``bias2``)."""
    counts, channels = check_inputs(counts, channels)
    w = counts.ndim
    est = castell(counts, channels)
    var_c = float(castell_variance(counts, channels).sum())
    margins = marginal_estimates(counts, channels)
    ind = outer(margins)
    var_m = []
    for i in range(w):
        c = counts.sum(axis=tuple(k for k in range(w) if k != i)) if w > 1 else counts
        var_m.append(float(castell_variance(c, [channels[i]]).sum()))
    sq = [float(np.square(m).sum()) for m in margins]
    var_ind = float(sum(var_m[i] * np.prod([sq[j] for j in range(w) if j != i])
                        for i in range(w)))
    bias2 = max(float(np.square(est - ind).sum()) - var_c, 0.0)
    return {"castell": est, "rr-independent": ind, "castell_err": var_c,
            "rr-independent_err": bias2 + var_ind, "bias2": bias2}


def hybrid_auto(counts: np.ndarray, channels: Sequence[np.ndarray]) -> tuple[np.ndarray, str]:
    """Data-driven rule: the estimate with the smaller estimated E‖error‖² (module docstring)."""
    e = auto_errors(counts, channels)
    if e["castell_err"] <= e["rr-independent_err"]:
        return e["castell"], "castell"  # type: ignore[return-value]  # the key is a literal
    return e["rr-independent"], "rr-independent"  # type: ignore[return-value]  # idem

