"""Per-device quotas inside the exactly-once apply: honest devices are counted exactly, each
attacker device gets exactly its quota counted (the excess dead-lettered as over_quota), across a
kill -9 of the worker; the estimate moves by no more than the stated poisoning bound."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from conftest import write_config
from kafka_helpers import read_dlq
from store_helpers import read_collection

from ldpstream.agents.store.quota import split_by_quota
from ldpstream.estimators.kernels.poisoning import inverse_map, poisoning_bound

pytestmark = pytest.mark.pipeline

QUOTA = 40
ATTACKERS = 5
PER_ATTACKER = 600


def test_split_by_quota_in_order():
    ids = np.array([7, 7, 3, 7, 3, 9, 7], dtype=np.uint64)
    mask, taken = split_by_quota(ids, {7: 1, 9: 2}, 3)
    assert mask.tolist() == [True, True, True, False, True, True, False]
    assert taken == {7: 2, 3: 2, 9: 1}


def test_bound_is_attained_by_the_worst_attack():
    rng = np.random.default_rng(0)
    P = [np.array([[0.7, 0.3], [0.2, 0.8]]), np.full((3, 3), 0.2) + 0.4 * np.eye(3)]
    M = inverse_map(P)
    n, m = 1000, 50
    j = int(np.argmax(M.max(axis=1) - M.min(axis=1)))
    h = np.zeros(M.shape[1])
    h[np.argmin(M[j])] = 1.0   # honest reports where M_j is smallest
    a = np.zeros_like(h)
    a[np.argmax(M[j])] = m     # crafted reports where it is largest
    shift = abs((M @ ((n * h + a) / (n + m)) - M @ h)[j])
    assert shift == pytest.approx(poisoning_bound(P, n, m))
    for _ in range(200):  # and never exceeded
        h = rng.dirichlet(np.ones(M.shape[1]))
        a = rng.multinomial(m, rng.dirichlet(np.ones(M.shape[1]) * 0.1))
        assert np.abs(M @ ((n * h + a) / (n + m)) - M @ h).max() <= poisoning_bound(P, n, m) + 1e-12


def test_quota_breaking_devices_exact_counts_across_kill9(tmp_path, kafka_broker, redis_server,
                                                          spawn_worker, unique_name):
    import yaml

    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.producers.codec import decode_batch, encode_batch
    from ldpstream.producers.fleet import run_fleet
    from ldpstream.producers.publisher import Publisher

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, columns=("sex", "Salary"), partitions=2,
                        marginals=[("sex", "Salary")], estimators=("castell",))
    doc = yaml.safe_load(open(path))
    doc["collections"][0]["device_quota"] = {"reports": QUOTA, "window_s": 86400}
    yaml.safe_dump(doc, open(path, "w"))
    coll = load_config(path).collections[cid]
    mech = coll.mechanism()
    worker = spawn_worker(path)
    worker.wait_ready(60)
    crafted = np.array([[0, 1]])  # every crafted report says (Female, >50K)

    async def attack(pub: Publisher, rounds: range) -> None:
        for _r in rounds:  # 60 messages of 10 reports per attacker, each on its own partition
            for a in range(ATTACKERS):
                payload = encode_batch(cid, mech.version, np.repeat(crafted, 10, axis=0),
                                       device_ids=np.full(10, 10**9 + a, dtype=np.uint64))
                await pub.send(coll.topic, payload, partition=a % 2)
        await pub.flush()

    async def run() -> tuple[dict, dict]:
        store = make_store(redis_server.url)
        async with Publisher(kafka_broker.bootstrap) as pub:
            honest1 = await run_fleet(kafka_broker.bootstrap, coll, rate=0, total=10_000,
                                      batch=250, devices=2000, seed=1, keep_counts=True,
                                      mechanism=mech)
            await attack(pub, range(0, 30))
            deadline = time.monotonic() + 60
            while await store.n(cid, 2) <= 10_000 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)  # until some attacker reports are counted
            worker.kill()  # SIGKILL: whatever was pending is lost, Redis holds the truth
            honest2 = await run_fleet(kafka_broker.bootstrap, coll, rate=0, total=10_000,
                                      batch=250, devices=2000, seed=2, keep_counts=True,
                                      mechanism=mech)
            await attack(pub, range(30, PER_ATTACKER // 10))
            w2 = spawn_worker(path)
            w2.wait_ready(60)
            want = 20_000 + ATTACKERS * QUOTA
            deadline = time.monotonic() + 90
            while await store.n(cid, 2) < want and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.5)
            assert await store.n(cid, 2) == want, w2.log_tail()
            counts = await read_collection(store, coll)
        await store.close()
        honest = {k: honest1.counts[k] + honest2.counts[k] for k in honest1.counts}
        return honest, counts

    honest, counts = asyncio.run(run())
    key = next(iter(honest))
    attack_counts = counts[key] - honest[key]
    expected = np.zeros_like(attack_counts)
    expected[0, 1] = ATTACKERS * QUOTA
    np.testing.assert_array_equal(attack_counts, expected)  # honest counted exactly, attackers q each
    over = {(r["partition"], r["offset"]): r for r in read_dlq(kafka_broker.bootstrap, topic=coll.topic)
            if r["reason"] == "over_quota"}
    import base64
    excess = sum(decode_batch(base64.b64decode(r["payload_b64"])).n for r in over.values())
    assert excess == ATTACKERS * (PER_ATTACKER - QUOTA)  # distinct DLQ records (at-least-once)
    # the poisoning bound: the castell estimate moved by at most the stated amount
    attrs = ("sex", "Salary")
    n = int(sum(v.sum() for v in honest.values()) // len(honest))
    clean = mech.estimate(honest, attrs, "castell").factor.values
    poisoned = mech.estimate(counts, attrs, "castell").factor.values
    shift = float(np.abs(poisoned - clean).max())
    bound = poisoning_bound(mech.channels_of(attrs), n, ATTACKERS * QUOTA)
    assert 0 < shift <= bound + 1e-12, (shift, bound)
    unbounded = poisoning_bound(mech.channels_of(attrs), n, ATTACKERS * PER_ATTACKER)
    assert bound < 0.05 < unbounded, (bound, unbounded)
