"""Memoized ``partitioned`` with a numeric attribute (docs/numeric.md "In partitioned
marginals"): each device α-point rounds its value with its own fixed α [Ding et al., NeurIPS
2017, §3], so a reading wandering inside one rounding interval keeps its memo; the description
expresses it (``memoize.round``, then the ``round`` step mapping the point to its index) and its
ε is the one of the channel applied; the estimates are unbiased over fleets (α uniform), not per
device, and the mean's stated standard error and interval hold (seeded Monte Carlo)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from memo_helpers import assert_unbiased, memoized_estimates

from ldpstream.config import parse_config
from ldpstream.estimators.families.partitioned import Partitioned, assign_by_device
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels import device_program as dp
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.kernels.numeric import numeric_labels
from ldpstream.producers.program import PartitionMemo, Program
from ldpstream.producers.program_steps import ProgramError

pytestmark = pytest.mark.core

G = 33
DOM = Domain(("fw", "battery"), (3, G), (("a", "b", "c"), numeric_labels(0, 100, G)),
             (None, (0.0, 100.0)))
MARGINALS = [["battery"], ["fw", "battery"]]


def _mech(oracle: str = "grr", inst: float | None = 1.0, eps: float = 2.0) -> Partitioned:
    memo: dict = {"rotation_s": 3600.0}
    if inst is not None:
        memo["instantaneous_epsilon"] = inst
    return Partitioned.from_config(DOM, {"marginals": MARGINALS, "oracles": [oracle],
                                         "bins": {"battery": 9}, "memoize": memo},
                                   epsilon=eps, epsilon_scope="record")


def _program(m: Partitioned) -> dict:
    return json.loads(json.dumps(m.device_program()))


def test_config_accepts_memoize_with_a_numeric_attribute_and_states_epsilon_over_time():
    coll = parse_config({"collections": [{
        "id": "c", "schema": {"attributes": {"fw": ["a", "b", "c"],
                                             "battery": {"numeric": {"min": 0, "max": 100}}}},
        "mechanism": "partitioned", "epsilon": 2.0, "epsilon_scope": "record",
        "params": {"ways": 2, "bins": {"battery": 9},
                   "memoize": {"rotation_s": 3600, "instantaneous_epsilon": 1.0}},
        "marginals": [["fw", "battery"]], "estimators": ["unbiased"]}]}).collections["c"]
    mech = coll.mechanism()
    g = mech.guarantee()
    assert mech.memoization() is not None and g.memoized
    assert g.per_rotation == pytest.approx(2.0, rel=1e-9)            # the permanent oracle's
    assert g.per_day == pytest.approx(50.0, rel=1e-9)                # 25 hourly periods a day
    assert g.per_report < 1.0                                        # the composed oracle's
    assert dp.program_epsilon(mech.device_state()["device"]) == pytest.approx(2.0, rel=1e-9)


@pytest.mark.parametrize("oracle", ["grr", "olh"])
def test_description_rounds_then_maps_the_point_and_its_epsilon_is_the_channels(oracle):
    """``memoize.round`` holds the points and the α seed of the attribute's name; the permanent
    steps are the ``round`` step then the partition step. Each table's channel from a grid
    value, averaged over α (R ⊗ I)·T, has the table's ε to 1e-9 and so does the description;
    one device's channel (its α fixed: a deterministic rounding, then T) never exceeds it."""
    m = _mech(oracle)
    prog = _program(m)
    memo = prog["memoize"]
    pts = [int(p) for p in m.binning.points[1]]
    assert prog["steps"] == [] and memo["kind"] == "partition"
    assert memo["round"] == [None, {"points": pts, "seed": str(dp.alpha_seed("battery"))}]
    assert [s["op"] for s in memo["permanent"]] == ["round", "partition"]
    assert memo["permanent"][0] == {"op": "round", "in": [1], "points": pts}
    eps = dp.program_epsilon(prog)
    assert eps == pytest.approx(m.guarantee().per_rotation, rel=1e-9)
    for t, o in zip(memo["permanent"][1]["tables"], m.permanent_oracles):
        C = dp.record_table_channel(prog, t)
        assert ch.epsilon(C) == pytest.approx(o.epsilon, rel=1e-9)
        assert ch.epsilon(C) <= eps * (1 + 1e-9)
        for alpha in (0.0, 0.3, 0.999):   # one device: deterministic rounding, then the table
            rounded = dp.round_index(np.arange(G), np.asarray(pts), np.full(G, alpha))
            cols = t["in"]
            shape = [3, len(pts)]
            rows = np.ravel_multi_index(
                tuple(np.meshgrid(*[np.arange(3) if c == 0 else rounded for c in cols],
                                  indexing="ij")), [shape[c] for c in cols]).ravel()
            T = dp.table_channel(t, shape)
            assert ch.epsilon(T[rows]) <= o.epsilon * (1 + 1e-9)


def test_python_sdk_keys_a_wandering_reading_by_its_rounded_point():
    """The SDK's memo keys equal the estimator's α-point rounding for every grid value and 500
    devices (bit for bit); a reading between two points keeps one key per device, the point
    above for a share of devices equal to its fraction of the way there."""
    m = _mech()
    memo = Program(_program(m)).memo
    assert isinstance(memo, PartitionMemo)
    ids = np.arange(500, dtype=np.uint64) * 7919 + 3
    pts = m.binning.points[1]
    alpha = dp.device_alpha(ids, dp.alpha_seed("battery"))
    battery_table = 0                      # [battery] is the first marginal
    for x in range(G):
        want = dp.round_index(np.full(len(ids), x), pts, alpha)
        for i, dev in enumerate(ids):
            xr = memo.rounded([0, x], int(dev))
            keys = memo.keys(xr, int(dev), 0)
            cells = {t: c for t, c in keys}
            if battery_table in cells:
                assert cells[battery_table] == want[i], (x, dev)
            else:   # (fw, battery): fw a, battery's point index
                assert cells[1] == want[i], (x, dev)
    # 10 grid steps from point 8 to point 12: fraction 0.5 between them (pts every 4 steps)
    x = int(pts[2]) + 2
    up = dp.round_index(np.full(len(ids), x), pts, alpha) == 3
    assert abs(up.mean() - 0.5) < 4 * np.sqrt(0.25 / len(ids))
    wander = [memo.rounded([0, v], int(ids[0]))[1] for v in (x - 1, x, x + 1)]
    frac = [(v - pts[2]) / (pts[3] - pts[2]) for v in (x - 1, x, x + 1)]
    a0 = float(alpha[0])
    assert wander == [int(pts[3] if f > a0 else pts[2]) for f in frac]


def test_round_entry_and_round_steps_must_agree():
    m = _mech()
    prog = _program(m)
    for change, field in (
            (lambda d: d["memoize"].pop("round"), "device.memoize.round"),
            (lambda d: d["memoize"]["permanent"].pop(0), "device.memoize.round"),
            (lambda d: d["memoize"]["permanent"][0].update(points=[0, 8, 16, 32]),
             "device.memoize.round"),
            (lambda d: d["memoize"]["permanent"].reverse(), "device.memoize.permanent")):
        d = json.loads(json.dumps(prog))
        change(d)
        with pytest.raises(ProgramError) as exc:
            Program(d)
        assert exc.value.field.startswith(field), (exc.value.field, str(exc.value))


def test_estimates_unbiased_over_fleets_with_stated_errors_by_seeded_monte_carlo():
    """200 fleets of 3,000 devices (new ids: new α per fleet), each counted once (as the worker
    counts a memoized collection: its latest report), ε = 3 with an instantaneous ε of 3: the
    unbiased (fw, battery) table's mean over fleets within 4
    standard errors of the expected rounded table; the mean of every firmware and of all within
    4 standard errors of the true mean; the stated standard error within 20 % of the measured
    one and the 95 % interval covering the truth in 90–99 % of the fleets."""
    m = _mech("grr", 3.0, eps=3.0)
    rng = np.random.default_rng(31)
    n, runs = 3000, 200
    fw = rng.integers(0, 3, n)
    x = np.rint(np.clip(rng.beta(5, 2 + fw), 0, 1) * (G - 1)).astype(np.int64)
    pop = np.stack([fw, x], axis=1)
    values = x / (G - 1) * 100
    truth = np.array([values[fw == k].mean() for k in range(3)] + [values.mean()])
    R_b = m.binning.channel(1)
    want = np.stack([np.bincount(x[fw == k], minlength=G) @ R_b for k in range(3)]) / n

    def estimate(c):
        est = m.estimate(c, ("fw", "battery"), "unbiased")
        one = m.estimate(c, ("battery",), "unbiased").extra
        rows = est.extra["categories"]
        return np.concatenate([est.factor.values.ravel(),
                               [r["mean"] for r in rows] + [one["mean"]],
                               [r["stderr"] for r in rows] + [one["stderr"]]])

    out = memoized_estimates(m, pop, 1, runs, 13, estimate, [tuple(mg) for mg in MARGINALS])
    cells = want.size
    tables, means, ses = out[:, :cells], out[:, cells:cells + 4], out[:, cells + 4:]
    assert_unbiased(tables, want)
    assert_unbiased(means, truth)
    ratio = ses.mean(axis=0) / means.std(axis=0, ddof=1)
    assert np.all((ratio > 0.8) & (ratio < 1.2)), ratio
    cover = (np.abs(means - truth) <= 1.959964 * ses).mean(axis=0)
    assert np.all((cover >= 0.90) & (cover <= 0.99)), cover


def test_rounding_is_fixed_per_device_and_splits_over_a_fleet():
    """At ε = 40 (the oracle keeps the cell but with probability ~1e-17) the permanent codes show
    each device's rounded point: 400 devices holding one value a quarter of the way between two
    points keep their marginal and their point in every one of 20 runs (only the oracles
    re-draw), the point each one's α gives; over the fleet a share 0.25 rounds up."""
    m = _mech("grr", None, eps=40.0)
    memo = m.memoization()
    ids = np.arange(400, dtype=np.uint64)
    pts = m.binning.points[1]
    x = int(pts[2]) + 1                                  # 1 of 4 grid steps from point 2 to 3
    pop = np.tile([[0, x]], (len(ids), 1))
    first = assign_by_device(ids, len(m.marginals), m.assign_seed, 0)
    point = dp.round_index(np.full(len(ids), x), pts,
                           dp.device_alpha(ids, dp.alpha_seed("battery")))
    want = m.offsets[first] + point   # [battery]: the point; [fw, battery]: fw a (0)·9 + it
    for s in range(20):
        codes = memo.responses(pop, ids, 0, np.random.default_rng(s))[:, 0]
        assert np.array_equal(codes, want), s
    up = point == 3
    assert abs(up.mean() - 0.25) < 4 * np.sqrt(0.25 * 0.75 / len(ids))


def test_permanent_codes_follow_the_rounded_channel_over_a_fleet():
    """Devices holding one grid value: their permanent codes of the [battery] table follow the
    row of (R·T) (α uniform over the fleet), within 5 standard errors per code."""
    m = _mech("grr", None)
    memo = m.memoization()
    n = 40_000
    ids = np.arange(n, dtype=np.uint64) + 10**6
    x = int(m.binning.points[1][5]) + 3
    pop = np.tile([[1, x]], (n, 1))
    codes = memo.responses(pop, ids, 0, np.random.default_rng(5))[:, 0]
    first = assign_by_device(ids, len(m.marginals), m.assign_seed, 0)
    sel = codes[first == 0] - m.offsets[0]
    row = (m.binning.channel(1) @ m.permanent_oracles[0].channel())[x]
    got = np.bincount(sel, minlength=len(row)) / len(sel)
    assert np.all(np.abs(got - row) <= 5 * np.sqrt(row * (1 - row) / len(sel))), got - row


def test_a_wandering_reading_costs_one_memo_per_rounded_point_it_reaches():
    """A battery reading wandering ±1 % around 60 % over a day (96 readings, a 1,025-point grid
    rounded to 9 points: 50 and 62.5 around it) visits 21 grid values (and would be 96 fresh
    reports); through the Python SDK each of 1,000 devices reaches at most 2 rounded points,
    1.165 on average (those whose α lies between the wander's fractions, 0.72 to 0.88, see
    both): the memos, and the ε, of one table's cell each."""
    dom = Domain(("fw", "battery"), (3, 1025), (("a", "b", "c"), numeric_labels(0, 100, 1025)),
                 (None, (0.0, 100.0)))
    m = Partitioned.from_config(dom, {"marginals": MARGINALS, "bins": {"battery": 9},
                                      "memoize": {"rotation_s": 86400}},
                                epsilon=2.0, epsilon_scope="record")
    prog = Program(_program(m))
    rng = np.random.default_rng(5)
    grid = [prog.encode({"fw": "a", "battery": f"{v:.4f}"})[1]
            for v in 60 + rng.uniform(-1, 1, 96)]
    assert len(set(grid)) >= 15
    per_device = [len({prog.memo.rounded([0, g], d)[1] for g in grid}) for d in range(1, 1001)]
    assert max(per_device) == 2 and 1.08 < np.mean(per_device) < 1.24, np.mean(per_device)


def test_simulate_numeric_runs_a_memoized_partitioned_collection(capsys):
    """``ldpstream simulate --numeric`` with ``--param memoize=...``: every record a device of a
    new fleet per run (its own α and marginal), counted once; ε per record is the composed
    oracle's; ``--memoize`` (the categorical comparison) is refused with the way to do it."""
    from ldpstream.cli import CliError, build_parser
    from ldpstream.simulate.command import main

    base = ["simulate", "--numeric", "age", "--columns", "sex", "--mechanism", "partitioned",
            "--epsilon", "2", "--epsilon-scope", "record", "--runs", "3", "--json"]
    memo = "memoize={rotation_s: 86400, instantaneous_epsilon: 4}"
    assert main(build_parser().parse_args([*base, "--param", memo])) == 0
    doc = json.loads(capsys.readouterr().out)
    age = doc["attributes"]["age"]
    assert 1.0 < doc["epsilon_per_record"] < 2.0        # the composed oracle's, below ε
    assert age["mean_error"] < 1.0 and age["mean_covered"] >= 2 / 3
    assert age["w1_range"] < 0.05
    with pytest.raises(CliError, match="--param 'memoize="):
        main(build_parser().parse_args([*base, "--memoize"]))
