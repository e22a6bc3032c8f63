"""The calibrated bound of corr-rr's unbiased GLS estimate U (docs/estimators.md "Error bounds";
the model: :mod:`.corr_rr`).

U = u + K1(f̂ᴵ − u) + K2(λ̂ − Hu) is linear in the Phase I decodes f̂ᴵ and the Phase II column
frequencies λ̂, with the gains K1, K2 of the estimate's final plug-in. The parametric bootstrap
(estimators/kernels/bounds.py) draws both from the reference distributions ``ref`` of every
attribute, exactly and without a loop over reports: Phase I, every attribute's column a
multinomial of n₁ reports through GRR(ε/m); Phase II, the pivots' counts a multinomial of n₂ over
the m attributes, each pivot's outputs a multinomial through GRR(ε) and every copied column, per
pivot output, a multinomial through that row of the copy channel (only the pivot is randomized;
given its output the copies are independent). Each draw goes through the same K1, K2.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ldpstream.estimators.families.corr_rr_model import Combined, PhaseModel
from ldpstream.estimators.kernels.bounds import DRAWS, LEVEL, SEED, Bound, bootstrap_bound, reference, stream

__all__ = ["unbiased_bounds"]


def unbiased_bounds(pm: PhaseModel, cb: Combined, counts: Sequence[np.ndarray], *,
                    level: float = LEVEL, draws: int = DRAWS, seed: int = SEED) -> list[Bound]:
    """The bound of U's marginal of every attribute (``counts``: the column counts, for the
    bootstrap's seed)."""
    assert cb.gains is not None, "the combination keeps its gains"
    K1, K2 = cb.gains
    rng = stream(seed, np.concatenate([np.ravel(c) for c in counts]))
    n1, n2 = int(round(pm.n1)), int(round(pm.n2))
    refs = [reference(x, pm.n) for x in pm.split(cb.unbiased)]
    f1 = np.empty((draws, pm.D))
    cols = np.zeros((draws, pm.D))
    pivots = rng.multinomial(n2, np.full(pm.m, 1.0 / pm.m), size=draws)
    for j, (ref, (p1, q1)) in enumerate(zip(refs, pm.pq1)):
        s = slice(pm.off[j], pm.off[j + 1])
        if n1 > 0:
            c1 = rng.multinomial(n1, pm.P1[j].T @ ref, size=draws)
            f1[:, s] = (c1 / n1 - q1) / (p1 - q1)
        out = rng.multinomial(pivots[:, j], pm.P2[j].T @ ref)            # (draws, d_j)
        for k in range(pm.m):
            t = slice(pm.off[k], pm.off[k + 1])
            M = pm.Mbig[j][:, t]
            M = M / M.sum(axis=1, keepdims=True)
            cols[:, t] += out if k == j else rng.multinomial(out, M).sum(axis=1)
    U = pm.u + (f1 - pm.u) @ K1.T if n1 > 0 else np.broadcast_to(pm.u, (draws, pm.D))
    U = U + (cols / max(n2, 1) - pm.H @ pm.u) @ K2.T
    return [bootstrap_bound(x, ref, U[:, pm.off[k]:pm.off[k + 1]], level)
            for k, (x, ref) in enumerate(zip(pm.split(cb.unbiased), refs))]
