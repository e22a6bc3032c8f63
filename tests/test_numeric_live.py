"""A numeric collection live (docs/numeric.md "Live"), end to end: a real worker, the embedded
broker and Redis, reports randomized with the family's own ``randomize``.

One population (battery ~ 100·Beta(5, 2), firmware a/b/c) reports with Kafka record times 62 s
ago, then another (100·Beta(2, 5)) now. ``GET /estimates`` serves each estimate's summary — the
mean with its interval and mechanism, the CDF with its band, median/p90/p99 with bounds, the W1
bound, per firmware — and the ε computed from the channels; the 1m window's drift alarm names
the mean that moved and the quantiles; Prometheus has the numeric gauges and none of the input
grid's 1,025 cells; every error is JSON. Then the live page in headless Chromium shows the CDF
with its band, the quantiles and the mean over time with its interval, with the API's numbers."""
from __future__ import annotations

import asyncio
import os
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import yaml
from conftest import WorkerProcess, api_json
from test_page_browser import browser, field, fresh, shot, wait  # noqa: F401 - the fixture
from test_windows_e2e import publish

pytestmark = pytest.mark.e2e

N = 20_000          # reports per population
PER_MESSAGE = 5_000
RANGE = (0.0, 100.0)


def population(n: int, rng: np.random.Generator, later: bool) -> np.ndarray:
    """(firmware index, battery) rows; battery ~ 100·Beta(5, 2), later 100·Beta(2, 5)."""
    a, b = (2, 5) if later else (5, 2)
    return np.stack([rng.integers(0, 3, n), 100 * rng.beta(a, b, n)], axis=1)


@pytest.fixture(scope="module")
def numeric_stack(tmp_path_factory, kafka_broker, redis_server):
    """A worker serving a numeric collection, both populations counted and refreshed."""
    from ldpstream.config import load_config

    tmp = tmp_path_factory.mktemp("numeric-live")
    cid = f"numlive-{os.getpid()}"
    cfg = tmp / "numeric.yaml"
    cfg.write_text(yaml.safe_dump({"collections": [{
        "id": cid, "schema": {"attributes": {
            "fw": ["a", "b", "c"], "battery": {"numeric": {"min": RANGE[0], "max": RANGE[1]}}}},
        "mechanism": "sw-hm", "epsilon": 2.0, "partitions": 1,
        "marginals": [["battery"], ["fw", "battery"]], "estimators": ["distribution", "mean"],
        "windows": ["1m", "all"], "bucket_s": 1, "refresh_interval_s": 1.0,
        "drift_alpha": 0.001}]}, sort_keys=False))
    coll = load_config(str(cfg)).collections[cid]
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_broker.bootstrap,
               REDIS_URL=redis_server.url, LDP_SESSION_TIMEOUT_S="3", LDP_WEB_BIND="127.0.0.1",
               LDP_APP_ID=f"ldp-{cid}")
    worker = WorkerProcess(str(cfg), env, str(tmp / "worker.log"))
    rng = np.random.default_rng(33)
    mech = coll.mechanism()
    try:
        worker.wait_ready(90)
        values = {}
        for later, ago_s in ((False, 62), (True, 0)):   # the 1m window before, and now
            vals = population(N, rng, later)
            idx, clipped = mech.encode(vals)
            assert clipped == {"battery": 0}
            values[later] = (idx, vals)
            stamps = np.full(N // PER_MESSAGE, time.time() * 1000 - ago_s * 1000)
            asyncio.run(publish(kafka_broker.bootstrap, coll, idx, stamps, rng))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:   # both populations in the all-time estimates
            status, est = api_json(worker.url, f"/estimates/{cid}?attrs=fw,battery&method=mean"
                                          f"&window=all")
            if status == 200 and est["n"] == 2 * N:
                break
            time.sleep(0.3)
        else:
            raise AssertionError(f"not refreshed: {est}\n{worker.log_tail()}")
        yield {"worker": worker, "cid": cid, "mech": mech, "values": values}
    finally:
        worker.stop()


def on_grid(mech, idx: np.ndarray) -> np.ndarray:
    """The battery values as counted: the grid points the devices put them on."""
    lo, hi = RANGE
    return lo + idx[:, 1] / (mech.domain.shape[1] - 1) * (hi - lo)


def test_estimates_metrics_drift_and_errors_of_a_numeric_collection(numeric_stack):
    worker, cid, mech = numeric_stack["worker"], numeric_stack["cid"], numeric_stack["mech"]
    url = worker.url
    early = on_grid(mech, numeric_stack["values"][False][0])
    late = on_grid(mech, numeric_stack["values"][True][0])
    both = np.concatenate([early, late])

    status, info = api_json(url, f"/collections/{cid}")
    assert status == 200 and info["mechanism"] == "sw-hm"
    # the ε it cost: computed from the channels (two attributes at ε = 2 each)
    assert info["epsilon_per_record"] == pytest.approx(mech.epsilon, rel=1e-12)
    assert info["epsilon_per_record"] == pytest.approx(4.0, rel=1e-9)

    # the mean with its interval and mechanism (all time: both populations)
    status, est = api_json(url, f"/estimates/{cid}?attrs=battery&method=mean&window=all")
    assert status == 200, est
    m = est["numeric"]["mean"]
    assert est["numeric"]["attribute"] == "battery" and est["numeric"]["level"] == 0.95
    assert m["mechanism"] == mech.mean_mechs[1] == "points"
    assert m["low"] < both.mean() < m["high"], (m, both.mean())
    assert m["high"] - m["low"] < 3.0
    assert est["epsilon_per_record"] == pytest.approx(mech.epsilon, rel=1e-12)

    # the distribution: CDF with its band, quantiles with bounds, histogram, W1 bound
    status, est = api_json(url, f"/estimates/{cid}?attrs=battery&method=distribution&window=all")
    assert status == 200, est
    num = est["numeric"]
    cdf = num["cdf"]
    assert len(cdf["at"]) == len(cdf["value"]) == len(cdf["low"]) == len(cdf["high"]) >= 17
    assert cdf["at"][0] == RANGE[0] and cdf["at"][-1] == RANGE[1]
    assert all(0 <= lo <= hi <= 1 for lo, hi in zip(cdf["low"], cdf["high"]))
    assert cdf["value"][0] == 0 and cdf["value"][-1] == pytest.approx(1)
    assert all(b >= a - 1e-12 for a, b in zip(cdf["value"], cdf["value"][1:]))   # a CDF
    assert abs(sum(num["histogram"]["mass"]) - 1) < 1e-9
    assert num["histogram"]["bins"] == len(num["histogram"]["mass"])
    for p, q in num["quantiles"].items():
        truth = float(np.quantile(both, float(p)))
        assert q["low"] <= q["value"] <= q["high"], (p, q)
        # the 95 % interval widened by half its width each side (≈ 4σ: a chance miss is about
        # 1 in 10,000; its coverage is measured in tests/test_numeric.py)
        slack = (q["high"] - q["low"]) / 2
        assert q["low"] - slack <= truth <= q["high"] + slack, (p, q, truth)
    assert set(num["quantiles"]) == {"0.5", "0.9", "0.99"}
    assert 0 < num["w1_bound"] < 10 and num["w1_bound_coverage"] == "at least"

    # per category: a mean with its interval for each firmware
    status, est = api_json(url, f"/estimates/{cid}?attrs=battery,fw&method=mean&window=all")
    assert status == 200, est
    cats = est["numeric"]["categories"]
    assert [c["category"] for c in cats] == ["a", "b", "c"] and est["numeric"]["by"] == "fw"
    fw = np.concatenate([numeric_stack["values"][k][0][:, 0] for k in (False, True)])
    for i, c in enumerate(cats):   # (the intervals' coverage is measured in test_numeric.py)
        half = (c["mean"]["high"] - c["mean"]["low"]) / 2
        assert c["mean"]["low"] < c["mean"]["value"] < c["mean"]["high"]
        assert abs(c["mean"]["value"] - both[fw == i].mean()) < 2 * half, c
        assert abs(c["share"] - 1 / 3) < 0.05
    # per category: the distribution's quantiles and W1 bound, also on Prometheus
    status, est = api_json(url, f"/estimates/{cid}?attrs=fw,battery&method=distribution&window=all")
    assert status == 200, est
    w1 = {c["category"]: c["w1_bound"] for c in est["numeric"]["categories"]}
    assert all(0 < v < RANGE[1] - RANGE[0] for v in w1.values()), w1
    assert {c["w1_bound_coverage"] for c in est["numeric"]["categories"]} == {"at least"}

    # the 1m window holds the later population; its drift alarm names the mean that moved
    status, est = api_json(url, f"/estimates/{cid}?attrs=battery&method=mean&window=1m")
    assert status == 200, est
    assert est["numeric"]["mean"]["low"] < late.mean() < est["numeric"]["mean"]["high"]
    assert est["drift_alarm"] and est["drift_statistic"] > est["drift_threshold"]
    (moved,) = est["drift_detail"]
    assert moved["quantity"] == "mean" and abs(moved["previous"] - early.mean()) < 2
    assert abs(moved["current"] - late.mean()) < 2
    status, est = api_json(url, f"/estimates/{cid}?attrs=battery&method=distribution&window=1m")
    assert est["drift_alarm"]
    assert {q["quantity"] for q in est["drift_detail"]} == {"0.5", "0.9", "0.99"}
    assert max(q["z"] for q in est["drift_detail"]) == est["drift_statistic"]
    status, est = api_json(url, f"/estimates/{cid}?attrs=fw,battery&method=mean&window=1m")
    assert est["drift_alarm"]
    assert {q["category"] for q in est["drift_detail"] if q["z"] > est["drift_threshold"]} \
        == {"a", "b", "c"}
    status, est = api_json(url, f"/estimates/{cid}?attrs=battery&method=mean&window=all")
    assert est["drift_statistic"] is None and not est["drift_alarm"]   # nothing before "all"

    # Prometheus: the summaries, never the grid's cells
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert len(text) < 300_000
    cells = [line for line in text.splitlines() if line.startswith("ldp_estimate_cell{")]
    assert not [line for line in cells if f'collection="{cid}"' in line]
    status, est = api_json(url, f"/estimates/{cid}?attrs=battery&method=mean&window=all")
    mean_line = next(line for line in text.splitlines() if line.startswith("ldp_numeric_mean{")
                     and f'collection="{cid}"' in line and 'marginal="battery"' in line
                     and 'method="mean"' in line and 'window="all"' in line)
    assert float(mean_line.rsplit(" ", 1)[1]) == pytest.approx(est["numeric"]["mean"]["value"])
    for name in ("ldp_numeric_mean_low", "ldp_numeric_mean_high", "ldp_numeric_quantile",
                 "ldp_numeric_quantile_low", "ldp_numeric_w1_bound", "ldp_numeric_cdf"):
        assert any(line.startswith(name + "{") and f'collection="{cid}"' in line
                   for line in text.splitlines()), name
    assert any(line.startswith("ldp_numeric_mean_low{") and 'category="b"' in line
               for line in text.splitlines())
    assert any(line.startswith("ldp_numeric_w1_bound{") and 'category="b"' in line
               and 'marginal="fw|battery"' in line for line in text.splitlines())

    # every error is JSON, naming what is wrong
    for path, code, words in (
            (f"/estimates/{cid}?attrs=fw&method=mean", 400, "categorical"),
            (f"/estimates/{cid}?attrs=battery&method=castell", 404, "not configured"),
            (f"/estimates/{cid}?attrs=battery&window=1h", 404, "window '1h'"),
            (f"/estimates/{cid}?attrs=temp", 404, "not in the schema"),
            (f"/estimates/{cid}?attrs=battery&raw=2", 400, "raw"),
            (f"/ui/history/{cid}?attrs=fw&method=mean", 400, "categorical")):
        status, body = api_json(url, path)
        assert status == code and words in body["error"], (path, status, body)
    # a sub-marginal of a by-category estimate keeps its cells, says why it has no summary
    status, est = api_json(url, f"/estimates/{cid}?attrs=fw&method=distribution&window=all")
    assert status == 200 and "numeric" not in est and est["marginalized_from"] == ["fw", "battery"]
    assert any("per-category" in w for w in est["warnings"])


def test_the_page_shows_a_numeric_distribution_and_the_mean_over_time(numeric_stack, browser):  # noqa: F811
    worker, cid = numeric_stack["worker"], numeric_stack["cid"]
    browser.get(f"{worker.url}/?poll=400#c={cid}&m=battery&e=distribution&w=1m")
    wait(lambda: browser.find_elements("css selector", "#estimate-chart g.quantile"), 30,
         "the quantile marks of the CDF")
    status, est = api_json(worker.url, f"/estimates/{cid}?attrs=battery&method=distribution&window=1m")

    def table() -> dict[str, float]:
        return fresh(lambda: {r.get_attribute("data-cell"): float(r.get_attribute("data-value"))
                              for r in browser.find_elements("css selector",
                                                             "#estimate-table tbody tr")})

    def same_as_api() -> bool:
        nonlocal est
        status, est = api_json(worker.url,
                          f"/estimates/{cid}?attrs=battery&method=distribution&window=1m")
        rows = table()
        return all(rows.get(p) == q["value"] for p, q in est["numeric"]["quantiles"].items())
    wait(same_as_api, 30, "the page's quantiles equal the API's")
    assert table()["w1_bound"] == est["numeric"]["w1_bound"]
    assert browser.find_elements("css selector", '#estimate-chart path[data-band="cdf"]')
    assert len(browser.find_elements("css selector", "#estimate-chart g.histogram rect")) == \
        est["numeric"]["histogram"]["bins"]
    assert not browser.find_element("id", "cells").is_displayed()   # no grid cells to follow
    wait(lambda: "median" in field(browser, "#drift-state"), 30,
         "the drift alarm naming the median")
    assert "alarm" in (browser.find_element("id", "drift-state").get_attribute("class") or "")
    shot(browser, "numeric-distribution")

    browser.get(f"{worker.url}/?poll=400#c={cid}&m=battery&e=mean&w=1m")
    wait(lambda: browser.find_elements("css selector", '#estimate-chart g.interval[data-cell="mean"]'),
         30, "the mean with its interval")
    wait(lambda: len(browser.find_elements("css selector", "#history-chart path.band")) >= 1, 30,
         "the mean over time with its interval band (two refreshes)")
    status, est = api_json(worker.url, f"/estimates/{cid}?attrs=battery&method=mean&window=1m")
    # one script reads the three numbers: the page re-renders every poll (400 ms), so an element
    # found by one call may be gone by the next
    low, value, high = browser.execute_script(
        "const m = document.querySelector('#estimate-chart g.interval[data-cell=\"mean\"]');"
        "return [m.dataset.low, m.dataset.value, m.dataset.high];")
    assert float(low) <= float(value) <= float(high)
    assert field(browser, '#summary dd[data-field="mean_mechanism"]') == "points"
    drift = wait(lambda: "mean" in field(browser, "#drift-state") and field(browser, "#drift-state"),
                 30, "the drift alarm naming the mean")
    assert drift.startswith("Drift alarm"), drift
    shot(browser, "numeric-mean")


def test_the_numeric_dashboard_and_the_drift_alert_against_real_prometheus(numeric_stack,
                                                                           tmp_path):
    """Prometheus scrapes the worker with the production rules (holds shortened to 1 s): every
    target of the numeric Grafana dashboard (dashboards/grafana/dashboards/ldpstream-numeric.json,
    its variables resolved as Grafana does) returns data, and EstimateDrift fires for the
    numeric marginal whose mean moved."""
    import math

    from observability_helpers import (
        GRAFANA_DIR,
        PrometheusServer,
        interpolate,
        load_dashboard,
        panel_targets,
        prometheus_config,
        resolve_variables,
        short_hold_rules,
    )

    from ldpstream.dev.process import free_port

    worker, cid = numeric_stack["worker"], numeric_stack["cid"]
    rules = tmp_path / "rules.yml"
    rules.write_text(short_hold_rules(hold="1s"))
    prom = PrometheusServer(tmp_path, prometheus_config([f"127.0.0.1:{worker.web_port}"],
                                                        rules.name), free_port())
    try:
        prom.start()
        prom.wait_alert("EstimateDrift", timeout=15, collection=cid, window="1m",
                        marginal="battery", method="mean")
        dash = load_dashboard(GRAFANA_DIR / "ldpstream-numeric.json")
        values = resolve_variables(dash, prom, fixed={"collection": cid, "window": "1m"})
        assert values["marginal"] == "battery" and values["category"] == "(all)", values
        checked = []
        for panel, target in panel_targets(dash):
            expr = interpolate(target["expr"], values)
            res = prom.query(expr)
            assert res, f"panel {panel['id']} {panel['title']!r} {target['refId']}: no data for {expr}"
            assert any(math.isfinite(float(s["value"][1])) for s in res), (panel["title"], expr)
            checked.append(panel["id"])
        assert len(checked) == sum(1 for _ in panel_targets(dash)) >= 10
        by_category = resolve_variables(dash, prom, fixed={"collection": cid, "window": "1m",
                                                            "marginal": "fw|battery"})
        assert by_category["category"] == "a"
    finally:
        prom.stop()


def test_memoized_numeric_reports_count_each_device_once_with_its_epsilon_per_day(
        tmp_path, kafka_broker, redis_server):
    """A memoized numeric collection (α-point rounding to 16 intervals, daily rotation): 3,000
    devices each send their permanent response 3 times; the worker counts each device once (its
    latest report), the mean's interval covers the devices' mean, and the ε a device spends per
    day is stated, computed from the channels: 2 per rotation period (ε = 1 per attribute), 4
    per day (a day meets two periods)."""
    from aiokafka import AIOKafkaProducer

    from ldpstream.config import load_config
    from ldpstream.producers.codec import encode_batch

    cid = f"nummemo-{os.getpid()}"
    cfg = tmp_path / "memo.yaml"
    cfg.write_text(yaml.safe_dump({"collections": [{
        "id": cid, "schema": {"attributes": {
            "fw": ["a", "b", "c"], "battery": {"numeric": {"min": RANGE[0], "max": RANGE[1]}}}},
        "mechanism": "sw-hm", "epsilon": 1.0, "partitions": 1,
        "params": {"memoize": {"rotation_s": 86400}, "alpha_points": 16},
        "marginals": [["battery"]], "estimators": ["mean"], "windows": ["all"],
        "refresh_interval_s": 0.5}]}, sort_keys=False))
    coll = load_config(str(cfg)).collections[cid]
    mech = coll.mechanism()
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_broker.bootstrap,
               REDIS_URL=redis_server.url, LDP_SESSION_TIMEOUT_S="3", LDP_WEB_BIND="127.0.0.1",
               LDP_APP_ID=f"ldp-{cid}")
    worker = WorkerProcess(str(cfg), env, str(tmp_path / "worker.log"))
    devices = 3_000
    rng = np.random.default_rng(12)
    ids = np.arange(1, devices + 1, dtype=np.uint64)
    idx, _ = mech.encode(population(devices, rng, later=False))
    perm = mech.memoization().responses(idx, ids, 0, rng)   # each device's permanent response

    async def send() -> None:
        pub = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
        await pub.start()
        try:
            futs = [await pub.send(coll.topic, encode_batch(cid, mech.version, perm[s:s + 500],
                                                            device_ids=ids[s:s + 500]))
                    for _ in range(3) for s in range(0, devices, 500)]
            await asyncio.gather(*futs)
        finally:
            await pub.stop()
    try:
        worker.wait_ready(90)
        status, info = api_json(worker.url, f"/collections/{cid}")
        assert info["longitudinal"]["memoized"] and info["over_time"]["counted_by"] == "device"
        assert info["epsilon_per_record"] == pytest.approx(mech.epsilon) == pytest.approx(2.0)
        assert info["epsilon_per_day"] == pytest.approx(2 * info["epsilon_per_record"])
        asyncio.run(send())
        deadline = time.monotonic() + 30
        while api_json(worker.url, f"/collections/{cid}")[1]["n"] < 3 * devices:   # reports taken
            assert time.monotonic() < deadline, worker.log_tail()
            time.sleep(0.2)
        taken = time.time()
        est: dict = {}
        while time.monotonic() < deadline:   # a refresh after the last report was counted
            status, est = api_json(worker.url, f"/estimates/{cid}?attrs=battery&method=mean")
            if status == 200 and est["updated_at"] > taken:
                break
            time.sleep(0.2)
        # each device once, at its latest report: those whose permanent response is a mean cell
        assert est["n"] == int((perm[:, 1] < mech.mean_cells(1)).sum()), est["n"]
        m = est["numeric"]["mean"]
        truth = on_grid(mech, idx).mean()
        assert m["low"] < truth < m["high"], (m, truth)
        assert m["reports"] == est["n"] and est["epsilon_per_day"] == pytest.approx(4.0)
    finally:
        worker.stop()
