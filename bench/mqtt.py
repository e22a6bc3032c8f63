"""``ldpstream bench mqtt [--json] [--quick]``: MQTT ingress throughput and publish→counted latency.

On the embedded broker (Tansu), Redis and Mosquitto (Debian), in one run, for two batch sizes,
1 report per message (a device flushing every report) and 100 (a buffering device):

* **bare**: a plain MQTT subscriber that only decodes each batch (``decode_batch``) receives
  ``messages`` QoS 1 messages from one publishing process (``WINDOW`` publishes in flight); the
  rate from the first publish to the last decoded message is the ceiling the publisher and
  Mosquitto allow on this machine;
* **bridge**: the same messages (keyed batches, distinct device ids) through one
  ``ldpstream mqtt-bridge`` process, timed from the first publish until the bridge has
  acknowledged the last message (after Kafka acknowledged it, ``ldp_mqtt_messages_total``);
  ``ratio`` = bridge rate / bare rate, same run.

Then a worker is started, counts the backlog, and ``probes`` single-report messages are sent one
per second (a quiet stream, bench/ingest_run.py ``publish_to_counted``): the latency from
publish until the report is counted in Redis (``CountStore.n``, read every 2 ms) gives p50 and
p99 (with few probes, p99 is close to the maximum), against the 100 ms target of adaptive
flushing (docs/pipeline.md "Adaptive flushing").

Publisher, Mosquitto, bridge, broker and worker share the machine's cores: the numbers are a
floor for one bridge process, not a capacity plan. ``--quick``: fewer messages and probes.
"""
from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading
import time
from typing import Any

import numpy as np

from ldpstream.names import ENV_KAFKA_BOOTSTRAP, mqtt_reports_topic

CID = "bench-mqtt"
FLEET = "devices"
SIZES = (1, 100)
WINDOW = 256


def _payloads(n: int, size: int, first_device: int, version: int) -> list[bytes]:
    from ldpstream.producers.codec import encode_batch

    rng = np.random.default_rng(first_device)
    return [encode_batch(CID, version, rng.integers(0, 2, size=(size, 4)),
                         device_ids=np.full(size, first_device + i, dtype=np.uint64),
                         key=(first_device + i, 1)) for i in range(n)]


async def _publish(url: str, payloads: list[bytes], client_id: str) -> float:
    """Publish every payload (QoS 1, ``WINDOW`` in flight); returns the start time."""
    from ldpstream.mqtt_client import AsyncPublisher, connect, make_client, parse_mqtt_url

    ep = parse_mqtt_url(url)
    client = make_client(ep, client_id)
    await asyncio.to_thread(connect, client, ep, persistent=False)
    pub = AsyncPublisher(client, asyncio.get_running_loop())
    topic = mqtt_reports_topic(FLEET, CID)
    t0 = time.perf_counter()
    try:
        for a in range(0, len(payloads), WINDOW):
            await asyncio.gather(*(pub.publish(topic, p, timeout_s=60)
                                   for p in payloads[a:a + WINDOW]))
    finally:
        client.disconnect()
        client.loop_stop()
    return t0


async def _bare(stack: Any, payloads: list[bytes]) -> float:
    """Seconds from the first publish until a plain subscriber decoded every message."""
    from ldpstream.mqtt_client import connect, make_client, parse_mqtt_url
    from ldpstream.producers.codec import decode_batch

    done, count, t_end = threading.Event(), [0], [0.0]

    def on_message(_c: Any, _u: Any, msg: Any) -> None:
        decode_batch(msg.payload)
        count[0] += 1
        if count[0] == len(payloads):
            t_end[0] = time.perf_counter()
            done.set()

    ep = parse_mqtt_url(stack.mosquitto.bridge_url)
    sub = make_client(ep, "bench-bare")
    sub.on_message = on_message
    await asyncio.to_thread(connect, sub, ep, persistent=False)
    sub.subscribe(mqtt_reports_topic("+", "+"), qos=1)
    await asyncio.sleep(0.5)
    t0 = await _publish(stack.device_url, payloads, "bench-pub-bare")
    if not await asyncio.to_thread(done.wait, 300):
        raise RuntimeError(f"the bare subscriber got {count[0]} of {len(payloads)} messages")
    sub.disconnect()
    sub.loop_stop()
    return t_end[0] - t0


async def _through_bridge(stack: Any, payloads: list[bytes]) -> float:
    """Seconds from the first publish until the bridge acknowledged every message."""
    before = await asyncio.to_thread(stack.bridge.metric, "ldp_mqtt_messages_total")
    t0 = await _publish(stack.device_url, payloads, "bench-pub-bridge")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        done = await asyncio.to_thread(stack.bridge.metric, "ldp_mqtt_messages_total")
        if done - before >= len(payloads):
            return time.perf_counter() - t0
        await asyncio.sleep(0.02)
    raise RuntimeError(f"the bridge acknowledged {done - before:g} of {len(payloads)} messages; "
                       f"health: {stack.bridge.health()}")


async def _latency(stack: Any, store: Any, probes: int, expected: int) -> dict[str, Any]:
    from ldpstream.bench.ingest_run import latency_summary, publish_to_counted
    from ldpstream.mqtt_client import AsyncPublisher, connect, make_client, parse_mqtt_url

    deadline = time.monotonic() + 300
    while await store.n(CID, 4) < expected:  # the backlog of the throughput runs first
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker counted {await store.n(CID, 4)} of {expected}")
        await asyncio.sleep(0.2)
    ep = parse_mqtt_url(stack.device_url)
    client = make_client(ep, "bench-probe")
    await asyncio.to_thread(connect, client, ep, persistent=False)
    pub = AsyncPublisher(client, asyncio.get_running_loop())
    payloads = _payloads(probes + 1, 1, 9_000_000, 0)

    async def send(i: int) -> None:
        await pub.publish(mqtt_reports_topic(FLEET, CID), payloads[i + 1])

    try:
        return latency_summary(await publish_to_counted(store, CID, 4, send, probes))
    finally:
        client.disconnect()
        client.loop_stop()


async def run(quick: bool = False) -> dict[str, Any]:
    import yaml

    from ldpstream.agents.app import make_store
    from ldpstream.dev.broker import EmbeddedBroker
    from ldpstream.dev.mqtt_stack import MqttStack
    from ldpstream.dev.process import free_port
    from ldpstream.dev.redis import EmbeddedRedis
    from ldpstream.embedded import WorkerChild
    from ldpstream.estimators.families.rr import RRIndependent
    from ldpstream.estimators.kernels.domain import Domain
    from ldpstream.kafka_admin import create_topics
    from ldpstream.names import COMPACTED_TOPICS, CONFIG_TOPIC, SERVICE_TOPICS, reports_topic
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.signing import ENV_PUBLIC_KEY, ENV_SIGNING_KEY, SigningKey

    messages = {1: 500, 100: 200} if quick else {1: 5000, 100: 1000}
    probes = 5 if quick else 30
    broker = redis = stack = worker = None
    tmp = tempfile.mkdtemp(prefix="ldpstream-bench-mqtt-")
    try:
        bootstrap = os.environ.get(ENV_KAFKA_BOOTSTRAP)
        if not bootstrap:
            broker = EmbeddedBroker()
            bootstrap = broker.start()
        redis = EmbeddedRedis(appendfsync="everysec")
        redis_url = redis.start()
        key = SigningKey.generate()
        domain = Domain.from_categories({a: ["0", "1"] for a in "abcd"})
        mech = RRIndependent(domain, epsilon=1.0)
        await create_topics(bootstrap, {**SERVICE_TOPICS, reports_topic(CID): 4},
                            compacted=COMPACTED_TOPICS)
        async with Publisher(bootstrap) as pub:
            await pub.send_and_wait(CONFIG_TOPIC, key.sign_state(mech.state(), CID),
                                    key=CID.encode())
        env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=bootstrap, REDIS_URL=redis_url,
                   **{ENV_PUBLIC_KEY: key.verify_key.to_text(), ENV_SIGNING_KEY: key.to_text(),
                      "LDP_SESSION_TIMEOUT_S": "3"})
        stack = MqttStack(env, fleet=FLEET, collections=[CID])
        stack.start_broker()
        rows, first = [], 0
        for size in SIZES:  # bare first: no bridge session exists yet to queue them
            payloads = _payloads(messages[size], size, first, mech.version)
            first += len(payloads)
            rows.append({"reports_per_message": size, "messages": len(payloads),
                         "bare_s": await _bare(stack, payloads)})
        await asyncio.to_thread(stack.start_bridge)
        for row in rows:
            payloads = _payloads(row["messages"], row["reports_per_message"], first, mech.version)
            first += len(payloads)
            row["bridge_s"] = await _through_bridge(stack, payloads)
        total = sum(r["messages"] * r["reports_per_message"] for r in rows)
        config = os.path.join(tmp, "bench-mqtt.yaml")
        with open(config, "w") as fh:
            yaml.safe_dump({"collections": [{
                "id": CID, "schema": {"attributes": {a: ["0", "1"] for a in "abcd"}},
                "mechanism": "rr-ind", "epsilon": 1.0, "partitions": 4,
                "marginals": [["a", "b"]], "estimators": ["castell"]}]}, fh)
        worker = WorkerChild(config, free_port(), env)
        store = make_store(redis_url)
        try:
            quiet = await _latency(stack, store, probes, total)
        finally:
            await store.close()
    finally:
        if worker is not None:
            worker.stop()
        if stack is not None:
            stack.stop()
        for svc in (redis, broker):
            if svc is not None:
                svc.stop()
    for r in rows:
        n, size = r["messages"], r["reports_per_message"]
        for side in ("bare", "bridge"):
            r[f"{side}_messages_per_s"] = round(n / r[f"{side}_s"], 1)
            r[f"{side}_reports_per_s"] = round(n * size / r[f"{side}_s"], 1)
        r["ratio"] = round(r["bare_s"] / r["bridge_s"], 3)
    return {"window": WINDOW, "results": rows, "probes": probes,
            "latency_p50_s": quiet["p50_s"], "latency_p99_s": quiet["p99_s"], "quiet": quiet}


def main(args: Any) -> int:
    res = asyncio.run(run(quick=bool(getattr(args, "quick", False))))
    if getattr(args, "json", False):
        print(json.dumps(res, indent=2))
        return 0
    print(f"MQTT ingress: one publisher ({res['window']} QoS 1 messages in flight), Mosquitto, "
          f"one bridge, loopback")
    print(f"{'reports/msg':>11} {'messages':>9} {'bare msg/s':>11} {'bridge msg/s':>13} "
          f"{'bridge reports/s':>17} {'ratio':>6}")
    for r in res["results"]:
        print(f"{r['reports_per_message']:>11} {r['messages']:>9} "
              f"{r['bare_messages_per_s']:>11.0f} {r['bridge_messages_per_s']:>13.0f} "
              f"{r['bridge_reports_per_s']:>17.0f} {r['ratio']:>6.2f}")
    q = res["quiet"]
    print(f"publish -> counted ({q['probes']} single-report probes, one per second): "
          f"p50 {1000 * q['p50_s']:.0f} ms, p99 {1000 * q['p99_s']:.0f} ms, max "
          f"{1000 * q['max_s']:.0f} ms: {'PASS' if q['pass'] else 'FAIL'} "
          f"(p99 <= {1000 * q['target_p99_s']:.0f} ms)")
    return 0
