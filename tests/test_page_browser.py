"""The live page (agents/serve/ui.py, agents/serve/static/) in a real browser: Debian's headless Chromium
driven by Selenium, against a real worker with the embedded broker and Redis.

Before any report the page says there is no estimate yet; once a population reports, the numbers
on the page equal the API's (exactly: the table's data-value and the 4-digit text); more reports
show up without a reload; a changed population raises a drift alarm that the page marks, with
its threshold drawn; every cell carries the API's 95 % interval, and error_bound is named as the
API names it; the history's axis stays on [0, 1] with no repeated time label. Every
step leaves a screenshot in ``test-artifacts/page/`` (or ``$LDP_TEST_ARTIFACTS``)."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np
import pytest
import yaml
from conftest import WorkerProcess
from test_windows_e2e import ATTRS, population, publish

T = TypeVar("T")

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: without these Chromium tries to reach Google's hosts and hangs on the closed network
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--window-size=1280,2200")
ARTIFACTS = Path(os.environ.get("LDP_TEST_ARTIFACTS")
                 or Path(__file__).resolve().parents[1] / "test-artifacts") / "page"
PER_MESSAGE = 5_000


def api(url: str, path: str) -> dict:
    with urllib.request.urlopen(url + path, timeout=10) as resp:
        return json.loads(resp.read())


def wait(cond, timeout: float, what: str, every: float = 0.25):
    """``cond()`` until it is truthy (returned), else an AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = cond()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - the page is between two renders
            last = exc
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout}s (last: {last!r})")


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for exe in (CHROMIUM, CHROMEDRIVER):
        if not os.access(exe, os.X_OK):
            pytest.fail(f"{exe} missing: scripts/bootstrap.sh installs Debian's chromium and "
                        f"chromium-driver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="ldp-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def shot(driver, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    return path


def page_table(driver) -> dict[str, tuple[float, str]]:
    """The estimate table on the page: cell → (data-value, shown text)."""
    def read() -> dict[str, tuple[float, str]]:
        rows = driver.find_elements("css selector", "#estimate-table tbody tr")
        return {r.get_attribute("data-cell"): (float(r.get_attribute("data-value")),
                                               r.find_elements("css selector", "td.num")[0]
                                               .get_attribute("textContent")) for r in rows}
    return fresh(read)


def fresh(read: Callable[[], T]) -> T:
    """``read()``, done again if the page re-rendered what it reads between a lookup and a read
    (every poll replaces the tables and the chart)."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(5):
        try:
            return read()
        except StaleElementReferenceException:
            time.sleep(0.05)
    return read()


def field(driver, selector: str) -> str:
    """The text of the element at ``selector``."""
    return fresh(lambda: driver.find_element("css selector", selector)
                 .get_attribute("textContent"))


def start_worker(tmp_path, cid: str, collection: dict, bootstrap: str, redis_url: str):
    """A worker child serving one collection over ATTRS (``collection``: its other fields)."""
    from ldpstream.config import load_config

    cfg = tmp_path / f"{cid}.yaml"
    cfg.write_text(yaml.safe_dump({"collections": [{
        "id": cid, "schema": {"attributes": ATTRS}, "mechanism": "rr-ind", "epsilon": 2.0,
        "refresh_interval_s": 1.0, "bucket_s": 1, **collection}]}, sort_keys=False))
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=bootstrap, REDIS_URL=redis_url,
               LDP_SESSION_TIMEOUT_S="3", LDP_WEB_BIND="127.0.0.1", LDP_APP_ID=f"ldp-{cid}")
    worker = WorkerProcess(str(cfg), env, str(tmp_path / f"{cid}.log"))
    return worker, load_config(str(cfg)).collections[cid]


def test_the_page_shows_the_api_live_and_marks_drift(tmp_path, kafka_broker, redis_server,
                                                      browser):
    from selenium.webdriver.common.keys import Keys

    cid = f"page-{os.getpid()}"
    worker, coll = start_worker(tmp_path, cid, {
        "partitions": 2, "marginals": [["sex", "income"], ["sex", "income", "region"]],
        "estimators": ["castell", "truncated"], "windows": ["all", "30s"], "drift_alpha": 0.001},
        kafka_broker.bootstrap, redis_server.url)
    rng = np.random.default_rng(11)

    def send(n: int, changed: bool, seconds_ago: tuple[float, float]) -> None:
        now_ms = time.time() * 1000
        stamps = np.linspace(now_ms - seconds_ago[0] * 1000, now_ms - seconds_ago[1] * 1000,
                             n // PER_MESSAGE)
        asyncio.run(publish(kafka_broker.bootstrap, coll, population(n, rng, changed), stamps,
                            rng))

    def shown_n() -> int:
        text = field(browser, f'tr[data-collection="{cid}"] td[data-field="n"]')
        return int(text.replace(",", "")) if text.replace(",", "").isdigit() else -1

    try:
        worker.wait_ready(90)
        browser.get(f"{worker.url}/?poll=400#c={cid}&m=sex,income&e=castell&w=all")
        # 1. no report yet: a clear message in place of the chart
        message = wait(lambda: browser.find_element("id", "estimate-message").is_displayed()
                       and field(browser, "#estimate-message"), 30, "the no-estimate message")
        assert "No estimate to show yet" in message, message
        assert shown_n() == 0
        shot(browser, "1-no-estimate")

        # 2. a population reports: the page's numbers are the API's
        send(20_000, False, (50, 35))       # the previous 30 s window
        send(20_000, False, (5, 1))         # the current one
        wait(lambda: shown_n() == 40_000, 60, "n = 40,000 on the page")
        wait(lambda: field(browser, '#summary dd[data-field="n"]') == "40,000", 30,
             "the all-time estimate of all 40,000 reports")
        est = api(worker.url, f"/estimates/{cid}?attrs=sex,income&method=castell&window=all")
        info = api(worker.url, f"/collections/{cid}")
        table = page_table(browser)
        flat = {f"{a}|{b}": est["cells"][i][j] for i, a in enumerate(est["labels"][0])
                for j, b in enumerate(est["labels"][1])}
        assert set(table) == set(flat)
        for cell, v in flat.items():
            assert table[cell][0] == v, (cell, table[cell], v)   # the same float, to the bit
            assert table[cell][1] == f"{v:.4f}", (cell, table[cell], v)
        heat = fresh(lambda: {g.get_attribute("data-cell"): float(g.get_attribute("data-value"))
                              for g in browser.find_elements("css selector",
                                                             "#estimate-chart g.hcell")})
        assert heat == flat
        shown_bound = field(browser, '#summary dd[data-field="error_bound"]')
        assert shown_bound == f"{est['error_bound']:.4f}", (shown_bound, est["error_bound"])
        # per-cell 95 % intervals, the API's own, in the chart and the table; one meaning for
        # error_bound (the API's: an upper 95 % quantile of the TVD), never "expected"
        lows = fresh(lambda: {g.get_attribute("data-cell"): (float(g.get_attribute("data-low")),
                                                             float(g.get_attribute("data-high")))
                              for g in browser.find_elements("css selector",
                                                             "#estimate-chart g.hcell")})
        want = {f"{a}|{b}": (est["cells_low"][i][j], est["cells_high"][i][j])
                for i, a in enumerate(est["labels"][0]) for j, b in enumerate(est["labels"][1])}
        assert lows == want
        assert len({hi - lo for lo, hi in want.values()}) > 1  # not one ± on every cell
        interval_text = fresh(lambda: [r.find_elements("css selector", "td.num")[1]
                                       .get_attribute("textContent") for r in
                                       browser.find_elements("css selector",
                                                             "#estimate-table tbody tr")])
        assert all(" to " in t for t in interval_text), interval_text
        caption = field(browser, "#estimate-caption")
        assert "95 % interval" in caption and "95 % upper quantile" in caption, caption
        page_text = browser.find_element("tag name", "body").get_attribute("textContent")
        assert "expected total-variation" not in page_text and "expected TVD" not in page_text
        row = f'tr[data-collection="{cid}"]'
        assert float(field(browser, f'{row} td[data-field="epsilon_per_record"]')) == \
            pytest.approx(info["epsilon_per_record"], rel=1e-2)
        assert field(browser, f'{row} td[data-field="version"]') == str(info["version"])
        # what a device spends in the window: unbounded without a declared reporting rate
        assert info["over_time"]["epsilon_per_window"]["all"] is None
        assert field(browser, '#summary dd[data-field="epsilon_per_window"]') == \
            "unbounded (no declared rate)"
        shot(browser, "2-estimate")
        # the history answers only what is new after `since` (what the page polls for)
        path = f"/ui/history/{cid}?attrs=sex,income&method=castell&window=all"
        full = wait(lambda: (lambda pts: pts if len(pts) >= 2 else None)(
            api(worker.url, path)["points"]), 30, "two sampled refreshes")
        assert full[-1]["n"] == 40_000
        newer = api(worker.url, f"{path}&since={full[-2]['updated_at']!r}")["points"]
        assert newer and newer[0] == full[-1]
        with pytest.raises(urllib.error.HTTPError) as bad:
            api(worker.url, f"{path}&since=yesterday")
        assert bad.value.code == 400 and "since" in json.loads(bad.value.read())["error"]

        # 3. more reports arrive: the page follows without a reload
        send(20_000, False, (4, 1))
        wait(lambda: shown_n() == 60_000, 60, "n = 60,000 on the page without a reload")
        assert int(browser.execute_script("return document.body.dataset.polls")) > 3

        # 4. the 30 s window, chosen with the keyboard; then the population changes: an alarm
        win = browser.find_element("id", "window")
        win.send_keys(Keys.END)  # the last option: 30s
        wait(lambda: "30s" in browser.current_url, 10, "window 30s chosen by keyboard")
        wait(lambda: field(browser, "#drift-state").startswith(("No drift:", "Drift alarm")), 30,
             "a drift statistic measured")
        assert browser.find_element("id", "drift-state").get_attribute("data-alarm") != "true"
        send(20_000, False, (45, 35))
        send(40_000, True, (3, 1))
        wait(lambda: browser.find_element("id", "drift-state").get_attribute("data-alarm")
             == "true", 60, "the drift alarm on the page")
        drift = api(worker.url, f"/estimates/{cid}?attrs=sex,income&method=castell&window=30s")
        assert drift["drift_alarm"] and drift["drift_statistic"] > drift["drift_threshold"]
        assert browser.find_elements("css selector", "#drift-chart circle.alarm")
        assert "Drift alarm" in field(browser, "#drift-state")
        # the history follows the three largest cells, with their bands
        assert len(browser.find_elements("css selector", "#history-chart path.line")) == 3
        assert len(browser.find_elements("css selector", "#history-chart path.band")) == 3
        # charts without artefacts: the threshold drawn at the API's value, shares on [0, 1],
        # no x label twice, the right-hand labels apart
        # (read in one script: every poll redraws the charts)
        charts = browser.execute_script("""
            const texts = (sel) => [...document.querySelectorAll(sel)].map((t) => t.textContent);
            const th = document.querySelector("#drift-chart path.threshold");
            return {threshold: th && th.getAttribute("data-threshold"),
                    historyX: texts("#history-chart text.xtick"), driftX: texts("#drift-chart text.xtick"),
                    ticks: [...document.querySelectorAll("#history-chart text.tick")]
                      .filter((t) => !t.classList.contains("xtick")).map((t) => t.textContent),
                    legends: [...document.querySelectorAll("#history-chart text.legend")]
                      .map((t) => Number(t.getAttribute("y")))};""")
        assert float(charts["threshold"]) == pytest.approx(drift["drift_threshold"], rel=0.05)
        for xs in (charts["historyX"], charts["driftX"]):
            assert xs and len(xs) == len(set(xs)), charts
        ticks = [float(t) for t in charts["ticks"] if t.replace(".", "", 1).lstrip("-").isdigit()]
        assert ticks and min(ticks) >= 0 and max(ticks) <= 1, charts
        ys = sorted(charts["legends"])
        assert len(ys) == 3 and all(b - a >= 12 for a, b in zip(ys, ys[1:])), ys
        shot(browser, "3-drift-alarm")

        # 5. three attributes: small multiples, one heatmap per sex
        browser.get(f"{worker.url}/?poll=400#c={cid}&m=sex,income,region&e=truncated&w=all")
        panels = wait(lambda: browser.find_elements("css selector", "#estimate-chart .panel"),
                      30, "small multiples")
        assert len(panels) == len(ATTRS["sex"])
        shot(browser, "4-three-attributes")
        # no script error (the API's 404s before the first estimate are logged as network ones)
        severe = [e for e in browser.get_log("browser")
                  if e["level"] == "SEVERE" and e["source"] != "network"]
        assert not severe, severe
    finally:
        worker.kill()


def test_the_page_shows_a_store_outage_in_place(tmp_path, kafka_broker, fresh_redis, browser):
    """Redis stops under a running worker: the page names the failing check at the top and says
    in place of the estimate why there is none; when Redis is back the estimate returns."""
    cid = f"outage-{os.getpid()}"
    worker, coll = start_worker(tmp_path, cid, {
        "partitions": 1, "marginals": [["sex", "income"]], "estimators": ["castell"],
        "windows": ["all"]}, kafka_broker.bootstrap, fresh_redis.url)
    rng = np.random.default_rng(5)
    try:
        worker.wait_ready(90)
        stamps = np.full(2, time.time() * 1000)
        asyncio.run(publish(kafka_broker.bootstrap, coll, population(10_000, rng, False), stamps,
                            rng))
        browser.get(f"{worker.url}/?poll=400#c={cid}")
        wait(lambda: browser.find_elements("css selector", "#estimate-chart g.hcell"), 60,
             "the estimate drawn")
        fresh_redis.stop()
        problem = wait(lambda: browser.find_element("id", "problem").is_displayed()
                       and field(browser, "#problem"), 30, "the outage named at the top")
        assert "redis" in problem.lower(), problem
        message = wait(lambda: field(browser, "#estimate-message"), 30, "the estimate's failure")
        assert "unavailable" in message and browser.find_element(
            "id", "estimate-message").get_attribute("class").split()[-1] == "failure", message
        assert not browser.find_elements("css selector", "#estimate-chart g.hcell")
        shot(browser, "5-redis-down")
        fresh_redis.start()
        wait(lambda: browser.find_elements("css selector", "#estimate-chart g.hcell"), 60,
             "the estimate back after Redis returned")
        wait(lambda: not browser.find_element("id", "problem").is_displayed(), 30,
             "the outage message gone")
    finally:
        worker.kill()


def test_the_page_marks_a_mechanism_version_change(tmp_path, kafka_broker, redis_server,
                                                    browser):
    """RRBA turns every full block into a new mechanism version (the worker's controller
    decides, the fleet follows): the collections table follows the version and the history
    marks each change where it happened."""
    from ldpstream.config import load_config
    from ldpstream.producers.fleet import run_fleet
    from ldpstream.producers.signing import ENV_SIGNING_KEY, SigningKey

    cid = f"versions-{os.getpid()}"
    cfg = tmp_path / "versions.yaml"
    cfg.write_text(yaml.safe_dump({"collections": [{
        "id": cid, "schema": {"csv": {"columns": ["sex", "race", "Salary"]}},
        "mechanism": "rrba", "params": {"block_size": 400, "p": 0.6}, "epsilon_scope": "record",
        "epsilon": 60.0, "partitions": 2, "marginals": [["sex", "Salary"]],
        "estimators": ["pooled"], "refresh_interval_s": 1, "controller_interval_s": 0.3,
        "windows": ["all"]}], "ingest": {"batch_reports": 500, "batch_seconds": 0.2}}))
    coll = load_config(str(cfg), env={}).collections[cid]
    key = SigningKey.generate()
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_broker.bootstrap,
               REDIS_URL=redis_server.url, LDP_SESSION_TIMEOUT_S="3", LDP_WEB_BIND="127.0.0.1",
               LDP_APP_ID=f"ldp-{cid}", **{ENV_SIGNING_KEY: key.to_text()})
    worker = WorkerProcess(str(cfg), env, str(tmp_path / "versions.log"))
    row = f'tr[data-collection="{cid}"] td[data-field="version"]'
    try:
        worker.wait_ready(90)
        browser.get(f"{worker.url}/?poll=400#c={cid}&m=sex,Salary&e=pooled&w=all")
        wait(lambda: field(browser, row) == "0", 30, "version 0 shown")
        # slowly enough that refreshes (every 1 s) see every version
        stats = asyncio.run(run_fleet(kafka_broker.bootstrap, coll, total=3000, rate=300,
                                      batch=100, seed=3, verify_key=key.verify_key,
                                      config_timeout_s=20))
        assert stats.version >= 2, stats
        info = wait(lambda: (lambda c: c if c["version"] >= 2 else None)(
            api(worker.url, f"/collections/{cid}")), 30, "version 2 or later")
        wait(lambda: field(browser, row) == str(info["version"]), 30, "the version on the page")
        # one script reads every mark's title: the page re-renders every poll (400 ms), so a mark
        # found by one call may be gone by the next
        titles = wait(lambda: browser.execute_script(
            "return Array.from(document.querySelectorAll('#history-chart line.version title'),"
            " t => t.textContent);"), 30, "the version changes marked in the history")
        assert all(t.startswith("mechanism version ") and " → " in t for t in titles), titles
        shot(browser, "6-version-change")
    finally:
        worker.kill()
