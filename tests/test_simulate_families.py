"""``ldpstream simulate`` across the mechanism families: the JSON schema every family shares
(computed ``epsilon_per_record``, a ``metrics`` object per result row), ``--epsilon`` validated
for every family, and families that derive ε from their own parameters (rrba: p and γ; lopub: f
and the Bloom filters) either solving from it or refusing it in one line."""
import json

import numpy as np
import pytest

from ldpstream import cli
from ldpstream.datasets import load_csv
from ldpstream.estimators.families.lopub import LoPub
from ldpstream.estimators.families.rrba import RRBA
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.mechanism import PROVIDERS

pytestmark = [pytest.mark.core, pytest.mark.slow]

ADULT3 = "sex,Salary,race"


@pytest.fixture(scope="module")
def toy_csv(tmp_path_factory):
    rng = np.random.default_rng(0)
    n = 3000
    a = rng.choice(["x", "y", "z"], n)
    b = np.where(rng.random(n) < 0.7, a, rng.choice(["x", "y", "z"], n))
    c = rng.choice(["p", "q"], n)
    d = np.where(rng.random(n) < 0.6, c, rng.choice(["p", "q"], n))
    path = tmp_path_factory.mktemp("fam") / "toy.csv"
    path.write_text("a,b,c,d\n" + "\n".join(",".join(r) for r in zip(a, b, c, d)) + "\n")
    return path


def _run(capsys, *argv):
    rc = cli.main(["simulate", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


TOP_KEYS = {"mechanism", "n", "m", "epsilon", "epsilon_scope", "epsilon_per_record",
            "longitudinal", "over_time", "parameters", "seed", "runs", "results"}
METRIC_KEYS = {"tvd", "max_abs", "mae", "mse", "l2_counts", "jsd"}


def _rrba(capsys, toy_csv, *argv):
    rc, out, err = _run(capsys, "--mechanism", "rrba", "--data", str(toy_csv), "--columns",
                        "a,b,c,d", "--block-size", "100", "--ways", "2", "--subsets", "2", "--json",
                        "--epsilon-scope", "record", *argv)
    assert rc == 0, err
    return json.loads(out)


def _rrba_epsilon(toy_csv, p, gamma):
    return RRBA(load_csv(toy_csv, list("abcd")).domain, p, gamma, 2).epsilon


def _check_doc(doc):
    """The one schema of every family: top-level keys, and every row has ``metrics``."""
    assert set(doc) == TOP_KEYS
    assert doc["results"]
    for r in doc["results"]:
        assert isinstance(r["metrics"], dict) and set(r["metrics"]) == METRIC_KEYS
        assert all(np.isfinite(v) for v in r["metrics"].values())
        assert {"mechanism", "estimator", "w", "subsets", "seconds", "reports",
                "versions"} <= set(r)


def test_rrba_schema_and_epsilon_solved_for_p(capsys, toy_csv):
    doc = _rrba(capsys, toy_csv, "--epsilon", "12")
    # p solved so that the computed per-record ε is the target (γ at its default 0.05)
    assert doc["epsilon"] == 12.0 and doc["parameters"]["gamma"] == 0.05
    assert doc["epsilon_per_record"] == pytest.approx(12.0, rel=1e-9)
    assert doc["epsilon_per_record"] == pytest.approx(
        _rrba_epsilon(toy_csv, doc["parameters"]["p"], 0.05))
    _check_doc(doc)
    assert {r["block_size"] for r in doc["results"]} == {100}
    assert all(1 <= r["versions"] and r["reports"] <= 3000 for r in doc["results"])


def test_rrba_epsilon_with_p_solves_gamma(capsys, toy_csv):
    doc = _rrba(capsys, toy_csv, "--epsilon", "12", "--p", "0.5")
    par = doc["parameters"]
    assert par["p"] == 0.5 and 0 < par["gamma"] <= 1 and par["gamma"] != 0.05
    assert doc["epsilon_per_record"] == pytest.approx(12.0, rel=1e-9)
    assert doc["epsilon_per_record"] == pytest.approx(_rrba_epsilon(toy_csv, 0.5, par["gamma"]))


def test_rrba_p_and_gamma_without_epsilon(capsys, toy_csv):
    doc = _rrba(capsys, toy_csv, "--p", "0.5", "--gamma", "0.1")
    assert doc["epsilon"] is None
    assert (doc["parameters"]["p"], doc["parameters"]["gamma"]) == (0.5, 0.1)
    assert doc["epsilon_per_record"] == pytest.approx(_rrba_epsilon(toy_csv, 0.5, 0.1))
    # nothing given: p solved for the default ε = 1.0 (per record here)
    doc = _rrba(capsys, toy_csv)
    assert doc["epsilon_per_record"] == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("argv,needle", [
    (["--epsilon", "12", "--p", "0.5", "--gamma", "0.1"], "at most two of epsilon, p, gamma"),
    (["--epsilon", "0.5", "--p", "0.9"], "lower p"),  # below the ε of p = 0.9 even at γ = 1
])
def test_rrba_epsilon_overdetermined_or_infeasible(capsys, toy_csv, argv, needle):
    rc, out, err = _run(capsys, "--mechanism", "rrba", "--data", str(toy_csv), "--columns",
                        "a,b,c,d", "--epsilon-scope", "record", *argv)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err
    assert "--gamma" in err or "--p" in err


def test_lopub_schema_epsilon_is_the_exact_one(capsys):
    rc, out, err = _run(capsys, "--mechanism", "lopub", "--f", "0.5", "--columns", ADULT3,
                        "--ways", "2", "--subsets", "2", "--runs", "2", "--estimator",
                        "cooccurrence", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    mech = LoPub(load_csv(None, ADULT3.split(",")).domain, f=0.5, seed=0)
    assert doc["epsilon_per_record"] == pytest.approx(mech.epsilon_exact)
    assert doc["parameters"]["f"] == 0.5
    _check_doc(doc)
    for r in doc["results"]:
        assert set(r["stderr"]) == METRIC_KEYS


def test_lopub_solves_f_from_epsilon_and_refuses_both(capsys):
    rc, out, err = _run(capsys, "--mechanism", "lopub", "--columns", ADULT3, "--epsilon", "3",
                        "--epsilon-scope", "record", "--ways", "2", "--subsets", "1",
                        "--estimator", "lasso", "--json")
    assert rc == 0, err
    assert json.loads(out)["epsilon_per_record"] == pytest.approx(3.0, rel=1e-9)
    rc, out, err = _run(capsys, "--mechanism", "lopub", "--f", "0.5", "--columns", ADULT3,
                        "--epsilon", "3")
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ldpstream: error: --f: ")


@pytest.mark.parametrize("family", [
    ["--mechanism", "rr-ind"],
    ["--mechanism", "rrba", "--p", "0.5"],
    ["--mechanism", "lopub"],
    ["--mechanism", "corr-rr", "--generator", "corr:m=3,d=3,rho=0.8,n=2000"],
], ids=lambda f: f[1])
@pytest.mark.parametrize("bad", ["nan", "0", "-1", "inf"])
def test_epsilon_validated_for_every_family(capsys, family, bad):
    rc, out, err = _run(capsys, *family, "--epsilon", bad, "--subsets", "1")
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ldpstream: error: --epsilon: ")
    assert "finite number > 0" in lines[0]


def test_ways_a_mechanism_cannot_serve_is_one_line(capsys):
    rc, out, err = _run(capsys, "--mechanism", "corr-rr", "--generator",
                        "corr:m=3,d=3,rho=0.8,n=2000", "--ways", "2")
    assert rc == 2 and out == ""
    assert err.strip() == ("ldpstream: error: --ways: corr-rr estimates one-way marginals only "
                           "(got 2-way)")


def test_corr_family_one_way_and_default_epsilon(capsys):
    rc, out, err = _run(capsys, "--mechanism", "corr-rr", "--generator",
                        "corr:m=3,d=3,rho=0.8,n=2000", "--epsilon-scope", "record", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    _check_doc(doc)
    assert doc["epsilon_per_record"] == pytest.approx(1.0)
    # one-way marginals only: the default ways; two versions (Phase I, then the table)
    assert [r["w"] for r in doc["results"]] == [1] and doc["results"][0]["versions"] == 2


def test_rr_family_default_epsilon(capsys):
    rc, out, err = _run(capsys, "--mechanism", "rr-ind", "--columns", ADULT3, "--ways", "2",
                        "--subsets", "1", "--estimator", "castell", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["epsilon_per_record"] == pytest.approx(3.0)


@pytest.mark.parametrize("name", list(PROVIDERS))
def test_every_family_runs_through_the_one_driver(capsys, toy_csv, name):
    """Same schema for every family; the estimate is exactly what estimate_versions gives on the
    driver's counts (what the worker computes from the same counts)."""
    rc, out, err = _run(capsys, "--mechanism", name, "--data", str(toy_csv), "--subsets", "1",
                        "--epsilon", "2", "--json")
    assert rc == 0, err
    _check_doc(json.loads(out))


def test_simulate_equals_estimate_versions_on_the_same_counts(toy_csv):
    from ldpstream.simulate.driver import Plan, build, draw_subsets, drive, simulate
    ds = load_csv(toy_csv, list("abcd"))
    for name, est, w in (("rrba", "pooled", 2), ("corr-rr", "corr-rr", 1),
                         ("rr-clusters", "castell", 2)):
        attrs = tuple(ds.domain.attrs[i] for i in draw_subsets(4, w, 1, 3)[0])
        plan = Plan(ds, name, (est,), (w,), 1, seed=3, epsilon=2.0,
                    params={"block_size": 100} if name == "rrba" else {},
                    metrics=("tvd",))
        doc = simulate(plan)
        run = drive(build(plan), ds.records, np.random.default_rng([3, 0]), [attrs])
        value = run.mechanism.estimate_versions(run.counts, attrs, est).factor.values
        truth = np.bincount(np.ravel_multi_index(tuple(ds.records[:, ds.domain.axes((a,))[0]]
                                                       .astype(np.intp) for a in attrs),
                                                 ds.domain.project(attrs).shape),
                            minlength=ds.domain.size(attrs)).reshape(
                                ds.domain.project(attrs).shape) / ds.n
        (row,) = doc["results"]
        assert row["metrics"]["tvd"] == pytest.approx(0.5 * np.abs(value - truth).sum()), name
        assert row["versions"] == len(run.versions) >= 2, name



# --- --data without --columns: every column of the CSV ------------------------------------------

def test_load_csv_defaults_to_every_header_column(toy_csv):
    ds = load_csv(toy_csv)
    assert ds.domain.attrs == ("a", "b", "c", "d") and ds.domain.shape == (3, 3, 2, 2)
    assert ds.n == 3000
    assert load_csv(None).domain.attrs[0] == "workclass"  # no path: the bundled Adult columns


@pytest.mark.parametrize("family", [
    ["--mechanism", "rr-ind", "--estimator", "castell"],
    ["--mechanism", "rrba", "--p", "0.5", "--block-size", "200"],
    ["--mechanism", "lopub", "--estimator", "cooccurrence"],
    ["--mechanism", "corr-rr"],
], ids=lambda f: f[1])
def test_data_without_columns_uses_the_csv_header(capsys, toy_csv, family):
    rc, out, err = _run(capsys, *family, "--data", str(toy_csv), "--subsets", "1", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["n"] == 3000 and doc["m"] == 4


@pytest.mark.parametrize("text,needle", [("", "no header"), ("\n\n", "no header"),
                                         ("a,b\n", "no records"),
                                         ("a,,c\nx,y,z\n", "empty column name")])
@pytest.mark.parametrize("mechanism", ["rr-ind", "rrba", "lopub", "corr-rr"])
def test_unusable_csv_is_one_clear_line(capsys, tmp_path, text, needle, mechanism):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    rc, out, err = _run(capsys, "--mechanism", mechanism, "--data", str(path))
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and str(path) in lines[0]
    assert "StopIteration" not in lines[0]


# --- the one driver against the previous per-family pipelines, in distribution ------------------

def _mean_se(xs):
    xs = np.asarray(xs, dtype=float)
    return xs.mean(), xs.std(ddof=1) / np.sqrt(len(xs))


def test_corr_rr_driver_matches_the_two_phase_pipeline_in_distribution():
    """Phase I then the table then Phase II through the driver (Phase I = the first round(β·n)
    arrivals) has the MSE of the previous pipeline (a random round(β·n) in Phase I, table, the rest
    in Phase II): means within 3 standard errors over 8 seeded runs."""
    from ldpstream.estimators.families.corr_rr import CorrRR
    from ldpstream.estimators.families.corr_rr_paper import run_two_phase
    from ldpstream.estimators.families.multi_baselines import marginal_mse
    from ldpstream.producers.synthetic import generate, parse_spec
    from ldpstream.simulate.driver import Plan, build, drive
    ds = generate(parse_spec("corr:m=3,d=3,rho=0.7,n=4000,seed=1"))
    truth = [np.bincount(ds.records[:, j], minlength=3) / ds.n for j in range(3)]
    plan = Plan(ds, "corr-rr", ("corr-rr",), (1,), 3, epsilon=1.0, scope="record")
    new, old = [], []
    for r in range(8):
        run = drive(build(plan), ds.records, np.random.default_rng([11, r]),
                    [(a,) for a in ds.domain.attrs])
        new.append(marginal_mse([run.mechanism.estimate_versions(run.counts, (a,), "corr-rr")
                                 .factor.values for a in ds.domain.attrs], truth))
        mech, counts = run_two_phase(CorrRR(ds.domain, 1.0, 0.1), ds.records,
                                     np.random.default_rng([12, r]))
        old.append(marginal_mse(mech.estimate_all(counts), truth))
    (mn, sn), (mo, so) = _mean_se(new), _mean_se(old)
    assert abs(mn - mo) < 3 * np.hypot(sn, so), (mn, sn, mo, so)


def test_rrba_driver_matches_the_per_view_block_loop_in_distribution():
    """RRBA through the driver (each device picks an open view at random) converges with about
    the reports of the paper's per-view loop and its pooled 2-way tables are as accurate."""
    from ldpstream.bench.mech_rrba import run_once
    from ldpstream.simulate.driver import Plan, build, drive
    rng0 = np.random.default_rng(0)
    n = 6000
    a = rng0.integers(0, 2, n)
    b = np.where(rng0.random(n) < 0.8, a, rng0.integers(0, 2, n))
    c = rng0.integers(0, 3, n)
    from ldpstream.datasets import Dataset
    ds = Dataset(Domain(("a", "b", "c"), (2, 2, 3)), np.stack([a, b, c], axis=1))
    plan = Plan(ds, "rrba", ("pooled",), (2,), 3, epsilon=None, scope="record",
                params={"p": 0.8, "gamma": 0.05, "block_size": 200})
    pairs = [("a", "b"), ("a", "c"), ("b", "c")]
    truth = {s: np.histogram2d(ds.records[:, ds.domain.axes(s)[0]],
                               ds.records[:, ds.domain.axes(s)[1]],
                               bins=ds.domain.project(s).shape,
                               range=[(0, d) for d in ds.domain.project(s).shape])[0] / n
             for s in pairs}
    new_r, old_r, new_t, old_t = [], [], [], []
    for r in range(8):
        mech0 = build(plan)
        run = drive(mech0, ds.records, np.random.default_rng([21, r]), pairs)
        new_r.append(run.randomized)
        new_t.append(np.mean([0.5 * np.abs(run.mechanism.estimate_versions(
            run.counts, s, "pooled").factor.values - truth[s]).sum() for s in pairs]))
        tables, info = run_once(ds, mech0, np.random.default_rng([22, r]))
        old_r.append(info["reports"])
        old_t.append(np.mean([0.5 * np.abs(mech0.marginal(tables["pooled"], s)[0]
                                           - truth[s]).sum() for s in pairs]))
    (mn, sn), (mo, so) = _mean_se(new_t), _mean_se(old_t)
    assert abs(mn - mo) < 3 * np.hypot(sn, so) + 0.005, (mn, mo)
    (rn, _), (ro, _) = _mean_se(new_r), _mean_se(old_r)
    assert 0.5 * ro < rn < 2 * ro, (rn, ro)
