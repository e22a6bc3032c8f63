"""Per-device identity on the real broker and Redis (docs/security.md "Per-device identity"):
what one stolen device credential (its key, its fleet's gateway token) can do to other devices.
A forged batch key no longer silences a device (before: one batch with the victim's sender and a
huge sequence sent all its later batches to the DLQ as ``stale_sequence``), and a fleet cannot
take another fleet's share of a memoized collection's device state (before: one request with
2,500 invented ids locked out every new device of another fleet)."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from conftest import wait_for_n, write_config
from kafka_helpers import read_dlq

from ldpstream.credentials.device_keys import derive_device_key, server_id
from ldpstream.producers.ledger import Ledger

pytestmark = pytest.mark.pipeline

SECRETS = {"phones": "11" * 32, "sensors": "22" * 32}
TOKENS = {"phones": "phones-token-0123456789", "sensors": "sensors-token-0123456789"}
VICTIM, ATTACKER = 5, 666


def _env(service_env: dict) -> dict:
    return {**service_env, "LDP_DEVICE_SECRETS": json.dumps(
        {"fleets": {f: {"secret": s} for f, s in SECRETS.items()}})}


def _worker(tmp_path, cid: str, spawn_worker, service_env: dict, partitions: int,
            extra: dict | None = None):
    """A worker with the fleets' secrets for a (sex, Salary) collection; (collection, worker)."""
    from ldpstream.config import load_config

    path = write_config(tmp_path / "c.yaml", cid, columns=("sex", "Salary"),
                        partitions=partitions, marginals=[("sex", "Salary")], extra=extra)
    worker = spawn_worker(path, env=_env(service_env))
    worker.wait_ready(60)
    return load_config(path).collections[cid], worker


def _key(fleet: str, device: int) -> bytes:
    return derive_device_key(bytes.fromhex(SECRETS[fleet]), fleet, device)


def _rows(n: int) -> np.ndarray:
    return np.stack([np.arange(n) % 2, (np.arange(n) // 2) % 2], axis=1)


def _gateway_fleets(collection: str):
    from ldpstream.producers.gateway import parse_fleets

    return parse_fleets({"fleets": {f: {"token": t, "collections": [collection]}
                                    for f, t in TOKENS.items()}}, "t")


async def _post(session, url: str, fleet: str, body: bytes) -> int:
    async with session.post(url, data=body, headers={
            "Authorization": f"Bearer {TOKENS[fleet]}",
            "Content-Type": "application/octet-stream"}) as r:
        await r.read()
        return r.status


def test_forged_batch_keys_cannot_silence_a_device(tmp_path, kafka_broker, redis_server,
                                                   spawn_worker, service_env, unique_name):
    """The attacker holds device 666 of fleet phones (its key and the fleet's gateway token).
    Straight to Kafka and through the gateway it sends batches claiming the victim's sender with
    sequences 2^64-1, 2^63-1 and victim+1000: unsigned, signed with its own key, or signed as
    itself with the victim's device ids. Then the victim's SDK sends 200 reports in 20 batches
    through the gateway: all 200 are counted, every forgery is in ldp.dlq with its reason."""
    import aiohttp

    from ldpstream.agents.app import make_store
    from ldpstream.credentials.device_keys import DeviceCredential
    from ldpstream.dev.process import free_port
    from ldpstream.producers.codec import encode_batch
    from ldpstream.producers.device import ConfigWatcher
    from ldpstream.producers.gateway import IngestGateway, serve
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.sdk import DeviceClient, HttpTransport, device_key

    cid = unique_name
    coll, worker = _worker(tmp_path, cid, spawn_worker, service_env, 1)
    own = _key("phones", ATTACKER)
    forged = []
    for seq in (2**64 - 1, 2**63 - 1, 1000):
        ids = np.full(10, VICTIM, np.uint64)
        forged += [
            (encode_batch(cid, coll.version, _rows(10), device_ids=ids, key=(VICTIM, seq)),
             "unauthenticated"),
            (encode_batch(cid, coll.version, _rows(10), device_ids=ids,
                          key=(server_id("phones", VICTIM), seq)), "unauthenticated"),
            (encode_batch(cid, coll.version, _rows(10), device_ids=ids, key=(VICTIM, seq),
                          auth=("phones", own)), "bad_mac"),
            (encode_batch(cid, coll.version, _rows(10), device_ids=ids, key=(ATTACKER, seq),
                          auth=("phones", own)), "sender_mismatch"),
        ]

    async def run() -> tuple[int, list[int]]:
        gw = await IngestGateway(kafka_broker.bootstrap, _gateway_fleets(cid)).start()
        port = free_port()
        runner = await serve(gw, "127.0.0.1", port)
        url = f"http://127.0.0.1:{port}"
        store = make_store(redis_server.url)
        watcher = await ConfigWatcher(kafka_broker.bootstrap, collections=[cid]).start()
        statuses = []
        try:
            async with Publisher(kafka_broker.bootstrap) as pub:
                for body, _ in forged:
                    await pub.send(coll.topic, body, key=device_key(server_id("phones", VICTIM)))
                await pub.flush()
            async with aiohttp.ClientSession() as s:
                for body, _ in forged:   # the same through the gateway, with the fleet's token
                    statuses.append(await _post(s, f"{url}/v1/collections/{cid}/reports",
                                                "phones", body))
            cred = DeviceCredential("phones", VICTIM, _key("phones", VICTIM))
            client = DeviceClient(cid, watcher=watcher, ledger=Ledger(":memory:"),
                                  transport=HttpTransport(url, TOKENS["phones"]),
                                  credential=cred, batch_size=10)
            await client.report_many([{"sex": "Male", "Salary": "<=50K"}] * 200)
            await client.close()
            assert client.sent_batches == 20
            await wait_for_n(store, cid, 200, 60)
            await asyncio.sleep(2.0)   # nothing beyond
            return await store.n(cid, 1), statuses
        finally:
            await watcher.stop()
            await store.close()
            await runner.cleanup()
            await gw.stop()

    n, statuses = asyncio.run(run())
    assert n == 200
    assert statuses == [200] * len(forged)   # relayed: the gateway holds no secrets
    reasons = sorted(r["reason"] for r in read_dlq(kafka_broker.bootstrap, topic=coll.topic))
    assert reasons == sorted([why for _, why in forged] * 2)
    metrics = worker.get("/metrics")
    assert f'ldp_device_batches_total{{collection="{cid}",fleet="phones"}} 20.0' in metrics
    assert f'ldp_reports_rejected_total{{collection="{cid}",reason="bad_mac"}} 60.0' in metrics
    assert worker.proc.poll() is None, worker.log_tail()


def test_one_fleet_cannot_take_another_fleets_device_state(tmp_path, kafka_broker, redis_server,
                                                           spawn_worker, service_env,
                                                           unique_name):
    """A memoized collection with device_state_max 1,000, fleets phones and sensors (equal
    shares, 500 each). With the phones token alone, one gateway request of 2,500 invented ids
    takes no state (unauthenticated: refused at the gateway that requires device MACs, and
    dead-lettered by the worker when sent straight to Kafka). Even with the phones fleet's
    secret (every device key), 600 new devices get 500 entries. Then 100 new devices of sensors
    are all admitted and counted."""
    import aiohttp

    from ldpstream.agents.app import make_store
    from ldpstream.dev.process import free_port
    from ldpstream.producers.codec import encode_batch
    from ldpstream.producers.gateway import IngestGateway, serve
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.sdk import device_key

    cid = unique_name
    coll, worker = _worker(tmp_path, cid, spawn_worker, service_env, 1,
                           {"params": {"memoize": {"rotation_s": 86400}},
                            "device_state_max": 1000})
    invented = np.arange(10**6, 10**6 + 2500, dtype=np.uint64)
    flood = encode_batch(cid, coll.version, _rows(2500), device_ids=invented)

    def one(fleet: str, dev: int) -> bytes:
        return encode_batch(cid, coll.version, _rows(1), device_ids=np.full(1, dev, np.uint64),
                            key=(dev, 0), auth=(fleet, _key(fleet, dev)))

    async def run() -> tuple[int, int, int]:
        gw = await IngestGateway(kafka_broker.bootstrap, _gateway_fleets(cid),
                                 require_device_auth=True).start()
        port = free_port()
        runner = await serve(gw, "127.0.0.1", port)
        store = make_store(redis_server.url)
        try:
            async with aiohttp.ClientSession() as s:
                status = await _post(s, f"http://127.0.0.1:{port}/v1/collections/{cid}/reports",
                                     "phones", flood)
            async with Publisher(kafka_broker.bootstrap) as pub:
                await pub.send(coll.topic, flood, key=device_key(1))
                for dev in range(600):
                    await pub.send(coll.topic, one("phones", 10**7 + dev), key=device_key(dev))
                await pub.flush()
                await wait_for_n(store, cid, 500, 60)
                for dev in range(100):
                    await pub.send(coll.topic, one("sensors", 2 * 10**7 + dev),
                                   key=device_key(dev))
                await pub.flush()
            got = await wait_for_n(store, cid, 600, 60)
            await asyncio.sleep(2.0)
            return status, got, await store.n(cid, 1)
        finally:
            await store.close()
            await runner.cleanup()
            await gw.stop()

    status, _, n = asyncio.run(run())
    assert status == 401
    assert n == 600      # 500 phones (its share) + all 100 sensors
    dlq = read_dlq(kafka_broker.bootstrap, topic=coll.topic)
    assert sorted({r["reason"] for r in dlq}) == ["device_state_full", "unauthenticated"]
    assert sum(r["reason"] == "device_state_full" for r in dlq) == 100
    assert all("fleet 'phones'" in r["detail"] for r in dlq if r["reason"] == "device_state_full")
    assert worker.proc.poll() is None, worker.log_tail()


def test_the_simulated_fleet_signs_each_device(tmp_path, kafka_broker, redis_server,
                                               spawn_worker, service_env, unique_name):
    """The simulated fleet as a trusted aggregator (``ldpstream fleet --device-fleet``): it holds
    the fleet's secret and sends each device's reports as that device's authenticated batch; a
    worker with the secrets counts all 3,000 and dead-letters nothing."""
    from ldpstream.agents.app import make_store
    from ldpstream.credentials.device_keys import DeviceSigner, parse_fleet_secrets
    from ldpstream.producers.fleet import run_fleet

    cid = unique_name
    coll, worker = _worker(tmp_path, cid, spawn_worker, service_env, 2)
    fleets = parse_fleet_secrets({"fleets": {f: {"secret": s} for f, s in SECRETS.items()}}, "t")

    async def run() -> int:
        stats = await run_fleet(kafka_broker.bootstrap, coll, devices=200, rate=0, total=3000,
                                seed=4, signer=DeviceSigner(fleets, "sensors"))
        assert stats.sent_reports == 3000
        store = make_store(redis_server.url)
        try:
            await wait_for_n(store, cid, 3000, 60)
            await asyncio.sleep(1.5)
            return await store.n(cid, 2)
        finally:
            await store.close()

    assert asyncio.run(run()) == 3000
    assert read_dlq(kafka_broker.bootstrap, topic=coll.topic) == []
    assert f'ldp_device_batches_total{{collection="{cid}",fleet="sensors"}}' in worker.get("/metrics")
