"""The firing alerts of a Prometheus (``$LDP_PROMETHEUS_URL``; ``ldpstream up --obs`` starts one
with the project's rules, ldpstream/dev/observability.py), as the live page (``GET /ui/alerts``)
and ``ldpstream estimates`` show them (docs/dashboards.md, "Alerts without Docker")."""
from __future__ import annotations

import json
import os
import urllib.request
from typing import Any

from ldpstream.names import ENV_PROMETHEUS_URL

__all__ = ["prometheus_url", "firing_alerts"]


def prometheus_url() -> str | None:
    """``$LDP_PROMETHEUS_URL`` without a trailing slash, or None."""
    url = os.environ.get(ENV_PROMETHEUS_URL, "").strip().rstrip("/")
    return url or None


def firing_alerts(url: str, timeout: float = 3.0) -> list[dict[str, Any]]:
    """The firing alerts of the Prometheus at ``url`` (``/api/v1/alerts``): name, severity,
    labels, summary, runbook and since when; OSError/ValueError when it does not answer."""
    with urllib.request.urlopen(f"{url}/api/v1/alerts", timeout=timeout) as resp:
        data = json.loads(resp.read())["data"]["alerts"]
    return [{"name": a["labels"].get("alertname"), "severity": a["labels"].get("severity"),
             "labels": a["labels"], "summary": a.get("annotations", {}).get("summary"),
             "runbook": a.get("annotations", {}).get("runbook"), "since": a.get("activeAt")}
            for a in data if a.get("state") == "firing"]
