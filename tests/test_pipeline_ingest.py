"""End to end ingest: fleet and device client → Tansu → `ldpstream worker` → Redis counts equal the
exact counts of the reports sent (real broker, real Redis, worker as a child process)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import wait_for_n, write_config
from store_helpers import read_collection

pytestmark = pytest.mark.pipeline


def test_fleet_and_device_reports_counted_exactly(tmp_path, kafka_broker, redis_target,
                                                  service_env, spawn_worker, unique_name):
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.producers.device import ConfigWatcher, Device, mechanism_from_state
    from ldpstream.producers.fleet import run_fleet
    from ldpstream.producers.publisher import Publisher

    cid = unique_name
    path = write_config(tmp_path / "c.yaml", cid, partitions=3, version=3,
                        columns=("sex", "race", "relationship", "Salary"))
    config = load_config(path)
    coll = config.collections[cid]
    worker = spawn_worker(path, env=dict(service_env, REDIS_URL=redis_target.url))
    worker.wait_ready(60)

    async def run():
        # devices read the mechanism state the worker published to ldp.config
        watcher = await ConfigWatcher(kafka_broker.bootstrap).start()
        state = await watcher.wait_for(cid, 20)
        await watcher.stop()
        assert state is not None and state.collection == cid and state.version == 3
        mech = mechanism_from_state(state)
        assert mech.version == 3

        stats = await run_fleet(kafka_broker.bootstrap, coll, rate=0, total=60_000, batch=500,
                                seed=11, keep_counts=True, devices=300)
        assert stats.sent_reports == 60_000 and stats.sent_messages == 120 and stats.version == 3

        # a few single devices, one report per message, then buffered batches of 7
        expected = {k: v.copy() for k, v in stats.counts.items()}
        specs = coll.tensors()
        rng = np.random.default_rng(5)
        recs = rng.integers(0, np.array(coll.domain.shape), size=(230, len(coll.domain)))
        async with Publisher(kafka_broker.bootstrap) as pub:
            for i, buf in enumerate((1, 7, 50)):
                dev = Device(cid, mech, pub, device_id=1000 + i, buffer_size=buf,
                             rng=np.random.default_rng(i))
                sent = await dev.observe(recs[i * 70:(i + 1) * 70 + (20 if i == 2 else 0)])
                await dev.flush()
                for k, v in mech.count(sent, specs).items():
                    expected[k] += v
        total = 60_000 + 70 + 70 + 90

        store = make_store(redis_target.url)
        got_n = await wait_for_n(store, cid, total, timeout=60)
        await asyncio.sleep(1.0)  # nothing beyond the total may arrive
        assert await store.n(cid, 16) == total, got_n
        got = await read_collection(store, coll)
        for spec in specs:
            np.testing.assert_array_equal(got[spec.key], expected[spec.key], err_msg=spec.key)
        offsets = await store.offsets(cid, 16)
        assert set(offsets) <= {0, 1, 2} and offsets
        await store.close()

    asyncio.run(run())
    metrics = worker.get("/metrics")
    line = next(l for l in metrics.splitlines()
                if l.startswith("ldp_reports_ingested_total") and f'collection="{cid}"' in l)
    assert float(line.rsplit(" ", 1)[1]) == 60_230
    assert worker.stop() == 0


def test_worker_decodes_with_the_codec_fast_path():
    """One definition of the wire layout: the worker's many-messages decode is the codec's
    (tests/test_codec.py checks it against decode_batch), not a second copy of the header."""
    from ldpstream.agents.ingest import intake
    from ldpstream.producers import codec

    assert intake.decode_uniform is codec.decode_uniform
    assert not any(hasattr(intake, name) for name in ("_HEAD0", "_HEAD1", "_VALUE_DTYPES"))


def test_fast_count_equals_mechanism_count():
    from ldpstream.agents.ingest.intake import count_reports
    from ldpstream.config import default_config_path, load_config

    # the rr-ind variant of the demo: one channel per attribute, every marginal counted
    coll = load_config(default_config_path().with_name("adult-fast.yaml")).collections["adult"]
    mech = coll.mechanism()
    rng = np.random.default_rng(2)
    reports = mech.randomize(rng.integers(0, np.array(coll.domain.shape), (5000, 8)), rng)
    specs = mech.tensors(coll.marginals + [("Salary",), ("workclass", "education", "occupation")])
    want = mech.count(reports, specs)
    # every dtype a batch may arrive in (the cell index is built in uint16 here)
    for dtype in (np.uint8, np.uint16, np.int32, np.int64):
        got = count_reports(mech, reports.astype(dtype), specs)
        assert want.keys() == got.keys()
        for k in want:
            assert got[k].dtype == np.int64
            np.testing.assert_array_equal(got[k], want[k])


def test_fast_count_of_a_tensor_past_uint16():
    """A tensor of more than 65,536 cells: the cell index is built in uint32."""
    from ldpstream.agents.ingest.intake import count_reports
    from ldpstream.estimators.families.rr import RRIndependent
    from ldpstream.estimators.kernels.domain import Domain

    dom = Domain(("a", "b", "c"), (300, 300, 3))
    mech = RRIndependent(dom, epsilon=1.0)
    rng = np.random.default_rng(3)
    reports = mech.randomize(rng.integers(0, np.array(dom.shape), (20_000, 3)), rng)
    specs = mech.tensors([("a", "b", "c")])
    assert specs[0].size > 1 << 16
    want, got = mech.count(reports, specs), count_reports(mech, reports, specs)
    np.testing.assert_array_equal(got[specs[0].key], want[specs[0].key])
