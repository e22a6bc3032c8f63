"""Truncated RR-Ind-Joint [Castell Alg. 4; docs/mechanisms.md §2].

No cell of a w-way marginal can exceed the (w−1)-way marginal it sums into, so the Castell
estimate is clipped at 0 and then, for every attribute i of the marginal, capped by the clipped
Castell estimate of the (w−1)-way marginal without i, broadcast along axis i:

    Π₀ = max(Π̂, 0);  Π_i = min(Π_{i−1}, max(Π̂_{S∖{i}}, 0) broadcast along axis i).

The (w−1)-way estimates are plain Castell estimates from the counts summed over axis i (not
truncated recursively). The result is not renormalised ([Castell] Appendix B gives
[[0.3, 0], [0.25, 0.3]], which sums to 0.85).

>>> import numpy as np
>>> from ldpstream.estimators.kernels.channels import grr
>>> P = grr(np.log(3), 2)
>>> truncated(np.array([[3, 1], [3, 3]]), [P, P]).round(6).tolist()
[[0.3, 0.0], [0.25, 0.3]]
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ldpstream.estimators.kernels.castell import castell, check_inputs

__all__ = ["truncated", "lower_level"]


def lower_level(counts: np.ndarray, channels: Sequence[np.ndarray], axis: int) -> np.ndarray:
    """Clipped Castell estimate of the marginal without ``axis``, shaped to broadcast along it
    (that axis has length 1)."""
    counts, channels = check_inputs(counts, channels)
    rest = [P for k, P in enumerate(channels) if k != axis]
    est = np.maximum(castell(counts.sum(axis=axis), rest), 0.0)
    return np.expand_dims(est, axis)


def truncated(counts: np.ndarray, channels: Sequence[np.ndarray]) -> np.ndarray:
    """[Castell Alg. 4] (see module docstring); at w = 1 this is max(Π̂, 0)."""
    counts, channels = check_inputs(counts, channels)
    est = np.maximum(castell(counts, channels), 0.0)
    if counts.ndim == 1:
        return est
    for i in range(counts.ndim):
        np.minimum(est, lower_level(counts, channels, i), out=est)
    return est
