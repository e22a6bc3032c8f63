"""The adaptive controller on a real Redis: counts stored per version, one worker decides under the
lease (compare-and-set on the version), every worker follows, the new version is published one
interval after it was stored, and the decision equals the mechanism's adaptive step on the same
counts (what ``simulate`` computes)."""
import asyncio
import json

import numpy as np
import pytest

from ldpstream.agents.app import make_store
from ldpstream.agents.context import Context
from ldpstream.agents.control.controller import STATE, Controller
from ldpstream.agents.metrics import REGISTRY
from ldpstream.agents.store import keys
from ldpstream.agents.store.apply_delta import PartitionDelta
from ldpstream.config import parse_config
from ldpstream.producers.codec import decode_batch, encode_batch, explain_batch

pytestmark = pytest.mark.pipeline

ATTRS = {"a": ["x", "y", "z"], "b": ["x", "y", "z"], "c": ["x", "y", "z"]}


def _config(cid, mechanism, params, marginals, estimators, interval=1.0):
    return parse_config({"collections": [{
        "id": cid, "schema": {"attributes": ATTRS}, "mechanism": mechanism, "params": params,
        "epsilon": 1.0, "epsilon_scope": "record", "partitions": 2, "marginals": marginals,
        "estimators": estimators, "controller_interval_s": interval}]}, env={})


def _records(n, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 3, n)
    b = np.where(rng.random(n) < 0.8, a, rng.integers(0, 3, n))
    return np.stack([a, b, rng.integers(0, 3, n)], axis=1)


class Worker:
    """One worker's context and controller (its publish function records what it published)."""

    def __init__(self, cfg, url):
        self.ctx = Context(cfg, url, "", make_store(url))
        self.published: list[int] = []
        cid = next(iter(cfg.collections))

        async def publish():
            self.published.append(self.ctx.collections[cid].current.version)
        self.ctl = Controller(self.ctx, publish)

    async def count(self, cid, reports, partition, offsets):
        """Count ``reports`` (stamped with the version in force) as the ingest does."""
        mech = self.ctx.collections[cid].current
        layout = self.ctx.collections[cid].layout(mech.version)
        flat = layout.pack(mech.count(reports, list(layout.specs)), len(reports))
        off = offsets.get(partition, -1)
        await self.ctx.store.apply_many(cid, [PartitionDelta(
            partition, off + 1, {(layout, None): flat}, len(reports), expected=off)])
        offsets[partition] = off + 1

    async def close(self):
        await self.ctx.store.close()


@pytest.mark.parametrize("mechanism,params,marginals,est", [
    ("corr-rr-paper", {"phase1_reports": 400}, [["a"], ["b"]], "paper"),
    ("rr-clusters", {"cluster_reports": 400, "min_dependence": 0.2}, [["a", "b"]], "castell"),
    ("rs-rfd", {"phase1_reports": 400}, [["a"], ["c"]], "unbiased"),
])
def test_one_worker_decides_every_worker_follows(redis_server, unique_name, mechanism, params,
                                                 marginals, est):
    cid = unique_name
    cfg = _config(cid, mechanism, params, marginals, [est])

    async def main():
        a, b, stale = Worker(cfg, redis_server.url), Worker(cfg, redis_server.url), \
            Worker(cfg, redis_server.url)
        try:
            offsets: dict[int, int] = {}
            mech0 = a.ctx.collections[cid].current
            rng = np.random.default_rng(1)
            recs = _records(1000)
            rep0 = mech0.randomize(recs[:400], rng)
            await a.count(cid, rep0[:250], 0, offsets)
            await a.count(cid, rep0[250:], 1, offsets)
            # the first tick publishes the configured version 0, then decides
            await a.ctl.tick(cid)
            new = a.ctx.collections[cid].current
            assert new.version == 1 and a.published == [0]
            # the decision is the adaptive step on the same counts
            expect = mech0.adapt({0: mech0.count(rep0, mech0.tensors(cfg.collections[cid].marginals))})
            assert new.state() == expect.state()
            assert a.ctx.collections[cid].versions() == {v: new for v in new.accepted_versions()}
            # visible: the version gauge and the change counter
            assert REGISTRY.get_sample_value("ldp_mechanism_version", {"collection": cid}) == 1
            assert REGISTRY.get_sample_value("ldp_mechanism_version_changes_total",
                                             {"collection": cid}) == 1
            # stored before it is published; published one interval later
            raw = await a.ctx.store.redis.hget(keys.collection_key(cid, STATE), "version")
            assert int(raw) == 1
            await a.ctl.tick(cid)
            assert a.published == [0]
            await asyncio.sleep(1.05)
            await a.ctl.tick(cid)
            assert a.published == [0, 1]
            # another worker follows without deciding
            await b.ctl.follow(cid)
            assert b.ctx.collections[cid].current.state() == new.state()
            assert set(b.ctx.collections[cid].versions()) == set(new.accepted_versions())
            # a stale holder (it never followed) cannot store a second version 1
            stale_mech = stale.ctx.collections[cid].current
            assert stale_mech.version == 0
            assert await stale.ctl.step(cid) is None       # compare-and-set refused: it follows
            assert stale.ctx.collections[cid].current.state() == new.state()
            # a stale device's batch: counted under its own version if the state still
            # accepts it, else filed as unknown_version (as the intake checks versions())
            batch = decode_batch(encode_batch(cid, 0, rep0[:10]))
            why = explain_batch(batch, {cid: b.ctx.collections[cid].versions()})
            if 0 in new.accepted_versions():
                assert why is None
            else:
                assert why is not None and why[0] == "unknown_version"
            # reports of the new version are counted under it; the estimate combines the
            # accepted versions exactly as the in-memory mechanism does
            rep1 = new.randomize(recs[400:], rng)
            await b.count(cid, rep1, 0, offsets)
            counts = await a.ctl.counts(cid, new)
            mem = {0: mech0.count(rep0, a.ctx.collections[cid].layout(0).specs),
                   1: new.count(rep1, a.ctx.collections[cid].layout(1).specs)}
            mem = {v: mem[v] for v in new.accepted_versions()}
            for v in mem:
                for k in mem[v]:
                    np.testing.assert_array_equal(counts[v][k], mem[v][k])
            attrs = tuple(marginals[0])
            live = new.estimate_versions(counts, attrs, est).factor.values
            offline = new.estimate_versions(mem, attrs, est).factor.values
            np.testing.assert_array_equal(live, offline)
        finally:
            for w in (a, b, stale):
                await w.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_rrba_blocks_become_versions_and_a_foreign_state_is_ignored(redis_server, unique_name):
    cid = unique_name
    cfg = _config(cid, "rrba", {"block_size": 60}, [["a", "b"]], ["pooled"])

    async def main():
        w = Worker(cfg, redis_server.url)
        try:
            offsets: dict[int, int] = {}
            recs = _records(2000, seed=3)
            rng = np.random.default_rng(2)
            i = 0
            while i < len(recs) and w.ctx.collections[cid].current.collecting():
                mech = w.ctx.collections[cid].current
                k = mech.reports_until_adapt(await w.ctl.counts(cid, mech)) or 200
                block = recs[i:i + k]
                await w.count(cid, mech.randomize(block, rng), i % 2, offsets)
                i += len(block)
                await w.ctl.step(cid)
            mech = w.ctx.collections[cid].current
            assert mech.version >= 3
            assert set(w.ctx.collections[cid].versions()) == set(range(mech.version + 1))
            est = mech.estimate_versions(await w.ctl.counts(cid, mech), ("a", "b"), "pooled")
            assert est.n == i and est.factor.values.sum() == pytest.approx(1.0)
            # a state stored for another config (other params) is not followed
            other = _config(cid, "rrba", {"block_size": 61}, [["a", "b"]], ["pooled"])
            w2 = Worker(other, redis_server.url)
            assert not await w2.ctl.follow(cid) and w2.ctx.collections[cid].current.version == 0
            await w2.close()
            state = json.loads(await w.ctx.store.redis.hget(keys.collection_key(cid, STATE),
                                                            "state"))
            assert state["version"] == mech.version
        finally:
            await w.close()

    asyncio.run(asyncio.wait_for(main(), 60))
