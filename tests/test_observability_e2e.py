"""Dashboards and alerts proven against a real Prometheus (Debian package ``/usr/bin/prometheus``).

An embedded broker and Redis, one ``ldpstream worker`` and one ``ldpstream fleet --drift-at`` run
as child processes; Prometheus scrapes the worker every second and evaluates the production alert
rules every second, with only their clocks shortened (``observability_helpers.
short_hold_rules``: every ``for: <d>`` line → ``for: 5s``, and the ``[1m]`` range of
IngestStalled's rate → ``[15s]``; expressions otherwise unchanged). The test

1. resolves the dashboard's template variables through Prometheus' label values API (as Grafana
   does) and runs every panel target through ``/api/v1/query`` (and ``/api/v1/query_range`` for
   time series panels): every one returns data;
2. checks the calibrated drift alarm stays 0 before the drift (the threshold of each marginal is
   the Šidák quantile for its number of cells at drift_alpha) and that EstimateDrift is not
   pending or firing then, then waits (bounded) for EstimateDrift to fire after the fleet switches
   its population;
3. stops the fleet and waits (bounded) for IngestStalled to fire.

Never skipped: a missing prometheus binary or service fails with the reason.
"""
from __future__ import annotations

import asyncio
import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from conftest import WorkerProcess
from observability_helpers import (
    PrometheusServer,
    interpolate,
    load_dashboard,
    panel_targets,
    prometheus_config,
    resolve_variables,
    short_hold_rules,
)

from ldpstream.estimators.stream.drift import sidak_threshold

pytestmark = pytest.mark.e2e

CID = "obs"
WINDOW = "6s"           # the drift window (bucket_s 1: six 1 s buckets against the six before)
ALPHA = 1e-4            # drift_alpha: false-alarm probability per refresh and estimate
DRIFT_AT = 22.0         # fleet seconds before it switches to generator:skewed
RATE = 1500             # fleet reports/s
HOLD = "5s"             # every rule's for: in the test copy of the rules
RANGES = {"1m": "15s"}  # and its 1m range selectors (IngestStalled's rate): a 4x faster clock
DRIFT_FIRE_BOUND_S = 90.0
STALL_FIRE_BOUND_S = 60.0   # IngestStalled: rate(...[15s]) must reach 0, then the 5s hold


def _write_config(path) -> str:
    doc = {"ingest": {"batch_reports": 5000, "batch_seconds": 0.25},
           "collections": [{
               "id": CID, "schema": {"csv": {"columns": ["sex", "race", "Salary"]}},
               "mechanism": "rr-ind", "epsilon": 4, "epsilon_scope": "attribute",
               "partitions": 2, "marginals": [["sex", "Salary"], ["race", "sex"]],
               "estimators": ["castell", "truncated"], "refresh_interval_s": 1,
               "bucket_s": 1, "windows": [WINDOW, "all"], "drift_alpha": ALPHA,
               "expect_traffic": True, "version": 0}]}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


async def _send_bad_messages(bootstrap: str, topic: str, mech) -> None:
    """A few rejects for the rejects panel: undecodable bytes and a batch stamped with an unknown
    config version (both counted under collection=CID, the collection of their topic)."""
    from aiokafka import AIOKafkaProducer

    from ldpstream.producers.codec import encode_batch

    rng = np.random.default_rng(11)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for _ in range(3):
            await producer.send_and_wait(topic, rng.bytes(64), partition=0)
        reports = mech.randomize(np.zeros((4, 3), np.uint8), rng)
        await producer.send_and_wait(topic, encode_batch(CID, 99, reports), partition=1)
    finally:
        await producer.stop()


def _max_value(result) -> float:
    vals = [float(v) for s in result for _, v in s.get("values", [s.get("value", (0, "nan"))])]
    vals = [v for v in vals if math.isfinite(v)]
    return max(vals) if vals else float("nan")


def _kill_group(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_dashboards_and_alerts_against_real_prometheus(tmp_path):
    from ldpstream.config import load_config
    from ldpstream.dev.broker import EmbeddedBroker
    from ldpstream.dev.process import free_port
    from ldpstream.dev.redis import EmbeddedRedis

    t_start = time.monotonic()
    cfg_path = _write_config(tmp_path / "obs.yaml")
    coll = load_config(cfg_path).collections[CID]
    rules = tmp_path / "ldpstream.rules.yml"
    rules.write_text(short_hold_rules(hold=HOLD, ranges=RANGES))
    web_port = free_port()
    prom = PrometheusServer(tmp_path, prometheus_config([f"127.0.0.1:{web_port}"], rules.name),
                            free_port())
    broker, redis = EmbeddedBroker(), EmbeddedRedis(data_dir=str(tmp_path / "redis"))
    worker = fleet = None
    fleet_log = tmp_path / "fleet.log"
    timings: dict[str, float] = {}
    try:
        broker.start()
        redis.start()
        prom.start()
        env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, REDIS_URL=redis.url,
                   LDP_SESSION_TIMEOUT_S="3", LDP_WEB_BIND="127.0.0.1")
        worker = WorkerProcess(cfg_path, env, str(tmp_path / "worker.log"), web_port=web_port)
        worker.wait_ready(60)
        timings["worker_ready"] = time.monotonic() - t_start

        with open(fleet_log, "wb") as log:
            fleet_t0 = time.time()
            fleet = subprocess.Popen(
                [sys.executable, "-m", "ldpstream.cli", "fleet", "--config", cfg_path,
                 "--rate", str(RATE), "--devices", "200", "--batch", "250", "--seed", "5",
                 "--drift-at", str(DRIFT_AT), "--drift-to", "generator:skewed,seed=2"],
                env=dict(env, LDP_LOG_LEVEL="INFO"), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
        asyncio.run(_send_bad_messages(broker.bootstrap, coll.topic, coll.mechanism()))

        # the worker is scraped and its drift gauges exist (needs two windows of history); the
        # threshold is the Šidák quantile for the marginal's cells (sex|Salary 4, race|sex 10)
        sel = f'collection="{CID}"'
        prom.wait_series(f"ldp_estimate_drift_statistic{{{sel}}}", timeout=DRIFT_AT - 2)
        up = prom.query('up{job="ldpstream-workers"}')
        assert [s["value"][1] for s in up] == ["1"], up
        thresholds = {s["metric"]["marginal"]: float(s["value"][1]) for s in prom.query(
            f'ldp_estimate_drift_statistic_threshold{{{sel},window="{WINDOW}"}}')}
        assert thresholds == {"sex|Salary": pytest.approx(sidak_threshold(4, ALPHA)),
                              "race|sex": pytest.approx(sidak_threshold(10, ALPHA))}, thresholds

        # every dashboard panel query returns data through Prometheus' HTTP API
        dash = load_dashboard()
        values = resolve_variables(dash, prom, fixed={"collection": CID, "window": WINDOW})
        checked = []
        for panel, target in panel_targets(dash):
            expr = interpolate(target["expr"], values)
            res = prom.query(expr)
            assert res, f"panel {panel['id']} {panel['title']!r} {target['refId']}: no data for {expr}"
            assert any(math.isfinite(float(s["value"][1])) for s in res), (panel["title"], expr, res)
            if not target.get("instant", False):
                now = time.time()
                rng = prom.query_range(expr, now - 10, now, 1)
                assert rng and any(s["values"] for s in rng), (panel["title"], expr)
            checked.append((panel["id"], target["refId"], len(res)))
        n_targets = sum(1 for _ in panel_targets(dash))
        assert len(checked) == n_targets >= 10, checked
        rejected = prom.query(f'sum(ldp_reports_rejected_total{{collection="{CID}"}})')
        assert float(rejected[0]["value"][1]) >= 7, rejected  # 3 undecodable + 4 of version 99
        timings["panels_ok"] = time.monotonic() - t_start

        # naming conventions and low-cardinality labels, as Prometheus stored them
        series = prom.api("series", match='{__name__=~"ldp_.+"}', start=f"{fleet_t0:.0f}")
        allowed = {"__name__", "job", "instance", "collection", "reason", "marginal", "method",
                   "window", "cell", "kind", "le"}
        assert all(set(s) <= allowed for s in series), [s for s in series if set(s) - allowed]
        assert len(series) < 400, len(series)  # 2 marginals x 2 methods x 2 windows, 14 cells
        meta = prom.api("metadata")
        assert "ldp_reports_ingested_total" in meta and "ldp_estimate_drift_tvd" in meta, list(meta)
        for name, (m, *_) in meta.items():
            if name.startswith("ldp_") and m["type"] == "counter":
                assert name.endswith("_total"), name
            if name.startswith("ldp_") and m["type"] == "histogram":
                assert name.endswith("_seconds"), name  # base unit

        # before the drift: the calibrated alarm stays 0 on noise, EstimateDrift is not pending
        # (Prometheus' own ALERTS series records every pending/firing evaluation)
        drift_at_wall = fleet_t0 + DRIFT_AT
        time.sleep(max(0.0, drift_at_wall - 0.5 - time.time()))
        pre = drift_at_wall - 0.5
        alarm_expr = f"max(ldp_estimate_drift_alarm{{{sel}}})"
        assert _max_value(prom.query_range(alarm_expr, fleet_t0, pre)) == 0.0
        drift_expr = (f"max(ldp_estimate_drift_statistic{{{sel}}} "
                      f"/ ldp_estimate_drift_statistic_threshold{{{sel}}})")
        before = _max_value(prom.query_range(drift_expr, fleet_t0, pre))
        assert before < 1.0, f"noise drift statistic at {before:.2f} × its threshold"
        span = int(pre - fleet_t0)
        noisy = prom.query(f'count_over_time(ALERTS{{alertname="EstimateDrift",{sel}}}[{span}s])',
                           at=pre)
        assert noisy == [], f"EstimateDrift pending/firing before the drift: {noisy}"
        assert prom.alert_state("EstimateDrift", collection=CID) is None, prom.alerts()

        deadline = time.time() + 30  # the fleet's clock starts after its imports
        while "population drifted" not in fleet_log.read_text():
            assert time.time() < deadline and fleet.poll() is None, fleet_log.read_text()[-2000:]
            time.sleep(0.2)
        drift_seen = time.time()
        waited = prom.wait_alert("EstimateDrift", DRIFT_FIRE_BOUND_S, collection=CID)
        timings["drift_fired_after_drift_s"] = time.time() - drift_seen
        after = _max_value(prom.query_range(drift_expr, drift_at_wall, time.time()))
        assert after > 1.0, after
        firing = [a for a in prom.alerts() if a["labels"]["alertname"] == "EstimateDrift"
                  and a["state"] == "firing"]
        assert {a["labels"]["collection"] for a in firing} == {CID}
        assert all(a["labels"]["severity"] == "warning" and
                   a["annotations"]["runbook"].startswith("docs/windows.md#estimatedrift")
                   for a in firing)
        assert prom.query(f'ALERTS{{alertname="EstimateDrift",alertstate="firing",{sel}}}')
        assert prom.alert_state("IngestStalled", collection=CID) is None  # the fleet still sends

        # the fleet stops: IngestStalled fires
        _kill_group(fleet, signal.SIGTERM)
        assert fleet.returncode == 0, fleet_log.read_text()[-2000:]
        t_stop = time.monotonic()
        prom.wait_alert("IngestStalled", STALL_FIRE_BOUND_S, collection=CID)
        timings["stall_fired_after_stop_s"] = time.monotonic() - t_stop
        stalled = [a for a in prom.alerts() if a["labels"]["alertname"] == "IngestStalled"
                   and a["state"] == "firing"]
        assert stalled[0]["labels"]["severity"] == "critical"
        assert worker.proc.poll() is None, worker.log_tail()
        timings["total_s"] = time.monotonic() - t_start
        print(f"\nobservability e2e: {len(checked)} panel targets with data {checked}; "
              f"variables {values}; drift statistic / threshold max before {before:.2f} / after "
              f"{after:.2f}; EstimateDrift firing after {waited:.1f}s of waiting; "
              f"timings {({k: round(v, 1) for k, v in timings.items()})}")
    except BaseException:
        for name, text in (("worker", worker.log_tail(30) if worker else ""),
                           ("fleet", fleet_log.read_text()[-3000:] if fleet_log.exists() else ""),
                           ("prometheus", prom.log_tail())):
            print(f"--- {name} log ---\n{text}", file=sys.stderr)
        raise
    finally:
        if fleet is not None:
            _kill_group(fleet)
        if worker is not None:
            worker.kill()
        prom.stop()
        redis.stop()
        broker.stop()


def test_docs_document_every_alert_and_metric():
    """Every alert's runbook link (``docs/<page>.md#anchor``) leads to a heading named after the
    alert in a page that has a table row for the alert with its hold time; every exported metric
    has a table row in docs/dashboards.md or in docs/windows.md (the windows, drift and
    refresh-failure metrics)."""
    from observability_helpers import ROOT, RULES

    from ldpstream.agents.metrics import METRIC_NAMES

    dashboards = (ROOT / "docs" / "dashboards.md").read_text()
    windows = (ROOT / "docs" / "windows.md").read_text()
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    for r in rules:
        page, anchor = re.match(r"(docs/[\w.-]+\.md)#(\w+)", r["annotations"]["runbook"]).groups()
        doc = (ROOT / page).read_text()
        headings = {h.strip().lower() for h in re.findall(r"^#+ (.+)$", doc, re.MULTILINE)}
        assert anchor == r["alert"].lower() and anchor in headings, (r["alert"], page, anchor)
        assert f"| [{r['alert']}](#{anchor}) |" in doc, r["alert"]
        hold = r.get("for", "none")
        row = next(line for line in doc.splitlines() if line.startswith(f"| [{r['alert']}]"))
        assert f"| {hold}" in row, (r["alert"], hold, row)
    for name in METRIC_NAMES:
        assert f"| `{name}` |" in dashboards or f"| `{name}` |" in windows, name
    assert "for: 5s" in dashboards and "docker compose up" in dashboards
