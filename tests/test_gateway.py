"""The HTTP ingest gateway: refusals (401 missing/wrong token, 403 token not allowed, 404 unknown
collection, 413 oversized, 415, 400 malformed with the reason) are JSON and produce nothing;
accepted batches are produced with stamped device ids, keyed per device; and end to end (gateway
and worker as child processes, real broker and Redis) the reports devices send through the SDK's
HTTP transport are counted exactly."""
from __future__ import annotations

import asyncio
import json
import urllib.request

import numpy as np
import pytest
import yaml
from conftest import wait_for_n
from gateway_helpers import GatewayProcess
from store_helpers import read_collection

from ldpstream.errors import CliError
from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.producers.codec import batch_to_json, decode_batch, encode_batch
from ldpstream.producers.gateway import Fleet, IngestGateway, authenticate, load_fleets, parse_fleets, serve, stamp
from ldpstream.producers.sdk import GatewayConfigWatcher, GatewayError, device_key

pytestmark = pytest.mark.pipeline

DOM = Domain.from_categories({"os": ["android", "ios", "other"], "plan": ["free", "pro"]})
TOKEN_A, TOKEN_B = "phones-token-0123456789", "sensors-token-0123456789"


def fleets_doc(cid: str) -> dict:
    return {"fleets": {"phones": {"token": TOKEN_A, "collections": [cid]},
                       "sensors": {"token": TOKEN_B, "collections": ["elsewhere"]}}}


def test_fleet_tokens_parsing_and_constant_time_lookup(tmp_path):
    fleets = parse_fleets(fleets_doc("c"), "t")
    assert fleets[0] == Fleet("phones", TOKEN_A, frozenset({"c"}))
    assert authenticate(fleets, f"Bearer {TOKEN_A}").name == "phones"
    assert authenticate(fleets, f"bearer {TOKEN_B}").name == "sensors"
    for bad in (None, "", "Bearer", f"Basic {TOKEN_A}", f"Bearer {TOKEN_A}x", "Bearer ünï"):
        assert authenticate(fleets, bad) is None
    star = parse_fleets({"fleets": {"all": {"token": TOKEN_A, "collections": "*"}}}, "t")
    assert star[0].allows("anything")
    with pytest.raises(CliError, match=r"t: fleets.x.token: must be a string of at least 16"):
        parse_fleets({"fleets": {"x": {"token": "short"}}}, "t")
    with pytest.raises(CliError, match="fleets.x.colour: unknown field"):
        parse_fleets({"fleets": {"x": {"token": TOKEN_A, "colour": 1}}}, "t")
    with pytest.raises(CliError, match="same token is given to two fleets"):
        parse_fleets({"fleets": {"x": {"token": TOKEN_A}, "y": {"token": TOKEN_A}}}, "t")
    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump(fleets_doc("c")))
    assert load_fleets(str(path), environ={}) == fleets
    assert load_fleets(None, environ={"LDP_GATEWAY_TOKENS": json.dumps(fleets_doc("c"))}) == fleets
    with pytest.raises(CliError, match="no fleet tokens"):
        load_fleets(None, environ={})
    ids = np.array([1, 2, 1], dtype=np.uint64)
    a, b = stamp("phones", ids), stamp("sensors", ids)
    assert a[0] == a[2] != a[1] and not np.any(a == b)  # per fleet, stable


async def _post(url: str, body: bytes, headers: dict) -> tuple[int, dict]:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        async with s.post(url, data=body, headers=headers) as r:
            return r.status, await r.json()


async def _topic_messages(bootstrap: str, topic: str) -> list:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic)
                                                        or await _parts(consumer, topic))]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        await consumer.seek_to_beginning(*tps)
        out = []
        while any([await consumer.position(tp) < ends[tp] for tp in tps]):
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                out.extend(msgs)
        return out
    finally:
        await consumer.stop()


async def _parts(consumer, topic):
    await consumer._client.force_metadata_update()  # noqa: SLF001
    return consumer.partitions_for_topic(topic)


def test_gateway_refusals_produce_nothing_then_a_batch_is_stamped(kafka_broker, unique_name):
    from ldpstream.dev.process import free_port
    from ldpstream.kafka_admin import create_topics
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.signing import load_signing_key

    cid, cfg = unique_name, f"cfg.{unique_name}"
    topic = f"ldp.reports.{cid}"
    mech = RRIndependent(DOM, epsilon=1.0, version=2)

    async def run():
        await create_topics(kafka_broker.bootstrap, {cfg: 1, topic: 3}, compacted={cfg})
        async with Publisher(kafka_broker.bootstrap) as pub:
            await pub.send_and_wait(cfg, load_signing_key().sign_state(mech.state(), cid),
                                    key=cid.encode())
        gw = IngestGateway(kafka_broker.bootstrap, parse_fleets(fleets_doc(cid), "t"),
                           max_body_bytes=4096, config_topic=cfg)
        port = free_port()
        runner = await serve(gw, "127.0.0.1", port)
        base = f"http://127.0.0.1:{port}"
        url = f"{base}/v1/collections/{cid}/reports"
        ok = {"Authorization": f"Bearer {TOKEN_A}", "Content-Type": "application/octet-stream"}
        good = encode_batch(cid, 2, [[1, 1], [2, 0]], device_ids=[7, 7])
        try:
            cases = [
                (url, good, {"Content-Type": "application/octet-stream"}, 401, "unauthorized"),
                (url, good, dict(ok, Authorization="Bearer wrong-token-0123456789"), 401,
                 "unauthorized"),
                (url, good, dict(ok, Authorization=f"Bearer {TOKEN_B}"), 403, "forbidden"),
                (f"{base}/v1/collections/nope/reports", good,
                 {**ok, "Authorization": f"Bearer {TOKEN_A}"}, 403, "forbidden"),
                (url, b"x" * 5000, ok, 413, "too_large"),
                (url, good[:-3], ok, 400, "truncated"),
                (url, b"GARBAGE!" * 4, ok, 400, "bad_magic"),
                (url, b"{", dict(ok, **{"Content-Type": "application/json"}), 400, "malformed"),
                (url, good, dict(ok, **{"Content-Type": "text/plain"}), 415,
                 "unsupported_media_type"),
                (url, encode_batch(cid, 1, [[1, 1]], device_ids=[7]), ok, 400,
                 "unknown_version"),
                (url, encode_batch(cid, 2, [[1, 2]], device_ids=[7]), ok, 400, "out_of_domain"),
                (url, encode_batch(cid, 2, [[1, 1, 0]], device_ids=[7]), ok, 400, "wrong_width"),
                (url, encode_batch("other", 2, [[1, 1]], device_ids=[7]), ok, 400,
                 "wrong_collection"),
                (url, encode_batch(cid, 2, [[1, 1]]), ok, 400, "no_device_id"),
            ]
            for u, body, headers, status, reason in cases:
                got, doc = await _post(u, body, headers)
                assert (got, doc.get("reason")) == (status, reason), (reason, doc)
                assert doc["error"], doc
            got, doc = await _post(url, good[:-3], ok)
            assert "n=2 width=2" in doc["error"]  # the codec's detail names the problem
            # an unknown collection for a fleet allowed everywhere: 404
            gw.fleets.append(Fleet("all", "all-token-0123456789", None))
            got, doc = await _post(f"{base}/v1/collections/nope/reports", good,
                                   dict(ok, Authorization="Bearer all-token-0123456789"))
            assert got == 404 and doc["reason"] == "unknown_collection"
            # chunked (no Content-Length) oversized body: 413 too
            async def chunks():
                for _ in range(10):
                    yield b"y" * 1000
            got, doc = await _post(url, chunks(), ok)
            assert got == 413 and doc["reason"] == "too_large"
            # routes and methods answer JSON too
            import aiohttp
            async with aiohttp.ClientSession() as s:
                async with s.get(f"{base}/nowhere") as r:
                    assert r.status == 404 and (await r.json())["reason"] == "http_404"
                async with s.get(url) as r:
                    assert r.status == 405 and (await r.json())["reason"] == "http_405"
                async with s.get(f"{base}/healthz") as r:
                    h = await r.json()
                    assert r.status == 200 and h["collections"] == {cid: [2]}
            assert await _topic_messages(kafka_broker.bootstrap, topic) == []  # nothing produced

            # the signed state, relayed unchanged and verified by a device that speaks only HTTP
            http = await GatewayConfigWatcher(base, TOKEN_A, [cid]).start()
            try:
                assert http.mechanisms[cid].version == 2 and http.running
                assert http.records[cid] == gw.watcher.records[cid]
            finally:
                await http.stop()
            for token, status in (("wrong-token-0123456789", 401), (TOKEN_B, 403)):
                with pytest.raises(GatewayError, match=str(status)):
                    await GatewayConfigWatcher(base, token, [cid]).start()

            # accepted: the binary form (two devices) and the JSON form (X-Device-Id header)
            two = encode_batch(cid, 2, [[1, 1], [2, 0], [0, 1]], device_ids=[7, 8, 7])
            got, doc = await _post(url, two, ok)
            assert got == 200 and doc == {"collection": cid, "version": 2, "accepted": 3,
                                          "messages": 2}
            js = batch_to_json(decode_batch(encode_batch(cid, 2, [[0, 0]])))
            got, doc = await _post(url, js.encode(), dict(ok, **{
                "Content-Type": "application/json", "X-Device-Id": "7"}))
            assert got == 200 and doc["accepted"] == 1
        finally:
            await runner.cleanup()
            await gw.stop()
        msgs = await _topic_messages(kafka_broker.bootstrap, topic)
        assert len(msgs) == 3
        s7, s8 = stamp("phones", np.array([7, 8], dtype=np.uint64))
        by_dev: dict[int, list] = {}
        for m in msgs:
            b = decode_batch(m.value)
            dev = int(b.device_ids[0])
            assert set(b.device_ids.tolist()) == {dev} and m.key == device_key(dev)
            by_dev.setdefault(dev, []).append((m.partition, b.reports.tolist()))
        assert sorted(by_dev) == sorted([int(s7), int(s8)])
        assert len({p for p, _ in by_dev[int(s7)]}) == 1  # one device, one partition
        assert sorted(r for _, rs in by_dev[int(s7)] for r in rs) == [[0, 0], [0, 1], [1, 1]]
        assert [r for _, rs in by_dev[int(s8)] for r in rs] == [[2, 0]]

    asyncio.run(run())


def test_requests_arriving_together_share_one_broker_check(kafka_broker):
    """The broker check before producing: when its cached answer has expired, the requests
    arriving together wait for one metadata check, not one connection each (counted by
    ``ldp_gateway_broker_checks_total``); the next expiry makes one more."""
    from ldpstream.producers.gateway import BROKER_CACHE_S, REGISTRY

    def checks() -> float:
        return REGISTRY.get_sample_value("ldp_gateway_broker_checks_total") or 0.0

    async def main() -> None:
        gw = IngestGateway(kafka_broker.bootstrap, parse_fleets(fleets_doc("c"), "t"))
        before = checks()
        answers = await asyncio.gather(*(gw.broker_ok() for _ in range(40)))
        assert all(ok for ok, _ in answers) and len(set(answers)) == 1, answers[:2]
        assert checks() - before == 1
        await gw.broker_ok()   # cached
        assert checks() - before == 1
        await asyncio.sleep(BROKER_CACHE_S + 0.1)
        await asyncio.gather(*(gw.broker_ok() for _ in range(40)))
        assert checks() - before == 2

    asyncio.run(main())


def test_reports_through_the_gateway_are_counted_exactly(tmp_path, kafka_broker, redis_server,
                                                         spawn_worker, service_env, unique_name):
    """SDK devices speaking only HTTP (memoized collection; mechanism states from the gateway,
    verified on the device) → HttpTransport → gateway → Kafka → worker → Redis:
    the counts equal the counts of each device's latest queued report (a memoized collection
    counts devices: docs/privacy-over-time.md); refused requests add nothing."""
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.dev.process import free_port
    from ldpstream.producers.ledger import Ledger
    from ldpstream.producers.sdk import DeviceClient, HttpTransport

    cid = unique_name
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"collections": [{
        "id": cid, "schema": {"attributes": {a: list(DOM.categories(a)) for a in DOM.attrs}},
        "mechanism": "rr-ind", "epsilon": 1.0, "partitions": 3, "marginals": [["os", "plan"]],
        "estimators": ["castell"], "refresh_interval_s": 2.0,
        "params": {"memoize": {"rotation_s": 3600, "instantaneous_epsilon": 2.0}}}]}))
    coll = load_config(path).collections[cid]
    worker = spawn_worker(str(path))
    worker.wait_ready(60)
    port = free_port()
    env = dict(service_env, LDP_GATEWAY_TOKENS=json.dumps(fleets_doc(cid)))
    gateway = GatewayProcess(env, port, str(tmp_path / "gateway.log"))
    try:
        gateway.wait_for(cid)

        async def run():
            # devices speak HTTP only: mechanism states come through the gateway too
            url = f"http://127.0.0.1:{port}"
            watcher = await GatewayConfigWatcher(url, TOKEN_A, [cid]).start()
            mech = watcher.mechanisms[cid]
            assert mech.memoize is not None and mech.instantaneous is not None
            specs = coll.tensors()
            expected = {s.key: np.zeros(s.shape, dtype=np.int64) for s in specs}
            rng = np.random.default_rng(4)
            labels = {a: np.asarray(DOM.categories(a)) for a in DOM.attrs}
            sent = 0
            for dev in range(40):  # 40 devices, 3 distinct records each, 5 reports each
                client = DeviceClient(cid, watcher=watcher, ledger=Ledger(":memory:"),
                                      transport=HttpTransport(url, TOKEN_A),
                                      device_id=dev, batch_size=4, rng=rng)
                recs = [{a: str(rng.choice(labels[a])) for a in DOM.attrs} for _ in range(3)]
                last = None
                for res in await client.report_many([recs[i % 3] for i in range(5)]):
                    if res.sent:
                        sent += 1
                        last = res.report
                if last is not None:  # memoized: each device counted once, at its latest report
                    for k, v in mech.count(last[None, :], specs).items():
                        expected[k] += v
                await client.close()
            refused = DeviceClient(cid, watcher=watcher, ledger=Ledger(":memory:"),
                                   transport=HttpTransport(url, TOKEN_B),
                                   batch_size=1)
            with pytest.raises(GatewayError, match="403.*not allowed"):
                await refused.report({"os": "ios", "plan": "pro"})
            await watcher.stop()
            store = make_store(redis_server.url)
            try:
                got_n = await wait_for_n(store, cid, sent, timeout=60)
                await asyncio.sleep(1.0)  # nothing beyond
                assert await store.n(cid, 16) == sent, got_n
                got = await read_collection(store, coll)
                for s in specs:
                    np.testing.assert_array_equal(got[s.key], expected[s.key], err_msg=s.key)
            finally:
                await store.close()
            return sent

        sent = asyncio.run(run())
        assert 80 <= sent <= 200  # duplicates within the period were not sent
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        line = next(l for l in text.splitlines()
                    if l.startswith("ldp_gateway_reports_total") and cid in l)
        assert float(line.rsplit(" ", 1)[1]) == sent
        info = json.loads(worker.get(f"/collections/{cid}"))["longitudinal"]
        assert info["memoized"] and info["epsilon_per_rotation"] == pytest.approx(2.0)
    finally:
        assert gateway.stop() == 0


def test_gateway_cli_refuses_to_start_without_tokens_or_key(monkeypatch, capsys):
    from ldpstream.cli import main

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.delenv("LDP_GATEWAY_TOKENS", raising=False)
    monkeypatch.delenv("LDP_GATEWAY_TOKENS_FILE", raising=False)
    assert main(["gateway"]) == 2
    assert "no fleet tokens" in capsys.readouterr().err
    monkeypatch.setenv("LDP_GATEWAY_TOKENS", json.dumps(fleets_doc("c")))
    monkeypatch.delenv("LDP_CONFIG_PUBLIC_KEY", raising=False)
    monkeypatch.delenv("LDP_CONFIG_PUBLIC_KEY_FILE", raising=False)
    assert main(["gateway"]) == 2
    assert "no public key pinned" in capsys.readouterr().err


def test_bench_gateway_quick_runs(monkeypatch):
    """``ldpstream bench gateway --quick`` on its own embedded broker: every request answered 200
    (the bench raises otherwise), both batch sizes measured. No timing is asserted."""
    from ldpstream.bench.gateway import run

    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    res = asyncio.run(run(quick=True))
    rows = res["results"]
    assert [(r["scheme"], r["connection"], r["reports_per_request"]) for r in rows] == [
        ("http", "kept", 1), ("http", "kept", 100), ("https", "kept", 1), ("https", "kept", 100),
        ("https", "new", 1), ("https", "new", 100)]
    assert all(r["requests"] == 300 and r["p99_s"] >= r["p50_s"] > 0 for r in rows)
    quiet = res["quiet"]  # publish -> counted through a worker (every probe counted, or it raises)
    assert quiet["probes"] == 5 and 0 < quiet["p50_s"] <= quiet["p99_s"] <= quiet["max_s"]
