"""``mechanism: partitioned`` live: a collection configured with it, the fleet reading its state
from ldp.config, the worker counting (the family's own ``count``) and refreshing, and the live
estimates equal the offline ones on the same seeded reports (real broker, real Redis, worker as a
child process); the device SDK assigns each device its marginal by its id."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import yaml
from conftest import wait_for_n
from store_helpers import read_collection
from tolerance import assert_close

pytestmark = pytest.mark.pipeline

COLUMNS = ("sex", "race", "relationship", "Salary")
MARGINALS = [["sex", "race"], ["race", "relationship"], ["sex", "Salary"],
             ["sex", "race", "Salary"]]          # the 3-way one by maximum entropy from pairs
METHODS = ("consistent", "calm", "global")


def _config(path, cid: str, bounds: str = "proxy") -> str:
    coll = {"id": cid, "schema": {"csv": {"columns": list(COLUMNS)}},
            "mechanism": "partitioned", "epsilon": 2.0, "epsilon_scope": "record",
            "params": {"ways": 2, "bounds": bounds}, "partitions": 2, "marginals": MARGINALS,
            "estimators": list(METHODS), "refresh_interval_s": 1.0, "windows": ["all", "5m"]}
    with open(path, "w") as fh:
        yaml.safe_dump({"collections": [coll]}, fh)
    return str(path)


@pytest.mark.parametrize("bounds", ["proxy", "bootstrap"])
def test_live_estimates_equal_offline(tmp_path, kafka_broker, redis_server, spawn_worker,
                                      unique_name, bounds):
    """With ``bounds: bootstrap`` the live bounds are the offline ones too (the bootstrap is
    seeded by the counts), and a triple from the pairs gets its own bound, not 1."""
    from ldpstream.agents.app import make_store
    from ldpstream.agents.refresh.payloads import estimate_payload
    from ldpstream.config import load_config
    from ldpstream.estimators.families.partitioned import Partitioned
    from ldpstream.producers.fleet import run_fleet

    cid = unique_name
    path = _config(tmp_path / "c.yaml", cid, bounds)
    coll = load_config(path).collections[cid]
    mech = coll.mechanism()
    assert isinstance(mech, Partitioned) and mech.epsilon == 2.0
    worker = spawn_worker(path)
    worker.wait_ready(60)
    total = 24_000

    async def run():
        stats = await run_fleet(kafka_broker.bootstrap, coll, rate=0, total=total, batch=600,
                                seed=21, keep_counts=True, devices=400)
        assert stats.sent_reports == total
        store = make_store(redis_server.url)
        assert await wait_for_n(store, cid, total, timeout=60) == total
        got = await read_collection(store, coll)
        for spec in coll.tensors():
            np.testing.assert_array_equal(got[spec.key], stats.counts[spec.key], err_msg=spec.key)
        window = coll.windows[0]
        counts = {coll.version: stats.counts}
        want = {(tuple(m), e): estimate_payload(coll, mech, mech.estimate_versions(counts, m, e),
                                                m, e, window, 0.0, list(counts))
                for m in MARGINALS for e in METHODS}
        deadline = time.monotonic() + 60
        live: dict = {}
        while time.monotonic() < deadline and len(live) < len(want):
            for (m, e) in want:
                p = await store.get_estimate(cid, window.name, e, m)
                if p is not None and p.get("n") == total:
                    live[(m, e)] = p
            await asyncio.sleep(0.3)
        await store.close()
        assert live.keys() == want.keys(), sorted(set(want) - set(live))
        for k, w in want.items():
            p = live[k]
            assert_close(np.asarray(p["cells"], dtype=float), np.asarray(w["cells"], dtype=float),
                         rel=1e-12, err_msg=str(k))
            assert p["epsilon"] == w["epsilon"] == mech.epsilon
            assert p["error_bound"] == w["error_bound"]
            assert p["error_bound_method"] == w["error_bound_method"]
        triple = live[(("sex", "race", "Salary"), "consistent")]
        if bounds == "proxy":   # a triple from the collected pairs: the bound that always holds
            assert triple["error_bound"] == 1.0 and triple["error_bound_coverage"] == "at least"
        else:                   # its own bootstrap bound, for the noise
            assert 0 < triple["error_bound"] < 0.5, triple["error_bound"]
            assert triple["error_bound_coverage"] == "noise only"
            pair = live[(("sex", "race"), "global")]
            assert pair["error_bound_coverage"] == "calibrated"
            assert pair["error_bound_method"].startswith("bootstrap of the served estimator")
            assert live[(("sex", "race"), "calm")]["error_bound_method"].startswith(
                "bootstrap of the unbiased estimate")   # calm carries the unbiased table's
        assert live[(("sex", "race"), "consistent")]["error_bound"] > 0
        assert live[(("sex", "race", "Salary"), "global")]["chosen"] in ("global", "measurements",
                                                                         "consistent")

    asyncio.run(run())
    assert worker.stop() == 0


def test_device_sdk_assigns_marginals_by_device_id(kafka_broker, unique_name):
    """The SDK passes its device id: every report of a device carries the marginal its id
    hashes to (``assign_by_device``), whatever the records."""
    from test_device_sdk import watching

    from ldpstream.estimators.families.partitioned import Partitioned, assign_by_device
    from ldpstream.estimators.kernels.domain import Domain
    from ldpstream.producers.ledger import Ledger
    from ldpstream.producers.sdk import DeviceClient, RecordingTransport

    dom = Domain.from_categories({"os": ["android", "ios", "other"], "plan": ["free", "pro"],
                                  "region": ["eu", "us"]})
    mech = Partitioned(dom, 2.0, ways=2, assign_seed=5)
    topic = f"cfg.{unique_name}"
    rng = np.random.default_rng(0)
    records = [{"os": str(rng.choice(["android", "ios", "other"])),
                "plan": str(rng.choice(["free", "pro"])), "region": str(rng.choice(["eu", "us"]))}
               for _ in range(30)]

    async def run():
        blocks = {}
        async with watching(kafka_broker.bootstrap, topic, {"part": mech}) as watcher:
            for device in range(1, 9):
                sent = RecordingTransport()
                client = DeviceClient("part", watcher=watcher, transport=sent,
                                      ledger=Ledger(":memory:"), device_id=device,
                                      rng=np.random.default_rng(device))
                res = await client.report_many(records)
                assert all(r.status == "queued" for r in res)
                assert res[0].epsilon == pytest.approx(2.0)
                await client.close()
                codes = sent.reports()[:, 0].astype(np.int64)
                blocks[device] = set(np.searchsorted(mech.offsets, codes, side="right") - 1)
        want = assign_by_device(np.arange(1, 9, dtype=np.uint64), len(mech.marginals), 5)
        assert blocks == {d: {int(k)} for d, k in zip(range(1, 9), want)}
        assert len(set(want.tolist())) > 1          # the devices do not all share one marginal

    asyncio.run(run())
