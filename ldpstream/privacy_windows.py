"""What a device spends per window and per day at its collection's declared reporting rate, and
the daily ε budget the SDK ledger and the worker enforce (docs/privacy-over-time.md, "ε per window and per
day"). Pure functions of the collection's config and its mechanism's
:class:`~ldpstream.estimators.stream.longitudinal.Guarantee`.

At ``reports_per_day = r``, a window of ``s`` seconds (half-open, as the ledger's) holds at most
``k = ceil(r · s / 86400)`` reports of a device. Fresh randomization composes: ``k × ε_report``.
A memoized device pays its permanent responses once per rotation period [RAPPOR §3]: at most
``ε_rotation × periods_per_window(s, rotation_s)`` while its record stays the same, and never more
than ``k × ε_report`` (each report is ``ε_report``-LDP on its own).
"""
from __future__ import annotations

import math
from typing import Any

from ldpstream.estimators.mechanism import Mechanism
from ldpstream.estimators.stream.longitudinal import Guarantee, periods_per_window

__all__ = ["DAY_S", "budget_day", "reports_in", "epsilon_in", "daily_report_limit", "budget_problem",
           "window_fields"]

DAY_S = 86_400.0
_RTOL = 1e-9   # a computed ε equal to the budget up to rounding is within it


def budget_day(t: float) -> int:
    """The budget day of unix time ``t``: its UTC calendar day, ``floor(t / 86,400)``. The one
    day of ``max_epsilon_per_day``: the device ledger sums the spend of it, the worker counts the
    reports of it (its quota window of one day, agents/store/quota.py) (docs/privacy-over-time.md)."""
    return int(math.floor(float(t) / DAY_S))


def reports_in(seconds: float, reports_per_day: float) -> int:
    """The most reports a device at ``reports_per_day`` sends in ``seconds``."""
    return int(math.ceil(reports_per_day * seconds / DAY_S * (1 - _RTOL)))


def epsilon_in(g: Guarantee, seconds: float, reports_per_day: float | None) -> float | None:
    """ε one device spends in any ``seconds`` (None: unbounded: fresh randomization at an
    undeclared rate)."""
    fresh = None if reports_per_day is None else \
        reports_in(seconds, reports_per_day) * g.per_report
    if g.memoized and g.per_rotation is not None:
        memo = g.per_rotation * periods_per_window(seconds, g.rotation_s)
        return memo if fresh is None else min(memo, fresh)
    return fresh


def _guarantee(mechanism: Mechanism) -> Guarantee | None:
    try:
        return mechanism.guarantee()
    except (ValueError, RuntimeError):  # an adaptive mechanism without its state yet
        return None


def daily_report_limit(max_epsilon_per_day: float | None, reports_per_day: float | None,
                       g: Guarantee | None) -> int | None:
    """Reports the worker counts per device and day (the rest → ``over_budget``): the declared
    rate, and for fresh randomization also the reports ``max_epsilon_per_day`` pays for. None:
    no budget."""
    if max_epsilon_per_day is None:
        return None
    limits = []
    if reports_per_day is not None:
        limits.append(reports_in(DAY_S, reports_per_day))
    if g is not None and not g.memoized and g.per_report > 0:
        limits.append(int(math.floor(max_epsilon_per_day / g.per_report * (1 + _RTOL))))
    return min(limits) if limits else None


def budget_problem(max_epsilon_per_day: float | None, reports_per_day: float | None,
                   mechanism: Mechanism) -> str | None:
    """Why a collection's ``max_epsilon_per_day`` cannot hold at its declared rate (None: it
    holds, or there is none)."""
    g = _guarantee(mechanism)
    if max_epsilon_per_day is None or g is None:
        return None
    if g.memoized and reports_per_day is None:
        return ("a memoized collection needs reports_per_day (the declared rate the worker "
                "checks devices against)")
    spent = epsilon_in(g, DAY_S, reports_per_day)
    if spent is not None and spent > max_epsilon_per_day * (1 + _RTOL):
        return (f"a device at the declared rate spends ε = {spent:.6g} per day "
                f"(reports_per_day = {reports_per_day}), above max_epsilon_per_day = "
                f"{max_epsilon_per_day:g}")
    if daily_report_limit(max_epsilon_per_day, reports_per_day, g) == 0:
        return (f"one report costs ε = {g.per_report:.6g}, above max_epsilon_per_day = "
                f"{max_epsilon_per_day:g}")
    return None


def window_fields(reports_per_day: float | None, max_epsilon_per_day: float | None,
                  windows: list[tuple[str, float | None]], mechanism: Mechanism
                  ) -> dict[str, Any]:
    """The fields ``/collections``, the page and ``simulate`` state: the declared rate, the
    budget, the ε per device per window (``all``: per rotation period if memoized, else
    unbounded) and per day."""
    g = _guarantee(mechanism)
    per_window = {name: None if g is None or seconds is None else
                  epsilon_in(g, seconds, reports_per_day) for name, seconds in windows}
    return {"reports_per_day": reports_per_day,
            "max_epsilon_per_day": max_epsilon_per_day,
            "epsilon_per_window": per_window,
            "epsilon_per_device_day": None if g is None else
            epsilon_in(g, DAY_S, reports_per_day),
            "daily_report_limit": daily_report_limit(max_epsilon_per_day, reports_per_day, g)}
