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


#: the worst /healthz answer time of a running worker while its ldp.config is flooded
HEALTHZ_WITHIN_S = 3.0
#: how long the running worker is watched after the flood was produced
WATCH_AFTER_S = 10.0


def _junk(key, cid: str) -> bytes:
    """A record a watcher must verify: the pinned key's id, a bad signature."""
    return json.dumps({"alg": "ed25519", "key_id": key.verify_key.key_id,
                       "payload": json.dumps({"collection": cid, "version": 99}),
                       "signature": "A" * 86 + "=="}).encode()


async def _flood(bootstrap: str, junk: bytes, cid: str) -> float:
    """Produce FLOOD copies of ``junk`` to ldp.config; returns the seconds it took."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=50,
                                max_batch_size=1 << 20)
    await producer.start()
    t0 = time.monotonic()
    try:
        futs = [await producer.send("ldp.config", junk, key=cid.encode()) for _ in range(FLOOD)]
        await asyncio.gather(*futs)
    finally:
        await producer.stop()
    return time.monotonic() - t0


def test_config_flood_against_a_running_worker_keeps_it_responsive(
        tmp_path, fresh_redis, spawn_worker, service_env, unique_name):
    """The worker follows ldp.config live and verifies every record of its collections: 300,000
    junk records are worked off in slices of at most 10 ms (producers/device.py ``SLICE_S``), so
    its HTTP port answers within HEALTHZ_WITHIN_S throughout and the worker stays up, refusing
    (and counting) the records as it goes. Before: the event loop stalled for 16-20 s (timers late by as
    much), and the app could crash."""
    import threading
    import urllib.request

    from ldpstream.dev.mqtt_stack import read_metric

    own = OwnBrokerWorker(tmp_path, unique_name, spawn_worker, service_env, fresh_redis.url)
    worker, cid = own.worker, unique_name
    worst = [0.0]
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(worker.url + "/healthz", timeout=60) as r:
                    r.read()
            except OSError:   # no answer within 60 s: counted as 60 s and more
                pass
            worst[0] = max(worst[0], time.monotonic() - t0)
            time.sleep(0.2)

    poller = threading.Thread(target=poll, daemon=True)
    try:
        poller.start()
        t0 = time.monotonic()
        produced_s = asyncio.run(_flood(own.broker.bootstrap, _junk(own.key, cid), cid))
        time.sleep(WATCH_AFTER_S)   # the worker works the flood off meanwhile
        refused = read_metric(worker.url, "ldp_config_records_refused_total",
                              'reason="bad_signature"')
        watched_s = time.monotonic() - t0
        done.set()
        poller.join(70)
        print(f"\nconfig flood on a running worker: {FLOOD} records produced in "
              f"{produced_s:.1f} s; {refused:.0f} refused {watched_s:.1f} s after the flood "
              f"began ({refused / watched_s:.0f}/s); worst /healthz {worst[0]:.2f} s")
        assert worker.proc.poll() is None, worker.log_tail()
        assert refused >= 10_000, refused   # verifying, not stuck
        assert worst[0] < HEALTHZ_WITHIN_S, worst[0]
    finally:
        done.set()
        own.stop()


def test_config_flood_then_worker_restart_and_fresh_device(tmp_path, fresh_redis, spawn_worker,
                                                          service_env, unique_name):
    from ldpstream.producers.device import ConfigWatcher

    # a broker of its own: other tests' watchers never read this flood
    own = OwnBrokerWorker(tmp_path, unique_name, spawn_worker, service_env, fresh_redis.url)
    broker, key, worker, cid, path, env = (own.broker, own.key, own.worker, unique_name,
                                           own.path, own.env)
    try:
        async def fresh_watcher() -> tuple[float, ConfigWatcher]:
            t0 = time.monotonic()
            w = await ConfigWatcher(broker.bootstrap, verify_key=key.verify_key,
                                    collections=[cid]).start(timeout_s=60)
            return time.monotonic() - t0, w

        produced_s = asyncio.run(_flood(broker.bootstrap, _junk(key, cid), cid))
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


def test_a_refused_record_costs_a_hash_the_second_time():
    """The CPU a watcher spends per junk record: a signature check for new bytes, a hash for
    bytes it refused before (producers/device.py ``REFUSED_REMEMBERED``)."""
    from ldpstream.producers.device import ConfigWatcher
    from ldpstream.producers.signing import SigningKey

    key = SigningKey.generate()
    watcher = ConfigWatcher("127.0.0.1:1", verify_key=key.verify_key, collections=["c"])
    n = 5000

    def junk(i: int) -> bytes:
        return json.dumps({"alg": "ed25519", "key_id": key.verify_key.key_id,
                           "payload": json.dumps({"collection": "c", "version": 99 + i}),
                           "signature": "A" * 86 + "=="}).encode()

    cost = {}
    for label, values in (("distinct", [junk(i) for i in range(n)]), ("same", [junk(0)] * n)):
        t0 = time.process_time()
        for v in values:
            watcher._take(b"c", v)
        cost[label] = (time.process_time() - t0) / n
    print(f"\nrefused ldp.config record: {cost['distinct'] * 1e6:.0f} us CPU each when new, "
          f"{cost['same'] * 1e6:.1f} us when refused before")
    assert watcher.rejected == {"bad_signature": 2 * n}
    assert cost["same"] < cost["distinct"] / 5, cost
