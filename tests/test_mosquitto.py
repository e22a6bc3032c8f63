"""The embedded Mosquitto (ldpstream/dev/mosquitto.py) as devices and the bridge see it: password
authentication, per-fleet ACLs (publish only under the own prefix, read only the own config),
retained messages and persistent sessions across a restart, and TLS with host-name
verification."""
from __future__ import annotations

import asyncio
import queue
import ssl

import pytest
from mqtt_helpers import BRIDGE, FLEETS

from ldpstream.dev.mosquitto import FleetCreds, MosquittoService
from ldpstream.errors import ServiceError
from ldpstream.mqtt_client import AsyncPublisher, MqttError, connect, make_client, parse_mqtt_url
from ldpstream.names import mqtt_config_topic, mqtt_reports_topic

pytestmark = pytest.mark.pipeline


def client(svc: MosquittoService, creds: FleetCreds, cid: str, *, persistent: bool = False,
           host: str | None = None):
    ep = parse_mqtt_url(svc.url_for(creds))
    if host is not None:
        ep = type(ep)(host, ep.port, ep.tls, ep.username, ep.password)
    c = make_client(ep, cid, ca=None if svc.ca_path is None else str(svc.ca_path))
    # set before connecting: a resumed session's queued messages arrive right after CONNACK
    c.user_data_set(queue.Queue())
    c.on_message = lambda _c, got, m: got.put((m.topic, m.payload, m.retain))
    connect(c, ep, persistent=persistent)
    return c


def subscribe(c, topic: str) -> "queue.Queue":
    """Subscribe and wait for the broker's SUBACK, so what happens next is delivered."""
    acked: queue.Queue = queue.Queue()
    c.on_subscribe = lambda _c, _userdata, mid, *_rest: acked.put(mid)
    _rc, mid = c.subscribe(topic, qos=1)
    while acked.get(timeout=10) != mid:
        pass
    return c.user_data_get()


def publish(c, topic: str, payload: bytes, *, retain: bool = False) -> None:
    async def go() -> None:
        await AsyncPublisher(c, asyncio.get_running_loop()).publish(topic, payload, retain=retain,
                                                                    timeout_s=10)
    asyncio.run(go())


def close(*clients) -> None:
    for c in clients:
        c.disconnect()
        c.loop_stop()


def test_passwords_acls_and_retained_config(mosquitto):
    with pytest.raises(MqttError, match="(?i)not authorized|bad user name"):
        client(mosquitto, FleetCreds("phones", "wrong-password"), "bad")
    bridge = client(mosquitto, BRIDGE, "bridge")
    seen = subscribe(bridge, "$share/ldp-bridge/" + mqtt_reports_topic("+", "+"))
    phone = client(mosquitto, FLEETS["phones"], "phone-1")
    publish(phone, mqtt_reports_topic("phones", "c1"), b"own prefix")
    assert seen.get(timeout=10)[:2] == (mqtt_reports_topic("phones", "c1"), b"own prefix")
    # another fleet's prefix: refused with MQTT 5 "Not authorized", nothing delivered
    with pytest.raises(MqttError, match="(?i)not authorized"):
        publish(phone, mqtt_reports_topic("sensors", "c1"), b"forged")
    # a fleet cannot publish configs; the bridge can, retained, and only that fleet reads it
    with pytest.raises(MqttError, match="(?i)not authorized"):
        publish(phone, mqtt_config_topic("phones", "c1"), b"forged state")
    publish(bridge, mqtt_config_topic("phones", "c1"), b"state-phones", retain=True)
    publish(bridge, mqtt_config_topic("sensors", "c1"), b"state-sensors", retain=True)
    fresh = client(mosquitto, FLEETS["phones"], "phone-2")
    configs = subscribe(fresh, mqtt_config_topic("+", "+"))
    assert configs.get(timeout=10) == (mqtt_config_topic("phones", "c1"), b"state-phones", True)
    with pytest.raises(queue.Empty):
        print(configs.get(timeout=1.0))
    assert seen.empty()
    close(bridge, phone, fresh)


def test_restart_keeps_persistent_sessions_and_retained(mosquitto):
    bridge = client(mosquitto, BRIDGE, "bridge-p", persistent=True)
    bridge.subscribe("$share/ldp-bridge/" + mqtt_reports_topic("+", "+"), qos=1)
    publish(bridge, mqtt_config_topic("phones", "c1"), b"state", retain=True)
    close(bridge)  # offline: the broker queues its messages
    phone = client(mosquitto, FLEETS["phones"], "phone-p")
    for i in range(5):
        publish(phone, mqtt_reports_topic("phones", "c1"), b"m%d" % i)
    close(phone)
    mosquitto.restart()
    bridge = client(mosquitto, BRIDGE, "bridge-p", persistent=True)
    got = subscribe(bridge, mqtt_config_topic("phones", "+"))
    received = sorted(got.get(timeout=10)[1] for _ in range(6))
    assert received == [b"m0", b"m1", b"m2", b"m3", b"m4", b"state"]
    close(bridge)


def test_tls_verifies_the_host_name(mosquitto_tls, tmp_path):
    assert mosquitto_tls.url.startswith("mqtts://localhost:")
    c = client(mosquitto_tls, FLEETS["phones"], "tls-ok")
    publish(c, mqtt_reports_topic("phones", "c1"), b"over tls")
    close(c)
    # the same certificate reached by a name it does not carry: refused by the client
    other = MosquittoService(tmp_path / "other", tls=True, fleets=FLEETS, bridge=BRIDGE,
                             tls_hosts=("mqtt.example.internal",))
    other.start()
    try:
        with pytest.raises(MqttError, match="(?i)certificate|hostname|SSL"):
            client(other, FLEETS["phones"], "tls-bad", host="127.0.0.1")
    finally:
        other.stop()
    # and a client without the test CA does not trust it
    ep = parse_mqtt_url(mosquitto_tls.url_for(FLEETS["phones"]))
    with pytest.raises((MqttError, ssl.SSLError)):
        connect(make_client(ep, "no-ca"), ep, persistent=False)


def test_a_broker_that_cannot_start_names_its_log(tmp_path):
    taken = MosquittoService(tmp_path / "a", fleets=FLEETS, bridge=BRIDGE)
    taken.start()
    try:
        clash = MosquittoService(tmp_path / "b", fleets=FLEETS, bridge=BRIDGE, port=taken.port,
                                 startup_timeout=5)
        with pytest.raises(ServiceError, match="log"):
            clash.start()
        clash.stop()
    finally:
        taken.stop()


@pytest.mark.timeout(120)  # a deadlock hangs the loop thread: only pytest-timeout ends it
def test_many_publishes_in_flight_all_get_their_puback(mosquitto):
    """Hundreds of QoS 1 publishes awaited at once (paho's network thread acknowledges while
    the loop thread publishes: no lock-order deadlock, every PUBACK reaches its publish)."""
    bridge = client(mosquitto, BRIDGE, "bridge-many")
    seen = subscribe(bridge, mqtt_reports_topic("+", "+"))
    phone = client(mosquitto, FLEETS["phones"], "phone-many")

    async def go() -> None:
        pub = AsyncPublisher(phone, asyncio.get_running_loop())
        await asyncio.wait_for(asyncio.gather(*(
            pub.publish(mqtt_reports_topic("phones", "c1"), b"%d" % i) for i in range(2000))), 60)

    asyncio.run(go())
    got = sorted(int(seen.get(timeout=10)[1]) for _ in range(2000))
    assert got == list(range(2000))
    close(bridge, phone)
