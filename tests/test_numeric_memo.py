"""Memoized numeric reports (docs/numeric.md "Memoization"): α-point rounding [Ding et al.,
NeurIPS 2017, "Collecting Telemetry Data Privately", §3] then one permanent response per rounded
value and rotation period. The ε per report, per rotation and per device per day are computed
from the channels; a device's α is fixed by its id, so a reading that wanders inside its
rounding interval keeps its memo; over a fleet the rounding is unbiased and the permanent
responses follow the channel the server inverts; repeated reports of a device leave the mean
unbiased."""
from __future__ import annotations

import numpy as np
import pytest
from memo_helpers import NUMERIC_DOMAIN, NUMERIC_GRID, assert_unbiased, memoized_estimates, memoized_numeric
from scipy.stats import chisquare

from ldpstream.estimators.families.numeric import (
    ALPHA_POINTS,
    alpha_round,
    alpha_seed,
    device_alpha,
    rounding_points,
)
from ldpstream.estimators.kernels import numeric as nm
from ldpstream.estimators.mechanism import ParamError, from_state, mechanism_class
from ldpstream.estimators.stream.longitudinal import periods_per_window

pytestmark = pytest.mark.core

G, DOM = NUMERIC_GRID, NUMERIC_DOMAIN


def memoized(eps: float = 1.0, **params):
    return memoized_numeric(eps, **params)


def test_epsilon_per_report_rotation_and_day_come_from_the_channels():
    mech = memoized(1.0)
    g = mech.guarantee()
    eps = [nm.epsilon(mech.channel(j)) for j in range(2)]
    assert eps == pytest.approx([1.0, 1.0], rel=1e-9)     # rounding keeps the attribute's ε
    assert g.memoized and g.per_report == pytest.approx(sum(eps), rel=1e-12)
    assert g.per_rotation == pytest.approx(sum(eps), rel=1e-12)
    assert g.per_day == pytest.approx(sum(eps) * periods_per_window(86400, 86400))   # 4
    assert mech.memoization() is not None and mech.memoization().rule.rotation_s == 86400
    back = from_state(mech.state())
    assert back.state() == mech.state() and back.alpha_points == ALPHA_POINTS
    assert mechanism_class("sw-hm").from_config(DOM, None, epsilon=1.0).guarantee().per_day \
        is None                                              # not memoized: no per-day cap
    with pytest.raises(ParamError) as exc:
        memoized(1.0, memoize={"instantaneous_epsilon": 2.0})
    assert exc.value.field == "memoize.instantaneous_epsilon"
    with pytest.raises(ParamError) as exc:
        mechanism_class("sw-hm").from_config(DOM, {"alpha_points": 8}, epsilon=1.0)
    assert exc.value.field == "alpha_points"


def test_a_device_keeps_its_rounded_value_while_its_reading_wanders_and_the_fleet_is_unbiased():
    """A device's α comes from its id: its readings rounded to 16 intervals of the range. A
    battery reading wandering ±1 % around 60 % over a day (96 readings) visits 6 grid values
    but at most 2 rounded ones (one memo each, ε per memo; on average 1.3 over 1,000 devices:
    those whose α-point falls inside the wander see both); over 20,000 devices the α are
    uniform and the rounding unbiased (the mean rounded value of one reading within 0.5 % of
    an interval of it); a rounding point rounds to itself."""
    mech = memoized(1.0)
    pts = rounding_points(G, ALPHA_POINTS)
    assert len(pts) == ALPHA_POINTS + 1 and pts[0] == 0 and pts[-1] == G - 1
    rng = np.random.default_rng(5)
    ids = np.arange(1, 1001, dtype=np.uint64)
    readings = 60 + rng.uniform(-1, 1, size=(96, 1))
    day = np.stack([np.zeros(96), readings[:, 0]], axis=1)
    grid, _ = mech.encode(day)
    distinct_grid = len(np.unique(grid[:, 1]))
    per_device = [len(np.unique(mech.device_records(grid, np.full(96, d, np.uint64))[:, 1]))
                  for d in ids]
    assert distinct_grid >= 5 and max(per_device) <= 2
    assert np.mean(per_device) < 1.5, np.mean(per_device)
    fleet = np.arange(20_000, dtype=np.uint64)
    alpha = device_alpha(fleet, alpha_seed("battery"))
    assert abs(alpha.mean() - 0.5) < 0.01 and abs(alpha.std() - 12 ** -0.5) < 0.01
    assert abs(np.corrcoef(alpha, device_alpha(fleet, alpha_seed("fw")))[0, 1]) < 0.03
    x = np.full(len(fleet), 150)                     # between the points 144 and 160
    rounded = alpha_round(x, pts, alpha)
    assert set(rounded.tolist()) == {144, 160}
    assert abs(rounded.mean() - 150) < 0.005 * 16
    assert np.array_equal(alpha_round(pts, pts, np.full(len(pts), 0.999)), pts)


def test_permanent_responses_follow_the_channel_the_server_inverts():
    """Over 30,000 devices holding the same reading (between two rounding points), the
    permanent responses (each device's α, then the channels' samplers) follow the attribute's
    channel row R·C the estimators invert (χ², seeded, p > 1e-4)."""
    mech = memoized(2.0)
    n = 30_000
    records = np.tile([[1, 150]], (n, 1))
    perm = mech.memoization().responses(records, np.arange(n, dtype=np.uint64), 0,
                                        np.random.default_rng(8))
    P = mech.channel(1)[150]
    seen = np.bincount(perm[:, 1], minlength=len(P))
    keep = P * n >= 5
    assert seen[P == 0].sum() == 0
    exp = np.append(P[keep] * n, P[~keep].sum() * n)[:keep.sum() + bool(P[~keep].sum() > 0)]
    obs = np.append(seen[keep], seen[~keep].sum())[:len(exp)]
    assert chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-4


def test_the_mean_stays_unbiased_with_repeated_memoized_reports():
    """5,000 devices of Beta(5, 2) batteries, each reporting its permanent response 3 times,
    30 seeds: the mean estimate's average is within 4 standard errors of the true mean of the
    readings on the grid (the rounding adds variance, not bias)."""
    mech = memoized(1.0)
    rng = np.random.default_rng(2)
    vals = np.stack([rng.integers(0, 3, 5_000), 100 * rng.beta(5, 2, 5_000)], axis=1)
    pop, _ = mech.encode(vals)
    ests = memoized_estimates(mech, pop, 3, 30, 11,
                              lambda c: [mech.estimate(c, ("battery",), "mean").extra["mean"]],
                              [("battery",)])
    assert_unbiased(ests, np.array([(pop[:, 1] / (G - 1) * 100).mean()]))
