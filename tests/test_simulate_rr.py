"""``ldpstream simulate`` for the rr family: JSON schema, ε bookkeeping, and one-line errors."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ldpstream import cli
from ldpstream.estimators.families.rr import RRClusters, RRIndependent, RRJoint
from ldpstream.simulate import driver as sim
from ldpstream.simulate.driver import draw_subsets

pytestmark = [pytest.mark.core, pytest.mark.slow]

TOP_KEYS = {"mechanism", "n", "m", "epsilon", "epsilon_scope", "epsilon_per_record",
            "longitudinal", "over_time", "parameters", "seed", "runs", "results"}
ROW_KEYS = {"mechanism", "estimator", "w", "subsets", "metrics", "seconds", "reports", "versions"}
METRIC_KEYS = {"tvd", "max_abs", "mae", "mse", "l2_counts", "jsd"}


def _run(capsys, *argv):
    rc = cli.main(["simulate", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_schema_small_run(capsys):
    rc, out, _ = _run(capsys, "--mechanism", "rr-ind", "--estimator", "castell", "--estimator",
                      "ibu", "--estimator", "rr-adjustment", "--ways", "2", "--subsets", "2",
                      "--seed", "3", "--epsilon", "2", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert set(doc) == TOP_KEYS
    assert doc["n"] == 32561 and doc["m"] == 8 and doc["epsilon"] == 2.0
    assert doc["epsilon_scope"] == "attribute"
    assert doc["epsilon_per_record"] == pytest.approx(16.0)  # computed from 8 GRR(2) channels
    assert [r["estimator"] for r in doc["results"]] == ["castell", "ibu", "rr-adjustment"]
    for r in doc["results"]:
        extra = {"iterations", "converged_fraction"} if r["estimator"] != "castell" else set()
        assert set(r) == ROW_KEYS | extra
        assert r["mechanism"] == "rr-ind" and r["w"] == 2 and r["subsets"] == 2
        assert set(r["metrics"]) == METRIC_KEYS
        assert all(np.isfinite(v) and v >= 0 for v in r["metrics"].values())
        assert 0 < r["metrics"]["tvd"] < 0.1
        assert r["seconds"] >= 0
        if extra:
            assert r["iterations"] >= 1 and 0 <= r["converged_fraction"] <= 1


def test_record_scope_runs_and_stderr(capsys):
    rc, out, _ = _run(capsys, "--mechanism", "rr-clusters", "--estimator", "rr-independent",
                      "--estimator", "castell", "--ways", "2", "--subsets", "2", "--runs", "2",
                      "--epsilon", "4", "--epsilon-scope", "record", "--json", "--proper")
    assert rc == 0
    doc = json.loads(out)
    assert doc["epsilon_scope"] == "record"
    assert doc["epsilon_per_record"] == pytest.approx(4.0)  # 8 attributes × 0.5
    for r in doc["results"]:
        assert set(r["stderr"]) == METRIC_KEYS and r["mechanism"] == "rr-clusters"
        assert r["metrics"]["tvd"] <= 1.0  # --proper: distributions, so TVD ≤ 1


def test_rr_joint_and_custom_csv(tmp_path, capsys):
    rng = np.random.default_rng(0)
    a = rng.choice(["x", "y", "z"], 3000)
    b = np.where(rng.random(3000) < 0.8, a, rng.choice(["x", "y", "z"], 3000))
    c = rng.choice(["p", "q"], 3000)
    path = tmp_path / "toy.csv"
    path.write_text("a,b,c\n" + "\n".join(f"{u}, {v}, {w}" for u, v, w in zip(a, b, c)) + "\n")
    rc, out, _ = _run(capsys, "--data", str(path), "--columns", "a,b,c", "--mechanism",
                      "rr-joint", "--estimator", "castell", "--estimator", "truncated",
                      "--ways", "2,3", "--subsets", "5", "--epsilon", "2", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["n"] == 3000 and doc["m"] == 3
    assert doc["epsilon_per_record"] == pytest.approx(6.0)  # ε_C = Σ ε_A
    rows = {(r["estimator"], r["w"]): r for r in doc["results"]}
    assert rows[("castell", 2)]["subsets"] == 3 and rows[("castell", 3)]["subsets"] == 1


def test_table_output(capsys):
    rc, out, _ = _run(capsys, "--ways", "2", "--subsets", "1", "--estimator", "castell")
    assert rc == 0 and "castell" in out and "tvd" in out and "ε per record=8" in out


def test_draw_subsets_seeded_distinct():
    s = draw_subsets(8, 3, 20, seed=5)
    assert len(s) == 20 == len(set(s)) and all(len(x) == 3 for x in s)
    assert s == draw_subsets(8, 3, 20, seed=5) and s != draw_subsets(8, 3, 20, seed=6)
    assert len(draw_subsets(4, 2, 20, seed=0)) == 6  # all of them


@pytest.mark.parametrize("argv,needle", [
    (["--data", "/no/such/file.csv"], "/no/such/file.csv"),
    (["--columns", "sex,not-a-column"], "'not-a-column'"),
    (["--epsilon", "0"], "--epsilon"),
    (["--epsilon", "-2"], "--epsilon"),
    (["--epsilon", "nan"], "--epsilon"),
    (["--mechanism", "rr-joint", "--estimator", "hybrid"], "'hybrid'"),
    (["--ways", "2,12"], "--ways"),
])
def test_errors_are_one_line(capsys, argv, needle):
    rc, out, err = _run(capsys, *argv, "--subsets", "1")
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ldpstream: error: ") and needle in lines[0]


def test_error_via_console_script():
    exe = Path(sys.executable).parent / "ldpstream"
    assert exe.exists(), "console script missing: pip install -e . (scripts/bootstrap.sh)"
    p = subprocess.run([str(exe), "simulate", "--columns", "bogus"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "'bogus'" in p.stderr


def test_bench_adult_quick(capsys):
    from ldpstream.bench import adult
    doc = adult.run(quick=True)
    assert set(doc["scopes"]) == {"attribute", "record"} and doc["ways"] == [2, 3, 4]
    assert doc["scopes"]["attribute"]["epsilon_per_record"] == pytest.approx(32.0)
    assert doc["scopes"]["record"]["epsilon_per_record"] == pytest.approx(4.0)
    names = {r["estimator"] for r in doc["scopes"]["record"]["results"]}
    assert names == set(adult.ESTIMATORS) | {"truncated+clip"}
    assert all(set(r["metrics"]) == {"tvd", "max_abs", "l2"}
               for r in doc["scopes"]["record"]["results"])
    assert [c["passed"] for c in doc["checks"]][0] is True  # record scope: ibu beats truncated
    assert len(doc["checks"]) == 3
    adult.print_report(doc)
    out = capsys.readouterr().out
    assert "Table VI" in out and "n/a" in out and "PASS" in out


@pytest.mark.parametrize("cls", [RRIndependent, RRJoint, RRClusters], ids=lambda c: c.name)
def test_simulate_equals_mechanism_estimate_for_every_estimator(cls):
    """One code path: every estimator's simulate metric equals the metric of ``mech.estimate`` on
    the exact count tensor of the same reports (same seed), as a streaming server would have."""
    ds = sim.load_dataset(None, "workclass,education,marital-status,relationship,sex")
    plan = sim.Plan(ds, cls.name, cls.estimators, (2, 3), 1, seed=4, runs=1, epsilon=2.0)
    doc = sim.simulate(plan)
    rows = {(r["estimator"], r["w"]): r for r in doc["results"]}
    subsets = {w: tuple(ds.domain.attrs[c] for c in draw_subsets(len(ds.domain), w, 1, 4)[0])
               for w in plan.ways}
    run = sim.drive(sim.build(plan), ds.records, np.random.default_rng([plan.seed, 0]),
                    sorted(subsets.values()))
    assert run.epsilon == doc["epsilon_per_record"]
    for w, attrs in subsets.items():
        truth = sim.histogram(ds.records, ds.domain.axes(attrs),
                              ds.domain.project(attrs).shape) / ds.n
        for e in cls.estimators:
            est = run.mechanism.estimate_versions(run.counts, attrs, e)
            assert rows[(e, w)]["metrics"] == sim._metrics(est.factor.values, truth,
                                                           sim.METRICS, ds.n), (e, w)
            if est.iterations is not None:
                assert rows[(e, w)]["iterations"] == est.iterations


def test_rr_adjustment_full_is_simulate_only_and_differs(capsys):
    """Alg. 2 on whole records is kept as ``rr-adjustment-full`` (simulate only); it rakes all m
    attributes, so its w-way estimate differs from the w-way-table ``rr-adjustment``."""
    assert "rr-adjustment-full" not in RRIndependent.estimators
    rc, out, _ = _run(capsys, "--mechanism", "rr-ind", "--estimator", "rr-adjustment",
                      "--estimator", "rr-adjustment-full", "--ways", "2", "--subsets", "2",
                      "--epsilon", "1", "--json")
    assert rc == 0
    rows = {r["estimator"]: r for r in json.loads(out)["results"]}
    assert set(rows) == {"rr-adjustment", "rr-adjustment-full"}
    for r in rows.values():
        assert r["converged_fraction"] == 1.0 and r["iterations"] >= 1
        assert 0 < r["metrics"]["tvd"] < 0.5
    assert rows["rr-adjustment"]["metrics"]["tvd"] != rows["rr-adjustment-full"]["metrics"]["tvd"]
    rc, _, err = _run(capsys, "--mechanism", "rr-joint", "--estimator", "rr-adjustment-full",
                      "--subsets", "1")
    assert rc == 2 and "'rr-adjustment-full'" in err
