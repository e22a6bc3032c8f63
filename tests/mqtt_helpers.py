"""The MQTT tests' helpers: a real ``mosquitto`` (Debian package) on a free loopback port with
per-fleet passwords and ACLs (ldpstream/dev/mosquitto.py), the bridge as a child process, SDK
devices over MQTT, and the exact-count check.

- ``mosquitto`` → a :class:`~ldpstream.dev.mosquitto.MosquittoService` without TLS, fleets
  ``FLEETS`` and the bridge user ``BRIDGE``, stopped after the test.
- ``mosquitto_tls`` → the same with its TLS listener (``.ca_path`` is the test CA).

The fixtures are in tests/conftest.py.
"""
from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import Iterator

import numpy as np
import yaml
from conftest import wait_for_n
from gateway_helpers import GatewayProcess
from store_helpers import read_collection

from ldpstream.dev.mosquitto import FleetCreds, MosquittoService
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.mqtt_client import AsyncPublisher, connect, make_client, parse_mqtt_url
from ldpstream.producers.codec import encode_batch

DOM = Domain.from_categories({"os": ["android", "ios", "other"], "plan": ["free", "pro"]})

FLEETS = {"phones": FleetCreds("phones", "phones-secret-0123"),
          "sensors": FleetCreds("sensors", "sensors-secret-0123")}
BRIDGE = FleetCreds("ldp-bridge", "bridge-secret-0123")


def running_mosquitto(tmp_path, *, tls: bool) -> Iterator[MosquittoService]:
    """Start a Mosquitto with ``FLEETS`` and ``BRIDGE`` under ``tmp_path``, yield it, stop it."""
    svc = MosquittoService(tmp_path / ("mosquitto-tls" if tls else "mosquitto"), tls=tls,
                           fleets=FLEETS, bridge=BRIDGE)
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()


def setup(tmp_path, service_env, spawn_worker, cid: str, mqtt, *, ca=None):
    """A worker for ``cid``, a fleets file (phones: cid; sensors: elsewhere) and the bridge's
    environment; returns (config, worker, env)."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"collections": [{
        "id": cid, "schema": {"attributes": {a: list(DOM.categories(a)) for a in DOM.attrs}},
        "mechanism": "rr-ind", "epsilon": 1.0, "partitions": 3, "marginals": [["os", "plan"]],
        "estimators": ["castell"], "refresh_interval_s": 2.0}]}))
    fleets = tmp_path / "fleets.yaml"
    fleets.write_text(yaml.safe_dump({"fleets": {"phones": {"collections": [cid]},
                                                 "sensors": {"collections": ["elsewhere"]}}}))
    worker = spawn_worker(str(path))
    worker.wait_ready(60)
    env = dict(service_env, LDP_MQTT_URL=mqtt.bridge_url, LDP_MQTT_FLEETS_FILE=str(fleets),
               LDP_MQTT_CLIENT_ID=f"bridge-{cid}", LDP_MQTT_CA=str(ca or ""))
    from ldpstream.config import load_config
    return load_config(path).collections[cid], worker, env


def bridge(env, tmp_path, cid: str) -> GatewayProcess:
    from ldpstream.dev.process import free_port

    proc = GatewayProcess(env, free_port(), str(tmp_path / "bridge.log"), command=("mqtt-bridge",))
    proc.wait_for(cid)
    return proc


def metric(port: int, name: str, *labels: str) -> float:
    from ldpstream.dev.mqtt_stack import read_metric

    return read_metric(f"http://127.0.0.1:{port}", name, *labels)


async def devices(url: str, cid: str, n_devices: int, per_device: int, *, seed: int, ca=None,
                  first: int = 0, on_batch=None):
    """``n_devices`` SDK devices over MQTT, each sending ``per_device`` reports in batches of 4
    (states from the retained config topic); returns the expected counts and the number sent."""
    from ldpstream.producers.ledger import Ledger
    from ldpstream.producers.mqtt_transport import MqttConfigWatcher, MqttTransport
    from ldpstream.producers.sdk import DeviceClient

    watcher = await MqttConfigWatcher(url, "phones", [cid], ca=ca).start(30)
    mech = watcher.mechanisms[cid]
    rng = np.random.default_rng(seed)
    labels = {a: np.asarray(DOM.categories(a)) for a in DOM.attrs}
    reports = []

    async def one(dev: int) -> None:
        client = DeviceClient(cid, watcher=watcher, ledger=Ledger(":memory:"),
                              transport=MqttTransport(url, "phones", ca=ca, timeout_s=60),
                              device_id=dev, batch_size=4, rng=np.random.default_rng(seed + dev))
        for _ in range(per_device):
            res = await client.report({a: str(rng.choice(labels[a])) for a in DOM.attrs})
            if res.report is not None:
                reports.append(res.report)
            if on_batch is not None and client.sent_batches:
                await on_batch(client.sent_batches)
        await client.close()

    await asyncio.gather(*(one(first + d) for d in range(n_devices)))
    await watcher.stop()
    return mech, np.stack(reports)


async def check_counts(redis_url: str, coll, mech, reports) -> None:
    from ldpstream.agents.app import make_store

    specs = coll.tensors()
    expected = mech.count(reports, specs)
    store = make_store(redis_url)
    try:
        got_n = await wait_for_n(store, coll.id, len(reports), timeout=90)
        await asyncio.sleep(1.5)  # nothing beyond
        assert await store.n(coll.id, 16) == len(reports), got_n
        got = await read_collection(store, coll)
        for s in specs:
            np.testing.assert_array_equal(got[s.key], expected[s.key], err_msg=s.key)
    finally:
        await store.close()


def keyed(cid: str, dev: int, version: int = 0) -> bytes:
    return encode_batch(cid, version, np.zeros((1, 2), np.int64),
                        device_ids=np.array([dev], np.uint64), key=(dev, 1))


def raw_publisher(svc, fleet: str) -> AsyncPublisher:
    ep = parse_mqtt_url(svc.url_for(FLEETS[fleet]))
    client = make_client(ep, f"raw-{fleet}", ca=None if svc.ca_path is None else str(svc.ca_path))
    connect(client, ep, persistent=False)
    return AsyncPublisher(client, asyncio.get_running_loop())


def wait_health(port: int, status: int, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                got, body = r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            got, body = exc.code, json.loads(exc.read())
        if got == status or time.monotonic() > deadline:
            assert got == status, body
            return body
        time.sleep(0.2)
