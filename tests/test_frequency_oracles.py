"""Frequency oracles (GRR, OUE, OLH): exact variances of Wang et al. 2017, the variance rule, the
privacy audit (declared ε = ε of the channel; sampled reports follow the channel) and
unbiasedness by seeded Monte Carlo."""
from __future__ import annotations

import math

import numpy as np
import pytest
from tolerance import assert_close

from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.oracles import frequency_oracles as fo

pytestmark = pytest.mark.core


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 4.0, 8.0])
@pytest.mark.parametrize("d", [2, 7, 40, 300])
def test_wang_variances_are_the_oracles_variances(eps, d):
    e = math.exp(eps)
    n = 1000.0
    assert fo.GRR(eps, d).variance(n)[0] == pytest.approx((e + d - 2) / (n * (e - 1) ** 2),
                                                          rel=1e-12)
    assert fo.OUE(eps, d).variance(n)[0] == pytest.approx(4 * e / (n * (e - 1) ** 2), rel=1e-12)
    olh = fo.OLH(eps, d)
    assert olh.variance(n)[0] == pytest.approx(fo.wang_variance("olh", eps, d, n), rel=1e-12)
    # prime g: within 3% of the continuous optimum (= OUE's variance)
    assert olh.variance(n)[0] <= 1.03 * fo.OUE(eps, d).variance(n)[0]


@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 4.0, 8.0])
def test_variance_rule_grr_below_3e_eps_plus_2(eps):
    for d in [2, 3, 5, 10, 30, 100, 300, 1000]:
        got = fo.choose(eps, d, allowed=("grr", "oue")).name
        assert got == ("grr" if d < 3 * math.exp(eps) + 2 else "oue"), (eps, d)
        assert fo.choose(eps, d, allowed=("grr", "olh")).name in ("grr", "olh")


def test_unknown_oracle_and_bad_parameters_are_named():
    with pytest.raises(ValueError, match="unknown frequency oracle 'rappor'"):
        fo.make("rappor", 1.0, 4)
    with pytest.raises(ValueError, match="epsilon"):
        fo.make("grr", -1.0, 4)
    with pytest.raises(ValueError, match="domain size"):
        fo.make("oue", 1.0, 1)
    with pytest.raises(ValueError, match="prime"):
        fo.OLH(1.0, 10, g=4)


@pytest.mark.parametrize("oracle", [fo.GRR(1.3, 5), fo.OUE(1.3, 5), fo.OLH(1.3, 5),
                                    fo.OLH(2.0, 11, g=3), fo.GRR(6.0, 3), fo.OUE(0.4, 3)])
def test_privacy_audit_declared_epsilon_is_the_channels(oracle):
    P = oracle.channel()
    assert P.shape[0] == oracle.d
    assert_close(P.sum(axis=1), 1.0, rel=1e-12)
    assert ch.epsilon(P) == pytest.approx(oracle.eps, rel=1e-9)
    assert oracle.epsilon == pytest.approx(ch.epsilon(P), rel=1e-9)
    # support probabilities are exactly p*, q* for every value
    if oracle.name != "oue":
        codes = np.arange(P.shape[1])
        sup = np.stack([oracle.supports(np.array([c])) for c in codes])  # (codes, d)
    else:
        bits = (np.arange(P.shape[1])[:, None] >> np.arange(oracle.d)[None, :]) & 1
        sup = bits
    pr_support = P @ sup  # [x, v] = Pr[v ∈ S(o) | x]
    assert_close(np.diag(pr_support), oracle.p_star, rel=1e-12)
    off = pr_support[~np.eye(oracle.d, dtype=bool)]
    assert_close(off, oracle.q_star, rel=1e-12)


@pytest.mark.parametrize("oracle", [fo.GRR(1.0, 4), fo.OUE(1.0, 4), fo.OLH(1.0, 4, g=3)])
def test_sampled_reports_follow_the_channel(oracle):
    rng = np.random.default_rng(7)
    P = oracle.channel()
    n = 40_000
    for x in range(oracle.d):
        rep = oracle.randomize(np.full(n, x), rng)
        freq = np.bincount(oracle.report_index(rep), minlength=P.shape[1]) / n
        # every output within 5 binomial standard deviations of its channel probability
        sd = np.sqrt(P[x] * (1 - P[x]) / n)
        assert np.all(np.abs(freq - P[x]) <= 5 * sd + 1e-12), (oracle.name, x)


def test_olh_hash_family_is_exactly_universal():
    o = fo.OLH(2.0, 30, g=5)
    h = o.hash(np.arange(o.seeds), np.arange(o.d))   # (seeds, d)
    coll = (h[:, :, None] == h[:, None, :]).mean(axis=0)
    off = coll[~np.eye(o.d, dtype=bool)]
    assert np.all(off == 1 / o.g)


@pytest.mark.parametrize("oracle", [fo.GRR(1.0, 6), fo.OUE(1.0, 6), fo.OLH(1.0, 6),
                                    fo.OLH(3.0, 40)])
def test_unbiased_by_seeded_monte_carlo(oracle):
    """R = 300 runs on one fixed dataset: the mean estimate is within 4 standard errors of the
    truth in every cell, and the empirical variance within 25% of the analytic one."""
    rng = np.random.default_rng(11)
    d, n, R = oracle.d, 2000, 300
    f = rng.dirichlet(np.ones(d))
    x = np.repeat(np.arange(d), np.round(f * n).astype(int))
    n = len(x)
    f = np.bincount(x, minlength=d) / n
    est = np.stack([oracle.estimate(oracle.supports(oracle.randomize(x, rng)), n)
                    for _ in range(R)])
    var = oracle.variance(n, f)
    se = np.sqrt(var / R)
    assert np.all(np.abs(est.mean(axis=0) - f) <= 4 * se), oracle.name
    ratio = est.var(axis=0, ddof=1) / var
    assert np.all((ratio > 0.75) & (ratio < 1.25)), (oracle.name, ratio)
