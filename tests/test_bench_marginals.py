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
                         population=pop)
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
