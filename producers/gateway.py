"""``ldpstream gateway``: the HTTP ingest gateway for devices that do not speak Kafka.

    POST /v1/collections/<id>/reports    one report batch: the binary batch of producers/codec.py
                                         (Content-Type application/octet-stream) or its JSON form
                                         (application/json); Authorization: Bearer <fleet token>
    GET  /v1/collections/<id>/config     the collection's signed mechanism state as published on
                                         ldp.config (devices verify it, see sdk.GatewayConfigWatcher);
                                         same token checks as the reports
    GET  /v1/public-key                  the key that signs ldp.config, its key id and fingerprint
                                         (no token: producers/gateway_edge.py)
    GET  /healthz                        broker reachable and ldp.config read; 200 or 503
    GET  /metrics                        Prometheus text (ldp_gateway_* series)

A request is checked in this order, and answered with JSON ``{"error", "reason"}`` when refused;
a refused request produces nothing:

* 401 ``unauthorized``: no ``Authorization: Bearer`` header, or a token of no fleet (every
  fleet's token is compared with :func:`hmac.compare_digest`, all of them, every time);
* 403 ``forbidden``: the fleet's token is not allowed for that collection; 403 ``wrong_fleet``: a
  batch authenticated for another fleet than the token's;
* 404 ``unknown_collection``: no verified mechanism state for it on ``ldp.config``;
* 413 ``too_large``: a body above ``--max-body-bytes`` (checked on Content-Length and while
  reading);
* 415 ``unsupported_media_type``; 400 with the codec's reason (``malformed``, ``truncated``,
  ``bad_magic``, ``unknown_version``, ``wrong_width``, ``out_of_domain``, ``wrong_collection``,
  ``no_device_id``) and a detail naming the problem;
* 503 ``unavailable`` when Kafka did not acknowledge.

A batch authenticated by its device (producers/codec.py flag bit 2: its fleet and MAC) is
produced byte for byte, keyed by its sender's server id, once the token's fleet is the batch's
(403 ``wrong_fleet`` otherwise); the worker verifies the MAC (docs/security.md "Per-device
identity"). Other accepted reports are produced to ``ldp.reports.<id>`` with device ids stamped by the gateway:
``stamp(fleet, device id)`` (8 bytes of BLAKE2b), so a device cannot report under another fleet's
ids. The device's own id is the batch's ``device_ids`` or the ``X-Device-Id`` header. Messages are
keyed by the stamped id (one message per device of the batch, split to stay under the worker's
message limit), so a device's reports go to one partition. The gateway answers 200 once Kafka has
acknowledged every message: ``{"accepted": n, "messages": k, "version": v}``. A batch with a
batch key goes whole as one message with the key ``(stamped sender, sequence)``, so a retried
request is counted once (agents/store/dedupe.py).

TLS: ``--tls-cert FILE`` (PEM chain) and ``--tls-key FILE`` serve HTTPS (docs/security.md).

Fleets and tokens: ``--tokens FILE`` or ``LDP_GATEWAY_TOKENS_FILE`` (YAML or JSON), or the JSON in
``LDP_GATEWAY_TOKENS``::

    fleets:
      phones:  {token: "<at least 16 characters>", collections: [app-usage]}
      sensors: {token: "<...>", collections: "*"}          # every collection
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import json
import logging
import os
import ssl
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import yaml
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from ldpstream import termination
from ldpstream.credentials.device_keys import server_id
from ldpstream.errors import CliError
from ldpstream.estimators.mechanism import Mechanism
from ldpstream.http_guard import GATEWAY_ENV, ConnectionGuard, HardenedSite
from ldpstream.names import CONFIG_TOPIC, ENV_KAFKA_BOOTSTRAP, reports_topic
from ldpstream.producers.ack_ledger import AckLedger, AckMetrics
from ldpstream.producers.codec import (
    MAX_MESSAGE_BYTES,
    DecodeError,
    ReportBatch,
    batch_from_json,
    decode_batch,
    encode_batch,
    explain_batch,
)
from ldpstream.producers.device import ConfigWatcher
from ldpstream.producers.gateway_edge import PUBLIC_KEY_PATH, public_key_handler, server_tls_context
from ldpstream.producers.kafka_security import kafka_security
from ldpstream.producers.publisher import Publisher, PublishError
from ldpstream.producers.sdk import device_key
from ldpstream.producers.signing import ENV_PUBLIC_KEY, ENV_PUBLIC_KEY_FILE, load_verify_key

log = logging.getLogger(__name__)

ENV_TOKENS = "LDP_GATEWAY_TOKENS"
ENV_TOKENS_FILE = "LDP_GATEWAY_TOKENS_FILE"
MIN_TOKEN_CHARS = 16
DEFAULT_MAX_BODY = MAX_MESSAGE_BYTES
#: bytes of a produced message besides the reports (header + collection id, generous)
_HEADER_ROOM = 512
BROKER_CHECK_S = 1.0    # a broker metadata check waits this long (/healthz, before producing)
BROKER_CACHE_S = 1.5    # and its answer is reused this long
PRODUCE_TIMEOUT_S = 10.0  # a batch not acknowledged by then is answered 503 (a keyed retry
#                           is counted once: agents/store/dedupe.py)

REGISTRY = CollectorRegistry(auto_describe=True)
REQUESTS = Counter("ldp_gateway_requests_total", "HTTP report requests by answer status.",
                   ["collection", "status"], registry=REGISTRY)
REPORTS = Counter("ldp_gateway_reports_total", "Reports accepted and acknowledged by Kafka.",
                  ["collection"], registry=REGISTRY)
ACK_METRICS = AckMetrics(REGISTRY)
BROKER_CHECKS = Counter("ldp_gateway_broker_checks_total",
                        "Metadata checks of the broker made (one at a time; requests meanwhile "
                        "share its answer).", registry=REGISTRY)
SECONDS = Histogram("ldp_gateway_request_seconds", "Seconds to answer a report request.",
                    registry=REGISTRY, buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                0.25, 0.5, 1.0, 2.5))


@dataclass(frozen=True)
class Fleet:
    """A group of devices sharing a bearer token; ``collections`` None = every collection."""

    name: str
    token: str
    collections: frozenset[str] | None

    def allows(self, collection: str) -> bool:
        return self.collections is None or collection in self.collections


def parse_fleets(doc: Any, source: str, *, tokens: bool = True) -> list[Fleet]:
    """``{"fleets": {name: {"token": str, "collections": [ids] | "*"}}}`` → fleets; errors name
    the field. ``tokens=False`` (the MQTT bridge, whose devices authenticate to the MQTT broker):
    a fleet may have no token (``""``); a token given is still checked."""
    if not isinstance(doc, Mapping) or set(doc) != {"fleets"} or not isinstance(doc["fleets"],
                                                                               Mapping):
        raise CliError(f"{source}: must be a mapping with one key 'fleets' "
                       f"({{name: {{token, collections}}}})")
    out, seen = [], set()
    for name, spec in doc["fleets"].items():
        where = f"{source}: fleets.{name}"
        if not isinstance(spec, Mapping):
            raise CliError(f"{where}: must be a mapping {{token, collections}}")
        extra = set(spec) - {"token", "collections"}
        if extra:
            raise CliError(f"{where}.{sorted(extra)[0]}: unknown field (allowed: token, "
                           f"collections)")
        token = spec.get("token")
        if token is None and not tokens:
            token = ""
        elif not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS:
            raise CliError(f"{where}.token: must be a string of at least {MIN_TOKEN_CHARS} "
                           f"characters")
        if token and token in seen:
            raise CliError(f"{where}.token: the same token is given to two fleets")
        seen.add(token)
        colls = spec.get("collections", "*")
        if colls == "*":
            allowed = None
        elif isinstance(colls, list) and colls and all(isinstance(c, str) for c in colls):
            allowed = frozenset(colls)
        else:
            raise CliError(f"{where}.collections: must be \"*\" or a non-empty list of "
                           f"collection ids")
        out.append(Fleet(str(name), token, allowed))
    if not out:
        raise CliError(f"{source}: no fleets")
    return out


def load_fleets(path: str | None = None, environ: Mapping[str, str] | None = None) -> list[Fleet]:
    """Fleets from ``path``, else ``LDP_GATEWAY_TOKENS_FILE``, else ``LDP_GATEWAY_TOKENS``."""
    env = os.environ if environ is None else environ
    path = path or env.get(ENV_TOKENS_FILE)
    if path:
        return read_fleets_file(path)
    if env.get(ENV_TOKENS):
        try:
            return parse_fleets(json.loads(env[ENV_TOKENS]), ENV_TOKENS)
        except ValueError as exc:
            raise CliError(f"{ENV_TOKENS}: invalid JSON: {exc}") from None
    raise CliError(f"no fleet tokens: give --tokens FILE, {ENV_TOKENS_FILE} or {ENV_TOKENS}")


def read_fleets_file(path: str, *, tokens: bool = True) -> list[Fleet]:
    """The fleets of a YAML or JSON file (:func:`parse_fleets`); errors name the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"{path}: cannot read the fleets ({exc})") from None
    try:
        return parse_fleets(yaml.safe_load(text), path, tokens=tokens)
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: invalid YAML/JSON: " + " ".join(str(exc).split())) from None


def authenticate(fleets: Sequence[Fleet], header: str | None) -> Fleet | None:
    """The fleet whose token is the ``Bearer`` token of ``header``, or None. Every token is
    compared (constant time each, no early exit)."""
    if not header:
        return None
    scheme, _, given = header.partition(" ")
    given_b = given.strip().encode("utf-8", "surrogateescape")
    if scheme.lower() != "bearer" or not given_b:
        return None
    found = None
    for f in fleets:
        if hmac.compare_digest(given_b, f.token.encode("utf-8")):
            found = f
    return found


def stamp(fleet: str, device_ids: np.ndarray) -> np.ndarray:
    """The device ids the server sees: 8 bytes of BLAKE2b(fleet, device id) per id (one hash per
    distinct id of the batch)."""
    uniq, inverse = np.unique(np.asarray(device_ids, dtype=np.uint64), return_inverse=True)
    prefix = fleet.encode("utf-8") + b"\x00"
    out = np.array([int.from_bytes(hashlib.blake2b(prefix + int(d).to_bytes(8, "big"),
                                                   digest_size=8).digest(), "big")
                    for d in uniq], dtype=np.uint64)
    return out[inverse]


class Refused(Exception):
    """A request the gateway answers with an error (``status``, ``reason``, ``detail``)."""

    def __init__(self, status: int, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.reason, self.detail = status, reason, detail


def validate_batch(collection: str, content_type: str | None, body: bytes,
                   known: Mapping[str, Mapping[int, Mechanism]], max_bytes: int) -> ReportBatch:
    """Decode and check one device batch posted for ``collection`` (binary or JSON form by
    ``content_type``) against the accepted mechanism versions ``known``; raises
    :class:`Refused` (415, or 400 with the codec's reason). The one check of any ingress."""
    ctype = (content_type or "application/octet-stream").split(";")[0].strip()
    try:
        if ctype == "application/json":
            batch = batch_from_json(body)
        elif ctype == "application/octet-stream":
            batch = decode_batch(body, max_bytes=max_bytes)
        else:
            raise Refused(415, "unsupported_media_type",
                          f"Content-Type {ctype!r}: send application/octet-stream (binary "
                          f"batch) or application/json")
    except DecodeError as exc:
        raise Refused(400, exc.reason, exc.detail) from None
    if batch.collection != collection:
        raise Refused(400, "wrong_collection", f"the batch is for collection "
                                               f"{batch.collection!r}, the URL for "
                                               f"{collection!r}")
    bad = explain_batch(batch, known)
    if bad is not None:
        raise Refused(400, *bad)
    return batch


class IngestGateway:
    """The gateway's state: fleets, the accepted mechanism versions (from a verified
    ``ldp.config``), the Kafka publisher."""

    def __init__(self, bootstrap: str, fleets: Sequence[Fleet], *,
                 max_body_bytes: int = DEFAULT_MAX_BODY,
                 max_message_bytes: int = MAX_MESSAGE_BYTES,
                 config_topic: str | None = None,
                 require_device_auth: bool = False, via: str = "gateway",
                 ack_metrics: AckMetrics | None = None) -> None:
        self.bootstrap = bootstrap
        #: refuse batches without a device MAC (401 ``unauthenticated``) instead of relaying
        #: what a worker with fleet secrets would dead-letter (docs/security.md)
        self.require_device_auth = bool(require_device_auth)
        self.fleets = list(fleets)
        self.max_body_bytes = int(max_body_bytes)
        self.max_message_bytes = int(max_message_bytes)
        # not a device: no ε ceiling (devices apply their own to the relayed states); only the
        # fleets' collections unless one fleet may report anywhere (a flood of ldp.config then
        # costs a bounded time: producers/device.py TAIL_RECORDS)
        follow = None if any(f.collections is None for f in self.fleets) else \
            frozenset().union(*(f.collections or () for f in self.fleets))
        self.watcher = ConfigWatcher(bootstrap, topic=config_topic or CONFIG_TOPIC,
                                     on_change=self._on_state, max_epsilon=None,
                                     collections=follow)
        self.publisher = Publisher(bootstrap, client_id="ldpstream-gateway")
        #: acknowledged reports per fleet and collection, for the workers' reconciliation
        self.acks = AckLedger(self.publisher, via, ack_metrics or ACK_METRICS)
        #: collection → version → mechanism, for every version the newest state accepts
        self.known: dict[str, dict[int, Mechanism]] = {}
        #: the last Kafka failure (shown by /healthz until a batch is acknowledged again)
        self.last_error: str | None = None
        #: (monotonic time, (broker answered, detail)) of the last broker check
        self._broker: tuple[float, tuple[bool, str]] | None = None
        #: the broker check in progress, which every request arriving meanwhile waits for
        self._broker_check: asyncio.Future[tuple[bool, str]] | None = None

    def _on_state(self, collection: str, signed: Any) -> None:
        newest = self.watcher.mechanisms[collection]
        accepted = set(newest.accepted_versions())
        versions = {v: m for v, m in self.known.get(collection, {}).items() if v in accepted}
        versions[newest.version] = newest
        self.known[collection] = versions

    async def start(self, timeout_s: float = 30.0) -> "IngestGateway":
        await self.publisher.start(timeout_s)
        await self.watcher.start(timeout_s)
        self.acks.start()
        return self

    async def stop(self) -> None:
        try:
            await asyncio.wait_for(self.acks.stop(), PRODUCE_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("gateway: the acknowledged counts were not flushed")
        try:  # every part of the stop is bounded: a SIGTERM must end the process
            await asyncio.wait_for(self.watcher.stop(), PRODUCE_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("gateway: the config watcher did not stop within %gs", PRODUCE_TIMEOUT_S)
        try:  # with the broker gone, what is unacknowledged was answered 503 already
            await asyncio.wait_for(self.publisher.stop(), PRODUCE_TIMEOUT_S)
        except (Exception, asyncio.TimeoutError) as exc:  # noqa: BLE001
            log.warning("gateway: the Kafka producer did not stop cleanly: %s", exc)

    # --- one request ---------------------------------------------------------------------------
    async def ingest(self, collection: str, fleet: Fleet, headers: Mapping[str, str],
                     body: bytes) -> dict[str, Any]:
        """Check, stamp and produce the batch of one request of ``fleet`` (authenticated by
        :meth:`check_access`); raises :class:`Refused`."""
        batch = validate_batch(collection, headers.get("Content-Type"), body, self.known,
                               self.max_body_bytes)
        broker, detail = await self.broker_ok()
        if not broker:  # answered at once instead of waiting for the producer's timeout
            raise Refused(503, "unavailable", f"Kafka is not reachable: {detail}")
        if batch.fleet is not None and batch.key is not None:
            # authenticated by its device (flag bit 2): relayed byte for byte, the worker
            # verifies the MAC (agents/ingest/identity_gate.py); a token of another fleet is refused
            if batch.fleet != fleet.name:
                raise Refused(403, "wrong_fleet", f"the batch is authenticated for fleet "
                                                  f"{batch.fleet!r}, the token is fleet "
                                                  f"{fleet.name!r}'s")
            if len(body) > self.max_message_bytes:
                raise Refused(413, "too_large", f"an authenticated batch must fit one message "
                                                f"of {self.max_message_bytes} bytes")
            await self._send_all([(body, device_key(server_id(fleet.name, batch.key[0])))],
                                 reports_topic(collection))
            self.acks.add(fleet.name, collection, batch.n)
            return {"collection": collection, "version": batch.version, "accepted": batch.n,
                    "messages": 1}
        if self.require_device_auth:
            raise Refused(401, "unauthenticated", "this gateway relays only batches "
                                                  "authenticated by their device (a device "
                                                  "credential: docs/credentials.md)")
        ids = self.device_ids(batch, headers.get("X-Device-Id"))
        key = None if batch.key is None else (  # the sender is stamped like the device ids
            int(stamp(fleet.name, np.array([batch.key[0]], dtype=np.uint64))[0]), batch.key[1])
        messages = await self.produce(batch, stamp(fleet.name, ids), key)
        return {"collection": collection, "version": batch.version, "accepted": batch.n,
                "messages": messages}

    def check_access(self, collection: str, authorization: str | None) -> Fleet:
        fleet = authenticate(self.fleets, authorization)
        if fleet is None:
            raise Refused(401, "unauthorized", "missing or wrong token (send 'Authorization: "
                                               "Bearer <fleet token>')")
        if not fleet.allows(collection):
            raise Refused(403, "forbidden", f"the token of fleet {fleet.name!r} is not allowed "
                                            f"to report to collection {collection!r}")
        if collection not in self.known:
            raise Refused(404, "unknown_collection", f"collection {collection!r} has no verified "
                                                     f"mechanism state on ldp.config (known: "
                                                     f"{', '.join(sorted(self.known)) or 'none'})")
        return fleet

    @staticmethod
    def device_ids(batch: ReportBatch, header: str | None) -> np.ndarray:
        if batch.device_ids is not None:
            return batch.device_ids
        if header is None:
            raise Refused(400, "no_device_id", "the batch carries no device ids: set them in the "
                                               "batch or send the X-Device-Id header")
        try:
            dev = int(header)
            if not 0 <= dev < 2**64:
                raise ValueError
        except ValueError:
            raise Refused(400, "no_device_id", f"X-Device-Id must be an integer in [0, 2**64), "
                                               f"got {header[:40]!r}") from None
        return np.full(batch.n, dev, dtype=np.uint64)

    async def produce(self, batch: ReportBatch, stamped: np.ndarray,
                      key: tuple[int, int] | None = None) -> int:
        """One message per device (split to fit ``max_message_bytes``), keyed by its stamped id;
        returns the number of messages once Kafka acknowledged all of them. A batch with a batch
        key (stamped sender, sequence) goes whole as one message keyed by its sender, so that
        the worker counts it once however often it is retried (agents/store/dedupe.py)."""
        if key is not None:
            payload = encode_batch(batch.collection, batch.version, batch.reports,
                                   device_ids=stamped, sent_at=batch.sent_at, key=key)
            if len(payload) > self.max_message_bytes:
                raise Refused(413, "too_large", f"a batch with a batch key must fit one message "
                                                f"of {self.max_message_bytes} bytes")
            await self._send_all([(payload, device_key(key[0]))], reports_topic(batch.collection))
            return 1
        order = np.argsort(stamped, kind="stable")
        ids, reports = stamped[order], batch.reports[order]
        starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
        ends = np.r_[starts[1:], len(ids)]
        per_row = 8 + batch.width * batch.reports.dtype.itemsize
        rows = max(1, (self.max_message_bytes - _HEADER_ROOM) // per_row)
        messages = []
        for s, e in zip(starts, ends):
            for a in range(s, e, rows):
                b = min(e, a + rows)
                messages.append((encode_batch(batch.collection, batch.version, reports[a:b],
                                              device_ids=ids[a:b], sent_at=batch.sent_at),
                                 device_key(int(ids[s]))))
        await self._send_all(messages, reports_topic(batch.collection))
        return len(messages)

    async def _send_all(self, messages: list[tuple[bytes, bytes]], topic: str) -> None:
        """Produce (payload, key) messages; returns once Kafka acknowledged all of them."""
        futures = []
        try:
            async with asyncio.timeout(PRODUCE_TIMEOUT_S):
                for payload, key in messages:
                    futures.append(await self.publisher.send(topic, payload, key=key))
                await asyncio.gather(*futures)
            self.last_error = None
        except Exception as exc:  # noqa: BLE001 - any Kafka failure: the device retries
            self.last_error = f"{exc.__class__.__name__}: {exc}"
            raise Refused(503, "unavailable", f"Kafka did not acknowledge the batch: "
                                              f"{exc.__class__.__name__}: {exc}") from None

    # --- HTTP ----------------------------------------------------------------------------------
    def app(self) -> Any:
        from aiohttp import web

        @web.middleware
        async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
            try:
                return await handler(request)
            except web.HTTPException as exc:
                if exc.content_type == "application/json":
                    raise
                return web.json_response({"error": exc.reason, "reason": f"http_{exc.status}"},
                                         status=exc.status)
            except Exception as exc:  # noqa: BLE001 - every error is JSON
                log.exception("gateway request failed")
                return web.json_response({"error": f"internal error: {exc.__class__.__name__}",
                                          "reason": "internal"}, status=500)

        app = web.Application(middlewares=[json_errors],
                              client_max_size=self.max_body_bytes + 1)
        app.router.add_post("/v1/collections/{collection}/reports", self._post_reports)
        app.router.add_get("/v1/collections/{collection}/config", self._get_config)
        if self.watcher.verify_key is not None:
            app.router.add_get(PUBLIC_KEY_PATH,
                               functools.partial(public_key_handler, self.watcher.verify_key))
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _post_reports(self, request: Any) -> Any:
        from aiohttp import web

        t0 = time.perf_counter()
        collection = request.match_info["collection"]
        label = collection if collection in self.known else "-"
        try:
            # access first: an unauthenticated client learns nothing, not even the size limit
            fleet = self.check_access(collection, request.headers.get("Authorization"))
            body = await self._read_body(request)
            result = await self.ingest(collection, fleet, request.headers, body)
        except Refused as exc:
            REQUESTS.labels(label, str(exc.status)).inc()
            return _refusal(exc)
        finally:
            SECONDS.observe(time.perf_counter() - t0)
        REQUESTS.labels(label, "200").inc()
        REPORTS.labels(collection).inc(result["accepted"])
        return web.json_response(result)

    async def _get_config(self, request: Any) -> Any:
        from aiohttp import web

        collection = request.match_info["collection"]
        try:
            self.check_access(collection, request.headers.get("Authorization"))
        except Refused as exc:
            return _refusal(exc)
        return web.Response(body=self.watcher.records[collection],
                            content_type="application/json")

    async def _read_body(self, request: Any) -> bytes:
        limit = self.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise Refused(413, "too_large", f"body of {request.content_length} bytes > limit "
                                            f"{limit}")
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = await request.content.read(65536)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise Refused(413, "too_large", f"body of more than {limit} bytes")
            chunks.append(chunk)

    async def broker_ok(self) -> tuple[bool, str]:
        """Whether the broker answers a metadata request within :data:`BROKER_CHECK_S` (the
        answer is cached for :data:`BROKER_CACHE_S`). One check at a time: the requests arriving
        while it runs share its answer (each opening its own connection made every request of a
        busy gateway wait for one when the cached answer expired: docs/devices.md "Measured")."""
        now = time.monotonic()
        if self._broker is not None and now - self._broker[0] < BROKER_CACHE_S:
            return self._broker[1]
        if self._broker_check is None:
            self._broker_check = asyncio.ensure_future(self._check_broker())
        # shielded: a request given up (its client gone) does not cancel the others' answer
        return await asyncio.shield(self._broker_check)

    async def _check_broker(self) -> tuple[bool, str]:
        from aiokafka.client import AIOKafkaClient

        BROKER_CHECKS.inc()
        client = AIOKafkaClient(bootstrap_servers=self.bootstrap,
                                request_timeout_ms=int(BROKER_CHECK_S * 1000),
                                **kafka_security().client_kwargs())
        try:
            try:
                await asyncio.wait_for(client.bootstrap(), BROKER_CHECK_S)
                brokers = len(client.cluster.brokers())
                verdict = (brokers > 0, f"{brokers} broker(s) answered metadata")
            except Exception as exc:  # noqa: BLE001 - any failure means: not reachable now
                verdict = (False, f"no metadata answer in {BROKER_CHECK_S:g} s: "
                                  f"{exc.__class__.__name__}: {exc}")
            finally:
                await client.close()
            self._broker = (time.monotonic(), verdict)
            return verdict
        finally:
            self._broker_check = None   # with the answer cached: the next request uses it

    async def _healthz(self, request: Any) -> Any:
        from aiohttp import web

        broker, detail = await self.broker_ok()
        ok = self.watcher.running and broker
        return web.json_response({"status": "ok" if ok else "unavailable",
                                  "config_watcher_running": self.watcher.running,
                                  "broker": {"ok": broker, "detail": detail},
                                  "last_kafka_error": self.last_error,
                                  "collections": {c: sorted(v) for c, v in self.known.items()},
                                  "refused_states": dict(self.watcher.rejected)},
                                 status=200 if ok else 503)

    async def _metrics(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(body=generate_latest(REGISTRY),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def _refusal(exc: Refused) -> Any:
    from aiohttp import web

    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return web.json_response({"error": exc.detail, "reason": exc.reason}, status=exc.status,
                             headers=headers)


async def serve(gateway: IngestGateway, host: str, port: int,
                guard: ConnectionGuard | None = None,
                ssl_context: ssl.SSLContext | None = None) -> Any:
    """Start the gateway and its HTTP server, hardened like the worker's (ldpstream/http_guard.py:
    connection cap with eviction and header deadline, ``LDP_GATEWAY_MAX_CONNECTIONS`` and
    ``LDP_GATEWAY_HEADER_TIMEOUT_S`` unless ``guard`` is given), over TLS with ``ssl_context``
    (producers/gateway_edge.py); returns the aiohttp runner
    (``await runner.cleanup()`` then ``await gateway.stop()`` to stop)."""
    from aiohttp import web

    await gateway.start()
    runner = web.AppRunner(gateway.app(), access_log=None)
    await runner.setup()
    await HardenedSite(runner, host, port, guard=guard or ConnectionGuard.from_env(GATEWAY_ENV),
                       ssl_context=ssl_context).start()
    return runner


def main(args: Any) -> int:
    """``ldpstream gateway [--port P] [--bind H] [--tokens FILE] [--max-body-bytes N]
    [--tls-cert FILE --tls-key FILE]``."""
    bootstrap = os.environ.get(ENV_KAFKA_BOOTSTRAP)
    if not bootstrap:
        raise CliError("KAFKA_BOOTSTRAP_SERVERS is not set")
    fleets = load_fleets(args.tokens)
    if load_verify_key() is None:
        raise CliError(f"no public key pinned: set {ENV_PUBLIC_KEY} or {ENV_PUBLIC_KEY_FILE} (the "
                       f"gateway accepts only mechanism states signed by that key)")
    tls = server_tls_context(args.tls_cert, args.tls_key)
    gateway = IngestGateway(bootstrap, fleets, max_body_bytes=args.max_body_bytes,
                            require_device_auth=args.require_device_auth)

    from ldpstream.producers.fleet import unless_stopped

    async def run() -> None:
        # the stop signals count from the start: a stop while connecting is clean too
        stop = asyncio.Event()
        termination.on_loop(stop.set)
        try:
            runner = await unless_stopped(serve(gateway, args.bind, args.port,
                                                ssl_context=tls), stop)
        except (ConnectionError, PublishError) as exc:
            await gateway.stop()  # what did start (the producer) is closed, not leaked
            raise CliError(str(exc)) from None
        if runner is None:  # stopped while starting
            await gateway.stop()
            return
        print(f"ldpstream gateway: {'https' if tls else 'http'}://{args.bind}:{args.port}/v1/collections/<id>/reports "
              f"(fleets: {', '.join(f.name for f in fleets)}; collections: "
              f"{', '.join(sorted(gateway.known)) or 'none yet'})", file=sys.stderr, flush=True)
        await stop.wait()
        try:
            await asyncio.wait_for(runner.cleanup(), PRODUCE_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("gateway: the HTTP server did not stop within %gs", PRODUCE_TIMEOUT_S)
        await gateway.stop()

    asyncio.run(run())
    return 0
