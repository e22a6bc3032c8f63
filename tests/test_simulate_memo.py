"""``ldpstream simulate --memoize`` (docs/simulate.md "Memoization"): every row spends the same
ε per device per day, computed from the mechanism's channels (fresh: R × ε per report;
memoized: the guarantee's per-day ε); a family that cannot memoize is refused by name; the
memoized estimate does not get worse with more copies of one report."""
from __future__ import annotations

import json

import pytest

from ldpstream.cli import CliError, build_parser
from ldpstream.simulate.command import main

pytestmark = pytest.mark.core

GEN = "corr:m=3,d=4,rho=0.6,n=3000"


def _run(capsys, *extra: str) -> dict:
    args = build_parser().parse_args(["simulate", "--memoize", "--generator", GEN, "--json",
                                      "--epsilon", "2", "--runs", "2", *extra])
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_rows_spend_the_same_epsilon_per_day(capsys):
    doc = _run(capsys, "--reports-per-device", "1,4", "--memo-mechanisms", "partitioned,rr-ind")
    rows = doc["rows"]
    assert {(r["mechanism"], r["mode"], r["reports_per_device"]) for r in rows} == {
        (m, mode, r) for m in ("partitioned", "rr-ind") for mode in ("fresh", "memoized")
        for r in (1, 4)}
    for r in rows:
        assert r["epsilon_per_day"] == pytest.approx(2.0, rel=1e-6)
        if r["mode"] == "fresh":
            assert r["epsilon_per_report"] * r["reports_per_device"] == pytest.approx(2.0)
            assert r["epsilon_per_rotation"] is None
        else:   # daily rotation: a 24 h window meets two periods, each gets half
            assert r["epsilon_per_rotation"] == pytest.approx(1.0, rel=1e-6)
        assert 0.0 <= r["tvd"] <= 1.0 and r["tvd_stderr"] is not None
        assert (r["tvd_devices"] is None) == (r["mode"] == "fresh")
    # without an instantaneous layer one device's R reports are one response: counted once
    # per device, the estimate is the same whatever R (same seeds, same responses)
    for m in ("partitioned", "rr-ind"):
        one, four = (next(r for r in rows if r["mechanism"] == m and r["mode"] == "memoized"
                          and r["reports_per_device"] == k) for k in (1, 4))
        assert one["tvd_devices"] == pytest.approx(four["tvd_devices"], rel=1e-12)
        assert one["tvd"] == pytest.approx(one["tvd_devices"], rel=1e-12)


def test_instantaneous_layer_lowers_the_epsilon_per_report(capsys):
    doc = _run(capsys, "--reports-per-device", "3", "--memo-mechanisms", "partitioned",
               "--instantaneous-epsilon", "1")
    memo = [r for r in doc["rows"] if r["mode"] == "memoized"][0]
    assert memo["epsilon_per_report"] < memo["epsilon_per_rotation"]
    assert memo["epsilon_per_day"] == pytest.approx(2.0, rel=1e-6)


def test_every_memoizing_family_runs_with_family_parameters(capsys):
    doc = _run(capsys, "--reports-per-device", "2", "--memo-mechanisms",
               "spl,smp,rr-joint,rr-clusters", "--param", "rr-clusters:clusters=[[X1, X2], [X3]]")
    assert {r["mechanism"] for r in doc["rows"]} == {"spl", "smp", "rr-joint", "rr-clusters"}
    for r in doc["rows"]:
        assert r["epsilon_per_day"] == pytest.approx(2.0, rel=1e-6)
    with pytest.raises(CliError, match="--param: rr-joint: clusters"):
        _run(capsys, "--memo-mechanisms", "rr-joint", "--param", "clusters=[[X1], [X2, X3]]")


def test_a_family_that_cannot_memoize_is_refused_by_name(capsys):
    with pytest.raises(CliError, match="lopub cannot memoize"):
        _run(capsys, "--reports-per-device", "2", "--memo-mechanisms", "lopub")
