"""Acknowledged equals counted (docs/security.md "Acknowledged equals counted"), on the real
broker, Redis and Mosquitto: with an intentionally lax broker (a device of another fleet may
read every fleet's reports and has learnt the bridges' group name), a shared-subscription spy
swallows its share of the reports the bridge acknowledges; the workers' reconciliation of what
the bridge acknowledged (``ldp.acks``) and what they took shows exactly that many reports as a
gap, in ``/healthz`` and ``ldp_ack_gap_reports``, within ACK_SETTLE_S + ACK_CHECK_S + 2 flushes
of the last acknowledgement (the alert ``AckedNotCounted`` fires 1 min later: promtool test in
dashboards/prometheus/tests/integrity.test.yml). Before, nothing showed it."""
from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from mqtt_helpers import BRIDGE, DOM, FLEETS, bridge, setup

from ldpstream.credentials.device_keys import DeviceCredential, derive_device_key
from ldpstream.dev.mosquitto import MosquittoService
from ldpstream.mqtt_client import connect, make_client, parse_mqtt_url
from ldpstream.names import ACK_CHECK_S, ACK_FLUSH_S, ACK_SETTLE_S
from ldpstream.producers.codec import decode_batch
from ldpstream.producers.mqtt_bridge import bridge_names

pytestmark = pytest.mark.pipeline

SECRET = "33" * 32


class LaxMosquitto(MosquittoService):
    """The test broker with one intentional hole: fleet sensors may read every report topic."""

    def _write_files(self):
        conf = super()._write_files()
        acl = self.dir / "acl"
        acl.write_text(acl.read_text() + "\nuser sensors\ntopic read ldp/+/+/reports\n"
                       "topic read $share/+/ldp/+/+/reports\n")
        return conf


def test_a_shared_subscription_spy_raises_the_gap_alarm(tmp_path, kafka_broker, redis_server,
                                                        spawn_worker, service_env, unique_name):
    from ldpstream.producers.ledger import Ledger
    from ldpstream.producers.mqtt_transport import MqttConfigWatcher, MqttTransport
    from ldpstream.producers.sdk import DeviceClient

    mqtt = LaxMosquitto(tmp_path / "mosquitto", fleets=FLEETS, bridge=BRIDGE)
    mqtt.start()
    secrets = {"LDP_DEVICE_SECRETS": json.dumps({"fleets": {"phones": {"secret": SECRET}}})}
    cid = unique_name
    coll, worker, env = setup(tmp_path, service_env,
                              lambda p: spawn_worker(p, env={**service_env, **secrets}), cid,
                              mqtt)
    proc = bridge(env, tmp_path, cid)
    group = bridge_names(env["LDP_MQTT_CLIENT_ID"], BRIDGE.password)[1]   # leaked, for the test
    swallowed: list[tuple[int, int, int]] = []   # (reports, device, sequence)
    sensors = parse_mqtt_url(mqtt.url_for(FLEETS["sensors"]))
    spy = make_client(sensors, "spy")

    def swallow(_c, _u, msg) -> None:
        b = decode_batch(bytes(msg.payload))
        swallowed.append((b.n, b.key[0], b.key[1]))
    spy.on_message = swallow
    connect(spy, sensors, persistent=True)
    spy.subscribe(f"$share/{group}/ldp/+/+/reports", qos=1)
    url = mqtt.url_for(FLEETS["phones"])

    async def run() -> int:
        watcher = await MqttConfigWatcher(url, "phones", [cid]).start(30)
        rng = np.random.default_rng(3)
        sent = 0
        for dev in range(8):
            cred = DeviceCredential("phones", dev, derive_device_key(bytes.fromhex(SECRET),
                                                                     "phones", dev))
            client = DeviceClient(cid, watcher=watcher, ledger=Ledger(":memory:"),
                                  transport=MqttTransport(url, "phones", timeout_s=60),
                                  credential=cred, batch_size=4)
            for _ in range(40):
                await client.report({a: str(rng.choice(DOM.categories(a))) for a in DOM.attrs})
            await client.close()
            sent += client.sent_reports
        await watcher.stop()
        return sent

    try:
        time.sleep(0.5)
        sent = asyncio.run(run())
        done = time.monotonic()
        bound = ACK_SETTLE_S + ACK_CHECK_S + 2 * ACK_FLUSH_S + 5
        lost = sum(n for n, _, _ in swallowed)
        # a device's batch s + 1 proves s was acknowledged: every swallowed batch but a
        # device's last (sequence 9 of 0..9) is detectable
        holes = sum(seq < 9 for _, _, seq in swallowed)
        acks: dict = {}
        while time.monotonic() - done < 15:
            acks = json.loads(worker.get("/healthz", any_status=True))["checks"].get("acks", {})
            if acks.get("missing_batches", {}).get(f"{cid}/phones") == holes:
                break
            time.sleep(0.5)
        alarm_s = time.monotonic() - done
        assert sent == 320 and holes > 0, (sent, swallowed)
        assert acks["missing_batches"] == {f"{cid}/phones": holes}, acks
        metrics = worker.get("/metrics")
        assert f'ldp_batches_missing_total{{collection="{cid}",fleet="phones"}} {float(holes)}' \
            in metrics
        # the bridge acknowledged what it received, and the workers took exactly that: the
        # reconciliation of ldp.acks agrees once settled (the loss is before the bridge)
        want = {"acked": 320 - lost, "taken": 320 - lost, "gap": 0}
        fleets: dict = {}
        while time.monotonic() - done < bound:
            fleets = json.loads(worker.get("/healthz", any_status=True))["checks"]["acks"]["fleets"]
            if fleets.get(f"{cid}/phones") == want:
                break
            time.sleep(1.0)
        assert fleets[f"{cid}/phones"] == want, fleets
        print(f"\n[acks] spy swallowed {len(swallowed)} batches ({lost} of {sent} reports "
              f"acknowledged to devices); {holes} missing batches shown {alarm_s:.1f} s after "
              f"the last acknowledgement")
    finally:
        spy.disconnect()
        spy.loop_stop()
        proc.stop()
        mqtt.stop()
