"""The Python device SDK on memoized one-shot families (docs/devices.md "Memoization"): a
device of a memoized ``partitioned`` collection reports its assigned marginal (fixed per
rotation period from its id), is charged once per new (marginal, value) memo, sends 1,000
identical records once per period, and follows the composed channel over periods."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
from scipy.stats import chisquare
from test_device_sdk import Clock, watching

from ldpstream.estimators.families.partitioned import Partitioned, assign_by_device
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.producers.ledger import Budget, Ledger
from ldpstream.producers.sdk import DeviceClient, RecordingTransport

pytestmark = pytest.mark.pipeline

DOM = Domain.from_categories({"os": ["android", "ios", "other"], "plan": ["free", "pro"],
                              "region": ["eu", "us", "asia", "latam"]})
REC = {"os": "ios", "plan": "pro", "region": "us"}
ROT = 3600.0


def _mech(inst: float | None) -> Partitioned:
    memo = {"rotation_s": ROT, **({} if inst is None else {"instantaneous_epsilon": inst})}
    return Partitioned.from_config(DOM, {"ways": 2, "oracles": ["grr"], "memoize": memo},
                                   epsilon=2.0, epsilon_scope="record", version=3)


def _table(mech: Partitioned, code: int) -> int:
    return int(np.searchsorted(mech.offsets, code, side="right") - 1)


def test_memoized_partitioned_device_reports_its_period_marginal_once(kafka_broker, unique_name,
                                                                     tmp_path):
    topic = f"cfg.{unique_name}"
    mech = _mech(None)
    per_rotation = mech.guarantee().per_rotation
    assert per_rotation == pytest.approx(2.0, rel=1e-9)
    dev = 4242

    async def run():
        clock = Clock(ROT * 500 + 5)
        sent = RecordingTransport()
        async with watching(kafka_broker.bootstrap, topic, {"part": mech}) as watcher:
            client = DeviceClient("part", watcher=watcher, transport=sent,
                                  ledger=Ledger(tmp_path / "d.sqlite",
                                                budget=Budget(3 * per_rotation, 86400.0)),
                                  device_id=dev, batch_size=10, clock=clock,
                                  rng=np.random.default_rng(1))
            results = [await client.report(REC) for _ in range(1000)]
            assert [r.status for r in results].count("queued") == 1
            assert results[0].epsilon == pytest.approx(per_rotation, rel=1e-9)
            assert all(r.epsilon == 0 for r in results[1:])
            await client.flush()
            code = int(sent.reports()[0, 0])
            period = int(clock.t // ROT)
            assigned = int(assign_by_device(np.array([dev], np.uint64), len(mech.marginals),
                                            mech.assign_seed, period)[0])
            assert _table(mech, code) == assigned
            # a value outside the assigned marginal changes nothing it reports: same memo key,
            # a new record is sent (its record differs) but costs nothing
            other_attr = [a for a in DOM.attrs if a not in mech.marginals[assigned]][0]
            moved = dict(REC, **{other_attr: DOM.categories(other_attr)[0]
                                 if REC[other_attr] != DOM.categories(other_attr)[0]
                                 else DOM.categories(other_attr)[1]})
            same = await client.report(moved)
            assert same.status == "queued" and same.epsilon == 0
            assert int(same.report[0]) == code
            # a new value of the assigned marginal: one new memo, its ε
            inside = mech.marginals[assigned][0]
            changed = dict(REC, **{inside: next(c for c in DOM.categories(inside)
                                                if c != REC[inside])})
            new = await client.report(changed)
            assert new.status == "queued" and new.epsilon == pytest.approx(per_rotation)
            # the next period: a new assignment and a new memo (charged), until the budget ends
            clock.t += ROT
            nxt = await client.report(REC)
            assert nxt.status == "queued" and nxt.epsilon == pytest.approx(per_rotation)
            clock.t += ROT
            refused = await client.report(REC)
            assert refused.status == "refused" and "budget exceeded" in refused.reason
            await client.close()
            client.ledger.close()

    asyncio.run(run())


def test_memoized_partitioned_reports_follow_the_composed_channel(kafka_broker, unique_name):
    """One device, one report per period over 4,000 periods: its reports are i.i.d. draws of
    (uniform marginal) × row of the composed oracle (χ², p > 1e-4)."""
    topic = f"cfg.{unique_name}"
    mech = _mech(1.0)
    x = DOM.encode([REC])[0]

    async def run():
        clock = Clock(0.0)
        sent = RecordingTransport()
        async with watching(kafka_broker.bootstrap, topic, {"audit": mech}) as watcher:
            client = DeviceClient("audit", watcher=watcher, transport=sent,
                                  ledger=Ledger(":memory:"), device_id=9, batch_size=500,
                                  clock=clock, rng=np.random.default_rng(3))
            for _ in range(4000):
                assert (await client.report(REC)).status == "queued"
                clock.t += ROT
            await client.flush()
        codes = sent.reports()[:, 0]
        expected = np.zeros(int(mech.offsets[-1]))
        for j, o in enumerate(mech.oracles):
            cols = DOM.axes(mech.marginals[j])
            cell = int(np.ravel_multi_index(tuple(int(x[c]) for c in cols),
                                            tuple(DOM.shape[c] for c in cols)))
            expected[mech.offsets[j]:mech.offsets[j + 1]] = o.channel()[cell] / len(mech.oracles)
        obs = np.bincount(codes, minlength=len(expected))
        assert chisquare(obs, len(codes) * expected).pvalue > 1e-4

    asyncio.run(run())
