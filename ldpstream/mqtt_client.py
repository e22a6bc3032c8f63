"""MQTT connections of the bridge, the device SDK's MQTT transport and ``bench mqtt``
(docs/devices.md, "MQTT"): URL parsing, a configured paho-mqtt client (MQTT 5, TLS with host-name
verification, persistent sessions) and an asyncio view of its publishes.

``mqtt://user:pass@host:port`` is plain TCP (port 1883 by default), ``mqtts://...`` is TLS (8883);
the certificate is verified against ``ca`` (a PEM file; None: the system's trust store) and its
subject alternative names must contain ``host``.
"""
from __future__ import annotations

import asyncio
import ssl
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from ldpstream.errors import CliError

__all__ = ["MqttEndpoint", "MqttError", "parse_mqtt_url", "make_client", "connect",
           "AsyncPublisher", "SESSION_EXPIRY_S"]

#: a persistent session (bridge, devices) is kept by the broker this long while disconnected
SESSION_EXPIRY_S = 7 * 86_400


class MqttError(RuntimeError):
    """An MQTT connection or publish failed; ``reason`` is the broker's reason (e.g. ``Not
    authorized``, ``Bad user name or password``) or the client's error."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


@dataclass(frozen=True)
class MqttEndpoint:
    """Where and as whom to connect."""

    host: str
    port: int
    tls: bool
    username: str | None = None
    password: str | None = None

    def __str__(self) -> str:  # never the password
        user = f"{self.username}@" if self.username else ""
        return f"{'mqtts' if self.tls else 'mqtt'}://{user}{self.host}:{self.port}"


def parse_mqtt_url(url: str, source: str = "--mqtt-url") -> MqttEndpoint:
    """``mqtt://[user[:pass]@]host[:port]`` or ``mqtts://...`` → :class:`MqttEndpoint`; a bad URL
    raises :class:`~ldpstream.errors.CliError` naming ``source``."""
    parts = urlsplit(url)
    if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
        raise CliError(f"{source}: {url.split('@')[-1]!r} must look like mqtt://user:pass@host:port "
                       f"or mqtts://user:pass@host:port")
    try:
        port = parts.port
    except ValueError:
        raise CliError(f"{source}: the port of {url.split('@')[-1]!r} is not a number") from None
    tls = parts.scheme == "mqtts"
    return MqttEndpoint(parts.hostname, port or (8883 if tls else 1883), tls,
                        unquote(parts.username) if parts.username else None,
                        unquote(parts.password) if parts.password is not None else None)


def make_client(endpoint: MqttEndpoint, client_id: str, *, ca: str | None = None,
                manual_ack: bool = False) -> paho.Client:
    """A paho client (MQTT 5) with credentials and TLS set, not connected yet."""
    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv5)
    if endpoint.username is not None:
        client.username_pw_set(endpoint.username, endpoint.password)
    if endpoint.tls:
        client.tls_set(ca_certs=ca, cert_reqs=ssl.CERT_REQUIRED, tls_version=ssl.PROTOCOL_TLS_CLIENT)
        client.tls_insecure_set(False)
    client.manual_ack_set(manual_ack)
    client.reconnect_delay_set(min_delay=1, max_delay=5)
    return client


def connect(client: paho.Client, endpoint: MqttEndpoint, *, persistent: bool,
            timeout_s: float = 10.0, keepalive: int = 30,
            receive_maximum: int | None = None) -> bool:
    """Connect and start the client's network thread; wait for the broker's CONNACK. Returns
    whether the broker still had a session for this client id (``session_present``); the
    client's own ``on_connect`` (restored afterwards) sees reconnects, not this first one. A refusal
    (wrong credentials, TLS failure, timeout) raises :class:`MqttError` and stops the thread."""
    done = threading.Event()
    answer: dict[str, Any] = {}

    def on_connect(_c: Any, _u: Any, flags: Any, reason: ReasonCode, _p: Any) -> None:
        answer.setdefault("reason", reason)
        answer.setdefault("session", bool(flags.session_present))
        done.set()

    previous = client.on_connect
    client.on_connect = on_connect
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = SESSION_EXPIRY_S if persistent else 0
    if receive_maximum is not None:  # QoS 1 messages the broker may send unacknowledged
        props.ReceiveMaximum = receive_maximum
    try:
        client.connect(endpoint.host, endpoint.port, keepalive=keepalive,
                       clean_start=not persistent, properties=props)
    except (OSError, ssl.SSLError) as exc:
        raise MqttError(f"cannot connect to {endpoint}: {exc.__class__.__name__}: {exc}",
                        exc.__class__.__name__) from None
    client.loop_start()
    if not done.wait(timeout_s):
        client.loop_stop()
        raise MqttError(f"no CONNACK from {endpoint} within {timeout_s:g} s", "timeout")
    client.on_connect = previous
    reason = answer["reason"]
    if reason.is_failure:
        client.disconnect()
        client.loop_stop()
        raise MqttError(f"{endpoint} refused the connection: {reason}", str(reason))
    return bool(answer["session"])


class AsyncPublisher:
    """Await QoS 1 publishes of a connected paho client from asyncio: :meth:`publish` returns
    once the broker's PUBACK arrived and raises :class:`MqttError` when its reason code is a
    failure (MQTT 5: ``Not authorized`` for a topic outside the client's ACL)."""

    def __init__(self, client: paho.Client, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: dict[int, asyncio.Future[ReasonCode]] = {}
        self._early: dict[int, ReasonCode] = {}
        client.on_publish = self._on_publish

    def _on_publish(self, _c: Any, _u: Any, mid: int, reason: ReasonCode, _p: Any) -> None:
        with self._lock:
            fut = self._pending.pop(mid, None)
            if fut is None:
                self._early[mid] = reason
                return
        self.loop.call_soon_threadsafe(_resolve, fut, reason)

    async def publish(self, topic: str, payload: bytes, *, retain: bool = False,
                      timeout_s: float = 30.0) -> None:
        fut: asyncio.Future[ReasonCode] = self.loop.create_future()
        with self._lock:
            info = self.client.publish(topic, payload, qos=1, retain=retain)
            if info.rc != paho.MQTT_ERR_SUCCESS and info.rc != paho.MQTT_ERR_NO_CONN:
                raise MqttError(f"publish to {topic} failed: {paho.error_string(info.rc)}")
            early = self._early.pop(info.mid, None)
            if early is None:
                self._pending[info.mid] = fut
            else:
                fut.set_result(early)
        try:
            reason = await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            with self._lock:
                self._pending.pop(info.mid, None)
            raise MqttError(f"no PUBACK for {topic} within {timeout_s:g} s", "timeout") from None
        if reason.is_failure:
            raise MqttError(f"the broker refused the publish to {topic}: {reason}", str(reason))


def _resolve(fut: asyncio.Future[ReasonCode], reason: ReasonCode) -> None:
    if not fut.done():
        fut.set_result(reason)
