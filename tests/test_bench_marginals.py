"""``bench marginals`` columns on a small generated network: the sampling floor is the TVD of
the non-private empirical marginals to the population's, and every estimate is measured
against the population (bench/marginals.py)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from ldpstream.bench.marginals import _triples, _truth, run_dataset
from ldpstream.bngen import shape_network
from ldpstream.estimators.kernels.domain import Factor
from ldpstream.estimators.kernels.metrics import tvd

pytestmark = pytest.mark.core


def test_sampling_floor_column_is_the_empirical_marginals_tvd():
    net = shape_network("tree-mixed", 4, 0)
    rec = net.sample(3_000, np.random.default_rng(0))
    pop = net.joint()
    (row,) = run_dataset("t", net.domain, rec, epsilons=(8.0,), seeds=(0,), verbose=False,
                         population=pop, net=net)
    pairs = list(itertools.combinations(net.domain.attrs, 2))
    want = np.mean([tvd(_truth(rec, net.domain, a), Factor(net.domain, pop).project(a).values)
                    for a in pairs])
    assert row["2way_sampling"] == pytest.approx(want, rel=1e-12)
    assert 0 < row["2way_sampling"] < row["2way_auto"]   # no mechanism beats the floor here
    assert row["2way_auto_vs_sampling"] == pytest.approx(row["2way_auto"] / want, rel=1e-12)
    assert len(_triples(net.domain, 20)) == 4 and "2way_pgm" not in row
    assert row["2way_global_ratio"] == pytest.approx(row["2way_split"] / row["2way_global"],
                                                     rel=1e-12)
    assert row["global_chosen_seeds"] in (0, 1) and row["2way_global"] > 0
    assert row["2way_oracle_vs_sampling"] == pytest.approx(row["2way_oracle"] / want, rel=1e-12)


def test_true_structure_fit_is_the_network_when_the_tables_are_exact():
    """The reference column factorizes the consistent tables along the true network: with
    every record reported at ε = 50 (no noise) and all records as the population, it equals
    the records' own distribution wherever the records follow the network's independences
    (here: the population itself, up to the tables' sampling)."""
    from ldpstream.bench.marginals import true_structure_fit
    from ldpstream.estimators.families.partitioned import Partitioned
    net = shape_network("chain-skewed", 4, 0)
    rec = net.sample(200_000, np.random.default_rng(1))
    mech = Partitioned(net.domain, 50.0, ways=len(net.domain))
    counts = mech.count(mech.randomize(rec, np.random.default_rng(2)), mech.tensors())
    fit = true_structure_fit(net, mech, counts)
    assert float(fit.values.sum()) == pytest.approx(1.0, rel=1e-12)
    assert tvd(fit.values, net.joint()) < 0.01


def test_global_targets_name_the_cells_that_miss():
    from ldpstream.bench.marginals import _global_targets

    def row(eps, ratio, pgm):
        return {"epsilon": eps, **{f"{w}_global_ratio": ratio for w in ("2way", "3way")},
                **{f"{w}_global": 0.01 for w in ("2way", "3way")},
                **{f"{w}_auto_floor": 0.01 for w in ("2way", "3way")},
                **{f"{w}_global_vs_sampling": 1.4 for w in ("2way", "3way")},
                "2way_pgm": 0.02, **{f"{w}_pgm_over_global": pgm for w in ("2way", "3way")}}

    t = _global_targets([row(0.5, 1.2, 1.1), row(8.0, 2.0, 0.9)])
    assert not t["ratio_ge_1.3_everywhere"] and t["below_1.3"] == [(0.5, "2way", 1.2),
                                                                   (0.5, "3way", 1.2)]
    assert t["within_1.2_of_floor_at_eps8"] and t["over_sampling_floor_at_eps8"]["3way"] == 1.4
    assert not t["pgm_over_ours_ge_1"] and t["pgm_below_ours"] == [(8.0, "2way", 0.9),
                                                                   (8.0, "3way", 0.9)]
