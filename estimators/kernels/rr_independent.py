"""RR-Independent [Castell Alg. 2; docs/mechanisms.md §2]: the joint as the product of marginals.

Each 1-way marginal is estimated from the counts summed over every other axis (a 1-way Castell
estimate, i.e. π̂ = P⁻ᵀ λ̂), repaired with :func:`~ldpstream.estimators.kernels.proper.clip_rescale`
[MDRR §6.4], and the w-way estimate is their outer product. It ignores every dependence between
attributes: low variance, bias = the distance of the truth from independence.

>>> import numpy as np
>>> from ldpstream.estimators.kernels.channels import grr
>>> P = grr(np.log(3), 2)
>>> rr_independent(np.array([[3, 1], [3, 3]]), [P, P]).round(6).tolist()
[[0.21, 0.09], [0.49, 0.21]]
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ldpstream.estimators.kernels.castell import castell, check_inputs
from ldpstream.estimators.kernels.proper import clip_rescale

__all__ = ["rr_independent", "marginal_estimates", "outer"]


def marginal_estimates(counts: np.ndarray, channels: Sequence[np.ndarray], *,
                       repair: bool = True) -> list[np.ndarray]:
    """The w one-way estimates (clip-rescaled unless ``repair=False``)."""
    counts, channels = check_inputs(counts, channels)
    w = counts.ndim
    out = []
    for i in range(w):
        c = counts.sum(axis=tuple(k for k in range(w) if k != i)) if w > 1 else counts
        est = castell(c, [channels[i]])
        out.append(clip_rescale(est) if repair else est)
    return out


def outer(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """Outer product v₁ ⊗ … ⊗ v_w as a w-way array."""
    out = np.asarray(vectors[0], dtype=float)
    for v in vectors[1:]:
        out = np.multiply.outer(out, np.asarray(v, dtype=float))
    return out


def rr_independent(counts: np.ndarray, channels: Sequence[np.ndarray]) -> np.ndarray:
    """[Castell Alg. 2]: outer product of the clip-rescaled 1-way estimates (a proper
    distribution)."""
    return outer(marginal_estimates(counts, channels))
