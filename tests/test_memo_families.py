"""Memoization of the one-shot families other than partitioned (docs/mechanisms.md §8): rr-ind,
spl, rr-joint and rr-clusters memoize per attribute or per cluster, smp per (attribute sampled
for the device and period, value). For each, with and without
an instantaneous layer: the ε per report is the composed channel's and the ε per rotation the
permanent channels' (computed from the matrices the device program applies, rtol 1e-9); the
device program's sampled reports and the numpy randomizer's follow the composed channel (χ²,
seeded, p > 1e-4); unbiased with repeated reports per device (seeded Monte Carlo). Families
whose device side does not allow it refuse ``memoize`` naming the parameter."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from memo_helpers import assert_unbiased, memoized_estimates
from scipy.stats import chisquare

from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.mechanism import Mechanism, ParamError, from_state, mechanism_class
from ldpstream.estimators.stream.longitudinal import DAY_S, periods_per_window
from ldpstream.producers.draws import SplitMix64
from ldpstream.producers.program import Memo, Program, SelectMemo

pytestmark = pytest.mark.core

DOM = Domain(("a", "b", "c"), (2, 3, 4))
P_MIN = 1e-4
FAMILIES = [("rr-ind", {}), ("spl", {}), ("rr-joint", {}),
            ("rr-clusters", {"clusters": [["a", "c"], ["b"]]})]


def _mech(name: str, params: dict, inst: float | None) -> Mechanism:
    memo: dict = {"rotation_s": 600.0}
    if inst is not None:
        memo["instantaneous_epsilon"] = inst
    return mechanism_class(name).from_config(DOM, {**params, "memoize": memo}, epsilon=0.8)


def _grr_matrix(p: float, k: int) -> np.ndarray:
    return np.where(np.eye(k, dtype=bool), p, (1.0 - p) / (k - 1))


def _unit_channels(prog: Program) -> list[tuple[np.ndarray, np.ndarray]]:
    """(permanent, composed) matrix of every memo unit, from the description's steps."""
    assert isinstance(prog.memo, Memo)
    out = []
    for s in prog.memo.permanent:
        k = math.prod(s.shape)
        P = _grr_matrix(s.p, k)
        inst = [t for t in prog.steps if t.cols == s.cols]
        out.append((P, P @ _grr_matrix(inst[0].p, k) if inst else P))
    return out


@pytest.mark.parametrize("name,params", FAMILIES)
@pytest.mark.parametrize("inst", [None, 1.5])
def test_epsilon_per_report_and_rotation_come_from_the_channels(name, params, inst):
    m = _mech(name, params, inst)
    st = json.loads(json.dumps(m.device_state()))
    prog = Program(st["device"])
    units = _unit_channels(prog)
    per_report = sum(ch.epsilon(C) for _, C in units)
    per_rotation = sum(ch.epsilon(P) for P, _ in units)
    g = m.guarantee()
    assert m.memoization() is not None and g.memoized
    assert m.epsilon == pytest.approx(per_report, rel=1e-9)
    assert g.per_report == pytest.approx(per_report, rel=1e-9)
    assert g.per_rotation == pytest.approx(per_rotation, rel=1e-9)
    assert prog.epsilon == pytest.approx(per_rotation, rel=1e-9)
    assert list(prog.memo.epsilons) == pytest.approx(m.memoization().unit_epsilons(), rel=1e-9)
    assert g.per_day == pytest.approx(per_rotation * periods_per_window(DAY_S, 600.0), rel=1e-12)
    assert per_rotation == pytest.approx(3 * 0.8, rel=1e-9)   # ε per attribute × m
    back = from_state(st)
    assert back.guarantee() == g and back.epsilon == pytest.approx(m.epsilon, rel=1e-12)
    if inst is not None:
        assert per_report < per_rotation


def _cells(prog: Program, reports: np.ndarray) -> list[np.ndarray]:
    """Each unit's output cell of every report (mixed radix over the unit's columns)."""
    assert isinstance(prog.memo, Memo)
    return [np.ravel_multi_index(tuple(reports[:, c] for c in s.cols), s.shape)
            for s in prog.memo.permanent]


@pytest.mark.parametrize("name,params", FAMILIES)
def test_sampled_reports_follow_the_composed_channel(name, params):
    """Over many periods (a fresh memo each) one device's reports of record x are draws from
    the composed channel's row of x, unit by unit: the device program and the numpy
    randomizer (χ², p > 1e-4)."""
    m = _mech(name, params, 1.0)
    prog = Program(json.loads(json.dumps(m.device_program())))
    memo = prog.memo
    assert isinstance(memo, Memo)
    x = [1, 2, 3]
    n = 6000
    rng = SplitMix64(5)
    rows = []
    for period in range(n):
        keys = memo.keys(x, 0, period)
        perm = memo.permanent_record([memo.draw(k, rng) for k in keys])
        rows.append(prog.randomize(perm, rng))
    sdk = np.array(rows)
    gen = np.random.default_rng(6)
    mm = m.memoization()
    xs = np.tile([x], (n, 1))
    numpy_reports = np.asarray(mm.instantaneous(mm.responses(xs, np.arange(n), 0, gen), gen))
    for reports in (sdk, numpy_reports):
        for (_, cell), cells, (_, C) in zip(memo.keys(x, 0, 0), _cells(prog, reports),
                                           _unit_channels(prog)):
            obs = np.bincount(cells, minlength=len(C))
            assert chisquare(obs, n * C[cell]).pvalue > P_MIN, (name, cell)


@pytest.mark.parametrize("name,params,method", [("spl", {}, "unbiased"),
                                                ("rr-joint", {}, "castell")])
def test_unbiased_with_repeated_memoized_reports_per_device(name, params, method):
    """1,500 devices × 10 memoized reports (instantaneous layer on), 40 seeds: the mean
    estimate of a marginal is within 4 standard errors of the population's."""
    m = _mech(name, params, 1.0)
    rng0 = np.random.default_rng(31)
    n, reps, seeds = 1500, 10, 40
    pop = np.stack([rng0.integers(0, d, n) for d in DOM.shape], axis=1)
    pop[:, 1] = np.where(rng0.random(n) < 0.5, pop[:, 0], pop[:, 1])   # dependence
    attrs = ("a",) if name == "spl" else ("a", "b")
    cols = DOM.axes(attrs)
    shape = tuple(DOM.shape[c] for c in cols)
    truth = np.histogramdd(pop[:, list(cols)], bins=shape,
                           range=[(0, d) for d in shape])[0] / n
    ests = memoized_estimates(m, pop, reps, seeds, 8,
                              lambda c: m.estimate(c, attrs, method).factor.values, [attrs])
    assert_unbiased(ests, truth)


def test_rr_clusters_version_change_costs_a_new_memo():
    """The singleton round and the clustered version have different permanent channels, so a
    memoized device draws new memos (another fingerprint) when the version changes: the
    guarantee states it (per_version_change = per_rotation); the memoization carries over."""
    m = mechanism_class("rr-clusters").from_config(
        DOM, {"memoize": {"rotation_s": 600.0}, "cluster_reports": 50}, epsilon=0.8)
    rng = np.random.default_rng(2)
    x = rng.integers(0, DOM.shape, (80, 3))
    x[:, 2] = x[:, 0]   # a and c dependent: clustered together
    counts = {0: m.count(m.randomize(x, rng), m.tensors([]))}
    nxt = m.adapt(counts)
    assert nxt is not None and nxt.clustered and nxt.memoize == m.memoize
    fp0 = Program(m.device_program()).memo.fingerprint
    fp1 = Program(nxt.device_program()).memo.fingerprint
    assert fp0 != fp1
    for mech in (m, nxt):
        g = mech.guarantee()
        assert g.per_version_change == pytest.approx(g.per_rotation, rel=1e-12)
        assert g.to_dict()["epsilon_per_version_change"] == g.per_version_change
    static = _mech("rr-joint", {}, None).guarantee()
    assert static.per_version_change is None


@pytest.mark.parametrize("name", ["rs-fd", "rs-rfd", "lopub", "rrba", "corr-rr",
                                  "corr-rr-paper"])
def test_families_that_cannot_memoize_refuse_the_parameter(name):
    with pytest.raises(ParamError) as exc:
        mechanism_class(name).from_config(DOM, {"memoize": {"rotation_s": 600.0}},
                                          epsilon=1.0)
    assert exc.value.field == "memoize"


def _smp(inst: float | None):
    memo: dict = {"rotation_s": 600.0}
    if inst is not None:
        memo["instantaneous_epsilon"] = inst
    return mechanism_class("smp").from_config(DOM, {"memoize": memo}, epsilon=1.2,
                                              epsilon_scope="record")


@pytest.mark.parametrize("inst", [None, 0.7])
def test_smp_epsilon_comes_from_the_composed_and_permanent_channels(inst):
    m = _smp(inst)
    st = json.loads(json.dumps(m.device_state()))
    prog = Program(st["device"])
    assert isinstance(prog.memo, SelectMemo)
    perm = [_grr_matrix(b[0].p, b[0].shape[0]) for b in prog.memo.step.branches]
    comp = [P if inst is None else P @ _grr_matrix(q, len(P))
            for P, q in zip(perm, prog.memo.instantaneous or [None] * len(perm))]
    g = m.guarantee()
    assert m.epsilon == pytest.approx(max(ch.epsilon(C) for C in comp), rel=1e-9)
    assert g.per_rotation == pytest.approx(max(ch.epsilon(P) for P in perm), rel=1e-9)
    assert g.per_rotation == pytest.approx(1.2, rel=1e-9) == prog.epsilon
    assert from_state(st).guarantee() == g
    if inst is not None:
        assert m.epsilon < g.per_rotation


def test_smp_memoized_reports_follow_the_composed_channel():
    """The sampled attribute is fixed per (device, period) and matches the numpy randomizer's;
    over many periods one device's reports are (uniform attribute) × composed GRR row (χ²)."""
    from ldpstream.estimators.families.partitioned import assign_by_device

    m = _smp(0.7)
    prog = Program(json.loads(json.dumps(m.device_program())))
    memo = prog.memo
    assert isinstance(memo, SelectMemo)
    x = [1, 2, 3]
    ids = np.arange(300, dtype=np.uint64)
    assert [memo.keys(x, int(i), 9)[0][0] for i in ids] == \
        assign_by_device(ids, 3, 0, 9).tolist()
    n = 9000
    rng = SplitMix64(8)
    rows = []
    for period in range(n):
        keys = memo.keys(x, 4, period)
        rows.append(memo.report(keys, [memo.draw(k, rng) for k in keys], rng))
    gen = np.random.default_rng(3)
    mm = m.memoization()
    xs = np.tile([x], (n, 1))
    numpy_reports = mm.instantaneous(mm.responses(xs, np.arange(n), 0, gen), gen)
    for reports in (np.array(rows), np.asarray(numpy_reports)):
        for j, C in enumerate(m.channels):
            sel = reports[reports[:, 0] == j, 1]
            obs = np.bincount(sel, minlength=len(C))
            assert chisquare(obs, len(sel) * C[x[j]]).pvalue > P_MIN, j
        assert chisquare(np.bincount(reports[:, 0], minlength=3)).pvalue > P_MIN


def test_smp_unbiased_with_repeated_memoized_reports():
    m = _smp(0.7)
    rng0 = np.random.default_rng(5)
    n, reps, seeds = 2000, 10, 40
    pop = np.stack([rng0.integers(0, d, n) for d in DOM.shape], axis=1)
    truth = np.bincount(pop[:, 2], minlength=4) / n
    ests = memoized_estimates(m, pop, reps, seeds, 9,
                              lambda c: m.estimate(c, ("c",), "unbiased").factor.values,
                              [("c",)])
    assert_unbiased(ests, truth)
