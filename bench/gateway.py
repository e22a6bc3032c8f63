"""``ldpstream bench gateway [--json] [--quick]``: HTTP ingest gateway throughput and latency.

On the embedded broker (Tansu), in one run: a signed rr-ind state (4 attributes) is published on
``ldp.config``, ``ldpstream gateway`` runs as a child process on loopback, and this process sends a
bounded number of ``POST /v1/collections/<id>/reports`` requests (binary batches, one device
each, distinct device ids) with ``concurrency`` requests in flight, for two batch sizes: 1 report
per request (a device flushing every report) and 100 (a buffering device). Every request must be
answered 200 (the gateway answers after Kafka acknowledged). Reported per size: requests/s,
reports/s, p50 and p99 request latency (client side, seconds). Three ways in the same run: plain
HTTP on kept-alive connections, HTTPS (``--tls-cert``, a throw-away CA; the client verifies the
host name) on kept-alive connections, and HTTPS with a new connection (TLS handshake) for every
request, as a device that connects per batch does.

After the plain-HTTP rows, a worker (and Redis) counts their backlog, then ``probes``
single-report requests are sent one per second on a kept connection (a quiet stream,
bench/ingest_run.py ``publish_to_counted``): publish → counted p50 / p99 against the 100 ms
target of adaptive flushing (docs/pipeline.md "Adaptive flushing"). The worker is stopped before
the HTTPS rows, so the throughput rows run without it, as before.

Client, gateway and broker share the machine's cores: the numbers are a floor for one gateway
process, not a capacity plan. ``--quick``: 300 requests per size, 5 probes.
"""
from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from ldpstream.names import ENV_KAFKA_BOOTSTRAP

CID = "bench-gateway"
TOKEN = "bench-fleet-token-0123456789"
SIZES = (1, 100)
CONCURRENCY = 32


def _wait_ready(port: int, proc: subprocess.Popen, tls: ssl.SSLContext | None,
                timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{_base(port, tls)}/healthz", timeout=2,
                                        context=tls) as r:
                if CID in json.loads(r.read())["collections"]:
                    return
        except (urllib.error.URLError, OSError, ValueError):
            pass
        time.sleep(0.3)
    raise TimeoutError("gateway not ready")


def _base(port: int, tls: ssl.SSLContext | None) -> str:
    return f"{'https' if tls else 'http'}://localhost:{port}"


async def _load(port: int, requests: int, size: int, seed: int, tls: ssl.SSLContext | None = None,
                fresh: bool = False) -> dict[str, Any]:
    import aiohttp

    from ldpstream.producers.codec import encode_batch

    rng = np.random.default_rng(seed)
    bodies = [encode_batch(CID, 0, rng.integers(0, 2, size=(size, 4)),
                           device_ids=np.full(size, seed * 1_000_000 + i, dtype=np.uint64))
              for i in range(requests)]
    url = f"{_base(port, tls)}/v1/collections/{CID}/reports"
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/octet-stream"}
    latencies = np.empty(requests)
    statuses: dict[int, int] = {}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)

    async def client(session: Any) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            t0 = time.perf_counter()
            async with session.post(url, data=bodies[i], headers=headers) as r:
                await r.read()
                statuses[r.status] = statuses.get(r.status, 0) + 1
            latencies[i] = time.perf_counter() - t0

    connector = aiohttp.TCPConnector(limit=CONCURRENCY, ssl=tls if tls else True,
                                     force_close=fresh)
    async with aiohttp.ClientSession(connector=connector) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(CONCURRENCY)))
        elapsed = time.perf_counter() - t0
    if statuses != {200: requests}:
        raise RuntimeError(f"not every request was accepted: {statuses}")
    return {"scheme": "https" if tls else "http", "connection": "new" if fresh else "kept",
            "reports_per_request": size, "requests": requests, "seconds": round(elapsed, 3),
            "requests_per_s": round(requests / elapsed, 1),
            "reports_per_s": round(requests * size / elapsed, 1),
            "p50_s": round(float(np.percentile(latencies, 50)), 5),
            "p99_s": round(float(np.percentile(latencies, 99)), 5)}


async def _quiet(port: int, env: dict[str, str], probes: int, tmp: Path) -> dict[str, Any]:
    """A worker counts what the gateway took, then ``probes`` single reports are posted one per
    second: publish (request sent) → counted in Redis."""
    import aiohttp
    import yaml

    from ldpstream.agents.app import make_store
    from ldpstream.bench.ingest_run import latency_summary, publish_to_counted
    from ldpstream.dev.process import free_port
    from ldpstream.dev.redis import EmbeddedRedis
    from ldpstream.embedded import WorkerChild
    from ldpstream.producers.codec import encode_batch

    config = tmp / "bench-gateway-worker.yaml"
    config.write_text(yaml.safe_dump({"collections": [{
        "id": CID, "schema": {"attributes": {a: ["0", "1"] for a in "abcd"}},
        "mechanism": "rr-ind", "epsilon": 1.0, "partitions": 4, "marginals": [["a", "b"]],
        "estimators": ["castell"]}]}))
    redis = EmbeddedRedis(appendfsync="everysec")
    worker = None
    try:
        url = redis.start()
        worker = WorkerChild(str(config), free_port(), dict(env, REDIS_URL=url))
        store = make_store(url)
        rng = np.random.default_rng(77)
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/octet-stream"}
        async with aiohttp.ClientSession() as session:
            async def send(i: int) -> None:
                body = encode_batch(CID, 0, rng.integers(0, 2, size=(1, 4)),
                                    device_ids=np.full(1, 9_000_000 + i, dtype=np.uint64))
                async with session.post(f"http://localhost:{port}/v1/collections/{CID}/reports",
                                        data=body, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"probe {i} answered {r.status}")

            try:
                return latency_summary(await publish_to_counted(store, CID, 4, send, probes))
            finally:
                await store.close()
    finally:
        if worker is not None:
            worker.stop()
        redis.stop()


async def run(quick: bool = False) -> dict[str, Any]:
    from ldpstream.credentials.x509 import write_pki
    from ldpstream.dev.broker import EmbeddedBroker
    from ldpstream.dev.process import free_port
    from ldpstream.estimators.families.rr import RRIndependent
    from ldpstream.estimators.kernels.domain import Domain
    from ldpstream.kafka_admin import create_topics
    from ldpstream.names import COMPACTED_TOPICS, CONFIG_TOPIC, reports_topic
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.signing import ENV_PUBLIC_KEY, ENV_SIGNING_KEY, SigningKey

    requests = 300 if quick else 3000
    probes = 5 if quick else 30
    quiet: dict[str, Any] = {}
    broker = None
    bootstrap = os.environ.get(ENV_KAFKA_BOOTSTRAP)
    if not bootstrap:
        broker = EmbeddedBroker()
        bootstrap = broker.start()
    proc = None
    tmp = tempfile.TemporaryDirectory(prefix="ldpstream-bench-gateway-")
    try:
        ca, chain = write_pki(Path(tmp.name))
        key = SigningKey.generate()
        mech = RRIndependent(Domain(("a", "b", "c", "d"), (2, 2, 2, 2)), epsilon=1.0)
        await create_topics(bootstrap, {CONFIG_TOPIC: 1, reports_topic(CID): 4},
                            compacted=COMPACTED_TOPICS)
        async with Publisher(bootstrap) as pub:
            await pub.send_and_wait(CONFIG_TOPIC, key.sign_state(mech.state(), CID),
                                    key=CID.encode())
        env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=bootstrap,
                   **{ENV_PUBLIC_KEY: key.verify_key.to_text(),
                      "LDP_GATEWAY_TOKENS": json.dumps(
                          {"fleets": {"bench": {"token": TOKEN, "collections": [CID]}}})})
        rows = []
        for tls in (None, ssl.create_default_context(cafile=str(ca))):
            port = free_port()
            proc = subprocess.Popen([sys.executable, "-m", "ldpstream.cli", "gateway", "--port",
                                     str(port), *(["--tls-cert", str(chain)] if tls else [])],
                                    env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            await asyncio.to_thread(_wait_ready, port, proc, tls)
            await _load(port, min(requests, 100), 1, seed=99, tls=tls)  # warm-up
            for fresh in (False, True) if tls else (False,):
                rows += [await _load(port, requests, size, seed=len(rows), tls=tls, fresh=fresh)
                         for size in SIZES]
            if tls is None:
                quiet = await _quiet(port, dict(env, LDP_SESSION_TIMEOUT_S="3",
                                                **{ENV_SIGNING_KEY: key.to_text()}),
                                     probes, Path(tmp.name))
            proc.terminate()
            proc.wait(20)
            proc = None
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(20)
        if broker is not None:
            broker.stop()
        tmp.cleanup()
    return {"concurrency": CONCURRENCY, "results": rows, "quiet": quiet}


def main(args: Any) -> int:
    res = asyncio.run(run(quick=bool(getattr(args, "quick", False))))
    if getattr(args, "json", False):
        print(json.dumps(res, indent=2))
        return 0
    print(f"gateway load test: {res['concurrency']} requests in flight, loopback, binary batches")
    print(f"{'scheme':>6} {'connection':>10} {'reports/request':>16} {'requests':>9} "
          f"{'req/s':>9} {'reports/s':>11} {'p50 ms':>8} {'p99 ms':>8}")
    for r in res["results"]:
        print(f"{r['scheme']:>6} {r['connection']:>10} {r['reports_per_request']:>16} "
              f"{r['requests']:>9} {r['requests_per_s']:>9.0f} "
              f"{r['reports_per_s']:>11.0f} {1000 * r['p50_s']:>8.1f} {1000 * r['p99_s']:>8.1f}")
    q = res["quiet"]
    print(f"publish -> counted over HTTP ({q['probes']} single-report requests, one per second, "
          f"worker running): p50 {1000 * q['p50_s']:.0f} ms, p99 {1000 * q['p99_s']:.0f} ms, "
          f"max {1000 * q['max_s']:.0f} ms: {'PASS' if q['pass'] else 'FAIL'} "
          f"(p99 <= {1000 * q['target_p99_s']:.0f} ms)")
    return 0
