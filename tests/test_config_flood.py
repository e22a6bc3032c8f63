"""A flood of ``ldp.config`` costs a bounded time (producers/device.py ``TAIL_RECORDS``,
agents/control/control_topic.py): 300,000 junk records under a collection's key (with the pinned key's id
and a bad signature, so each would need a signature check), then a worker restart and a fresh
device watcher. Before, the restarted worker exited after 35.8 s ("cannot read ldp.config ... in
time") and a fresh watcher took 16.9 s; now both read from the end, where the newest valid state
is (the worker republishes on start and after a flood)."""
from __future__ import annotations

import asyncio
import json
import time

import pytest
from kafka_helpers import OwnBrokerWorker

pytestmark = pytest.mark.pipeline

FLOOD = 300_000


def test_config_flood_then_worker_restart_and_fresh_device(tmp_path, fresh_redis, spawn_worker,
                                                          service_env, unique_name):
    from aiokafka import AIOKafkaProducer

    from ldpstream.producers.device import ConfigWatcher

    # a broker of its own: other tests' watchers never read this flood
    own = OwnBrokerWorker(tmp_path, unique_name, spawn_worker, service_env, fresh_redis.url)
    broker, key, worker, cid, path, env = (own.broker, own.key, own.worker, unique_name,
                                           own.path, own.env)
    try:
        async def flood() -> float:
            junk = json.dumps({"alg": "ed25519", "key_id": key.verify_key.key_id,
                               "payload": json.dumps({"collection": cid, "version": 99}),
                               "signature": "A" * 86 + "=="}).encode()
            producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=50,
                                        max_batch_size=1 << 20)
            await producer.start()
            t0 = time.monotonic()
            try:
                futs = [await producer.send("ldp.config", junk, key=cid.encode())
                        for _ in range(FLOOD)]
                await asyncio.gather(*futs)
            finally:
                await producer.stop()
            return time.monotonic() - t0

        async def fresh_watcher() -> tuple[float, ConfigWatcher]:
            t0 = time.monotonic()
            w = await ConfigWatcher(broker.bootstrap, verify_key=key.verify_key,
                                    collections=[cid]).start(timeout_s=60)
            return time.monotonic() - t0, w

        produced_s = asyncio.run(flood())
        worker.kill()
        t0 = time.monotonic()
        w2 = spawn_worker(path, env)
        w2.wait_ready(60)
        restart_s = time.monotonic() - t0

        async def device() -> float:
            took, w = await fresh_watcher()
            try:
                assert w.states[cid].version == 0, w.rejected
                assert sum(w.rejected.values()) < 5000, w.rejected   # it read the tail only
            finally:
                await w.stop()
            return took

        device_s = asyncio.run(device())
        print(f"\nconfig flood: {FLOOD} records produced in {produced_s:.1f} s; worker restart "
              f"ready in {restart_s:.1f} s; fresh device watcher {device_s:.2f} s")
        assert restart_s < 30, restart_s
        assert device_s < 5, device_s
    finally:
        own.stop()
