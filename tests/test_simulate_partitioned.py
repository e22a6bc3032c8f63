"""``ldpstream simulate --mechanism partitioned`` (the common JSON: computed ε per record, a
``metrics`` object on every row) and ``simulate --compare`` (split vs partitioned at the same ε
per record, side by side), and the quick marginals bench."""
import json

import pytest

from ldpstream import cli
from ldpstream.estimators.families.partitioned import choose_ways

pytestmark = pytest.mark.core

#: sizes of sex, Salary, race, relationship, marital-status in the bundled Adult
SHAPE5 = (2, 2, 5, 6, 7)


def _json(capsys, *argv):
    assert cli.main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_partitioned_common_json(capsys):
    doc = _json(capsys, "--mechanism", "partitioned", "--columns", "sex,Salary,race,relationship",
                "--epsilon", "2", "--epsilon-scope", "record", "--ways", "2,3", "--subsets", "3")
    assert doc["mechanism"] == "partitioned"
    assert doc["epsilon_per_record"] == pytest.approx(2.0, rel=1e-9)
    assert {(r["estimator"], r["w"]) for r in doc["results"]} == {
        ("global", 2), ("global", 3), ("consistent", 2), ("consistent", 3)}
    for r in doc["results"]:
        assert 0 <= r["metrics"]["tvd"] < 0.5


def test_simulate_partitioned_attribute_scope_costs_m_epsilon(capsys):
    doc = _json(capsys, "--mechanism", "partitioned", "--columns", "sex,Salary,race",
                "--epsilon", "0.5", "--ways", "2", "--subsets", "2", "--estimator", "unbiased",
                "--param", "oracles=[grr]")
    assert doc["epsilon_per_record"] == pytest.approx(1.5, rel=1e-9)


def test_simulate_compare_split_vs_partitioned(capsys):
    doc = _json(capsys, "--compare", "--columns", "sex,Salary,race,relationship,marital-status",
                "--epsilon", "1", "--epsilon-scope", "record", "--ways", "2", "--subsets", "4")
    assert doc["compare"] == ["rr-ind", "partitioned"]
    assert doc["epsilon_per_record"] == {"rr-ind": pytest.approx(1.0),
                                         "partitioned": pytest.approx(1.0)}
    assert {(r["mechanism"], r.get("ways"), r["estimator"]) for r in doc["results"]} == {
        ("rr-ind", None, "castell"), ("rr-ind", None, "ibu"),
        ("partitioned", 2, "consistent"), ("partitioned", 2, "calm"),
        ("partitioned", 2, "global"), ("partitioned", 3, "consistent"),
        ("partitioned", 3, "calm"), ("partitioned", 3, "global")}
    assert all("metrics" in r for r in doc["results"])
    best = doc["best"]["2"]
    tvds = [r["metrics"]["tvd"] for r in doc["results"]]
    assert best["tvd"] == min(tvds) and best["ratio"] > 0
    assert doc["auto_ways"] == choose_ways(SHAPE5, doc["n"], 1.0)
    assert cli.main(["simulate", "--compare", "--columns", "sex,Salary,race", "--ways", "2",
                     "--subsets", "2"]) == 0
    assert "lowest TVD" in capsys.readouterr().out


def test_simulate_compare_refuses_estimator_and_one_column(capsys):
    assert cli.main(["simulate", "--compare", "--estimator", "ibu"]) != 0
    assert "--compare" in capsys.readouterr().err
    assert cli.main(["simulate", "--compare", "--columns", "sex", "--ways", "1"]) != 0
    assert "at least 2 columns" in capsys.readouterr().err


def test_simulate_compare_measures_the_size_auto_picks_at_large_epsilon(capsys):
    """At ε = 8 per record on four Adult columns ``ways: auto`` declares the whole record
    (4 attributes): ``--compare`` runs that size beside pairs and triples."""
    doc = _json(capsys, "--compare", "--columns", "sex,Salary,race,relationship",
                "--epsilon", "8", "--epsilon-scope", "record", "--ways", "2", "--subsets", "3")
    assert doc["auto_ways"] == choose_ways((2, 2, 5, 6), doc["n"], 8.0) == 4
    assert {r.get("ways") for r in doc["results"] if r["mechanism"] == "partitioned"} == \
        {2, 3, 4}
