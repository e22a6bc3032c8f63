"""``ldpstream bench numeric --live``: ingest of a numeric collection against a categorical one of
the same width, side by side in one run (docs/numeric.md "Live").

On the embedded broker (Tansu) and Redis: two collections of 8 attributes each, the same ε per
attribute (:data:`EPSILON`), 4 partitions, the default windows — ``num`` (`sw-hm`, every attribute
numeric on [0, 100]) and ``cat`` (`rr-ind`, every attribute 16 categories) — each prefilled with
the fleet's batches of 500 reports drawn from the built-in generator, then raw/ingest pairs as in
``bench pipeline`` (bench/ingest_run.py ``ratio_pairs``: a raw aiokafka consumer that decodes
every message, then a worker process counting the same topic into Redis; three pairs, the median
pair's ratio), categorical first. A device's reporting rate does not enter a collection that is
not memoized: what the worker pays per report is the decoding, the counting and the Redis apply
of its deltas, which is what differs between the two (a numeric attribute's count tensor holds
one cell per output of its channel: 1,155 at ε = 2 against 16).

Prints each collection's ingest/raw and the worker's timings (poll, decode, count, apply), and
``numeric_vs_categorical`` = the numeric ratio ÷ the categorical one against the target
(:data:`TARGET`: within 10 %); beside it the same ratio by CPU (``numeric_vs_categorical_cpu``:
the raw consumer's CPU seconds ÷ the worker's and Redis's, per collection), which a busy machine
moves far less than the rates. ``--quick``: 200,000 reports per collection, one pair.
"""
from __future__ import annotations

import asyncio
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ldpstream.bench.ingest_run import BATCH, ratio_pairs, worker_env

#: ε of each attribute of both collections
EPSILON = 2.0
#: attributes of each collection
WIDTH = 8
#: numeric ingest/raw ÷ categorical ingest/raw at least this
TARGET = 0.9


def _write_config(path: Path) -> None:
    def coll(cid: str, mechanism: str, attribute: Any, **extra: Any) -> dict[str, Any]:
        names = [f"{cid}{i}" for i in range(WIDTH)]
        return {"id": cid, "schema": {"attributes": {a: attribute for a in names}},
                "mechanism": mechanism, "epsilon": EPSILON, "partitions": 4,
                "marginals": [[a] for a in names], **extra}

    doc = {"collections": [coll("cat", "rr-ind", [str(v) for v in range(16)]),
                           coll("num", "sw-hm", {"numeric": {"min": 0, "max": 100}},
                                estimators=["distribution", "mean"])]}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


async def run(quick: bool = False, progress: Any = None) -> dict[str, Any]:
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.dev.broker import EmbeddedBroker
    from ldpstream.dev.redis import EmbeddedRedis
    from ldpstream.kafka_admin import create_ldp_topics

    say = progress or (lambda msg: None)
    total, repeats = (200_000, 1) if quick else (4_000_000, 3)
    work = Path(tempfile.mkdtemp(prefix="ldpstream-bench-numeric-"))
    cfg = work / "numeric.yaml"
    _write_config(cfg)
    colls = load_config(cfg, env={}).collections
    broker, redis = EmbeddedBroker(), EmbeddedRedis()
    out: dict[str, Any] = {"reports": total, "reports_per_message": BATCH, "width": WIDTH,
                           "epsilon_per_attribute": EPSILON, "target": TARGET}
    try:
        bootstrap, redis_url = broker.start(), redis.start()
        await create_ldp_topics(bootstrap, tuple(colls.values()))
        env = worker_env(bootstrap, redis_url)
        store = make_store(redis_url)
        try:
            for cid, coll in colls.items():
                res = await ratio_pairs(bootstrap, store, cfg, env, coll, total, BATCH, repeats,
                                        work, cid, say, data="generator")
                cells = sum(math.prod(t.shape) for t in coll.tensors())
                out[cid] = {"mechanism": coll.mechanism_name, "cells": cells,
                            **{k: res[k] for k in ("ratio", "ratios", "ingest_rate",
                                                   "raw_consume_rate", "ingest_timings_s",
                                                   "raw_timings_s", "cpu_ratio",
                                                   "cpu_ratios")}}
        finally:
            await store.close()
    finally:
        broker.stop()
        redis.stop()
    out["numeric_vs_categorical"] = out["num"]["ratio"] / out["cat"]["ratio"]
    out["pass"] = out["numeric_vs_categorical"] >= TARGET
    cpu = (out["num"]["cpu_ratio"], out["cat"]["cpu_ratio"])
    out["numeric_vs_categorical_cpu"] = None if None in cpu else cpu[0] / cpu[1]
    return out


def report(out: dict[str, Any]) -> None:
    print(f"Ingest/raw, {out['width']} attributes at ε {out['epsilon_per_attribute']:g} each, "
          f"{out['reports']:,} reports of {out['reports_per_message']} per message")
    print(f"{'collection':<22} {'cells':>6} {'raw r/s':>12} {'ingest r/s':>12} {'ratio':>6}  "
          f"pairs{'':<14} worker s: poll / decode / count / apply")
    for cid in ("cat", "num"):
        r = out[cid]
        t = r["ingest_timings_s"]
        pairs = " / ".join(f"{x:.2f}" for x in r["ratios"])
        print(f"{cid + ' (' + r['mechanism'] + ')':<22} {r['cells']:>6} "
              f"{r['raw_consume_rate']:>12,.0f} {r['ingest_rate']:>12,.0f} {r['ratio']:>6.2f}  "
              f"{pairs:<19} {t.get('poll', 0):.3f} / {t.get('decode', 0):.3f} / "
              f"{t.get('count', 0):.3f} / {t.get('apply', 0):.3f}")
    print(f"numeric ÷ categorical: {out['numeric_vs_categorical']:.2f} "
          f"({'PASS' if out['pass'] else 'FAIL'}: target ≥ {out['target']:g})")
    if out["numeric_vs_categorical_cpu"] is not None:
        cpus = {cid: " / ".join(f"{x:.2f}" for x in out[cid]["cpu_ratios"]) for cid in ("cat", "num")}
        print(f"by CPU (raw consumer's CPU ÷ worker's + Redis's, pairs: categorical {cpus['cat']}, "
              f"numeric {cpus['num']}): {out['numeric_vs_categorical_cpu']:.2f}")


def main(args: Any) -> int:
    import sys

    out = asyncio.run(run(quick=bool(args.quick),
                          progress=lambda m: print(m, file=sys.stderr, flush=True)))
    if args.json:
        print(json.dumps(out, indent=2, default=float))
    else:
        report(out)
    return 0


__all__ = ["run", "main", "TARGET"]
