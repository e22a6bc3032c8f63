"""The adaptive controller: runs a collection's adaptive step on the stream.

For a collection whose mechanism adapts (``Mechanism.adaptive``: RRBA block updates, Corr-RR's
Phase I → table, RS+RFD's priors, RR-Clusters' clustering) every worker runs one faust timer
(``controller_interval_s``). Each tick:

1. **follow**: read the collection's stored state (Redis hash ``ldp:{<cid>}:mechanism``: version,
   state JSON, origin) and adopt it when it is newer than the one in force — every worker, so
   that workers that never decide still accept the versions the state names;
2. **decide** (one worker, under the lease ``ldp:{<cid>}:controller_lease``): read the all-time
   counts of every accepted version (``CountStore.read_all_time``), run ``mech.adapt(counts)``
   off the event loop; a new state is stored with a compare-and-set on the version (two holders
   racing past an expired lease cannot both advance) and adopted;
3. **publish**: a stored version is published to the compacted ``ldp.config`` (through the
   ingest service's one signed publish function) one tick after it was stored, so every live
   worker has followed it before a device can report with it (a worker that has not would file
   those reports as ``unknown_version``).

Rules. A state's ``accepted_versions()`` are versions whose reports *it* can validate and count
(same report format and count layout), so the worker validates and counts them with the state in
force. Counts are kept per version (agents/store/keys.py), so a report is counted under the version it
is stamped with or not at all; nothing is moved between versions when the state changes. The
stored state carries the fingerprint of the config's version 0 (``origin``): a state stored for
another config is ignored (and replaced by the next step). A kill -9 between store and publish
leaves the state stored: the next tick (any worker) publishes it.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from ldpstream.agents import metrics
from ldpstream.agents.context import Context
from ldpstream.agents.store import keys
from ldpstream.agents.store.lease import acquire, release
from ldpstream.estimators.mechanism import Mechanism, from_state

log = logging.getLogger(__name__)

__all__ = ["Controller", "install", "store_state", "origin_of", "STATE",
           "LEASE"]

#: collection keys (agents/store/keys.py ``collection_key``)
STATE = "mechanism"
LEASE = "controller_lease"

_CAS = """
local cur = redis.call('HGET', KEYS[1], 'version')
local origin = redis.call('HGET', KEYS[1], 'origin')
if origin ~= ARGV[4] then cur = false end
if (cur == false and ARGV[1] == '-1') or cur == ARGV[1] then
  redis.call('HSET', KEYS[1], 'version', ARGV[2], 'state', ARGV[3], 'origin', ARGV[4],
             'stored_at', ARGV[5])
  return 1
end
return 0
"""


async def store_state(redis: Any, cid: str, origin: str, expected: int | None,
                      new: Mechanism) -> bool:
    """Store ``new`` as ``cid``'s state if the stored version is ``expected`` (None: nothing
    stored for this ``origin`` yet); True if stored."""
    return bool(await redis.eval(
        _CAS, 1, keys.collection_key(cid, STATE), "-1" if expected is None else str(expected),
        str(new.version), json.dumps(new.state()), origin, repr(time.time())))


def origin_of(mech: Mechanism) -> str:
    """Fingerprint of a collection's configured version-0 state."""
    text = json.dumps(mech.state(), sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


@dataclass
class _Track:
    origin: str
    #: version last published by this process (None: nothing yet)
    published: int | None = None
    #: unix time the version in force was stored (from Redis)
    stored_at: float = 0.0
    #: seconds the last decision took (read + adapt + store)
    last_step_s: float | None = None
    changes: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


class Controller:
    """Follows, decides and publishes the adaptive state of a worker's collections."""

    def __init__(self, ctx: Context,
                 publish: Callable[[], Awaitable[None]] | None = None) -> None:
        self.ctx = ctx
        self._publish = publish
        self.tracks: dict[str, _Track] = {}
        for cid, state in ctx.collections.items():
            self.tracks[cid] = _Track(origin_of(state.configured))
            metrics.MECHANISM_VERSION.labels(cid).set(float(state.current.version))

    @property
    def redis(self) -> Any:
        return self.ctx.store.redis

    def adaptive(self, cid: str) -> bool:
        return type(self.ctx.collections[cid].current).adaptive

    # --- follow -------------------------------------------------------------------------------
    async def stored(self, cid: str) -> tuple[Mechanism, float] | None:
        """The state stored for ``cid`` (and when it was stored), if it is for this config."""
        raw = await self.redis.hgetall(keys.collection_key(cid, STATE))
        if not raw:
            return None
        raw = {(k.decode() if isinstance(k, bytes) else k):
               (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()}
        if raw.get("origin") != self.tracks[cid].origin:
            return None
        return from_state(json.loads(raw["state"])), float(raw.get("stored_at", 0.0))

    def adopt(self, cid: str, mech: Mechanism, stored_at: float | None = None) -> None:
        """Make ``mech`` the state in force: it validates and counts every version it accepts."""
        old = self.ctx.collections[cid].adopt(mech)
        tr = self.tracks[cid]
        tr.stored_at = time.time() if stored_at is None else stored_at
        if mech.version != old.version:
            tr.changes += 1
            tr.history.append({"version": mech.version, "at": tr.stored_at,
                               "epsilon": mech.epsilon})
            del tr.history[:-20]
            metrics.MECHANISM_VERSION_CHANGES.labels(cid).inc()
            log.info("controller %s: version %d → %d (ε per report %.4g)", cid, old.version,
                     mech.version, mech.epsilon)
        metrics.MECHANISM_VERSION.labels(cid).set(float(mech.version))
        metrics.EPSILON_PER_RECORD.labels(cid).set(float(mech.epsilon))

    async def follow(self, cid: str) -> bool:
        """Adopt the stored state if it is newer than the one in force; True if adopted."""
        got = await self.stored(cid)
        if got is None or got[0].version <= self.ctx.collections[cid].current.version:
            return False
        self.adopt(cid, *got)
        return True

    async def follow_all(self) -> set[str]:
        """:meth:`follow` every adaptive collection; returns those whose stored state could not
        be read (logged; the next tick retries)."""
        unread = set()
        for cid in self.ctx.config.collections:
            if self.adaptive(cid):
                try:
                    await self.follow(cid)
                except Exception:  # noqa: BLE001 - e.g. Redis down at start: retried by the tick
                    metrics.CONTROLLER_ERRORS.labels(cid).inc()
                    log.warning("controller %s: cannot read the stored state", cid,
                                exc_info=True)
                    unread.add(cid)
        return unread

    # --- decide -------------------------------------------------------------------------------
    async def counts(self, cid: str, mech: Mechanism) -> dict[int, dict[str, Any]]:
        coll = self.ctx.config.collections[cid]
        layouts = {v: self.ctx.collections[cid].layout(v) for v in mech.accepted_versions()}
        return await self.ctx.store.read_all_time(cid, int(coll.partitions), layouts)

    async def step(self, cid: str) -> Mechanism | None:
        """One decision for ``cid`` (the caller holds the lease): the new state if one was
        stored, else None."""
        mech = self.ctx.collections[cid].current
        if not mech.collecting():
            return None
        t0 = time.perf_counter()
        counts = await self.counts(cid, mech)
        new = await asyncio.get_running_loop().run_in_executor(None, _adapt, mech, counts)
        if new is None:
            return None
        expected = None if mech.version == self.origin_version(cid) else mech.version
        ok = await store_state(self.redis, cid, self.tracks[cid].origin, expected, new)
        self.tracks[cid].last_step_s = time.perf_counter() - t0
        if not ok:   # another holder stored first: follow it
            await self.follow(cid)
            return None
        self.adopt(cid, new, time.time())
        return new

    def origin_version(self, cid: str) -> int:
        return int(self.ctx.config.collections[cid].version)

    # --- publish ------------------------------------------------------------------------------
    async def publish_due(self, cid: str, interval_s: float) -> bool:
        """Publish the version in force if this process has not yet and it was stored at least
        one interval ago (every live worker has followed it). True if published."""
        tr = self.tracks[cid]
        mech = self.ctx.collections[cid].current
        if tr.published == mech.version or self._publish is None:
            return False
        if mech.version != self.origin_version(cid) and time.time() - tr.stored_at < interval_s:
            return False
        await self._publish()
        tr.published = mech.version
        return True

    # --- the timer ----------------------------------------------------------------------------
    async def tick(self, cid: str) -> None:
        coll = self.ctx.config.collections[cid]
        interval = float(coll.controller_interval_s)
        await self.follow(cid)
        token = await acquire(self.redis, keys.collection_key(cid, LEASE),
                              max(500, int(3 * interval * 1000)))
        if token is None:
            return
        try:
            await self.publish_due(cid, interval)
            await self.step(cid)
        finally:
            try:
                await release(self.redis, keys.collection_key(cid, LEASE), token)
            except Exception:  # noqa: BLE001 - the TTL frees it anyway
                log.warning("controller %s: could not release the lease", cid, exc_info=True)

    def status(self, cid: str) -> dict[str, Any]:
        """What /collections shows about the adaptive state."""
        mech = self.ctx.collections[cid].current
        tr = self.tracks[cid]
        return {"version": mech.version, "accepted_versions": list(mech.accepted_versions()),
                "adaptive": self.adaptive(cid), "collecting": mech.collecting(),
                "version_changes": tr.changes, "published_version": tr.published,
                "version_stored_at": tr.stored_at or None, "last_step_s": tr.last_step_s,
                "recent_versions": list(tr.history)}


def _adapt(mech: Mechanism, counts: Any) -> Mechanism | None:
    """``mech.adapt`` with one BLAS thread: the adaptive steps are many small dense solves
    (Corr-RR's table search), which a multi-threaded BLAS slows by an order of magnitude on a
    busy machine."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1):
        return mech.adapt(counts)


def install(app: Any, ctl: Controller) -> None:
    """One faust timer per adaptive collection (``controller_interval_s``)."""
    for cid, coll in ctl.ctx.config.collections.items():
        if ctl.adaptive(cid):
            app.timer(float(coll.controller_interval_s),
                      name=f"ldp-controller-{cid}")(_make_tick(ctl, cid))


def _make_tick(ctl: Controller, cid: str):
    async def _tick() -> None:
        try:
            await ctl.tick(cid)
        except Exception:  # noqa: BLE001 - the next tick retries; visible in the log
            metrics.CONTROLLER_ERRORS.labels(cid).inc()
            log.warning("controller %s: tick failed", cid, exc_info=True)
    _tick.__name__ = _tick.__qualname__ = f"controller_{cid}"
    return _tick
