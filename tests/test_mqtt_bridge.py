"""``ldpstream mqtt-bridge`` end to end: devices (the SDK's MQTT transport) → Mosquitto (Debian,
passwords and ACLs) → bridge (child process) → Kafka → worker → Redis. Counts are exact,
including across a bridge killed with SIGKILL mid-stream and a Mosquitto restart (persistent
sessions: nothing lost, nothing counted twice); refused input (wrong credentials, another
fleet's prefix, a collection the fleet may not use, oversized and malformed payloads) adds nothing
and is counted; a fresh device reads the retained signed state; the bridge and devices work
over TLS (host-name verification: tests/test_mosquitto.py)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request

import numpy as np
import pytest
import yaml
from conftest import wait_for_n
from gateway_helpers import GatewayProcess
from kafka_helpers import read_dlq
from mqtt_helpers import FLEETS
from store_helpers import read_collection

from ldpstream.dev.mosquitto import FleetCreds
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.mqtt_client import AsyncPublisher, MqttError, connect, make_client, parse_mqtt_url
from ldpstream.names import mqtt_reports_topic
from ldpstream.producers.codec import encode_batch

pytestmark = pytest.mark.pipeline

DOM = Domain.from_categories({"os": ["android", "ios", "other"], "plan": ["free", "pro"]})


def setup(tmp_path, service_env, spawn_worker, cid: str, mqtt, *, ca=None):
    """A worker for ``cid``, a fleets file (phones: cid; sensors: elsewhere) and the bridge's
    environment; returns (config, worker, env)."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"collections": [{
        "id": cid, "schema": {"attributes": {a: list(DOM.categories(a)) for a in DOM.attrs}},
        "mechanism": "rr-ind", "epsilon": 1.0, "partitions": 3, "marginals": [["os", "plan"]],
        "estimators": ["castell"], "refresh_interval_s": 2.0}]}))
    fleets = tmp_path / "fleets.yaml"
    fleets.write_text(yaml.safe_dump({"fleets": {"phones": {"collections": [cid]},
                                                 "sensors": {"collections": ["elsewhere"]}}}))
    worker = spawn_worker(str(path))
    worker.wait_ready(60)
    env = dict(service_env, LDP_MQTT_URL=mqtt.bridge_url, LDP_MQTT_FLEETS_FILE=str(fleets),
               LDP_MQTT_CLIENT_ID=f"bridge-{cid}", LDP_MQTT_CA=str(ca or ""))
    from ldpstream.config import load_config
    return load_config(path).collections[cid], worker, env


def bridge(env, tmp_path, cid: str) -> GatewayProcess:
    from ldpstream.dev.process import free_port

    proc = GatewayProcess(env, free_port(), str(tmp_path / "bridge.log"), command=("mqtt-bridge",))
    proc.wait_for(cid)
    return proc


def metric(port: int, name: str, *labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith(name + "{") and all(x in l for x in labels))


async def devices(url: str, cid: str, n_devices: int, per_device: int, *, seed: int, ca=None,
                  first: int = 0, on_batch=None):
    """``n_devices`` SDK devices over MQTT, each sending ``per_device`` reports in batches of 4
    (states from the retained config topic); returns the expected counts and the number sent."""
    from ldpstream.producers.ledger import Ledger
    from ldpstream.producers.mqtt_transport import MqttConfigWatcher, MqttTransport
    from ldpstream.producers.sdk import DeviceClient

    watcher = await MqttConfigWatcher(url, "phones", [cid], ca=ca).start(30)
    mech = watcher.mechanisms[cid]
    rng = np.random.default_rng(seed)
    labels = {a: np.asarray(DOM.categories(a)) for a in DOM.attrs}
    reports = []

    async def one(dev: int) -> None:
        client = DeviceClient(cid, watcher=watcher, ledger=Ledger(":memory:"),
                              transport=MqttTransport(url, "phones", ca=ca, timeout_s=60),
                              device_id=dev, batch_size=4, rng=np.random.default_rng(seed + dev))
        for _ in range(per_device):
            res = await client.report({a: str(rng.choice(labels[a])) for a in DOM.attrs})
            if res.report is not None:
                reports.append(res.report)
            if on_batch is not None and client.sent_batches:
                await on_batch(client.sent_batches)
        await client.close()

    await asyncio.gather(*(one(first + d) for d in range(n_devices)))
    await watcher.stop()
    return mech, np.stack(reports)


async def check_counts(redis_url: str, coll, mech, reports) -> None:
    from ldpstream.agents.app import make_store

    specs = coll.tensors()
    expected = mech.count(reports, specs)
    store = make_store(redis_url)
    try:
        got_n = await wait_for_n(store, coll.id, len(reports), timeout=90)
        await asyncio.sleep(1.5)  # nothing beyond
        assert await store.n(coll.id, 16) == len(reports), got_n
        got = await read_collection(store, coll)
        for s in specs:
            np.testing.assert_array_equal(got[s.key], expected[s.key], err_msg=s.key)
    finally:
        await store.close()


def test_devices_over_mqtt_are_counted_exactly_and_bad_input_is_refused(
        tmp_path, mosquitto, kafka_broker, redis_server, spawn_worker, service_env, unique_name):
    cid = unique_name
    coll, worker, env = setup(tmp_path, service_env, spawn_worker, cid, mosquitto)
    proc = bridge(env, tmp_path, cid)
    url = mosquitto.url_for(FLEETS["phones"])
    try:
        mech, reports = asyncio.run(devices(url, cid, 12, 10, seed=3))
        asyncio.run(check_counts(redis_server.url, coll, mech, reports))
        assert metric(proc.port, "ldp_mqtt_reports_total", 'fleet="phones"') == len(reports)
        since = int(time.time() * 1000) - 1000

        async def refusals() -> None:
            # wrong credentials: refused at connect
            from ldpstream.producers.mqtt_transport import MqttTransport
            bad = MqttTransport(mosquitto.url_for(FleetCreds("phones", "wrong")), "phones")
            with pytest.raises(MqttError, match="(?i)not authorized|bad user"):
                await bad.send(cid, keyed(cid, 1), 1)
            # another fleet's prefix: Mosquitto's ACL refuses the publish (MQTT 5 reason code)
            forged = MqttTransport(url, "sensors")
            with pytest.raises(MqttError, match="(?i)not authorized"):
                await forged.send(cid, keyed(cid, 2), 2)
            await forged.close()
            # an unkeyed batch: the SDK's MQTT transport refuses to send it
            mqtt = MqttTransport(url, "phones")
            with pytest.raises(ValueError, match="batch key"):
                await mqtt.send(cid, encode_batch(cid, mech.version, reports[:1],
                                                  device_ids=np.array([5], np.uint64)), 5)
            await mqtt.close()
            # the bridge refuses what passes the broker: malformed, oversized, not allowed
            sensors = raw_publisher(mosquitto, "sensors")
            phones = raw_publisher(mosquitto, "phones")
            await phones.publish(mqtt_reports_topic("phones", cid), b"\x00garbage")
            await phones.publish(mqtt_reports_topic("phones", cid), b"{\"collection\": 1}")
            await phones.publish(mqtt_reports_topic("phones", cid), b"x" * (1_048_576 + 10))
            await sensors.publish(mqtt_reports_topic("sensors", cid), keyed(cid, 9, mech.version))
            # above Mosquitto's max_packet_size: the broker drops the connection
            with pytest.raises(MqttError):
                await phones.publish(mqtt_reports_topic("phones", cid), b"y" * (2 * 1_048_576 + 1),
                                     timeout_s=5)
            for p in (sensors, phones):
                p.client.disconnect()
                p.client.loop_stop()

        asyncio.run(refusals())
        dlq = []
        for _ in range(40):
            dlq = [r for r in read_dlq(kafka_broker.bootstrap, since_ms=since)
                   if r["topic"].startswith("ldp/")]
            if len(dlq) >= 4:
                break
            time.sleep(0.5)
        reasons = sorted(r["reason"] for r in dlq)
        assert len(reasons) == 4 and "too_large" in reasons and "forbidden" in reasons, reasons
        assert metric(proc.port, "ldp_mqtt_rejected_total", 'fleet="sensors"',
                      'reason="forbidden"') == 1
        assert metric(proc.port, "ldp_mqtt_rejected_total", 'fleet="phones"') == 3
        asyncio.run(check_counts(redis_server.url, coll, mech, reports))  # nothing added
        with urllib.request.urlopen(f"http://127.0.0.1:{proc.port}/healthz", timeout=5) as r:
            health = json.loads(r.read())
        assert health["mqtt"]["ok"] and health["broker"]["ok"], health
    finally:
        assert proc.stop() == 0


def keyed(cid: str, dev: int, version: int = 0) -> bytes:
    return encode_batch(cid, version, np.zeros((1, 2), np.int64),
                        device_ids=np.array([dev], np.uint64), key=(dev, 1))


def raw_publisher(svc, fleet: str) -> AsyncPublisher:
    ep = parse_mqtt_url(svc.url_for(FLEETS[fleet]))
    client = make_client(ep, f"raw-{fleet}", ca=None if svc.ca_path is None else str(svc.ca_path))
    connect(client, ep, persistent=False)
    return AsyncPublisher(client, asyncio.get_running_loop())


@pytest.mark.parametrize("subscription", ["shared", "exclusive"])
def test_bridge_sigkill_and_broker_restart_lose_nothing_count_nothing_twice(
        tmp_path, mosquitto, kafka_broker, redis_server, spawn_worker, service_env, unique_name,
        subscription):
    """SIGKILL of the bridge mid-stream (both subscriptions), then a Mosquitto restart
    (the exclusive subscription only: Mosquitto 2.0.11 does not restore shared subscriptions,
    producers/mqtt_bridge.py ``MqttBridge.subscription``)."""
    cid = unique_name
    coll, worker, env = setup(tmp_path, service_env, spawn_worker, cid, mosquitto)
    env["LDP_MQTT_SUBSCRIPTION"] = subscription
    procs = [bridge(env, tmp_path, cid)]
    url = mosquitto.url_for(FLEETS["phones"])
    events: dict[str, bool] = {}

    async def disrupt(batches: int) -> None:
        # mid-stream: the bridge dies without a goodbye, later the broker restarts
        if batches >= 3 and "killed" not in events:
            events["killed"] = True
            os.killpg(procs[-1].proc.pid, signal.SIGKILL)
            procs[-1].proc.wait(10)
            procs.append(await asyncio.to_thread(bridge, env, tmp_path, cid))
        elif batches >= 6 and "restarted" not in events and subscription == "exclusive":
            events["restarted"] = True
            await asyncio.to_thread(mosquitto.restart)

    try:
        mech, reports = asyncio.run(devices(url, cid, 8, 40, seed=11, on_batch=disrupt))
        assert events == ({"killed": True, "restarted": True} if subscription == "exclusive"
                          else {"killed": True})
        asyncio.run(check_counts(redis_server.url, coll, mech, reports))
    finally:
        assert procs[-1].stop() == 0


def test_tls_bridge_and_devices_verify_the_broker(tmp_path, mosquitto_tls, kafka_broker,
                                                  redis_server, spawn_worker, service_env,
                                                  unique_name):
    cid = unique_name
    ca = str(mosquitto_tls.ca_path)
    coll, worker, env = setup(tmp_path, service_env, spawn_worker, cid, mosquitto_tls, ca=ca)
    proc = bridge(env, tmp_path, cid)
    try:
        url = mosquitto_tls.url_for(FLEETS["phones"])
        mech, reports = asyncio.run(devices(url, cid, 3, 8, seed=5, ca=ca))
        asyncio.run(check_counts(redis_server.url, coll, mech, reports))
        assert metric(proc.port, "ldp_mqtt_reports_total", 'fleet="phones"') == len(reports)
    finally:
        assert proc.stop() == 0
