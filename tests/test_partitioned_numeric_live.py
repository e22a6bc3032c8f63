"""A numeric attribute inside ``partitioned``'s marginals live (docs/numeric.md "In partitioned
marginals"): a real worker counts reports randomized by the family (battery rounded without
bias to its points, then the marginal's oracle) and ``GET /estimates`` serves the cells on the
points with their labels, the mean with its interval, quantiles and the W1 bound, per firmware
too, and the ε computed from the channel; a 1m window's drift alarm names the mean that moved;
the Python device SDK reports raw numbers through the state's description (a ``round`` step,
then the partition step, as the C and TypeScript SDKs run it)."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import yaml
from conftest import api_json
from test_windows_e2e import PER_MESSAGE, publish

pytestmark = pytest.mark.pipeline

N = 20_000
BINS = 9


def _collection(cid: str) -> dict:
    return {"id": cid, "schema": {"attributes": {
        "fw": ["a", "b", "c"], "battery": {"numeric": {"min": 0, "max": 100}}}},
        "mechanism": "partitioned", "epsilon": 2.0, "epsilon_scope": "record",
        "params": {"ways": 2, "bins": {"battery": BINS}}, "partitions": 1,
        "marginals": [["battery"], ["fw", "battery"], ["fw"]],
        "estimators": ["global", "unbiased"], "windows": ["all"], "refresh_interval_s": 1.0}


def test_live_estimates_of_a_numeric_attribute(tmp_path, kafka_broker, spawn_worker,
                                               unique_name):
    from ldpstream.config import load_config

    cid = unique_name
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"collections": [_collection(cid)]}, sort_keys=False))
    coll = load_config(str(path)).collections[cid]
    mech = coll.mechanism()
    worker = spawn_worker(str(path))
    worker.wait_ready(60)
    rng = np.random.default_rng(8)
    fw = rng.integers(0, 3, N)
    battery = 100 * rng.beta(5, 2 + fw)
    G = mech.domain["battery"]
    idx = np.stack([fw, np.rint(battery / 100 * (G - 1)).astype(np.int64)], axis=1)
    on_grid = idx[:, 1] / (G - 1) * 100            # the values as devices put them on the grid
    stamps = np.full(N // PER_MESSAGE, time.time() * 1000)
    asyncio.run(publish(kafka_broker.bootstrap, coll, idx, stamps, rng))
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        status, est = api_json(worker.url, f"/estimates/{cid}?attrs=battery&method=global")
        if status == 200 and est.get("n") == N:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"not refreshed: {est}\n{worker.log_tail()}")
    assert len(est["cells"]) == BINS
    assert est["labels"] == [["0", "12.5", "25", "37.5", "50", "62.5", "75", "87.5", "100"]]
    assert est["epsilon_per_record"] == pytest.approx(mech.epsilon, rel=1e-12)
    assert mech.epsilon == pytest.approx(2.0, rel=1e-9)
    num = est["numeric"]
    assert num["attribute"] == "battery" and num["resolution"] == pytest.approx(12.5)
    # one 95 % interval: within twice its half-width (a miss that far has probability 1e-4)
    half = (num["mean"]["high"] - num["mean"]["low"]) / 2
    assert abs(num["mean"]["value"] - on_grid.mean()) < 2 * half, (num["mean"], on_grid.mean())
    med = num["quantiles"]["0.5"]
    assert med["low"] <= np.median(on_grid) <= med["high"]
    assert 12.5 * 0.75 <= num["w1_bound"] <= 100

    status, by = api_json(worker.url, f"/estimates/{cid}?attrs=fw,battery&method=unbiased")
    assert status == 200, by
    assert np.shape(by["cells"]) == (3, BINS)
    rows = by["numeric"]["categories"]
    assert by["numeric"]["by"] == "fw" and [r["category"] for r in rows] == ["a", "b", "c"]
    for k, r in enumerate(rows):   # 3 intervals at 95 %: each within twice its half-width
        half = (r["mean"]["high"] - r["mean"]["low"]) / 2
        assert abs(r["mean"]["value"] - on_grid[fw == k].mean()) < 2 * half, (k, r["mean"])
    assert rows[0]["mean"]["value"] > rows[2]["mean"]["value"]   # Beta(5, 2) above Beta(5, 4)

    status, bad = api_json(worker.url, f"/estimates/{cid}?attrs=battery&method=mean")
    assert status in (400, 404) and "error" in bad
    assert worker.stop() == 0


def test_live_drift_alarm_names_the_mean_that_moved(tmp_path, kafka_broker, spawn_worker,
                                                   unique_name):
    """The 1m window's drift (docs/windows.md "Numeric attributes"): 20,000 reports of battery
    ~ 100·Beta(5, 2) stamped 62 s ago, then 20,000 of 100·Beta(2, 5) now (mean 71.4 → 28.6);
    ``GET /estimates`` of the 1m window raises the alarm on the mean, whose ``drift_detail``
    gives both windows' means (within twice the 95 % half-width of the served mean), on the
    quantiles and on every firmware's mean; fw alone keeps the cells' test."""
    from ldpstream.config import load_config

    cid = unique_name
    path = tmp_path / "c.yaml"
    coll_cfg = {**_collection(cid), "windows": ["1m"], "bucket_s": 1, "drift_alpha": 0.001}
    path.write_text(yaml.safe_dump({"collections": [coll_cfg]}, sort_keys=False))
    coll = load_config(str(path)).collections[cid]
    G = coll.mechanism().domain["battery"]
    worker = spawn_worker(str(path))
    worker.wait_ready(60)
    rng = np.random.default_rng(12)
    means = []
    for (a, b), ago_s in (((5, 2), 62), ((2, 5), 0)):   # the 1m window before, and now
        fw = rng.integers(0, 3, N)
        idx = np.stack([fw, np.rint(rng.beta(a, b, N) * (G - 1)).astype(np.int64)], axis=1)
        means.append(idx[:, 1].mean() / (G - 1) * 100)
        stamps = np.full(N // PER_MESSAGE, time.time() * 1000 - ago_s * 1000)
        asyncio.run(publish(kafka_broker.bootstrap, coll, idx, stamps, rng))
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        status, est = api_json(worker.url, f"/estimates/{cid}?attrs=battery&method=global"
                                           f"&window=1m")
        if status == 200 and est.get("n") == N and est.get("drift_statistic") is not None:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"not refreshed: {est}\n{worker.log_tail()}")
    assert est["drift_alarm"] and est["drift_statistic"] > est["drift_threshold"]
    mean = est["drift_detail"][0]
    assert mean["quantity"] == "mean" and mean["z"] > est["drift_threshold"]
    half = (est["numeric"]["mean"]["high"] - est["numeric"]["mean"]["low"]) / 2
    assert abs(mean["previous"] - means[0]) < 2 * half and abs(mean["current"] - means[1]) < \
        2 * half, (mean, means, half)
    assert [q["quantity"] for q in est["drift_detail"]] == ["mean", "0.5", "0.9", "0.99"]
    status, by = api_json(worker.url, f"/estimates/{cid}?attrs=fw,battery&method=unbiased"
                                      f"&window=1m")
    assert status == 200 and by["drift_alarm"], by
    moved = {q["category"] for q in by["drift_detail"]
             if q["quantity"] == "mean" and q["z"] > by["drift_threshold"]}
    assert moved == {"a", "b", "c"}, by["drift_detail"]
    status, fw_est = api_json(worker.url, f"/estimates/{cid}?attrs=fw&method=global&window=1m")
    assert status == 200 and fw_est["drift_detail"] is None
    assert worker.stop() == 0


def test_python_sdk_reports_raw_numbers_through_the_family(kafka_broker, unique_name):
    """The SDK clips and grids a raw number and runs the state's description (the value rounded
    to its points by a ``round`` step, then the partition step); every report is a code of the
    marginal its device id is assigned, at ε = 2."""
    from test_device_sdk import watching

    from ldpstream.config import parse_config
    from ldpstream.estimators.families.partitioned import assign_by_device
    from ldpstream.producers.ledger import Ledger
    from ldpstream.producers.sdk import DeviceClient, RecordingTransport

    mech = parse_config({"collections": [_collection("p")]}).collections["p"].mechanism()
    assert [s["op"] for s in mech.device_state()["device"]["steps"]] == ["round", "partition"]
    topic = f"cfg.{unique_name}"

    async def run():
        async with watching(kafka_broker.bootstrap, topic, {"p": mech}) as watcher:
            sent = RecordingTransport()
            client = DeviceClient("p", watcher=watcher, transport=sent,
                                  ledger=Ledger(":memory:"), device_id=7,
                                  rng=np.random.default_rng(1))
            res = await client.report_many([{"fw": "a", "battery": 57.25},
                                            {"fw": "c", "battery": 140},
                                            {"fw": "b", "battery": "-3"}])
            assert [r.status for r in res] == ["queued"] * 3
            assert [r.clipped for r in res] == [(), ("battery",), ("battery",)]
            assert all(r.epsilon == pytest.approx(2.0) for r in res)
            assert client.clipped == {"battery": 2}
            await client.close()
            codes = sent.reports()[:, 0].astype(np.int64)
            k = assign_by_device(np.array([7], dtype=np.uint64), len(mech.marginals), 0)[0]
            assert np.all((codes >= mech.offsets[k]) & (codes < mech.offsets[k + 1]))

    asyncio.run(run())
