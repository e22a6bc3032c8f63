"""``ldpstream mqtt-bridge`` end to end: devices (the SDK's MQTT transport) → Mosquitto (Debian,
passwords and ACLs) → bridge (child process) → Kafka → worker → Redis. Counts are exact,
including across a bridge killed with SIGKILL mid-stream and a Mosquitto restart (persistent
sessions: nothing lost, nothing counted twice); refused input (wrong credentials, another
fleet's prefix, a collection the fleet may not use, oversized and malformed payloads) adds nothing
and is counted (the broker's own refusals too, from its log); a fresh device reads the retained
signed state; two bridges share the load; the
bridge and devices work over TLS (host-name verification: tests/test_mosquitto.py).
Helpers: tests/mqtt_helpers.py; up --mqtt, bench mqtt and Kafka down: tests/test_mqtt_ops.py."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request

import numpy as np
import pytest
from kafka_helpers import read_dlq
from mqtt_helpers import (
    FLEETS,
    bridge,
    check_counts,
    devices,
    keyed,
    metric,
    raw_publisher,
    setup,
    wait_health,
)
from test_mqtt_broker_refusals import publish_packet, raw_session, send_and_wait_close

from ldpstream.dev.mosquitto import FleetCreds
from ldpstream.mqtt_client import MqttError
from ldpstream.names import mqtt_reports_topic
from ldpstream.producers.codec import encode_batch

pytestmark = pytest.mark.pipeline


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
            from ldpstream.names import mqtt_config_topic, mqtt_public_key_topic
            from ldpstream.producers.codec import batch_to_json, decode_batch
            from ldpstream.producers.signing import VerifyKey, load_verify_key

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
            # the verifying key, retained per fleet: a phones device reads its own fleet's only
            keys: list = []
            reader = make_client(parse_mqtt_url(url), "phones-key")
            reader.on_message = lambda _c, _u, m: keys.append((m.topic, json.loads(m.payload)))
            connect(reader, parse_mqtt_url(url), persistent=False)
            reader.subscribe("ldp/+/public-key", qos=1)
            await asyncio.sleep(1.0)
            assert got == [], got
            assert [t for t, _ in keys] == [mqtt_public_key_topic("phones")], keys
            doc = keys[0][1]
            key = VerifyKey.from_text(doc["public_key"])
            assert doc == {"alg": "ed25519", "public_key": key.to_text(), "key_id": key.key_id,
                           "fingerprint": key.fingerprint}
            assert key.key_id == load_verify_key().key_id  # the key the bridge pinned
            for c in (phones.client, sensors, reader):
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
        # what the broker refused itself, from its log: the wrong password (fleet "-": Mosquitto
        # logs a refused CONNECT without its user), the packet over max_packet_size, and a
        # malformed packet; the other fleet's prefix is logged at debug level only
        send_and_wait_close(raw_session(mosquitto, "sensors-wild", FLEETS["sensors"]),
                            publish_packet(b"ldp/sensors/#/reports", b"x"))
        want = {('fleet="-"', 'reason="bad_credentials"'): 1.0,
                ('fleet="sensors"', 'reason="malformed_packet"'): 1.0}
        big = ('fleet="phones"', 'reason="too_large"')
        for _ in range(40):
            got = {k: metric(proc.port, "ldp_mqtt_broker_refused_total", *k) for k in want}
            if got == want and metric(proc.port, "ldp_mqtt_broker_refused_total", *big):
                break
            time.sleep(0.25)
        assert got == want
        # paho resends the oversized QoS 1 publish on each reconnect until it is stopped: each
        # attempt is refused, and counted
        too_large = metric(proc.port, "ldp_mqtt_broker_refused_total", *big)
        assert too_large >= 1
        assert metric(proc.port, "ldp_mqtt_broker_refused_total") == sum(want.values()) + too_large
        asyncio.run(check_counts(redis_server.url, coll, mech, reports))  # only the JSON batch
        with urllib.request.urlopen(f"http://127.0.0.1:{proc.port}/healthz", timeout=5) as r:
            health = json.loads(r.read())
        assert health["mqtt"]["ok"] and health["broker"]["ok"], health
        assert health["broker_log"]["ok"] and health["broker_log"]["detail"] == "subscribed", \
            health
    finally:
        assert proc.stop() == 0


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


def test_a_retired_bridge_hands_over_its_share(
        tmp_path, mosquitto, kafka_broker, redis_server, spawn_worker, service_env, unique_name):
    """Mosquitto keeps assigning a stopped member of the shared group its share; ``mqtt-bridge
    --retire`` under that client id handles what its session holds and ends it, so later
    messages all go to the bridge that stays. Counts exact throughout."""
    import subprocess
    import sys

    cid = unique_name
    coll, worker, env = setup(tmp_path, service_env, spawn_worker, cid, mosquitto)
    stays = bridge(dict(env, LDP_MQTT_CLIENT_ID=f"stays-{cid}"), tmp_path, cid)
    (tmp_path / "g").mkdir()
    leaves_env = dict(env, LDP_MQTT_CLIENT_ID=f"leaves-{cid}")
    leaves = bridge(leaves_env, tmp_path / "g", cid)
    url = mosquitto.url_for(FLEETS["phones"])
    try:
        assert leaves.stop() == 0  # its session stays, and keeps getting a share
        mech, first = asyncio.run(devices(url, cid, 4, 8, seed=31))
        done = subprocess.run([sys.executable, "-m", "ldpstream.cli", "mqtt-bridge", "--retire"],
                              env=leaves_env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "retired" in done.stderr, done.stderr[-2000:]
        before = metric(stays.port, "ldp_mqtt_reports_total")
        assert 0 < before < len(first)  # the retired session held the rest
        _, second = asyncio.run(devices(url, cid, 4, 8, seed=32, first=100))
        reports = np.concatenate([first, second])
        asyncio.run(check_counts(redis_server.url, coll, mech, reports))
        assert metric(stays.port, "ldp_mqtt_reports_total") - before == len(second)
    finally:
        assert stays.stop() == 0
