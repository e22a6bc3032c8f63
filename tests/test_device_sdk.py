"""The device SDK against a real broker: ConfigWatcher.start() returns with the topic's state
read; DeviceClient validates labels, randomizes with the published mechanism, memoizes per
rotation period (1,000 identical reports → one sent per period), keeps its ε ledger and memoized
responses across a restart, refuses the report that would break its budget (saying why), samples
the composed channel, and produces batches keyed by the device id."""
from __future__ import annotations

import asyncio
import contextlib

import numpy as np
import pytest
from scipy.stats import chisquare
from tolerance import assert_close

from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.domain import Domain, SchemaError
from ldpstream.estimators.stream.longitudinal import Memoize
from ldpstream.producers.codec import decode_batch
from ldpstream.producers.device import ConfigWatcher
from ldpstream.producers.ledger import Budget, Ledger
from ldpstream.producers.sdk import DeviceClient, KafkaTransport, RecordingTransport, UnknownCollectionError, device_key

pytestmark = pytest.mark.pipeline

DOM = Domain.from_categories({"os": ["android", "ios", "other"], "plan": ["free", "pro"]})
REC = {"os": "ios", "plan": "pro"}


async def publish(bootstrap: str, topic: str, states: dict[str, RRIndependent]) -> None:
    """Publish signed mechanism states to a config topic the way the worker does (compacted,
    key = collection id)."""
    from ldpstream.kafka_admin import create_topics
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.signing import load_signing_key

    key = load_signing_key()  # the session's key (tests/conftest.py); devices pin its public key
    assert key is not None
    await create_topics(bootstrap, {topic: 1}, compacted={topic})
    async with Publisher(bootstrap) as pub:
        for cid, mech in states.items():
            await pub.send(topic, key.sign_state(mech.device_state(), cid), key=cid.encode())
        await pub.flush()


@contextlib.asynccontextmanager
async def watching(bootstrap: str, topic: str, states: dict[str, RRIndependent]):
    """Publish ``states`` to ``topic`` and yield a started ConfigWatcher on it."""
    await publish(bootstrap, topic, states)
    watcher = await ConfigWatcher(bootstrap, topic=topic, max_epsilon=None).start()
    try:
        yield watcher
    finally:
        await watcher.stop()


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_watcher_start_reads_the_current_state(kafka_broker, unique_name):
    topic = f"cfg.{unique_name}"
    states = {f"c{i}": RRIndependent(DOM, epsilon=1.0 + i, version=i) for i in range(3)}

    async def run():
        await publish(kafka_broker.bootstrap, topic, states)
        newer = {"c1": RRIndependent(DOM, epsilon=5.0, version=9)}
        async with watching(kafka_broker.bootstrap, topic, newer) as watcher:
            # no wait_for: start() has read up to the end offsets
            assert sorted(watcher.states) == ["c0", "c1", "c2"]
            assert [watcher.states[c].version for c in ("c0", "c1", "c2")] == [0, 9, 2]
            assert watcher.mechanisms["c1"].epsilon == pytest.approx(10.0)

    asyncio.run(run())


def test_memoized_device_sends_once_per_rotation_and_keeps_its_ledger(kafka_broker, unique_name,
                                                                       tmp_path):
    topic = f"cfg.{unique_name}"
    mech = RRIndependent(DOM, epsilon=1.0, version=4, memoize=Memoize(3600.0, (2.0, 2.0)))
    eps_perm = sum(ch.epsilon(P) for P in mech.permanent)
    path = tmp_path / "device.sqlite"

    async def run():
        clock = Clock(3600.0 * 1000 + 10)
        sent = RecordingTransport()
        async with watching(kafka_broker.bootstrap, topic, {"app": mech}) as watcher:
            client = DeviceClient("app", watcher=watcher, transport=sent,
                                  ledger=Ledger(path, budget=Budget(3 * eps_perm, 86400.0)),
                                  device_id=77, batch_size=10, clock=clock,
                                  rng=np.random.default_rng(1))
            results = []
            for _ in range(1000):  # the same record, 1,000 times within one rotation period
                results.append(await client.report(REC))
                clock.t += 1.0
            await client.flush()
            assert [r.status for r in results].count("queued") == 1
            assert all(r.status == "duplicate" and r.epsilon == 0 for r in results[1:])
            assert results[0].epsilon == pytest.approx(eps_perm) and results[0].version == 4
            assert sent.reports().shape == (1, 2) and sent.batches[0].version == 4
            np.testing.assert_array_equal(sent.batches[0].device_ids, [77])
            assert client.ledger.spent(clock.t, 86400.0) == pytest.approx(eps_perm)

            # a restart (new client, same ledger file): still a duplicate, nothing spent
            client.ledger.close()
            client = DeviceClient("app", watcher=watcher, transport=sent,
                                  ledger=Ledger(path, budget=Budget(3 * eps_perm, 86400.0)),
                                  device_id=77, batch_size=1, clock=clock,
                                  rng=np.random.default_rng(2))
            again = await client.report(REC)
            assert again.status == "duplicate" and again.epsilon == 0
            assert client.ledger.spent(clock.t, 86400.0) == pytest.approx(eps_perm)

            # a new value in the same period costs the permanent ε of the changed attribute only
            other = await client.report({"os": "ios", "plan": "free"})
            assert other.status == "queued"
            assert other.epsilon == pytest.approx(ch.epsilon(mech.permanent[1]))
            # back to the first value: already reported in this period
            back = await client.report(REC)
            assert back.status == "duplicate" and back.epsilon == 0
            # android is new (its permanent ε); then a new combination of memoized values: sent,
            # nothing spent
            mixed = await client.report({"os": "android", "plan": "pro"})
            assert mixed.status == "queued"
            assert mixed.epsilon == pytest.approx(ch.epsilon(mech.permanent[0]))
            combo = await client.report({"os": "android", "plan": "free"})
            assert combo.status == "queued" and combo.epsilon == 0

            # next rotation periods: a fresh permanent response each, until the budget says no
            clock.t += 3600.0
            r2 = await client.report(REC)
            assert r2.status == "queued" and r2.epsilon == pytest.approx(eps_perm)
            clock.t += 3600.0
            r3 = await client.report(REC)
            assert r3.status == "refused" and r3.epsilon == 0 and r3.report is None
            assert "budget exceeded" in r3.reason and "ε=" in r3.reason
            spent = client.ledger.spent(clock.t, 86400.0)
            assert spent == pytest.approx(2 * eps_perm + ch.epsilon(mech.permanent[1])
                                          + ch.epsilon(mech.permanent[0]))
            await client.close()
            assert sent.reports().shape == (5, 2)  # first, other, mixed, combo, next period
            client.ledger.close()
            # the restart keeps the refusal too
            with Ledger(path, budget=Budget(3 * eps_perm, 86400.0)) as led:
                assert led.refusal(eps_perm, clock.t) is not None

    asyncio.run(run())


def test_fresh_mechanism_charges_every_report_and_validates_labels(kafka_broker, unique_name,
                                                                  tmp_path):
    topic = f"cfg.{unique_name}"
    mech = RRIndependent(DOM, epsilon=0.5)

    async def run():
        async with watching(kafka_broker.bootstrap, topic, {"fresh": mech}) as watcher:
            sent = RecordingTransport()
            client = DeviceClient("fresh", watcher=watcher, transport=sent,
                                  ledger=Ledger(tmp_path / "l.sqlite", budget=Budget(3.2, 60.0)),
                                  batch_size=2, clock=Clock())
            res = await client.report_many([REC] * 4)
            assert [r.status for r in res] == ["queued"] * 3 + ["refused"]
            assert [r.epsilon for r in res[:3]] == [pytest.approx(1.0)] * 3
            with pytest.raises(SchemaError, match=r"unknown category 'mac' \(allowed: "
                                                  r"'android', 'ios', 'other'\)"):
                await client.report({"os": "mac", "plan": "pro"})
            with pytest.raises(SchemaError, match="unknown attribute 'colour'"):
                await client.report_many([REC, {**REC, "colour": "red"}])  # nothing queued
            await client.close()
            assert sent.reports().shape == (3, 2) and len(sent.batches) == 2
            nobody = DeviceClient("nope", watcher=watcher, transport=sent,
                                  ledger=Ledger(":memory:"))
            with pytest.raises(UnknownCollectionError, match="'nope' is not published.*fresh"):
                await nobody.report(REC)

    asyncio.run(run())


def test_device_reports_follow_the_composed_channel(kafka_broker, unique_name):
    """Privacy audit through the SDK: each rotation period draws a fresh permanent response and a
    fresh instantaneous one, so one device's reports over many periods are i.i.d. draws from the
    row of P @ Q of its value (χ² goodness of fit)."""
    topic = f"cfg.{unique_name}"
    mech = RRIndependent(DOM, epsilon=1.0, memoize=Memoize(60.0, (1.0, 1.0)))

    async def run():
        clock = Clock(0.0)
        sent = RecordingTransport()
        async with watching(kafka_broker.bootstrap, topic, {"audit": mech}) as watcher:
            client = DeviceClient("audit", watcher=watcher, transport=sent,
                                  ledger=Ledger(":memory:"), batch_size=500, clock=clock,
                                  rng=np.random.default_rng(9))
            n = 3000
            for _ in range(n):
                await client.report(REC)
                clock.t += 60.0
            await client.flush()
        reports = sent.reports()
        assert reports.shape == (n, 2)
        for j, u in enumerate(DOM.encode([REC])[0]):
            obs = np.bincount(reports[:, j], minlength=DOM.shape[j])
            assert chisquare(obs, n * mech.channels[j][u]).pvalue > 1e-4, (j, obs)

    asyncio.run(run())


def test_kafka_transport_keys_batches_by_device(kafka_broker, unique_name, tmp_path):
    from aiokafka import AIOKafkaConsumer

    from ldpstream.kafka_admin import create_topics
    from ldpstream.producers.publisher import Publisher

    topic = f"cfg.{unique_name}"
    cid = unique_name

    async def run():
        await create_topics(kafka_broker.bootstrap, {f"ldp.reports.{cid}": 3})
        states = {cid: RRIndependent(DOM, epsilon=1.0)}
        async with watching(kafka_broker.bootstrap, topic, states) as watcher:
            async with Publisher(kafka_broker.bootstrap) as pub:
                for dev in (5, 6):
                    client = DeviceClient(cid, watcher=watcher, transport=KafkaTransport(pub),
                                          ledger=Ledger(":memory:"), device_id=dev, batch_size=4)
                    await client.report_many([REC] * 10)
                    await client.close()
        consumer = AIOKafkaConsumer(f"ldp.reports.{cid}", bootstrap_servers=kafka_broker.bootstrap,
                                    auto_offset_reset="earliest", group_id=None)
        await consumer.start()
        try:
            msgs = []
            for _ in range(30):
                if len(msgs) >= 6:
                    break
                for batch in (await consumer.getmany(timeout_ms=1000)).values():
                    msgs.extend(batch)
        finally:
            await consumer.stop()
        parts = {}
        for m in msgs:
            b = decode_batch(m.value)
            dev = int(b.device_ids[0])
            assert m.key == device_key(dev) and set(b.device_ids.tolist()) == {dev}
            parts.setdefault(dev, set()).add(m.partition)
        assert sorted(parts) == [5, 6] and all(len(p) == 1 for p in parts.values())

    asyncio.run(run())


def test_docs_copy_paste_example_runs(tmp_path, spawn_worker, service_env, unique_name):
    """docs/devices.md: the schema and the device script, as printed (collection id renamed so
    runs do not share counts), against a worker: it prints one queued report then duplicates,
    and a second run only duplicates (the ledger file persisted)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "devices.md").read_text()
    config = re.search(r"```yaml\n(.*?)```", text, re.S).group(1).replace("app-usage", unique_name)
    script = re.search(r"```python\n(.*?)```", text, re.S).group(1).replace("app-usage",
                                                                             unique_name)
    (tmp_path / "telemetry.yaml").write_text(config)
    (tmp_path / "device.py").write_text(script)
    worker = spawn_worker(str(tmp_path / "telemetry.yaml"))
    worker.wait_ready(60)

    def run() -> list[str]:
        out = subprocess.run([sys.executable, "device.py"], cwd=tmp_path, env=service_env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return [line.strip() for line in out.stdout.splitlines()]

    dup = "duplicate 0.0 this record was already reported in this rotation period"
    assert run() == ["queued 3.0", dup, dup]
    assert run() == [dup, dup, dup]
    assert "It prints `queued 3.0`" in text and f"twice `{dup}`" in " ".join(text.split())


def test_client_never_uses_an_unsigned_or_forged_state(kafka_broker, unique_name):
    """The SDK randomizes only with states the watcher verified: an unsigned state (the old
    plain JSON) and a state signed by another key are refused, and the client says so."""
    import json

    from ldpstream.kafka_admin import create_topics
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.signing import SigningKey

    topic = f"cfg.{unique_name}"
    forged = RRIndependent(DOM, epsilon=12.0)  # nearly the true values

    async def run():
        await create_topics(kafka_broker.bootstrap, {topic: 1}, compacted={topic})
        async with Publisher(kafka_broker.bootstrap) as pub:
            await pub.send(topic, json.dumps(dict(forged.state(), collection="plain")).encode(),
                           key=b"plain")
            await pub.send(topic, SigningKey.generate().sign_state(forged.state(), "other"),
                           key=b"other")
            await pub.flush()
        async with watching(kafka_broker.bootstrap, topic, {}) as watcher:
            assert watcher.mechanisms == {} and sum(watcher.rejected.values()) == 2
            for cid in ("plain", "other"):
                client = DeviceClient(cid, watcher=watcher, transport=RecordingTransport(),
                                      ledger=Ledger(":memory:"))
                with pytest.raises(UnknownCollectionError, match="refused records"):
                    await client.report(REC)

    asyncio.run(run())


MEMO_YAML = "{rotation_s: 86400, instantaneous_epsilon: 2.0}"


def test_device_reports_estimate_exactly_as_simulate(kafka_broker, unique_name, tmp_path):
    """1,000 devices report through the SDK (each its record three times: one memoized report
    sent); the collection's estimate of their reports (count + estimate_versions, what the worker
    computes) equals ``simulate``'s estimation path on the same reports, with the mechanism
    ``simulate`` builds from ``--param memoize=...``; both state the same guarantee."""
    from ldpstream import cli
    from ldpstream.config import parse_config
    from ldpstream.simulate.driver import build, estimate_run, plan_from_args, run_of_reports

    topic = f"cfg.{unique_name}"
    schema = {"os": ["android", "ios", "other"], "plan": ["free", "pro"],
              "region": ["asia", "eu", "us"]}   # sorted, as simulate's CSV domain is
    coll = parse_config({"collections": [{
        "id": "memo", "schema": {"attributes": schema}, "epsilon": 1.0,
        "params": {"memoize": {"rotation_s": 86400, "instantaneous_epsilon": 2.0}},
        "marginals": [["os", "plan"]]}]}).collections["memo"].mechanism()
    rng = np.random.default_rng(12)
    n = 1000
    os_ = rng.choice(3, n, p=[0.5, 0.4, 0.1])
    plan = np.where(rng.random(n) < 0.6, (os_ == 1).astype(int), rng.choice(2, n))
    region = rng.choice(3, n, p=[0.2, 0.5, 0.3])
    rows = [{"os": schema["os"][a], "plan": schema["plan"][b], "region": schema["region"][c]}
            for a, b, c in zip(os_, plan, region)]
    csv = tmp_path / "devices.csv"
    csv.write_text("os,plan,region\n" + "".join(f"{r['os']},{r['plan']},{r['region']}\n"
                                                for r in rows))
    args = cli.build_parser().parse_args([
        "simulate", "--mechanism", "rr-ind", "--epsilon", "1", "--param", f"memoize={MEMO_YAML}",
        "--data", str(csv), "--columns", "os,plan,region", "--ways", "2,3"])
    sim = build(plan_from_args(args))
    assert sim.domain.attrs == coll.domain.attrs and sim.domain.shape == coll.domain.shape
    assert sim.guarantee() == coll.guarantee() and sim.memoize == coll.memoize
    for a, b in zip(sim.channels, coll.channels):
        np.testing.assert_array_equal(a, b)

    async def run() -> np.ndarray:
        sent = RecordingTransport()
        async with watching(kafka_broker.bootstrap, topic, {"memo": coll}) as watcher:
            for i, row in enumerate(rows):
                client = DeviceClient("memo", watcher=watcher, transport=sent,
                                      ledger=Ledger(":memory:"), device_id=i, batch_size=10,
                                      clock=Clock(), rng=np.random.default_rng([7, i]))
                statuses = [(await client.report(row)).status for _ in range(3)]
                assert statuses == ["queued", "duplicate", "duplicate"]
                await client.close()
                client.ledger.close()
        return sent.reports()

    reports = asyncio.run(run())
    assert reports.shape == (n, 3)
    marginals = [("os", "plan"), ("plan", "region"), ("os", "region"), ("os", "plan", "region")]
    simulated = run_of_reports(sim, reports, marginals)
    for attrs in marginals:
        counts = coll.count(reports, coll.tensors([attrs]))
        for method in ("castell", "truncated", "ibu", "hybrid"):
            worker = coll.estimate_versions({coll.version: counts}, attrs, method)
            offline = estimate_run(simulated, attrs, method, {"proper": False})
            assert_close(worker.factor.values, offline.factor.values, rel=1e-12)
            assert worker.epsilon == pytest.approx(offline.epsilon, rel=1e-12)
