"""Memoized ``partitioned`` (docs/partitioned.md "Memoization"): the composed channel (permanent
oracle @ instantaneous GRR) is what the estimators invert and what the ε per report is computed
from; the sampled outputs of the numpy randomizer and of the device program follow it (χ²);
the assignment is fixed per (device, period) and independent of the record; the unbiased
estimate stays unbiased with repeated memoized reports per device (seeded Monte Carlo)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from memo_helpers import assert_unbiased, memoized_estimates
from scipy.stats import chisquare
from tolerance import assert_close

from ldpstream.estimators.families.partitioned import Partitioned, assign_by_device
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.mechanism import ParamError, from_state
from ldpstream.estimators.oracles import frequency_oracles as fo
from ldpstream.estimators.stream.longitudinal import DAY_S, periods_per_window
from ldpstream.producers.draws import SplitMix64
from ldpstream.producers.program import PartitionMemo, Program
from ldpstream.producers.program_memo import partition_first

pytestmark = pytest.mark.core

DOM = Domain(("a", "b", "c"), (2, 3, 4))
#: χ² p-value below which a sampled distribution is taken not to follow its channel (seeded
#: draws: a correct sampler fails one run in 10⁴ per test)
P_MIN = 1e-4


def _mech(oracles=("grr",), inst: float | None = 1.0, per_report: int = 1,
          rotation: float | None = 3600.0) -> Partitioned:
    memo: dict = {"rotation_s": rotation}
    if inst is not None:
        memo["instantaneous_epsilon"] = inst
    return Partitioned.from_config(DOM, {"ways": 2, "oracles": list(oracles),
                                         "per_report": per_report, "memoize": memo},
                                   epsilon=2.0, epsilon_scope="record")


def _instantaneous_matrix(o: fo.Oracle, eps: float) -> np.ndarray:
    """The instantaneous layer over the oracle's codes: GRR over the value (OLH: per seed)."""
    if isinstance(o, fo.OLH):
        return np.kron(np.eye(o.seeds), ch.grr(eps, o.g))
    return ch.grr(eps, o.d)


@pytest.mark.parametrize("oracle", ["grr", "olh"])
@pytest.mark.parametrize("inst", [None, 0.5, 2.0])
def test_declared_epsilon_is_computed_from_the_composed_channel(oracle, inst):
    m = _mech((oracle,), inst)
    for perm, rep in zip(m.permanent_oracles, m.oracles):
        composed = perm.channel() if inst is None else \
            perm.channel() @ _instantaneous_matrix(perm, inst)
        assert_close(rep.channel(), composed, rel=1e-9)
        assert ch.epsilon(composed) == pytest.approx(rep.epsilon, rel=1e-9)
    g = m.guarantee()
    assert g.memoized and g.per_report == pytest.approx(m.epsilon, rel=1e-12)
    per_rotation = max(ch.epsilon(o.channel()) for o in m.permanent_oracles)
    assert g.per_rotation == pytest.approx(per_rotation, rel=1e-9)
    assert per_rotation == pytest.approx(2.0, rel=1e-9)   # the whole record budget
    assert g.per_day == pytest.approx(per_rotation * periods_per_window(DAY_S, 3600.0), rel=1e-12)
    if inst is not None:
        assert m.epsilon < per_rotation


def test_per_report_slots_compose_sequentially():
    m = _mech(("grr",), 1.0, per_report=2)
    g = m.guarantee()
    assert g.per_rotation == pytest.approx(2 * max(o.epsilon for o in m.permanent_oracles))
    assert g.per_report == pytest.approx(2 * max(o.epsilon for o in m.oracles))
    assert [o.eps for o in m.permanent_oracles] == pytest.approx([1.0, 1.0, 1.0])


def test_state_and_device_program_round_trip():
    m = _mech(("grr", "olh"), 0.7)
    st = json.loads(json.dumps(m.device_state()))
    back = from_state(st)
    assert back.guarantee() == m.guarantee() and back.epsilon == m.epsilon
    assert back.memoization() is not None and back.memoization().unit == "marginal"
    prog = Program(st["device"])
    assert isinstance(prog.memo, PartitionMemo)
    assert prog.epsilon == pytest.approx(m.guarantee().per_rotation, rel=1e-12)
    assert prog.memo.epsilons == pytest.approx(m.memoization().unit_epsilons(), rel=1e-12)
    fresh = Partitioned.from_config(DOM, {"ways": 2}, epsilon=2.0, epsilon_scope="record")
    assert fresh.memoization() is None and not fresh.guarantee().memoized


def test_bad_memoize_parameter_names_its_field():
    with pytest.raises(ParamError, match="memoize.instantaneous_epsilon"):
        Partitioned.from_config(DOM, {"memoize": {"instantaneous_epsilon": -1}}, epsilon=1.0)
    with pytest.raises(ParamError, match="memoize.colour"):
        Partitioned.from_config(DOM, {"memoize": {"colour": 1}}, epsilon=1.0)


def test_assignment_is_fixed_per_device_and_period_and_ignores_the_record():
    m = _mech(("grr",), None)
    memo = Program(m.device_program()).memo
    assert isinstance(memo, PartitionMemo)
    K = len(m.marginals)
    ids = np.arange(4000, dtype=np.uint64)
    for period in (0, 7, 123456):
        ours = assign_by_device(ids, K, m.assign_seed, period)
        assert [partition_first(memo.step, int(i), period) for i in ids[:200]] == \
            ours[:200].tolist()
        # near-uniform over devices: χ² against K equal cells
        assert chisquare(np.bincount(ours, minlength=K)).pvalue > P_MIN
        tables = {memo.keys(list(x), 17, period)[0][0] for x in np.ndindex(*DOM.shape)}
        assert len(tables) == 1   # every record of one device, one period: one marginal
    a, b = assign_by_device(ids, K, 0, 1), assign_by_device(ids, K, 0, 2)
    assert 0.5 < np.mean(a != b) < 0.8   # rotates: (K-1)/K of devices change marginal


def _sampled_codes(memo: PartitionMemo, x: list[int], n: int, seed: int) -> np.ndarray:
    """n reports of record x by devices in fresh periods (a new memo each time)."""
    rng = SplitMix64(seed)
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        keys = memo.keys(x, 5, i)
        out[i] = memo.report(keys, [memo.draw(k, rng) for k in keys], rng)[0]
    return out


@pytest.mark.parametrize("oracle", ["grr", "olh"])
def test_device_program_reports_follow_the_composed_channel(oracle):
    """The Python interpreter of the memoized description: over many periods one device's
    reports are draws from (uniform marginal) × row of the composed channel (χ², P_MIN)."""
    m = _mech((oracle,), 0.8)
    memo = Program(json.loads(json.dumps(m.device_program()))).memo
    assert isinstance(memo, PartitionMemo)
    x = [1, 2, 3]
    n = 12000
    codes = _sampled_codes(memo, x, n, 3)
    expected = np.zeros(int(m.offsets[-1]))
    for j, (cols, o) in enumerate(zip(m._cols, m.oracles)):
        cell = int(np.ravel_multi_index(tuple(x[c] for c in cols), m._shapes[j]))
        expected[m.offsets[j]:m.offsets[j + 1]] = o.channel()[cell] / len(m.marginals)
    assert chisquare(np.bincount(codes, minlength=len(expected)), n * expected).pvalue > P_MIN


@pytest.mark.parametrize("oracle", ["grr", "olh"])
def test_numpy_randomizer_follows_the_composed_channel(oracle):
    m = _mech((oracle,), 0.8)
    rng = np.random.default_rng(11)
    n = 20000
    x = np.tile([[0, 1, 2]], (n, 1))
    memo = m.memoization()
    reports = memo.instantaneous(memo.responses(x, np.arange(n), 0, rng), rng)[:, 0]
    assign = assign_by_device(np.arange(n, dtype=np.uint64), len(m.marginals), m.assign_seed, 0)
    for j, (cols, o) in enumerate(zip(m._cols, m.oracles)):
        sel = reports[assign == j] - m.offsets[j]
        cell = int(np.ravel_multi_index(tuple(x[0][c] for c in cols), m._shapes[j]))
        obs = np.bincount(sel, minlength=o.n_codes)
        assert chisquare(obs, len(sel) * o.channel()[cell]).pvalue > P_MIN, j


def test_unbiased_with_repeated_memoized_reports_per_device():
    """2,000 devices × 10 memoized reports a day, 40 seeds: the mean of the unbiased estimate of
    every collected marginal is within 4 standard errors (of that mean, across seeds) of the
    population's marginal; every device's reports share one permanent response."""
    m = _mech(("grr",), 1.0)
    rng0 = np.random.default_rng(2024)
    n, reps, seeds = 2000, 10, 40
    pop = np.stack([rng0.choice(d, n, p=np.arange(1, d + 1) / (d * (d + 1) / 2))
                    for d in DOM.shape], axis=1)
    ests = memoized_estimates(m, pop, reps, seeds, 7, lambda c: np.concatenate(
        [m.estimate(c, mg, "unbiased").factor.values.ravel() for mg in m.marginals]))
    truth = np.concatenate([np.histogramdd(pop[:, list(c)], bins=sh,
                                           range=[(0, d) for d in sh])[0].ravel() / n
                            for c, sh in zip(m._cols, m._shapes)])
    assert_unbiased(ests, truth)


def test_a_memoized_partitioned_collection_states_its_epsilon_over_time(tmp_path):
    """Through the config, as /collections states it: ε per report from the composed oracles,
    per rotation and per day from the permanent ones (record budget 2, hourly rotation: a day
    meets 25 periods)."""
    import yaml

    from ldpstream.config import load_config
    from ldpstream.privacy import epsilon_fields

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"collections": [{
        "id": "p", "schema": {"attributes": {"os": ["a", "i", "w"], "plan": ["f", "p"],
                                             "region": ["eu", "us", "as", "la"]}},
        "mechanism": "partitioned", "epsilon": 2.0, "epsilon_scope": "record",
        "params": {"ways": 2, "memoize": {"rotation_s": 3600, "instantaneous_epsilon": 1.0}},
        "marginals": [["os", "plan"]], "estimators": ["unbiased"]}]}))
    coll = load_config(str(path)).collections["p"]
    mech = coll.mechanism()
    f = epsilon_fields(coll, mech)
    assert mech.memoization() is not None
    assert f["epsilon_per_record"] == pytest.approx(mech.guarantee().per_report, rel=1e-12)
    assert f["epsilon_per_record"] < 1.0
    assert f["epsilon_per_rotation"] == pytest.approx(2.0, rel=1e-9)
    assert f["epsilon_per_day"] == pytest.approx(50.0, rel=1e-9)
    assert f["privacy_note"].startswith("weak privacy: ε = 50 per device per day")
