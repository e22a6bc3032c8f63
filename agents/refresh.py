"""Periodic estimate refresh (DESIGN.md "Refresh"): read a collection's count tensors from Redis,
run every configured estimator on every configured marginal, write the estimates (with n, ε,
method, time and an error bound) back to Redis, update the gauges, and measure drift.

The estimation itself, :func:`refresh_collection`, is a pure function of the counts; it runs in a
one-thread executor so the worker's event loop keeps consuming while numpy works. When several
workers run, a Redis lease (``SET NX PX``) per collection lets one of them refresh per interval,
and a lock held during the refresh keeps a forced refresh from overlapping a timed one.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

import numpy as np

from ..estimators.mechanism import Mechanism
from ..estimators.metrics import tvd
from . import metrics
from .store import history_cap_for

log = logging.getLogger(__name__)

#: Redis keys owned by this module (hash-tagged like agents/store.py's keys).
LEASE_KEY = "ldp:{%s}:refresh_lease"
LOCK_KEY = "ldp:{%s}:refresh_lock"
#: max ``sent_at`` (unix seconds) of the reports counted so far; CountStore.apply(sent_at_max=...)
#: raises it atomically with the counts (read here for the freshness gauge).
SENT_AT_MAX_KEY = "ldp:{%s}:sent_at_max"

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


# --- pure part ----------------------------------------------------------------------------------
def _finite(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _json_cells(values: np.ndarray) -> list:
    vals = np.asarray(values, dtype=float)
    return vals.tolist() if np.isfinite(vals).all() else _nan_to_none(vals.tolist())


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_nan_to_none(v) for v in obj]
    return obj if (obj is None or math.isfinite(obj)) else None


def _labels(collection: Any, mechanism: Mechanism, factor_domain: Any,
            attrs: Sequence[str]) -> list[list[str]]:
    for dom in (factor_domain, getattr(collection, "domain", None), mechanism.domain):
        if dom is not None and getattr(dom, "labels", None) is not None:
            try:
                return [list(lab) for lab in dom.project(attrs).labels]
            except KeyError:
                continue
    sizes = mechanism.domain.project(attrs).shape
    return [[str(i) for i in range(s)] for s in sizes]


def estimate_payload(collection: Any, mechanism: Mechanism, counts: Mapping[str, np.ndarray],
                     attrs: Sequence[str], method: str, now: float) -> dict[str, Any]:
    """One estimate as the JSON payload stored in Redis and served by ``GET /estimates``."""
    attrs = tuple(attrs)
    est = mechanism.estimate(counts, attrs, method)
    factor = est.factor
    if tuple(factor.domain.attrs) != attrs:
        factor = factor.project(attrs)
    extra = dict(est.extra or {})
    chosen = extra.get("chosen")
    if chosen is None and method.startswith("hybrid"):
        chosen = extra.get("method")
    return {
        "collection": collection.id,
        "attrs": list(attrs),
        "method": method,
        "cells": _json_cells(factor.values),
        "labels": _labels(collection, mechanism, factor.domain, attrs),
        "n": int(est.n),
        "epsilon": float(est.epsilon),
        "epsilon_scope": getattr(collection, "epsilon_scope", None),
        "error_bound": _finite(est.error_bound),
        "updated_at": float(now),
        "iterations": None if est.iterations is None else int(est.iterations),
        "converged": None if est.converged is None else bool(est.converged),
        "chosen": None if chosen is None else str(chosen),
        "version": int(getattr(mechanism, "version", 0)),
    }


def refresh_collection(collection: Any, mechanism: Mechanism, counts: Mapping[str, np.ndarray],
                       now: float) -> list[dict[str, Any]]:
    """Run every configured estimator on every configured marginal of ``collection``.

    Returns one payload per (marginal, estimator) that could be computed; an estimator that
    raises is logged and skipped so one bad method cannot stop the others. No reports → [].
    """
    if not counts or all(int(np.asarray(c).sum()) == 0 for c in counts.values()):
        return []
    out = []
    for attrs in collection.marginals:
        for method in collection.estimators:
            try:
                out.append(estimate_payload(collection, mechanism, counts, attrs, method, now))
            except Exception:  # noqa: BLE001 - keep refreshing the other estimates
                log.exception("refresh %s: %s on %s failed", collection.id, method, attrs)
    return out


def drift_tvd(newest: Mapping[str, Any], history: Sequence[Mapping[str, Any]],
              window_s: float) -> float | None:
    """TVD between ``newest`` and the newest entry of ``history`` at least ``window_s`` older.

    ``history`` holds past payloads (any order; each with ``updated_at`` and ``cells``). None when
    no entry is that old yet, or when the shapes differ (the marginal's schema changed).
    """
    cutoff = float(newest["updated_at"]) - float(window_s)
    ref = None
    for h in history:
        t = h.get("updated_at")
        if t is None or float(t) > cutoff + 1e-9:
            continue
        if ref is None or float(t) > float(ref["updated_at"]):
            ref = h
    if ref is None:
        return None
    a = np.asarray(_none_to_nan(newest["cells"]), float)
    b = np.asarray(_none_to_nan(ref["cells"]), float)
    if a.shape != b.shape:
        return None
    return tvd(np.nan_to_num(a), np.nan_to_num(b))


def _none_to_nan(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_none_to_nan(v) for v in obj]
    return float("nan") if obj is None else obj


# --- Redis helpers ------------------------------------------------------------------------------
async def acquire(redis: Any, key: str, ttl_ms: int) -> str | None:
    """``SET key token NX PX ttl``: the token when acquired, else None."""
    token = uuid.uuid4().hex
    ok = await redis.set(key, token, nx=True, px=max(1, int(ttl_ms)))
    return token if ok else None


async def release(redis: Any, key: str, token: str) -> bool:
    """Delete ``key`` only if it still holds ``token`` (compare-and-delete in Lua)."""
    return bool(await redis.eval(_RELEASE, 1, key, token))


async def read_sent_at_max(redis: Any, collection: str) -> float | None:
    raw = await redis.get(SENT_AT_MAX_KEY % collection)
    return None if raw is None else float(raw)


def _redis_of(store: Any) -> Any:
    for name in ("redis", "_redis", "client"):
        r = getattr(store, name, None)
        if r is not None:
            return r
    raise AttributeError("CountStore exposes no redis client (expected .redis)")


# --- the refresher ------------------------------------------------------------------------------
class Refresher:
    """Refreshes the collections of one worker's context (see :func:`install`)."""

    def __init__(self, ctx: Any, *, executor: ThreadPoolExecutor | None = None) -> None:
        self.ctx = ctx
        self.executor = executor or ThreadPoolExecutor(max_workers=1,
                                                       thread_name_prefix="ldp-refresh")

    @property
    def store(self) -> Any:
        return self.ctx.store

    @property
    def redis(self) -> Any:
        return _redis_of(self.ctx.store)

    def collection(self, cid: str) -> Any:
        return self.ctx.config.collections[cid]

    def mechanism(self, cid: str) -> Mechanism:
        getter = getattr(self.ctx, "mechanism", None)
        if callable(getter):
            return getter(cid)
        mechs = getattr(self.ctx, "mechanisms", None) or {}
        mech = mechs.get(cid)
        return mech if mech is not None else self.collection(cid).mechanism()

    def set_static_gauges(self, cid: str) -> None:
        coll = self.collection(cid)
        metrics.REFRESH_INTERVAL.labels(cid).set(float(coll.refresh_interval_s))
        metrics.DRIFT_THRESHOLD.labels(cid).set(float(coll.drift_threshold))
        metrics.INGEST_EXPECTED.labels(cid).set(1.0 if getattr(coll, "expect_traffic", True) else 0.0)
        metrics.EPSILON_PER_RECORD.labels(cid).set(float(self.mechanism(cid).epsilon))

    async def tick(self, cid: str) -> list[dict[str, Any]] | None:
        """Timer entry: refresh unless another worker holds this interval's lease."""
        coll = self.collection(cid)
        lease_ms = max(500, int(0.8 * float(coll.refresh_interval_s) * 1000))
        if await acquire(self.redis, LEASE_KEY % cid, lease_ms) is None:
            # another worker refreshes this interval: mirror its estimates into our gauges so
            # every worker's /metrics agrees (Prometheus combines workers with max by ...)
            await self.sync_gauges(cid)
            return None
        return await self.refresh(cid, wait_s=0.0)

    async def sync_gauges(self, cid: str) -> int:
        """Set this worker's gauges from the estimates stored in Redis; returns how many."""
        coll = self.collection(cid)
        payloads = []
        for attrs in coll.marginals:
            for method in coll.estimators:
                p = await self.store.get_estimate(cid, method, tuple(attrs))
                if p is not None:
                    payloads.append(p)
        n_reports = await self.store.n(cid)
        metrics.COLLECTION_REPORTS.labels(cid).set(float(n_reports))
        metrics.EPSILON_PER_RECORD.labels(cid).set(float(self.mechanism(cid).epsilon))
        if not payloads:
            return 0
        newest = max(float(p["updated_at"]) for p in payloads)
        metrics.LAST_REFRESH.labels(cid).set(newest)
        sent = max((p.get("sent_at_max") or 0.0 for p in payloads), default=0.0)
        if sent:
            metrics.FRESHNESS.labels(cid).set(max(0.0, newest - float(sent)))
        self._estimate_gauges(cid, payloads)
        return len(payloads)

    async def refresh(self, cid: str, *, wait_s: float = 30.0,
                      lock_ttl_s: float = 120.0) -> list[dict[str, Any]] | None:
        """Refresh ``cid`` now under the collection lock (waiting up to ``wait_s`` for it).

        Returns the payloads written, or None when the lock could not be taken.
        """
        key = LOCK_KEY % cid
        deadline = time.monotonic() + wait_s
        while True:
            token = await acquire(self.redis, key, int(lock_ttl_s * 1000))
            if token is not None or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        if token is None:
            return None
        try:
            return await self._refresh_locked(cid)
        finally:
            try:
                await release(self.redis, key, token)
            except Exception:  # noqa: BLE001 - the TTL frees it anyway
                log.warning("refresh %s: could not release the lock", cid, exc_info=True)

    async def _refresh_locked(self, cid: str) -> list[dict[str, Any]]:
        coll = self.collection(cid)
        mech = self.mechanism(cid)
        t0 = time.perf_counter()
        counts = await self.store.read_all(cid, coll.tensors())
        n_reports = await self.store.n(cid)
        sent_at_max = await self._sent_at_max(cid)
        now = time.time()
        loop = asyncio.get_running_loop()
        payloads = await loop.run_in_executor(self.executor, refresh_collection, coll, mech,
                                              counts, now)
        window = float(coll.drift_window_s)
        interval = float(coll.refresh_interval_s)
        # keep enough history that an entry a drift window old always exists (a fixed cap would
        # silently disable drift for windows longer than cap × interval)
        cap = history_cap_for(window, interval)
        for p in payloads:
            p["sent_at_max"] = sent_at_max
            try:
                hist = await self.store.estimate_history(cid, p["method"], p["attrs"],
                                                         2 * window + 2 * interval)
            except Exception:  # noqa: BLE001
                log.warning("refresh %s: no estimate history", cid, exc_info=True)
                hist = []
            p["drift_tvd"] = drift_tvd(p, hist, window)
            await self.store.put_estimate(cid, p["method"], p["attrs"], p, history_cap=cap)
        elapsed = time.perf_counter() - t0
        self._update_gauges(cid, mech, payloads, n_reports, now, sent_at_max, elapsed)
        return payloads

    async def _sent_at_max(self, cid: str) -> float | None:
        getter = getattr(self.store, "sent_at_max", None)
        if getter is not None:
            return await getter(cid)
        return await read_sent_at_max(self.redis, cid)

    def _update_gauges(self, cid: str, mech: Mechanism, payloads: Sequence[Mapping[str, Any]],
                       n_reports: int, now: float, sent_at_max: float | None,
                       elapsed: float) -> None:
        metrics.REFRESH_SECONDS.labels(cid).observe(elapsed)
        metrics.LAST_REFRESH.labels(cid).set(now)
        metrics.COLLECTION_REPORTS.labels(cid).set(float(n_reports))
        metrics.EPSILON_PER_RECORD.labels(cid).set(float(mech.epsilon))
        if sent_at_max is not None and n_reports:
            metrics.FRESHNESS.labels(cid).set(max(0.0, now - sent_at_max))
        self._estimate_gauges(cid, payloads)

    @staticmethod
    def _estimate_gauges(cid: str, payloads: Sequence[Mapping[str, Any]]) -> None:
        for p in payloads:
            marginal = metrics.marginal_label(p["attrs"])
            method = p["method"]
            flat = np.asarray(_none_to_nan(p["cells"]), float).ravel()
            for label, v in zip(metrics.cell_labels(p["labels"]), flat):
                metrics.ESTIMATE_CELL.labels(cid, marginal, method, label).set(float(v))
            eb = p.get("error_bound")
            metrics.ESTIMATE_ERROR_BOUND.labels(cid, marginal, method).set(
                float("nan") if eb is None else float(eb))
            if p.get("drift_tvd") is not None:
                metrics.ESTIMATE_DRIFT.labels(cid, marginal, method).set(float(p["drift_tvd"]))


def refresher_for(ctx: Any) -> Refresher:
    """The :class:`Refresher` of a worker context (created on first use, kept in
    ``ctx.extras["refresh"]``)."""
    extras = getattr(ctx, "extras", None)
    if extras is None:
        extras = {}
        try:
            ctx.extras = extras
        except AttributeError:
            pass
    r = extras.get("refresh")
    if r is None:
        r = extras["refresh"] = Refresher(ctx)
    return r


async def refresh_now(ctx: Any, cid: str, *, wait_s: float = 30.0) -> list[dict[str, Any]] | None:
    """Force a refresh of ``cid`` (used by ``POST /collections/<id>/refresh``)."""
    return await refresher_for(ctx).refresh(cid, wait_s=wait_s)


def install(app: Any, ctx: Any) -> Refresher:
    """Register one faust timer per collection (``app.timer(refresh_interval_s)``)."""
    refresher = refresher_for(ctx)
    for cid, coll in ctx.config.collections.items():
        try:
            refresher.set_static_gauges(cid)
        except Exception:  # noqa: BLE001 - mechanisms may need state first
            log.warning("refresh %s: static gauges not set", cid, exc_info=True)
        app.timer(float(coll.refresh_interval_s), name=f"ldp-refresh-{cid}")(_make_tick(refresher, cid))
    return refresher


def _make_tick(refresher: Refresher, cid: str):
    async def _tick() -> None:
        try:
            await refresher.tick(cid)
        except Exception:  # noqa: BLE001 - a failed refresh must not kill the timer
            log.exception("refresh %s failed", cid)
    _tick.__name__ = _tick.__qualname__ = f"refresh_{cid}"
    return _tick
