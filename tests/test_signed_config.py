"""Signed mechanism states: a device adopts only states signed by the pinned key, never an older
(replayed) one and never one whose computed ε exceeds its ceiling. Forged states are written to a
real broker by a plain Kafka producer, as any device could."""
from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from conftest import over_both_brokers

from ldpstream.producers.device import ConfigWatcher, mechanism_from_state
from ldpstream.producers.signing import SigningKey, StateRejected, VerifyKey, keygen

pytestmark = pytest.mark.pipeline
kafka_broker = over_both_brokers()


def _mechanism(epsilon: float = 1.0, version: int = 3):
    from ldpstream.config import load_config

    coll = next(iter(load_config(None).collections.values()))
    from ldpstream.estimators.families.rr import RRIndependent

    return coll, RRIndependent(coll.domain, epsilon=epsilon, version=version)


def _identity_state(mech) -> dict:
    """The downgrade attack: the same state with identity channels (reports = true values)."""
    state = dict(mech.state())
    state["channels"] = [np.eye(len(np.asarray(c))).tolist() for c in state["channels"]]
    return state


def test_sign_open_roundtrip_and_each_forgery_refused(tmp_path):
    coll, mech = _mechanism()
    key = SigningKey.generate()
    pinned = VerifyKey.from_text(key.verify_key.to_text())
    value = key.sign_state(mech.state(), "adult", issued_at=100.0)
    signed = pinned.open(value, collection="adult", now=150.0)
    assert (signed.collection, signed.version, signed.issued_at) == ("adult", 3, 100.0)
    rebuilt = mechanism_from_state(signed, max_epsilon=mech.epsilon)
    assert rebuilt.epsilon == pytest.approx(mech.epsilon) and rebuilt.version == 3

    def reason(v: bytes, collection: str = "adult") -> str:
        with pytest.raises(StateRejected) as exc:
            pinned.open(v, collection=collection, now=150.0)
        return exc.value.reason

    plain = dict(_identity_state(mech), collection="adult")
    assert reason(json.dumps(plain).encode()) == "unsigned"
    assert reason(SigningKey.generate().sign_state(_identity_state(mech), "adult")) == "wrong_key"
    doc = json.loads(value)
    doc["payload"] = doc["payload"].replace('"version":3', '"version":4')
    assert reason(json.dumps(doc).encode()) == "bad_signature"
    assert reason(value, collection="other") == "wrong_collection"
    assert reason(b"\xff\x00") == "malformed"
    # a plain dict never reaches a mechanism
    with pytest.raises(StateRejected) as exc:
        mechanism_from_state(plain)  # type: ignore[arg-type]  # deliberately the wrong type
    assert exc.value.reason == "unsigned"
    # the identity channel costs ε = inf: refused by any finite ceiling even when validly signed
    ident = pinned.open(key.sign_state(_identity_state(mech), "adult"), collection="adult")
    with pytest.raises(StateRejected) as exc:
        mechanism_from_state(ident, max_epsilon=1e6)
    assert exc.value.reason == "over_ceiling"

    priv, pub = keygen(tmp_path)
    assert oct(priv.stat().st_mode & 0o777) == "0o600"
    assert SigningKey.from_text(priv.read_text()).verify_key.to_text() == pub.read_text().strip()
    with pytest.raises(FileExistsError):
        keygen(tmp_path)


def test_device_refuses_forged_replayed_and_over_ceiling_states(kafka_broker, unique_name):
    """On a real broker: the worker's key signs v3; then forged (unsigned identity channels at
    v3 and v9, another key, tampered), replayed (v2, v3 signed earlier), cross-collection and
    over-ceiling states arrive; the device keeps v3, then adopts the signed v4."""
    from aiokafka import AIOKafkaProducer

    from ldpstream.kafka_admin import create_topics

    topic = f"cfg-{unique_name}"
    coll, mech = _mechanism(epsilon=1.0, version=3)
    ceiling = mech.epsilon
    key = SigningKey.generate()
    t0 = time.time()

    async def run():
        await create_topics(kafka_broker.bootstrap, {topic: 1}, compacted={topic})
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
        await producer.start()
        watcher = None
        try:
            async def put(value: bytes, cid: str = "adult") -> None:
                await producer.send_and_wait(topic, value, key=cid.encode())

            await put(key.sign_state(mech.state(), "adult", issued_at=t0))
            watcher = await ConfigWatcher(kafka_broker.bootstrap, topic=topic,
                                          verify_key=key.verify_key,
                                          max_epsilon=ceiling).start()
            assert (await watcher.wait_for("adult", 20)).version == 3
            forged = _identity_state(mech)
            await put(json.dumps(dict(forged, collection="adult")).encode())
            await put(json.dumps(dict(forged, collection="adult", version=9)).encode())
            await put(SigningKey.generate().sign_state(dict(forged, version=9), "adult"))
            doc = json.loads(key.sign_state(mech.state(), "adult", issued_at=t0 + 1))
            doc["payload"] = doc["payload"].replace('"version":3', '"version":9')
            await put(json.dumps(doc).encode())
            _, old = _mechanism(epsilon=1.0, version=2)
            await put(key.sign_state(old.state(), "adult", issued_at=t0 + 2))
            await put(key.sign_state(mech.state(), "adult", issued_at=t0 - 60))
            await put(key.sign_state(dict(mech.state(), version=9), "other"), cid="adult")
            _, greedy = _mechanism(epsilon=4.0, version=9)
            await put(key.sign_state(greedy.state(), "adult", issued_at=t0 + 3))
            await put(key.sign_state(dict(forged, version=9), "adult", issued_at=t0 + 4))
            deadline = time.monotonic() + 20
            while sum(watcher.rejected.values()) < 9 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert watcher.rejected == {"unsigned": 2, "wrong_key": 1, "bad_signature": 1,
                                        "replayed": 2, "wrong_collection": 1,
                                        "over_ceiling": 2}, watcher.refusals
            assert watcher.states["adult"].version == 3
            in_force = watcher.mechanisms["adult"]
            assert in_force.version == 3 and in_force.epsilon == pytest.approx(ceiling)
            np.testing.assert_allclose(np.asarray(in_force.state()["channels"][0]),
                                       np.asarray(mech.state()["channels"][0]))
            _, v4 = _mechanism(epsilon=1.0, version=4)
            await put(key.sign_state(v4.state(), "adult", issued_at=t0 + 5))
            while watcher.states["adult"].version != 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert watcher.mechanisms["adult"].version == 4
        finally:
            if watcher is not None:
                await watcher.stop()
            await producer.stop()

    asyncio.run(run())


def test_device_without_pinned_key_adopts_nothing(kafka_broker, unique_name):
    from aiokafka import AIOKafkaProducer

    from ldpstream.kafka_admin import create_topics

    topic = f"cfg-{unique_name}"
    _, mech = _mechanism()
    key = SigningKey.generate()

    async def run():
        await create_topics(kafka_broker.bootstrap, {topic: 1}, compacted={topic})
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, key.sign_state(mech.state(), "adult"), key=b"adult")
        finally:
            await producer.stop()
        watcher = ConfigWatcher(kafka_broker.bootstrap, topic=topic)
        watcher.verify_key = None  # as on a device where LDP_CONFIG_PUBLIC_KEY is unset
        await watcher.start()
        try:
            assert await watcher.wait_for("adult", 3) is None
            assert watcher.rejected == {"no_public_key": 1}
            # the refusal names what to set
            summary = watcher.refusal_summary()
            assert summary.startswith("no_public_key ×1: no public key pinned: set "
                                      "LDP_CONFIG_PUBLIC_KEY"), summary
            assert "LDP_CONFIG_PUBLIC_KEY_FILE" in summary
        finally:
            await watcher.stop()

    asyncio.run(run())


def test_worker_counts_forged_config_records(tmp_path, kafka_broker, spawn_worker, unique_name):
    """The worker reads ldp.config like a device: a forged record shows in
    ldp_config_records_refused_total (the ConfigForgery alert's input)."""
    from aiokafka import AIOKafkaProducer
    from conftest import write_config

    path = write_config(tmp_path / "c.yaml", unique_name, partitions=1)
    worker = spawn_worker(path)
    worker.wait_ready(60)
    _, mech = _mechanism()

    async def forge():
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait("ldp.config", json.dumps(
                dict(_identity_state(mech), collection=unique_name)).encode(),
                key=unique_name.encode())
        finally:
            await producer.stop()

    asyncio.run(forge())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = next(l for l in worker.get("/metrics").splitlines()
                    if l.startswith('ldp_config_records_refused_total{reason="unsigned"}'))
        if float(line.rsplit(" ", 1)[1]) >= 1:
            break
        time.sleep(0.2)
    assert float(line.rsplit(" ", 1)[1]) >= 1, line
