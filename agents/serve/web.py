"""HTTP API of a worker (faust web views): collections, estimates, Prometheus metrics, health,
and token-guarded refresh/reset (docs/api.md).

    GET  /collections                      ids, schema, mechanism, ε, marginals, estimators, n
    GET  /collections/<id>                 one of them
    GET  /estimates/<id>                   the estimates stored for the collection (index)
    GET  /estimates/<id>?attrs=a,b&method=m&window=1h
                                           one estimate (cells transposed to the attrs order;
                                           window: one of the collection's, default its first;
                                           a subset of a configured marginal is summed from it;
                                           raw=1: unbiased cells unprojected, docs/api.md)
    GET  /, /ui/..., /ui/history/<id>      the live page (agents/serve/ui.py)
    GET  /metrics                          Prometheus text (agents/metrics.py REGISTRY)
    GET  /healthz                          Redis PING + broker metadata; 200 or 503
    POST /collections/<id>/refresh         refresh now          } Authorization: Bearer
    POST /collections/<id>/reset           clear counts+estimates }  $LDP_API_TOKEN, else 403
                                           (Kafka offsets kept: nothing is recounted)

Every error is JSON ``{"error": "..."}`` naming what is missing or wrong, including the ones no
view answers (unknown route, wrong method, oversized or malformed requests, unhandled errors:
agents/serve/http_guard.py, which also caps connections and times out slow headers).
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import TYPE_CHECKING, Any

from faust import web

from ldpstream.agents import metrics
from ldpstream.agents.ingest.clients import REDIS_ERRORS
from ldpstream.agents.serve.selection import (
    covering_marginal,
    marginalize_payload,
    match_marginal,
    parse_attrs,
    transpose_payload,
)
from ldpstream.agents.worker import Worker
from ldpstream.estimators.kernels.serving import raw_payload
from ldpstream.kafka_admin import BrokerProbe
from ldpstream.privacy import epsilon_fields, over_time
from ldpstream.redis_client import health as redis_health

if TYPE_CHECKING:
    from ldpstream.config import Collection
    from ldpstream.estimators.mechanism import Mechanism

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 2.0


# --- helpers (pure) -----------------------------------------------------------------------------
#: ``raw=`` values of ``GET /estimates``: the unprojected unbiased cells on request
RAW_VALUES = {"0": False, "false": False, "1": True, "true": True}


def token_ok(configured: str | None, header: str | None) -> bool:
    """True only when a token is configured and the header is exactly ``Bearer <token>``."""
    if not configured or not header:
        return False
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        return False
    # aiohttp decodes header bytes that are not UTF-8 as surrogates: compare the bytes sent
    return hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"),
                               str(configured).encode("utf-8"))


def collection_info(coll: Collection, mechanism: Mechanism, n: int | None,
                    device_state_full: int = 0) -> dict[str, Any]:
    """The JSON description of one collection (``device_state_full``: reports this worker
    refused for want of device state, docs/privacy-over-time.md)."""
    dom = coll.domain
    labels = dom.labels or tuple(tuple(str(i) for i in range(s)) for s in dom.shape)
    try:
        longitudinal = mechanism.guarantee().to_dict()
    except Exception:  # noqa: BLE001 - adaptive mechanisms may lack state yet
        longitudinal = None
    return {
        "id": coll.id,
        "topic": coll.topic,
        "version": mechanism.version,      # the state in force (adaptive: the controller's)
        "accepted_versions": list(mechanism.accepted_versions()),
        "config_version": coll.version,
        "schema": {a: list(lab) for a, lab in zip(dom.attrs, labels)},
        "mechanism": coll.mechanism_name,
        **epsilon_fields(coll, mechanism),
        "longitudinal": longitudinal,
        "over_time": over_time(coll, mechanism, device_state_full),
        "marginals": [list(m) for m in coll.marginals],
        "estimators": list(coll.estimators),
        "n": n,
        "refresh_interval_s": coll.refresh_interval_s,
        "bucket_s": coll.bucket_s,
        "windows": [w.name for w in coll.windows],
        "drift_alpha": coll.drift_alpha,
        "drift_min_effect": coll.drift_min_effect,
        "expect_traffic": coll.expect_traffic,
    }


def _assigned_partitions(app: Any) -> int | None:
    try:
        return len(app.consumer.assignment())
    except Exception:  # noqa: BLE001 - not started / not available
        return None


# --- views --------------------------------------------------------------------------------------
def install(app: Any, worker: Worker) -> None:
    """Add the views to the faust ``app`` of ``worker`` (agents/worker.py)."""
    ctx = worker.ctx

    def coll_or_none(cid: str) -> Collection | None:
        return ctx.config.collections.get(cid)

    def mechanism_of(cid: str) -> Mechanism:
        return ctx.collections[cid].current

    def unknown(view: web.View, cid: str) -> Any:
        return view.error(404, f"unknown collection {cid!r}",
                          collections=sorted(ctx.config.collections))

    def store_unavailable(view: web.View, exc: BaseException) -> Any:
        log.warning("Redis unavailable: %s: %s", exc.__class__.__name__, exc)
        return view.error(503, f"count store (Redis) unavailable: {exc.__class__.__name__}: "
                               f"{exc}; nothing was changed, try again")

    def guarded(view: web.View, request: Any) -> Any | None:
        configured = ctx.config.api_token
        if not configured:
            return view.error(403, "state-changing endpoints are disabled: no API token "
                                   "configured (set LDP_API_TOKEN)")
        if not token_ok(configured, request.headers.get("Authorization")):
            return view.error(403, "missing or wrong token (send 'Authorization: Bearer "
                                   "$LDP_API_TOKEN')")
        return None

    async def n_of(cid: str) -> int | None:
        try:
            return int(await ctx.store.n(cid, range(int(ctx.config.collections[cid].partitions))))
        except Exception:  # noqa: BLE001 - Redis down: still describe the collection
            log.warning("n(%s) unavailable", cid, exc_info=True)
            return None

    def refused_devices(cid: str) -> int:
        """Reports of new devices this worker refused for want of device state."""
        return 0 if worker.ingest is None else worker.ingest.stats.device_state_full.get(cid, 0)

    @app.page("/collections", name="ldp_collections")
    class Collections(web.View):
        async def get(self, request: web.Request) -> web.Response:
            out = []
            for cid, coll in ctx.config.collections.items():
                out.append(collection_info(coll, mechanism_of(cid), await n_of(cid),
                                           refused_devices(cid)))
            return self.json({"collections": out})

    @app.page("/collections/{collection}", name="ldp_collection")
    class CollectionView(web.View):
        async def get(self, request: web.Request, collection: str) -> web.Response:
            coll = coll_or_none(collection)
            if coll is None:
                return unknown(self, collection)
            return self.json(collection_info(coll, mechanism_of(collection),
                                             await n_of(collection), refused_devices(collection)))

    @app.page("/estimates/{collection}", name="ldp_estimates")
    class Estimates(web.View):
        async def get(self, request: web.Request, collection: str) -> web.Response:
            coll = coll_or_none(collection)
            if coll is None:
                return unknown(self, collection)
            for name in ("attrs", "method", "window", "raw"):
                # faust types the query as a Mapping; at run time it is aiohttp's MultiDict
                given = request.query.getall(name, [])  # type: ignore[attr-defined]
                if len(given) > 1:
                    return self.error(400, f"{name}: given {len(given)} times ({given}); "
                                           f"give it once")
            attrs = parse_attrs(request.query.get("attrs"))
            method = request.query.get("method")
            if method is not None and method not in coll.estimators:
                return self.error(404, f"method {method!r} is not configured for collection "
                                       f"{collection!r}", estimators=list(coll.estimators))
            wname = request.query.get("window")
            if wname is not None and coll.window(wname) is None:
                return self.error(404, f"window {wname!r} is not configured for collection "
                                       f"{collection!r}", windows=[w.name for w in coll.windows])
            raw = request.query.get("raw", "0")
            if raw not in RAW_VALUES:
                return self.error(400, f"raw: must be one of {', '.join(RAW_VALUES)} (got "
                                       f"{raw!r})")
            try:
                if attrs is None:
                    return self.json(await self._index(coll, method, wname))
                return await self._one(coll, attrs, method or coll.estimators[0],
                                       wname or coll.windows[0].name, RAW_VALUES[raw])
            except Exception as exc:  # noqa: BLE001 - Redis unavailable
                log.warning("estimates %s failed", collection, exc_info=True)
                return self.error(503, f"estimate store unavailable: {exc.__class__.__name__}: {exc}")

        async def _index(self, coll: Any, method: str | None,
                         window: str | None) -> dict[str, Any]:
            items = []
            for w in ([window] if window else [w.name for w in coll.windows]):
                for m in coll.marginals:
                    for meth in ([method] if method else coll.estimators):
                        p = await ctx.store.get_estimate(coll.id, w, meth, tuple(m))
                        items.append({"attrs": list(m), "method": meth, "window": w,
                                      "updated_at": None if p is None else p.get("updated_at"),
                                      "n": None if p is None else p.get("n"),
                                      "available": p is not None and p.get("cells") is not None,
                                      "error": None if p is None else p.get("error")})
            return {"collection": coll.id, "windows": [w.name for w in coll.windows],
                    "estimates": items}

        async def _one(self, coll: Any, attrs: tuple[str, ...], method: str,
                       window: str, raw: bool = False) -> web.Response:
            if len(set(attrs)) != len(attrs):
                return self.error(400, f"attrs: an attribute is repeated in {list(attrs)}")
            missing = [a for a in attrs if a not in coll.domain.attrs]
            if missing:
                return self.error(404, f"attribute {missing[0]!r} is not in the schema of "
                                       f"collection {coll.id!r}", attributes=list(coll.domain.attrs))
            stored = match_marginal(coll.marginals, attrs) or covering_marginal(coll.marginals,
                                                                                 attrs)
            if stored is None:
                return self.error(404, f"marginal {','.join(attrs)} is not configured for "
                                       f"collection {coll.id!r}, nor contained in a configured "
                                       f"one", marginals=[",".join(m) for m in coll.marginals])
            why = mechanism_of(coll.id).check_marginal(attrs, method) if len(stored) > len(
                attrs) else None
            if why is not None:   # e.g. the mean of a categorical attribute (sw-hm)
                return self.error(400, f"attrs {','.join(attrs)} with {method!r}: {why}",
                                  marginals=[",".join(m) for m in coll.marginals])
            payload = await ctx.store.get_estimate(coll.id, window, method, stored)
            if payload is None:
                return self.error(404, f"no estimate yet for {','.join(stored)} with {method!r} "
                                       f"over window {window!r} in collection {coll.id!r} "
                                       f"(refreshed every {coll.refresh_interval_s}s once reports "
                                       f"arrive in the window)")
            if payload.get("empty"):
                span = "counted yet" if window == "all" else f"in the last {window}"
                return self.error(404, f"no reports {span} in collection {coll.id!r} (under the "
                                       f"mechanism versions it accepts now)",
                                  windows=[w.name for w in coll.windows])
            if payload.get("error") is not None:
                return self.error(500, f"estimating {','.join(attrs)} with {method!r} over window "
                                       f"{window!r} failed: {payload['error']}",
                                  failed_at=payload.get("updated_at"))
            if raw:
                payload = raw_payload(payload)
            if len(stored) > len(attrs):
                payload = marginalize_payload(payload, attrs)
            full = over_time(coll, mechanism_of(coll.id), refused_devices(coll.id))["warning"]
            if full is not None:   # devices missing from the estimate: said in the answer
                payload = {**payload, "warnings": [*(payload.get("warnings") or []), full]}
            return self.json(transpose_payload(payload, attrs))

    @app.page("/metrics", name="ldp_metrics")
    class Metrics(web.View):
        async def get(self, request: web.Request) -> web.Response:
            body, content_type = metrics.render()
            # aiohttp refuses a charset inside content_type=; send the full header instead
            return self.bytes(body, headers={"Content-Type": content_type})

    broker_probe = BrokerProbe(ctx.kafka_bootstrap or ctx.config.kafka_bootstrap or "",
                               ctx.kafka_security, HEALTH_TIMEOUT_S)

    @app.page("/healthz", name="ldp_healthz")
    class Healthz(web.View):
        async def get(self, request: web.Request) -> web.Response:
            checks: dict[str, Any] = {}
            # a cluster: every master answers and cluster_state is ok (a failover shows here)
            checks["redis"] = await redis_health(ctx.store.redis, HEALTH_TIMEOUT_S)
            try:
                ok, detail = await asyncio.wait_for(broker_probe.check(), 2 * HEALTH_TIMEOUT_S + 1)
                checks["broker"] = {"ok": ok, "detail": detail}
            except Exception as exc:  # noqa: BLE001
                checks["broker"] = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
            ingest = worker.ingest
            if ingest is not None:
                try:
                    checks["ingest"] = ingest.status()
                except Exception as exc:  # noqa: BLE001
                    checks["ingest"] = {"error": f"{exc.__class__.__name__}: {exc}"}
            else:
                checks["ingest"] = {"assigned_partitions": _assigned_partitions(app)}
            checks["refresh"] = {cid: dict(h) for cid, h in
                                 worker.refresher.health.items()}
            healthy = checks["redis"]["ok"] and checks["broker"]["ok"]
            resets = checks["ingest"].get("log_resets") or []
            # a Kafka log found recreated/truncated: still serving, but loudly (docs/security.md)
            checks["log"] = {"ok": not resets, "resets": resets}
            # memoized collections: devices refused for want of state (docs/privacy-over-time.md)
            full = checks["ingest"].get("device_state_full") or {}
            checks["devices"] = {"ok": not full, "device_state_full": full}
            # acknowledged to devices and never taken by a worker (docs/security.md)
            gap = False
            if worker.acks is not None:
                checks["acks"] = worker.acks.status()
                gap = bool(checks["acks"]["gaps"])
            status = ("ok" if not (resets or full or gap) else "degraded") if healthy \
                else "unavailable"
            return self.json({"status": status, "checks": checks,
                              "uptime_s": round(time.time() - ctx.started_at, 3)},
                             status=200 if healthy else 503)

    @app.page("/collections/{collection}/refresh", name="ldp_refresh")
    class Refresh(web.View):
        async def post(self, request: web.Request, collection: str) -> web.Response:
            denied = guarded(self, request)
            if denied is not None:
                return denied
            if coll_or_none(collection) is None:
                return unknown(self, collection)
            t0 = time.perf_counter()
            try:
                payloads = await worker.refresher.refresh(collection, wait_s=30.0)
            except REDIS_ERRORS as exc:
                return store_unavailable(self, exc)
            if payloads is None:
                return self.error(409, f"collection {collection!r} is being refreshed by another "
                                       f"worker; try again")
            return self.json({"collection": collection, "refreshed": len(payloads),
                              "estimates": [{"attrs": p["attrs"], "method": p["method"],
                                             "n": p["n"]} for p in payloads],
                              "seconds": round(time.perf_counter() - t0, 4)})

    @app.page("/collections/{collection}/reset", name="ldp_reset")
    class Reset(web.View):
        async def post(self, request: web.Request, collection: str) -> web.Response:
            denied = guarded(self, request)
            if denied is not None:
                return denied
            if coll_or_none(collection) is None:
                return unknown(self, collection)
            try:
                # offsets kept: a partition that moves must not recount what it counted
                deleted = await ctx.store.reset(collection, keep_offsets=True)
            except REDIS_ERRORS as exc:
                return store_unavailable(self, exc)
            metrics.clear_collection(collection)
            metrics.COLLECTION_REPORTS.labels(collection).set(0)
            return self.json({"collection": collection, "reset": True, "keys_deleted": deleted,
                              "offsets_kept": True})
