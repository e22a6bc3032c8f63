"""Time buckets and windows (ldpstream/windows.py): parsing, placement of record timestamps (the
future/late rule), window ranges and their cover by coarse and fine buckets."""
from __future__ import annotations

import numpy as np
import pytest

from ldpstream.windows import COARSE_FACTOR, FUTURE_TOLERANCE_S, BucketPolicy, Window, cover, parse_window

pytestmark = pytest.mark.core

POLICY = BucketPolicy(60.0, (parse_window("5m"), parse_window("1h"), parse_window("all")))


def test_parse_window():
    assert parse_window("5m") == Window("5m", 300.0)
    assert parse_window("24h") == Window("24h", 86_400.0)
    assert parse_window("7d") == Window("7d", 604_800.0)
    assert parse_window("all") == Window("all", None) and parse_window("all").is_all
    for bad in ("", "5", "m", "-5m", "5 min", "0s", "1y"):
        with pytest.raises(ValueError, match="window"):
            parse_window(bad)


def test_policy_rejects_windows_that_are_not_whole_buckets():
    with pytest.raises(ValueError, match="whole number of buckets"):
        BucketPolicy(60.0, (parse_window("90s"),))
    assert not BucketPolicy(60.0, (parse_window("all"),)).bucketed


def test_retention_is_twice_the_longest_window_plus_a_bucket():
    assert POLICY.longest_s == 3600.0
    assert POLICY.retention_s() == 2 * 3600 + 60
    assert POLICY.fine_expire_at(100) == 101 * 60 + 7260
    assert POLICY.coarse_expire_at(2) == 3 * 3600 + 7260


def test_placement_of_record_timestamps():
    now = 1_000_000.0
    t = np.array([now, now - 59.0, now + FUTURE_TOLERANCE_S - 1, now + FUTURE_TOLERANCE_S + 1,
                  now - 7000.0, now - 8000.0])
    b, future, late = POLICY.place_many(t, now)
    nb = int(now // 60)
    assert b.tolist() == [nb, int((now - 59) // 60), int((now + 119) // 60), nb,
                          int((now - 7000) // 60), -1]
    assert future.tolist() == [False, False, False, True, False, False]   # clamped to now
    assert late.tolist() == [False, False, False, False, False, True]     # all-time only
    # the scalar rule agrees
    for ti, bi in zip(t, b.tolist()):
        got, why = POLICY.place(float(ti), now)
        assert (got if got is not None else -1) == bi
    assert POLICY.place(now + 500, now) == (nb, "future")
    assert POLICY.place(now - 8000, now) == (None, "late")
    # without finite windows nothing is bucketed
    only_all = BucketPolicy(60.0, (parse_window("all"),))
    assert only_all.place(now, now) == (None, None)
    assert (only_all.place_many(t, now)[0] == -1).all()


def test_ranges_are_adjacent_and_of_the_window_length():
    now = 1_000_000.0
    cur, prev = POLICY.ranges(parse_window("5m"), now)
    nb = int(now // 60)
    assert cur == (nb - 4, nb) and prev == (nb - 9, nb - 5)


@pytest.mark.parametrize("first,last", [(0, 0), (55, 130), (60, 119), (59, 120), (1, 58),
                                        (0, 1439), (7, 7 + 3 * 60)])
def test_cover_is_exactly_the_range(first, last):
    fine, coarse = cover(first, last)
    cells = set(fine)
    for c in coarse:
        block = set(range(c * COARSE_FACTOR, (c + 1) * COARSE_FACTOR))
        assert not cells & block
        cells |= block
    assert cells == set(range(first, last + 1))
    assert len(fine) <= 2 * (COARSE_FACTOR - 1)


def test_cover_of_an_empty_range():
    assert cover(5, 4) == ([], [])
