"""Live = simulate for a memoized collection (docs/privacy-over-time.md): a seeded fleet of SDK
devices reports each record three times (memoized permanent response, fresh instantaneous
randomization, all three sent) to a real worker through Kafka; the worker counts each device once,
at its latest report, so its counts equal ``simulate``'s counting of the devices' latest reports
exactly and the served estimate (raw, unprojected) equals ``simulate``'s estimate of them."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.parse

import numpy as np
import pytest
from conftest import write_config
from store_helpers import read_collection
from tolerance import assert_close

pytestmark = pytest.mark.pipeline

DEVICES = 300
REPEATS = 3
MEMO_YAML = "{rotation_s: 86400, instantaneous_epsilon: 2}"


class Ticking:
    """A device clock one second further at every read (each report is a resend)."""

    def __init__(self, t: float = 2_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_live_counts_and_estimate_equal_simulate(tmp_path, kafka_broker, redis_server,
                                                 spawn_worker, unique_name):
    from ldpstream import cli
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.producers.device import ConfigWatcher
    from ldpstream.producers.ledger import Ledger
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.sdk import DeviceClient, KafkaTransport
    from ldpstream.simulate.driver import build, estimate_run, plan_from_args, run_of_reports

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, columns=("sex", "Salary"), partitions=2,
                        marginals=[("sex", "Salary")], estimators=("castell",),
                        refresh_interval_s=0.5,
                        extra={"params": {"memoize": {"rotation_s": 86400,
                                                      "instantaneous_epsilon": 2.0}},
                               "windows": ["5m", "all"]})
    coll = load_config(path).collections[cid]
    mech = coll.mechanism()
    args = cli.build_parser().parse_args([
        "simulate", "--mechanism", "rr-ind", "--epsilon", "1", "--param", f"memoize={MEMO_YAML}",
        "--columns", "sex,Salary", "--ways", "2"])
    sim = build(plan_from_args(args))
    assert sim.domain.shape == coll.domain.shape and sim.guarantee() == mech.guarantee()
    rng = np.random.default_rng(21)
    labels = coll.domain.labels
    records = [{"sex": labels[0][rng.integers(2)], "Salary": labels[1][rng.integers(2)]}
               for _ in range(DEVICES)]
    worker = spawn_worker(path)
    worker.wait_ready(60)

    async def run() -> tuple[np.ndarray, dict, dict]:
        last = np.zeros((DEVICES, 2), dtype=np.int64)
        watcher = await ConfigWatcher(kafka_broker.bootstrap, max_epsilon=None).start()
        store = make_store(redis_server.url)
        try:
            await watcher.wait_for(cid, 30)
            async with Publisher(kafka_broker.bootstrap) as pub:
                for i, rec in enumerate(records):
                    client = DeviceClient(cid, watcher=watcher, transport=KafkaTransport(pub),
                                          ledger=Ledger(":memory:"), device_id=i + 1,
                                          batch_size=REPEATS, resend_every_s=0.5,
                                          clock=Ticking(), rng=np.random.default_rng([5, i]))
                    res = [await client.report(rec) for _ in range(REPEATS)]
                    assert [r.status for r in res] == ["queued"] * REPEATS
                    last[i] = res[-1].report
                    await client.close()
                    client.ledger.close()
                await pub.flush()
            deadline = time.monotonic() + 60
            while await store.n(cid, 2) < DEVICES * REPEATS and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            counts = await read_collection(store, coll)
            q = urllib.parse.urlencode({"attrs": "sex,Salary", "method": "castell",
                                        "window": "all", "raw": "1"})
            est: dict = {}
            deadline = time.monotonic() + 30
            while est.get("n") != DEVICES and time.monotonic() < deadline:
                await asyncio.sleep(0.3)
                est = json.loads(worker.get(f"/estimates/{cid}?{q}", any_status=True))
        finally:
            await watcher.stop()
            await store.close()
        return last, counts, est

    last, counts, est = asyncio.run(run())
    simulated = run_of_reports(sim, last, [("sex", "Salary")])
    key = next(iter(counts))
    np.testing.assert_array_equal(counts[key], mech.count(last, coll.tensors())[key])
    assert est.get("n") == DEVICES, est
    offline = estimate_run(simulated, ("sex", "Salary"), "castell", {"proper": False})
    assert_close(np.asarray(est["cells"], dtype=float), offline.factor.values, 1e-9)
