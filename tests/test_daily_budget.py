"""The daily ε budget (docs/privacy-over-time.md): ε per window and per day at the declared rate,
computed from the mechanism's guarantee; a config whose declared rate spends more than
``max_epsilon_per_day`` fails at start naming the field; the SDK ledger refuses the report that
would exceed it (the worker publishes the budget in its signed state) and the worker counts at
most the reports per device and day that fit, the rest dead-lettered as ``over_budget``."""
from __future__ import annotations

import pytest
from tolerance import assert_close

from ldpstream.config import ConfigError, parse_config
from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.stream.longitudinal import Memoize
from ldpstream.privacy_windows import DAY_S, daily_report_limit, epsilon_in, window_fields
from ldpstream.producers.ledger import Ledger

DOM = Domain.from_categories({"os": ["android", "ios", "other"], "plan": ["free", "pro"]})


def collection(**extra) -> dict:
    return {"collections": [{"id": "c", "schema": {"attributes": {"os": ["a", "b", "c"],
                                                                  "plan": ["f", "p"]}},
                             "epsilon": 1.0, "marginals": [["os", "plan"]], **extra}]}

pytestmark = pytest.mark.core


def test_epsilon_per_window_fresh_and_memoized():
    fresh = RRIndependent(DOM, epsilon=1.0).guarantee()         # 2 attributes: ε 2 per report
    assert_close(epsilon_in(fresh, 3600.0, 24.0), 2.0, 1e-12)   # one report an hour
    assert_close(epsilon_in(fresh, DAY_S, 24.0), 48.0, 1e-12)
    assert epsilon_in(fresh, DAY_S, None) is None               # unbounded at an undeclared rate
    memo = RRIndependent(DOM, epsilon=1.0,
                         memoize=Memoize(DAY_S, (2.0, 2.0))).guarantee()
    # permanent ε 2 per rotation period; a day meets at most 2 periods, an hour 2 as well
    assert_close(epsilon_in(memo, DAY_S, 1440.0), 4.0, 1e-12)
    assert_close(epsilon_in(memo, 3600.0, 1440.0), 4.0, 1e-12)
    # never more than the reports' own ε: one report a day costs at most ε per report
    assert_close(epsilon_in(memo, DAY_S, 1.0), memo.per_report, 1e-12)
    assert daily_report_limit(20.0, None, fresh) == 10
    assert daily_report_limit(20.0, 6.0, fresh) == 6
    assert daily_report_limit(4.0, 1440.0, memo) == 1440
    assert daily_report_limit(None, 1440.0, memo) is None
    f = window_fields(1440.0, 4.0, [("1h", 3600.0), ("all", None)],
                      RRIndependent(DOM, epsilon=1.0, memoize=Memoize(DAY_S, (2.0, 2.0))))
    assert f["epsilon_per_window"]["all"] is None and f["daily_report_limit"] == 1440
    assert_close(f["epsilon_per_window"]["1h"], 4.0, 1e-12)


def test_config_refuses_a_rate_over_the_budget():
    memo = {"memoize": {"rotation_s": 86400, "instantaneous_epsilon": 2.0}}
    parse_config(collection(params=memo, reports_per_day=1440, max_epsilon_per_day=4.0))
    with pytest.raises(ConfigError, match=r"collections\[0\]\.max_epsilon_per_day: a device at "
                                          r"the declared rate spends ε = 48 per day"):
        parse_config(collection(reports_per_day=24, max_epsilon_per_day=20.0))
    with pytest.raises(ConfigError, match=r"max_epsilon_per_day: a memoized collection needs "
                                          r"reports_per_day"):
        parse_config(collection(params=memo, max_epsilon_per_day=4.0))
    with pytest.raises(ConfigError, match=r"max_epsilon_per_day: one report costs ε = 2"):
        parse_config(collection(max_epsilon_per_day=1.0))


def test_ledger_refuses_beyond_the_collection_budget(tmp_path):
    led = Ledger(tmp_path / "l.sqlite")
    t = 1_000_000.0
    for i in range(5):
        assert led.daily_refusal("c", 2.0, t + i, 10.0) is None
        led.commit("c", t + i, 2.0)
    why = led.daily_refusal("c", 2.0, t + 10, 10.0)
    assert why is not None and why.startswith("over_budget") and "'c'" in why
    assert led.daily_refusal("other", 2.0, t + 10, 10.0) is None     # per collection
    assert led.daily_refusal("c", 2.0, t + DAY_S + 1, 10.0) is None  # the day has passed


def test_ledger_and_worker_share_the_utc_budget_day(tmp_path):
    """One budget day for both: the ledger's spend resets at 00:00 UTC (not 24 h after a spend),
    the worker's one-day quota window (agents/store/quota.py) is the same day."""
    from ldpstream.agents.store.quota import window_of
    from ldpstream.privacy_windows import budget_day

    midnight = 20_000 * DAY_S
    for t in (midnight - 0.5, midnight, midnight + 0.5, midnight + DAY_S - 1e-3):
        assert window_of(t * 1000.0, DAY_S) == budget_day(t)
    led = Ledger(tmp_path / "l.sqlite")
    led.commit("c", midnight - 30, 10.0)                     # the whole cap, at 23:59:30
    assert led.daily_refusal("c", 1.0, midnight - 1, 10.0) is not None
    assert led.daily_refusal("c", 1.0, midnight + 30, 10.0) is None   # a new UTC day


def test_simulate_states_epsilon_per_window():
    from ldpstream.simulate.driver import simulated_windows

    memo = RRIndependent(DOM, epsilon=1.0, memoize=Memoize(3600.0, (2.0, 2.0)))
    w = simulated_windows(memo)["epsilon_per_window"]
    per_rotation = memo.guarantee().per_rotation
    assert_close(w["5m"], 2 * per_rotation, 1e-12)     # a 5 minute window meets 2 periods
    assert_close(w["24h"], 25 * per_rotation, 1e-12)
    assert w["all"] is None
    assert simulated_windows(RRIndependent(DOM, epsilon=1.0))["epsilon_per_window"]["1h"] is None


def test_collections_listing_states_what_a_device_spends(capsys):
    from ldpstream.agents.serve.web import collection_info
    from ldpstream.query import print_collections

    memo = {"memoize": {"rotation_s": 86400, "instantaneous_epsilon": 2.0}}
    coll = parse_config(collection(params=memo, reports_per_day=1440, max_epsilon_per_day=4.0,
                                   windows=["5m", "all"])).collections["c"]
    info = collection_info(coll, coll.mechanism(), 10)
    assert info["over_time"]["counted_by"] == "device"
    print_collections({"collections": [info]})
    out = capsys.readouterr().out
    assert "c: counts devices (each once per window, at its latest report)" in out
    assert "c: ε per device at 1440 reports/day: 5m 4, day 4" in out
