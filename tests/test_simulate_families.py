"""``ldpstream simulate`` across the mechanism families: the JSON schema every family shares
(computed ``epsilon_per_record``, a ``metrics`` object per result row), ``--epsilon`` validated
for every family, and families that derive ε from their own parameters (rrba: p and γ; lopub: f
and the Bloom filters) either solving from it or refusing it in one line."""
import json

import numpy as np
import pytest

from ldpstream import cli
from ldpstream.datasets import load_csv
from ldpstream.estimators.lopub import LoPub
from ldpstream.estimators.rrba import RRBA

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


def _rrba(capsys, toy_csv, *argv):
    rc, out, err = _run(capsys, "--mechanism", "rrba", "--data", str(toy_csv), "--columns",
                        "a,b,c,d", "--block-size", "100", "--ways", "2", "--subsets", "2", "--json",
                        *argv)
    assert rc == 0, err
    return json.loads(out)


def _rrba_epsilon(toy_csv, p, gamma):
    return RRBA(load_csv(toy_csv, list("abcd")).domain, p, gamma, 2).epsilon


def _check_rows(doc, metric_keys):
    assert doc["results"]
    for r in doc["results"]:
        assert isinstance(r["metrics"], dict) and set(r["metrics"]) == metric_keys
        assert all(np.isfinite(v) for v in r["metrics"].values())
        assert {"estimator", "w", "subsets", "seconds"} <= set(r)


def test_rrba_schema_and_epsilon_solved_for_p(capsys, toy_csv):
    doc = _rrba(capsys, toy_csv, "--epsilon", "12")
    # p solved so that the computed per-record ε is the target (γ at its default 0.05)
    assert doc["epsilon_target"] == 12.0 and doc["gamma"] == 0.05
    assert doc["epsilon_per_record"] == doc["epsilon"] == pytest.approx(12.0, rel=1e-9)
    assert doc["epsilon_per_record"] == pytest.approx(_rrba_epsilon(toy_csv, doc["p"], 0.05))
    _check_rows(doc, {"l2_counts", "jsd", "tvd"})
    assert {"block_size", "reports_until_convergence", "derivation"} <= set(doc["results"][0])


def test_rrba_epsilon_with_p_solves_gamma(capsys, toy_csv):
    doc = _rrba(capsys, toy_csv, "--epsilon", "12", "--p", "0.5")
    assert doc["p"] == 0.5 and 0 < doc["gamma"] <= 1 and doc["gamma"] != 0.05
    assert doc["epsilon_per_record"] == pytest.approx(12.0, rel=1e-9)
    assert doc["epsilon_per_record"] == pytest.approx(_rrba_epsilon(toy_csv, 0.5, doc["gamma"]))


def test_rrba_p_and_gamma_without_epsilon_unchanged(capsys, toy_csv):
    doc = _rrba(capsys, toy_csv, "--p", "0.5", "--gamma", "0.1")
    assert doc["epsilon_target"] is None and (doc["p"], doc["gamma"]) == (0.5, 0.1)
    assert doc["epsilon"] == pytest.approx(_rrba_epsilon(toy_csv, 0.5, 0.1))
    # nothing given: p solved for the default ε = 1.0 (as before the --epsilon default became
    # None in the parser)
    doc = _rrba(capsys, toy_csv)
    assert doc["epsilon"] == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("argv,needle", [
    (["--epsilon", "12", "--p", "0.5", "--gamma", "0.1"], "at most two of --epsilon, --p, --gamma"),
    (["--epsilon", "0.5", "--p", "0.9"], "lower p"),  # below the ε of p = 0.9 even at γ = 1
])
def test_rrba_epsilon_overdetermined_or_infeasible(capsys, toy_csv, argv, needle):
    rc, out, err = _run(capsys, "--mechanism", "rrba", "--data", str(toy_csv), "--columns",
                        "a,b,c,d", *argv)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "--epsilon" in err and needle in err


def test_lopub_schema_epsilon_is_the_exact_one(capsys):
    rc, out, err = _run(capsys, "--mechanism", "lopub", "--f", "0.5", "--columns", ADULT3,
                        "--ways", "2", "--subsets", "2", "--runs", "2", "--estimator",
                        "cooccurrence", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    mech = LoPub(load_csv(None, ADULT3.split(",")).domain, f=0.5, seed=0)
    assert doc["epsilon"] == doc["epsilon_per_record"] == pytest.approx(mech.epsilon_exact)
    assert doc["epsilon_eq8"] == pytest.approx(mech.epsilon_eq8) and doc["epsilon_eq8"] > doc["epsilon"]
    assert doc["epsilon_attribute_eq8"] == pytest.approx(mech.epsilon_attribute)
    _check_rows(doc, {"tvd"})
    for r in doc["results"]:
        assert set(r["stderr"]) == {"tvd"} and "em_iterations" in r


def test_lopub_rejects_epsilon(capsys):
    rc, out, err = _run(capsys, "--mechanism", "lopub", "--f", "0.5", "--columns", ADULT3,
                        "--epsilon", "3")
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--epsilon" in lines[0] and "--f" in lines[0]


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


def test_corr_family_default_epsilon(capsys):
    rc, out, err = _run(capsys, "--mechanism", "corr-rr", "--generator",
                        "corr:m=3,d=3,rho=0.8,n=2000", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["epsilon"] == 1.0 and doc["epsilon_per_record"] == pytest.approx(1.0)


def test_rr_family_default_epsilon(capsys):
    rc, out, err = _run(capsys, "--mechanism", "rr-ind", "--columns", ADULT3, "--ways", "2",
                        "--subsets", "1", "--estimator", "castell", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["epsilon"] == 1.0 and doc["epsilon_per_record"] == pytest.approx(3.0)



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
    rc, out, err = _run(capsys, *family, "--data", str(toy_csv), "--ways", "2", "--subsets", "1",
                        "--json")
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
