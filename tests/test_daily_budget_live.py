"""The daily ε budget (docs/privacy-over-time.md): ε per window and per day at the declared rate,
computed from the mechanism's guarantee; a config whose declared rate spends more than
``max_epsilon_per_day`` fails at start naming the field; the SDK ledger refuses the report that
would exceed it (the worker publishes the budget in its signed state) and the worker counts at
most the reports per device and day that fit, the rest dead-lettered as ``over_budget``."""
from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
import pytest
from conftest import write_config
from kafka_helpers import read_dlq
from store_helpers import read_collection

from ldpstream.producers.ledger import Ledger


def collection(**extra) -> dict:
    return {"collections": [{"id": "c", "schema": {"attributes": {"os": ["a", "b", "c"],
                                                                  "plan": ["f", "p"]}},
                             "epsilon": 1.0, "marginals": [["os", "plan"]], **extra}]}

pytestmark = pytest.mark.pipeline


def test_worker_and_sdk_refuse_a_device_over_the_budget(tmp_path, kafka_broker, redis_server,
                                                        spawn_worker, unique_name):
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.producers.codec import decode_batch, encode_batch
    from ldpstream.producers.device import ConfigWatcher
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.sdk import DeviceClient, RecordingTransport

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, columns=("sex", "Salary"), partitions=1,
                        marginals=[("sex", "Salary")], estimators=("castell",),
                        extra={"max_epsilon_per_day": 20.0})   # ε 2 per report: 10 a day
    coll = load_config(path).collections[cid]
    mech = coll.mechanism()
    worker = spawn_worker(path)
    worker.wait_ready(60)

    async def run() -> tuple[dict, list[str]]:
        store = make_store(redis_server.url)
        async with Publisher(kafka_broker.bootstrap) as pub:
            for dev, k in ((7, 15), (8, 10)):     # 7: five reports over; 8: exactly the budget
                for _ in range(k):
                    await pub.send(coll.topic, encode_batch(
                        cid, mech.version, np.array([[1, 0]]),
                        device_ids=np.array([dev], np.uint64)), partition=0)
            await pub.flush()
        deadline = time.monotonic() + 60
        while await store.n(cid, 1) < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        counts = await read_collection(store, coll)
        await store.close()
        watcher = await ConfigWatcher(kafka_broker.bootstrap, max_epsilon=None).start()
        try:
            await watcher.wait_for(cid, 30)
            client = DeviceClient(cid, watcher=watcher, transport=RecordingTransport(),
                                  ledger=Ledger(tmp_path / "d.sqlite"), device_id=9,
                                  clock=lambda: 2_000_000.0)
            res = await client.report_many([{"sex": "Male", "Salary": "<=50K"}] * 12)
            await client.close()
        finally:
            await watcher.stop()
        return counts, [r.status + ":" + r.reason[:11] for r in res]

    counts, statuses = asyncio.run(run())
    assert int(next(iter(counts.values())).sum()) == 20
    assert statuses == ["queued:"] * 10 + ["refused:over_budget"] * 2
    over = [r for r in read_dlq(kafka_broker.bootstrap, topic=coll.topic)
            if r["reason"] == "over_budget"]
    assert sum(decode_batch(base64.b64decode(r["payload_b64"])).n for r in over) == 5
    assert "over_budget" in worker.get("/metrics")
