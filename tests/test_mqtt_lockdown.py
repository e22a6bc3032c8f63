"""Who may take what on the real Mosquitto (docs/security.md "MQTT: who may take what"): a
device of another fleet, holding only its fleet's MQTT password, neither swallows reports by
joining the bridges' shared-subscription group nor takes over the bridge's session by its
client id. Before, three spies in ``$share/ldp-bridge/...`` took three quarters of the messages
(acknowledged to the devices, dropped by the read ACL) and a client connecting as the bridge's
configured client id took its session over: reports PUBACKed and never counted."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
from mqtt_helpers import FLEETS, bridge, check_counts, devices, setup
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ldpstream.mqtt_client import connect, make_client, parse_mqtt_url

pytestmark = pytest.mark.pipeline

SPY_TOPICS = ("$share/ldp-bridge/ldp/+/+/reports", "ldp/+/+/reports",
              "$share/ldp-bridge/ldp/phones/+/reports")


def test_spies_and_a_client_id_thief_take_nothing(tmp_path, mosquitto, kafka_broker,
                                                  redis_server, spawn_worker, service_env,
                                                  unique_name):
    """Three spies of fleet sensors subscribe to the bridges' well-known group (and the plain
    topic) before the devices start; a thief of fleet sensors connects with the bridge's
    configured client id five times, with a persistent session, while 8 devices of fleet phones
    send 320 reports over MQTT. Every report is counted exactly, the spies and the thief receive
    no message, and the bridge's session stays up."""
    cid = unique_name
    coll, worker, env = setup(tmp_path, service_env, spawn_worker, cid, mosquitto)
    proc = bridge(env, tmp_path, cid)
    sensors = parse_mqtt_url(mosquitto.url_for(FLEETS["sensors"]))
    received: list[str] = []
    spies = []
    for i in range(3):
        spy = make_client(sensors, f"spy-{i}")
        spy.on_message = lambda _c, _u, msg: received.append(msg.topic)
        connect(spy, sensors, persistent=True)
        spy.subscribe([(t, 1) for t in SPY_TOPICS])
        spies.append(spy)
    stop = threading.Event()
    takeovers: list[bool] = []

    def thief() -> None:
        # the id compose gives its bridge (LDP_MQTT_CLIENT_ID), known to anyone reading it
        for _ in range(5):
            if stop.is_set():
                return
            c = make_client(sensors, env["LDP_MQTT_CLIENT_ID"])
            c.on_message = lambda _c, _u, msg: received.append(msg.topic)
            takeovers.append(connect(c, sensors, persistent=True))   # session_present
            time.sleep(0.6)
            props = Properties(PacketTypes.DISCONNECT)
            props.SessionExpiryInterval = 0   # so the next attempt finds only the bridge's
            c.disconnect(properties=props)
            c.loop_stop()

    t = threading.Thread(target=thief)
    try:
        time.sleep(0.5)   # the spies' subscriptions are in place
        t.start()
        mech, reports = asyncio.run(devices(mosquitto.url_for(FLEETS["phones"]), cid, 8, 40,
                                            seed=5))
        t.join(30)
        asyncio.run(check_counts(redis_server.url, coll, mech, reports))
        assert len(reports) == 320
        assert received == []
        assert len(takeovers) == 5 and not any(takeovers)   # never the bridge's session
    finally:
        stop.set()
        for spy in spies:
            spy.disconnect()
            spy.loop_stop()
        assert proc.stop() == 0
