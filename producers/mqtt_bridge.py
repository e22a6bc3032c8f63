"""``ldpstream mqtt-bridge``: MQTT ingress for device fleets (docs/devices.md, "MQTT").

The bridge subscribes to ``$share/ldp-bridge-<tag>/ldp/+/+/reports`` (:func:`bridge_names`: the
group and the client id carry a tag of the bridge's password; bridges with distinct client ids
split the messages; ``--subscription exclusive``: ``ldp/+/+/reports``, one bridge, see
:attr:`MqttBridge.subscription`) with a persistent session and manual QoS 1 acknowledgements. Each message on
``ldp/<fleet>/<collection>/reports`` is one report batch, binary or its JSON form (MQTT 5 content
type ``application/json``, or a payload starting with ``{``), checked and produced by the gateway's
own code (producers/gateway.py: :func:`~.gateway.validate_batch`, device ids stamped per fleet,
keyed batches whole): the MQTT message is acknowledged only once Kafka acknowledged what it
produced, so a crash in between makes the broker deliver it again, and the batch key makes the
worker count it once (agents/store/dedupe.py). A refused message goes to ``ldp.dlq`` with its reason
(acknowledged once the DLQ has it) and counts in ``ldp_mqtt_rejected_total{fleet,reason}``.
While Kafka is unreachable the message stays unacknowledged and is retried.

Every verified mechanism state of ``ldp.config`` is relayed unchanged, retained, to
``ldp/<fleet>/<collection>/config`` for each fleet allowed that collection (devices verify the
signature themselves); the verifying key's document is retained on ``ldp/<fleet>/public-key``.
What the broker refuses itself (wrong password, oversized or malformed packet) is counted from its
log on ``$SYS/broker/log/N`` in ``ldp_mqtt_broker_refused_total{fleet,reason}``
(producers/mqtt_broker_log.py). ``/healthz`` is 200 only when the MQTT session is up, the Kafka
broker answers metadata and ``ldp.config`` is being read; ``/metrics`` has the ``ldp_mqtt_*`` series.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import threading
import time
from typing import Any, Sequence

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ldpstream.errors import CliError
from ldpstream.mqtt_client import MqttEndpoint, connect, make_client
from ldpstream.names import (
    DLQ_TOPIC,
    ENV_MQTT_FLEETS_FILE,
    MQTT_BROKER_LOG_TOPIC,
    MQTT_RECEIVE_MAXIMUM,
    MQTT_SHARE_GROUP,
    mqtt_config_topic,
    mqtt_public_key_topic,
    mqtt_reports_topic,
)
from ldpstream.producers.ack_ledger import AckMetrics
from ldpstream.producers.codec import MAX_MESSAGE_BYTES, dlq_record
from ldpstream.producers.gateway import (
    PRODUCE_TIMEOUT_S,
    Fleet,
    IngestGateway,
    Refused,
    read_fleets_file,
)
from ldpstream.producers.gateway_edge import public_key_document
from ldpstream.producers.mqtt_broker_log import BrokerRefusals, refused_counter

log = logging.getLogger(__name__)

#: received and not yet acknowledged messages the bridge holds at most, whatever the broker
#: sends (Mosquitto 2.0.11 sends a client more than its Receive Maximum): past either bound the
#: MQTT thread stops reading until messages are acknowledged, and the broker queues the rest
#: under its own limits (ldpstream/dev/mosquitto.py)
MAX_PENDING_MESSAGES = MQTT_RECEIVE_MAXIMUM
MAX_PENDING_BYTES = 64 * 1_048_576
RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)

REGISTRY = CollectorRegistry(auto_describe=True)
MESSAGES = Counter("ldp_mqtt_messages_total", "MQTT messages produced to Kafka and acknowledged.",
                   ["fleet"], registry=REGISTRY)
REPORTS = Counter("ldp_mqtt_reports_total", "Reports produced to Kafka from MQTT.",
                  ["fleet", "collection"], registry=REGISTRY)
REJECTED = Counter("ldp_mqtt_rejected_total", "MQTT messages refused (sent to ldp.dlq).",
                   ["fleet", "reason"], registry=REGISTRY)
BROKER_REFUSED = refused_counter(REGISTRY)
ACK_METRICS = AckMetrics(REGISTRY)
BROKER_LOG = Gauge("ldp_mqtt_broker_log_subscribed", "1 while the bridge reads the broker's log "
                   "(the refusals it counts).", registry=REGISTRY)
RETRIES = Counter("ldp_mqtt_kafka_retries_total", "Produce attempts retried while Kafka was "
                  "unreachable (the MQTT message stays unacknowledged).", registry=REGISTRY)
RELAYED = Counter("ldp_mqtt_configs_relayed_total", "Signed states published retained on MQTT.",
                  ["fleet"], registry=REGISTRY)
PENDING = Gauge("ldp_mqtt_pending_messages", "MQTT messages received and not acknowledged yet "
                "(at most MAX_PENDING_MESSAGES).", registry=REGISTRY)
PENDING_BYTES = Gauge("ldp_mqtt_pending_bytes", "Payload bytes of the messages received and not "
                      "acknowledged yet (at most MAX_PENDING_BYTES).", registry=REGISTRY)
HELD_BACK = Counter("ldp_mqtt_held_back_total", "Times the bridge stopped reading from the "
                    "broker because its pending messages reached a bound.", registry=REGISTRY)
CONNECTED = Gauge("ldp_mqtt_connected", "1 while the bridge's MQTT session is up.",
                  registry=REGISTRY)
SECONDS = Histogram("ldp_mqtt_message_seconds", "Seconds from receiving an MQTT message to its "
                    "acknowledgement.", registry=REGISTRY,
                    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5))


def bridge_names(client_id: str, password: str | None) -> tuple[str, str]:
    """The bridge's MQTT client id and shared-subscription group as the broker sees them: the
    given ``client_id`` and ``ldp-bridge``, each suffixed with 16 hex digits of
    HMAC-SHA256(bridge password, ...). Mosquitto 2.0 grants any SUBSCRIBE (its ACL filters only
    what is delivered) and lets any authenticated client take over a session by its client id,
    so names a fleet's device cannot guess keep it out of the bridges' group and their sessions;
    bridges sharing the password share the group (docs/security.md). Without a password: the
    plain names."""
    if not password:
        return client_id, MQTT_SHARE_GROUP

    def tag(what: str) -> str:
        return hmac.new(password.encode("utf-8"), f"ldpstream/mqtt-bridge/{what}".encode("utf-8"),
                        hashlib.sha256).hexdigest()[:16]

    return f"{client_id}-{tag('client-id/' + client_id)}", f"{MQTT_SHARE_GROUP}-{tag('group')}"


def load_mqtt_fleets(path: str | None, environ: Any = None) -> list[Fleet]:
    """Fleets from ``--fleets`` or ``LDP_MQTT_FLEETS_FILE``: the gateway's tokens file, tokens
    optional (``fleets: {name: {collections: [ids] | "*"}}``)."""
    env = os.environ if environ is None else environ
    path = path or env.get(ENV_MQTT_FLEETS_FILE)
    if not path:
        raise CliError(f"no fleets: give --fleets FILE or {ENV_MQTT_FLEETS_FILE}")
    return read_fleets_file(path, tokens=False)


class _RelayingGateway(IngestGateway):
    """The gateway's checks and producer, telling the bridge of every new mechanism state."""

    def __init__(self, *args: Any, relay: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._relay = relay

    def _on_state(self, collection: str, signed: Any) -> None:
        super()._on_state(collection, signed)
        self._relay(collection)


class MqttBridge:
    """One bridge: an MQTT session (shared subscription, manual acks) and the gateway's core."""

    def __init__(self, bootstrap: str, fleets: Sequence[Fleet], endpoint: MqttEndpoint, *,
                 client_id: str, ca: str | None = None, shared: bool = True,
                 max_body_bytes: int = MAX_MESSAGE_BYTES,
                 broker_log_file: str | None = None,
                 require_device_auth: bool = False) -> None:
        self.endpoint = endpoint
        self.shared = shared
        self.client_id = client_id
        #: the names the broker sees: a device of any fleet can neither join the bridges' group
        #: nor take over a bridge's session (docs/security.md "MQTT: who may take what")
        self.session_id, self.share_group = bridge_names(client_id, endpoint.password)
        self.ca = ca
        self.fleets = {f.name: f for f in fleets}
        self.max_body_bytes = int(max_body_bytes)
        self.gateway = _RelayingGateway(bootstrap, fleets, max_body_bytes=max_body_bytes,
                                        relay=self._relay, via="mqtt", ack_metrics=ACK_METRICS,
                                        require_device_auth=require_device_auth)
        self.client = make_client(endpoint, self.session_id, ca=ca, manual_ack=True)
        self.client.on_message = self._on_message
        self.refusals = BrokerRefusals(self.fleets, BROKER_REFUSED, BROKER_LOG, broker_log_file)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: messages received and not acknowledged yet, and when the last one arrived
        self._open = 0
        #: the same, held under MAX_PENDING_*: counted by the MQTT thread as it takes a message
        #: (it waits on this condition while a bound is reached), released after the ack
        self._room = threading.Condition()
        self._held = 0
        self._held_bytes = 0
        self.peak_pending = (0, 0)
        self._last_message = time.monotonic()
        #: the last MQTT disconnect's reason (None while connected)
        self.mqtt_detail = "not connected yet"

    @property
    def subscription(self) -> str:
        """The shared subscription (bridges split the messages), or with ``shared=False`` the
        plain one: Mosquitto 2.0.11 (Debian 12) does not restore shared subscriptions from its
        persistence, so what devices publish between a broker restart and the bridge's
        reconnect reaches no one; a plain subscription of a persistent session is restored."""
        plain = mqtt_reports_topic("+", "+")
        return f"$share/{self.share_group}/{plain}" if self.shared else plain

    # --- MQTT thread -> loop ------------------------------------------------------------------
    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        if msg.topic == MQTT_BROKER_LOG_TOPIC:  # QoS 0, nothing to acknowledge
            self.refusals.topic.feed(bytes(msg.payload).decode("utf-8", "replace"))
            return
        loop = self._loop
        if loop is not None and self._hold(len(msg.payload)):
            loop.call_soon_threadsafe(self._take, (time.perf_counter(), msg))

    def _hold(self, size: int) -> bool:
        """Count a received message as pending, first waiting (in the MQTT thread, so nothing
        more is read from the broker) while a bound is reached; False when the bridge stops
        meanwhile (the message stays unacknowledged: the broker delivers it again)."""
        with self._room:
            waited = False
            while self._held and (self._held >= MAX_PENDING_MESSAGES
                                  or self._held_bytes + size > MAX_PENDING_BYTES):
                if self._stopping:
                    return False
                if not waited:
                    HELD_BACK.inc()
                    waited = True
                self._room.wait(0.5)
            self._held += 1
            self._held_bytes += size
            self.peak_pending = (max(self.peak_pending[0], self._held),
                                 max(self.peak_pending[1], self._held_bytes))
            PENDING.set(self._held)
            PENDING_BYTES.set(self._held_bytes)
        return True

    def _release(self, msg: Any) -> None:
        """One pending message acknowledged (or left to the broker): room for the next."""
        self._open -= 1
        with self._room:
            self._held -= 1
            self._held_bytes -= len(msg.payload)
            PENDING.set(self._held)
            PENDING_BYTES.set(self._held_bytes)
            self._room.notify()

    def _take(self, item: tuple[float, Any]) -> None:
        self._open += 1
        self._last_message = time.monotonic()
        self._queue.put_nowait(item)

    def _on_connect(self, _c: Any, _u: Any, _flags: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            self.mqtt_detail = f"connection refused: {reason}"
            return
        self.mqtt_detail = "connected"
        CONNECTED.set(1)
        self._subscribe()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._relay_all)

    def _subscribe(self) -> None:
        """The reports (QoS 1) and the broker's notice log (QoS 0: the refusals it counts)."""
        self.client.on_subscribe = self._on_subscribe
        self.client.subscribe([(self.subscription, 1), (MQTT_BROKER_LOG_TOPIC, 0)])

    def _on_subscribe(self, _c: Any, _u: Any, _mid: int, reasons: Any, _p: Any) -> None:
        if len(reasons) == 2:  # the pair of _subscribe; a refused log shows in /healthz
            self.refusals.on_suback(reasons[1].is_failure, str(reasons[1]))

    def _on_disconnect(self, _c: Any, _u: Any, _flags: Any, reason: Any, _p: Any) -> None:
        self.mqtt_detail = f"disconnected: {reason}"
        CONNECTED.set(0)

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self, timeout_s: float = 30.0) -> "MqttBridge":
        """Start the Kafka side, then connect (a refused connection raises
        :class:`~ldpstream.mqtt_client.MqttError`) and subscribe."""
        self._loop = asyncio.get_running_loop()
        await self.gateway.start(timeout_s)
        self._task = asyncio.create_task(self._run(), name="ldp-mqtt-bridge")
        self.refusals.start()
        await asyncio.to_thread(connect, self.client, self.endpoint, persistent=True,
                                receive_maximum=MQTT_RECEIVE_MAXIMUM)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.mqtt_detail = "connected"
        CONNECTED.set(1)
        self._subscribe()
        self._relay_all()
        return self

    async def retire(self, idle_s: float = 2.0) -> None:
        """Leave the subscription group for good: unsubscribe, handle what the session still
        holds (Mosquitto keeps assigning a disconnected shared-group member its share), and once
        nothing arrived for ``idle_s`` and everything is acknowledged, end the session
        (MQTT 5 session expiry 0). Call after :meth:`start`."""
        self.client.unsubscribe(self.subscription)
        self.client.on_connect = None  # a reconnect must not subscribe again
        while self._open or time.monotonic() - self._last_message < idle_s:
            await asyncio.sleep(0.1)
        props = Properties(PacketTypes.DISCONNECT)
        props.SessionExpiryInterval = 0
        self.client.disconnect(properties=props)

    async def stop(self) -> None:
        """Disconnect (unacknowledged messages stay with the broker's session), then stop."""
        self._stopping = True
        with self._room:
            self._room.notify_all()  # an MQTT thread waiting for room gives up the message
        self.client.disconnect()
        self.client.loop_stop()
        CONNECTED.set(0)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.refusals.stop()
        await self.gateway.stop()

    # --- config relay ----------------------------------------------------------------------------
    def _relay(self, collection: str) -> None:
        record = self.gateway.watcher.records.get(collection)
        if record is None or not self.client.is_connected():
            return  # published on (re)connect
        for fleet in self.fleets.values():
            if fleet.allows(collection):
                self.client.publish(mqtt_config_topic(fleet.name, collection), record, qos=1,
                                    retain=True)
                RELAYED.labels(fleet.name).inc()

    def _relay_all(self) -> None:
        self._publish_public_key()
        for collection in list(self.gateway.known):
            self._relay(collection)

    def _publish_public_key(self) -> None:
        """The verifying key's document (``GET /v1/public-key``'s: no private material),
        retained on ``ldp/<fleet>/public-key`` for each fleet (docs/devices.md, "Getting the
        public key": check its fingerprint before pinning it)."""
        key = self.gateway.watcher.verify_key
        if key is None or not self.client.is_connected():
            return
        doc = json.dumps(public_key_document(key), sort_keys=True).encode()
        for fleet in self.fleets:
            self.client.publish(mqtt_public_key_topic(fleet), doc, qos=1, retain=True)

    # --- messages ---------------------------------------------------------------------------------
    async def _run(self) -> None:
        """Handle every message as it arrives, each in a task of its own, so that one waiting
        for Kafka's acknowledgement never holds back those behind it (taking the queue in
        groups and waiting for a whole group made the bridge idle a Kafka round trip per group:
        docs/benchmarks.md "Benchmark: MQTT ingress"). How many run at once is bounded by
        ``MAX_PENDING_*`` (the MQTT thread holds the rest back). Cancelled: so are they."""
        handling: set[asyncio.Task[None]] = set()
        try:
            while True:
                t0, msg = await self._queue.get()
                task = asyncio.create_task(self._handle(t0, msg))
                handling.add(task)
                task.add_done_callback(handling.discard)
        finally:
            for task in handling:
                task.cancel()
            await asyncio.gather(*handling, return_exceptions=True)

    async def _handle(self, t0: float, msg: Any) -> None:
        """Produce (or file in the DLQ) one message, retrying while Kafka is unreachable, then
        acknowledge it."""
        for attempt in range(10**9):
            try:
                await self._ingest(msg)
                break
            except Refused as exc:
                if exc.status != 503 and await self._dead_letter(msg, exc):
                    break
            except Exception as exc:  # noqa: BLE001 - a bug must not stop the bridge: the
                # message is kept in the DLQ with the error (and logged with its traceback)
                log.exception("mqtt-bridge: unexpected error on %s", msg.topic)
                if await self._dead_letter(msg, Refused(500, "internal", f"{exc.__class__.__name__}: {exc}")):
                    break
            if self._stopping:
                self._release(msg)
                return  # not acknowledged: the broker delivers it again
            RETRIES.inc()
            await asyncio.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
        self.client.ack(msg.mid, msg.qos)
        self._release(msg)
        SECONDS.observe(time.perf_counter() - t0)

    def _route(self, topic: str) -> tuple[Fleet, str]:
        parts = topic.split("/")
        if len(parts) != 4 or mqtt_reports_topic(parts[1], parts[2]) != topic:
            raise Refused(400, "bad_topic", f"topic {topic!r} is not "
                                            f"{mqtt_reports_topic('<fleet>', '<collection>')}")
        fleet = self.fleets.get(parts[1])
        if fleet is None:
            raise Refused(403, "unknown_fleet", f"fleet {parts[1]!r} is not in the bridge's "
                                                f"fleets file")
        if not fleet.allows(parts[2]):
            raise Refused(403, "forbidden", f"fleet {fleet.name!r} is not allowed to report to "
                                            f"collection {parts[2]!r}")
        if parts[2] not in self.gateway.known:
            raise Refused(404, "unknown_collection", f"collection {parts[2]!r} has no verified "
                                                     f"mechanism state on ldp.config")
        return fleet, parts[2]

    async def _ingest(self, msg: Any) -> None:
        fleet, collection = self._route(msg.topic)
        payload = bytes(msg.payload)
        if len(payload) > self.max_body_bytes:
            raise Refused(413, "too_large", f"message of {len(payload)} bytes > limit "
                                            f"{self.max_body_bytes}")
        headers = {"Content-Type": content_type(msg)}
        device = user_property(msg, "device-id")
        if device is not None:
            headers["X-Device-Id"] = device
        result = await self.gateway.ingest(collection, fleet, headers, payload)
        MESSAGES.labels(fleet.name).inc()
        REPORTS.labels(fleet.name, collection).inc(result["accepted"])

    async def _dead_letter(self, msg: Any, exc: Refused) -> bool:
        """File the refused message in ``ldp.dlq``; True once Kafka has it."""
        parts = msg.topic.split("/")
        fleet = parts[1] if len(parts) == 4 and parts[1] in self.fleets else "-"
        collection = parts[2] if len(parts) == 4 else None
        record = dlq_record(exc.reason, f"mqtt {msg.topic}: {exc.detail}", collection=collection,
                            topic=msg.topic, payload=bytes(msg.payload))
        try:
            async with asyncio.timeout(PRODUCE_TIMEOUT_S):
                await (await self.gateway.publisher.send(DLQ_TOPIC, record,
                                                         key=(collection or "-").encode()))
        except Exception as err:  # noqa: BLE001 - any Kafka failure: retried, not acknowledged
            self.gateway.last_error = f"{err.__class__.__name__}: {err}"
            return False
        REJECTED.labels(fleet, exc.reason).inc()
        log.info("mqtt-bridge: refused %s (%s): %s", msg.topic, exc.reason, exc.detail)
        return True

    # --- HTTP -------------------------------------------------------------------------------------
    async def health(self) -> tuple[bool, dict[str, Any]]:
        broker, detail = await self.gateway.broker_ok()
        mqtt = self.client.is_connected()
        running = self._task is not None and not self._task.done()
        ok = mqtt and broker and self.gateway.watcher.running and running
        return ok, {"status": "ok" if ok else "unavailable",
                    "mqtt": {"ok": mqtt, "detail": self.mqtt_detail if not mqtt else "connected",
                             "url": str(self.endpoint), "client_id": self.client_id},
                    "broker": {"ok": broker, "detail": detail},
                    "broker_log": self.refusals.health(),
                    "config_watcher_running": self.gateway.watcher.running,
                    "ingest_running": running,
                    "last_kafka_error": self.gateway.last_error,
                    "pending_messages": self._queue.qsize(),
                    # received, not acknowledged: now, the most at once, the bounds
                    "unacknowledged": {"messages": self._held, "bytes": self._held_bytes,
                                       "peak_messages": self.peak_pending[0],
                                       "peak_bytes": self.peak_pending[1],
                                       "max_messages": MAX_PENDING_MESSAGES,
                                       "max_bytes": MAX_PENDING_BYTES},
                    "collections": {c: sorted(v) for c, v in self.gateway.known.items()}}

    def app(self) -> Any:
        from aiohttp import web

        async def healthz(request: web.Request) -> web.Response:
            ok, body = await self.health()
            return web.json_response(body, status=200 if ok else 503)

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=generate_latest(REGISTRY),
                                headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

        @web.middleware
        async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
            try:
                return await handler(request)
            except web.HTTPException as exc:
                return web.json_response({"error": exc.reason, "reason": f"http_{exc.status}"},
                                         status=exc.status)

        app = web.Application(middlewares=[json_errors])
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/metrics", metrics)
        return app


def content_type(msg: Any) -> str:
    """The batch's form: the MQTT 5 content type when given, else JSON for a payload starting
    with ``{``, else the binary batch."""
    given = getattr(msg.properties, "ContentType", None) if msg.properties is not None else None
    if given:
        return str(given)
    return "application/json" if bytes(msg.payload[:1]) == b"{" else "application/octet-stream"


def user_property(msg: Any, name: str) -> str | None:
    """The MQTT 5 user property ``name`` of ``msg`` (the device id of a batch without ids)."""
    pairs = getattr(msg.properties, "UserProperty", None) if msg.properties is not None else None
    for key, value in pairs or ():
        if key == name:
            return str(value)
    return None
