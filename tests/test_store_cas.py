"""CountStore compare-and-set apply against a real redis-server: a delta covers the offsets
``(expected, offset]`` and is counted only when the stored offset equals ``expected``; replays are
skipped; gaps and overlaps are refused and change nothing. Includes the frozen-worker ("zombie")
interleaving that double-counted with the old ``offset > stored`` rule, step by step, and a seeded
random interleaving of several workers following the ingest protocol."""
from __future__ import annotations

import random

import numpy as np
import pytest
from store_helpers import P, cells, on_masters, read, with_stores

from ldpstream.agents.store.apply_delta import ApplyStatus, PartitionDelta
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.layout import Layout
from ldpstream.estimators.mechanism import TensorSpec

pytestmark = pytest.mark.pipeline

SPEC = TensorSpec("m:a|b", ("a", "b"), (3, 4), (0, 1))
LAYOUT = Layout.of(0, [SPEC])
APPLIED, REPLAYED, CONFLICT = ApplyStatus.APPLIED, ApplyStatus.REPLAYED, ApplyStatus.CONFLICT


def run(body, url, **store_kw):
    return with_stores(url, body, store_kw, store_kw, store_kw)


class Log:
    """One partition's messages: offset i holds one report (a, b); gaps in offsets allowed."""

    def __init__(self, rng: np.random.Generator, n: int, gaps: bool = False):
        self.offsets = np.cumsum(rng.integers(1, 3, n)) - 1 if gaps else np.arange(n)
        self.reports = np.stack([rng.integers(0, 3, n), rng.integers(0, 4, n)], axis=1)

    def count(self, lo: int, hi: int) -> np.ndarray:
        """Counts of the messages at offsets in (lo, hi]."""
        sel = (self.offsets > lo) & (self.offsets <= hi)
        flat = self.reports[sel, 0] * 4 + self.reports[sel, 1]
        return np.bincount(flat, minlength=12).reshape(3, 4).astype(np.int64)

    def n(self, lo: int, hi: int) -> int:
        return int(((self.offsets > lo) & (self.offsets <= hi)).sum())

    def delta(self, partition: int, lo: int, hi: int, *, cas: bool = True,
              sent: float | None = None) -> PartitionDelta:
        return PartitionDelta(partition, hi, cells(LAYOUT, {SPEC.key: self.count(lo, hi)},
                                                   self.n(lo, hi)),
                              self.n(lo, hi), lo if cas else None, sent)


async def one(store: CountStore, coll: str, d: PartitionDelta):
    (res,) = await store.apply_many(coll, [d])
    return res.status, res.stored


def test_cas_applies_replays_skip_conflicts_change_nothing(redis_url):
    log = Log(np.random.default_rng(1), 60)

    async def body(store, *_):
        c = "cas1"
        await store.reset(c)
        assert await one(store, c, log.delta(0, -1, 9, sent=50.0)) == (APPLIED, 9)  # first delta
        assert await one(store, c, log.delta(0, 9, 19, sent=60.0)) == (APPLIED, 19)
        snapshot = (await read(store, c, LAYOUT, SPEC), await store.n(c, P), await store.sent_at_max(c, P))
        np.testing.assert_array_equal(snapshot[0], log.count(-1, 19))
        assert snapshot[1:] == (20, 60.0)
        refused = [
            ((9, 19), REPLAYED),    # the same delta again (a retry after a timeout)
            ((4, 12), REPLAYED),    # an older range, entirely below the stored offset
            ((-1, 19), REPLAYED),   # the union of both
            ((-1, 30), CONFLICT),   # "first" delta but something is stored: overlaps (-1, 19]
            ((15, 30), CONFLICT),   # overlap: starts inside the counted range
            ((20, 30), CONFLICT),   # gap: (19, 20] would never be counted
            ((25, 40), CONFLICT),   # gap
        ]
        for (lo, hi), want in refused:
            assert await one(store, c, log.delta(0, lo, hi, sent=1e12)) == (want, 19), (lo, hi)
        # nothing changed: counts, n, sent_at_max, offsets
        np.testing.assert_array_equal(await read(store, c, LAYOUT, SPEC), snapshot[0])
        assert (await store.n(c, P), await store.sent_at_max(c, P)) == snapshot[1:]
        assert await store.offsets(c, P) == {0: 19}
        # a partition with nothing stored refuses a delta that expects something stored
        assert await one(store, c, log.delta(1, 5, 9)) == (CONFLICT, None)
        assert await store.offsets(c, P) == {0: 19}
        # the chain continues where it ended
        assert await one(store, c, log.delta(0, 19, 59)) == (APPLIED, 59)
        np.testing.assert_array_equal(await read(store, c, LAYOUT, SPEC), log.count(-1, 59))
        assert await store.n(c, P) == 60
        # apply(): the bool form with expected=
        assert await store.apply(c, 0, 59, cells(LAYOUT, {SPEC.key: log.count(19, 59)}, 40), 40, expected=19) is False
        assert await store.apply(c, 2, 3, cells(LAYOUT, {SPEC.key: log.count(-1, 3)}, 4), 4, expected=-1) is True
        assert await store.offsets(c, P) == {0: 59, 2: 3}
        # empty or malformed ranges are a caller bug
        for lo, hi in ((5, 5), (7, 3), (-2, 4)):
            with pytest.raises(ValueError):
                await store.apply_many(c, [log.delta(0, lo, hi)])
        assert await store.apply_many(c, []) == []
    run(body, redis_url)


def test_many_partitions_in_one_flush_each_decided_on_its_own(redis_url):
    rng = np.random.default_rng(2)
    logs = [Log(rng, 40) for _ in range(4)]

    async def evalsha_calls(store):  # every master of a cluster
        return sum(int(info.get("cmdstat_evalsha", {}).get("calls", 0))
                   for info in await on_masters(store.redis, "INFO", "commandstats"))

    async def body(store, *_):
        c = "cas2"
        await store.reset(c)
        res = await store.apply_many(c, [lg.delta(p, -1, 9, sent=10.0 + p)
                                         for p, lg in enumerate(logs)])
        assert [(r.partition, r.status, r.stored) for r in res] == [(p, APPLIED, 9) for p in range(4)]
        before = await evalsha_calls(store)
        res = await store.apply_many(c, [
            logs[0].delta(0, 9, 19, sent=20.0),    # applied
            logs[1].delta(1, -1, 9, sent=99.0),    # replayed
            logs[2].delta(2, 5, 19, sent=99.0),    # conflict (overlap)
            logs[3].delta(3, 9, 29, sent=21.0),    # applied
            logs[0].delta(0, 19, 25, sent=22.0),   # applied: continues the first item
            logs[2].delta(2, 9, 14, sent=23.0),    # applied after the conflict of the same call
        ])
        assert await evalsha_calls(store) - before == 6            # one script call each
        assert [(r.status, r.stored) for r in res] == [
            (APPLIED, 19), (REPLAYED, 9), (CONFLICT, 9), (APPLIED, 29), (APPLIED, 25),
            (APPLIED, 14)]
        assert await store.offsets(c, P) == {0: 25, 1: 9, 2: 14, 3: 29}
        want = logs[0].count(-1, 25) + logs[1].count(-1, 9) + logs[2].count(-1, 14) \
            + logs[3].count(-1, 29)
        np.testing.assert_array_equal(await read(store, c, LAYOUT, SPEC), want)
        assert await store.n(c, P) == 26 + 10 + 15 + 30
        assert await store.sent_at_max(c, P) == 23.0                  # max over applied items only
        # legacy (unchecked) items still work beside CAS items
        res = await store.apply_many(c, [logs[1].delta(1, 9, 19, cas=False),
                                         logs[3].delta(3, 0, 20, cas=False)])
        assert [(r.status, r.stored) for r in res] == [(APPLIED, 19), (REPLAYED, 29)]
    run(body, redis_url, chunk_cells=5)  # 12 cells in 3 chunks: keys shared across partitions


def test_frozen_worker_interleaving_counts_exactly(redis_url):
    """The reported double count, step by step: worker A stored S = 9 and has (9, 19] pending
    when it freezes past the session timeout; B takes the partition over and reads S; A's apply
    lands; B applies (9, 24]. With the CAS, B's delta conflicts, B re-reads from 20 and the counts
    are exact. The same schedule with the old rule (offset > stored) counts (9, 19] twice."""
    log = Log(np.random.default_rng(3), 80, gaps=True)
    o = log.offsets  # real offsets (with gaps): positions below are message indexes

    async def scenario(a, b, cas: bool, c: str):
        await a.reset(c)
        assert (await one(a, c, log.delta(0, -1, o[9], cas=cas)))[0] is APPLIED
        a_pending = log.delta(0, o[9], o[19], cas=cas)          # A freezes with this in flight
        s = (await b.offsets(c, P)).get(0, -1)                     # B is assigned, reads S
        assert s == o[9]
        b_pending = log.delta(0, s, o[24], cas=cas)             # B consumes (S, o[24]]
        assert (await one(a, c, a_pending))[0] is APPLIED       # the zombie's apply lands
        status, stored = await one(b, c, b_pending)
        if cas:
            assert (status, stored) == (CONFLICT, o[19])
            # B drops its pending delta and re-reads from stored + 1
            assert await one(b, c, log.delta(0, stored, o[29])) == (APPLIED, o[29])
            # A wakes up still believing it owns the partition: its next deltas are refused
            assert await one(a, c, log.delta(0, o[19], o[25])) == (REPLAYED, o[29])
            assert await one(a, c, log.delta(0, o[19], o[39])) == (CONFLICT, o[29])
            # A's zombie delta arriving AFTER B's apply instead is a replay/conflict too
            assert await one(a, c, log.delta(0, o[9], o[19])) == (REPLAYED, o[29])
            # B carries on; A is revoked (drops its pending deltas)
            assert await one(b, c, log.delta(0, o[29], o[79])) == (APPLIED, o[79])
        else:
            assert status is APPLIED                            # the overlap is counted twice
            await one(b, c, log.delta(0, o[24], o[79], cas=False))
        return await read(a, c, LAYOUT, SPEC), await a.n(c, P)

    async def body(a, b, _):
        got, n = await scenario(a, b, True, "zombie-cas")
        np.testing.assert_array_equal(got, log.count(-1, o[79]))
        assert n == 80
        got, n = await scenario(a, b, False, "zombie-legacy")
        assert n == 80 + 10                                     # (o[9], o[19]] twice
        np.testing.assert_array_equal(got, log.count(-1, o[79]) + log.count(o[9], o[19]))
    run(body, redis_url)


@pytest.mark.parametrize("seed", range(5))
def test_random_interleaving_of_workers_counts_exactly(redis_url, seed):
    """Three workers over 3 partitions follow the ingest protocol (deltas carry the offset they
    continue from; conflict → drop pending, re-read stored + 1; replay ending below stored → same)
    while partitions move between them at random and applies are delayed, reordered and retried
    at random (zombies included). Whatever the schedule, the final counts are exact."""
    rnd = random.Random(20240611 + seed)
    nprng = np.random.default_rng(seed)
    parts = 3
    logs = [Log(nprng, 400, gaps=(p == 1)) for p in range(parts)]
    end = [int(lg.offsets[-1]) for lg in logs]
    coll = f"rand{seed}"

    class Worker:
        def __init__(self, store, outcomes):
            self.store = store
            self.outcomes = outcomes
            self.pos: dict[int, int] = {}        # partition -> highest offset taken
            self.inflight: list[PartitionDelta] = []

        async def assign(self, p: int) -> None:
            self.pos[p] = (await self.store.offsets(coll, P)).get(p, -1)
            self.inflight = [d for d in self.inflight if d.partition != p]

        def consume(self, p: int) -> None:
            lo = self.pos[p]
            nxt = logs[p].offsets[logs[p].offsets > lo]
            if nxt.size:
                hi = int(nxt[min(nxt.size - 1, rnd.randrange(1, 40))])
                self.inflight.append(logs[p].delta(p, lo, hi))
                self.pos[p] = hi

        async def flush(self) -> None:
            batch, self.inflight = self.inflight, []
            if not batch:
                return
            rnd.shuffle(batch)   # several deltas of one partition may even arrive out of order
            for r, d in zip(await self.store.apply_many(coll, batch), batch):
                self.outcomes[r.status] += 1
                resync = r.status is CONFLICT or (r.status is REPLAYED and r.stored != d.offset)
                if resync and d.partition in self.pos:  # (a zombie may still think it owns p)
                    self.pos[d.partition] = -1 if r.stored is None else r.stored
                    self.inflight = [x for x in self.inflight if x.partition != d.partition]

    async def body(*stores):
        await stores[0].reset(coll)
        outcomes = {APPLIED: 0, REPLAYED: 0, CONFLICT: 0}
        workers = [Worker(s, outcomes) for s in stores]
        owner = {p: workers[p % 3] for p in range(parts)}
        for p, w in owner.items():
            await w.assign(p)
        steps = 0
        while steps < 3000:
            steps += 1
            stored = await stores[0].offsets(coll, P)
            if all(stored.get(p) == end[p] for p in range(parts)):
                break
            w = rnd.choice(workers)
            act = rnd.random()
            if act < 0.08:  # a partition moves; the old owner is NOT told (a frozen zombie)
                p = rnd.randrange(parts)
                nw = rnd.choice(workers)
                owner[p] = nw
                await nw.assign(p)
            elif act < 0.12:  # a zombie learns it lost partitions and drops them
                for p in [p for p in w.pos if owner[p] is not w]:
                    del w.pos[p]
                    w.inflight = [d for d in w.inflight if d.partition != p]
            elif act < 0.65:
                for p in list(w.pos):
                    if rnd.random() < 0.7:
                        w.consume(p)
            else:
                if rnd.random() < 0.1 and w.inflight:  # retry after a "timeout": apply twice
                    await w.store.apply_many(coll, list(w.inflight))
                await w.flush()
        assert steps < 3000, "did not converge"
        got = await read(stores[0], coll, LAYOUT, SPEC)
        want = sum(lg.count(-1, e) for lg, e in zip(logs, end))
        np.testing.assert_array_equal(got, want)
        assert await stores[0].n(coll, P) == sum(lg.offsets.size for lg in logs)
        return steps, outcomes

    _, outcomes = run(body, redis_url)
    # the schedule did exercise the refusals (zombie deltas, retries, out-of-order deltas)
    assert outcomes[REPLAYED] > 0 and outcomes[CONFLICT] > 0, outcomes
