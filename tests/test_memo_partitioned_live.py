"""Memoized ``partitioned`` live (docs/partitioned.md "Memoization"): the worker publishes the
memoized state, device SDKs read it from ldp.config, memoize and report over three rotation
periods through Kafka, and the worker's counts and estimates equal the offline ones on each
device's latest report (real broker, real Redis, worker as a child process). Also with a
numeric attribute (docs/numeric.md "In partitioned marginals"): each device α-point rounds its
raw reading (a reading moved inside its rounded point is a duplicate, nothing spent) and the
mean's summary is served from the counts of each device once."""
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

ATTRS = {"os": ["android", "ios", "web"], "plan": ["free", "pro"], "region": ["eu", "us", "apac"]}
MARGINALS = [["os", "plan"], ["plan", "region"]]
#: a firmware and a battery on [0, 100] (its grid of 1,025 points rounded to 9 points)
NUMERIC = {"fw": ["a", "b", "c"], "battery": {"numeric": {"min": 0, "max": 100}}}
NUMERIC_MARGINALS = [["battery"], ["fw", "battery"]]
ROT = 3600.0


@pytest.mark.parametrize("numeric", [False, True], ids=["categorical", "numeric"])
def test_memoized_partitioned_live_equals_offline(tmp_path, kafka_broker, redis_server,
                                                  spawn_worker, unique_name, numeric):
    from ldpstream.agents.app import make_store
    from ldpstream.agents.refresh.payloads import estimate_payload
    from ldpstream.config import load_config
    from ldpstream.producers.device import ConfigWatcher
    from ldpstream.producers.ledger import Ledger
    from ldpstream.producers.program import Program
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.sdk import DeviceClient, KafkaTransport

    cid = unique_name
    attrs, marginals = (NUMERIC, NUMERIC_MARGINALS) if numeric else (ATTRS, MARGINALS)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"collections": [{
        "id": cid, "schema": {"attributes": attrs}, "mechanism": "partitioned",
        "epsilon": 2.0, "epsilon_scope": "record",
        "params": {"ways": 2, "memoize": {"rotation_s": ROT,
                                          "instantaneous_epsilon": 4.0 if numeric else 1.0},
                   **({"bins": {"battery": 9}} if numeric else {})},
        "marginals": marginals, "estimators": ["unbiased"], "refresh_interval_s": 1.0,
        "windows": ["all"]}]}))
    coll = load_config(str(path)).collections[cid]
    mech = coll.mechanism()
    assert mech.memoization() is not None
    worker = spawn_worker(str(path))
    worker.wait_ready(60)
    devices, periods = 300 if numeric else 150, 3
    rng = np.random.default_rng(12)
    if numeric:   # raw readings between two of the 9 points
        records = [{"fw": str(rng.choice(NUMERIC["fw"])),
                    "battery": f"{100 * rng.beta(5, 2):.2f}"} for _ in range(devices)]
    else:
        records = [{a: str(rng.choice(ATTRS[a])) for a in ATTRS} for _ in range(devices)]
    prog = Program(mech.device_state()["device"])
    assert prog.memo is not None

    async def run():
        store = make_store(redis_server.url)
        watcher = await ConfigWatcher(kafka_broker.bootstrap, collections=[cid]).start()
        sent = []
        try:
            async with Publisher(kafka_broker.bootstrap) as pub:
                for d, rec in enumerate(records):
                    now = [ROT * 1000]
                    client = DeviceClient(cid, watcher=watcher, transport=KafkaTransport(pub),
                                          ledger=Ledger(":memory:"), device_id=d + 1,
                                          batch_size=periods, clock=lambda: now[0],
                                          rng=np.random.default_rng([5, d]))
                    for _ in range(periods):
                        res = await client.report(rec)
                        assert res.status == "queued" and res.epsilon == pytest.approx(
                            mech.guarantee().per_rotation, rel=1e-9)
                        sent.append(res.report)
                        res = await client.report(rec)    # the same period: not sent again
                        assert res.status == "duplicate"
                        if numeric:   # a reading moved inside its rounded point: the same
                            moved = _moved(rec, prog, d + 1)
                            res = await client.report(moved)
                            assert res.status == "duplicate" and res.epsilon == 0.0
                        now[0] += ROT
                    await client.close()
            total = devices * periods
            assert await wait_for_n(store, cid, total, timeout=60) == total
            # a memoized collection counts each device once, at its latest report
            # (docs/privacy-over-time.md): the last of each device's periods
            latest = np.stack(sent)[periods - 1::periods]
            want_counts = mech.count(latest, coll.tensors())
            got = await read_collection(store, coll)
            for spec in coll.tensors():
                np.testing.assert_array_equal(got[spec.key], want_counts[spec.key],
                                              err_msg=spec.key)
            window = coll.windows[0]
            counts = {coll.version: want_counts}
            want = {tuple(m): estimate_payload(coll, mech, mech.estimate_versions(
                counts, m, "unbiased"), m, "unbiased", window, 0.0, list(counts))
                for m in marginals}
            deadline = time.monotonic() + 60
            live: dict = {}
            while time.monotonic() < deadline and len(live) < len(want):
                for m in want:
                    p = await store.get_estimate(cid, window.name, "unbiased", m)
                    if p is not None and p.get("n") == want[m]["n"]:   # the marginal's own
                        live[m] = p
                await asyncio.sleep(0.3)
            assert live.keys() == want.keys()
            for m, w in want.items():
                assert_close(np.asarray(live[m]["cells"], dtype=float),
                             np.asarray(w["cells"], dtype=float), rel=1e-12, err_msg=str(m))
                assert live[m]["epsilon"] == w["epsilon"] == 2.0          # configured
                assert live[m]["epsilon_per_record"] == pytest.approx(mech.epsilon, rel=1e-12)
                assert live[m]["epsilon_per_rotation"] == pytest.approx(2.0, rel=1e-9)
                if numeric:   # the means' summaries (per firmware too), from the counts of
                    got_num, want_num = live[m]["numeric"], w["numeric"]   # each device once
                    rows = list(zip(got_num.get("categories", [got_num]),
                                    want_num.get("categories", [want_num])))
                    assert rows and all("mean" in b for _, b in rows), want_num
                    for a, b in rows:
                        for k in ("value", "low", "high"):
                            assert a["mean"][k] == pytest.approx(b["mean"][k], rel=1e-9), (m, k)
        finally:
            await watcher.stop()
            await store.close()

    asyncio.run(run())
    assert worker.stop() == 0


def _moved(rec: dict, prog, device_id: int) -> dict:
    """``rec`` with its battery reading moved by a grid step (of 1,025 points) that keeps the
    device's rounded point (up, else down; the reading itself when neither does)."""
    memo, g = prog.memo, prog.encode(rec)[1]
    here = memo.rounded([0, g], device_id)[1]
    for v in (g + 1, g - 1):
        if 0 <= v <= 1024 and memo.rounded([0, v], device_id)[1] == here:
            return {**rec, "battery": f"{v / 1024 * 100:.6f}"}
    return rec
