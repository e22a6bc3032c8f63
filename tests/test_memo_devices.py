"""Memoized collections count devices, not reports (docs/privacy-over-time.md): the rule (each device at its
latest report, its previous report subtracted), its state in Redis written with the counts, and
the live worker: a device sending 1,000 memoized reports moves the estimate by one device and
does not shrink the error bound, across a kill -9 of the worker."""
from __future__ import annotations

import numpy as np
import pytest
from tolerance import assert_close

from ldpstream.agents.store.device_memo import (
    COMPACT_MIN,
    DeviceTable,
    LogWrite,
    encode_log,
    group_rows,
    latest_per_device,
    parse_log,
    retention_epochs,
    roll,
    stack_rows,
)
from ldpstream.config_semantics import windows_of
from ldpstream.windows import BucketPolicy

DEVICES = 2000
CHATTY = 1000       # reports of the one chatty device


def _table(entries: dict[int, tuple[int, int, list[int]]]) -> DeviceTable:
    """A table of device -> (version, bucket, report)."""
    t = DeviceTable()
    for d, (v, b, rep) in sorted(entries.items()):
        t.upsert(np.array([d], dtype=np.uint64), np.array([[v, b + 1, len(rep), *rep]]))
    return t

pytestmark = pytest.mark.core


def test_latest_report_of_each_device_supersedes_its_previous():
    ids = np.array([5, 7, 5, 9, 7], dtype=np.uint64)
    reports = np.array([[0, 0], [1, 0], [0, 1], [1, 1], [1, 1]])
    buckets = np.array([10, 10, 11, 11, 12])
    cur = _table({7: (0, 3, [0, 1]), 8: (0, 4, [1, 1])})
    prev = _table({5: (1, -1, [1, 0]), 7: (0, 2, [0, 0])})   # 7: this epoch's row wins
    mv = latest_per_device(ids, reports, buckets, 2, (cur, prev))
    assert mv.ids.tolist() == [5, 7, 9] and mv.keep.tolist() == [2, 4, 3]   # each one's last
    removed = mv.removed_rows()
    assert sorted(removed) == [(0, 3), (1, -1)]
    assert removed[(0, 3)].tolist() == [[0, 1]] and removed[(1, -1)].tolist() == [[1, 0]]
    assert mv.rows.tolist() == [[2, 12, 2, 0, 1], [2, 13, 2, 1, 1], [2, 12, 2, 1, 1]]
    cur.upsert(mv.ids, mv.rows)
    assert cur.ids.tolist() == [5, 7, 8, 9] and cur.rows[:, 1].tolist() == [12, 13, 5, 12]


def test_device_log_round_trip_compaction_and_corruption():
    """The binary log of a table: chunks appended replay to the last row of each device, a
    wider version's rows pad the narrower ones, the log is rewritten once it holds more than
    1.5 times the table's rows, and a log that is not one is refused."""
    t = DeviceTable()
    first = latest_per_device(np.array([3, 1, 3], dtype=np.uint64), np.array([[1], [2], [3]]),
                              np.array([-1]), 4, (t,))
    t.upsert(first.ids, first.rows)
    second = latest_per_device(np.array([2, 3], dtype=np.uint64),
                               np.array([[7, 8], [9, 10]]), np.array([6]), 5, (t,))
    t.upsert(second.ids, second.rows)
    log = encode_log(first.ids, first.rows) + encode_log(second.ids, second.rows)
    back = parse_log(log)
    assert back.ids.tolist() == [1, 2, 3] and back.logged == 4
    assert back.rows.tolist() == t.rows.tolist() == [[4, 0, 1, 2, 0], [5, 7, 2, 7, 8],
                                                     [5, 7, 2, 9, 10]]
    assert {k: v.tolist() for k, v in second.removed_rows().items()} == {(4, -1): [[3]]}
    big = np.arange(10, 10 + COMPACT_MIN, dtype=np.uint64)
    rows = np.tile([[1, 1, 1, 0]], (big.size, 1))
    w = LogWrite(expire_at=1.0)
    for _ in range(3):           # the same devices again and again: the log outgrows 1.5x + min
        t.upsert(big, rows)
        w.record(t, big, rows)
    assert w.replace and t.logged == len(t) == big.size + 3
    assert parse_log(w.payload()).ids.tolist() == t.ids.tolist()
    for bad in (b"x" * 12, np.array([2, 5], dtype="<i8").tobytes()):
        with pytest.raises(ValueError):
            parse_log(bad)


def test_a_device_silent_past_two_epochs_is_not_counted_twice_all_time():
    """Epoch tables roll: a device whose only entry is in a table leaving the (previous, current)
    pair is carried as all-time only, so when it comes back its old report is subtracted from the
    all-time tensor (not counted twice there); a device also in a newer table is not carried."""
    old = _table({1: (0, 40, [1, 0]), 2: (0, 41, [0, 1])})
    cur = _table({2: (0, 90, [1, 1])})
    memo = roll({5: old, 6: DeviceTable(), 7: cur}, 7, 0)   # epoch 5 leaves the pair
    assert sorted(memo) == [6, 7] and memo[6].ids.tolist() == [1]
    # carried: all-time only, its bucket column holds -(epoch of its last report)
    assert memo[6].rows.tolist() == [[0, -5, 2, 1, 0]] and len(memo[6].unlogged) == 1
    assert memo[6].cleared == [5] and not memo[6].evicted
    back = latest_per_device(np.array([1], dtype=np.uint64), np.array([[0, 0]]),
                             np.array([95]), 0, (memo[7], memo[6]))
    assert {k: v.tolist() for k, v in back.removed_rows().items()} == {(0, -1): [[1, 0]]}
    # after a restart the worker reads three epochs' logs and carries the same way
    again = roll({5: parse_log(encode_log(old.ids, old.rows)), 7: cur}, 7, 0)
    assert again[6].ids.tolist() == [1]


def test_a_device_silent_beyond_the_retention_is_evicted_once():
    """At a roll a device whose last report is older than the retention (``keep_from``) is not
    carried: its row waits in ``evicted`` for the next delta (subtracted from all-time), the
    expired table's log is emptied; a carried row keeps its last epoch across rolls and its log
    round trip (the signed bucket column), so it leaves exactly when the retention says."""
    old = _table({1: (0, 40, [1, 0]), 2: (0, 41, [0, 1]), 3: (1, -1, [1, 1])})
    cur = _table({2: (0, 90, [1, 1])})
    memo = roll({5: old, 7: cur}, 7, keep_from=6)       # last seen in epoch 5 < 6: evicted
    assert memo[6].ids.tolist() == [] and memo[6].cleared == [5]
    gone = stack_rows(memo[6].evicted)
    assert sorted(gone[:, 3:5].tolist()) == [[1, 0], [1, 1]]   # device 2 is in epoch 7: kept
    assert {k: v.tolist() for k, v in group_rows(gone).items()} == \
        {(0, -1): [[1, 0]], (1, -1): [[1, 1]]}              # all-time only, per version
    kept = roll({5: old, 7: cur}, 7, keep_from=5)        # within the retention: carried
    assert kept[6].ids.tolist() == [1, 3] and kept[6].rows[:, 1].tolist() == [-5, -5]
    # the carried rows' log, read back (restart), rolls again: still last seen in epoch 5
    carried = parse_log(encode_log(kept[6].ids, kept[6].rows))
    assert carried.rows[:, 1].tolist() == [-5, -5]
    later = roll({6: carried, 8: DeviceTable()}, 8, keep_from=5)
    assert later[7].ids.tolist() == [1, 3] and later[7].rows[:, 1].tolist() == [-5, -5]
    last = roll({7: later[7], 9: DeviceTable()}, 9, keep_from=6)
    assert len(last[8]) == 0 and stack_rows(last[8].evicted).shape[0] == 2
    assert retention_epochs(90 * 86_400.0, BucketPolicy(60.0, windows_of(["24h"], 60.0))) == 45


def test_latest_report_per_device_is_unbiased_monte_carlo():
    """Seeded, 300 runs of 1,000 devices reporting 5 memoized reports each (one permanent
    response, a fresh instantaneous randomization per report): castell on the table of each
    device's latest report (what the worker counts) is unbiased, every cell within 4 standard
    errors of the truth, and its spread is that of 1,000 independent reports, the n its bound
    assumes (a report-counting table would state the bound of 5,000 independent reports, while
    the permanent responses they share do not average out)."""
    from ldpstream.estimators.families.rr import RRIndependent
    from ldpstream.estimators.kernels import channels as ch
    from ldpstream.estimators.kernels.domain import Domain
    from ldpstream.estimators.stream.longitudinal import Memoize

    dom = Domain(("a", "b"), (3, 2))
    mech = RRIndependent(dom, epsilon=1.0, memoize=Memoize(86400.0, (2.0, 2.0)))
    memo = mech.memoization()
    assert memo is not None
    attrs = ("a", "b")
    spec = mech.tensors([attrs])[0]
    truth = np.array([[0.3, 0.1], [0.15, 0.25], [0.05, 0.15]])
    rng = np.random.default_rng(11)
    n, reports_each, runs = 1000, 5, 300
    ids = np.tile(np.arange(n, dtype=np.uint64), reports_each)

    def permanent() -> np.ndarray:
        """The permanent responses of a fresh fleet of n devices drawn from ``truth``."""
        cells = rng.choice(truth.size, n, p=truth.ravel())
        x = np.stack(np.unravel_index(cells, truth.shape), axis=1)
        return np.stack([ch.randomize(x[:, j], memo.permanent[j], rng) for j in range(2)],
                        axis=1)

    est = np.empty((runs,) + truth.shape)
    for r in range(runs):
        perm = permanent()
        reports = np.concatenate([memo.instantaneous(perm, rng) for _ in range(reports_each)])
        mv = latest_per_device(ids, reports, np.zeros(1, dtype=np.int64), 0, ())
        table = mech.count(reports[mv.keep], [spec])[spec.key]
        assert int(table.sum()) == n
        est[r] = mech.estimate({spec.key: table}, attrs, "castell").factor.values
    mean, se = est.mean(axis=0), est.std(axis=0, ddof=1) / np.sqrt(runs)
    assert np.all(np.abs(mean - truth) <= 4 * se), (mean, truth, se)
    # the same fleet reporting once: the spread its n independent reports give
    one = np.empty((runs,) + truth.shape)
    for r in range(runs):
        table = mech.count(memo.instantaneous(permanent(), rng), [spec])[spec.key]
        one[r] = mech.estimate({spec.key: table}, attrs, "castell").factor.values
    assert_close(est.std(axis=0), one.std(axis=0), 0.25)


def test_drift_counts_devices_so_a_chatty_device_is_no_alarm():
    """Seeded: 20 pairs of windows of 2,000 different devices each from one population, one
    device reporting 1,000 memoized copies in the current window. Counted once (the worker's
    tables of a memoized collection), the drift check's variances come from 2,001 devices and
    it stays quiet; counted 1,000 times, the same check alarms in every pair."""
    from ldpstream.estimators.families.rr import RRIndependent
    from ldpstream.estimators.kernels.domain import Domain
    from ldpstream.estimators.stream.longitudinal import Memoize
    from ldpstream.estimators.stream.many import drift_many, estimate_many

    dom = Domain(("a", "b"), (2, 2))
    mech = RRIndependent(dom, epsilon=1.0, memoize=Memoize(86400.0, (2.0, 2.0)))
    attrs = ("a", "b")
    key = mech.tensors([attrs])[0].key
    rng = np.random.default_rng(3)
    truth = np.array([0.4, 0.1, 0.2, 0.3])

    def table(n: int) -> np.ndarray:
        cells = rng.choice(4, n, p=truth)
        records = np.stack([cells // 2, cells % 2], axis=1)
        return mech.count(mech.randomize(records, rng), [mech.tensors([attrs])[0]])[key]

    def alarm(cur: np.ndarray, prev: np.ndarray) -> bool:
        c, p = {mech.version: {key: cur}}, {mech.version: {key: prev}}
        est = estimate_many(mech, {"cur": c, "prev": p}, [attrs], ["castell"]).estimates
        k = ("cur", attrs, "castell")
        return drift_many(mech, {"cur": (c, p)}, {k: est[k]}, {k: est[("prev", attrs, "castell")]},
                          alpha=1e-3).results[k].alarm

    chatty = np.zeros((2, 2), dtype=np.int64)
    chatty[0, 1] = 1
    by_device, by_report = 0, 0
    for _ in range(20):
        prev, cur = table(DEVICES), table(DEVICES)
        by_device += alarm(cur + chatty, prev)
        by_report += alarm(cur + CHATTY * chatty, prev)
    assert by_device <= 1 and by_report == 20, (by_device, by_report)


def test_drift_of_a_fleet_reporting_in_both_windows():
    """Seeded: 2,000 devices report in every 5-minute window. Counted at their latest report, the
    range before the current window holds none of them; the snapshot of the window one window
    length ago (agents/refresh/window_snapshots.py) holds each once, so drift gets a value: an alarm in
    every one of 10 pairs when the population shifts, in at most one when it does not."""
    from ldpstream.agents.refresh.bucket_reader import WindowCounts
    from ldpstream.agents.refresh.window_snapshots import PER_WINDOW, WindowSnapshots
    from ldpstream.estimators.families.rr import RRIndependent
    from ldpstream.estimators.kernels.domain import Domain
    from ldpstream.estimators.stream.longitudinal import Memoize
    from ldpstream.estimators.stream.many import drift_many, estimate_many
    from ldpstream.windows import parse_window

    dom = Domain(("a", "b"), (2, 2))
    mech = RRIndependent(dom, epsilon=4.0, memoize=Memoize(86400.0, (2.0, 2.0)))
    attrs, spec = ("a", "b"), mech.tensors([("a", "b")])[0]
    rng = np.random.default_rng(5)
    ids = np.arange(DEVICES, dtype=np.uint64)
    w = parse_window("5m")
    span = float(w.seconds or 0)

    def window(truth: list[float]) -> WindowCounts:
        """The window's counts: every device's latest report (two reports each in it)."""
        cells = rng.choice(4, DEVICES, p=truth)
        rec = np.stack([cells // 2, cells % 2], axis=1)
        reports = np.concatenate([mech.randomize(rec, rng), mech.randomize(rec, rng)])
        mv = latest_per_device(np.tile(ids, 2), reports, np.zeros(1, dtype=np.int64), 0, ())
        table = mech.count(reports[mv.keep], [spec])[spec.key]
        return WindowCounts({mech.version: {spec.key: table}}, int(table.sum()), ())

    def alarm(truth_before: list[float], truth_now: list[float]) -> bool:
        snaps, t0 = WindowSnapshots(), 1_000_000.0
        first = {"5m": window(truth_before), "5m/previous": window(truth_before)}
        snaps.swap(first, [w], t0, "/previous")
        assert "5m/previous" not in first        # no snapshot one window ago yet: no drift
        for k in range(1, PER_WINDOW + 1):       # refreshes in between
            snaps.add("5m", t0 + k * span / PER_WINDOW / 2, window(truth_before), span)
        empty = WindowCounts({mech.version: {spec.key: np.zeros((2, 2), np.int64)}}, 0, ())
        reads = {"5m": window(truth_now), "5m/previous": empty}   # the range: all moved on
        snaps.swap(reads, [w], t0 + span, "/previous")
        prev = reads["5m/previous"]
        assert prev is first["5m"] and prev.n == DEVICES    # the window as it was, every device
        c, p = reads["5m"].counts, prev.counts
        est = estimate_many(mech, {"cur": c, "prev": p}, [attrs], ["castell"]).estimates
        key = ("cur", attrs, "castell")
        res = drift_many(mech, {"cur": (c, p)}, {key: est[key]},
                         {key: est[("prev", attrs, "castell")]}, alpha=1e-3).results[key]
        assert res.statistic is not None
        return bool(res.alarm)

    same, moved = [0.4, 0.1, 0.2, 0.3], [0.1, 0.4, 0.4, 0.1]
    assert sum(alarm(same, same) for _ in range(10)) <= 1
    assert sum(alarm(same, moved) for _ in range(10)) == 10


def test_config_retention_is_at_least_one_state_epoch():
    """``device_retention_s`` below one state epoch (2 × the longest window + one bucket) is a
    config error naming the field; the default is 90 days, or one epoch if longer; ``/collections``
    says what the all-time window then holds."""
    from ldpstream.config import ConfigError, parse_config
    from ldpstream.privacy import over_time

    def coll(**extra) -> dict:
        return {"collections": [{"id": "c", "schema": {"attributes": {"os": ["a", "b"],
                                                                      "plan": ["f", "p"]}},
                                 "epsilon": 1.0, "marginals": [["os", "plan"]],
                                 "params": {"memoize": {"rotation_s": 86400,
                                                        "instantaneous_epsilon": 2.0}},
                                 **extra}]}

    with pytest.raises(ConfigError, match=r"^collections\[0\]\.device_retention_s: 3600 s is "
                                          r"shorter than one device state epoch \(172860 s"):
        parse_config(coll(device_retention_s=3600))
    c = parse_config(coll()).collections["c"]
    assert c.device_retention() == 90 * 86_400.0
    assert parse_config(coll(windows=["60d"])).collections["c"].device_retention() == \
        2 * 60 * 86_400.0 + 60.0
    ot = over_time(c, c.mechanism())
    assert ot["device_retention_s"] == 90 * 86_400.0
    assert ot["all_window"].startswith("devices active within the last 90 days")
