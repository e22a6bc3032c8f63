"""Idempotent batches (agents/store/dedupe.py, docs/security.md "Idempotent batches"): a keyed batch
(sender, sequence) is counted once per partition however often it arrives: produced twice
straight to Kafka, with a worker kill between the two deliveries, and retried through the HTTP
gateway after an answer the device never saw; the SDK keys every batch and persists its sequence
in the ledger."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import wait_for_n, write_config
from kafka_helpers import read_dlq

from ldpstream.agents.store.dedupe import DUPLICATE, NEW, STALE, DedupeBook, admit
from ldpstream.producers.ledger import Ledger

pytestmark = pytest.mark.pipeline


def test_admit_remembers_the_64_sequences_below_the_highest():
    verdict, st = admit(None, 10)
    assert verdict == NEW and st == (10, 0)
    for seq, want in ((10, DUPLICATE), (12, NEW), (11, NEW), (11, DUPLICATE), (12, DUPLICATE),
                      (9, NEW), (9, DUPLICATE), (12 - 64, NEW), (12 - 65, STALE)):
        verdict, after = admit(st, seq)
        assert verdict == want, (seq, st)
        st = after
    verdict, st = admit(st, 1000)       # a jump beyond the bitmap forgets what is below
    assert verdict == NEW and st == (1000, 0)
    assert admit(st, 999)[0] == NEW and admit(st, 1000 - 65)[0] == STALE
    verdict, st = admit((5, 0), 69)    # exactly 64 up: the old highest is the top bit
    assert st == (69, 1 << 63) and admit(st, 5)[0] == DUPLICATE


def test_book_reads_the_previous_window_and_records_what_is_pending():
    book = DedupeBook(epoch=1)
    assert not book.windows
    book.load(6, {b"42": b"5:0"})
    book.load(7, {})
    pending: dict = {}
    assert book.decide(7, 42, 5, pending) == DUPLICATE    # seen the window before
    assert book.decide(7, 42, 6, pending) == NEW
    assert pending == {7: {42: "6:1"}} and book.decide(7, 42, 6, pending) == DUPLICATE
    book.load(9, {})
    assert sorted(book.windows) == [9]  # below 8: forgotten


def test_ledger_keeps_the_sequence_across_restarts(tmp_path):
    path = tmp_path / "device.db"
    with Ledger(path) as led:
        assert [led.next_sequence(7) for _ in range(3)] == [0, 1, 2]
        assert led.next_sequence(8) == 0
    with Ledger(path) as led:
        assert led.next_sequence(7) == 3


def _collection(tmp_path, cid: str, spawn_worker):
    from ldpstream.config import load_config

    path = write_config(tmp_path / "c.yaml", cid, columns=("sex", "Salary"), partitions=2,
                        marginals=[("sex", "Salary")])
    worker = spawn_worker(path)
    worker.wait_ready(60)
    return path, load_config(path).collections[cid], worker


def _batch(coll, sender: int, seq: int, n: int = 10) -> bytes:
    from ldpstream.producers.codec import encode_batch

    rep = np.stack([np.arange(n) % 2, (np.arange(n) // 2) % 2], axis=1)
    return encode_batch(coll.id, coll.version, rep, device_ids=np.full(n, sender, np.uint64),
                        key=(sender, seq))


def test_same_batch_twice_through_kafka_across_a_worker_kill(tmp_path, kafka_broker,
                                                            redis_server, spawn_worker,
                                                            unique_name):
    """Batches (s, 0..9) produced twice each, then (s, 5) once more after a SIGKILL of the
    worker, (s, 10) new, (s, 200) new and (s, 100) far below it: 12 batches counted, the
    duplicates seen as such, (s, 100) dead-lettered as stale_sequence."""
    from ldpstream.agents.app import make_store
    from ldpstream.producers.publisher import Publisher
    from ldpstream.producers.sdk import device_key

    path, coll, worker = _collection(tmp_path, unique_name, spawn_worker)

    async def run() -> tuple[int, int]:
        store = make_store(redis_server.url)
        try:
            async with Publisher(kafka_broker.bootstrap) as pub:
                for seq in range(10):
                    for _ in range(2):
                        await pub.send(coll.topic, _batch(coll, 77, seq), key=device_key(77))
                await pub.flush()
                assert await wait_for_n(store, coll.id, 100, 60) == 100
                await asyncio.sleep(1.0)
                metrics = worker.get("/metrics")
                worker.kill()
                await pub.send(coll.topic, _batch(coll, 77, 5), key=device_key(77))
                for seq in (10, 200, 100):
                    await pub.send(coll.topic, _batch(coll, 77, seq), key=device_key(77))
                await pub.flush()
            w2 = spawn_worker(path)
            w2.wait_ready(60)
            got = await wait_for_n(store, coll.id, 120, 60)
            await asyncio.sleep(1.5)  # nothing beyond
            return got, await store.n(coll.id, 2), metrics
        finally:
            await store.close()

    got, n, metrics = asyncio.run(run())
    assert got == n == 120
    assert [r["reason"] for r in read_dlq(kafka_broker.bootstrap, topic=coll.topic)] == \
        ["stale_sequence"]
    line = next(l for l in metrics.splitlines()
                if l.startswith("ldp_duplicate_batches_total") and coll.id in l)
    assert float(line.split()[-1]) == 10


class _LostAnswers:
    """A transport whose first ``lose`` sends reach the gateway but whose answers are lost (the
    device sees an error), like a timeout after the gateway produced the batch."""

    def __init__(self, inner, lose: int) -> None:
        self.inner, self.lose = inner, lose

    async def send(self, collection: str, batch: bytes, device_id: int) -> None:
        await self.inner.send(collection, batch, device_id)
        if self.lose > 0:
            self.lose -= 1
            raise TimeoutError("answer lost")

    async def flush(self) -> None:
        await self.inner.flush()

    async def close(self) -> None:
        await self.inner.close()


def test_retried_gateway_batch_is_counted_once(tmp_path, kafka_broker, redis_server,
                                               spawn_worker, unique_name):
    """Through the HTTP gateway: the same keyed body posted three times is answered 200 each time
    and counted once; an SDK device whose first two sends lose their answer retries the same
    batch, and each of its reports is counted once."""
    import aiohttp

    from ldpstream.agents.app import make_store
    from ldpstream.dev.process import free_port
    from ldpstream.producers.device import ConfigWatcher
    from ldpstream.producers.gateway import IngestGateway, parse_fleets, serve
    from ldpstream.producers.sdk import DeviceClient, HttpTransport

    _, coll, worker = _collection(tmp_path, unique_name, spawn_worker)
    token = "idempotent-token-0123456789"
    fleets = parse_fleets({"fleets": {"f": {"token": token, "collections": [coll.id]}}}, "t")

    async def run() -> int:
        gw = await IngestGateway(kafka_broker.bootstrap, fleets).start()
        port = free_port()
        runner = await serve(gw, "127.0.0.1", port)
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}
        store = make_store(redis_server.url)
        watcher = await ConfigWatcher(kafka_broker.bootstrap, collections=[coll.id]).start()
        try:
            async with aiohttp.ClientSession() as s:
                for _ in range(3):
                    async with s.post(f"{url}/v1/collections/{coll.id}/reports",
                                      data=_batch(coll, 5, 0), headers=headers) as r:
                        assert r.status == 200, await r.text()
                        assert (await r.json())["accepted"] == 10
            client = DeviceClient(coll.id, watcher=watcher, ledger=Ledger(":memory:"),
                                  transport=_LostAnswers(HttpTransport(url, token), 2),
                                  device_id=9, batch_size=4)
            recs = [{"sex": "Male", "Salary": "<=50K"}] * 4
            for attempt in range(3):
                try:
                    if attempt == 0:
                        await client.report_many(recs)
                    else:
                        await client.flush()
                    break
                except TimeoutError:
                    continue
            assert client.sent_batches == 1 and client.sent_reports == 4
            await client.close()
            got = await wait_for_n(store, coll.id, 14, 60)
            await asyncio.sleep(1.5)  # nothing beyond
            assert await store.n(coll.id, 2) == 14, got
            return got
        finally:
            await watcher.stop()
            await store.close()
            await runner.cleanup()
            await gw.stop()

    asyncio.run(run())
    assert worker.proc.poll() is None, worker.log_tail()
