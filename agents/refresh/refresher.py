"""Periodic estimate refresh over time windows (docs/windows.md): read a collection's bucket counts
from Redis, run every configured estimator on every configured marginal for every configured
window, write the estimates (with n, ε, method, window, time and an error bound) back to Redis,
update the gauges, and compare each window with the previous window of the same length (drift).

The estimation itself (agents/refresh/payloads.py) is a pure function of the counts; it runs in
a one-thread executor so the worker's event loop keeps consuming while numpy works, batched over
the marginals (estimators/stream/many.py). A window's counts are the sum of its buckets
(ldpstream/windows.py ``cover``: coarse buckets inside, fine buckets at the edges);
:class:`~.bucket_reader.BucketReader` re-reads only the buckets whose report count (cell 0)
changed since the last
refresh, and a table that did not change is not estimated again. Drift compares each finite
window with the previous window of the same length: the calibrated statistic of
estimators/stream/drift.py (max |z| over cells against a Šidák threshold at ``drift_alpha``).

When several workers run, a Redis lease (agents/store/lease.py) per collection lets one of them
refresh per interval, and a lock held during the refresh keeps a forced refresh from overlapping a timed one.
An estimator that raises is counted (``ldp_estimate_failures_total``, ``ldp_estimate_failing``)
and its reason stored where the estimate would be, so the API answers with it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

import numpy as np

from ldpstream.agents import metrics
from ldpstream.agents.context import Context
from ldpstream.agents.refresh.bucket_reader import BucketReader
from ldpstream.agents.refresh.payloads import PREVIOUS, none_to_nan, refresh_payloads
from ldpstream.agents.refresh.window_snapshots import WindowSnapshots
from ldpstream.agents.store import keys
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.lease import acquire, release
from ldpstream.estimators.mechanism import Mechanism
from ldpstream.estimators.stream.many import EstimateCache

log = logging.getLogger(__name__)


LEASE = "refresh_lease"
LOCK = "refresh_lock"


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
        if mech.memoization() is not None:  # agents/refresh/window_snapshots.py
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
            if p.get("numeric") is not None:   # summaries, not the input grid's cells
                metrics.numeric_gauges(labels, p["numeric"])
            else:
                flat = np.asarray(none_to_nan(p["cells"]), float).ravel()
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


def install(app: Any, refresher: Refresher) -> None:
    """Register one faust timer per collection (``app.timer(refresh_interval_s)``)."""
    for cid, coll in refresher.ctx.config.collections.items():
        refresher.set_static_gauges(cid)
        app.timer(float(coll.refresh_interval_s), name=f"ldp-refresh-{cid}")(_make_tick(refresher, cid))


def _make_tick(refresher: Refresher, cid: str):
    async def _tick() -> None:
        await tick_safe(refresher, cid)
    _tick.__name__ = _tick.__qualname__ = f"refresh_{cid}"
    return _tick
