"""Square Wave's half-width b as a parameter of sw-hm (docs/numeric.md "The distribution: Square
Wave and EMS"): the privacy audit of the channel at the default b (ε from the matrix equals the
declared ε; the sampler and the device's ``wave`` step draw from that matrix), the W1 it buys at
large ε over Li et al.'s b, and states from before the parameter loading exactly as they did."""
from __future__ import annotations

import math

import numpy as np
import pytest
from test_numeric import _chi2_rows

from ldpstream.estimators.families.numeric import Numeric, bound_bins, numeric_domain, sw_buckets
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels import device_program as dp
from ldpstream.estimators.kernels import numeric as nm
from ldpstream.estimators.mechanism import ParamError, from_state, mechanism_class

pytestmark = pytest.mark.core

EPS = (0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0)


def test_default_half_width_is_li_at_small_eps_and_wider_above() -> None:
    for eps in (0.5, 1.0, 2.0):
        assert nm.sw_half_width(eps) == nm.sw_b(eps)
    for eps in (3.0, 4.0, 8.0):
        assert nm.sw_half_width(eps) > nm.sw_b(eps)
        assert math.isclose(nm.sw_half_width(eps), nm.SW_B_FLOOR * math.exp(-eps / 3),
                            rel_tol=1e-12)


@pytest.mark.parametrize("eps", EPS)
def test_default_window_channel_epsilon_and_sampler(eps: float) -> None:
    """The channel at the default b attains exactly the declared ε; the direct sampler and the
    device's wave step (its parameters alone, :func:`~.device_program.wave_channel`) follow it."""
    G = 65
    b = nm.sw_half_width(eps)
    k = sw_buckets(eps, b)
    S = nm.sw_channel(eps, nm.grid_v(G), k, b)
    assert math.isclose(ch.epsilon(S), eps, rel_tol=1e-9)
    mech = Numeric(numeric_domain(["v"], G), {"v": (0.0, 1.0)}, eps)
    assert mech.sw_bs == [b] and mech.buckets == [k]
    assert math.isclose(ch.epsilon(mech.channel(0)), eps, rel_tol=1e-9)
    for t in mech.layout(0):
        w = dp.wave_step(0, 0, t.offset, t.cells, **nm.wave(t, eps))  # type: ignore[arg-type]
        P = dp.wave_channel(w, G)
        np.testing.assert_allclose(P, nm.task_channel(t, eps, G), rtol=1e-9, atol=1e-12)
        assert math.isclose(dp.step_epsilon(w, [G]), eps, rel_tol=1e-9)
    _chi2_rows(lambda x, r: nm.sample_sw(eps, nm.grid_v(G)[x], k, r, b), S, [0, 9, 32, 50, 64],
               60_000, 3)


def test_wider_window_lowers_w1_at_eps_8() -> None:
    """Beta(5, 2), n = 50,000, ε = 8, 3 seeded runs each: the default b's W1 is at most 0.7 ×
    Li et al.'s b's (measured 3.9e-4 against 8.9e-4, 0.43 ×; docs/numeric.md)."""
    rng = np.random.default_rng(2024)
    v = rng.beta(5, 2, size=50_000)
    w1 = {}
    for label, b in (("li", nm.sw_b(8.0)), ("default", None)):
        mech = Numeric(numeric_domain(["v"]), {"v": (0.0, 1.0)}, 8.0, mean_share=0.0, sw_b=b)
        idx, _ = mech.encode(v[:, None])
        r = np.random.default_rng(7)
        runs = []
        for _ in range(3):
            counts = mech.count(mech.randomize(idx, r), mech.tensors([("v",)]))
            est = mech.estimate(counts, ("v",), "distribution")
            runs.append(nm.w1_samples(np.asarray(est.extra["histogram"]), v))
        w1[label] = float(np.mean(runs))
    assert w1["default"] <= 0.7 * w1["li"], w1


def test_state_without_half_width_loads_as_before() -> None:
    """A state stored before b was a parameter (no ``sw_b``) is Li et al.'s b: the same channel,
    buckets, bounds' bins and draws as a collection made with that b."""
    dom = numeric_domain(["a", "b"], 65)
    for eps in (1.0, 4.0, 8.0):
        old = Numeric(dom, {"a": (0, 1), "b": (10, 20)}, eps, mean="pm",
                      sw_b=nm.sw_b(eps))
        state = old.state()
        assert state["sw_b"] == [nm.sw_b(eps)] * 2
        del state["sw_b"]
        assert state["buckets"] == [sw_buckets(eps)] * 2   # what the old default gave
        back = from_state(state)
        assert back.sw_bs == [nm.sw_b(eps)] * 2
        assert back.buckets == old.buckets
        for j in range(2):
            assert np.array_equal(back.channel(j), old.channel(j))
        assert bound_bins(eps, 128, back.buckets[0], back.sw_bs[0]) == bound_bins(
            eps, 128, sw_buckets(eps))
        recs = np.random.default_rng(0).integers(0, 65, size=(400, 2))
        assert np.array_equal(back.randomize(recs, np.random.default_rng(5)),
                              old.randomize(recs, np.random.default_rng(5)))
        # and a state of today's default keeps its b
        new = Numeric(dom, {"a": (0, 1), "b": (10, 20)}, eps)
        again = from_state(new.state())
        assert again.sw_bs == new.sw_bs == [nm.sw_half_width(eps)] * 2
        assert np.array_equal(again.channel(0), new.channel(0))


def test_half_width_param() -> None:
    cls = mechanism_class("sw-hm")
    dom = numeric_domain(["age"], 33)
    mech = cls.from_config(dom, {"ranges": {"age": [0, 1]}, "sw_b": 0.05}, epsilon=4.0)
    assert mech.sw_bs == [0.05] and mech.buckets == [sw_buckets(4.0, 0.05)]
    assert math.isclose(ch.epsilon(mech.channel(0)), 4.0, rel_tol=1e-9)
    li = cls.from_config(dom, {"ranges": {"age": [0, 1]}, "sw_b": "li"}, epsilon=4.0)
    assert li.sw_bs == [nm.sw_b(4.0)] and li.buckets == [sw_buckets(4.0, nm.sw_b(4.0))]
    for bad, msg in ((0, "must be > 0"), (-0.1, "must be > 0"), (0.6, "must be <= 0.5"),
                     ("wide", "must be a number in \\(0, 0.5\\] or li"), (True, "must be a finite number")):
        with pytest.raises(ParamError, match=f"^sw_b: {msg}") as err:
            cls.from_config(dom, {"ranges": {"age": [0, 1]}, "sw_b": bad}, epsilon=4.0)
        assert err.value.field == "sw_b"


def test_bins_keep_the_values_masses() -> None:
    """The bins EMS fits hold the values' masses: a grid point on a bin edge counts half in each
    bin (:func:`~.numeric.grid_bin_weights`). The exact grid counts of a Beta(5, 2) sample put
    into 128 bins this way are within 1.5e-4 of the sample in W1 (measured 9.6e-5; each point
    wholly in one bin, as before, gave 4.9e-4: a shift of half a grid step at every edge)."""
    v = np.random.default_rng(1).beta(5, 2, size=50_000)
    G = nm.DEFAULT_GRID
    idx, _ = nm.quantize(v, 0.0, 1.0, G)
    c = np.bincount(idx, minlength=G) / len(v)
    for d in (64, 128, 512):
        W = nm.grid_bin_weights(G, d)
        np.testing.assert_allclose(W.sum(axis=1), 1.0, rtol=1e-12)
        assert (W.sum(axis=0) > 0).all()
        assert nm.w1_samples(c @ W, v) < 1.5e-4 * 128 / min(d, 128)
        x = np.random.default_rng(d).dirichlet(np.ones(d))
        assert math.isclose(nm.spread_on_grid(x, G).sum(), 1.0, rel_tol=1e-12)
        assert math.isclose(float(nm.spread_on_grid(x, G) @ nm.grid_v(G)),
                            float(x @ nm.grid_mid(d)), rel_tol=1e-3)
    # a point on an edge: half in each bin
    W = nm.grid_bin_weights(9, 2)
    np.testing.assert_allclose(W[4], [0.5, 0.5], rtol=1e-12)


def test_counts_of_another_channel_with_the_same_shape_are_kept_apart() -> None:
    """At ε = 4 Li et al.'s window and the wider one both give 128 buckets: the same tensor
    shapes, other channels. The tensors say so (``channel``), so their counts go to other keys
    (the layout id); the channels of earlier versions (HM, Li et al.'s b) say nothing, so the
    counts of a collection that pins them keep the keys they had."""
    from ldpstream.agents.store.layout import Layout

    cls = mechanism_class("sw-hm")
    dom = numeric_domain(["fw", "age"], 33)
    marg = [("age",), ("fw", "age")]
    wide = cls.from_config(dom, {"ranges": {"age": [0, 1]}}, epsilon=4.0)
    li = cls.from_config(dom, {"ranges": {"age": [0, 1]}, "sw_b": "li"}, epsilon=4.0)
    legacy = cls.from_config(dom, {"ranges": {"age": [0, 1]}, "sw_b": "li", "mean": "hm"},
                             epsilon=4.0)
    assert wide.buckets == li.buckets == [128, 128]
    t_wide, t_li, t_legacy = (m.tensors(marg) for m in (wide, li, legacy))
    assert [t.shape for t in t_wide] == [t.shape for t in t_li] != [t.shape for t in t_legacy]
    assert all(t.channel for t in t_wide) and all(t.channel for t in t_li)
    assert all(t.channel == "" for t in t_legacy)
    ids = {Layout.of(0, t).id for t in (t_wide, t_li, t_legacy)}
    assert len(ids) == 3
    # a stored state tags its tensors as the collection it came from
    assert from_state(wide.state()).tensors(marg) == t_wide
    old = {k: v for k, v in legacy.state().items()
           if k not in ("mean_points", "mean_mechanisms", "sw_b")}
    assert from_state(old).tensors(marg) == t_legacy
