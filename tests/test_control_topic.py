"""The control topic survives broker log loss (agents/control/control_topic.py, docs/security.md "The
control topic"): an in-memory broker restarted empty gets ``ldp.config`` republished and
``ldp.dlq`` (and the report topics) recreated by the worker without help, a rejected message is
then filed in the DLQ, and a captured older signed state produced afterwards is refused."""
from __future__ import annotations

import asyncio
import json
import time

import pytest
from kafka_helpers import OwnBrokerWorker, read_dlq

pytestmark = pytest.mark.pipeline


def test_broker_log_loss_republishes_config_and_recreates_dlq(tmp_path, fresh_redis,
                                                               spawn_worker, service_env,
                                                               unique_name):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from ldpstream.producers.device import ConfigWatcher

    own = OwnBrokerWorker(tmp_path, unique_name, spawn_worker, service_env, fresh_redis.url)
    broker, key, worker, cid = own.broker, own.key, own.worker, unique_name
    try:
        async def watch() -> ConfigWatcher:
            return await ConfigWatcher(broker.bootstrap, verify_key=key.verify_key,
                                       collections=[cid]).start(timeout_s=30)

        async def topics() -> set[str]:
            c = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
            await c.start()
            try:
                return set(await c.topics())
            finally:
                await c.stop()

        async def run() -> float:
            w = await watch()
            before = w.states[cid]
            captured = w.records[cid]   # an attacker keeps this signed record
            await w.stop()
            broker.stop()
            broker.start()              # every log lost: no topic left
            t0 = time.monotonic()
            deadline = t0 + 60
            while time.monotonic() < deadline:
                try:
                    if {"ldp.config", "ldp.dlq", f"ldp.reports.{cid}"} <= await topics():
                        w = await watch()
                        if cid in w.states:
                            break
                        await w.stop()
                except (ConnectionError, OSError):
                    pass
                await asyncio.sleep(0.5)
            took = time.monotonic() - t0
            assert cid in w.states, worker.log_tail()
            assert w.states[cid].order > before.order  # republished, signed anew
            await w.stop()
            producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
            await producer.start()
            try:  # the captured older state, replayed; a garbage report
                await producer.send_and_wait("ldp.config", captured, key=cid.encode())
                await producer.send_and_wait(f"ldp.reports.{cid}", b"garbage!", partition=0)
            finally:
                await producer.stop()
            fresh = await watch()
            try:
                assert fresh.states[cid].order > before.order
                assert fresh.rejected == {"replayed": 1}
            finally:
                await fresh.stop()
            return took

        took = asyncio.run(run())
        assert took < 30, took
        deadline = time.monotonic() + 30
        reasons: list[str] = []
        while time.monotonic() < deadline and not reasons:
            reasons = [r["reason"] for r in read_dlq(broker.bootstrap, topic=f"ldp.reports.{cid}")]
            time.sleep(0.5)
        assert reasons == ["bad_magic"], worker.log_tail()
        health = json.loads(worker.get("/healthz", any_status=True))
        whys = {e["why"] for e in health["checks"]["ingest"]["config_republished"]}
        assert whys & {"recreated", "empty", "shrank"}, health["checks"]["ingest"]
        assert any(l.startswith("ldp_config_republished_total") and 'why="recreated"' in l
                   for l in worker.get("/metrics").splitlines())
    finally:
        own.stop()
