"""Alerts without Docker (docs/dashboards.md "Alerts without Docker"): ``ldpstream up --obs``
starts Prometheus and Alertmanager (Debian packages) as children with the project's rules
(scraping the worker and, with ``--mqtt``, the MQTT bridge); a
forged record on ldp.config makes the real worker count it, the real Prometheus evaluate
ConfigForgery and send it to the real Alertmanager, and the worker's ``/ui/alerts``, the live page
(headless Chromium) and ``ldpstream estimates`` name it; Ctrl-C stops them all."""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from test_page_browser import browser, field, shot, wait  # noqa: F401 - browser: a fixture

pytestmark = [pytest.mark.e2e, pytest.mark.slow,
              pytest.mark.skipif(not (shutil.which("prometheus")
                                      and shutil.which("prometheus-alertmanager")),
                                 reason="needs the Debian packages prometheus and "
                                        "prometheus-alertmanager (make install)")]


def _json(url: str):
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _forge(bootstrap: str) -> None:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:  # a state nobody signed: workers and devices refuse it ("unsigned")
            await producer.send_and_wait("ldp.config", json.dumps(
                {"collection": "adult", "version": 99, "mechanism": "rr-ind"}).encode(),
                key=b"adult")
        finally:
            await producer.stop()

    asyncio.run(run())


def test_up_obs_shows_a_firing_alert(tmp_path, browser):  # noqa: F811 - the fixture
    from ldpstream.dev.process import free_port

    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL")}
    log = tmp_path / "up.log"
    proc = subprocess.Popen([sys.executable, "-m", "ldpstream.cli", "up", "--obs", "--mqtt", "--no-fleet",
                             "--duration", "300", "--web-port", str(free_port())], env=env,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        text = ""
        while time.monotonic() < deadline and "Ctrl-C stops everything" not in text:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.5)
            text = log.read_text(errors="replace")
        prom = re.search(r"alerts:\s+Prometheus (http://\S+)/alerts\s+Alertmanager (http://\S+)",
                         text)
        assert prom, text
        prometheus, alertmanager = prom.groups()
        web = re.search(r"page:\s+(http://\S+?)/\s", text).group(1)
        bootstrap = re.search(r"embedded Kafka broker \(Tansu\): (\S+)", text).group(1)
        # the project's rules are loaded, the worker is scraped
        groups = _json(f"{prometheus}/api/v1/rules")["data"]["groups"]
        names = {r["name"] for g in groups for r in g["rules"]}
        assert {"ConfigForgery", "EstimateDrift", "WorkerDown"} <= names
        deadline = time.monotonic() + 90  # the worker answers once it has joined its group
        while True:
            try:
                first = _json(f"{web}/ui/alerts")
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(1)
        assert first == {"prometheus": prometheus, "alerts": []}
        # Prometheus has seen the counter at 0, so the forgery is an increase it can tell
        query = (f"{prometheus}/api/v1/query?query=" +
                 urllib.parse.quote('ldp_config_records_refused_total{reason="unsigned"}'))
        deadline = time.monotonic() + 60
        while not _json(query)["data"]["result"]:
            assert time.monotonic() < deadline, "Prometheus never scraped the worker"
            time.sleep(1)
        # with --mqtt the bridge is scraped too (its refusal and backlog metrics)
        deadline = time.monotonic() + 60
        bridge: list = []
        while time.monotonic() < deadline and not bridge:
            bridge = [t for t in _json(f"{prometheus}/api/v1/targets")["data"]["activeTargets"]
                      if t["labels"]["job"] == "ldpstream-mqtt-bridge" and t["health"] == "up"]
            time.sleep(1)
        assert bridge, _json(f"{prometheus}/api/v1/targets")
        _forge(bootstrap)
        deadline = time.monotonic() + 120
        firing: list = []
        while time.monotonic() < deadline:
            firing = [a for a in _json(f"{web}/ui/alerts")["alerts"] if a["name"] == "ConfigForgery"]
            if firing:
                break
            time.sleep(1)
        assert firing and firing[0]["severity"] == "critical", _json(f"{prometheus}/api/v1/alerts")
        assert "forged mechanism state" in firing[0]["summary"]
        # Prometheus sent it on to Alertmanager
        deadline = time.monotonic() + 60
        held: list = []
        while time.monotonic() < deadline and not held:
            held = [a for a in _json(f"{alertmanager}/api/v2/alerts")
                    if a["labels"].get("alertname") == "ConfigForgery"]
            time.sleep(1)
        assert held
        # the live page lists it at the top, with its runbook
        browser.get(f"{web}/?poll=400")
        wait(lambda: browser.find_elements("css selector", '#alerts li[data-alert="ConfigForgery"]'),
             30, "the firing alert on the page")
        assert browser.find_element("id", "alerts").is_displayed()
        shown = field(browser, '#alerts li[data-alert="ConfigForgery"]')
        assert "critical" in shown and "forged mechanism state" in shown and "Runbook" in shown
        shot(browser, "7-firing-alert")
        cli = subprocess.run([sys.executable, "-m", "ldpstream.cli", "estimates", "--url", web],
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        assert "alert firing: ConfigForgery (critical)" in cli.stdout, cli.stdout
    finally:
        if proc.poll() is None:
            proc.send_signal(2)
        proc.wait(90)
    assert proc.returncode == 0, log.read_text()
    for url in (prometheus, alertmanager):  # gone with up
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{url}/-/ready", timeout=2)
