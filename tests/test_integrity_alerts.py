"""The data-integrity alert rules (dashboards/prometheus/rules/integrity.rules.yml) pass promtool,
are loaded by prometheus.yml, and fire (and stay silent) as their unit tests say."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.core

PROM = Path(__file__).resolve().parents[1] / "dashboards" / "prometheus"


def _promtool(*args: str) -> str:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run scripts/bootstrap.sh (apt-get install prometheus)"
    res = subprocess.run([promtool, *args], cwd=PROM, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_integrity_rules_load_and_every_alert_fires_and_not():
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert "rules/integrity.rules.yml" in cfg["rule_files"]
    _promtool("check", "rules", "rules/integrity.rules.yml")
    rules = yaml.safe_load((PROM / "rules" / "integrity.rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tests = yaml.safe_load((PROM / "tests" / "integrity.test.yml").read_text())
    fired, silent = set(), set()
    for t in tests["tests"]:
        for case in t["alert_rule_test"]:
            (fired if case["exp_alerts"] else silent).add(case["alertname"])
    assert alerts == fired == silent == {"LogReset", "ConfigForgery", "ConfigReplayed",
                                         "BatchesMissing", "AckedNotCounted"}
    for r in rules["groups"][0]["rules"]:
        assert {"summary", "description", "runbook"} <= set(r["annotations"])
    _promtool("test", "rules", "tests/integrity.test.yml")
