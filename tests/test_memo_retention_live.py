"""A memoized collection counts the devices active within its retention (docs/privacy-over-time.md,
"Memory"): a device silent longer than ``device_retention_s`` leaves the all-time counts and the
state, once, across a kill -9 of the worker; a device back after that is counted once again.
Real worker, broker and Redis; a short retention (5 s epochs), no clock injected."""
from __future__ import annotations

import asyncio
import json
import math
import re
import time

import numpy as np
import pytest
from conftest import write_config
from store_helpers import read_collection
from test_memo_devices_live import MEMOIZE, latest_table

pytestmark = [pytest.mark.pipeline, pytest.mark.slow]

OLD = np.arange(1, 201, dtype=np.uint64)           # silent after their first reports
NEW = np.arange(1001, 1101, dtype=np.uint64)       # report later
BACK = OLD[:20]                                    # silent, evicted, then back


def test_silent_devices_leave_all_time_once_across_kill9(tmp_path, kafka_broker, redis_server,
                                                          spawn_worker, unique_name):
    from aiokafka import AIOKafkaProducer

    from ldpstream.agents.app import make_store
    from ldpstream.agents.store import device_memo, keys
    from ldpstream.agents.store.layout import Layout
    from ldpstream.config import load_config
    from ldpstream.producers.codec import encode_batch

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, columns=("sex", "Salary"), partitions=2,
                        marginals=[("sex", "Salary")], estimators=("castell",),
                        refresh_interval_s=0.5,
                        extra={"params": {"memoize": MEMOIZE}, "bucket_s": 1,
                               "windows": ["2s", "all"], "device_retention_s": 5})
    coll = load_config(path).collections[cid]
    mech = coll.mechanism()
    span = device_memo.epoch_length(coll.policy)
    assert span == 5.0 and device_memo.retention_epochs(coll.device_retention(), coll.policy) == 1
    shape = coll.domain.shape
    rng = np.random.default_rng(3)

    def reports(n: int) -> np.ndarray:
        return np.stack([rng.integers(0, k, n) for k in shape], axis=1)

    async def send(pub: AIOKafkaProducer, ids: np.ndarray, reps: np.ndarray) -> None:
        futs = [await pub.send(coll.topic, encode_batch(cid, mech.version, reps[ids % 2 == p],
                                                        device_ids=ids[ids % 2 == p]),
                               partition=p) for p in (0, 1)]
        await asyncio.gather(*futs)

    async def counted(store, want: int) -> None:
        deadline = time.monotonic() + 60
        while await store.n(cid, 2) < want and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert await store.n(cid, 2) == want

    async def two_epochs_later(t: float) -> None:
        """Until the worker's epoch is two past the one of ``t`` (the old table then leaves
        the (previous, current) pair and its silent devices are beyond one epoch)."""
        await asyncio.sleep(max(0.0, (math.floor(t / span) + 2) * span - time.time()) + 0.3)

    old_reps, new_reps, back_reps, again_reps, back_again = reports(OLD.size), \
        reports(NEW.size), reports(BACK.size), reports(NEW.size), reports(BACK.size)
    worker = spawn_worker(path)
    worker.wait_ready(60)

    async def run() -> tuple[dict, dict, dict, list[bytes], str]:
        store = make_store(redis_server.url)
        pub = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
        await pub.start()
        try:
            await send(pub, OLD, old_reps)
            await counted(store, OLD.size)
            before = await read_collection(store, coll)
            await two_epochs_later(time.time())
            await send(pub, NEW, new_reps)
            await send(pub, BACK, back_reps)
            await counted(store, OLD.size + NEW.size + BACK.size)
            after = await read_collection(store, coll)
            metrics_text = worker.get("/metrics")
            worker.kill()   # SIGKILL: Redis holds the evictions, the counts and the logs together
            w2 = spawn_worker(path)
            w2.wait_ready(60)
            # the same devices again (evicted meanwhile if the restart took two epochs or not:
            # either way each counts once, at this report)
            await send(pub, NEW, again_reps)
            await send(pub, BACK, back_again)
            await counted(store, OLD.size + 2 * NEW.size + 2 * BACK.size)
            final = await read_collection(store, coll)
            layout = Layout.of(coll.version, coll.tensors()).id
            logs = [await store.redis.get(keys.side_key(cid, p, device_memo.side_name(e, layout)))
                    for p in (0, 1) for e in range(device_memo.epoch_of(time.time(), coll.policy)
                                                   - 6, device_memo.epoch_of(time.time(),
                                                                             coll.policy) + 1)]
            info = json.loads(w2.get(f"/collections/{cid}"))["over_time"]
            evicted2 = re.search(r'ldp_memo_devices_evicted_total\{collection="%s"\} (\S+)'
                                 % re.escape(cid), w2.get("/metrics"))
        finally:
            await pub.stop()
            await store.close()
        return before, after, final, logs, metrics_text + json.dumps(info), evicted2

    before, after, final, logs, text, evicted2 = asyncio.run(run())
    key = next(iter(before))
    np.testing.assert_array_equal(before[key], latest_table(OLD, old_reps, shape))
    back = latest_table(BACK, back_reps, shape)
    # the silent devices left all time; the ones back count once, at their new report
    np.testing.assert_array_equal(after[key], latest_table(NEW, new_reps, shape) + back)
    assert 'ldp_memo_devices_evicted_total{collection="%s"} 200.0' % cid in text
    # after the kill -9 the restarted worker subtracts nothing twice: the old devices' logs
    # were emptied with their eviction
    assert evicted2 is None or float(evicted2.group(1)) in (0.0, NEW.size + BACK.size), evicted2
    np.testing.assert_array_equal(final[key], latest_table(NEW, again_reps, shape)
                                  + latest_table(BACK, back_again, shape))
    held = [device_memo.parse_log(raw) for raw in logs if raw]
    ids = set().union(*(t.ids.tolist() for t in held))
    assert ids == set(NEW.tolist()) | set(BACK.tolist()), sorted(ids - set(NEW.tolist()))[:5]
    assert '"device_retention_s": 5.0' in text and "active within the last" in text
