"""MQTT ingress as an operator meets it: ``ldpstream up --mqtt`` (a device uses the printed URL),
``ldpstream bench mqtt --quick``, and the bridge with its Kafka broker down (nothing
acknowledged, the message delivered again to a restarted bridge)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request

import pytest
import yaml
from mqtt_helpers import DOM, bridge, keyed, metric, raw_publisher, wait_health

from ldpstream.names import mqtt_reports_topic

pytestmark = pytest.mark.pipeline


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

            # the demo is under the SDK's default ceiling (8 per report): no override
            watcher = await MqttConfigWatcher(url, "devices", ["adult"]).start(60)
            rec = {a: watcher.mechanisms["adult"].domain.categories(a)[0]
                   for a in watcher.mechanisms["adult"].domain.attrs}
            for device in range(7, 12):  # memoized: one report per device and day counts
                client = DeviceClient("adult", watcher=watcher, ledger=Ledger(":memory:"),
                                      transport=MqttTransport(url, "devices"), device_id=device)
                assert (await client.report(rec)).status == "queued"
                assert (await client.report(rec)).status == "duplicate"
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
