"""``ldpstream bench devices [--json] [--quick] [--steps 1000000,3000000]``: per-device state at
fleet scale: a device-counted (memoized) collection grown to 1, 3 and 10 million distinct devices.

On the embedded broker (Tansu) and Redis, two collections of the same 8 Adult attributes and 4
partitions: ``devm`` memoized (counted per device: agents/store/device_memo.py) and ``devp`` not.
For each step (a number of distinct devices) the bench

1. produces the step's new devices' reports (one each, 500 per message, keyed by device: a
   device's messages on partition ``id % 4``) to both topics;
2. starts a worker on ``devp`` alone, then one on ``devm`` alone, each counting the step's
   reports: ``plain_rate`` and ``memo_rate`` (reports/s from the first to the last applied
   delta, timed by the bench; when one delta holds them all, the worker's own ``/healthz``
   timing), ``memo_vs_plain``; ``restart_to_ready_s``: from starting the
   ``devm`` worker (holding the devices of the steps before in Redis) to its first applied
   delta, i.e. process start, group join and the device state read (``plain_restart_s`` is the
   same without device state); ``worker_rss_mb``: the ``devm`` worker's resident memory right
   after the step's last apply (``/proc/<pid>/status``), ``worker_rss_mb_idle`` the same once it
   has been idle ``IDLE_S`` seconds (the last polls' buffers handed back, agents/heap.py: what it
   holds for its devices; ``rss_growth`` and ``rss_bytes_per_added_device`` compare these from
   the first to the last step, the ``_busy`` ones the former);
3. ``refresh_s``: the mean ``ldp_estimate_refresh_seconds`` of ``devm``;
4. ``rebalance_s``: a second worker joins; from its start until a report sent to each of the 4
   partitions after it holds partitions is counted (the new owner read its partitions' state);
5. the step's devices report again, three times (a worker on each collection, once ready, its
   device state loaded, gets them: ``memo_<run>_rate``, ``plain_<run>_rate`` from the first
   report produced to the last counted, ``memo_vs_plain_<run>``; ``memo_<run>_produce_rate``,
   ``plain_<run>_produce_rate`` the producer's own rate, the ceiling of these): ``again``, new
   reports (re-randomized: each memoized report supersedes its device's row, rewritten);
   ``resend``, 90 % of the devices resend their memoized report unchanged, 10 % a changed
   value's, with the record timestamps of ``again`` (so in the same fine bucket: a resent row
   is the row the worker holds, nothing moves); ``moved``, the same with the time of sending
   (a later bucket: each row moves to it, its predecessor subtracted from the worker's index,
   not read back);
6. Redis bytes per device: ``memo_bytes``: ``MEMORY USAGE`` of the device state logs'
   segments over the devices they hold (agents/store/memo_log.py); ``dedupe_bytes`` and
   ``quota_bytes``: of the batch-dedupe and quota side hashes of a third collection ``devq``
   (plain, ``device_quota``, every device sending its own keyed one-report batch) fed up to
   30,000 of the step's new devices, its ``expected_senders`` the 7,500 of them a partition
   gets (the buckets of their first window sized for them: agents/store/side_buckets.py).

Then the **churn run** (``churn``): the retention rule itself (agents/store/device_memo.py
``roll``, ``latest_per_device``: the worker's functions, in this process, no broker) for one of
4 partitions of a fleet of 1,000,000 devices over 36 simulated months, 10 % of the fleet replaced
each month, every active device reporting once per state epoch (windows 7d and all: 14 days, so
the 36 months take 77 epochs):
the entries the partition holds each month with the default retention (90 days) and without
any (``device_retention_s`` infinite, the code before), against ``device_state_max``.

``--restart-at N[,N...]``: a fourth collection ``devl`` whose device state (``N`` devices, one
row each) is written straight to Redis with the worker's own log encoding, then a worker started
on it: ``restart_at``: seconds to its first applied delta and its resident memory, the state
loaded (how a 10-million-device restart is measured without feeding 10 million reports).

``--senders N[,N...]`` (``--compare-python PYTHON``): instead, the side-state run of
bench/device_side.py: a worker taking idempotent batches of a collection with a device quota
while the dedupe and quota state of ``N`` senders is in Redis, bucketed as the applies write
it (its memory, rate and the Redis bytes per sender); with ``--compare-python``, beside an
earlier version's worker, on state in the single hash a window that every version reads.

``--quick`` (smoke tests): steps of 20,000 and 40,000 devices, a restart at 50,000, a churn run
of 20,000 devices.
"""
from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ldpstream.bench.ingest_run import (
    BATCH,
    count_run,
    http_get,
    metric_mean,
    rss_mb,
    start_worker,
    stop_worker,
    worker_env,
)

STEPS = (1_000_000, 3_000_000, 10_000_000)
QUICK_STEPS = (20_000, 40_000)
PARTITIONS = 4
MEMOIZE = {"rotation_s": 86400, "instantaneous_epsilon": 4.0}
#: share of the devices resending their memoized report unchanged in the resend runs
RESEND_SAME = 0.9
#: devices of a step that feed the dedupe and quota collection
SIDE_SAMPLE = 30_000
#: seconds after its last apply when the worker's resident memory is read again, idle
IDLE_S = 7.0


def _write_config(path: Path, devices_max: int, refresh_interval_s: float) -> None:
    from ldpstream.config import default_config_path

    # the rr-ind variant of the demo (8 attributes, one report carries all): the figures docs/ cite
    doc = yaml.safe_load(default_config_path().with_name("adult-fast.yaml").read_text())
    base = doc["collections"][0]
    base.setdefault("schema", {}).setdefault("csv", {}).pop("path", None)
    base.update(partitions=PARTITIONS, refresh_interval_s=refresh_interval_s)
    plain = dict(base, id="devp")
    memo = dict(base, id="devm", params={"memoize": MEMOIZE},
                device_state_max=2 * devices_max // PARTITIONS + 1024)
    side = dict(base, id="devq", device_quota={"reports": 100, "window_s": 86400},
                expected_senders=SIDE_SAMPLE // PARTITIONS)
    loaded = dict(memo, id="devl")
    for coll in (plain, memo, side, loaded):
        one = dict(doc, collections=[coll])
        (path.parent / f"{coll['id']}.yaml").write_text(yaml.safe_dump(one))
    doc["collections"] = [plain, memo, side, loaded]
    path.write_text(yaml.safe_dump(doc))


async def _produce(bootstrap: str, colls: list[Any], ids: np.ndarray, reports: np.ndarray,
                   batch: int, keyed: bool = False, at_ms: int | None = None) -> None:
    """``reports[i]`` of device ``ids[i]`` to every collection of ``colls``, ``batch`` per
    message, a device's messages on partition ``id % PARTITIONS`` (keyed: one sequence-1 batch key
    per message, its first device the sender; ``at_ms``: every record's timestamp, else the
    time it is sent)."""
    from aiokafka import AIOKafkaProducer

    from ldpstream.producers.codec import encode_batch

    pub = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20,
                           max_request_size=8 << 20, acks=1)
    await pub.start()
    try:
        for p in range(PARTITIONS):
            on = ids % PARTITIONS == p
            pid, prep = ids[on], reports[on]
            futs = []
            for s in range(0, pid.size, batch):
                sl = slice(s, s + batch)
                for coll in colls:
                    key = (int(pid[s]), 1) if keyed else None
                    msg = encode_batch(coll.id, coll.version, prep[sl], device_ids=pid[sl],
                                       key=key)
                    futs.append(await pub.send(coll.topic, msg, partition=p,
                                               timestamp_ms=at_ms))
                if len(futs) >= 2000:
                    await asyncio.gather(*futs)
                    futs = []
            await asyncio.gather(*futs)
    finally:
        await pub.stop()



async def _bytes_per(store: Any, cid: str, prefix: str, entries: Any) -> float | None:
    """MEMORY USAGE of ``cid``'s side keys named ``prefix...`` over the entries they hold
    (``entries``: async key -> count)."""
    from ldpstream.agents.store import keys

    used = held = 0
    for p in range(PARTITIONS):
        pattern = keys.glob_escape(keys.side_key(cid, p, prefix)) + "*"
        async for key in store.redis.scan_iter(match=pattern):
            used += int(await store.redis.memory_usage(key, samples=0) or 0)
            held += await entries(key)
    return used / held if held else None


async def _state_bytes(store: Any) -> dict[str, float | None]:
    from ldpstream.agents.store import dedupe, device_memo, quota

    async def logged(key: Any) -> int:
        return len(device_memo.parse_log(await store.redis.get(key)))

    async def fields(key: Any) -> int:
        # a window's meta hash (agents/store/side_buckets.py) costs bytes but holds no device
        meta = key.endswith(b":m") if isinstance(key, bytes) else key.endswith(":m")
        return 0 if meta else int(await store.redis.hlen(key))

    return {"memo_bytes": await _bytes_per(store, "devm", device_memo.PREFIX, logged),
            "dedupe_bytes": await _bytes_per(store, "devq", dedupe.PREFIX, fields),
            "quota_bytes": await _bytes_per(store, "devq", quota.WINDOW_PREFIX, fields)}


async def _warm_count(store: Any, coll: Any, cfg: Path, env: dict, work: Path, bootstrap: str,
                      ids: np.ndarray, reports: np.ndarray, at_ms: int | None,
                      timeout: float) -> tuple[float, float]:
    """A worker on ``coll`` started and ready (a report to each partition counted: its device
    state loaded), then ``reports`` produced to it: (reports/s from the start of producing to
    the last one counted, the producer's own reports/s)."""
    from ldpstream.dev.process import free_port

    port = free_port()
    worker = start_worker(cfg, env, port, work / f"worker-{coll.id}.log")
    try:
        deadline = time.monotonic() + timeout
        before = await store.n(coll.id, coll.partitions)
        probe = np.array([np.flatnonzero(ids % PARTITIONS == p)[0] for p in range(PARTITIONS)])
        await _produce(bootstrap, [coll], ids[probe], reports[probe], 1, at_ms=at_ms)
        start = before + PARTITIONS
        while await store.n(coll.id, coll.partitions) < start:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{coll.id}: the worker never got ready")
            await asyncio.sleep(0.02)
        t0 = time.perf_counter()
        await _produce(bootstrap, [coll], ids, reports, BATCH, at_ms=at_ms)
        produced = time.perf_counter() - t0
        while await store.n(coll.id, coll.partitions) < start + ids.size:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{coll.id}: {await store.n(coll.id, coll.partitions)} of "
                                   f"{start + ids.size}")
            await asyncio.sleep(0.02)
        return ids.size / (time.perf_counter() - t0), ids.size / produced
    finally:
        stop_worker(worker)


async def _rebalance(store: Any, coll: Any, cfg: Path, env: dict, port: int, work: Path,
                     bootstrap: str, probe_ids: np.ndarray, reports: np.ndarray) -> float:
    """Seconds from a second worker's start until a report sent to every partition after it
    holds partitions is counted."""
    from ldpstream.dev.process import free_port

    port2 = free_port()
    t0 = time.perf_counter()
    second = start_worker(cfg, env, port2, work / "worker-rebalance.log")
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                if json.loads(http_get(port2, "/healthz"))["checks"]["ingest"].get("assigned"):
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            await asyncio.sleep(0.1)
        before = await store.n(coll.id, coll.partitions)
        await _produce(bootstrap, [coll], probe_ids, reports, 1)
        while await store.n(coll.id, coll.partitions) < before + probe_ids.size:
            if time.monotonic() > deadline:
                raise TimeoutError("rebalance: probes not counted")
            await asyncio.sleep(0.02)
        return time.perf_counter() - t0
    finally:
        stop_worker(second)


async def _restart_at(store: Any, coll: Any, devices: int, cfg: Path, env: dict, work: Path,
                      bootstrap: str, reports: np.ndarray) -> dict[str, Any]:
    """A worker restarted with ``devices`` devices in state: their memo logs written straight to
    Redis (the worker's own encoding, agents/store/memo_log.py ``encode_segments``; this epoch,
    one row per device), then the seconds from its start to its first applied delta (one report
    on each partition) and its resident memory then."""
    from ldpstream.agents.store import device_memo, keys, memo_log
    from ldpstream.agents.store.layout import Layout
    from ldpstream.dev.process import free_port

    layout = Layout.of(coll.version, coll.tensors()).id
    name = device_memo.side_name(device_memo.epoch_of(time.time(), coll.policy), layout)
    width = len(coll.domain)
    for p in range(PARTITIONS):
        ids = np.arange(p, devices, PARTITIONS, dtype=np.uint64) + 10 * devices
        rows = np.zeros((ids.size, device_memo.META + width), dtype=np.int64)
        rows[:, 2] = width
        rows[:, device_memo.META:] = np.resize(reports, (ids.size, width))
        for seg, data in enumerate(memo_log.encode_segments(ids, rows)):
            await store.redis.set(keys.side_key(coll.id, p, memo_log.segment_name(name, seg)),
                                  data)
        del rows
    port = free_port()
    start = await store.n(coll.id, coll.partitions)
    t0 = time.perf_counter()
    worker = start_worker(cfg, env, port, work / "worker-devl.log")
    try:
        probe = np.arange(PARTITIONS, dtype=np.uint64) + 10 * devices   # known devices
        await _produce(bootstrap, [coll], probe, reports[:PARTITIONS], 1)
        ready, _ = await count_run(store, coll, start, start + PARTITIONS, t0, port, 600.0)
        return {"devices": devices, "restart_to_ready_s": ready,
                "worker_rss_mb": rss_mb(worker.pid)}
    finally:
        stop_worker(worker)


def churn(fleet: int = 1_000_000, months: int = 36, monthly: float = 0.10,
          retention_s: float | None = None) -> dict[str, Any]:
    """The state of one of 4 partitions of a churning fleet, month by month, under the worker's
    own roll and lookup (agents/store/device_memo.py): entries held, with the default retention
    and without any; ``retention_s`` None: the collection default (90 days)."""
    from ldpstream.agents.store import device_memo
    from ldpstream.config import Collection

    coll = Collection.model_validate({
        "id": "churn", "schema": {"csv": {"columns": ["sex", "race"]}}, "mechanism": "rr-ind",
        "params": {"memoize": MEMOIZE}, "epsilon": 1.0, "marginals": [["sex", "race"]],
        "windows": ["7d", "all"],
        **({} if retention_s is None else {"device_retention_s": retention_s})})
    span = device_memo.epoch_length(coll.policy)
    k = device_memo.retention_epochs(coll.device_retention(), coll.policy)
    n = fleet // PARTITIONS
    rng = np.random.default_rng(11)
    out: dict[str, Any] = {"fleet": fleet, "months": months, "monthly_churn": monthly,
                           "epoch_s": span, "device_retention_s": coll.device_retention(),
                           "device_state_max": coll.device_state_max}
    for name, keep in (("with_retention", k), ("without_retention", None)):
        active = np.arange(n, dtype=np.uint64) * PARTITIONS
        next_id = n
        memo: dict[int, device_memo.DeviceTable] = {}
        held = []
        month_s = 30 * 86_400.0
        for e in range(int(round(months * month_s / span))):
            month = int(e * span // month_s)
            if month > len(held):   # a month ended: its entries, then its churn
                held.append(sum(len(t) for t in memo.values()))
                gone = rng.random(active.size) < monthly
                fresh = (np.arange(next_id, next_id + int(gone.sum()), dtype=np.uint64)
                         * PARTITIONS)
                next_id += int(gone.sum())
                active = np.concatenate([active[~gone], fresh])
            memo = device_memo.roll(memo, e, e - keep if keep else -1)
            cur, prev = memo[e], memo[e - 1]
            for t in memo.values():   # what the next delta writes and subtracts
                t.unlogged.clear()
                t.evicted.clear()
                t.cleared.clear()
            reps = rng.integers(0, 2, size=(active.size, 2))
            mv = device_memo.latest_per_device(active, reps, np.array([e]), 0, (cur, prev))
            cur.upsert(mv.ids, mv.rows)
        held.append(sum(len(t) for t in memo.values()))
        out[name] = {"entries_by_month": held, "max_entries": max(held),
                     "first_month_over_cap": next((m + 1 for m, h in enumerate(held)
                                                   if h > coll.device_state_max), None),
                     # the worker's index: 16 bytes an entry (agents/store/memo_log.py)
                     "peak_index_bytes": 16 * max(held)}
    return out


async def run(steps: tuple[int, ...] = STEPS, quick: bool = False, progress: Any = None,
              load_steps: tuple[int, ...] = (), again: bool = True) -> dict[str, Any]:
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.dev.broker import EmbeddedBroker
    from ldpstream.dev.process import free_port
    from ldpstream.dev.redis import EmbeddedRedis
    from ldpstream.kafka_admin import create_ldp_topics

    say = progress or (lambda msg: None)
    work = Path(tempfile.mkdtemp(prefix="ldpstream-bench-devices-"))
    cfg = work / "bench.yaml"
    _write_config(cfg, max(steps + load_steps), 1.0 if quick else 5.0)
    colls = load_config(cfg, env={}).collections
    plain, memo, side, loaded = colls["devp"], colls["devm"], colls["devq"], colls["devl"]
    tansu, redis = EmbeddedBroker(), EmbeddedRedis()
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"steps": rows, "partitions": PARTITIONS,
                              "reports_per_message": BATCH,
                              "attributes": len(memo.domain)}
    rng = np.random.default_rng(5)
    mech = plain.mechanism()
    try:
        bootstrap, redis_url = tansu.start(), redis.start()
        await create_ldp_topics(bootstrap, (plain, memo, side, loaded))
        env = worker_env(bootstrap, redis_url)
        store = make_store(redis_url)
        have = 0
        for devices in steps:
            ids = np.arange(have, devices, dtype=np.uint64) + 1
            recs = rng.integers(0, np.array(memo.domain.shape), size=(ids.size, len(memo.domain)))
            reports = mech.randomize(recs, rng)
            say(f"{devices:,} devices: produce {ids.size:,} reports to devp and devm ...")
            await _produce(bootstrap, [plain, memo], ids, reports, BATCH)
            sample = ids[:max(0, min(ids.size, SIDE_SAMPLE))]
            await _produce(bootstrap, [side], sample, reports[:sample.size], 1, keyed=True)
            row: dict[str, Any] = {"devices": devices}
            for coll in (plain, memo, side):
                say(f"{devices:,} devices: worker on {coll.id} ...")
                port = free_port()
                start = await store.n(coll.id, coll.partitions)   # rebalance probes included
                total = start + (sample.size if coll is side else ids.size)
                t0 = time.perf_counter()
                worker = start_worker(work / f"{coll.id}.yaml", env, port,
                                      work / f"worker-{coll.id}.log")
                try:
                    ready, rate = await count_run(store, coll, start, total, t0, port,
                                                   240.0 if quick else 3600.0)
                    if coll is plain:
                        row.update(plain_rate=rate, plain_restart_s=ready)
                    elif coll is memo:
                        counted = time.monotonic()
                        row.update(memo_rate=rate, restart_to_ready_s=ready,
                                   worker_rss_mb=rss_mb(worker.pid))
                        deadline = time.monotonic() + 120
                        refresh = None
                        while refresh is None and time.monotonic() < deadline:
                            await asyncio.sleep(1.0)
                            refresh = metric_mean(http_get(port, "/metrics"),
                                                   "ldp_estimate_refresh_seconds", memo.id)
                        row["refresh_s"] = refresh
                        # idle: the last polls' buffers freed and handed back (agents/heap.py,
                        # every 5 s): what the worker holds for its devices
                        await asyncio.sleep(max(0.0, IDLE_S - (time.monotonic() - counted)))
                        row["worker_rss_mb_idle"] = rss_mb(worker.pid)
                        say(f"{devices:,} devices: rebalance ...")
                        probe = ids[:PARTITIONS]   # known devices, one per partition
                        row["rebalance_s"] = await _rebalance(
                            store, memo, work / "devm.yaml", env, port, work, bootstrap, probe,
                            reports[:PARTITIONS])
                        row["worker_rss_mb_after_rebalance"] = rss_mb(worker.pid)
                finally:
                    stop_worker(worker)
            have = devices
            row["memo_vs_plain"] = row["memo_rate"] / row["plain_rate"]
            row.update(await _state_bytes(store))
            if again:
                # the step's devices report again, three ways (module docstring, point 5)
                at_ms = int(time.time() * 1000)
                changed = rng.random(ids.size) < 1.0 - RESEND_SAME
                for name, label, ts in (("again", "re-randomized", at_ms),
                                        ("resend", "resend, same bucket", at_ms),
                                        ("moved", "resend, a later bucket", None)):
                    if name == "again":
                        reports = mech.randomize(recs, rng)
                    else:   # 90 % resend their memoized report, 10 % changed value
                        reports = reports.copy()
                        reports[changed] = mech.randomize(rng.integers(
                            0, np.array(memo.domain.shape),
                            size=(int(changed.sum()), len(memo.domain))), rng)
                    say(f"{devices:,} devices: the step's devices again ({label}) ...")
                    for coll, kind in ((plain, "plain"), (memo, "memo")):
                        row[f"{kind}_{name}_rate"], row[f"{kind}_{name}_produce_rate"] = \
                            await _warm_count(store, coll, work / f"{coll.id}.yaml", env, work,
                                              bootstrap, ids, reports, ts,
                                              240.0 if quick else 3600.0)
                    row[f"memo_vs_plain_{name}"] = row[f"memo_{name}_rate"] / \
                        row[f"plain_{name}_rate"]
            rows.append(row)
            say("step " + json.dumps(row))
        for devices in load_steps:
            say(f"restart with {devices:,} devices in state ...")
            result.setdefault("restart_at", []).append(await _restart_at(
                store, loaded, devices, work / "devl.yaml", env, work, bootstrap,
                mech.randomize(rng.integers(0, np.array(memo.domain.shape),
                                            size=(64, len(memo.domain))), rng)))
            say("restart " + json.dumps(result["restart_at"][-1]))
        await store.close()
    finally:
        tansu.stop()
        redis.stop()
    loads = result.get("restart_at", [])
    if len(loads) >= 2:
        a, b = loads[0], loads[-1]
        result["restart_rss_bytes_per_added_device"] = (
            (b["worker_rss_mb"] - a["worker_rss_mb"]) * 2**20 / (b["devices"] - a["devices"]))
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        for key, suffix in (("worker_rss_mb_idle", ""), ("worker_rss_mb", "_busy")):
            result["rss_growth" + suffix] = b[key] / a[key] - 1.0
            result["rss_bytes_per_added_device" + suffix] = (
                (b[key] - a[key]) * 2**20 / (b["devices"] - a["devices"]))
    say("churn run (36 simulated months) ...")
    result["churn"] = churn(fleet=20_000 if quick else 1_000_000)
    return result


def main(args: Any) -> int:
    senders = getattr(args, "senders", None)
    if senders:   # the side-state run (bench/device_side.py)
        from ldpstream.bench import device_side

        return device_side.main(tuple(int(s) for s in senders.split(",") if s),
                                getattr(args, "compare_python", None),
                                bool(getattr(args, "json", False)))
    quick = bool(getattr(args, "quick", False))
    raw = getattr(args, "steps", None)
    steps = tuple(int(s) for s in raw.split(",") if s) if raw is not None else \
        (QUICK_STEPS if quick else STEPS)
    load = tuple(int(s) for s in (getattr(args, "restart_at", None) or "").split(",") if s) \
        or ((50_000,) if quick else ())
    quiet = bool(getattr(args, "json", False))
    # progress on stderr in both forms (--json: the document alone on stdout)
    res = asyncio.run(run(steps, quick, lambda m: print(m, file=sys.stderr, flush=True), load))
    if quiet:
        print(json.dumps(res, indent=2))
        return 0
    head = ("devices", "memo B", "dedupe B", "quota B", "RSS MB", "idle MB", "memo r/s",
            "plain r/s", "ratio", "refresh s", "restart s", "rebal. s")
    print(" ".join(f"{h:>11}" for h in head))
    for r in res["steps"]:
        vals = (f"{r['devices']:,}", f"{r['memo_bytes'] or 0:.1f}", f"{r['dedupe_bytes'] or 0:.1f}",
                f"{r['quota_bytes'] or 0:.1f}", f"{r['worker_rss_mb']:.0f}",
                f"{r['worker_rss_mb_idle']:.0f}",
                f"{r['memo_rate']:,.0f}", f"{r['plain_rate']:,.0f}", f"{r['memo_vs_plain']:.2f}",
                f"{r['refresh_s'] or 0:.3f}", f"{r['restart_to_ready_s']:.1f}",
                f"{r['rebalance_s']:.1f}")
        print(" ".join(f"{v:>11}" for v in vals))
    for r in res["steps"]:
        for name, label in (("again", "re-randomized"), ("resend", "90 % resent, same bucket"),
                            ("moved", "90 % resent, a later bucket")):
            if f"memo_{name}_rate" in r:
                print(f"{r['devices']:,} devices reporting again ({label}): memoized "
                      f"{r[f'memo_{name}_rate']:,.0f} reports/s, plain "
                      f"{r[f'plain_{name}_rate']:,.0f}, ratio {r[f'memo_vs_plain_{name}']:.2f}")
    for r in res.get("restart_at", []):
        print(f"restart with {r['devices']:,} devices in state (logs written directly): ready in "
              f"{r['restart_to_ready_s']:.1f} s, worker RSS {r['worker_rss_mb']:.0f} MB")
    if "rss_growth" in res:
        print(f"worker RSS growth first -> last step, idle: {100 * res['rss_growth']:.1f} % "
              f"({res['rss_bytes_per_added_device']:.1f} bytes per added device); right after "
              f"the last apply: {100 * res['rss_growth_busy']:.1f} % "
              f"({res['rss_bytes_per_added_device_busy']:.1f} bytes per added device)")
    if "restart_rss_bytes_per_added_device" in res:
        print(f"worker RSS with the state loaded: "
              f"{res['restart_rss_bytes_per_added_device']:.1f} bytes per added device")
    c = res["churn"]
    for name in ("with_retention", "without_retention"):
        s = c[name]
        print(f"churn {name.replace('_', ' ')}: max {s['max_entries']:,} entries per partition "
              f"(cap {c['device_state_max']:,}; over the cap in month "
              f"{s['first_month_over_cap'] or '-'}), worker index at most "
              f"{s['peak_index_bytes'] / 2**20:.1f} MB")
    return 0
