"""``bench marginals`` held-out runs (bench/heldout.py): the sources (CSV, BIF, fresh networks
from disjoint seeds), choices frozen from the shape, the rows and the summary."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from ldpstream.bench.heldout import (
    bif_source,
    csv_source,
    generated_sources,
    run_heldout,
    summarize,
)
from ldpstream.bn import survey_path
from ldpstream.bngen import HELDOUT_KINDS
from ldpstream.estimators.families.partitioned import Partitioned, choose_ways

pytestmark = pytest.mark.core


def test_generated_networks_cycle_the_kinds_and_differ_by_seed():
    a = generated_sources(3, 100, n=500, m=4)
    b = generated_sources(3, 200, n=500, m=4)
    assert [s.kind for s in a] == list(HELDOUT_KINDS)
    assert [s.name for s in a] == [f"{k}-{100 + i}" for i, k in enumerate(HELDOUT_KINDS)]
    again = generated_sources(3, 100, n=500, m=4)
    for x, y, z in zip(a, again, b):
        assert np.array_equal(x.records, y.records)          # reproducible from the seed
        assert float(x.population.sum()) == pytest.approx(1.0, rel=1e-12)
        assert x.population.shape != z.population.shape or not np.allclose(
            x.population, z.population)                       # another seed: another network


def test_near_deterministic_rows_are_more_skewed_than_dense_ones():
    """The kinds do what their names say: the largest probability of a CPT row."""
    from ldpstream.bngen import shape_network
    def top(kind):
        net = shape_network(kind, 7, 5)
        return float(np.mean([np.mean(c.max(axis=-1)) for c in net.cpt.values()]))
    assert top("near-deterministic") > 0.95 > top("skewed") > 0.8 > 0.6 > top("dense")


def test_csv_and_bif_sources(tmp_path):
    path = tmp_path / "t.csv"
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 3, (400, 3))
    path.write_text("a,b,c\n" + "\n".join(",".join(f"v{x}" for x in r) for r in rows) + "\n")
    src = csv_source(str(path), ["a", "c"], seed=1)
    assert src.domain.attrs == ("a", "c") and src.records.shape == (400, 2)
    want = np.zeros((3, 3))
    np.add.at(want, (rows[:, 0], rows[:, 2]), 1)
    np.testing.assert_allclose(src.population, want / 400, rtol=1e-12)
    bif = bif_source(str(survey_path()), n=300, seed=0)
    assert bif.kind == "bif" and bif.records.shape == (300, 6)


def test_rows_use_the_frozen_shape_choice_and_name_the_cells_pgm_wins():
    src = generated_sources(1, 7, n=3_000, m=4)
    rows = run_heldout(src, [1.0, 8.0], runs=1, verbose=False)
    for r in rows:
        assert r["ways"] == choose_ways(src[0].domain.shape, 3_000, r["epsilon"])
        assert r["default"] == Partitioned.default_estimators[0]
        assert 0 < r[f"2way_{r['default']}"] < 1 and r["cost_over_consistent"] > 0
    fake = [dict(rows[0], **{"2way_pgm_over_default": 0.9, "3way_pgm_over_default": 1.1}),
            dict(rows[1], **{"2way_pgm_over_default": 1.2, "3way_pgm_over_default": 1.0})]
    s = summarize(fake)
    assert s["below_1"] == [(src[0].name, 1.0, "2way", 0.9)]
    assert s["per_epsilon"][1.0]["2way_min"] == pytest.approx(0.9, rel=1e-12)


def test_bounds_run_measures_both_bounds_through_the_cli(capsys):
    """``bench marginals --bounds`` (bench/heldout_bounds.py): one row per dataset and ε with
    the coverage and width of the proxy and the bootstrap bounds, printed as a table."""
    from ldpstream.bench.marginals import heldout_main
    args = argparse.Namespace(data=[], columns=None, bif=[], generate=1, seed=7,
                              epsilons="2", runs=2, json=True, quick=False, bounds=True)
    assert heldout_main(args) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == 1 and rows[0]["runs"] == 2
    for w in ("2way", "3way"):
        for k in ("proxy_coverage", "bootstrap_coverage", "cell_coverage"):
            assert 0.0 <= rows[0][f"{w}_{k}"] <= 1.0
        assert rows[0][f"{w}_bootstrap_median_ratio"] > 0
    assert rows[0]["2way_stated"] == ["calibrated"] and rows[0]["cost_over_estimate"] > 0
    from ldpstream.bench.heldout_bounds import print_bounds
    print_bounds(rows)
    assert "bootstrap" in capsys.readouterr().out


def test_bad_source_is_a_clear_error(tmp_path, capsys):
    from ldpstream.bench.marginals import heldout_main
    args = argparse.Namespace(data=[str(tmp_path / "missing.csv")], columns=None, bif=[],
                              generate=0, seed=0, epsilons="1", runs=1, json=False, quick=False,
                              bounds=False)
    assert heldout_main(args) == 2
    assert "no such file" in capsys.readouterr().err
