"""The worker's HTTP server, hardened (docs/security.md "The HTTP port"): faust serves the
views (agents/serve/web.py) with aiohttp; :class:`HardenedWeb` is faust's aiohttp driver, registered as
the web driver ``ldp-aiohttp://``, on the shared :class:`~ldpstream.http_guard.HardenedSite`
(connection cap with eviction, header deadline, JSON errors) with
:func:`~ldpstream.http_guard.json_errors`. Limits: ``LDP_WEB_MAX_CONNECTIONS``,
``LDP_WEB_HEADER_TIMEOUT_S``; request bodies are capped at ``MAX_BODY_BYTES``
(``web_application_options``).
"""
from __future__ import annotations

from typing import Any

from aiohttp.web_runner import BaseSite
from faust.web.drivers import DRIVERS
from faust.web.drivers.aiohttp import Web as AiohttpWeb

from ldpstream.http_guard import MAX_BODY_BYTES, WORKER_ENV, ConnectionGuard, HardenedSite, json_errors

__all__ = ["HardenedWeb", "DRIVER_URL", "MAX_BODY_BYTES"]

DRIVER_URL = "ldp-aiohttp://"


class HardenedWeb(AiohttpWeb):
    """faust's aiohttp web driver with :class:`HardenedSite` and :func:`json_errors`."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.web_app.middlewares.append(json_errors)
        self.guard = ConnectionGuard.from_env(WORKER_ENV)

    def _new_transport_tcp(self) -> BaseSite:
        return HardenedSite(self._runner, self.app.conf.web_bind, self.app.conf.web_port,
                            guard=self.guard, ssl_context=self.app.conf.web_ssl_context)


DRIVERS.aliases["ldp-aiohttp"] = f"{__name__}:HardenedWeb"
