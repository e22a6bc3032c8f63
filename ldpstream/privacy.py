"""What a collection's reports cost in privacy, as every answer states it (API, CLI, `up`).

Four fields, always together: ``epsilon`` and ``epsilon_scope`` are the configured budget and
what it budgets (each attribute, or the whole record); ``epsilon_per_record`` and
``epsilon_per_attribute`` are computed from the channels the mechanism actually applies (the
second only where attributes are randomized by separate channels: the ε that protects one
attribute when the others are known). ``privacy_note`` flags a per-record ε above
:data:`WEAK_EPSILON` (docs/mechanisms.md §9).
"""
from __future__ import annotations

import math
from typing import Any

from .estimators.mechanism import Mechanism

#: above this ε per record one report says much about its device's record; flagged everywhere
WEAK_EPSILON = 4.0


def epsilon_per_attribute(mechanism: Mechanism) -> float | None:
    """The largest ε of one attribute: its channel's ε (rr-ind) or its cluster's (rr-joint,
    rr-clusters, where changing one attribute changes the cluster's cell). None for mechanisms
    that randomize attributes jointly otherwise (only the per-record ε applies):
    ``Mechanism.epsilon_per_attribute``."""
    return mechanism.epsilon_per_attribute()


def privacy_note(epsilon_per_record: float | None) -> str | None:
    """A warning when ``epsilon_per_record`` is weak privacy, else None."""
    # a computed ε of 4.000000000000004 is the configured 4: compare with a relative tolerance
    if epsilon_per_record is None or epsilon_per_record <= WEAK_EPSILON * (1 + 1e-9):
        return None
    ratio = "more than 1e300" if epsilon_per_record > 690 else f"{math.exp(epsilon_per_record):.3g}"
    return (f"weak privacy: ε = {epsilon_per_record:.3g} per record, so one report can be "
            f"{ratio} times likelier under one record than under another (ε per record ≤ 1 is "
            f"strong; above {WEAK_EPSILON:g} little about a device's record stays hidden)")


def epsilon_fields(collection: Any, mechanism: Mechanism,
                   per_record: float | None = None) -> dict[str, Any]:
    """The ε fields of a collection's description and of every estimate of it (``per_record``:
    what the estimate's reports cost, when known; else the mechanism's)."""
    if per_record is None:
        try:
            per_record = float(mechanism.epsilon)
        except (ValueError, RuntimeError):  # an adaptive mechanism without its state yet
            per_record = None
    return {
        "epsilon": float(collection.epsilon),
        "epsilon_scope": collection.epsilon_scope,
        "epsilon_per_record": per_record,
        "epsilon_per_attribute": None if per_record is None else epsilon_per_attribute(mechanism),
        "privacy_note": privacy_note(per_record),
    }
