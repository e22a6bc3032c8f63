"""Windows on a long history, end to end (real broker, Redis, worker and Prometheus).

A stable population reports for 24 h (1.2M reports, backdated Kafka record timestamps spread over
the last day), then the population changes and 100k reports arrive with current timestamps. The
5m and 1h windows show the change; the all-time estimate barely moves; the 5m window's drift
alarm goes up, and EstimateDrift (the production rule with only its ``for:`` shortened) fires
within two evaluation periods of the alarm. Before the change no window raises an alarm."""
from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import yaml
from conftest import WorkerProcess
from observability_helpers import PrometheusServer, prometheus_config, short_hold_rules

pytestmark = pytest.mark.e2e

ATTRS = {"sex": ["F", "M"], "income": ["low", "high"], "region": ["a", "b", "c"]}
HISTORY = 1_200_000
PER_MESSAGE = 5_000
CHANGE = 100_000
DAY_S = 86_400.0


def population(n: int, rng: np.random.Generator, changed: bool) -> np.ndarray:
    sex = rng.integers(0, 2, n)
    p_high = np.where(sex == 1, 0.9, 0.7) if changed else np.where(sex == 1, 0.4, 0.2)
    income = (rng.random(n) < p_high).astype(np.int64)
    region = rng.choice(3, n, p=[0.5, 0.3, 0.2])
    return np.stack([sex, income, region], axis=1)


def truth(changed: bool) -> np.ndarray:
    """P(sex, income) of a population."""
    p_high = np.array([0.7, 0.9]) if changed else np.array([0.2, 0.4])
    return 0.5 * np.stack([1 - p_high, p_high], axis=1)


async def publish(bootstrap: str, coll, records: np.ndarray, stamps_ms: np.ndarray,
                  rng: np.random.Generator) -> None:
    """Randomize on the 'devices' and publish one batch per stamp (its Kafka record time)."""
    from aiokafka import AIOKafkaProducer

    from ldpstream.producers.codec import encode_batch

    mech = coll.mechanism()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5,
                                max_request_size=4 * 1024 * 1024)
    await producer.start()
    try:
        futs = []
        for i, ts in enumerate(stamps_ms):
            chunk = records[i * PER_MESSAGE:(i + 1) * PER_MESSAGE]
            reports = mech.randomize(chunk, rng)
            futs.append(await producer.send(coll.topic, encode_batch(coll.id, mech.version, reports),
                                            partition=i % coll.partitions, timestamp_ms=int(ts)))
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def estimate(worker: WorkerProcess, cid: str, window: str) -> dict:
    return get(f"{worker.url}/estimates/{cid}?attrs=sex,income&method=castell&window={window}")


def wait_n(worker: WorkerProcess, cid: str, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = get(f"{worker.url}/collections/{cid}")["n"]
        if got is not None and got >= n:
            return
        time.sleep(0.5)
    raise AssertionError(f"only {got} of {n} reports counted:\n{worker.log_tail()}")


def wait_refreshed(worker: WorkerProcess, cid: str, n: int, timeout: float = 60.0) -> None:
    """Until the all-time estimate includes ``n`` reports."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if estimate(worker, cid, "all")["n"] >= n:
                return
        except urllib.error.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"no refreshed estimate with n >= {n}:\n{worker.log_tail()}")


def test_long_history_windows_and_calibrated_drift(tmp_path, kafka_broker, redis_server):
    from ldpstream.config import load_config
    from ldpstream.dev.process import free_port

    cid = f"hist-{os.getpid()}"
    cfg = tmp_path / "hist.yaml"
    cfg.write_text(yaml.safe_dump({"collections": [{
        "id": cid, "schema": {"attributes": ATTRS}, "mechanism": "rr-ind", "epsilon": 2.0,
        "partitions": 2, "marginals": [["sex", "income"], ["income", "region"]],
        "estimators": ["castell", "truncated"], "refresh_interval_s": 1.0, "bucket_s": 60,
        "windows": ["5m", "1h", "24h", "all"], "drift_alpha": 0.001}]}, sort_keys=False))
    coll = load_config(str(cfg)).collections[cid]
    rules = tmp_path / "rules.yml"
    rules.write_text(short_hold_rules(hold="2s"))
    web_port = free_port()
    prom = PrometheusServer(tmp_path, prometheus_config([f"127.0.0.1:{web_port}"], rules.name),
                            free_port())
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_broker.bootstrap,
               REDIS_URL=redis_server.url, LDP_SESSION_TIMEOUT_S="3", LDP_WEB_BIND="127.0.0.1",
               LDP_APP_ID=f"ldp-{cid}")
    rng = np.random.default_rng(8)
    worker = WorkerProcess(str(cfg), env, str(tmp_path / "worker.log"), web_port=web_port)
    try:
        prom.start()
        worker.wait_ready(90)
        now_ms = time.time() * 1000
        k = HISTORY // PER_MESSAGE
        stamps = np.linspace(now_ms - (DAY_S - 120) * 1000, now_ms - 20_000, k)  # inside 24h
        asyncio.run(publish(kafka_broker.bootstrap, coll, population(HISTORY, rng, False),
                            stamps, rng))
        wait_n(worker, cid, HISTORY, timeout=240)
        wait_refreshed(worker, cid, HISTORY)
        time.sleep(3)  # a few refreshes of the stable history
        before = {w: estimate(worker, cid, w) for w in ("5m", "1h", "24h", "all")}
        assert before["all"]["n"] == HISTORY
        assert before["24h"]["n"] == HISTORY                   # every bucket of the day is kept
        assert 0 < before["1h"]["n"] < HISTORY / 20            # about 1/24 of the day
        for w, est in before.items():                          # noise only: no alarm
            assert not est["drift_alarm"], (w, est)
        assert prom.alert_state("EstimateDrift", collection=cid) is None
        # the population changes now
        asyncio.run(publish(kafka_broker.bootstrap, coll, population(CHANGE, rng, True),
                            np.full(CHANGE // PER_MESSAGE, time.time() * 1000), rng))
        t_change = time.monotonic()
        wait_n(worker, cid, HISTORY + CHANGE, timeout=120)
        wait_refreshed(worker, cid, HISTORY + CHANGE)
        after = {w: estimate(worker, cid, w) for w in ("5m", "1h", "24h", "all")}
        new, old = truth(True), truth(False)

        def dist(est: dict, p: np.ndarray) -> float:
            return 0.5 * float(np.abs(np.asarray(est["cells"]) - p).sum())

        assert dist(after["5m"], new) < 0.05                   # the 5m window is the new population
        assert dist(after["1h"], new) < dist(before["1h"], new) - 0.3  # 1h moved most of the way
        assert dist(after["all"], old) < 0.05                  # all time barely moves
        assert after["5m"]["drift_alarm"] and after["5m"]["drift_statistic"] > \
            after["5m"]["drift_threshold"]
        fired_after = prom.wait_alert("EstimateDrift", timeout=60, collection=cid, window="5m")
        elapsed = time.monotonic() - t_change
        print(f"\n[windows e2e] EstimateDrift firing {elapsed:.1f} s after the change "
              f"(refresh every 1 s, scrape/eval every 1 s, hold 2 s); 5m tvd to the new "
              f"population {dist(after['5m'], new):.3f}, all-time tvd to the old "
              f"{dist(after['all'], old):.3f}")
        assert fired_after is not None
    finally:
        worker.stop()
        prom.stop()
