"""The daily ε budget in the worker (docs/privacy-over-time.md, "ε per window and per day"): a collection
with ``max_epsilon_per_day`` counts at most :func:`~ldpstream.privacy_windows.daily_report_limit`
reports per device id per day of the worker's clock; the rest go to ``ldp.dlq`` as
``over_budget`` (``ldp_reports_rejected_total{reason="over_budget"}``). Counted like the device
quota, in side counters applied with the counts (agents/ingest/quota_gate.py), so exactly once."""
from __future__ import annotations

from ldpstream.agents.ingest.quota_gate import QuotaRule
from ldpstream.config import Collection
from ldpstream.privacy_windows import DAY_S, daily_report_limit

__all__ = ["DAILY_BUDGET", "PREFIX"]

PREFIX = "budget:"


def _limit(c: Collection) -> tuple[int, float] | None:
    try:
        g = c.mechanism().guarantee()
    except (ValueError, RuntimeError):  # an adaptive mechanism without its state yet
        g = None
    k = daily_report_limit(c.max_epsilon_per_day, c.reports_per_day, g)
    return None if k is None else (k, DAY_S)


DAILY_BUDGET = QuotaRule("over_budget", PREFIX, _limit, "the daily ε budget")
