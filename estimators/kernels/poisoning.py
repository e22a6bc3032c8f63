"""How far crafted reports can move an unbiased marginal estimate (docs/security.md).

Under local differential privacy a crafted report is indistinguishable from an honest one, so
poisoning cannot be prevented, only bounded: per-device quotas (agents/store/quota.py) cap the reports
``m`` that ``k`` devices get counted (``m <= k * q`` per quota window, ``k * q * P`` when their
messages spread over ``P`` partitions).

For the unbiased inverse estimator of independent randomized response ([Castell] §III; the
``castell`` estimator of rr-ind) the marginal estimate is linear in the normalized report
histogram ``h`` of the marginal's cells: ``π̂ = M h`` with ``M = ⊗_a (P_aᵀ)⁻¹`` (``P_a`` the
attribute channels, ``P[u, v] = Pr(report v | value u)``). Adding ``m`` arbitrary reports to ``n``
honest ones changes ``h`` by ``v = (a − m h) / (n + m)`` where ``a ≥ 0`` sums to ``m``: ``v`` sums
to 0 and its positive and negative parts are each at most ``m / (n + m)``. Hence, for every cell
``j``::

    |Δπ̂_j| <= (max_i M_ji − min_i M_ji) · m / (n + m)

and the bound is attained by putting every crafted report in the cell maximizing ``M_ji`` while
the honest reports sit where it is smallest. :func:`poisoning_bound` is the maximum over cells.
Projections to a proper distribution (``truncated``, simplex) are non-expansive in L2, so their
shift is at most the unbiased estimate's in L2 (``sqrt(cells)`` times this bound).
"""
from __future__ import annotations

from functools import reduce
from typing import Sequence

import numpy as np

__all__ = ["inverse_map", "poisoning_bound"]


def inverse_map(channels: Sequence[np.ndarray]) -> np.ndarray:
    """``M = ⊗_a (P_aᵀ)⁻¹``: the unbiased estimate of the marginal is ``M @ h``."""
    return reduce(np.kron, [np.linalg.inv(np.asarray(P, dtype=float).T) for P in channels])


def poisoning_bound(channels: Sequence[np.ndarray], n: int, m: int) -> float:
    """The largest change of any cell of the unbiased estimate that ``m`` crafted reports can
    cause among ``n`` honest ones (exact: attained by some ``m`` reports and honest histogram).

    >>> import numpy as np
    >>> P = np.array([[0.75, 0.25], [0.25, 0.75]])        # binary RR, ε = ln 3
    >>> round(poisoning_bound([P], 900, 100), 4)          # (1.5 - -0.5) * 100 / 1000
    0.2
    """
    if n < 0 or m < 0:
        raise ValueError("n and m must be >= 0")
    if n + m == 0:
        return 0.0
    M = inverse_map(channels)
    return float((M.max(axis=1) - M.min(axis=1)).max() * m / (n + m))
