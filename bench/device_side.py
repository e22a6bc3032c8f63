"""The side-state run of ``ldpstream bench devices --senders N[,N...]``: a worker taking
idempotent (keyed) batches of a collection with a device quota while the batch-dedupe state and
the quota counters of ``N`` senders are in Redis (docs/scaling.md "Per-device state").

For each ``N``, a collection of its own (plain, 8 Adult attributes, 4 partitions, ``device_quota``
100 reports a day) whose state of ``N`` senders is written straight to Redis as a worker writes
it: each window's fields in listpack-sized buckets with the window's meta hash
(agents/store/side_buckets.py; each sender's highest sequence :data:`SEQ` with the 64 below it
seen, one report counted; ``--compare-python``: as the versions before the buckets wrote it, one
hash per window, which every version reads),
then :data:`BATCHES` keyed one-report batches produced, from as many of those senders with their
next sequence, and a tenth more that repeat one of them (duplicates, not counted). A worker
started on it: ``ready_s`` from its start to its first applied delta, ``rate`` batches counted a
second from there to the last, ``worker_rss_mb`` its resident memory right after the last apply,
``worker_rss_mb_idle`` after ``IDLE_S`` more seconds idle, and the Redis bytes per sender of
the dedupe and quota hashes (``MEMORY USAGE`` of their keys over their fields).

``--compare-python PATH``: every ``N`` also with the workers of the ldpstream installed for that
Python (an earlier version, in its own virtualenv), in the same run, on the same state:
``ldpstream bench devices --senders 1000000,3000000 --compare-python ../old/.venv/bin/python``.
"""
from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

PARTITIONS = 4
#: keyed one-report batches each run counts (plus a tenth of duplicates)
BATCHES = 100_000
#: the highest sequence of every sender written to Redis
SEQ = 100
#: the quota of the run's collection (reports a day per device)
QUOTA = 100
#: seconds after the last apply when the worker's resident memory is read again, idle
IDLE_S = 7.0

# Senders ``first + step * i`` (i < count) written to a dedupe hash (KEYS[1]: value ARGV[4]) and a
# quota hash (KEYS[2]: value ARGV[5]) of one shard, in Redis (many senders, no client round trips)
SIDE_STATE_LUA = """
for i = 0, tonumber(ARGV[2]) - 1 do
  local d = string.format('%d', tonumber(ARGV[1]) + tonumber(ARGV[3]) * i)
  redis.call('HSET', KEYS[1], d, ARGV[4])
  redis.call('HSET', KEYS[2], d, ARGV[5])
end
"""


async def write_side_state(store: Any, cid: str, partition: int, first: int, count: int,
                           step: int, high: int, bitmap: int, used: int,
                           quota_window_s: float, *, single: bool = False) -> None:
    """The dedupe state ``(high, bitmap)`` and quota use ``used`` of senders
    ``first + step * i`` (``i < count``) on ``partition`` of ``cid``, in the current windows of
    this clock: bucketed as a worker's applies write them (each window's buckets sized for
    ``count`` fields, its meta hash recording them), or, ``single``, as the versions before the
    buckets did: one hash per window, fields the unsigned ids, text values
    (agents/store/dedupe.py)."""
    from ldpstream.agents.store import dedupe, keys, quota, side_buckets

    now = time.time()
    dname = dedupe.side_name(dedupe.window_of(now))
    qname = quota.side_name(quota.window_of(now * 1000, quota_window_s))
    if single:
        dkey, qkey = keys.side_key(cid, partition, dname), keys.side_key(cid, partition, qname)
        for at in range(0, count, 25_000):   # one script call blocks Redis for ~0.2 s at most
            await store.redis.eval(SIDE_STATE_LUA, 2, dkey, qkey, first + step * at,
                                   min(25_000, count - at), step, f"{high}:{bitmap}", used)
        return
    ids = np.uint64(first) + np.uint64(step) * np.arange(count, dtype=np.uint64)
    buckets = side_buckets.buckets_for(count)
    which = side_buckets.bucket_of(ids, buckets)
    order = np.argsort(which, kind="stable")
    fields = np.asarray(side_buckets.bucket_fields(ids[order]), dtype=object)
    cuts = np.flatnonzero(np.diff(which[order])) + 1
    for name, value in ((dname, f"{high}:{bitmap}"), (qname, str(used))):
        pipe = store.redis.pipeline(transaction=False)
        for n_cmd, part in enumerate(np.split(np.arange(count), cuts)):
            if part.size:
                bucket = int(which[order[part[0]]])
                pipe.hset(keys.side_key(cid, partition, keys.side_bucket_name(name, bucket)),
                          mapping=dict.fromkeys(fields[part].tolist(), value))
            if n_cmd % 1000 == 999:
                await pipe.execute()
        pipe.hset(keys.side_key(cid, partition, keys.side_meta_name(name)),
                  mapping={side_buckets.META_B: buckets, side_buckets.META_N: count})
        await pipe.execute()


def _config(work: Path, cid: str) -> Path:
    from ldpstream.config import default_config_path

    doc = yaml.safe_load(default_config_path().with_name("adult-fast.yaml").read_text())
    coll = doc["collections"][0]
    coll.setdefault("schema", {}).setdefault("csv", {}).pop("path", None)
    coll.update(id=cid, partitions=PARTITIONS, refresh_interval_s=5.0,
                device_quota={"reports": QUOTA, "window_s": 86400})
    doc["collections"] = [coll]
    path = work / f"{cid}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


async def _produce(bootstrap: str, coll: Any, senders: np.ndarray, seqs: np.ndarray,
                   reports: np.ndarray) -> None:
    """One keyed one-report batch ``(senders[i], seqs[i])`` each, on partition ``id % 4``."""
    from aiokafka import AIOKafkaProducer

    from ldpstream.producers.codec import encode_batch

    pub = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20,
                           acks=1)
    await pub.start()
    try:
        futs = []
        for i, (s, q) in enumerate(zip(senders.tolist(), seqs.tolist())):
            msg = encode_batch(coll.id, coll.version, reports[i % len(reports)][None, :],
                               device_ids=np.array([s], np.uint64), key=(s, q))
            futs.append(await pub.send(coll.topic, msg, partition=s % PARTITIONS))
            if len(futs) >= 5000:
                await asyncio.gather(*futs)
                futs = []
        await asyncio.gather(*futs)
    finally:
        await pub.stop()


async def _bytes_per_field(store: Any, cid: str, prefix: str) -> float | None:
    from ldpstream.agents.store import keys

    used = held = 0
    for p in range(PARTITIONS):
        pattern = keys.glob_escape(keys.side_key(cid, p, prefix)) + "*"
        async for key in store.redis.scan_iter(match=pattern):
            used += int(await store.redis.memory_usage(key, samples=0) or 0)
            held += int(await store.redis.hlen(key))
    return used / held if held else None


async def _one(store: Any, bootstrap: str, env: dict, work: Path, cid: str, senders: int,
               python: str, reports: np.ndarray, single: bool, say: Any) -> dict[str, Any]:
    from ldpstream.agents.store import dedupe, quota
    from ldpstream.bench.ingest_run import count_run, rss_mb, start_worker, stop_worker
    from ldpstream.config import load_config
    from ldpstream.dev.process import free_port
    from ldpstream.kafka_admin import create_ldp_topics

    path = _config(work, cid)
    coll = load_config(path, env={}).collections[cid]
    await create_ldp_topics(bootstrap, [coll])
    say(f"{senders:,} senders ({python}): state to Redis ...")
    for p in range(PARTITIONS):
        n = (senders - p + PARTITIONS - 1) // PARTITIONS
        await write_side_state(store, cid, p, p + PARTITIONS, n, PARTITIONS, SEQ,
                               (1 << 64) - 1, 1, 86400, single=single)
    ids = np.arange(senders, dtype=np.uint64) + PARTITIONS
    rng = np.random.default_rng(3)
    take = rng.choice(ids, size=min(BATCHES, senders), replace=False)
    again = take[:take.size // 10]
    batch_ids = np.concatenate([take, again])
    seqs = np.full(batch_ids.size, SEQ + 1, dtype=np.uint64)
    say(f"{senders:,} senders: produce {batch_ids.size:,} keyed batches ...")
    await _produce(bootstrap, coll, batch_ids, seqs, reports)
    port = free_port()
    t0 = time.perf_counter()
    worker = start_worker(path, env, port, work / f"worker-{cid}.log", python=python)
    try:
        ready, rate = await count_run(store, coll, 0, take.size, t0, port, 1800.0)
        counted = time.monotonic()
        row: dict[str, Any] = {"senders": senders, "python": python, "ready_s": ready,
                               "rate": rate, "worker_rss_mb": rss_mb(worker.pid)}
        await asyncio.sleep(max(0.0, IDLE_S - (time.monotonic() - counted)))
        row["worker_rss_mb_idle"] = rss_mb(worker.pid)
        row["counted"] = await store.n(cid, PARTITIONS)
    finally:
        stop_worker(worker)
    row["dedupe_bytes"] = await _bytes_per_field(store, cid, dedupe.PREFIX)
    row["quota_bytes"] = await _bytes_per_field(store, cid, quota.WINDOW_PREFIX)
    await store.reset(cid)
    return row


async def run(senders: tuple[int, ...], pythons: tuple[str, ...], progress: Any = None
              ) -> dict[str, Any]:
    """Every size with every Python's workers, alternating (module docstring)."""
    from ldpstream.agents.app import make_store
    from ldpstream.bench.ingest_run import worker_env
    from ldpstream.config import load_config
    from ldpstream.dev.broker import EmbeddedBroker
    from ldpstream.dev.redis import EmbeddedRedis

    say = progress or (lambda msg: None)
    work = Path(tempfile.mkdtemp(prefix="ldpstream-bench-side-"))
    tansu, redis = EmbeddedBroker(), EmbeddedRedis()
    rows: list[dict[str, Any]] = []
    try:
        bootstrap, redis_url = tansu.start(), redis.start()
        env = worker_env(bootstrap, redis_url)
        store = make_store(redis_url)
        probe = load_config(_config(work, "probe"), env={}).collections["probe"]
        mech = probe.mechanism()
        rng = np.random.default_rng(5)
        reports = mech.randomize(rng.integers(0, np.array(probe.domain.shape),
                                              size=(256, len(probe.domain))), rng)
        run_no = 0
        for n in senders:
            for python in pythons:
                run_no += 1
                row = await _one(store, bootstrap, env, work, f"side{run_no}", n, python,
                                 reports, len(pythons) > 1, say)
                say("side " + str(row))
                rows.append(row)
        await store.close()
    finally:
        tansu.stop()
        redis.stop()
    return {"side_state": rows, "batches": BATCHES, "partitions": PARTITIONS}


def main(senders: tuple[int, ...], compare: str | None, quiet: bool) -> int:
    """Run and print (``quiet``: JSON only, as ``--json``)."""
    import json

    pythons = (sys.executable,) + ((compare,) if compare else ())
    res = asyncio.run(run(senders, pythons, lambda m: print(m, file=sys.stderr, flush=True)))
    if quiet:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{'senders':>10} {'worker':<40} {'ready s':>8} {'batches/s':>10} {'RSS MB':>7} "
          f"{'idle MB':>8} {'dedupe B':>9} {'quota B':>8}")
    for r in res["side_state"]:
        print(f"{r['senders']:>10,} {r['python'][-40:]:<40} {r['ready_s']:>8.1f} "
              f"{r['rate']:>10,.0f} {r['worker_rss_mb']:>7.0f} {r['worker_rss_mb_idle']:>8.0f} "
              f"{r['dedupe_bytes'] or 0:>9.1f} {r['quota_bytes'] or 0:>8.1f}")
    return 0
