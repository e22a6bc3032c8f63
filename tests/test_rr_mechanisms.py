"""The RR mechanisms (rr-ind, rr-joint, rr-clusters) through the Mechanism interface."""
import json
import time

import numpy as np
import pytest
from scipy import stats
from tolerance import close

from ldpstream.estimators.families.rr import RRClusters, RRIndependent, RRJoint
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.kernels.joint_grr import joint_channel
from ldpstream.estimators.mechanism import MECHANISMS, from_state, marginal_key

pytestmark = pytest.mark.core

DOM = Domain(("a", "b", "c", "d"), (3, 4, 2, 5),
             (("a0", "a1", "a2"), ("b0", "b1", "b2", "b3"), ("c0", "c1"),
              ("d0", "d1", "d2", "d3", "d4")))


def _records(n=40_000, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 3, n)
    b = np.where(rng.random(n) < 0.7, a, rng.integers(0, 4, n))  # b depends on a
    c = rng.integers(0, 2, n)
    d = rng.choice(5, n, p=[.4, .3, .15, .1, .05])
    return np.stack([a, b, c, d], axis=1).astype(np.uint8)


def _hist(records, cols, shape):
    h, _ = np.histogramdd(records[:, cols].astype(float),
                          bins=[np.arange(s + 1) - 0.5 for s in shape])
    return h


def _true(records, cols, shape):
    return _hist(records, cols, shape) / len(records)


def test_registered_and_epsilon_computed():
    assert {"rr-ind", "rr-joint", "rr-clusters"} <= set(MECHANISMS)
    m = RRIndependent(DOM, [0.5, 1.0, 1.5, 2.0])
    assert m.epsilon == pytest.approx(5.0)
    custom = [ch.warner(0.5, 3), ch.grr(1.0, 4), ch.grr(1.0, 2), ch.warner(0.7, 5)]
    mc = RRIndependent(DOM, channels=custom)
    assert mc.epsilon == pytest.approx(ch.epsilon_of_report(custom))
    j = RRJoint(DOM, [0.5, 1.0, 1.5, 2.0])
    assert j.epsilon == pytest.approx(5.0)
    assert ch.epsilon(joint_channel(5.0, DOM.shape)) == pytest.approx(j.epsilon)
    c = RRClusters(DOM, [("a", "b"), ("c",), ("d",)], 1.0)
    assert c.cluster_eps == [2.0, 1.0, 1.0] and c.epsilon == pytest.approx(4.0)
    single = RRClusters(DOM, epsilon=1.0, version=1)  # before any clustering round
    assert single.clusters == [("a",), ("b",), ("c",), ("d",)] and single.epsilon == 4.0
    with pytest.raises(ValueError):
        RRIndependent(DOM, 0.0)
    with pytest.raises(ValueError):
        RRClusters(DOM, [("a", "b"), ("c",)], 1.0)  # not a partition


@pytest.mark.parametrize("mech", [
    RRIndependent(DOM, [0.5, 1.0, 1.5, 2.0], version=3),
    RRIndependent(DOM, channels=[ch.warner(0.5, 3), ch.grr(1.0, 4), ch.grr(1.0, 2),
                                 ch.warner(0.7, 5)]),
    RRJoint(DOM, 1.0, version=1),
    RRClusters(DOM, [("b", "a"), ("d",), ("c",)], [1.0, 2.0, 0.5, 1.0], version=2,
               max_cells=20, min_dependence=0.1),
], ids=["rr-ind", "rr-ind-custom", "rr-joint", "rr-clusters"])
def test_state_round_trip(mech):
    st = json.loads(json.dumps(mech.state()))
    assert st["mechanism"] == mech.name and st["version"] == mech.version
    assert st["domain"]["attrs"] == list(DOM.attrs) and st["domain"]["labels"][0] == ["a0", "a1", "a2"]
    back = from_state(st)
    assert type(back) is type(mech) and back.state() == mech.state()
    assert back.domain == mech.domain and back.domain.labels == DOM.labels
    assert back.epsilon == pytest.approx(mech.epsilon)
    rng1, rng2 = np.random.default_rng(4), np.random.default_rng(4)
    recs = _records(500)
    assert np.array_equal(mech.randomize(recs, rng1), back.randomize(recs, rng2))


@pytest.mark.parametrize("custom", [False, True])
def test_rr_ind_randomize_matches_channel(custom):
    chans = ([ch.warner(0.5, 3), ch.grr(1.0, 4), ch.grr(1.0, 2), ch.warner(0.7, 5)] if custom
             else [ch.grr(e, d) for e, d in zip([0.5, 1.0, 1.5, 2.0], DOM.shape)])
    m = RRIndependent(DOM, channels=chans)
    n = 100_000
    true = np.array([2, 1, 0, 3], dtype=np.uint8)
    y = m.randomize(np.tile(true, (n, 1)), np.random.default_rng(7))
    assert y.dtype == np.uint8 and y.shape == (n, 4)
    for j, P in enumerate(chans):
        freq = np.bincount(y[:, j], minlength=DOM.shape[j])
        assert stats.chisquare(freq, P[true[j]] * n).pvalue > 1e-4, j


def test_tensor_counts_equal_histogramdd():
    m = RRIndependent(DOM, 1.0)
    recs = _records(5000)
    y = m.randomize(recs, np.random.default_rng(1))
    specs = m.tensors([("d", "a"), ("b", "c", "a"), ("d", "a")])
    assert [s.key for s in specs] == [marginal_key(("d", "a")), marginal_key(("b", "c", "a"))]
    counts = m.count(y, specs)
    for s in specs:
        assert s.axes == tuple(DOM.attrs[c] for c in s.columns)
        assert counts[s.key].shape == s.shape
        assert np.array_equal(counts[s.key], _hist(y, list(s.columns), s.shape))


def test_rr_ind_randomize_is_fast():
    dom = Domain(tuple("abcdefgh"), (9, 16, 7, 15, 6, 5, 2, 2))
    m = RRIndependent(dom, 1.0)
    rng = np.random.default_rng(0)
    recs = (rng.random((1_000_000, 8)) * np.array(dom.shape)).astype(np.uint8)
    best = np.inf
    for _ in range(3):
        t = time.perf_counter()
        m.randomize(recs, rng)
        best = min(best, time.perf_counter() - t)
    assert best < 1.0, best


RRIND_METHODS = [mth for mth in RRIndependent.estimators if mth != "ibu"]


@pytest.mark.parametrize("mech,methods", [
    (RRIndependent(DOM, 2.0), RRIND_METHODS),
    (RRJoint(DOM, 2.0), list(RRJoint.estimators)),
    (RRClusters(DOM, [("a", "b"), ("c",), ("d",)], 2.0), list(RRClusters.estimators)),
], ids=["rr-ind", "rr-joint", "rr-clusters"])
def test_superset_tensor_equals_exact_tensor(mech, methods):
    recs = _records(20_000)
    y = mech.randomize(recs, np.random.default_rng(2))
    attrs = ("b", "a", "d")
    exact = mech.count(y, mech.tensors([attrs]))
    sup = mech.count(y, mech.tensors([("a", "b", "c", "d")]))
    for method in methods:
        e1 = mech.estimate(exact, attrs, method)
        e2 = mech.estimate(sup, attrs, method)
        assert e1.factor.domain.attrs == attrs and e1.factor.values.shape == (4, 3, 5)
        assert close(e1.factor.values, e2.factor.values, rel=1e-12), method
        assert e1.n == 20_000 and e1.epsilon == pytest.approx(mech.epsilon)
        assert e1.method == method
    with pytest.raises(KeyError):
        mech.estimate(exact, ("c",), methods[0])
    with pytest.raises(ValueError):
        mech.estimate(exact, attrs, "no-such-method")


def test_rr_ind_estimates_are_accurate_and_labelled():
    recs = _records(60_000, seed=5)
    m = RRIndependent(DOM, 3.0)
    y = m.randomize(recs, np.random.default_rng(3))
    attrs = ("a", "b")
    counts = m.count(y, m.tensors([attrs]))
    truth = _true(recs, [0, 1], (3, 4))
    c = m.estimate(counts, attrs, "castell")
    assert c.factor.values.sum() == pytest.approx(1.0)
    tvd = 0.5 * np.abs(c.factor.values - truth).sum()
    assert tvd < 3 * c.error_bound and c.error_bound < 0.05
    tv = lambda e: 0.5 * np.abs(e.factor.values - truth).sum()  # noqa: E731
    for method in ("truncated", "hybrid-auto", "rr-adjustment"):
        e = m.estimate(counts, attrs, method, proper="clip")
        assert np.all(e.factor.values >= 0) and e.factor.values.sum() == pytest.approx(1.0)
    for method in ("truncated", "hybrid-auto"):
        assert tv(m.estimate(counts, attrs, method)) < 0.06, method
    ind = m.estimate(counts, attrs, "rr-independent")
    assert tv(ind) > 0.15  # a, b are dependent: independence is badly biased
    assert ind.error_bound >= tv(ind)   # castell's bound + its distance to castell covers it
    assert m.estimate(counts, attrs, "hybrid-auto").extra["chosen"] == "castell"
    adj = m.estimate(counts, attrs, "rr-adjustment")
    assert adj.converged and adj.iterations >= 1
    # Alg. 2 fixes the marginals but keeps the (attenuated) dependence of the randomized data:
    # better than independence, worse than inversion
    assert tv(c) < tv(adj) < tv(ind)
    assert close(adj.factor.values.sum(axis=1), m.estimate(counts, ("a",), "castell")
                       .factor.values.clip(0) / m.estimate(counts, ("a",), "castell")
                       .factor.values.clip(0).sum(), rel=1e-8)


def test_rr_ind_ibu():
    recs = _records(30_000, seed=6)
    m = RRIndependent(DOM, 1.0)
    y = m.randomize(recs, np.random.default_rng(4))
    attrs = ("a", "b", "d")
    counts = m.count(y, m.tensors([attrs]))
    e = m.estimate(counts, attrs, "ibu")
    assert e.converged and e.iterations >= 1 and e.error_bound is not None
    assert np.all(e.factor.values >= 0) and e.factor.values.sum() == pytest.approx(1.0)
    truth = _true(recs, [0, 1, 3], (3, 4, 5))
    tv = lambda v: 0.5 * np.abs(v - truth).sum()  # noqa: E731
    assert tv(e.factor.values) < tv(m.estimate(counts, attrs, "castell").factor.values)
    assert np.allclose(m.estimate(m.count(y, m.tensors([DOM.attrs])), attrs, "ibu").factor.values,
                       e.factor.values)


def test_rr_joint_and_clusters_estimates():
    recs = _records(60_000, seed=8)
    truth = _true(recs, [0, 1], (3, 4))
    rng = np.random.default_rng(9)
    j = RRJoint(DOM, 2.0)   # ε_C = 8 over 120 cells
    cj = j.count(j.randomize(recs, rng), j.tensors([("a", "b")]))
    for method in RRJoint.estimators:
        e = j.estimate(cj, ("a", "b"), method)
        assert 0.5 * np.abs(e.factor.values - truth).sum() < 0.03, method
    # RR-Clusters from an RR-Independent round: the dependent pair (a, b) is clustered
    ind = RRIndependent(DOM, 1.0)
    y0 = ind.randomize(recs[:10_000], rng)
    # RR at ε = 1 attenuates V(a, b) from 0.73 to ≈ 0.08; T_d is on the randomized scale
    c = RRClusters.from_randomized(DOM, y0, 2.0, max_cells=50, min_dependence=0.05)
    assert c.clusters == [("a", "b"), ("c",), ("d",)]
    assert c.epsilon == pytest.approx(8.0) and c.cluster_eps == [4.0, 2.0, 2.0]
    counts = c.count(c.randomize(recs[10_000:], rng), c.tensors([("a", "b", "d")]))
    t3 = _true(recs[10_000:], [0, 1, 3], (3, 4, 5))
    tvds = {}
    for method in RRClusters.estimators:
        e = c.estimate(counts, ("a", "b", "d"), method, proper="clip")
        assert e.factor.values.sum() == pytest.approx(1.0)
        tvds[method] = 0.5 * np.abs(e.factor.values - t3).sum()
    bound = c.estimate(counts, ("a", "b", "d"), "castell").error_bound
    assert tvds["castell"] < 2 * bound
    # d is independent of (a, b): the [MDRR] cluster-independence estimate is the best here
    assert tvds["rr-independent"] < min(tvds["castell"], 0.05)
    assert max(tvds.values()) < 0.1, tvds
    # the cluster's randomized cells follow its joint GRR (χ² on one true cell)
    n = 80_000
    y = c.randomize(np.tile(np.array([1, 2, 0, 4], np.uint8), (n, 1)), rng)
    freq = np.bincount(y[:, 0].astype(int) * 4 + y[:, 1], minlength=12)
    assert stats.chisquare(freq, joint_channel(4.0, 12)[1 * 4 + 2] * n).pvalue > 1e-4


@pytest.mark.parametrize("mech", [RRIndependent(DOM, 1.0), RRJoint(DOM, 1.0),
                                  RRClusters(DOM, epsilon=1.0)], ids=lambda m: m.name)
def test_randomize_rejects_out_of_domain_records(mech):
    bad = np.array([[0, 0, 2, 0]], dtype=np.uint8)  # c has 2 categories
    with pytest.raises(ValueError, match="'c'"):
        mech.randomize(bad, np.random.default_rng(0))
    with pytest.raises(ValueError):
        mech.randomize(np.array([[0, -1, 0, 0]]), np.random.default_rng(0))


def _dependent(n, d, w, rho, rng):
    """w attributes over d values: each copies a shared uniform value with probability rho."""
    x = rng.integers(0, d, n)
    return np.stack([np.where(rng.random(n) < rho, x, rng.integers(0, d, n))
                     for _ in range(w)], axis=1).astype(np.uint8)


def test_hybrid_error_bound_follows_the_chosen_estimate():
    """When a hybrid picks the biased RR-Independent product, its error bound must be the
    product's (castell's bound plus the product's TVD to castell), not castell's alone."""
    from ldpstream.estimators.kernels.bounds import AT_LEAST, product_channel_bound
    from ldpstream.estimators.kernels.castell import castell
    dom = Domain(("a", "b", "c"), (4, 4, 4))
    m = RRIndependent(dom, 2.0)
    rng = np.random.default_rng(0)
    recs = _dependent(500, 4, 3, 1.0, rng)  # a = b = c: as far from independence as it gets
    counts = m.count(m.randomize(recs, rng), m.tensors([dom.attrs]))
    c = counts[marginal_key(dom.attrs)].astype(float)
    truth = _true(recs, [0, 1, 2], (4, 4, 4))
    e = m.estimate(counts, dom.attrs, "hybrid")
    assert e.extra["chosen"] == "rr-independent"  # Theorem 5/6 rule at n = 500
    tv = 0.5 * np.abs(e.factor.values - truth).sum()
    castell_bound = product_channel_bound(c, m.channels).tvd
    assert castell_bound < 0.6 and tv > 0.9  # castell's bound would understate the error
    gap = 0.5 * np.abs(e.factor.values - castell(c, m.channels)).sum()
    assert e.error_bound == pytest.approx(min(1.0, castell_bound + gap), rel=1e-12)
    assert e.error_bound >= tv and e.bound is not None and e.bound.coverage == AT_LEAST
    assert e.extra["error_bound_of"].startswith("rr-independent")
    # hybrid-auto choosing castell keeps castell's bound
    ca = m.estimate(counts, dom.attrs, "hybrid-auto")
    assert ca.extra["chosen"] == "castell" and ca.error_bound == pytest.approx(castell_bound)
    assert ca.extra["error_bound_of"] == "castell"


def test_hybrid_auto_product_bound_covers_every_run():
    """Seeded (40 runs, mildly dependent data, ε = 1): whenever hybrid-auto picks the product,
    its bound (castell's plus the distance to castell) covers the TVD actually made. It is wide
    here (castell is noisy, which is why the product was picked): no bound that holds whatever
    the truth can be tighter than the unbiased estimate's noise."""
    dom = Domain(("a", "b", "c"), (4, 4, 4))
    m = RRIndependent(dom, 1.0)
    picked = 0
    for r in range(40):
        rng = np.random.default_rng([r, 7])
        recs = _dependent(5000, 4, 3, 0.3, rng)
        e = m.estimate(m.count(m.randomize(recs, rng), m.tensors([dom.attrs])), dom.attrs,
                       "hybrid-auto")
        if e.extra["chosen"] != "rr-independent":
            continue
        picked += 1
        assert 0.5 * np.abs(e.factor.values - _true(recs, [0, 1, 2], (4, 4, 4))).sum() \
            <= e.error_bound
    assert picked >= 30
