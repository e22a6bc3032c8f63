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
    from ldpstream.dev.mqtt_stack import read_metric

    return read_metric(f"http://127.0.0.1:{port}", name, *labels)


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

        async def json_form_and_relay() -> np.ndarray:
            # the JSON form of a keyed batch is accepted, so is a batch whose device id is
            # given beside it; the state is relayed only to the
            # fleets allowed the collection (sensors: "elsewhere" only)
            from ldpstream.mqtt_client import connect, make_client, parse_mqtt_url
            from ldpstream.names import mqtt_config_topic
            from ldpstream.producers.codec import batch_to_json, decode_batch

            extra = np.array([[0, 1], [2, 0]], dtype=np.int64)
            batch = decode_batch(encode_batch(cid, mech.version, extra,
                                              device_ids=np.full(2, 77, np.uint64), key=(77, 1)))
            phones = raw_publisher(mosquitto, "phones")
            await phones.publish(mqtt_reports_topic("phones", cid),
                                 batch_to_json(batch).encode())
            # a batch without device ids: the MQTT 5 user property device-id gives them
            await phones.publish(mqtt_reports_topic("phones", cid),
                                 encode_batch(cid, mech.version, extra, key=(78, 1)),
                                 user_properties={"device-id": "78"})
            ep = parse_mqtt_url(mosquitto.url_for(FLEETS["sensors"]))
            sensors = make_client(ep, "sensors-config")
            got: list = []
            sensors.on_message = lambda _c, _u, m: got.append(m.topic)
            connect(sensors, ep, persistent=False)
            sensors.subscribe(mqtt_config_topic("sensors", "+"), qos=1)
            await asyncio.sleep(1.0)
            assert got == [], got
            for c in (phones.client, sensors):
                c.disconnect()
                c.loop_stop()
            return np.concatenate([extra, extra])

        reports = np.concatenate([reports, asyncio.run(json_form_and_relay())])
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
        asyncio.run(check_counts(redis_server.url, coll, mech, reports))  # only the JSON batch
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


def test_two_bridges_split_the_messages_and_the_counts_stay_exact(
        tmp_path, mosquitto, kafka_broker, redis_server, spawn_worker, service_env, unique_name):
    """Bridges with distinct client ids in the shared subscription group scale out: each takes
    a share, the counts are exact."""
    cid = unique_name
    coll, worker, env = setup(tmp_path, service_env, spawn_worker, cid, mosquitto)
    procs = []
    for i in range(2):
        (tmp_path / str(i)).mkdir()
        procs.append(bridge(dict(env, LDP_MQTT_CLIENT_ID=f"bridge-{i}-{cid}"), tmp_path / str(i),
                            cid))
    try:
        mech, reports = asyncio.run(devices(mosquitto.url_for(FLEETS["phones"]), cid, 8, 12,
                                            seed=21))
        asyncio.run(check_counts(redis_server.url, coll, mech, reports))
        shares = [metric(p.port, "ldp_mqtt_reports_total") for p in procs]
        assert sum(shares) == len(reports) and min(shares) > 0, shares
    finally:
        for p in procs:
            assert p.stop() == 0


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
        # /healthz checks the MQTT session for real: 503 JSON while the broker is down
        mosquitto_tls.crash()
        health = wait_health(proc.port, 503)
        assert not health["mqtt"]["ok"] and health["broker"]["ok"], health
        mosquitto_tls.start()
        assert wait_health(proc.port, 200)["mqtt"]["ok"]
    finally:
        assert proc.stop() == 0


def wait_health(port: int, status: int, timeout: float = 30.0) -> dict:
    import urllib.error

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                got, body = r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            got, body = exc.code, json.loads(exc.read())
        if got == status or time.monotonic() > deadline:
            assert got == status, body
            return body
        time.sleep(0.2)


def test_up_mqtt_prints_how_a_device_connects_and_its_reports_are_counted(tmp_path):
    """``ldpstream up --mqtt --no-fleet``: the printed URL and topic take a device's batch."""
    import re
    import subprocess
    import sys

    from ldpstream.dev.process import free_port

    port = free_port()
    log = open(tmp_path / "up.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "ldpstream.cli", "up", "--mqtt", "--no-fleet",
                             "--web-port", str(port), "--duration", "120"], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            env={k: v for k, v in os.environ.items()
                                 if k not in ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL")})
    try:
        deadline = time.monotonic() + 120
        url = None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            found = re.search(r"MQTT: +(mqtt://\S+)", (tmp_path / "up.log").read_text())
            url = found.group(1) if found else None
        assert url, (tmp_path / "up.log").read_text()[-3000:]

        async def send() -> None:
            from ldpstream.producers.ledger import Ledger
            from ldpstream.producers.mqtt_transport import MqttConfigWatcher, MqttTransport
            from ldpstream.producers.sdk import DeviceClient

            watcher = await MqttConfigWatcher(url, "devices", ["adult"], max_epsilon=None).start(60)
            client = DeviceClient("adult", watcher=watcher, ledger=Ledger(":memory:"),
                                  transport=MqttTransport(url, "devices"), batch_size=5,
                                  max_epsilon=100.0, device_id=7)
            rec = {a: watcher.mechanisms["adult"].domain.categories(a)[0]
                   for a in watcher.mechanisms["adult"].domain.attrs}
            for _ in range(5):
                await client.report(rec)
            await client.close()
            await watcher.stop()

        asyncio.run(send())
        deadline = time.monotonic() + 60
        n = 0
        while n < 5 and time.monotonic() < deadline:
            try:  # the worker's API may not listen yet
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/collections/adult",
                                            timeout=5) as r:
                    n = json.loads(r.read())["n"]
            except OSError:
                pass
            time.sleep(0.5)
        assert n == 5
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0


def test_bench_mqtt_quick_runs(monkeypatch):
    """``ldpstream bench mqtt --quick`` on its own embedded services: every message through the
    bridge and every probe counted (it raises otherwise), rates and latencies positive."""
    from ldpstream.bench.mqtt import run

    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    res = asyncio.run(run(quick=True))
    assert [r["reports_per_message"] for r in res["results"]] == [1, 100]
    for r in res["results"]:
        assert r["bridge_messages_per_s"] > 0 and r["bare_messages_per_s"] > 0 and r["ratio"] > 0
    assert 0 < res["latency_p50_s"] <= res["latency_p99_s"]


def test_no_mqtt_ack_while_kafka_is_down(tmp_path, mosquitto, unique_name):
    """With Kafka down the bridge acknowledges nothing: /healthz is 503 naming the broker, the
    produce is retried; a bridge SIGKILLed then, started again once Kafka is back, gets the
    message again from its session and produces it (the message reaches Kafka)."""
    from aiokafka import AIOKafkaConsumer

    from ldpstream.dev.broker import EmbeddedBroker
    from ldpstream.estimators.families.rr import RRIndependent
    from ldpstream.names import COMPACTED_TOPICS, CONFIG_TOPIC, SERVICE_TOPICS, reports_topic
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.signing import load_signing_key

    cid = unique_name
    kafka = EmbeddedBroker()

    def start_kafka() -> None:  # Tansu keeps nothing: topics and the signed state again
        kafka.start()
        kafka.create_topics({**SERVICE_TOPICS, reports_topic(cid): 1}, COMPACTED_TOPICS)

        async def publish_state() -> None:
            key = load_signing_key()
            assert key is not None
            async with Publisher(kafka.bootstrap) as pub:
                await pub.send_and_wait(CONFIG_TOPIC, key.sign_state(
                    RRIndependent(DOM, epsilon=1.0).state(), cid), key=cid.encode())
        asyncio.run(publish_state())

    async def produced() -> int:
        c = AIOKafkaConsumer(reports_topic(cid), bootstrap_servers=kafka.bootstrap,
                             group_id=None, auto_offset_reset="earliest")
        await c.start()
        try:
            return sum(len(v) for v in (await c.getmany(timeout_ms=3000)).values())
        finally:
            await c.stop()

    start_kafka()
    fleets = tmp_path / "fleets.yaml"
    fleets.write_text(yaml.safe_dump({"fleets": {"phones": {"collections": [cid]}}}))
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka.bootstrap,
               LDP_MQTT_URL=mosquitto.bridge_url, LDP_MQTT_FLEETS_FILE=str(fleets),
               LDP_MQTT_CLIENT_ID=f"bridge-{cid}")
    proc = bridge(env, tmp_path, cid)
    try:
        kafka.crash()
        health = wait_health(proc.port, 503)
        assert not health["broker"]["ok"] and health["mqtt"]["ok"], health

        async def send() -> None:
            phones = raw_publisher(mosquitto, "phones")
            await phones.publish(mqtt_reports_topic("phones", cid), keyed(cid, 5))
            phones.client.disconnect()
            phones.client.loop_stop()
        asyncio.run(send())
        deadline = time.monotonic() + 30
        while metric(proc.port, "ldp_mqtt_kafka_retries_total") < 2:
            assert time.monotonic() < deadline, "the bridge did not retry"
            time.sleep(0.2)
        assert metric(proc.port, "ldp_mqtt_messages_total") == 0
        os.killpg(proc.proc.pid, signal.SIGKILL)  # dies with the message unacknowledged
        proc.proc.wait(10)
        proc.stop()
        start_kafka()
        proc = bridge(env, tmp_path, cid)
        deadline = time.monotonic() + 30
        while metric(proc.port, "ldp_mqtt_messages_total") < 1:
            assert time.monotonic() < deadline, "the message was not delivered again"
            time.sleep(0.2)
        assert asyncio.run(produced()) == 1
    finally:
        proc.stop()
        kafka.stop()
