"""Live: drift of a memoized collection whose devices report in every window (agents/
window_snapshots.py; docs/privacy-over-time.md, "Memoized collections count devices")."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.parse

import numpy as np
import pytest
from conftest import write_config

DEVICES = 2000
WINDOW_S = 8
SAME = [0.45, 0.05, 0.05, 0.45]      # (sex, Salary) cells of the reports
SHIFTED = [0.05, 0.45, 0.45, 0.05]

pytestmark = pytest.mark.pipeline


def test_fleet_reporting_in_every_window_gets_drift(tmp_path, kafka_broker, redis_server,
                                                    spawn_worker, unique_name):
    """2,000 devices report once per 11 s against an 8 s window, three rounds: every device
    moves on each round, so the bucket range before the window is empty. Drift compares the
    window with itself one window ago: after the second round (same population) a drift value and
    no alarm; after the third (shifted) an alarm."""
    from aiokafka import AIOKafkaProducer

    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.producers.codec import encode_batch

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, columns=("sex", "Salary"), partitions=2,
                        marginals=[("sex", "Salary")], estimators=("castell",), epsilon=4.0,
                        refresh_interval_s=0.5,
                        extra={"params": {"memoize": {"rotation_s": 86400,
                                                      "instantaneous_epsilon": 6.0}},
                               "bucket_s": 1, "windows": [f"{WINDOW_S}s", "all"]})
    coll = load_config(path).collections[cid]
    mech = coll.mechanism()
    rng = np.random.default_rng(9)
    ids = np.arange(1, DEVICES + 1, dtype=np.uint64)
    worker = spawn_worker(path)
    worker.wait_ready(60)

    def reports(truth: list[float]) -> np.ndarray:
        cells = rng.choice(4, DEVICES, p=truth)
        return np.stack([cells // 2, cells % 2], axis=1)

    async def run() -> list[dict]:
        store = make_store(redis_server.url)
        pub = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
        await pub.start()
        seen: list[dict] = []
        try:
            start = time.monotonic()
            for k, truth in enumerate([SAME, SAME, SHIFTED]):
                await asyncio.sleep(max(0.0, start + k * (WINDOW_S + 3) - time.monotonic()))
                rep = reports(truth)
                futs = [await pub.send(coll.topic, encode_batch(cid, mech.version,
                                                                rep[ids % 2 == p],
                                                                device_ids=ids[ids % 2 == p]),
                                       partition=p) for p in (0, 1)]
                await asyncio.gather(*futs)
                deadline = time.monotonic() + 6
                est: dict = {}
                while time.monotonic() < deadline:
                    q = urllib.parse.urlencode({"attrs": "sex,Salary", "method": "castell",
                                                "window": f"{WINDOW_S}s"})
                    est = json.loads(worker.get(f"/estimates/{cid}?{q}", any_status=True))
                    if est.get("n") == DEVICES and await store.n(cid, 2) == (k + 1) * DEVICES \
                            and (k == 0 or est.get("drift_statistic") is not None):
                        break
                    await asyncio.sleep(0.25)
                seen.append(est)
        finally:
            await pub.stop()
            await store.close()
        return seen

    first, same, shifted = asyncio.run(run())
    assert first.get("n") == DEVICES and first.get("drift_statistic") is None, first
    assert same.get("n") == DEVICES and same.get("drift_statistic") is not None, same
    assert same["drift_alarm"] is False, same
    assert shifted.get("drift_statistic") is not None and shifted["drift_alarm"] is True, shifted
