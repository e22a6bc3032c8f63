"""The steps the pipeline benchmarks share (bench/pipeline.py on the embedded broker,
bench/pipeline_kafka.py on Apache Kafka): prefill a topic with a fleet's batches, time a raw
consumer reading them, start and stop a worker process, and read the worker's own ingest rate and
timings from ``/healthz``."""
from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

#: reports per Kafka message of the prefill
BATCH = 500

#: the group session of the benchmarks' workers and of the raw consumer beside them (seconds:
#: Tansu answers a join after half of it)
SESSION_TIMEOUT_S = 3
SESSION_TIMEOUT_MS = 1000 * SESSION_TIMEOUT_S

#: the quiet stream of the publish → counted probes: one report per this many seconds
PROBE_INTERVAL_S = 1.0
#: the adaptive-flush target for a quiet stream, publish → counted (docs/pipeline.md)
QUIET_P99_TARGET_S = 0.1


async def prefill(bootstrap: str, coll: Any, total: int, batch: int,
                   devices: int = 1000, data: str | None = None) -> Any:
    """``total`` reports of ``coll`` sent by the simulated fleet, ``batch`` per message, from
    ``data`` (a CSV, or a generator spec; None: the bundled Adult)."""
    from ldpstream.producers.fleet import run_fleet

    return await run_fleet(bootstrap, coll, data=data, rate=0, total=total, batch=batch, seed=1,
                           mechanism=coll.mechanism(), devices=devices)


async def raw_consume(bootstrap: str, coll: Any, messages: int,
                      timings: dict[str, float] | None = None) -> tuple[float, int]:
    """Reports/s of a plain aiokafka consumer reading ``messages`` messages of ``coll``'s topic
    from the beginning and decoding each with ``decode_batch``, timed from the seek. It reads as
    the worker does: a group member (a group of its own, the worker's session timeout), its
    partitions paused when assigned until they are sought, the worker's fetch settings
    (``fetch_settings``: fetch sizes, how long a fetch waits in the broker) and messages per poll
    (``POLL_MAX_RECORDS``); only what it does with the records differs. ``timings`` (if given)
    gets its seconds waiting in ``getmany`` (``poll``: fetch, decompression, record parsing) and
    decoding (``decode``), the worker's first two timings, and its CPU seconds (``cpu``)."""
    import uuid

    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

    from ldpstream.agents.ingest.service import POLL_MAX_RECORDS, fetch_settings
    from ldpstream.names import MAX_MESSAGE_BYTES
    from ldpstream.producers.codec import decode_batch

    assigned = asyncio.Event()

    class Paused(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        async def on_partitions_assigned(self, got: Any) -> None:
            consumer.pause(*got)
            assigned.set()

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap,
                                group_id=f"ldpstream-bench-raw-{uuid.uuid4().hex[:8]}",
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                session_timeout_ms=SESSION_TIMEOUT_MS,
                                heartbeat_interval_ms=SESSION_TIMEOUT_MS // 4,
                                **fetch_settings(MAX_MESSAGE_BYTES))
    await consumer.start()
    try:
        consumer.subscribe([coll.topic], listener=Paused())
        tps = [TopicPartition(coll.topic, p) for p in range(int(coll.partitions))]
        while not assigned.is_set() or set(consumer.assignment()) != set(tps):
            await consumer.getmany(timeout_ms=50)   # paused: the group joins, nothing fetched
        t0, cpu0 = time.perf_counter(), time.process_time()
        await consumer.seek_to_beginning(*tps)
        consumer.resume(*tps)
        got = reports = 0
        poll = decode = 0.0
        while got < messages:
            t1 = time.perf_counter()
            data = await consumer.getmany(timeout_ms=1000, max_records=POLL_MAX_RECORDS)
            t2 = time.perf_counter()
            for msgs in data.values():
                for m in msgs:
                    reports += decode_batch(m.value).n
                got += len(msgs)
            poll += t2 - t1
            decode += time.perf_counter() - t2
        if timings is not None:
            timings.update(poll=round(poll, 4), decode=round(decode, 4),
                           cpu=round(time.process_time() - cpu0, 4))
        return reports / (time.perf_counter() - t0), reports
    finally:
        await consumer.stop()


def start_worker(config: Path, env: dict, port: int, log: Path,
                 python: str = sys.executable) -> subprocess.Popen:
    """A worker process on ``config`` (``python``: whose ldpstream install runs it)."""
    fh = open(log, "ab")
    return subprocess.Popen([python, "-m", "ldpstream.cli", "worker", "--config",
                             str(config), "--web-port", str(port)], env=env, stdout=fh,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)


def stop_worker(proc: subprocess.Popen) -> None:
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


async def ingest_rate(store: Any, cid: str, partitions: int, total: int, port: int,
                       timeout: float = 300.0) -> tuple[float, dict[str, float]]:
    """Reports/s into Redis as the worker times it: from the end of its partition assignment
    (seeks done, like the raw consumer's clock) to its last applied delta (``/healthz``), and
    the worker's cumulative ingest timings (seconds polling, decoding, counting, applying) with
    its CPU seconds over the same span (``cpu``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await store.n(cid, partitions) >= total:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
                ing = json.loads(resp.read())["checks"]["ingest"]
            if ing.get("assigned_at") is None or ing.get("last_apply_at") is None:
                raise RuntimeError(f"worker status without timings: {ing}")
            return (ing["applied_reports"] / (ing["last_apply_at"] - ing["assigned_at"]),
                    {**(ing.get("timings_s") or {}), "cpu": ing.get("cpu_s")})
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{cid}: only {await store.n(cid, partitions)} of {total} reports ingested")


async def publish_to_counted(store: Any, cid: str, partitions: int,
                             send: Callable[[int], Awaitable[None]], probes: int,
                             interval_s: float = PROBE_INTERVAL_S) -> list[float]:
    """Seconds from publishing each of ``probes`` single-report messages (``send(i)`` returns
    once the transport accepted probe ``i``) until ``CountStore.n`` in Redis shows it (read every
    2 ms), one probe every ``interval_s`` (a quiet stream: nothing else is waiting). A first,
    untimed probe (``send(-1)``) waits for the worker to be assigned and positioned, then for
    what was counted before to stop moving."""
    before = await store.n(cid, partitions)
    await send(-1)
    deadline = time.monotonic() + 120
    while await store.n(cid, partitions) <= before:
        if time.monotonic() > deadline:
            raise RuntimeError("the first probe was not counted within 120 s")
        await asyncio.sleep(0.05)
    before, still = await store.n(cid, partitions), 0
    while still < 3:  # a backlog still being counted would be mistaken for a probe
        await asyncio.sleep(0.2)
        now = await store.n(cid, partitions)
        still, before = (still + 1, now) if now == before else (0, now)
    out: list[float] = []
    for i in range(probes):
        t0 = time.perf_counter()
        await send(i)
        while await store.n(cid, partitions) < before + i + 1:
            if time.perf_counter() - t0 > 60:
                raise RuntimeError(f"probe {i} was not counted within 60 s")
            await asyncio.sleep(0.002)
        out.append(time.perf_counter() - t0)
        await asyncio.sleep(max(0.0, interval_s - (time.perf_counter() - t0)))
    return out


def latency_summary(latencies: list[float]) -> dict[str, Any]:
    """p50 / p99 / max of publish → counted latencies, and the quiet-stream target's verdict."""
    import numpy as np

    arr = np.asarray(latencies, dtype=float)
    p99 = float(np.percentile(arr, 99))
    return {"probes": int(arr.size), "p50_s": round(float(np.percentile(arr, 50)), 4),
            "p99_s": round(p99, 4), "max_s": round(float(arr.max()), 4),
            "target_p99_s": QUIET_P99_TARGET_S, "pass": p99 <= QUIET_P99_TARGET_S}


async def ratio_pairs(bootstrap: str, store: Any, cfg_path: Path, env: dict[str, str], coll: Any,
                      total: int, batch: int, repeats: int, work: Path, tag: str,
                      say: Callable[[str], None], data: str | None = None) -> dict[str, Any]:
    """Prefill ``coll``'s topic with ``total`` reports of ``batch`` per message, then ``repeats``
    raw/ingest pairs back to back (a busy moment of the machine hits one pair; the median pair's
    ratio is the result), the counts reset between pairs. Returns every pair's rates, ratios and
    both sides' timings, and the median pair's (``mid``); and, less sensitive to the machine's
    load than rates, ``cpu_ratios``: the raw consumer's CPU seconds ÷ the worker's and Redis's
    (``INFO cpu``) over the same reports, per pair, and their median ``cpu_ratio``."""
    from ldpstream.dev.process import free_port

    say(f"{tag}: prefill {total:,} reports, {batch} per message ...")
    stats = await prefill(bootstrap, coll, total, batch, data=data)
    raws, ingests, timings, raw_timings, cpu_ratios = [], [], [], [], []
    for rep in range(repeats):
        say(f"{tag} [{rep + 1}/{repeats}] raw aiokafka consumption + decode, then ingest ...")
        raw_spent: dict[str, float] = {}
        raw, got = await raw_consume(bootstrap, coll, stats.sent_messages, raw_spent)
        assert got == total, (got, total)
        await store.reset(coll.id)   # fresh offsets: the worker reads the topic again
        port = free_port()
        name = "".join(c if c.isalnum() else "-" for c in tag)
        redis_cpu = await _redis_cpu(store)
        worker = start_worker(cfg_path, env, port, work / f"worker-{name}-{rep}.log")
        try:
            ingest, spent = await ingest_rate(store, coll.id, coll.partitions, total, port)
        finally:
            stop_worker(worker)
        spent["redis_cpu"] = round(await _redis_cpu(store) - redis_cpu, 4)
        if spent.get("cpu") is not None and raw_spent.get("cpu"):
            cpu_ratios.append(raw_spent["cpu"] / (spent["cpu"] + spent["redis_cpu"]))
        raws.append(raw)
        ingests.append(ingest)
        timings.append(spent)
        raw_timings.append(raw_spent)
    ratios = [i / r for i, r in zip(ingests, raws)]
    mid = sorted(range(repeats), key=lambda k: ratios[k])[(repeats - 1) // 2]
    return {"reports_per_message": batch, "reports": total, "ratio": ratios[mid],
            "ratios": ratios, "ingest_rate": ingests[mid], "raw_consume_rate": raws[mid],
            "ingest_rates": ingests, "raw_consume_rates": raws, "ingest_timings_s": timings[mid],
            "raw_timings_s": raw_timings[mid], "ingest_timings_per_pair": timings,
            "raw_timings_per_pair": raw_timings, "cpu_ratios": cpu_ratios,
            "cpu_ratio": statistics.median(cpu_ratios) if cpu_ratios else None}


async def _redis_cpu(store: Any) -> float:
    """Redis's CPU seconds so far (``INFO cpu``: main thread and its children, user + system)."""
    info = await store.redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def quiet_probes(bootstrap: str, store: Any, coll: Any, probes: int) -> dict[str, Any]:
    """Publish → counted of single-report messages sent straight to Kafka, one per
    :data:`PROBE_INTERVAL_S` (a worker must be consuming ``coll``)."""
    import numpy as np

    from ldpstream.producers.codec import encode_batch
    from ldpstream.producers.publisher import Publisher

    mech = coll.mechanism()
    rng = np.random.default_rng(11)
    shape = np.array(coll.domain.shape)
    async with Publisher(bootstrap) as pub:
        async def send(_: int) -> None:
            rec = rng.integers(0, shape, size=(1, len(shape)))
            await pub.send_and_wait(coll.topic, encode_batch(coll.id, mech.version,
                                                             mech.randomize(rec, rng)))

        return latency_summary(await publish_to_counted(store, coll.id, coll.partitions, send,
                                                        probes))


def http_get(port: int, path: str) -> str:
    """The body of a worker's ``GET path`` on loopback."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return resp.read().decode()


def rss_mb(pid: int) -> float:
    """A process's resident memory in MiB (``/proc/<pid>/status``)."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", text).group(1)) / 1024.0  # type: ignore[union-attr]


async def count_run(store: Any, coll: Any, start: int, total: int, t_spawn: float,
                    port: int, timeout: float) -> tuple[float, float]:
    """(seconds from ``t_spawn`` to the first delta applied beyond ``start`` reports, reports/s
    from that delta to ``total``): polled every 20 ms; when one delta counted them all, the
    worker's own rate (``/healthz``: reports applied over the time from its assignment to its
    last apply, as ``bench pipeline`` times it)."""
    deadline = time.monotonic() + timeout
    first_at = first_n = None
    while time.monotonic() < deadline:
        n = await store.n(coll.id, coll.partitions)
        now = time.perf_counter()
        if first_at is None and n > start:
            first_at, first_n = now, n
        if n >= total:
            assert first_at is not None and first_n is not None
            if n > first_n:
                return first_at - t_spawn, (n - first_n) / (now - first_at)
            ing = json.loads(http_get(port, "/healthz"))["checks"]["ingest"]
            return first_at - t_spawn, ing["applied_reports"] / (ing["last_apply_at"]
                                                                 - ing["assigned_at"])
        await asyncio.sleep(0.02)
    raise TimeoutError(f"{coll.id}: {await store.n(coll.id, coll.partitions)} of {total}")


def worker_env(bootstrap: str, redis_url: str, **extra: str) -> dict[str, str]:
    """The environment of a benchmark's worker: this process's, the broker and Redis, a short
    group session and the HTTP API on loopback."""
    return dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=bootstrap, REDIS_URL=redis_url,
                LDP_SESSION_TIMEOUT_S=str(SESSION_TIMEOUT_S), LDP_WEB_BIND="127.0.0.1", **extra)


def metric_mean(text: str, name: str, cid: str) -> float | None:
    """The mean of histogram ``name`` of collection ``cid`` in Prometheus text (sum / count)."""
    total = count = None
    for line in text.splitlines():
        if f'collection="{cid}"' not in line:
            continue
        if line.startswith(name + "_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_count"):
            count = float(line.rsplit(" ", 1)[1])
    return total / count if total is not None and count else None
