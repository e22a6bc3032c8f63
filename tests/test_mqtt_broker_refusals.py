"""What Mosquitto refuses itself, counted from its log on ``$SYS/broker/log/N``
(producers/mqtt_broker_log.py; docs/security.md, "Refusals the broker counts"): a real broker
(Debian's mosquitto 2.0.11, the embedded service's config), its log lines read by the bridge's
user, refusals made by real clients and raw MQTT 3.1.1 packets. The bridge process serves the
same counter: tests/test_mqtt_bridge.py."""
from __future__ import annotations

import asyncio
import queue
import socket
import struct
import time

import pytest
from mqtt_helpers import BRIDGE, FLEETS
from prometheus_client import CollectorRegistry

from ldpstream.dev.mosquitto import FleetCreds, MosquittoService
from ldpstream.mqtt_client import AsyncPublisher, MqttError, connect, make_client, parse_mqtt_url
from ldpstream.names import MQTT_BROKER_LOG_TOPIC, mqtt_reports_topic
from ldpstream.producers.mqtt_broker_log import BrokerLog, follow, refused_counter

pytestmark = pytest.mark.pipeline


def _utf(text: bytes) -> bytes:
    return struct.pack(">H", len(text)) + text


def _varint(n: int) -> bytes:
    out = b""
    while True:
        n, digit = divmod(n, 128)
        out += bytes([digit | (128 if n else 0)])
        if not n:
            return out


def raw_session(svc: MosquittoService, client_id: str, creds: FleetCreds) -> socket.socket:
    """An MQTT 3.1.1 connection made by hand (so packets the clients would not send can be
    sent); the broker's CONNACK must accept it."""
    sock = socket.create_connection(("127.0.0.1", svc.port), timeout=5)
    body = (_utf(b"MQTT") + bytes([4, 0xC2]) + struct.pack(">H", 60) + _utf(client_id.encode())
            + _utf(creds.username.encode()) + _utf(creds.password.encode()))
    sock.sendall(b"\x10" + _varint(len(body)) + body)
    assert sock.recv(4) == b"\x20\x02\x00\x00"
    return sock


def send_and_wait_close(sock: socket.socket, packet: bytes) -> None:
    """Send ``packet`` and wait until the broker has closed the connection."""
    try:
        sock.sendall(packet)
        while sock.recv(4096):
            pass
    except OSError:
        pass  # reset by the broker: closed too
    sock.close()


def publish_packet(topic: bytes, payload: bytes) -> bytes:
    """A QoS 0 PUBLISH of ``payload`` on ``topic`` (no validity check: it may be refused)."""
    rest = _utf(topic) + payload
    return b"\x30" + _varint(len(rest)) + rest


def oversize_and_malformed(svc: MosquittoService) -> None:
    """phones: one packet over ``max_packet_size``; sensors: a publish to a wildcard topic
    (protocol error) and a packet whose topic length runs past its end (malformed)."""
    topic = mqtt_reports_topic("phones", "c1").encode()
    send_and_wait_close(raw_session(svc, "phones-big", FLEETS["phones"]),
                        publish_packet(topic, b"x" * (svc.max_packet_size + 1)))
    send_and_wait_close(raw_session(svc, "sensors-wild", FLEETS["sensors"]),
                        publish_packet(b"ldp/sensors/#/reports", b"x"))
    send_and_wait_close(raw_session(svc, "sensors-short", FLEETS["sensors"]),
                        b"\x30\x03\x00\x09a")


@pytest.fixture
def small_broker(tmp_path):
    svc = MosquittoService(tmp_path / "mq", fleets=FLEETS, bridge=BRIDGE, max_packet_size=4096)
    svc.start()
    yield svc
    svc.stop()


def _counts(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {(s.labels["fleet"], s.labels["reason"]): s.value
            for m in registry.collect() for s in m.samples if s.name.endswith("_total")}


def test_refusals_on_the_broker_log_are_counted_per_fleet(small_broker):
    registry = CollectorRegistry()
    log = BrokerLog(set(FLEETS), refused_counter(registry))
    lines: queue.Queue[str] = queue.Queue()
    ep = parse_mqtt_url(small_broker.url_for(BRIDGE))
    reader = make_client(ep, "log-reader")
    reader.on_message = lambda _c, _u, m: lines.put(m.payload.decode())
    connect(reader, ep, persistent=False)
    reader.subscribe(MQTT_BROKER_LOG_TOPIC, qos=0)
    time.sleep(0.5)
    try:
        with pytest.raises(MqttError, match="(?i)not authori|bad user"):
            bad = parse_mqtt_url(small_broker.url_for(FleetCreds("phones", "wrong")))
            connect(make_client(bad, "phones-wrong"), bad, persistent=False)
        oversize_and_malformed(small_broker)
        # another fleet's prefix: refused by the ACL, logged at debug level only (never on
        # $SYS/broker/log), so not counted from the topic
        phone = make_client(parse_mqtt_url(small_broker.url_for(FLEETS["phones"])), "phone-acl")
        connect(phone, parse_mqtt_url(small_broker.url_for(FLEETS["phones"])), persistent=False)
        phone.publish(mqtt_reports_topic("sensors", "c1"), b"forged", qos=1).wait_for_publish(5)
        phone.disconnect()
        phone.loop_stop()
        want = {("-", "bad_credentials"): 1.0, ("phones", "too_large"): 1.0,
                ("sensors", "malformed_packet"): 2.0}
        deadline = time.monotonic() + 10
        while _counts(registry) != want and time.monotonic() < deadline:
            try:
                log.feed(lines.get(timeout=0.2))
            except queue.Empty:
                pass
        assert _counts(registry) == want
    finally:
        reader.disconnect()
        reader.loop_stop()


def test_the_debug_line_of_a_denied_publish_names_its_fleet():
    """Mosquitto 2.0.11's own lines (timestamp prefix included), as its log file has them with
    ``log_type debug``: the user of the client id is remembered from its connect line."""
    registry = CollectorRegistry()
    log = BrokerLog({"phones"}, refused_counter(registry))
    assert log.feed("1795677815: New client connected from 127.0.0.1:43716 as dev-acl "
                    "(p5, c1, k60, u'phones').") is None
    assert log.feed("1795677815: Denied PUBLISH from dev-acl (d0, q1, r0, m1, "
                    "'ldp/sensors/c1/reports', ... (1 bytes))") == "not_authorized"
    assert log.feed("1795677815: Client dev-acl disconnected.") is None
    assert log.feed("1795677816: Client dev-acl disconnected due to oversize packet.") \
        == "too_large"  # forgotten after its disconnect: no fleet any more
    assert _counts(registry) == {("phones", "not_authorized"): 1.0, ("-", "too_large"): 1.0}


def test_the_broker_log_file_gives_the_acl_denied_publish_with_its_fleet(tmp_path):
    """Opt-in: Mosquitto logging at debug level to a file the bridge reads (``--broker-log``):
    a publish under another fleet's prefix counts as ``not_authorized`` for the publisher's
    fleet; the refusals the topic already gives are not counted a second time."""
    svc = MosquittoService(tmp_path / "dbg", fleets=FLEETS, bridge=BRIDGE, debug_log=True)
    svc.start()
    registry = CollectorRegistry()
    log = BrokerLog(set(FLEETS), refused_counter(registry), count=("not_authorized",))
    status: list[str] = []

    async def go() -> None:
        assert svc.log_path is not None
        task = asyncio.create_task(follow(svc.log_path, log, poll_s=0.05, status=status.append))
        while not status:
            await asyncio.sleep(0.05)
        assert status[-1] == "following"
        ep = parse_mqtt_url(svc.url_for(FLEETS["phones"]))
        phone = make_client(ep, "phone-forger")
        await asyncio.to_thread(connect, phone, ep, persistent=False)
        with pytest.raises(MqttError, match="(?i)not authorized"):
            await AsyncPublisher(phone, asyncio.get_running_loop()).publish(
                mqtt_reports_topic("sensors", "c1"), b"forged", timeout_s=10)
        phone.disconnect()
        phone.loop_stop()
        with pytest.raises(MqttError):
            bad = parse_mqtt_url(svc.url_for(FleetCreds("sensors", "wrong")))
            await asyncio.to_thread(connect, make_client(bad, "sensors-wrong"), bad,
                                    persistent=False)
        for _ in range(100):
            if _counts(registry):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # the wrong password's lines are in the file by now too
        task.cancel()

    try:
        asyncio.run(go())
    finally:
        svc.stop()
    assert _counts(registry) == {("phones", "not_authorized"): 1.0}


def test_the_bridge_counts_acl_denied_publishes_from_the_broker_log_file(
        tmp_path, kafka_broker, redis_server, spawn_worker, service_env, unique_name):
    """``mqtt-bridge`` with ``LDP_MQTT_BROKER_LOG_FILE`` (``--broker-log``): the forged publish
    shows in its ``/metrics`` with the forger's fleet, and ``/healthz`` says the file is read."""
    from mqtt_helpers import bridge, metric, setup, wait_health

    svc = MosquittoService(tmp_path / "dbg", fleets=FLEETS, bridge=BRIDGE, debug_log=True)
    svc.start()
    try:
        _coll, _worker, env = setup(tmp_path, service_env, spawn_worker, unique_name, svc)
        assert svc.log_path is not None
        proc = bridge(dict(env, LDP_MQTT_BROKER_LOG_FILE=svc.log_path), tmp_path, unique_name)
        try:
            health = wait_health(proc.port, 200)
            assert health["broker_log"]["file_detail"] == "following", health
            assert health["broker_log"]["ok"], health
            phone = make_client(parse_mqtt_url(svc.url_for(FLEETS["phones"])), "phone-forger")
            connect(phone, parse_mqtt_url(svc.url_for(FLEETS["phones"])), persistent=False)
            phone.publish(mqtt_reports_topic("sensors", unique_name), b"forged",
                          qos=1).wait_for_publish(5)
            phone.disconnect()
            phone.loop_stop()
            labels = ('fleet="phones"', 'reason="not_authorized"')
            for _ in range(40):
                if metric(proc.port, "ldp_mqtt_broker_refused_total", *labels):
                    break
                time.sleep(0.25)
            assert metric(proc.port, "ldp_mqtt_broker_refused_total", *labels) == 1
            assert metric(proc.port, "ldp_mqtt_broker_refused_total") == 1
        finally:
            assert proc.stop() == 0
    finally:
        svc.stop()
