"""Prometheus rules and config pass promtool; the Grafana dashboard is valid for provisioning."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parents[1]
PROM = ROOT / "dashboards" / "prometheus"
GRAFANA = ROOT / "dashboards" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "ldpstream.json"
DS_UID = "ldp-prometheus"

promtool = shutil.which("promtool")
def needs_promtool(fn):
    """promtool is installed by scripts/bootstrap.sh (Debian package prometheus); never skipped."""
    def wrapper():
        assert promtool, "promtool missing: run scripts/bootstrap.sh (apt-get install prometheus)"
        return fn()
    wrapper.__name__ = fn.__name__
    return wrapper


def _run(*args):
    res = subprocess.run([promtool, *args], cwd=PROM, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


@needs_promtool
def test_promtool_check_rules():
    out = _run("check", "rules", "rules/ldpstream.rules.yml")
    assert "9 rules found" in out


@needs_promtool
def test_promtool_unit_tests_every_alert_firing_and_not():
    tests = yaml.safe_load((PROM / "tests" / "alerts.test.yml").read_text())
    rules = yaml.safe_load((PROM / "rules" / "ldpstream.rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    fired, silent = set(), set()
    for t in tests["tests"]:
        for case in t["alert_rule_test"]:
            (fired if case["exp_alerts"] else silent).add(case["alertname"])
    assert alerts == fired == silent, "every alert needs a firing and a not-firing case"
    _run("test", "rules", "tests/alerts.test.yml")


@needs_promtool
def test_promtool_check_config():
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert any("ldpstream.rules.yml" in f for f in cfg.get("rule_files", []))
    _run("check", "config", "prometheus.yml")


def test_every_rule_has_runbook_and_summary():
    rules = yaml.safe_load((PROM / "rules" / "ldpstream.rules.yml").read_text())
    for r in rules["groups"][0]["rules"]:
        assert {"summary", "description", "runbook"} <= set(r["annotations"]), r["alert"]
        assert r["labels"]["severity"] in {"info", "warning", "critical"}
    expected = {"EstimateDrift", "EstimateFailing", "IngestStalled", "RejectSpike",
                "ConsumerLagHigh", "EstimateStale", "PrivacyBudgetChanged", "WorkerDown"}
    assert expected <= {r["alert"] for r in rules["groups"][0]["rules"]}


def test_dashboard_valid_for_provisioning():
    dash = json.loads(DASHBOARD.read_text())
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    assert dash["uid"] and dash["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == DS_UID, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == DS_UID and t["expr"].strip()
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            assert v["datasource"]["uid"] == DS_UID
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert [d["uid"] for d in ds["datasources"]] == [DS_UID]
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "ldpstream.yml").read_text())
    assert prov["providers"][0]["type"] == "file"


def test_dashboard_covers_required_views_and_metrics_follow_conventions():
    dash = json.loads(DASHBOARD.read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for metric in ("ldp_estimate_cell", "ldp_estimate_error_bound", "ldp_collection_reports",
                   "ldp_reports_ingested_total", "ldp_reports_rejected_total",
                   "ldp_consumer_lag_messages", "ldp_estimate_refresh_seconds_bucket",
                   "ldp_estimate_drift_tvd", "ldp_estimate_drift_statistic",
                   "ldp_estimate_drift_statistic_threshold", "ldp_estimate_failing",
                   "ldp_epsilon_per_record"):
        assert metric in exprs, metric
    for name in set(re.findall(r"\b(ldp_[a-z_]+)", exprs)):
        assert not name.endswith("_count") or name.endswith("_total"), name
    assert any(v["name"] == "collection" for v in dash["templating"]["list"])


def test_estimate_panels_follow_the_window_variable_and_alerts_are_annotated():
    """Every query of a per-window metric selects ``window="$window"``; the variable lists the
    collection's windows; the drift panel shows the statistic beside its threshold; firing
    EstimateDrift and EstimateFailing alerts are annotations."""
    dash = json.loads(DASHBOARD.read_text())
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names.index("collection") < names.index("window") < names.index("marginal")
    window = next(v for v in dash["templating"]["list"] if v["name"] == "window")
    assert window["query"]["query"] == 'label_values(ldp_estimate_cell{collection="$collection"}, window)'
    per_window = ("ldp_estimate_cell", "ldp_estimate_error_bound", "ldp_estimate_drift_tvd",
                  "ldp_estimate_drift_statistic", "ldp_estimate_drift_alarm",
                  "ldp_estimate_failing")
    for p in dash["panels"]:
        for t in p["targets"]:
            if any(re.search(rf"\b{m}\b", t["expr"]) for m in per_window):
                assert 'window="$window"' in t["expr"], (p["title"], t["expr"])
    drift = [p for p in dash["panels"]
             if any("ldp_estimate_drift_statistic{" in t["expr"] for t in p["targets"])]
    assert len(drift) == 1
    exprs = [t["expr"] for t in drift[0]["targets"]]
    assert any("ldp_estimate_drift_statistic_threshold{" in e for e in exprs), exprs
    alerts = [a for a in dash["annotations"]["list"] if a.get("expr", "").startswith("ALERTS{")]
    annotated = {re.search(r'alertname="(\w+)"', a["expr"]).group(1) for a in alerts}
    assert annotated == {"EstimateDrift", "EstimateFailing"}
    for a in dash["annotations"]["list"]:
        assert a["datasource"]["uid"] == DS_UID
    assert all('alertstate="firing"' in a["expr"] for a in alerts)


def test_numeric_dashboard_shows_the_mean_with_its_interval_and_the_distribution():
    """dashboards/grafana/dashboards/ldpstream-numeric.json (provisioned beside the main one):
    valid like it; the mean over time with its interval as a shaded band (fill between low and
    high), the quantiles with theirs, the CDF and its band, the W1 bound and the drift statistic
    beside its threshold; every per-window query follows the window variable."""
    dash = json.loads((GRAFANA / "dashboards" / "ldpstream-numeric.json").read_text())
    main = json.loads(DASHBOARD.read_text())
    assert dash["uid"] != main["uid"] and dash["schemaVersion"] >= 36
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names == ["collection", "window", "marginal", "category"]
    for v in dash["templating"]["list"]:
        assert v["datasource"]["uid"] == DS_UID
    exprs = []
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == DS_UID and p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == DS_UID and 'window="$window"' in t["expr"], t
            exprs.append(t["expr"])
    for metric in ("ldp_numeric_mean", "ldp_numeric_mean_low", "ldp_numeric_mean_high",
                   "ldp_numeric_quantile", "ldp_numeric_quantile_low", "ldp_numeric_quantile_high",
                   "ldp_numeric_cdf", "ldp_numeric_cdf_low", "ldp_numeric_cdf_high",
                   "ldp_numeric_w1_bound", "ldp_estimate_drift_statistic",
                   "ldp_estimate_drift_statistic_threshold"):
        assert any(re.search(rf"\b{metric}\{{", e) for e in exprs), metric
    mean = next(p for p in dash["panels"] if any("ldp_numeric_mean{" in t["expr"]
                                                  for t in p["targets"]))
    fills = [prop["value"] for o in mean["fieldConfig"]["overrides"]
             for prop in o["properties"] if prop["id"] == "custom.fillBelowTo"]
    legends = {t["legendFormat"] for t in mean["targets"]}
    assert mean["type"] == "timeseries" and fills and set(fills) <= legends
