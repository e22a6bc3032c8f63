"""``ldpstream bench adaptive [--json] [--quick]``: what adaptive mechanisms cost on the stream.

On the embedded broker (Tansu) and Redis, with one ``ldpstream worker`` child process:

1. **two live versions**: two Corr-RR (``corr-rr-paper``) collections, prefilled with the same
   number of reports (500 per message): ``one`` all stamped version 0 (Phase I), ``two`` half
   version 0 (Phase I) and half version 1 (Phase II, the table computed from Phase I and stored
   as the collection's state before the worker starts, so it accepts both). For each: the raw
   aiokafka consumption + decode rate, the worker's ingest rate (``/healthz`` timings) and their
   ratio, measured side by side in one run;
2. **controller latency**: Corr-RR collections with ``phase1_reports`` P and a controller
   interval of 0.25 s and 1 s: a fleet sends exactly P Phase I reports as fast as it can; the
   latency is from the broker's acknowledgement of the last one to a device's ``ConfigWatcher``
   seeing version 1 (signed) — ingest flush + the controller's tick + the one-interval wait
   before publishing + the watcher's fetch.

``--quick``: 40,000 reports per collection, one latency sample per interval.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ldpstream.bench.ingest_run import ingest_rate, raw_consume, start_worker, stop_worker, worker_env

BATCH = 500
COLUMNS = ["sex", "race", "relationship", "Salary"]


def _collection(cid: str, **extra: Any) -> dict[str, Any]:
    return {"id": cid, "schema": {"csv": {"columns": COLUMNS}}, "mechanism": "corr-rr-paper",
            "epsilon": 2.0, "epsilon_scope": "record", "partitions": 4,
            "marginals": [[a] for a in COLUMNS], "estimators": ["paper"],
            "refresh_interval_s": 5, "windows": ["all"], **extra}


async def _versions_rate(bootstrap: str, store: Any, cfg_path: Path, config: Any, env: dict,
                         total: int, work: Path, say) -> dict[str, Any]:
    from ldpstream.agents.control.controller import origin_of, store_state
    from ldpstream.dev.process import free_port
    from ldpstream.producers.fleet import run_fleet

    one, two = config.collections["one"], config.collections["two"]
    v0 = two.mechanism()
    rng = np.random.default_rng(0)
    recs = np.stack([rng.integers(0, d, 20_000) for d in two.domain.shape], axis=1)
    v1 = v0.adapt({0: v0.count(v0.randomize(recs, rng), v0.tensors())})
    assert v1 is not None and v1.version == 1
    assert await store_state(store.redis, "two", origin_of(v0), None, v1)
    say(f"prefill {total:,} reports (version 0) and {total // 2:,} + {total // 2:,} "
        "(versions 0 and 1) ...")
    s1 = await run_fleet(bootstrap, one, rate=0, total=total, batch=BATCH, seed=1,
                         mechanism=one.mechanism())
    s2a = await run_fleet(bootstrap, two, rate=0, total=total // 2, batch=BATCH, seed=2,
                          mechanism=v0)
    s2b = await run_fleet(bootstrap, two, rate=0, total=total - total // 2, batch=BATCH, seed=3,
                          mechanism=v1)
    say("raw consumption ...")
    raw1, _ = await raw_consume(bootstrap, one, s1.sent_messages)
    raw2, _ = await raw_consume(bootstrap, two, s2a.sent_messages + s2b.sent_messages)
    out: dict[str, Any] = {"reports": total, "reports_per_message": BATCH}
    for name, coll, raw in (("one_version", one, raw1), ("two_versions", two, raw2)):
        port = free_port()
        say(f"ingest ({name}) ...")
        cfg = yaml.safe_load(cfg_path.read_text())
        cfg["collections"] = [c for c in cfg["collections"] if c["id"] == coll.id]
        path = work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        worker = start_worker(path, env, port, work / f"worker-{name}.log")
        try:
            rate = await ingest_rate(store, coll.id, coll.partitions, total, port)
        finally:
            stop_worker(worker)
        out[name] = {"ingest_rate": rate, "raw_consume_rate": raw, "ratio": rate / raw}
    out["ratio_two_over_one"] = out["two_versions"]["ratio"] / out["one_version"]["ratio"]
    out["ingest_two_over_one"] = (out["two_versions"]["ingest_rate"]
                                  / out["one_version"]["ingest_rate"])
    return out


async def _latency(bootstrap: str, config: Any, cids: list[str], key: Any, say
                   ) -> dict[str, Any]:
    from ldpstream.producers.device import ConfigWatcher
    from ldpstream.producers.fleet import run_fleet

    out: dict[str, list[float]] = {}
    for cid in cids:
        coll = config.collections[cid]
        seen = asyncio.Event()

        def on_change(c: str, signed: Any, cid: str = cid) -> None:
            if c == cid and signed.version >= 1:
                seen.set()
        # the latency of adopting a state (ceilings are tested in tests/test_state_acceptance.py)
        watcher = await ConfigWatcher(bootstrap, verify_key=key.verify_key, max_epsilon=None,
                                      on_change=on_change).start()
        try:
            p1 = int(coll.params["phase1_reports"])
            await run_fleet(bootstrap, coll, rate=0, total=p1, batch=BATCH, seed=5,
                            mechanism=coll.mechanism())
            t_last = time.monotonic()
            await asyncio.wait_for(seen.wait(), 60)
            lat = time.monotonic() - t_last
        finally:
            await watcher.stop()
        key_ = f"{float(coll.controller_interval_s):g}s"
        out.setdefault(key_, []).append(lat)
        say(f"controller latency ({key_} interval): {lat:.2f} s")
    return {k: {"median_s": statistics.median(v), "samples_s": v} for k, v in out.items()}


async def run(quick: bool = False, progress=None) -> dict[str, Any]:
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.dev.broker import EmbeddedBroker
    from ldpstream.dev.process import free_port
    from ldpstream.dev.redis import EmbeddedRedis
    from ldpstream.kafka_admin import create_ldp_topics
    from ldpstream.producers.signing import ENV_SIGNING_KEY, SigningKey

    say = progress or (lambda msg: None)
    total = 40_000 if quick else 400_000
    samples = 1 if quick else 3
    work = Path(tempfile.mkdtemp(prefix="ldpstream-bench-adaptive-"))
    lat_ids = [f"lat{i}_{iv}" for iv in ("q", "s") for i in range(samples)]
    colls = [_collection("one", params={"phase1_reports": 10 * total}),
             _collection("two", params={"phase1_reports": 20_000})]
    colls += [_collection(c, params={"phase1_reports": 5000},
                          controller_interval_s=0.25 if "_q" in c else 1.0) for c in lat_ids]
    cfg_path = work / "bench.yaml"
    cfg_path.write_text(yaml.safe_dump({"collections": colls,
                                        "ingest": {"batch_reports": 20000, "batch_seconds": 0.2}}))
    config = load_config(cfg_path, env={})
    key = SigningKey.generate()
    broker, redis = EmbeddedBroker(), EmbeddedRedis()
    worker = None
    result: dict[str, Any] = {}
    try:
        bootstrap, redis_url = broker.start(), redis.start()
        await create_ldp_topics(bootstrap, config.collections.values())
        env = worker_env(bootstrap, redis_url, **{ENV_SIGNING_KEY: key.to_text()})
        store = make_store(redis_url)
        result["versions"] = await _versions_rate(bootstrap, store, cfg_path, config, env,
                                                  total, work, say)
        say("controller latency ...")
        lat_cfg = yaml.safe_load(cfg_path.read_text())
        lat_cfg["collections"] = [c for c in lat_cfg["collections"] if c["id"] in lat_ids]
        lat_path = work / "latency.yaml"
        lat_path.write_text(yaml.safe_dump(lat_cfg))
        port = free_port()
        worker = start_worker(lat_path, env, port, work / "worker-latency.log")
        await _wait_ready(port)
        result["controller_latency"] = await _latency(bootstrap, config, lat_ids, key, say)
        await store.close()
    finally:
        if worker is not None:
            stop_worker(worker)
        broker.stop()
        redis.stop()
    return result


async def _wait_ready(port: int, timeout: float = 60.0) -> None:
    import urllib.request
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                if json.loads(r.read()).get("checks", {}).get("ingest", {}).get("assigned_at"):
                    return
        except OSError:
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError("worker not ready")


def main(args) -> int:
    import sys

    res = asyncio.run(run(bool(getattr(args, "quick", False)),
                          progress=lambda m: print(m, file=sys.stderr, flush=True)))
    if getattr(args, "json", False):
        print(json.dumps(res, indent=2))
        return 0
    v = res["versions"]
    print(f"adaptive bench ({v['reports']:,} reports, {v['reports_per_message']} per message)")
    for name in ("one_version", "two_versions"):
        r = v[name]
        print(f"  {name:<13} ingest {r['ingest_rate']:>11,.0f}/s  raw {r['raw_consume_rate']:>11,.0f}/s"
              f"  ingest/raw {r['ratio']:.3f}")
    print(f"  two versions / one version: ingest/raw {v['ratio_two_over_one']:.3f}, ingest "
          f"{v['ingest_two_over_one']:.3f}")
    for k, lat in res["controller_latency"].items():
        print(f"  controller latency, {k} interval: median {lat['median_s']:.2f} s "
              f"(samples {', '.join(f'{x:.2f}' for x in lat['samples_s'])})")
    return 0
