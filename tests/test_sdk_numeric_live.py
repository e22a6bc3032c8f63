"""A numeric collection end to end (docs/numeric.md, docs/device-protocol.md "Numeric
attributes"): an ``sw-hm`` collection (a firmware version and a battery level on [0, 100]) on one
real worker; its signed state reaches three SDK devices, each over another ingress — the C
example ``ldp_post`` through ``ldpstream gateway``, the TypeScript ``mqtt.js`` through Mosquitto
and ``ldpstream mqtt-bridge``, the Python ``DeviceClient`` straight to Kafka — which report raw
numbers (values outside the range clipped and counted by each device) with the description's
``wave`` steps. The counts in Redis equal the counts of the reports on the report topic, the
Python device's among them its own; a batch with a cell beyond the layout and one of the wrong
width go to ``ldp.dlq`` with their reasons and are not counted."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from contextlib import ExitStack

import numpy as np
import pytest
import yaml
from kafka_helpers import read_dlq
from mqtt_helpers import FLEETS
from sdk_helpers import TS_DIR, c_sdk, ts_sdk  # noqa: F401
from store_helpers import assert_counted
from test_gateway import TOKEN_A, GatewayProcess, _topic_messages, fleets_doc

from ldpstream.producers.codec import decode_batch, encode_batch, explain_batch
from ldpstream.producers.signing import ENV_PUBLIC_KEY

pytestmark = pytest.mark.pipeline

N = 30  # records per device
VALUES = ["12.5", "-4", "57.25", "100", "130", "0.5", "99.9", "73", "1e1", "42"]  # 2 clipped in 10


def _records(seed: int) -> list[dict[str, str]]:
    rng = np.random.default_rng(seed)
    return [{"fw": f"v{1 + int(rng.integers(3))}", "battery": VALUES[i % len(VALUES)]}
            for i in range(N)]


def _lines(records: list[dict[str, str]]) -> str:
    return "".join(",".join(f"{a}={v}" for a, v in r.items()) + "\n" for r in records)


def test_numeric_reports_over_the_gateway_mqtt_and_kafka(
        tmp_path, mosquitto, kafka_broker, redis_server, spawn_worker, service_env, unique_name,
        c_sdk, ts_sdk):  # noqa: F811
    from ldpstream.config import load_config
    from ldpstream.dev.process import free_port
    from ldpstream.producers.device import ConfigWatcher
    from ldpstream.producers.ledger import Ledger
    from ldpstream.producers.program import SplitMix64
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.sdk import DeviceClient, KafkaTransport

    cid = unique_name
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"collections": [{
        "id": cid, "schema": {"attributes": {"fw": ["v1", "v2", "v3"],
                                             "battery": {"numeric": {"min": 0, "max": 100}}}},
        "mechanism": "sw-hm", "epsilon": 1.0, "partitions": 1,
        "marginals": [["battery"], ["fw", "battery"]], "estimators": ["distribution", "mean"],
        "refresh_interval_s": 1.0}]}))
    coll = load_config(config).collections[cid]
    mech = coll.mechanism()
    fleets = tmp_path / "mqtt-fleets.yaml"
    fleets.write_text(yaml.safe_dump({"fleets": {"phones": {"collections": [cid]}}}))
    key = os.environ[ENV_PUBLIC_KEY]
    clipped = sum(v in ("-4", "130") for v in (r["battery"] for r in _records(0)))
    worker = spawn_worker(str(config))
    with ExitStack() as running:   # the worker, the gateway and the bridge start side by side
        gateway = GatewayProcess(dict(service_env, LDP_GATEWAY_TOKENS=json.dumps(fleets_doc(cid))),
                                 free_port(), str(tmp_path / "gateway.log"))
        running.callback(lambda: gateway.stop() == 0 or pytest.fail("the gateway failed"))
        proc = GatewayProcess(dict(service_env, LDP_MQTT_URL=mosquitto.bridge_url,
                                   LDP_MQTT_FLEETS_FILE=str(fleets),
                                   LDP_MQTT_CLIENT_ID=f"bridge-{cid}", LDP_MQTT_CA=""),
                              free_port(), str(tmp_path / "bridge.log"), command=("mqtt-bridge",))
        running.callback(lambda: proc.stop() == 0 or pytest.fail("the bridge failed"))
        worker.wait_ready(60)
        gateway.wait_for(cid)
        proc.wait_for(cid)
        for d in ("c", "ts"):
            (tmp_path / d).mkdir()
        # C over the gateway, TypeScript over MQTT: raw numbers as text, clipping counted
        c = subprocess.run([str(c_sdk / "ldp_post"), f"http://127.0.0.1:{gateway.port}", TOKEN_A,
                            cid, key, "101", str(tmp_path / "c"), "10"],
                           input=_lines(_records(1)), capture_output=True, text=True, timeout=60)
        assert c.returncode == 0, c.stderr
        assert json.loads(c.stdout) == {"sent": N, "batches": 3, "clipped": {"battery": clipped}}
        t = subprocess.run(["node", str(ts_sdk / "tools" / "mqtt.js"),
                            f"mqtt://phones@127.0.0.1:{mosquitto.port}", "-", "phones", cid, key,
                            "202", str(tmp_path / "ts"), "10"], input=_lines(_records(2)),
                           capture_output=True, text=True, timeout=60, cwd=TS_DIR,
                           env=dict(os.environ, LDP_MQTT_PASSWORD=FLEETS["phones"].password))
        assert t.returncode == 0, t.stderr
        assert json.loads(t.stdout) == {"sent": N, "batches": 3, "clipped": {"battery": clipped}}

        async def python_device_and_malformed() -> np.ndarray:
            watcher = await ConfigWatcher(kafka_broker.bootstrap).start()
            own = []
            try:
                async with Publisher(kafka_broker.bootstrap) as pub:
                    client = DeviceClient(cid, watcher=watcher, transport=KafkaTransport(pub),
                                          ledger=Ledger(":memory:"), device_id=303,
                                          batch_size=10, rng=SplitMix64(7))
                    for r in _records(3):   # numbers, not text
                        res = await client.report(dict(r, battery=float(r["battery"])))
                        assert res.status == "queued", res.reason
                        own.append(res.report)
                    await client.flush()
                    assert client.clipped == {"battery": clipped}
                    topic = coll.topic
                    beyond = np.array([[0, mech.report_bounds()[1]]])   # a cell past the layout
                    await pub.send(topic, encode_batch(cid, mech.version, beyond))
                    await pub.send(topic, encode_batch(cid, mech.version, np.zeros((1, 3), int)))
                    await pub.flush()
            finally:
                await watcher.stop()
            return np.stack(own)

        own = asyncio.run(python_device_and_malformed())

        async def check() -> None:
            batches = [decode_batch(m.value) for m in
                       await _topic_messages(kafka_broker.bootstrap, coll.topic)]
            good = [b for b in batches if explain_batch(b, {cid: {mech.version: mech}}) is None]
            assert len(batches) == len(good) + 2
            reports = np.concatenate([b.reports for b in good])
            assert len(reports) == 3 * N
            ids = np.concatenate([b.device_ids for b in good])
            np.testing.assert_array_equal(reports[ids == 303], own)  # the Python device's own
            await assert_counted(redis_server.url, coll, mech.count(reports, coll.tensors()),
                                 3 * N, timeout=30)

        asyncio.run(check())
        deadline, dlq = time.monotonic() + 15, []
        while time.monotonic() < deadline and len(dlq) < 2:
            dlq = read_dlq(kafka_broker.bootstrap, topic=coll.topic)
            time.sleep(0.3)
        assert sorted(r["reason"] for r in dlq) == ["out_of_domain", "wrong_width"], dlq
