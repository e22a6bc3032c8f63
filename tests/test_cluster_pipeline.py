"""The pipeline on a real Redis Cluster (3 masters + 3 replicas on loopback).

* Failover with lost writes: mid-stream, the replica of the master that serves a shard of the
  collection is stalled (SIGSTOP, its replication stream backed up behind 40 MB written to that
  master), the worker keeps applying deltas that the master acknowledges but the replica never
  receives, then the master is SIGKILLed and the replica resumes and promotes itself: those
  acknowledged writes are gone. The worker's next apply on that shard finds a stored offset
  behind the one it continues from (compare-and-set CONFLICT), re-reads from the stored offset,
  and the final counts equal the counts of the reports produced, exactly. ``/healthz`` shows the
  failover while it lasts. Then the worker is SIGKILLed and replaced.
* Failover on an idle stream: every report is counted (acknowledged by the stalled master only),
  then nothing more arrives and the master dies: no apply will conflict, so the worker's periodic
  offset audit finds the stored offsets behind its own and re-reads them; counts exact.
* Many workers: 3 workers × 12 partitions, workers joining and leaving mid-stream; counts exact;
  the time each rebalance takes (membership change → the live workers hold every partition once,
  positioned) is printed (it is measured, not asserted; a join is timed from the process spawn,
  which includes the interpreter start-up, printed separately)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import numpy as np
import pytest
from conftest import wait_for_n, write_config
from store_helpers import read_collection

from ldpstream.agents.app import make_store
from ldpstream.agents.store import keys
from ldpstream.config import load_config
from ldpstream.producers.fleet import run_fleet
from ldpstream.redis_client import TRANSIENT_ERRORS

pytestmark = pytest.mark.pipeline


def _health(worker) -> dict:
    return json.loads(worker.get("/healthz", timeout=3.0, any_status=True))


def _stall_replication(cluster, master, tag: str):
    """SIGSTOP the replicas of ``master`` and write 40 MB to a key of ``master`` (hash tag ``tag``)
    so the replication stream backs up in the master's own buffer: whatever the master
    acknowledges from now on has not left it. Returns the stopped replicas."""
    replicas = cluster.replicas_of(master)
    for r in replicas:
        os.kill(r.pid, signal.SIGSTOP)
    admin = cluster.admin(master)
    blob = b"x" * (1 << 20)
    for _ in range(40):
        admin.set(f"stall:{{{tag}}}", blob)
    return replicas


def _one_worker(tmp_path, cid: str, cluster, service_env, spawn_worker, *,
                refresh_interval_s: float):
    """A 6-partition collection with small, frequent deltas and one worker on ``cluster``:
    (config path, collection, worker env, worker, store)."""
    path = write_config(tmp_path / "c.yaml", cid, partitions=6,
                        refresh_interval_s=refresh_interval_s,
                        ingest={"batch_reports": 4000, "batch_seconds": 0.2})
    env = dict(service_env, REDIS_URL=cluster.url)
    worker = spawn_worker(path, env=env)
    worker.wait_ready(60)
    return path, load_config(path).collections[cid], env, worker, make_store(cluster.url)


def _assert_counts(got: dict, want: dict) -> None:
    assert set(got) >= set(want)
    for key, w in want.items():
        np.testing.assert_array_equal(got[key], w, err_msg=key)


def test_master_failover_loses_acknowledged_writes_counts_stay_exact(
        tmp_path, kafka_broker, fresh_redis_cluster, service_env, spawn_worker, unique_name):
    cluster = fresh_redis_cluster
    cid = unique_name
    total = 150_000
    path, coll, env, worker, store = _one_worker(tmp_path, cid, cluster, service_env,
                                                 spawn_worker, refresh_interval_s=1.0)
    events: list[str] = []
    t0 = time.monotonic()

    def note(msg: str) -> None:
        events.append(f"{time.monotonic() - t0:5.1f}s {msg}")

    async def chaos() -> dict:
        nonlocal worker
        while await store.n(cid, coll.partitions) < 25_000:
            await asyncio.sleep(0.05)
        master = cluster.master_of(keys.offsets_key(cid, 0))
        on_master = [p for p in range(coll.partitions)
                     if cluster.master_of(keys.offsets_key(cid, p)).port == master.port]
        replicas = await asyncio.to_thread(_stall_replication, cluster, master, f"{cid}#0")
        note(f"replica of :{master.port} (shards {on_master}) stalled")
        await asyncio.sleep(1.2)  # applies acknowledged by the master only
        acked = await store.offsets(cid, on_master)
        cluster.crash_master(master)
        for r in replicas:
            os.kill(r.pid, signal.SIGCONT)
        await asyncio.sleep(0.3)  # the replica drains what reached its socket, then waits
        pipe = cluster.admin(replicas[0]).pipeline(transaction=False)
        pipe.execute_command("READONLY")  # what survives: the replica's copy, before it takes over
        for p in on_master:
            pipe.hget(keys.offsets_key(cid, p), "offset")
        raw = (await asyncio.to_thread(pipe.execute))[1:]
        kept = {p: -1 if v is None else int(v) for p, v in zip(on_master, raw)}
        note(f"master :{master.port} killed; acknowledged {acked}, replica has {kept}")
        failover = asyncio.create_task(asyncio.to_thread(cluster.wait_failover, master))
        seen: list[dict] = []
        while not failover.done():
            seen.append(await asyncio.to_thread(_health, worker))
            await asyncio.sleep(0.1)
        new = await failover
        note(f":{new.port} promoted")
        lost = {p: (acked[p], kept[p]) for p in acked if kept[p] < acked[p]}
        # the worker finds out at its next apply on the shard: CONFLICT, re-read
        deadline = time.monotonic() + 30
        while True:
            ing = (await asyncio.to_thread(_health, worker))["checks"]["ingest"]
            if ing["conflicts"] > 0 or not lost:
                break
            assert time.monotonic() < deadline, (events, worker.log_tail())
            await asyncio.sleep(0.1)
        note(f"worker status after failover: conflicts={ing['conflicts']}")
        worker.kill()  # and a crashed worker on top: its replacement seeks to the stored offsets
        worker = spawn_worker(path, env=env)
        note("worker killed and replaced")
        return {"seen": seen, "lost": lost}

    async def run():
        chaos_task = asyncio.create_task(chaos())
        stats = await run_fleet(kafka_broker.bootstrap, coll, rate=15_000, total=total, batch=100,
                                seed=17, keep_counts=True, devices=2000)
        got_chaos = await chaos_task
        # the replacement works the held partitions carefully (poison-pill breaker): slow under load
        n = await wait_for_n(store, cid, total, timeout=180)
        await asyncio.sleep(1.5)  # anything counted twice would show up now
        assert await store.n(cid, coll.partitions) == total, (n, events, worker.log_tail())
        _assert_counts(await read_collection(store, coll), stats.counts)
        await store.close()
        return got_chaos

    got = asyncio.run(run())
    print("\n".join(events))
    assert got["lost"], f"the failover lost no acknowledged write: {events}"
    bad = [h for h in got["seen"] if h["status"] != "ok"]
    assert bad, "healthz never showed the failover"
    assert any(not h["checks"]["redis"]["ok"] and h["checks"]["redis"].get("unreachable")
               for h in bad), bad[:3]
    assert _health(worker)["status"] == "ok"
    assert worker.stop() == 0


def test_failover_on_an_idle_stream_rereads_what_was_lost(
        tmp_path, kafka_broker, fresh_redis_cluster, service_env, spawn_worker, unique_name):
    """All the reports are counted while one master's replica is stalled, then the stream stops
    and the master dies: no apply will ever conflict, the worker's offset audit finds the stored
    offsets behind its own and re-reads them."""
    cluster = fresh_redis_cluster
    cid = unique_name
    total = 30_000
    _, coll, _, worker, store = _one_worker(tmp_path, cid, cluster, service_env, spawn_worker,
                                            refresh_interval_s=60.0)
    master = cluster.master_of(keys.offsets_key(cid, 0))
    on_master = [p for p in range(coll.partitions)
                 if cluster.master_of(keys.offsets_key(cid, p)).port == master.port]

    async def n_now() -> int:
        for _ in range(100):  # the test's own client may meet the dead master first
            try:
                return await store.n(cid, coll.partitions)
            except TRANSIENT_ERRORS:
                await asyncio.sleep(0.1)
        raise AssertionError("Redis Cluster unreachable")

    async def run():
        replicas = await asyncio.to_thread(_stall_replication, cluster, master, f"{cid}#0")
        stats = await run_fleet(kafka_broker.bootstrap, coll, rate=0, total=total, batch=100,
                                seed=29, keep_counts=True, devices=500)
        assert await wait_for_n(store, cid, total, timeout=60) == total
        await asyncio.sleep(0.5)  # the stream is idle now
        cluster.crash_master(master)
        for r in replicas:
            os.kill(r.pid, signal.SIGCONT)
        await asyncio.to_thread(cluster.wait_failover, master)
        lost = total - await n_now()
        deadline = time.monotonic() + 40
        while await n_now() < total:
            assert time.monotonic() < deadline, worker.log_tail()
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        assert await n_now() == total
        _assert_counts(await read_collection(store, coll), stats.counts)
        await store.close()
        return lost

    lost = asyncio.run(run())
    ing = _health(worker)["checks"]["ingest"]
    # the scenario happened when the worker found its stored offsets behind its own (on a slow
    # failover its 5 s audit may have re-read the lost range before `lost` was measured)
    assert ing["lost_rereads"] >= 1, (f"nothing was lost on shards {on_master} (lost {lost}): "
                                      f"the scenario did not happen", ing)
    assert ing["conflicts"] == 0, ing
    assert worker.stop() == 0


def test_three_workers_twelve_partitions_join_and_leave(tmp_path, kafka_broker, redis_cluster,
                                                        service_env, spawn_worker, unique_name):
    cid = unique_name
    total = 180_000
    partitions = 12
    path = write_config(tmp_path / "c.yaml", cid, partitions=partitions, refresh_interval_s=5.0,
                        ingest={"batch_reports": 5000, "batch_seconds": 0.2})
    coll = load_config(path).collections[cid]
    env = dict(service_env, REDIS_URL=redis_cluster.url)
    workers = [spawn_worker(path, env=env)]
    workers[0].wait_ready(60)
    store = make_store(redis_cluster.url)
    rebalance: list[tuple[str, float]] = []
    t0 = time.monotonic()

    def held() -> tuple[set[str], bool]:
        """Partitions held by the live workers, and whether each worker's last assignment is done
        (assigned_at set) — all from /healthz."""
        out: set[str] = set()
        for w in workers:
            ing = _health(w)["checks"]["ingest"]
            if ing.get("assigned_at") is None and ing.get("assigned"):
                return out, False
            out.update(ing.get("assigned") or [])
        return out, True

    async def settled(what: str, since: float, timeout: float = 60.0) -> None:
        """Until the live workers hold all 12 partitions between them, once each, with their
        assignments positioned, after ``since``; records the seconds it took."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                parts, done = await asyncio.to_thread(held)
                per = [set(_health(w)["checks"]["ingest"]["assigned"]) for w in workers]
            except OSError:
                parts, done, per = set(), False, []
            if done and len(parts) == partitions and sum(len(p) for p in per) == partitions \
                    and all(per):
                rebalance.append((what, time.monotonic() - since))
                return
            assert time.monotonic() < deadline, (what, parts, [w.log_tail() for w in workers])
            await asyncio.sleep(0.05)

    async def membership() -> None:
        async def progress(n: int) -> None:
            while await store.n(cid, coll.partitions) < n:
                await asyncio.sleep(0.05)

        async def join() -> float:
            """Start a worker; returns the spawn time. Records when its web server first answers
            (the interpreter and imports take seconds here: start-up, not rebalance; the worker
            joins the group before its web server is up)."""
            t = time.monotonic()
            w = spawn_worker(path, env=env)
            while True:
                try:
                    await asyncio.to_thread(_health, w)
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            rebalance.append((f"worker {len(workers) + 1} process up", time.monotonic() - t))
            workers.append(w)
            return t

        await progress(20_000)
        await settled("worker 2 joins", await join())
        await progress(60_000)
        await settled("worker 3 joins", await join())
        await progress(100_000)
        t = time.monotonic()
        leaving = workers.pop(0)
        assert leaving.stop() == 0  # SIGTERM: leaves the group cleanly
        await settled("worker 1 leaves (SIGTERM)", t)
        await progress(130_000)
        t = time.monotonic()
        crashed = workers.pop(0)
        crashed.kill()  # SIGKILL: the group notices after the session timeout
        await settled("worker 2 crashes (SIGKILL)", t)

    async def run():
        task = asyncio.create_task(membership())
        stats = await run_fleet(kafka_broker.bootstrap, coll, rate=12_000, total=total, batch=100,
                                seed=23, keep_counts=True, devices=3000)
        await task
        n = await wait_for_n(store, cid, total, timeout=90)
        await asyncio.sleep(1.5)
        assert await store.n(cid, coll.partitions) == total, (n, rebalance,
                                                              [w.log_tail() for w in workers])
        _assert_counts(await read_collection(store, coll), stats.counts)
        await store.close()

    asyncio.run(run())
    print(f"rebalance seconds ({time.monotonic() - t0:.0f}s run): "
          + "; ".join(f"{w}: {s:.2f}" for w, s in rebalance))
    assert [w for w, _ in rebalance] == [
        "worker 2 process up", "worker 2 joins", "worker 3 process up", "worker 3 joins",
        "worker 1 leaves (SIGTERM)", "worker 2 crashes (SIGKILL)"]
    for w in workers:
        assert w.stop() == 0
