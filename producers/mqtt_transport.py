"""The device SDK over MQTT (docs/devices.md, "MQTT"): :class:`MqttTransport` publishes report
batches to ``ldp/<fleet>/<collection>/reports`` with QoS 1 and returns once the broker
acknowledged them; :class:`MqttConfigWatcher` reads the signed mechanism states the bridge keeps
retained on ``ldp/<fleet>/<collection>/config`` and verifies them exactly as
:class:`~.device.ConfigWatcher` does (pinned key, replay and ε-ceiling checks).

Batches over MQTT must carry a batch key: a QoS 1 message is delivered at least once, and only
the key (device id, sequence) lets the worker count a redelivered batch once (agents/store/dedupe.py).
:class:`~.sdk.DeviceClient` always sends keyed batches; :meth:`MqttTransport.send` refuses an
unkeyed one.
"""
from __future__ import annotations

import asyncio
from typing import Any, Collection

from ldpstream.mqtt_client import AsyncPublisher, MqttError, connect, make_client, parse_mqtt_url
from ldpstream.names import mqtt_config_topic, mqtt_reports_topic
from ldpstream.producers.codec import decode_batch
from ldpstream.producers.device import ConfigWatcher

__all__ = ["MqttTransport", "MqttConfigWatcher", "MqttError"]


class MqttTransport:
    """Publish a fleet's batches to an MQTT broker (``mqtt://`` or ``mqtts://user:pass@host:port``;
    ``ca``: the CA certificate of a TLS broker). The session is persistent under ``client_id``
    (default ``ldp-<fleet>-<device id>`` of the first batch), so a batch in flight while the
    broker restarts is sent again when the client reconnects. A refusal (wrong credentials, a
    topic outside the fleet's ACL, no PUBACK within ``timeout_s``) raises
    :class:`~ldpstream.mqtt_client.MqttError`; the device client then keeps the batch and sends
    it again with the same key."""

    def __init__(self, url: str, fleet: str, *, ca: str | None = None,
                 client_id: str | None = None, timeout_s: float = 30.0,
                 check_keyed: bool = True) -> None:
        self.endpoint = parse_mqtt_url(url, "MqttTransport url")
        self.fleet = fleet
        self.ca = ca
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.check_keyed = check_keyed
        self._publisher: AsyncPublisher | None = None

    async def _connected(self, device_id: int) -> AsyncPublisher:
        if self._publisher is None:
            cid = self.client_id or f"ldp-{self.fleet}-{device_id}"
            client = make_client(self.endpoint, cid, ca=self.ca)
            await asyncio.to_thread(connect, client, self.endpoint, persistent=True,
                                    timeout_s=self.timeout_s)
            self._publisher = AsyncPublisher(client, asyncio.get_running_loop())
        return self._publisher

    async def send(self, collection: str, batch: bytes, device_id: int) -> None:
        if self.check_keyed and decode_batch(batch).key is None:
            raise ValueError("a batch sent over MQTT needs a batch key (device id, sequence): "
                             "QoS 1 may deliver it twice")
        publisher = await self._connected(device_id)
        await publisher.publish(mqtt_reports_topic(self.fleet, collection), batch,
                                timeout_s=self.timeout_s)

    async def flush(self) -> None:
        return None  # every send waited for its PUBACK

    async def close(self) -> None:
        if self._publisher is not None:
            client = self._publisher.client
            self._publisher = None
            client.disconnect()
            client.loop_stop()


class MqttConfigWatcher(ConfigWatcher):
    """Mechanism states of ``collections`` read from the retained config topics of ``fleet``;
    :meth:`start` returns once every collection has a verified state or ``timeout_s`` passed
    (a collection without one then raises :class:`~.sdk.UnknownCollectionError` when used)."""

    def __init__(self, url: str, fleet: str, collections: Collection[str], *,
                 ca: str | None = None, client_id: str | None = None, **kw: Any) -> None:
        self.endpoint = parse_mqtt_url(url, "MqttConfigWatcher url")
        super().__init__(str(self.endpoint), topic=mqtt_config_topic(fleet, "<collection>"),
                         collections=collections, **kw)
        self.fleet = fleet
        self.ca = ca
        self.client_id = client_id or f"ldp-{fleet}-config-{id(self):x}"
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        cid = msg.topic.split("/")[2]
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._take, cid.encode("utf-8"), bytes(msg.payload))

    def _subscribe(self) -> None:
        for cid in sorted(self.collections or ()):
            self._client.subscribe(mqtt_config_topic(self.fleet, cid), qos=1)

    async def start(self, timeout_s: float = 30.0) -> "MqttConfigWatcher":
        self._loop = asyncio.get_running_loop()
        client = make_client(self.endpoint, self.client_id, ca=self.ca)
        client.on_message = self._on_message
        await asyncio.to_thread(connect, client, self.endpoint, persistent=False)
        self._client = client
        self._subscribe()
        # a reconnect (broker restart) starts a fresh session: subscribe again, and the retained
        # states arrive again (a newer one replaces the adopted one; an older one is refused)
        client.on_connect = lambda *_: self._subscribe()
        deadline = self._loop.time() + timeout_s
        while not set(self.collections or ()) <= set(self.states) and self._loop.time() < deadline:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), max(0.0, deadline - self._loop.time()))
            except asyncio.TimeoutError:
                break
        self._task = asyncio.create_task(self._client_alive(), name="ldp-mqtt-config-watcher")
        return self

    async def _client_alive(self) -> None:
        while self._client is not None:  # states keep arriving on the client's thread
            await asyncio.sleep(3600)

    async def stop(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            client.disconnect()
            client.loop_stop()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
