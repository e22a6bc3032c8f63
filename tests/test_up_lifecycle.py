"""``ldpstream up`` and ``fleet`` on a first run with your own data: a custom config feeds every
collection from its own CSV (no drift target is checked unless a drift is asked for), bad
``--data`` and a busy ``--web-port`` are refused before anything starts, and no child process
outlives ``up`` (SIGHUP, SIGKILL), a worker or a fleet whose broker is gone (SIGTERM is honoured
within a bounded grace period)."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
import yaml
from test_embedded_up import _alive, _descendants

pytestmark = pytest.mark.e2e

ROWS = 3000


def _own_data(tmp_path, name: str = "mine") -> tuple[str, str]:
    """A CSV with columns that are not in the bundled Adult, and a config with two collections
    over it (the user's first own setup)."""
    rng = np.random.default_rng(1)
    mode = rng.choice(["car", "bike", "walk"], size=ROWS, p=[0.5, 0.3, 0.2])
    zone = np.where(mode == "car", rng.choice(["a", "b"], size=ROWS, p=[0.8, 0.2]),
                    rng.choice(["a", "b"], size=ROWS))
    hour = rng.choice(["am", "pm"], size=ROWS)
    csv = tmp_path / f"{name}.csv"
    csv.write_text("mode,zone,hour\n" + "\n".join(f"{m},{z},{h}" for m, z, h in zip(mode, zone, hour)))
    schema = {"csv": {"path": csv.name, "columns": ["mode", "zone", "hour"]}}
    common = {"schema": schema, "mechanism": "rr-ind", "epsilon": 2, "estimators": ["castell"],
              "refresh_interval_s": 1.0}
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({"collections": [
        {"id": f"{name}-trips", "marginals": [["mode", "zone"]], **common},
        {"id": f"{name}-hours", "marginals": [["mode", "hour"]], **common}]}))
    return str(cfg), str(csv)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL", "LDP_CONFIG")}


def _get_json(url: str):
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return json.loads(resp.read().decode())
    except Exception:  # noqa: BLE001 - not up yet
        return None


def _up(tmp_path, *args: str) -> tuple[subprocess.Popen, str]:
    log = str(tmp_path / "up.log")
    proc = subprocess.Popen([sys.executable, "-m", "ldpstream.cli", "up", *args], env=_env(),
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    return proc, log


def _wait_gone(pids: set[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.25)
    return [p for p in pids if _alive(p)]


def test_fleet_on_your_own_config_needs_no_drift_target(tmp_path, kafka_broker, capsys):
    """No --drift-at: the default drift target (a generator) is not even looked at; no --data:
    the collection's own CSV is sampled."""
    from ldpstream.cli import main

    cfg, csv = _own_data(tmp_path)
    os.environ["KAFKA_BOOTSTRAP_SERVERS"] = kafka_broker.bootstrap
    try:
        assert main(["fleet", "--config", cfg, "--data", csv, "--total", "200", "--rate", "0",
                     "--collection", "mine-hours"]) == 0
        assert main(["fleet", "--config", cfg, "--total", "200", "--rate", "0"]) == 0
        err = capsys.readouterr().err
        assert err.count("200 reports") == 2 and f"csv:{csv}" in err, err
        # a drift target that cannot feed the collection is refused, naming the option
        assert main(["fleet", "--config", cfg, "--total", "10", "--drift-at", "1",
                     "--drift-to", csv.replace("mine.csv", "nope.csv")]) == 2
        assert "--drift-to:" in capsys.readouterr().err
    finally:
        os.environ.pop("KAFKA_BOOTSTRAP_SERVERS")


def test_up_refuses_bad_data_and_a_busy_port_before_starting_anything(tmp_path, capsys):
    from ldpstream.cli import main
    from ldpstream.dev.process import free_port

    cfg, _ = _own_data(tmp_path)
    t0 = time.monotonic()
    assert main(["up", "--config", cfg, "--data", "generator:nope"]) == 2
    assert "--data:" in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free_port()))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["up", "--config", cfg, "--web-port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--web-port {port}: already in use" in err, err
    # a free port is suggested, with the ways to pass it
    suggested = int(re.search(r"port (\d+) is free", err).group(1))
    assert suggested > port and f"make up ARGS='--web-port {suggested}'" in err, err
    assert time.monotonic() - t0 < 10  # no broker, Redis or worker was started


def test_up_feeds_every_collection_and_a_hangup_stops_every_child(tmp_path):
    from ldpstream.dev.process import free_port

    cfg, _ = _own_data(tmp_path)
    port = free_port()
    proc, log = _up(tmp_path, "--config", cfg, "--web-port", str(port), "--rate", "500",
                    "--devices", "50")
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        counts: dict[str, int] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            seen |= _descendants(proc.pid)
            doc = _get_json(f"http://127.0.0.1:{port}/collections")
            if doc:
                counts = {c["id"]: c["n"] or 0 for c in doc["collections"]}
                if len(counts) == 2 and all(n > 0 for n in counts.values()):
                    break
            time.sleep(0.5)
        text = open(log, errors="replace").read()
        assert counts and all(n > 0 for n in counts.values()), (counts, text)
        seen |= _descendants(proc.pid)
        assert len(seen) >= 3, seen  # broker, Redis, worker
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(60) == 0, open(log, errors="replace").read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = open(log, errors="replace").read()
    assert "fleet mine-trips: sent" in text and "fleet mine-hours: sent" in text, text
    assert not _wait_gone(seen, 5), text


def test_no_child_survives_a_killed_up(tmp_path):
    from ldpstream.agents.app import STOP_GRACE_S
    from ldpstream.dev.process import free_port, port_free

    port = free_port()
    proc, log = _up(tmp_path, "--no-fleet", "--web-port", str(port))
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            seen |= _descendants(proc.pid)
            if _get_json(f"http://127.0.0.1:{port}/collections"):
                break
            time.sleep(0.5)
        seen |= _descendants(proc.pid)
        assert len(seen) >= 3, (seen, open(log, errors="replace").read())
        proc.kill()
        proc.wait()
        left = _wait_gone(seen, STOP_GRACE_S + 10)
    finally:
        for pid in seen:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not left, left
    assert port_free("127.0.0.1", port)  # the web port can be used again


@pytest.fixture
def lonely_broker():
    """A broker of this test alone (it gets stopped under a worker / fleet)."""
    from ldpstream.dev.broker import EmbeddedBroker

    broker = EmbeddedBroker()
    broker.start()
    yield broker
    broker.stop()


def test_worker_stops_promptly_when_its_broker_is_gone(tmp_path, lonely_broker, redis_server):
    from conftest import WorkerProcess, write_config

    from ldpstream.agents.app import STOP_GRACE_S

    cfg = write_config(tmp_path / "w.yaml", "lonely", partitions=1)
    lonely_broker.create_topics({"ldp.reports.lonely": 1, "ldp.dlq": 1, "ldp.config": 1},
                                compacted={"ldp.config"})
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=lonely_broker.bootstrap,
               REDIS_URL=redis_server.url, LDP_SESSION_TIMEOUT_S="3", LDP_WEB_BIND="127.0.0.1",
               LDP_APP_ID=f"lonely-{os.getpid()}")
    worker = WorkerProcess(cfg, env, str(tmp_path / "worker.log"))
    try:
        worker.wait_ready(90)
        lonely_broker.stop()
        time.sleep(1)
        t0 = time.monotonic()
        worker.stop(timeout=STOP_GRACE_S + 20)
        took = time.monotonic() - t0
    finally:
        worker.kill()
    assert took < STOP_GRACE_S + 5, (took, worker.log_tail())


def test_fleet_stops_promptly_when_its_broker_is_gone(tmp_path, lonely_broker):
    from ldpstream.producers.fleet import STOP_GRACE_S

    lonely_broker.create_topics({"ldp.reports.adult": 1, "ldp.config": 1}, compacted={"ldp.config"})
    env = dict(_env(), KAFKA_BOOTSTRAP_SERVERS=lonely_broker.bootstrap)
    log = str(tmp_path / "fleet.log")
    proc = subprocess.Popen([sys.executable, "-m", "ldpstream.cli", "fleet", "--rate", "2000"],
                            env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "reports in" not in open(log, errors="replace").read():
            time.sleep(0.5)
        assert "reports in" in open(log, errors="replace").read()
        lonely_broker.stop()
        time.sleep(2)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = open(log, errors="replace").read()
    assert took < STOP_GRACE_S + 5 and code in (0, 1), (took, code, text[-2000:])


def test_up_exits_non_zero_when_a_fleet_fails(tmp_path):
    """--data passes the up-front check, then disappears before the fleets start: the fleet
    fails, and up says so and exits 1 (it used to print a line and exit 0)."""
    import shutil

    from ldpstream.dev.process import free_port

    cfg, csv = _own_data(tmp_path)
    data = tmp_path / "copy.csv"
    shutil.copy(csv, data)
    proc, log = _up(tmp_path, "--config", cfg, "--data", str(data), "--web-port", str(free_port()))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "embedded Kafka broker" not in open(log).read():
            time.sleep(0.05)
        data.unlink()  # checked already; the fleets open it again when they start
        code = proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = open(log, errors="replace").read()
    assert code == 1, text
    assert "failed" in text and "copy.csv" in text and "stopped after a failure" in text, text
