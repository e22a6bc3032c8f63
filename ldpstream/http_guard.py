"""HTTP hardening shared by the worker's API (agents/serve/http_guard.py) and the ingest gateway
(producers/gateway.py): a connection cap with eviction, a header deadline, body limits and JSON
errors (docs/security.md "The HTTP port").

aiohttp waits forever for the headers of a new connection and has no connection limit: 3,000 idle
half-open connections stayed open on the worker and, at a 1,024-file limit, ``/healthz`` timed
out; 1,100 idle connections locked devices out of the gateway. :class:`HardenedSite` serves an
aiohttp app with

* a **header deadline**: a connection that has no request in progress (it is sending headers
  slowly, or idles between requests) for ``header_timeout_s`` is closed;
* a **connection cap** (``max_connections``): a new connection beyond it evicts the connection
  idle the longest; when every connection has a request in progress the new one is answered
  ``503`` (JSON) and closed. So idle connections can never starve the server;
* **one TLS policy** (over TLS): a connection counts against the cap and the header deadline
  from the moment it is accepted, while its TLS handshake is still under way, and a handshake
  longer than ``header_timeout_s`` is aborted (:class:`TlsGate`; asyncio's own TLS server
  counted a connection only once its handshake was done, and gave the handshake 60 s: 1,100
  connections that never sent a ClientHello filled 1,024 descriptors for a minute);
* **descriptors**: :func:`raise_fd_limit` lifts the soft ``RLIMIT_NOFILE`` to the hard one at
  start, and a cap above what the limit leaves is lowered to fit (logged);
* **JSON errors** for what aiohttp answers before routing: request line or headers too long
  (414/431) or malformed (400); :func:`json_errors` (the worker's middleware) turns unknown
  routes (404), wrong methods (405, ``Allow`` kept), bodies too large (413) and unhandled
  exceptions (500, logged, never a traceback in the answer) into ``{"error": ..., "status": ...}``.

Limits come from the environment, per server (:meth:`ConnectionGuard.from_env`):
``<PREFIX>_MAX_CONNECTIONS`` (default 256) and ``<PREFIX>_HEADER_TIMEOUT_S`` (default 10), with
prefix ``LDP_WEB`` for the worker and ``LDP_GATEWAY`` for the gateway.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import resource
import ssl
import time
from asyncio import sslproto
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_runner import BaseSite, TCPSite

log = logging.getLogger(__name__)

__all__ = ["ConnectionGuard", "HardenedSite", "TlsGate", "json_errors", "error_body",
           "MAX_BODY_BYTES", "WORKER_ENV", "GATEWAY_ENV", "raise_fd_limit"]

WORKER_ENV = "LDP_WEB"        # LDP_WEB_MAX_CONNECTIONS, LDP_WEB_HEADER_TIMEOUT_S
GATEWAY_ENV = "LDP_GATEWAY"   # LDP_GATEWAY_MAX_CONNECTIONS, LDP_GATEWAY_HEADER_TIMEOUT_S
DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_HEADER_TIMEOUT_S = 10.0
KEEPALIVE_TIMEOUT_S = 15.0
MAX_LINE_BYTES = 8190
MAX_FIELD_BYTES = 8190
MAX_BODY_BYTES = 64 * 1024
SWEEP_S = 0.5
#: descriptors kept free of HTTP connections (Kafka and Redis clients, log files, the listener)
RESERVED_FDS = 64


def raise_fd_limit() -> int:
    """Lift this process's soft ``RLIMIT_NOFILE`` to its hard limit; returns the soft limit now
    in force (unchanged when it cannot be raised)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY:
        return soft if soft != resource.RLIM_INFINITY else 1 << 20
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft


def error_body(status: int, message: str, **extra: Any) -> bytes:
    """The JSON body of every error answer."""
    return json.dumps({"error": message, "status": status, **extra}).encode("utf-8")


def _json_error(status: int, message: str, headers: Any = None, **extra: Any) -> web.Response:
    resp = web.Response(status=status, body=error_body(status, message, **extra),
                        content_type="application/json", headers=headers)
    return resp


_PARSER_MESSAGES = {400: "malformed HTTP request", 414: "request line too long",
                    431: "request header fields too large", 413: "request body too large"}


@web.middleware
async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Turn aiohttp's HTTP exceptions and unhandled errors into JSON answers."""
    try:
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES,
                                                actual_size=request.content_length)
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 404:
            message = f"no route {request.method} {request.path}"
        elif exc.status == 405:
            allowed = exc.headers.get("Allow", "")
            message = f"method {request.method} not allowed on {request.path} (allowed: {allowed})"
        else:
            message = _PARSER_MESSAGES.get(exc.status) or exc.reason
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return _json_error(exc.status, message, headers=headers)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the answer never carries a traceback
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _json_error(500, f"internal error ({exc.__class__.__name__}); see the server log")


class ConnectionGuard:
    """Live connections of one listening socket, their idle times, the cap and the deadline."""

    def __init__(self, max_connections: int, header_timeout_s: float) -> None:
        if max_connections < 1 or header_timeout_s <= 0:
            raise ValueError("max_connections must be >= 1 and header_timeout_s > 0")
        self.max_connections = int(max_connections)
        self.header_timeout_s = float(header_timeout_s)
        self.idle_since: dict[GuardedHandler, float | None] = {}
        self.evicted = 0
        self.refused = 0
        self.timed_out = 0
        self._sweeper: asyncio.TimerHandle | None = None

    @classmethod
    def from_env(cls, prefix: str, environ: Any = None) -> "ConnectionGuard":
        """Limits from ``<prefix>_MAX_CONNECTIONS`` and ``<prefix>_HEADER_TIMEOUT_S``."""
        env = os.environ if environ is None else environ
        return cls(int(env.get(f"{prefix}_MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS)),
                   float(env.get(f"{prefix}_HEADER_TIMEOUT_S", DEFAULT_HEADER_TIMEOUT_S)))

    def admit(self, handler: "GuardedHandler") -> bool:
        """Register a new connection; False when it must be refused (all others busy)."""
        self._refresh()
        if len(self.idle_since) >= self.max_connections:
            idle = [(t, h) for h, t in self.idle_since.items() if t is not None]
            if not idle:
                self.refused += 1
                return False
            _, oldest = min(idle, key=lambda x: x[0])
            self.evicted += 1
            self._close(oldest)
        self.idle_since[handler] = time.monotonic()
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP_S, self._sweep)
        return True

    def discard(self, handler: "GuardedHandler") -> None:
        self.idle_since.pop(handler, None)

    def fit(self, fd_limit: int) -> None:
        """Lower the cap to what ``fd_limit`` open files leave for connections (logged)."""
        room = max(1, fd_limit - RESERVED_FDS)
        if self.max_connections > room:
            log.warning("connection cap %d lowered to %d: the open-file limit is %d",
                        self.max_connections, room, fd_limit)
            self.max_connections = room

    def _refresh(self) -> None:
        now = time.monotonic()
        for h, since in list(self.idle_since.items()):
            if h.closed:
                self.idle_since.pop(h, None)
            elif h.busy:
                self.idle_since[h] = None
            elif since is None:
                self.idle_since[h] = now

    def _close(self, handler: "GuardedHandler") -> None:
        self.idle_since.pop(handler, None)
        handler.force_close()
        if handler.transport is not None:
            handler.transport.abort()
        if handler.raw_transport is not None:  # still in its TLS handshake, or TLS under it
            handler.raw_transport.abort()

    def _sweep(self) -> None:
        self._sweeper = None
        self._refresh()
        now = time.monotonic()
        for h, since in list(self.idle_since.items()):
            if since is not None and now - since > self.header_timeout_s:
                self.timed_out += 1
                self._close(h)
        if self.idle_since:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP_S, self._sweep)


class GuardedHandler(RequestHandler):
    """aiohttp's request handler under a :class:`ConnectionGuard`, with JSON parser errors."""

    def __init__(self, manager: Any, *, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.guard = guard
        self.admitted = False
        #: the TCP transport under TLS (set from accept by :class:`TlsGate`), else None
        self.raw_transport: asyncio.Transport | None = None
        #: length of the first request line seen (to tell 414 from 431)
        self.line_bytes = 0
        self.line_ended = False

    def data_received(self, data: bytes) -> None:
        if not self.line_ended:
            end = data.find(b"\n")
            self.line_bytes += len(data) if end < 0 else end
            self.line_ended = end >= 0
        super().data_received(data)

    @property
    def busy(self) -> bool:
        """A request of this connection is being handled (its headers are in)."""
        return self._current_request is not None

    @property
    def closed(self) -> bool:
        """A TLS connection that went away before its handshake ended."""
        return (self.transport is None and self.raw_transport is not None
                and self.raw_transport.is_closing())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.admitted:  # over TLS: admitted at accept (TlsGate), the handshake is done
            super().connection_made(transport)
            return
        if not self.guard.admit(self):
            assert isinstance(transport, asyncio.WriteTransport)
            body = error_body(503, "too many connections; try again",
                              reason="too_many_connections")
            transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json"
                            b"\r\nConnection: close\r\nContent-Length: "
                            + str(len(body)).encode() + b"\r\n\r\n" + body)
            transport.close()
            return
        self.admitted = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.guard.discard(self)
        if self.admitted:
            super().connection_lost(exc)

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """Errors aiohttp answers before routing (bad request line, headers too long, ...)."""
        if status >= 500:
            log.error("HTTP error %d: %s", status, exc, exc_info=exc)
            text = "internal error; see the server log"
        elif isinstance(exc, LineTooLong):
            # the request line (URL + query) or a header line beyond the limit
            status = 414 if self.line_bytes > MAX_LINE_BYTES else 431
            text = (f"{_PARSER_MESSAGES[status]} (limit {MAX_LINE_BYTES} bytes per line)")
        else:
            text = _PARSER_MESSAGES.get(status, "bad request")
            if isinstance(exc, HttpProcessingError) and exc.message:
                text += f": {exc.message[:200]}"
        resp = _json_error(status, text, reason=f"http_{status}")
        resp.force_close()
        return resp


class TlsGate(asyncio.Protocol):
    """The protocol of an accepted TCP connection of a TLS site: admits the connection under
    the guard at once (so it counts against the cap and the header deadline during its
    handshake), then runs the TLS server side (asyncio's own :class:`asyncio.sslproto.SSLProtocol`,
    the one ``loop.create_server(ssl=...)`` uses) with a handshake timeout of the header
    deadline; the request handler sees the connection once the handshake is done."""

    def __init__(self, handler: GuardedHandler, context: ssl.SSLContext) -> None:
        self.handler = handler
        self.context = context

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        handler = self.handler
        handler.raw_transport = transport
        if not handler.guard.admit(handler):
            transport.abort()  # no plain-text 503 can reach a client expecting TLS
            return
        handler.admitted = True
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        waiter.add_done_callback(self._handshake_done)
        # (the guard's sweep closes the connection at the deadline itself; whole seconds here)
        tls = sslproto.SSLProtocol(loop, handler, self.context, waiter, server_side=True,
                                   ssl_handshake_timeout=math.ceil(handler.guard.header_timeout_s))
        transport.set_protocol(tls)
        tls.connection_made(transport)

    def _handshake_done(self, waiter: asyncio.Future) -> None:
        failed = waiter.cancelled() or waiter.exception() is not None  # refused, timed out
        if failed or self.handler.transport is None:  # ... or the client went away
            self.handler.guard.discard(self.handler)
            if self.handler.raw_transport is not None:
                self.handler.raw_transport.abort()

    def data_received(self, data: bytes) -> None:  # never: the TLS protocol takes over at once
        raise AssertionError("TlsGate received data")


class HardenedSite(TCPSite):
    """A TCP site whose connections are :class:`GuardedHandler` s under one guard."""

    def __init__(self, runner: Any, host: str, port: int, *, guard: ConnectionGuard,
                 **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self.guard = guard

    async def start(self) -> None:
        await BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None

        self.guard.fit(raise_fd_limit())
        tls = self._ssl_context

        def handler() -> GuardedHandler:
            return GuardedHandler(server, loop=loop, guard=self.guard, access_log=None,
                                  keepalive_timeout=KEEPALIVE_TIMEOUT_S,
                                  max_line_size=MAX_LINE_BYTES, max_field_size=MAX_FIELD_BYTES)

        def factory() -> asyncio.Protocol:
            return handler() if tls is None else TlsGate(handler(), tls)

        # TLS is run by TlsGate, not by create_server: a connection counts from its accept
        self._server = await loop.create_server(factory, self._host, self._port,
                                                backlog=self._backlog)
        self._bound_port = self._server.sockets[0].getsockname()[1]
