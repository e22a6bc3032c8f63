"""``ldpstream bench pipeline [--json] [--quick] [--redis-cluster] [--broker kafka]``: end-to-end
ingest rate vs raw consumption.

On the embedded broker (Tansu) and Redis, in one run:

1. prefill ``ldp.reports.adult`` (bundled Adult demo collection, 4 partitions) with the fleet's
   default report batches (500 reports per message, lz4/gzip as the fleet sends them);
2. **raw**: an aiokafka consumer reads the whole topic and decodes every message with the same
   codec (``decode_batch``): reports/s from the seek to the last message. It consumes as the
   worker does (a group member, the worker's fetch settings and messages per poll:
   bench/ingest_run.py ``raw_consume``), so the two differ only in what they do with the records;
3. **ingest**: a ``ldpstream worker`` child process consumes the same topic; reports/s into Redis
   (timed by the worker, ``/healthz``: from the end of its partition assignment to its last
   applied delta). Steps 2 and 3 run as a pair, three times (``--quick``: once), the counts
   reset between pairs; ``ratio`` is the median pair's ingest / raw (``ratios``: every pair;
   ``ingest_timings_s``: where the median pair's worker spent its time);
4. a memoized copy of the collection (counted per device: agents/store/device_memo.py) fed by
   100,000 devices: ``memo_ratio`` (its ingest / raw), ``memo_vs_plain`` (its ingest / the
   median pair's plain ingest), ``memo_redis_bytes_per_device`` (its device state in Redis);
   then the same as 3 with one report per message (``single_report_rate``) on a second
   collection;
5. with the worker running: ``refresh_seconds`` (mean of ``ldp_estimate_refresh_seconds`` on
   /metrics) and ``freshness_seconds`` (median time from sending a batch to the first stored
   estimate whose n includes it; target ≤ 2 × refresh interval).

6. with ``--redis-cluster``: step 3 again with the worker writing to a Redis Cluster of 3 masters
   + 3 replicas (``cluster_ingest_rate``, ``cluster_ratio`` = cluster ingest / raw), and the apply
   alone (``apply``: applies/s and reports/s of 12 concurrent compare-and-set chains from one
   client process, and the microseconds Redis spends per apply) on one Redis, a cluster of
   1 master and a cluster of 3 masters.

7. with ``--broker kafka``: steps 2-3 again on Apache Kafka (bench/pipeline_kafka.py):
   ``kafka_ingest_rate``, ``kafka_raw_consume_rate``, ``kafka_ratio`` next to Tansu's ``ratio``.

``--quick`` (smoke tests): 200,000 + 20,000 reports, 2 freshness samples, refresh every 1 s.

Prints a table, or JSON with --json: ``ingest_rate``, ``raw_consume_rate``, ``ratio``,
``reports_per_message``, ``single_report_rate`` (+ ``single_raw_consume_rate``,
``refresh_seconds``, ``freshness_seconds``, ``refresh_interval_s``, sizes).
"""
from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from ldpstream.bench.ingest_run import (
    BATCH,
    QUIET_P99_TARGET_S,
    ingest_rate,
    metric_mean,
    prefill,
    quiet_probes,
    ratio_pairs,
    raw_consume,
    start_worker,
    stop_worker,
    worker_env,
)

#: the memoized collection of step 4 and its fleet: devices reporting again and again
MEMOIZE = {"rotation_s": 86400, "instantaneous_epsilon": 4.0}
MEMO_DEVICES = 100_000
#: the regression guard printed by the bench: ingest / raw consume at least this, per reports per
#: message (docs/pipeline.md "Measured")
RATIO_TARGETS = {BATCH: 0.8, 10: 0.6, 1: 0.6}


def _write_config(path: Path, refresh_interval_s: float | None = None,
                  only: str | None = None) -> None:
    from ldpstream.config import default_config_path

    # the fast rr-ind variant of the demo (ε = 16 per record): the figures docs/ cite
    doc = yaml.safe_load(default_config_path().with_name("adult-fast.yaml").read_text())
    base = doc["collections"][0]
    base.setdefault("schema", {}).setdefault("csv", {}).pop("path", None)
    if refresh_interval_s is not None:
        base["refresh_interval_s"] = refresh_interval_s
    single = dict(base, id=base["id"] + "1")
    # memoized: counted per device (agents/store/device_memo.py), its cost measured in step 4
    memo = dict(base, id=base["id"] + "m", params={"memoize": MEMOIZE})
    ten = dict(base, id=base["id"] + "10")   # 10 reports per message
    doc["collections"] = [c for c in (base, single, memo, ten) if only in (None, c["id"])]
    path.write_text(yaml.safe_dump(doc))


async def _memo_bytes(store: Any, coll: Any) -> float | None:
    """Redis bytes per device of the memoized collection's device state (MEMORY USAGE of its
    ``memo:<layout>:<epoch>`` logs over the devices they hold)."""
    from ldpstream.agents.store import keys
    from ldpstream.agents.store.device_memo import PREFIX, parse_log

    used = devices = 0
    for p in range(int(coll.partitions)):
        pattern = keys.glob_escape(keys.side_key(coll.id, p, PREFIX)) + "*"
        async for key in store.redis.scan_iter(match=pattern):
            used += int(await store.redis.memory_usage(key) or 0)
            devices += len(parse_log(await store.redis.get(key)))
    return used / devices if devices else None


async def _redis_bytes(store: Any, coll: Any) -> dict[str, Any]:
    """Redis memory of a collection's counts (``MEMORY USAGE`` of every key), split by level,
    and what it costs at steady state: one fine key per partition and bucket retained, one
    coarse key per partition and coarse bucket retained, the all-time keys, the estimates."""
    from ldpstream.agents.store import keys as K

    by: dict[str, list[int]] = {"f": [], "h": [], "a": [], "est": [], "other": []}
    fine_buckets: set[str] = set()
    for key in await store.scan_keys(coll.id):
        name = key.decode() if isinstance(key, bytes) else str(key)
        used = int(await store.redis.memory_usage(key) or 0)
        parts = name.split(":")
        if ":c:" in name and parts[-3] in (K.LEVEL_FINE, K.LEVEL_COARSE, K.LEVEL_ALL):
            by[parts[-3]].append(used)
            if parts[-3] == K.LEVEL_FINE:
                fine_buckets.add(parts[-2])
        elif name.endswith(":est"):
            by["est"].append(used)
        else:
            by["other"].append(used)
    policy = coll.policy
    per_fine = sum(by["f"]) / max(1, len(fine_buckets))   # all partitions of one bucket
    per_coarse = (sum(by["h"]) / max(1, len(by["h"]))) * int(coll.partitions)
    retained_fine = policy.retention_s() / policy.bucket_s if policy.bucketed else 0.0
    retained_coarse = policy.retention_s() / policy.coarse_s if policy.bucketed else 0.0
    steady = (per_fine * retained_fine + per_coarse * (retained_coarse + 1) + sum(by["a"])
              + sum(by["est"]) + sum(by["other"]))
    return {"redis_bytes_now": sum(sum(v) for v in by.values()),
            "redis_bytes_per_bucket": per_fine, "redis_bytes_all_time": sum(by["a"]),
            "redis_bytes_estimates": sum(by["est"]),
            "redis_bytes_steady_state": steady, "buckets_retained": retained_fine,
            "bucket_s": policy.bucket_s, "windows": [w.name for w in policy.windows]}


async def _freshness(bootstrap: str, store: Any, coll: Any, samples: int) -> list[float]:
    """Send one batch, wait for an estimate whose n includes it; seconds per sample."""
    import numpy as np

    from ldpstream.producers.device import Gateway
    from ldpstream.producers.publisher import Publisher

    mech = coll.mechanism()
    method, attrs = coll.estimators[0], coll.marginals[0]
    # the all-time window: its n is every report counted (a shorter window's n drops what the
    # earlier steps counted once they are older than the window)
    window = next((w.name for w in coll.windows if w.name == "all"), coll.windows[-1].name)
    rng = np.random.default_rng(3)
    out = []
    async with Publisher(bootstrap) as pub:
        for i in range(samples):
            doc = await store.get_estimate(coll.id, window, method, attrs)
            n_before = max(int(doc["n"]) if doc else 0, await store.n(coll.id, coll.partitions))
            recs = rng.integers(0, np.array(coll.domain.shape), size=(BATCH, len(coll.domain)))
            gw = Gateway(coll.id, pub, batch=BATCH, topic=coll.topic)
            t0 = time.time()
            await gw.add(mech.randomize(recs, rng), mech.version)
            await gw.flush()
            deadline = time.monotonic() + 6 * float(coll.refresh_interval_s) + 30
            while time.monotonic() < deadline:
                doc = await store.get_estimate(coll.id, window, method, attrs)
                if doc and int(doc["n"]) >= n_before + BATCH:
                    out.append(time.time() - t0)
                    break
                await asyncio.sleep(0.05)
            if i + 1 < samples:  # de-phase the next sample from the refresh timer
                await asyncio.sleep(float(rng.uniform(0.0, float(coll.refresh_interval_s))))
    return out


async def _cluster_ingest(cfg_path: Path, env: dict, coll: Any, total: int, raw: float,
                          work: Path) -> dict[str, Any]:
    """The ingest run again, the worker writing to a Redis Cluster (3 masters + 3 replicas)
    instead of the single Redis: same prefilled topic, fresh offsets (so it reads it all)."""
    from ldpstream.agents.app import make_store
    from ldpstream.dev.process import free_port
    from ldpstream.dev.redis_cluster import EmbeddedRedisCluster

    cluster = EmbeddedRedisCluster(masters=3, replicas=1)
    worker = None
    try:
        url = cluster.start()
        store = make_store(url)
        port = free_port()
        worker = start_worker(cfg_path, dict(env, REDIS_URL=url), port, work / "worker-c.log")
        rate, _ = await ingest_rate(store, coll.id, coll.partitions, total, port)
        await store.close()
    finally:
        if worker is not None:
            stop_worker(worker)
        cluster.stop()
    return {"cluster_ingest_rate": rate, "cluster_ratio": rate / raw, "cluster_masters": 3}


async def _apply_rate(url: str, coll: Any, *, applies: int, partitions: int = 12,
                      reports_per_apply: int = 2000) -> dict[str, float]:
    """The exactly-once apply alone (no Kafka): ``partitions`` chains of compare-and-set applies
    run concurrently, one per partition as a worker's flush runs them, each delta the counts of
    ``reports_per_apply`` randomized reports in the current fine bucket (so fine, coarse and
    all-time keys: 3 BITFIELD keys per apply). Returns applies/s and reports/s seen by one client
    process, and the microseconds Redis itself spends per apply (``INFO commandstats`` of every
    master: EVALSHA + EVAL), which bounds what one master can take whatever the clients."""
    import numpy as np
    from redis.asyncio.cluster import RedisCluster

    from ldpstream.agents.app import make_store
    from ldpstream.agents.ingest.intake import count_reports
    from ldpstream.agents.store.apply_delta import PartitionDelta
    from ldpstream.agents.store.layout import Layout

    store = make_store(url)
    r = store.redis
    mech, specs = coll.mechanism(), coll.tensors()
    layout = Layout.of(coll.version, specs)
    rng = np.random.default_rng(5)
    recs = rng.integers(0, np.array(coll.domain.shape), size=(reports_per_apply, len(coll.domain)))
    flat = layout.pack(count_reports(mech, mech.randomize(recs, rng), specs), reports_per_apply)
    cells = {(layout, coll.policy.fine_bucket(time.time())): flat}
    cid = "bench-apply"
    masters = RedisCluster.PRIMARIES if isinstance(r, RedisCluster) else None

    async def stats() -> dict[str, Any]:
        if not masters:
            return {"single": await r.info("commandstats")}
        # one INFO per master (redis-py returns a lone node's reply unwrapped)
        return {n.name: await r.info("commandstats", target_nodes=n) for n in r.get_primaries()}

    async def chain(p: int) -> None:
        for i in range(applies):
            res = await store.apply_many(cid, [PartitionDelta(p, i, cells, reports_per_apply,
                                                              i - 1)], coll.policy)
            assert res[0].applied, res

    try:
        await store.reset(cid)
        await (r.config_resetstat(target_nodes=masters) if masters else r.config_resetstat())
        t0 = time.perf_counter()
        await asyncio.gather(*(chain(p) for p in range(partitions)))
        dt = time.perf_counter() - t0
        calls = usec = 0.0
        for node in (await stats()).values():
            for name in ("cmdstat_evalsha", "cmdstat_eval"):
                if name in node:
                    calls += float(node[name]["calls"])
                    usec += float(node[name]["usec"])
        await store.reset(cid)
    finally:
        await store.close()
    n = applies * partitions
    return {"applies_per_s": n / dt, "reports_per_s": n * reports_per_apply / dt,
            "redis_usec_per_apply": usec / calls if calls else float("nan"),
            "nonzero_cells_per_apply": float(np.count_nonzero(flat))}


async def _apply_rates(coll: Any, applies: int, say) -> dict[str, Any]:
    """:func:`_apply_rate` on one Redis, a cluster of 1 master and a cluster of 3 masters (no
    replicas: on this machine they would take CPU from the masters)."""
    from ldpstream.dev.redis import EmbeddedRedis
    from ldpstream.dev.redis_cluster import EmbeddedRedisCluster

    out: dict[str, Any] = {}
    for name, server in (("single", EmbeddedRedis(appendfsync="everysec")),
                         ("cluster_1_master", EmbeddedRedisCluster(masters=1, replicas=0)),
                         ("cluster_3_masters", EmbeddedRedisCluster(masters=3, replicas=0))):
        say(f"apply throughput: {name} ...")
        with server:
            out[name] = await _apply_rate(server.url, coll, applies=applies)
    return {"apply": out}


async def run(quick: bool = False, progress=None, redis_cluster: bool = False,
              repeats: int | None = None, broker: str = "tansu") -> dict[str, Any]:
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.dev.broker import EmbeddedBroker
    from ldpstream.dev.process import free_port
    from ldpstream.dev.redis import EmbeddedRedis
    from ldpstream.kafka_admin import create_ldp_topics

    say = progress or (lambda msg: None)
    # --quick is a smoke run (tests): small sizes and a 1 s refresh interval, so the freshness
    # samples take seconds; its rates are not the measured numbers
    total = 200_000 if quick else 4_000_000
    single_total = 20_000 if quick else 150_000
    ten_total = 20_000 if quick else 1_000_000
    probes = 3 if quick else 30
    memo_total = 50_000 if quick else 1_000_000
    samples = 2 if quick else 5
    repeats = int(repeats or (1 if quick else 3))
    work = Path(tempfile.mkdtemp(prefix="ldpstream-bench-"))
    cfg_path = work / "bench.yaml"
    _write_config(cfg_path, refresh_interval_s=1.0 if quick else None)
    config = load_config(cfg_path, env={})
    batched, single, memo, ten = list(config.collections.values())
    tansu, redis = EmbeddedBroker(), EmbeddedRedis()
    result: dict[str, Any] = {}
    worker = None
    try:
        bootstrap, redis_url = tansu.start(), redis.start()
        await create_ldp_topics(bootstrap, (batched, single, memo, ten))
        env = worker_env(bootstrap, redis_url)
        store = make_store(redis_url)
        port = free_port()

        result.update(await ratio_pairs(bootstrap, store, cfg_path, env, batched, total, BATCH,
                                        repeats, work, f"{BATCH}/msg", say))
        raw = result["raw_consume_rate"]   # the median pair's: the cluster run's reference too

        say(f"prefill {memo_total:,} reports of {MEMO_DEVICES:,} devices, memoized ...")
        stats_m = await prefill(bootstrap, memo, memo_total, BATCH, MEMO_DEVICES)
        raw_m, _ = await raw_consume(bootstrap, memo, stats_m.sent_messages)
        say("ingest of the memoized collection (counted per device) ...")
        worker = start_worker(cfg_path, env, port, work / "worker-m.log")
        rate_m, spent_m = await ingest_rate(store, memo.id, memo.partitions, memo_total, port)
        stop_worker(worker)
        result.update(memo_ingest_rate=rate_m, memo_raw_consume_rate=raw_m,
                      memo_ratio=rate_m / raw_m, memo_vs_plain=rate_m / result["ingest_rate"],
                      memo_reports=memo_total, memo_devices=MEMO_DEVICES,
                      memo_ingest_timings_s=spent_m,
                      memo_redis_bytes_per_device=await _memo_bytes(store, memo))

        small = {}
        for coll_b, size, n in ((ten, 10, ten_total), (single, 1, single_total)):
            small[str(size)] = await ratio_pairs(bootstrap, store, cfg_path, env, coll_b, n,
                                                 size, repeats, work, f"{size}/msg", say)
        result.update(small_batches=small, single_report_rate=small["1"]["ingest_rate"],
                      single_raw_consume_rate=small["1"]["raw_consume_rate"],
                      single_reports=single_total)

        # the probes' worker reads and refreshes the probed collection only: the others' refresh
        # (seconds of CPU every 5 s on this machine) is not the quiet stream's path
        say(f"publish -> counted, {probes} single reports one per second ...")
        quiet_cfg = work / "quiet.yaml"
        _write_config(quiet_cfg, refresh_interval_s=1.0 if quick else None, only=single.id)
        worker = start_worker(quiet_cfg, env, free_port(), work / "worker-quiet.log")
        result["quiet"] = await quiet_probes(bootstrap, store, single, probes)
        stop_worker(worker)
        worker = start_worker(cfg_path, env, port, work / "worker-2.log")

        say("refresh and freshness ...")
        try:
            fresh = await _freshness(bootstrap, store, batched, samples)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            result["refresh_seconds"] = metric_mean(text, "ldp_estimate_refresh_seconds",
                                                     batched.id)
            result["freshness_seconds"] = statistics.median(fresh) if fresh else None
            result["freshness_samples"] = fresh
            result["refresh_interval_s"] = float(batched.refresh_interval_s)
        except Exception as exc:  # noqa: BLE001 - refresh part is optional
            result["refresh_error"] = f"{exc.__class__.__name__}: {exc}"
        result.update(await _redis_bytes(store, batched))  # counts and estimates
        await store.close()
        if redis_cluster:
            stop_worker(worker)
            worker = None
            say("ingest (worker) into a Redis Cluster of 3 masters + 3 replicas ...")
            result.update(await _cluster_ingest(cfg_path, env, batched, total, raw, work))
            result.update(await _apply_rates(batched, 20 if quick else 150, say))
    finally:
        if worker is not None:
            stop_worker(worker)
        tansu.stop()
        redis.stop()
    if broker == "kafka":
        from ldpstream.bench.pipeline_kafka import kafka_pairs

        quiet_kafka = work / "quiet-kafka.yaml"
        _write_config(quiet_kafka, refresh_interval_s=1.0 if quick else None, only=batched.id)
        result.update(await kafka_pairs(cfg_path, env, batched, total, repeats, work, say,
                                        probes=probes, quiet_cfg=quiet_kafka))
    result["guard"] = guard(result)
    return result


def guard(res: dict[str, Any]) -> dict[str, Any]:
    """The regression guard of the bench output: each measured ratio against
    :data:`RATIO_TARGETS`, each quiet stream's p99 publish → counted against 100 ms."""
    checks = [{"check": f"ingest/raw, {BATCH}/msg, Tansu", "value": res["ratio"],
               "target": RATIO_TARGETS[BATCH]}]
    if "kafka_ratio" in res:
        checks.append({"check": f"ingest/raw, {BATCH}/msg, Apache Kafka",
                       "value": res["kafka_ratio"], "target": RATIO_TARGETS[BATCH]})
    for size, pairs in res.get("small_batches", {}).items():
        checks.append({"check": f"ingest/raw, {size}/msg, Tansu", "value": pairs["ratio"],
                       "target": RATIO_TARGETS[int(size)]})
    for key, where in (("quiet", "Tansu"), ("kafka_quiet", "Apache Kafka")):
        if key in res:
            checks.append({"check": f"p99 publish -> counted (s), quiet, {where}",
                           "value": res[key]["p99_s"], "target": QUIET_P99_TARGET_S,
                           "at_most": True})
    for c in checks:
        c["pass"] = bool(c["value"] <= c["target"] if c.get("at_most")
                         else c["value"] >= c["target"])
    return {"pass": all(c["pass"] for c in checks), "checks": checks}


def main(args) -> int:
    quiet = bool(getattr(args, "json", False))
    res = asyncio.run(run(quick=bool(getattr(args, "quick", False)),
                          progress=None if quiet else (lambda m: print(m, file=sys.stderr,
                                                                       flush=True)),
                          redis_cluster=bool(getattr(args, "redis_cluster", False)),
                          broker=getattr(args, "broker", "tansu")))
    if getattr(args, "json", False):
        print(json.dumps(res, indent=2))
        return 0
    print(f"{'measure':<44} {'value':>14}")
    print(f"{'raw aiokafka consume + decode (reports/s)':<44} {res['raw_consume_rate']:>14,.0f}")
    print(f"{'ingest into Redis (reports/s)':<44} {res['ingest_rate']:>14,.0f}")
    print(f"{'ratio, median pair':<44} {res['ratio']:>14.2f}   (pairs: "
          f"{', '.join(f'{r:.2f}' for r in res['ratios'])})")
    _print_breakdown(res)
    for size, pairs in res.get("small_batches", {}).items():
        print(f"{size + ' per message: raw / ingest (reports/s)':<44} "
              f"{pairs['raw_consume_rate']:>14,.0f} / {pairs['ingest_rate']:,.0f}   ratio "
              f"{pairs['ratio']:.2f} (pairs: {', '.join(f'{r:.2f}' for r in pairs['ratios'])})")
    print(f"{'memoized, counted per device: ingest/raw':<44} {res['memo_ratio']:>14.2f}   "
          f"(ingest {res['memo_ingest_rate']:,.0f} reports/s = {res['memo_vs_plain']:.2f} x "
          f"plain; {res['memo_redis_bytes_per_device'] or 0:.0f} Redis bytes per device)")
    if "kafka_ratio" in res:
        print(f"{'Apache Kafka ' + res['kafka_version'] + ': raw (reports/s)':<44} "
              f"{res['kafka_raw_consume_rate']:>14,.0f}")
        print(f"{'Apache Kafka: ingest (reports/s)':<44} {res['kafka_ingest_rate']:>14,.0f}")
        print(f"{'Apache Kafka: ratio, median pair':<44} {res['kafka_ratio']:>14.2f}   (pairs: "
              f"{', '.join(f'{r:.2f}' for r in res['kafka_ratios'])})")
    print(f"{'reports per message':<44} {res['reports_per_message']:>14d}")
    for key, where in (("quiet", "Tansu"), ("kafka_quiet", "Apache Kafka")):
        if key in res:
            q = res[key]
            print(f"{'publish -> counted, 1 report/s, ' + where:<44} "
                  f"{1000 * q['p99_s']:>11.0f} ms   (p99; p50 {1000 * q['p50_s']:.0f} ms, max "
                  f"{1000 * q['max_s']:.0f} ms, {q['probes']} probes)")
    if "cluster_ingest_rate" in res:
        print(f"{'ingest into Redis Cluster, 3 masters (rep/s)':<44} "
              f"{res['cluster_ingest_rate']:>14,.0f}")
        print(f"{'ratio on the cluster':<44} {res['cluster_ratio']:>14.2f}")
        for name, a in res["apply"].items():
            print(f"{'apply, ' + name.replace('_', ' ') + ' (applies/s)':<44} "
                  f"{a['applies_per_s']:>14,.0f}   ({a['reports_per_s']:,.0f} reports/s, "
                  f"{a['redis_usec_per_apply']:.0f} us in Redis per apply)")
    print(f"{'Redis bytes per bucket (all partitions)':<44} {res['redis_bytes_per_bucket']:>14,.0f}"
          f"   ({res['bucket_s']:g} s buckets, windows {', '.join(res['windows'])})")
    print(f"{'Redis bytes of the collection now':<44} {res['redis_bytes_now']:>14,.0f}")
    print(f"{'Redis bytes at steady state':<44} {res['redis_bytes_steady_state']:>14,.0f}"
          f"   ({res['buckets_retained']:,.0f} buckets retained)")
    if res.get("refresh_seconds") is not None:
        print(f"{'refresh duration (s)':<44} {res['refresh_seconds']:>14.3f}")
    if res.get("freshness_seconds") is not None:
        print(f"{'freshness, send -> estimate (s)':<44} {res['freshness_seconds']:>14.2f}"
              f"   (refresh every {res['refresh_interval_s']:g}s)")
    g = res["guard"]
    print(f"regression guard: {'PASS' if g['pass'] else 'FAIL'}")
    for c in g["checks"]:
        print(f"  {'PASS' if c['pass'] else 'FAIL'}  {c['check']}: {c['value']:.3f} "
              f"({'<=' if c.get('at_most') else '>='} {c['target']:g})")
    return 0


def _print_breakdown(res: dict[str, Any]) -> None:
    """Seconds of the median pair, raw consumer beside the worker: waiting in ``getmany`` (fetch,
    decompression, record parsing), decoding (the worker: + validating and counting), counting
    alone, applying to Redis (the worker's background flushes)."""
    raw, ing = res.get("raw_timings_s") or {}, res.get("ingest_timings_s") or {}
    print(f"{'  seconds of the median pair':<44} {'raw':>14} {'worker':>10}")
    for key, what in (("poll", "poll (fetch, decompress, parse)"),
                      ("decode", "decode (worker: + validate, count)"),
                      ("count", "of which count"), ("flush_wait", "waiting for a flush"),
                      ("apply", "apply (in the background)")):
        r = raw.get(key)
        print(f"{'    ' + what:<44} {'-' if r is None else f'{r:.3f}':>14} "
              f"{ing.get(key, 0.0):>10.3f}")
