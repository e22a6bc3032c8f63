"""Memoized collections count devices, not reports (docs/privacy-over-time.md): the rule (each device at its
latest report, its previous report subtracted), its state in Redis written with the counts, and
the live worker: a device sending 1,000 memoized reports moves the estimate by one device and
does not shrink the error bound, across a kill -9 of the worker."""
from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.parse

import numpy as np
import pytest
from conftest import write_config
from kafka_helpers import read_dlq
from store_helpers import read_collection, read_fine_buckets
from tolerance import assert_close

from ldpstream.agents.store.device_memo import latest_per_device
from ldpstream.estimators.kernels.bounds import product_channel_bounds

DEVICES = 2000
ROUNDS = 3          # every honest device reports this many times (its last report counts)
CHATTY = 1000       # reports of the one chatty device
CHATTY_ID = 10**9
MEMOIZE = {"rotation_s": 86400, "instantaneous_epsilon": 2.0}

pytestmark = pytest.mark.pipeline


def memo_config(tmp_path, cid: str, **extra) -> str:
    return write_config(tmp_path / "c.yaml", cid, columns=("sex", "Salary"), partitions=2,
                        marginals=[("sex", "Salary")], estimators=("castell",),
                        refresh_interval_s=0.5,
                        extra={"params": {"memoize": MEMOIZE}, "windows": ["5m", "all"], **extra})


def latest_table(ids: np.ndarray, reports: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The count table of each device's last report (in order)."""
    mv = latest_per_device(ids, reports, np.zeros(1, dtype=np.int64), 0, ())
    table = np.zeros(shape, dtype=np.int64)
    np.add.at(table, tuple(reports[mv.keep].T), 1)
    return table



def test_chatty_device_counts_once_across_kill9(tmp_path, kafka_broker, redis_server,
                                                spawn_worker, unique_name):
    from aiokafka import AIOKafkaProducer

    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.estimators.kernels.poisoning import poisoning_bound
    from ldpstream.producers.codec import encode_batch

    cid = unique_name
    path = memo_config(tmp_path, cid)
    coll = load_config(path).collections[cid]
    mech = coll.mechanism()
    assert mech.memoization() is not None
    shape = coll.domain.shape
    rng = np.random.default_rng(7)
    honest_ids = np.arange(1, DEVICES + 1, dtype=np.uint64)
    # each round: every device's report; reports of a device land on partition id % 2
    rounds = [np.stack([rng.integers(0, k, DEVICES) for k in shape], axis=1)
              for _ in range(ROUNDS)]
    chatty = np.tile(np.array([[0, 1]]), (CHATTY, 1))
    worker = spawn_worker(path)
    worker.wait_ready(60)

    async def send(pub: AIOKafkaProducer, ids: np.ndarray, reports: np.ndarray,
                   ago_s: float = 0.0) -> None:
        """Each device's reports on partition id % 2, stamped ``ago_s`` seconds ago."""
        futs = []
        for p in (0, 1):
            on = ids % 2 == p
            for s in range(0, int(on.sum()), 250):
                sl = slice(s, s + 250)
                futs.append(await pub.send(
                    coll.topic, encode_batch(cid, mech.version, reports[on][sl],
                                             device_ids=ids[on][sl]),
                    partition=p, timestamp_ms=int((time.time() - ago_s) * 1000)))
        await asyncio.gather(*futs)

    async def run() -> tuple[dict, dict, dict, dict]:
        store = make_store(redis_server.url)
        pub = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
        await pub.start()
        try:
            # the first round 3 buckets back: the later rounds move every device out of it
            await send(pub, honest_ids, rounds[0], ago_s=180.0)
            await send(pub, np.full(CHATTY // 2, CHATTY_ID, np.uint64), chatty[:CHATTY // 2])
            deadline = time.monotonic() + 60
            while await store.n(cid, 2) < DEVICES and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            worker.kill()  # SIGKILL mid-stream: Redis holds counts and device state together
            for r in rounds[1:]:
                await send(pub, honest_ids, r)
            await send(pub, np.full(CHATTY // 2, CHATTY_ID, np.uint64), chatty[CHATTY // 2:])
            w2 = spawn_worker(path)
            w2.wait_ready(60)
            want = DEVICES * ROUNDS + CHATTY
            deadline = time.monotonic() + 90
            while await store.n(cid, 2) < want and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert await store.n(cid, 2) == want, w2.log_tail()
            counted_at = time.time()   # a refresh that began before this may miss the last deltas
            counts = await read_collection(store, coll)
            fine = await read_fine_buckets(store, coll, 300)
            recent = await read_fine_buckets(store, coll, 60)   # without round 0's bucket
            est = {}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                q = urllib.parse.urlencode({"attrs": "sex,Salary", "method": "castell",
                                            "window": "5m"})
                est = json.loads(w2.get(f"/estimates/{cid}?{q}", any_status=True))
                if est.get("n") == DEVICES + 1 and est.get("updated_at", 0) > counted_at:
                    break
                await asyncio.sleep(0.3)
        finally:
            await pub.stop()
            await store.close()
        return counts, fine, recent, est

    counts, fine, recent, est = asyncio.run(run())
    key = next(iter(counts))
    honest = latest_table(honest_ids, rounds[-1], shape)
    one = np.zeros(shape, dtype=np.int64)
    one[0, 1] = 1
    # exactly each device once: every honest device at its last report, the chatty one once
    np.testing.assert_array_equal(counts[key], honest + one)
    np.testing.assert_array_equal(fine[key], honest + one)
    np.testing.assert_array_equal(recent[key], honest + one)  # moved out of the old bucket
    assert est.get("n") == DEVICES + 1, est
    attrs = ("sex", "Salary")
    clean = mech.estimate({key: honest}, attrs, "castell").factor.values
    live = np.asarray(est["raw_cells"] if est.get("raw_cells") is not None else est["cells"])
    moved = float(np.abs(mech.estimate({key: counts[key]}, attrs, "castell").factor.values
                         - clean).max())
    assert moved <= poisoning_bound(mech.channels_of(attrs), DEVICES, 1) + 1e-12
    # the bound counts devices: what DEVICES + 1 devices give, not DEVICES + 1,000 reports
    by_device = mech.estimate({key: counts[key]}, attrs, "castell")
    assert est["error_bound"] is not None and by_device.error_bound is not None
    assert_close(est["error_bound"], by_device.error_bound, rel=0.05)
    # the served bound is a 100-draw bootstrap (±5 %): compare the two with 4,000 draws each
    wide = product_channel_bounds(np.stack([counts[key], honest + CHATTY * one]),
                                  mech.channels_of(attrs), draws=4000)
    assert wide[0].tvd > 1.1 * wide[1].tvd, (wide[0].tvd, wide[1].tvd)
    assert live.size == clean.size
    assert not [r for r in read_dlq(kafka_broker.bootstrap, topic=coll.topic)]


def test_device_state_cap_refuses_loudly(tmp_path, kafka_broker, redis_server, spawn_worker,
                                         unique_name):
    """Beyond ``device_state_max`` devices a partition refuses new devices' reports: DLQ
    ``device_state_full``, the metric, ``/healthz`` degraded and a warning in ``/collections``,
    which states what the collection counts and ε per window and day at the declared rate."""
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.producers.codec import decode_batch, encode_batch
    from ldpstream.producers.publisher import Publisher

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, columns=("sex", "Salary"), partitions=1,
                        marginals=[("sex", "Salary")], estimators=("castell",),
                        extra={"params": {"memoize": MEMOIZE}, "device_state_max": 50,
                               "reports_per_day": 1440, "max_epsilon_per_day": 4.0})
    coll = load_config(path).collections[cid]
    mech = coll.mechanism()
    worker = spawn_worker(path)
    worker.wait_ready(60)

    async def run() -> dict:
        store = make_store(redis_server.url)
        async with Publisher(kafka_broker.bootstrap) as pub:
            # 60 devices in 3 messages sent at once (one poll, most likely): 10 find no room
            for first in (0, 20, 40):
                ids = np.arange(first, first + 20, dtype=np.uint64)
                await pub.send(coll.topic, encode_batch(cid, mech.version,
                                                        np.zeros((ids.size, 2), np.int64),
                                                        device_ids=ids), partition=0)
            await pub.flush()
        deadline = time.monotonic() + 60
        while await store.n(cid, 1) < 50 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        counts = await read_collection(store, coll)
        await store.close()
        return counts

    counts = asyncio.run(run())
    assert int(next(iter(counts.values())).sum()) == 50
    full = [r for r in read_dlq(kafka_broker.bootstrap, topic=coll.topic)
            if r["reason"] == "device_state_full"]
    assert sum(decode_batch(base64.b64decode(r["payload_b64"])).n for r in full) == 10
    assert all("device_state_max = 50" in r["detail"] for r in full)
    deadline = time.monotonic() + 10
    health = json.loads(worker.get("/healthz", any_status=True))
    while not health["checks"].get("devices", {}).get("device_state_full") and \
            time.monotonic() < deadline:
        time.sleep(0.2)
        health = json.loads(worker.get("/healthz", any_status=True))
    assert health["status"] == "degraded", health
    assert health["checks"]["devices"] == {"ok": False, "device_state_full": {cid: 10}}
    info = json.loads(worker.get(f"/collections/{cid}"))["over_time"]
    assert info["counted_by"] == "device" and info["daily_report_limit"] == 1440
    assert "10 report(s) of new devices refused" in info["warning"]
    q = urllib.parse.urlencode({"attrs": "sex,Salary", "method": "castell", "window": "all"})
    est: dict = {}
    deadline = time.monotonic() + 30
    while "warnings" not in est and time.monotonic() < deadline:
        est = json.loads(worker.get(f"/estimates/{cid}?{q}", any_status=True))
        time.sleep(0.3)
    assert est["n"] == 50 and info["warning"] in est["warnings"], est
    assert_close(info["epsilon_per_device_day"], 4.0, 1e-9)      # 2 rotations × ε 2
    assert_close(info["epsilon_per_window"]["5m"], 4.0, 1e-9)
    text = worker.get("/metrics")
    assert 'ldp_reports_rejected_total{collection="%s",reason="device_state_full"} 10.0' % cid \
        in text
    assert 'ldp_memo_devices{collection="%s",partition="0"} 50.0' % cid in text
