"""Numeric attributes in the config and in CSVs (docs/numeric.md "Declaring a numeric attribute"): the schema
forms, errors naming the offending field, clipping counted, and a family without the numeric
capability refused."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ldpstream.config import ConfigError, parse_config
from ldpstream.datasets import DatasetError, load_csv

pytestmark = pytest.mark.core


def _cfg(schema, mech="sw-hm", marginals=(("temp",),), estimators=("mean",)):
    return {"collections": [{"id": "t", "schema": schema, "mechanism": mech, "epsilon": 1,
                             "marginals": [list(m) for m in marginals],
                             "estimators": list(estimators)}]}


def test_a_numeric_attribute_builds_the_numeric_family():
    app = parse_config(_cfg({"attributes": {"temp": {"numeric": {"min": -20, "max": 50}},
                                            "fw": ["a", "b"]}}), env={})
    coll = app.collections["t"]
    assert coll.domain.ranges == ((-20.0, 50.0), None)
    assert coll.domain.shape == (1025, 2)
    mech = coll.mechanism()
    assert mech.ranges["temp"] == (-20.0, 50.0)
    assert mech.epsilon == pytest.approx(2.0, rel=1e-9)     # 1 per attribute, from the channels


@pytest.mark.parametrize("schema, mech, where", [
    ({"attributes": {"temp": {"numeric": {"min": -20, "max": "x"}}}}, "sw-hm",
     "schema.attributes.temp.numeric.max: must be a finite number"),
    ({"attributes": {"temp": {"numeric": {"min": 20, "max": 10}}}}, "sw-hm",
     "schema.attributes.temp.numeric: min must be below max"),
    ({"attributes": {"temp": {"numerik": {"min": 0, "max": 1}}}}, "sw-hm",
     "schema.attributes.temp: a numeric attribute is {numeric: {min: a, max: b}}"),
    ({"attributes": {"temp": {"numeric": {"min": 0, "max": 1, "grid": 2}}}}, "sw-hm",
     "schema.attributes.temp.numeric.grid: must be an integer in 3..65536"),
    ({"csv": {"columns": ["age", "sex"], "numeric": {"agee": {"min": 17, "max": 90}}}},
     "sw-hm", "schema.csv.numeric.agee: not among the columns age, sex; did you mean 'age'?"),
    ({"attributes": {"temp": {"numeric": {"min": 0, "max": 1}}, "fw": ["a", "b"]}}, "rr-ind",
     "mechanism: attribute 'temp' is numeric: rr-ind randomizes categories"),
])
def test_errors_name_the_field(schema, mech, where):
    marg = (("age",),) if "csv" in schema else (("temp",),)
    est = ("castell",) if mech == "rr-ind" else ("mean",)
    with pytest.raises(ConfigError) as ei:
        parse_config(_cfg(schema, mech, marg, est), env={})
    assert f"collections[0].{where}" in str(ei.value)


def test_adult_numeric_columns_load_as_they_are():
    app = parse_config(_cfg({"csv": {"columns": ["age", "hours-per-week"], "numeric": {
        "age": {"min": 17, "max": 90}, "hours-per-week": {"min": 0, "max": 100, "grid": 201}}}},
        marginals=(("age",), ("hours-per-week",)), estimators=("distribution", "mean")), env={})
    dom = app.collections["t"].domain
    assert dom.shape == (1025, 201) and dom.ranges == ((17.0, 90.0), (0.0, 100.0))
    ds = load_csv(None, ["age", "hours-per-week"], numeric={"age": None, "hours-per-week": None})
    assert ds.domain.ranges == ((17.0, 90.0), (1.0, 99.0)) and ds.clipped == {
        "age": 0, "hours-per-week": 0}
    assert ds.values["age"].mean() == pytest.approx(38.58, abs=0.01)


def test_clipping_is_counted_and_bad_numbers_named(tmp_path: Path):
    f = tmp_path / "t.csv"
    f.write_text("temp,fw\n-30,a\n10,b\n60,a\n20,b\n")
    ds = load_csv(f, ["temp", "fw"], numeric={"temp": (-20, 50, 71)})
    assert ds.clipped == {"temp": 2}
    assert np.asarray(ds.records)[:, 0].tolist() == [0, 30, 70, 40]
    f.write_text("temp,fw\n-30,a\nwarm,b\n")
    with pytest.raises(DatasetError, match="numeric column 'temp' has value 'warm' on line 3"):
        load_csv(f, ["temp", "fw"], numeric={"temp": None})
    with pytest.raises(DatasetError, match="numeric column 'tmp' is not among the columns"):
        load_csv(f, ["temp", "fw"], numeric={"tmp": None})


def test_simulate_numeric_reads_adult_columns_as_they_are(capsys):
    from ldpstream import cli
    rc = cli.main(["simulate", "--numeric", "age,hours-per-week=0:100", "--epsilon", "2",
                   "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    import json
    doc = json.loads(out)
    assert doc["mechanism"] == "sw-hm" and doc["n"] == 32_561
    assert doc["epsilon_per_record"] == pytest.approx(4.0, rel=1e-9)
    age, hours = doc["attributes"]["age"], doc["attributes"]["hours-per-week"]
    assert age["range"] == [17.0, 90.0] and hours["range"] == [0.0, 100.0]
    assert age["true"]["mean"] == pytest.approx(38.58, abs=0.01)
    # n = 16,000 mean reports at ε = 2: the standard error of the mean is about 0.3 years
    assert age["mean_error"] < 1.5 and age["w1_range"] < 0.02
    assert set(age["quantile_error"]) == {"q0.5", "q0.9", "q0.99"}


def test_simulate_numeric_errors(capsys):
    from ldpstream import cli
    assert cli.main(["simulate", "--numeric", "age", "--mechanism", "rr-ind"]) == 2
    assert "rr-ind randomizes categories" in capsys.readouterr().err
    assert cli.main(["simulate", "--numeric", "age=90:17"]) == 2
    assert "MIN < MAX" in capsys.readouterr().err
