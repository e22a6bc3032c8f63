"""Periodic estimate refresh over time windows (docs/windows.md): read a collection's bucket counts
from Redis, run every configured estimator on every configured marginal for every configured
window, write the estimates (with n, ε, method, window, time and an error bound) back to Redis,
update the gauges, and compare each window with the previous window of the same length (drift).

The estimation itself (:func:`refresh_payloads`) is a pure function of the counts; it runs in a
one-thread executor so the worker's event loop keeps consuming while numpy works, batched over
the marginals (estimators/stream/many.py). A window's counts are the sum of its buckets
(ldpstream/windows.py ``cover``: coarse buckets inside, fine buckets at the edges);
:class:`~.bucket_reader.BucketReader` re-reads only the buckets whose report count (cell 0)
changed since the last
refresh, and a table that did not change is not estimated again. Drift compares each finite
window with the previous window of the same length: the calibrated statistic of
estimators/stream/drift.py (max |z| over cells against a Šidák threshold at ``drift_alpha``).

When several workers run, a Redis lease (``SET NX PX``) per collection lets one of them refresh per
interval, and a lock held during the refresh keeps a forced refresh from overlapping a timed one.
An estimator that raises is counted (``ldp_estimate_failures_total``, ``ldp_estimate_failing``)
and its reason stored where the estimate would be, so the API answers with it.
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

from ldpstream.agents import keys, metrics
from ldpstream.agents.bucket_reader import BucketReader, WindowCounts
from ldpstream.agents.context import Context
from ldpstream.agents.store import CountStore
from ldpstream.agents.window_snapshots import WindowSnapshots
from ldpstream.estimators.kernels.serving import served_fields
from ldpstream.estimators.mechanism import Estimate, Mechanism
from ldpstream.estimators.stream.many import EstimateCache, drift_many, estimate_many
from ldpstream.privacy import epsilon_fields
from ldpstream.windows import Window

log = logging.getLogger(__name__)

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

LEASE = "refresh_lease"
LOCK = "refresh_lock"


# --- pure part ----------------------------------------------------------------------------------
def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_nan_to_none(v) for v in obj]
    return obj if (obj is None or math.isfinite(obj)) else None


def _none_to_nan(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_none_to_nan(v) for v in obj]
    return float("nan") if obj is None else obj


def _json_cells(values: np.ndarray) -> list:
    vals = np.asarray(values, dtype=float)
    return vals.tolist() if np.isfinite(vals).all() else _nan_to_none(vals.tolist())


def _labels(collection: Any, attrs: Sequence[str]) -> list[list[str]]:
    dom = collection.domain.project(attrs)
    if dom.labels is not None:
        return [list(lab) for lab in dom.labels]
    return [[str(i) for i in range(s)] for s in dom.shape]


def estimate_payload(collection: Any, mechanism: Mechanism, est: Estimate,
                     attrs: Sequence[str], method: str, window: Window, now: float,
                     versions: Sequence[int]) -> dict[str, Any]:
    """One estimate as the JSON payload stored in Redis and served by ``GET /estimates``."""
    attrs = tuple(attrs)
    served = served_fields(est, attrs)   # projected cells, the bound and its quantile
    extra = dict(est.extra or {})
    chosen = extra.get("chosen")
    if chosen is None and method.startswith("hybrid"):
        chosen = extra.get("method")
    return {
        "collection": collection.id,
        "attrs": list(attrs),
        "method": method,
        "window": window.name,
        "window_s": window.seconds,
        "cells": _json_cells(served.pop("cells")),
        "labels": _labels(collection, attrs),
        "n": int(est.n),
        **epsilon_fields(collection, mechanism, float(est.epsilon)),
        **served,
        "updated_at": float(now),
        "iterations": None if est.iterations is None else int(est.iterations),
        "converged": None if est.converged is None else bool(est.converged),
        "chosen": None if chosen is None else str(chosen),
        "version": int(mechanism.version),
        "versions": sorted(int(v) for v in versions),
    }


def _stub(collection: Any, attrs: Sequence[str], method: str, window: Window,
          now: float, **fields: Any) -> dict[str, Any]:
    return {"collection": collection.id, "attrs": list(attrs), "method": method,
            "window": window.name, "window_s": window.seconds, "cells": None,
            "updated_at": float(now), **fields}


NO_DRIFT = {"drift_tvd": None, "drift_statistic": None, "drift_threshold": None,
            "drift_alarm": False}
#: suffix of the name under which a window's previous range is read and estimated
PREVIOUS = "/previous"


def refresh_payloads(collection: Any, mechanism: Mechanism, reads: Mapping[str, WindowCounts],
                     now: float, cache: EstimateCache) -> tuple[list[dict[str, Any]], int]:
    """Every configured estimator on every configured marginal for every configured window, and
    each finite window's drift against its previous window (estimators/stream/many.py: batched over the
    marginals, unchanged tables reused through ``cache``). ``reads`` holds each window's counts
    and, under ``<window>/previous``, its previous range's.

    Per (window, marginal, estimator) one payload: the estimate with its drift (tvd, calibrated
    statistic, threshold, alarm; :data:`NO_DRIFT` when the previous window holds no report); a
    failure (``error`` = the reason) when the estimator raised; ``empty`` when the window holds no
    report. Returns the payloads and how many estimates and variances were computed (not
    reused)."""
    counts = {name: wc.counts for name, wc in reads.items() if wc.n > 0}
    batch = estimate_many(mechanism, counts, collection.marginals, collection.estimators,
                          cache=cache)
    pairs = {w.name: (counts[w.name], counts[w.name + PREVIOUS]) for w in collection.windows
             if w.name in counts and w.name + PREVIOUS in counts}
    current = {k: e for k, e in batch.estimates.items() if not k[0].endswith(PREVIOUS)}
    previous = {(k[0].removesuffix(PREVIOUS), k[1], k[2]): e
                for k, e in batch.estimates.items() if k[0].endswith(PREVIOUS)}
    drift = drift_many(mechanism, pairs, current, previous, alpha=collection.drift_alpha,
                       min_effect=collection.drift_min_effect, cache=cache)
    out: list[dict[str, Any]] = []
    for w in collection.windows:
        versions = sorted(reads[w.name].counts)
        for attrs in collection.marginals:
            for method in collection.estimators:
                key = (w.name, tuple(attrs), method)
                if w.name not in counts:
                    out.append(_stub(collection, attrs, method, w, now, n=0, empty=True))
                elif key in batch.failures:
                    log.warning("refresh %s: %s on %s (%s) failed: %s", collection.id, method,
                                attrs, w.name, batch.failures[key])
                    out.append(_stub(collection, attrs, method, w, now,
                                     error=batch.failures[key]))
                else:
                    p = estimate_payload(collection, mechanism, current[key], attrs, method, w,
                                         now, versions)
                    res = drift.results.get(key)
                    p.update(NO_DRIFT if res is None else {
                        "drift_tvd": res.tvd, "drift_statistic": res.statistic,
                        "drift_threshold": res.threshold, "drift_alarm": res.alarm})
                    if key in drift.failures:
                        log.warning("refresh %s: drift of %s on %s (%s) not measured: %s",
                                    collection.id, method, attrs, w.name, drift.failures[key])
                        p["drift_error"] = drift.failures[key]
                    out.append(p)
    return out, batch.computed + drift.computed


# --- Redis helpers ------------------------------------------------------------------------------
async def acquire(redis: Any, key: str, ttl_ms: int) -> str | None:
    """``SET key token NX PX ttl``: the token when acquired, else None."""
    token = uuid.uuid4().hex
    ok = await redis.set(key, token, nx=True, px=max(1, int(ttl_ms)))
    return token if ok else None


async def release(redis: Any, key: str, token: str) -> bool:
    """Delete ``key`` only if it still holds ``token`` (compare-and-delete in Lua)."""
    return bool(await redis.eval(_RELEASE, 1, key, token))


# --- the refresher ------------------------------------------------------------------------------
class Refresher:
    """Refreshes the collections of one worker's context (see :func:`install`)."""

    def __init__(self, ctx: Context, *, executor: ThreadPoolExecutor | None = None) -> None:
        self.ctx = ctx
        self.executor = executor or ThreadPoolExecutor(max_workers=1,
                                                       thread_name_prefix="ldp-refresh")
        self._readers: dict[str, BucketReader] = {}
        self._caches: dict[str, EstimateCache] = {}
        #: memoized collections: each window's past counts, its drift's previous window
        self._snapshots: dict[str, WindowSnapshots] = {}
        #: collection → {"last_ok": unix s, "last_error": text, "failed_at": unix s,
        #: "failing_estimates": k}; shown by /healthz
        self.health: dict[str, dict[str, Any]] = {}

    @property
    def store(self) -> CountStore:
        return self.ctx.store

    @property
    def redis(self) -> Any:
        return self.ctx.store.redis

    def collection(self, cid: str) -> Any:
        return self.ctx.config.collections[cid]

    def mechanism(self, cid: str) -> Mechanism:
        return self.ctx.collections[cid].current

    def partitions(self, cid: str) -> list[int]:
        return list(range(int(self.collection(cid).partitions)))

    def reader(self, cid: str) -> BucketReader:
        r = self._readers.get(cid)
        if r is None:
            r = self._readers[cid] = BucketReader(self.store, cid, tuple(self.partitions(cid)))
        return r

    def set_static_gauges(self, cid: str) -> None:
        coll = self.collection(cid)
        metrics.REFRESH_INTERVAL.labels(cid).set(float(coll.refresh_interval_s))
        metrics.INGEST_EXPECTED.labels(cid).set(1.0 if coll.expect_traffic else 0.0)
        metrics.EPSILON_PER_RECORD.labels(cid).set(float(self.mechanism(cid).epsilon))

    async def tick(self, cid: str) -> list[dict[str, Any]] | None:
        """Timer entry: refresh unless another worker holds this interval's lease."""
        coll = self.collection(cid)
        lease_ms = max(500, int(0.8 * float(coll.refresh_interval_s) * 1000))
        if await acquire(self.redis, keys.collection_key(cid, LEASE), lease_ms) is None:
            # another worker refreshes this interval: mirror its estimates into our gauges so
            # every worker's /metrics agrees (Prometheus combines workers with max by ...)
            await self.sync_gauges(cid)
            return None
        return await self.refresh(cid, wait_s=0.0)

    async def stored_payloads(self, cid: str) -> list[dict[str, Any]]:
        coll = self.collection(cid)
        out = []
        for w in coll.windows:
            for attrs in coll.marginals:
                for method in coll.estimators:
                    p = await self.store.get_estimate(cid, w.name, method, tuple(attrs))
                    if p is not None:
                        out.append(p)
        return out

    async def sync_gauges(self, cid: str) -> int:
        """Set this worker's gauges from the estimates stored in Redis; returns how many."""
        payloads = await self.stored_payloads(cid)
        n_reports = await self.store.n(cid, self.partitions(cid))
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
        key = keys.collection_key(cid, LOCK)
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
        state = self.ctx.collections[cid]
        layouts = {v: state.layout(v) for v in sorted(state.versions())}
        policy = coll.policy
        t0 = time.perf_counter()
        now = time.time()
        ranges: dict[str, tuple[int, int] | None] = {}
        for w in coll.windows:
            if w.is_all:
                ranges[w.name] = None
            else:
                cur, prev = policy.ranges(w, now)
                ranges[w.name] = cur
                ranges[w.name + "/previous"] = prev
        read = await self.reader(cid).read(layouts, ranges)
        if mech.memoization() is not None:  # agents/window_snapshots.py
            self._snapshots.setdefault(cid, WindowSnapshots()).swap(read, coll.windows, now,
                                                                    PREVIOUS)
        n_reports = await self.store.n(cid, self.partitions(cid))
        sent_at_max = await self.store.sent_at_max(cid, self.partitions(cid))
        loop = asyncio.get_running_loop()
        cache = self._caches.setdefault(cid, EstimateCache())
        payloads, computed = await loop.run_in_executor(self.executor, refresh_payloads, coll,
                                                        mech, read, now, cache)
        for p in payloads:
            p["sent_at_max"] = sent_at_max
        await self.store.put_estimates(cid, payloads)
        elapsed = time.perf_counter() - t0
        self._update_gauges(cid, mech, payloads, n_reports, now, sent_at_max, elapsed)
        self.health[cid]["computed"] = computed
        return payloads

    def _update_gauges(self, cid: str, mech: Mechanism, payloads: Sequence[Mapping[str, Any]],
                       n_reports: int, now: float, sent_at_max: float | None,
                       elapsed: float) -> None:
        metrics.REFRESH_SECONDS.labels(cid).observe(elapsed)
        metrics.LAST_REFRESH.labels(cid).set(now)
        metrics.COLLECTION_REPORTS.labels(cid).set(float(n_reports))
        metrics.EPSILON_PER_RECORD.labels(cid).set(float(mech.epsilon))
        if sent_at_max is not None and n_reports:
            metrics.FRESHNESS.labels(cid).set(max(0.0, now - sent_at_max))
        failing = [p for p in payloads if p.get("error") is not None]
        self.health[cid] = {**self.health.get(cid, {}), "last_ok": now,
                            "failing_estimates": len(failing),
                            "failing": [f"{p['method']} on {','.join(p['attrs'])} ({p['window']}): "
                                        f"{p['error']}" for p in failing[:5]]}
        for p in failing:
            if p.get("updated_at") == now:
                metrics.ESTIMATE_FAILURES.labels(cid, metrics.marginal_label(p["attrs"]),
                                                 p["method"], p["window"]).inc()
        self._estimate_gauges(cid, payloads)

    @staticmethod
    def _estimate_gauges(cid: str, payloads: Sequence[Mapping[str, Any]]) -> None:
        for p in payloads:
            marginal = metrics.marginal_label(p["attrs"])
            labels = (cid, marginal, p["method"], p["window"])
            failed = p.get("error") is not None
            metrics.ESTIMATE_FAILING.labels(*labels).set(1.0 if failed else 0.0)
            if failed or p.get("cells") is None:
                continue
            flat = np.asarray(_none_to_nan(p["cells"]), float).ravel()
            for label, v in zip(metrics.cell_labels(p["labels"]), flat):
                metrics.ESTIMATE_CELL.labels(*labels, label).set(float(v))
            eb = p.get("error_bound")
            metrics.ESTIMATE_ERROR_BOUND.labels(*labels).set(
                float("nan") if eb is None else float(eb))
            metrics.ESTIMATE_NOT_CONVERGED.labels(*labels).set(
                1.0 if p.get("converged") is False else 0.0)
            if p.get("drift_statistic") is not None:
                metrics.ESTIMATE_DRIFT.labels(*labels).set(float(p["drift_tvd"]))
                metrics.DRIFT_STATISTIC.labels(*labels).set(float(p["drift_statistic"]))
                metrics.DRIFT_STATISTIC_THRESHOLD.labels(*labels).set(float(p["drift_threshold"]))
            metrics.DRIFT_ALARM.labels(*labels).set(1.0 if p.get("drift_alarm") else 0.0)


def refresher_for(ctx: Context) -> Refresher:
    """The :class:`Refresher` of a worker context (created on first use, kept in
    ``ctx.refresher``)."""
    if ctx.refresher is None:
        ctx.refresher = Refresher(ctx)
    return ctx.refresher


async def tick_safe(refresher: Refresher, cid: str) -> None:
    """One timer tick; a failure (e.g. Redis down) is logged, counted in
    ``ldp_refresh_errors_total`` and shown by /healthz, and never kills the timer."""
    try:
        await refresher.tick(cid)
    except Exception as exc:  # noqa: BLE001
        log.exception("refresh %s failed", cid)
        metrics.REFRESH_ERRORS.labels(cid).inc()
        refresher.health[cid] = {**refresher.health.get(cid, {}), "failed_at": time.time(),
                                 "last_error": f"{exc.__class__.__name__}: {exc}"}


async def refresh_now(ctx: Context, cid: str, *, wait_s: float = 30.0
                      ) -> list[dict[str, Any]] | None:
    """Force a refresh of ``cid`` (used by ``POST /collections/<id>/refresh``)."""
    return await refresher_for(ctx).refresh(cid, wait_s=wait_s)


def install(app: Any, ctx: Context) -> Refresher:
    """Register one faust timer per collection (``app.timer(refresh_interval_s)``)."""
    refresher = refresher_for(ctx)
    for cid, coll in ctx.config.collections.items():
        refresher.set_static_gauges(cid)
        app.timer(float(coll.refresh_interval_s), name=f"ldp-refresh-{cid}")(_make_tick(refresher, cid))
    return refresher


def _make_tick(refresher: Refresher, cid: str):
    async def _tick() -> None:
        await tick_safe(refresher, cid)
    _tick.__name__ = _tick.__qualname__ = f"refresh_{cid}"
    return _tick
