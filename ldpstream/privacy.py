"""What a collection's reports cost in privacy, as every answer states it (API, CLI, `up`).

Four fields, always together: ``epsilon`` and ``epsilon_scope`` are the configured budget and
what it budgets (each attribute, or the whole record); ``epsilon_per_record`` and
``epsilon_per_attribute`` are computed from the channels the mechanism actually applies (the
second only where attributes are randomized by separate channels: the ε that protects one
attribute when the others are known). A memoized collection adds ``epsilon_per_rotation`` and
``epsilon_per_day`` (what one device's reports cost together while its record stays the same,
docs/mechanisms.md §8), and ``privacy_note`` then judges the per-day figure, the one that grows
with reporting; otherwise it flags a per-record ε above :data:`WEAK_EPSILON` (docs/mechanisms.md
§9). docs/api.md ("ε fields") explains every field.
"""
from __future__ import annotations

import math
from typing import Any

from ldpstream.config import Collection
from ldpstream.estimators.mechanism import Mechanism
from ldpstream.privacy_windows import window_fields

#: above this ε per record one report says much about its device's record; flagged everywhere
WEAK_EPSILON = 4.0


def epsilon_per_attribute(mechanism: Mechanism) -> float | None:
    """The largest ε of one attribute: its channel's ε (rr-ind) or its cluster's (rr-joint,
    rr-clusters, where changing one attribute changes the cluster's cell). None for mechanisms
    that randomize attributes jointly otherwise (only the per-record ε applies):
    ``Mechanism.epsilon_per_attribute``."""
    return mechanism.epsilon_per_attribute()


def privacy_note(epsilon_per_record: float | None,
                 per_day: float | None = None) -> str | None:
    """A warning when ``epsilon_per_record`` (or, for a memoized collection, ``per_day``: what
    a device's reports of one day cost together) is weak privacy, else None."""
    eps, what, unit = ((epsilon_per_record, "one report", "per record") if per_day is None else
                       (per_day, "one device's reports of a day", "per device per day"))
    # a computed ε of 4.000000000000004 is the configured 4: compare with a relative tolerance
    if eps is None or eps <= WEAK_EPSILON * (1 + 1e-9):
        return None
    ratio = "more than 1e300" if eps > 690 else f"{math.exp(eps):.3g}"
    return (f"weak privacy: ε = {eps:.3g} {unit}, so {what} can be {ratio} times likelier "
            f"under one record than under another (ε ≤ 1 is strong; above {WEAK_EPSILON:g} "
            f"little about a device's record stays hidden)")


def epsilon_fields(collection: Collection, mechanism: Mechanism,
                   per_record: float | None = None) -> dict[str, Any]:
    """The ε fields of a collection's description and of every estimate of it (``per_record``:
    what the estimate's reports cost, when known; else the mechanism's)."""
    if per_record is None:
        try:
            per_record = float(mechanism.epsilon)
        except (ValueError, RuntimeError):  # an adaptive mechanism without its state yet
            per_record = None
    try:
        over_time = mechanism.guarantee()
    except (ValueError, RuntimeError):  # an adaptive mechanism without its state yet
        over_time = None
    memoized = over_time if over_time is not None and over_time.memoized else None
    per_day = memoized.per_day if memoized is not None else None
    return {
        "epsilon": float(collection.epsilon),
        "epsilon_scope": collection.epsilon_scope,
        "epsilon_per_record": per_record,
        "epsilon_per_attribute": None if per_record is None else epsilon_per_attribute(mechanism),
        "epsilon_per_rotation": memoized.per_rotation if memoized is not None else None,
        "epsilon_per_day": per_day,
        "privacy_note": privacy_note(per_record, per_day),
    }


def all_window(coll: Collection, memoized: bool) -> str:
    """What the ``all`` window holds: for a collection counted per device, the devices active
    within its retention (agents/store/device_memo.py); else every report counted."""
    if not memoized:
        return "every report counted since the collection started"
    days = coll.device_retention() / 86_400.0
    return (f"devices active within the last {days:g} days (device_retention_s), each at its "
            f"latest report")


def over_time(coll: Collection, mechanism: Mechanism,
              device_state_full: int = 0) -> dict[str, Any]:
    """The ``over_time`` field of a collection's description: what its estimates count
    (``device`` when the mechanism memoizes: agents/store/device_memo.py, else ``report``), the
    window fields above and, when this worker refused reports of new devices for want of room
    (``device_state_full``), a warning."""
    memoized = mechanism.memoization() is not None
    out = {"counted_by": "device" if memoized else "report",
           **window_fields(coll.reports_per_day, coll.max_epsilon_per_day,
                           [(w.name, w.seconds) for w in coll.windows], mechanism),
           "device_state_max": coll.device_state_max if memoized else None,
           "device_retention_s": coll.device_retention() if memoized else None,
           "all_window": all_window(coll, memoized),
           "warning": None}
    if device_state_full:
        out["warning"] = (f"{device_state_full} report(s) of new devices refused "
                          f"(device_state_full): a partition keeps at most device_state_max = "
                          f"{coll.device_state_max} devices; their devices are not in the "
                          f"estimates")
    return out
