"""What a device adopts from ``ldp.config`` (docs/security.md "Signed mechanism states"): a
default ceiling of ε = 8 per report (computed from the channel), identity channels never, a state
past its ``expires_at`` never (``expired``) and one without it never (``malformed``), and never an
older state than the newest it adopted, even after a restart (kept in the ledger). States are
written to a real broker by a plain Kafka producer, as any client with write access could."""
from __future__ import annotations

import asyncio
import base64
import json
import time

import numpy as np
import pytest

from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.producers.device import DEFAULT_MAX_EPSILON, ConfigWatcher
from ldpstream.producers.ledger import Ledger
from ldpstream.producers.sdk import DeviceClient, RecordingTransport
from ldpstream.producers.signing import ALG, DOMAIN, STATE_TTL_S, SigningKey, StateRejected

pytestmark = pytest.mark.pipeline

DOM = Domain.from_categories({"os": ["android", "ios", "other"], "plan": ["free", "pro"]})


def _state(epsilon_per_attr: float, version: int) -> dict:
    return RRIndependent(DOM, epsilon=epsilon_per_attr, version=version).state()


def _identity(version: int) -> dict:
    state = dict(_state(1.0, version))
    state["channels"] = [np.eye(len(np.asarray(c))).tolist() for c in state["channels"]]
    return state


def _without_expiry(key: SigningKey, state: dict, collection: str) -> bytes:
    """A validly signed payload of the old form (no ``expires_at``)."""
    payload = json.dumps(dict(state, collection=collection, issued_at=time.time()),
                         sort_keys=True, separators=(",", ":"))
    sig = key.key.sign(DOMAIN + payload.encode())
    return json.dumps({"alg": ALG, "key_id": key.verify_key.key_id, "payload": payload,
                       "signature": base64.b64encode(sig).decode()}).encode()


async def _topic(bootstrap: str, name: str, records: list[tuple[str, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    from ldpstream.kafka_admin import create_topics

    await create_topics(bootstrap, {name: 1}, compacted={name})
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for cid, value in records:
            await producer.send_and_wait(name, value, key=cid.encode())
    finally:
        await producer.stop()


def test_default_device_refuses_eps_12_identity_expired_and_unexpiring(kafka_broker, unique_name):
    """Finding 5: validly signed states a default device must not adopt: ε = 12 per report
    (6 per attribute), identity channels, expired, no expires_at. Before: the first two were
    adopted (the reports equalled the true records)."""
    key = SigningKey.generate()
    now = time.time()
    records = [("eps12", key.sign_state(_state(6.0, 1), "eps12")),
               ("ident", key.sign_state(_identity(1), "ident")),
               ("old", key.sign_state(_state(1.0, 1), "old", issued_at=now - 2 * STATE_TTL_S)),
               ("bare", _without_expiry(key, _state(1.0, 1), "bare")),
               ("fine", key.sign_state(_state(4.0, 1), "fine"))]    # ε = 8: at the ceiling
    topic = f"cfg-{unique_name}"

    async def run():
        await _topic(kafka_broker.bootstrap, topic, records)
        watcher = await ConfigWatcher(kafka_broker.bootstrap, topic=topic,
                                      verify_key=key.verify_key).start()
        try:
            assert sorted(watcher.states) == ["fine"]
            assert watcher.rejected == {"over_ceiling": 2, "expired": 1, "malformed": 1}
        finally:
            await watcher.stop()
        # a client refuses above its ceiling even when its watcher has none
        lax = await ConfigWatcher(kafka_broker.bootstrap, topic=topic, verify_key=key.verify_key,
                                  max_epsilon=None).start()
        try:
            assert sorted(lax.states) == ["eps12", "fine"]   # identity: refused by anyone
            client = DeviceClient("eps12", watcher=lax, ledger=Ledger(":memory:"),
                                  transport=RecordingTransport())
            with pytest.raises(StateRejected, match="over_ceiling"):
                await client.report({"os": "ios", "plan": "pro"})
            assert client.transport.reports().size == 0
            ok = DeviceClient("eps12", watcher=lax, ledger=Ledger(":memory:"),
                              transport=RecordingTransport(), max_epsilon=12.0)
            assert (await ok.report({"os": "ios", "plan": "pro"})).status == "queued"
        finally:
            await lax.stop()

    assert DEFAULT_MAX_EPSILON == 8.0
    asyncio.run(run())


def test_replayed_older_state_refused_after_a_restart(tmp_path, kafka_broker, unique_name):
    """Finding 4's replay: a device adopted version 5; after its restart a topic holding only a
    captured older version 3 (e.g. after broker log loss) is refused as replayed (the newest
    adopted state is in its ledger). A fresh device adopts the captured state only while it has
    not expired."""
    key = SigningKey.generate()
    now = time.time()
    new_topic, lost_topic = f"cfg-{unique_name}", f"cfg-lost-{unique_name}"
    v3 = key.sign_state(_state(1.0, 3), "c", issued_at=now - 60)
    v5 = key.sign_state(_state(1.0, 5), "c", issued_at=now - 30)
    ledger_path = tmp_path / "device.sqlite"

    async def watch(topic: str, ledger: Ledger, **kw) -> ConfigWatcher:
        return await ConfigWatcher(kafka_broker.bootstrap, topic=topic, verify_key=key.verify_key,
                                   floor=ledger, **kw).start()

    async def run():
        await _topic(kafka_broker.bootstrap, new_topic, [("c", v5)])
        await _topic(kafka_broker.bootstrap, lost_topic, [("c", v3)])
        with Ledger(ledger_path) as ledger:
            w = await watch(new_topic, ledger)
            assert w.states["c"].version == 5
            await w.stop()
        with Ledger(ledger_path) as ledger:      # the device restarted
            assert ledger.state_floor("c") == (5, pytest.approx(now - 30))
            w = await watch(lost_topic, ledger)
            assert "c" not in w.states and w.rejected == {"replayed": 1}
            await w.stop()
        with Ledger(":memory:") as fresh:        # a new device: the captured state until it expires
            w = await watch(lost_topic, fresh)
            assert w.states["c"].version == 3
            await w.stop()
            w = await watch(lost_topic, fresh, clock=lambda: now + 2 * STATE_TTL_S)
            assert w.rejected == {"expired": 1}
            await w.stop()

    asyncio.run(run())
