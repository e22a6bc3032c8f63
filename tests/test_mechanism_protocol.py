"""The mechanism protocol every family implements: built from a config mapping and from published
state, one registry of names, the adaptive step, versioned estimates, servable marginals, and the
config errors that come from it."""
import inspect
import json

import numpy as np
import pytest

from ldpstream.config import ConfigError, parse_config
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.mechanism import (
    PROVIDERS,
    Mechanism,
    ParamError,
    from_state,
    mechanism_class,
    mechanism_names,
)

pytestmark = [pytest.mark.core, pytest.mark.slow]

DOM = Domain.from_categories({"a": ["x", "y", "z"], "b": ["x", "y", "z"], "c": ["x", "y", "z"]})
#: small parameters so that every family builds fast
PARAMS = {"rrba": {"block_size": 50}, "rr-clusters": {"cluster_reports": 500},
          "corr-rr": {"phase1_reports": 500}, "corr-rr-paper": {"phase1_reports": 500},
          "lopub": {"bits": 16, "hashes": 2}, "rs-rfd": {"phase1_reports": 300}}
ADAPTIVE = {"rrba", "rr-clusters", "corr-rr", "corr-rr-paper", "rs-rfd"}


def build(name, epsilon=2.0, scope="record", **params):
    return mechanism_class(name).from_config(DOM, {**PARAMS.get(name, {}), **params},
                                             epsilon=epsilon, epsilon_scope=scope)


def records(n, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 3, n)
    b = np.where(rng.random(n) < 0.8, a, rng.integers(0, 3, n))
    return np.stack([a, b, rng.integers(0, 3, n)], axis=1)


def test_one_registry_lists_every_family():
    assert mechanism_names() == tuple(PROVIDERS) == (
        "rr-ind", "rr-joint", "rr-clusters", "rrba", "corr-rr", "corr-rr-paper", "spl", "smp",
        "rs-fd", "rs-rfd", "lopub", "partitioned", "sw-hm")
    with pytest.raises(ValueError) as ei:
        mechanism_class("rr-indd")
    assert str(ei.value) == ("unknown mechanism 'rr-indd' (known: " + ", ".join(PROVIDERS)
                             + "); did you mean 'rr-ind'?")


@pytest.mark.parametrize("name", list(PROVIDERS))
def test_from_config_and_from_state_on_every_family(name):
    cls = mechanism_class(name)
    mech = build(name)
    assert isinstance(mech, cls) and mech.version == 0
    # ε is computed from the channel; the record budget is what the config asked for
    assert mech.epsilon == pytest.approx(2.0, rel=1e-6) or name == "rs-fd"
    state = json.loads(json.dumps(mech.state()))
    back = from_state(state)
    assert type(back) is cls and back.state() == state and back.epsilon == mech.epsilon
    # randomize takes (records, rng) only: the phase / view is part of the state
    assert list(inspect.signature(cls.randomize).parameters) == ["self", "records", "rng"]
    reports = mech.randomize(records(200), np.random.default_rng(1))
    assert reports.shape == (200, mech.report_width)
    assert np.all(reports < mech.report_bounds())
    # the ABC declares the whole protocol
    for hook in ("from_config", "from_state"):
        assert hook in Mechanism.__abstractmethods__


def test_params_are_validated_naming_the_field():
    with pytest.raises(ParamError) as ei:
        build("rrba", block_size=0)
    assert ei.value.field == "block_size" and "must be an integer >= 1" in str(ei.value)
    with pytest.raises(ParamError) as ei:
        build("spl", colour=1)
    assert str(ei.value) == "colour: unknown parameter for spl (allowed: memoize)"
    with pytest.raises(ParamError) as ei:
        build("rrba", p=0.5, gamma=0.1)
    assert ei.value.field == "gamma"


def test_epsilon_solved_for_families_with_their_own_parameters():
    # rrba: p solved at γ; with p given, γ solved; lopub: f solved from the filters
    assert build("rrba", epsilon=3.0).epsilon == pytest.approx(3.0, rel=1e-9)
    r = build("rrba", epsilon=12.0, p=0.5)
    assert r.p == 0.5 and r.epsilon == pytest.approx(12.0, rel=1e-9)
    lo = build("lopub", epsilon=1.5, scope="attribute")
    assert lo.epsilon == pytest.approx(4.5, rel=1e-9)     # attribute scope: 3 × 1.5
    with pytest.raises(ParamError) as ei:
        build("lopub", epsilon=1.5, f=0.5)
    assert ei.value.field == "f" and "gives" in str(ei.value)


@pytest.mark.parametrize("name", sorted(set(PROVIDERS) - ADAPTIVE))
def test_static_families_never_adapt(name):
    mech = build(name)
    counts = {0: mech.count(mech.randomize(records(300), np.random.default_rng(0)),
                            mech.tensors([("a",)]))}
    assert mech.adapt(counts) is None and mech.reports_until_adapt(counts) is None
    assert mech.accepted_versions() == (0,)
    method = mech.estimators[0] if name != "lopub" else "lasso"
    a = mech.estimate_versions(counts, ("a",), method)
    b = mech.estimate(counts[0], ("a",), method)
    np.testing.assert_array_equal(a.factor.values, b.factor.values)


def _drive(mech, recs, rng, marginals=(("a", "b"),)):
    """randomize → count → adapt, one block at a time (the loop simulate and the worker run)."""
    counts: dict[int, dict[str, np.ndarray]] = {}
    versions = [mech]
    i = 0
    while i < len(recs):
        k = mech.reports_until_adapt(counts) or len(recs) - i
        block = recs[i:i + k]
        i += len(block)
        got = mech.count(mech.randomize(block, rng), mech.tensors(marginals))
        mine = counts.setdefault(mech.version, {})
        for key, t in got.items():
            mine[key] = mine[key] + t if key in mine else t
        new = mech.adapt(counts)
        if new is not None:
            assert new.version == mech.version + 1
            mech = new
            versions.append(mech)
    return mech, counts, versions


def test_rr_clusters_clusters_live_from_the_singleton_round():
    from ldpstream.estimators.families.rr import RRClusters
    mech = build("rr-clusters", epsilon=3.0, scope="attribute", min_dependence=0.2)
    assert not mech.clustered and mech.clusters == [("a",), ("b",), ("c",)]
    recs = records(4000)
    # the singleton round's reports, clustered from pair counts == Alg. 1 on the reports
    rng = np.random.default_rng(5)
    reps = mech.randomize(recs[:500], rng)
    counts = {0: mech.count(reps, mech.tensors([("a", "b")]))}
    assert mech.reports_until_adapt(counts) == 1
    new = mech.adapt(counts)
    ref = RRClusters.from_randomized(DOM, reps, 3.0, min_dependence=0.2)
    assert new.clusters == ref.clusters == [("a", "b"), ("c",)]
    assert new.version == 1 and new.clustered and new.adapt(counts) is None
    assert new.accepted_versions() == (1,) and new.epsilon == pytest.approx(mech.epsilon)
    last, counts, versions = _drive(mech, recs, np.random.default_rng(6))
    assert [v.version for v in versions] == [0, 1]
    est = last.estimate_versions(counts, ("a", "b"), "castell")
    assert est.n == 3500   # only the clustered version's reports are estimated from


@pytest.mark.parametrize("name", ["corr-rr", "corr-rr-paper"])
def test_corr_rr_phase_one_then_table_then_phase_two(name):
    mech = build(name)
    assert mech.phase == 0 and mech.accepted_versions() == (0,)
    recs = records(3000)
    last, counts, versions = _drive(mech, recs, np.random.default_rng(2), marginals=())
    assert [(v.version, v.phase) for v in versions] == [(0, 0), (1, 1)]
    assert last.accepted_versions() == (0, 1) and last.table_since == 1
    n1 = int(counts[0]["corr:a"][0].sum())
    assert n1 == 500 and counts[0]["corr:a"][1].sum() == 0 and counts[1]["corr:a"][0].sum() == 0
    # the published table is a pure function of the Phase I counts
    again = mech.refine(mech.combined_counts({0: counts[0]}))
    np.testing.assert_array_equal(again.table, last.table)
    est = last.estimate_versions(counts, ("a",), last.estimators[0])
    assert est.n == 3000
    # corr-rr: Phase II reports made with an older table are not mixed into this table's
    # estimate; corr-rr-paper decodes Phase II whatever the table, so it keeps them
    newer = type(last).from_state({**last.state(), "version": 2, "table_since": 2})
    comb = newer.combined_counts(counts)
    assert comb["corr:a"][0].sum() == n1
    assert comb["corr:a"][1].sum() == (2500 if name == "corr-rr-paper" else 0)


def test_rs_rfd_learns_its_priors_in_an_spl_round():
    mech = build("rs-rfd")
    assert mech.phase == 0 and mech.epsilon == pytest.approx(2.0)     # SPL round: ε/m each
    last, counts, versions = _drive(mech, records(3000), np.random.default_rng(4), marginals=())
    assert [(v.version, v.phase) for v in versions] == [(0, 0), (1, 1)]
    assert last.accepted_versions() == (0, 1)
    spl_est = [x for x in mech.spl.estimate_all(counts[0])]
    assert np.allclose(last.state()["priors"][0], np.clip(spl_est[0], 0, None)
                       / np.clip(spl_est[0], 0, None).sum())
    est = last.estimate_versions(counts, ("a",), "unbiased")
    assert est.n == 3000 and est.extra["n1"] == 300 and 0 < est.extra["weight_phase1"] < 1
    assert est.epsilon == max(last.epsilon, mech.epsilon)


def test_rrba_adapt_is_the_block_update():
    mech = build("rrba", epsilon=4.0)
    last, counts, versions = _drive(mech, records(3000), np.random.default_rng(3))
    assert len(versions) > 1 and last.accepted_versions() == tuple(range(last.version + 1))
    # every block update is eq. 4 on the counts so far
    merged = versions[0].combined_counts(
        {v: counts[v] for v in counts if v < versions[1].version})
    assert versions[0].advance(merged).state()["history"] == versions[1].state()["history"]
    est = last.estimate_versions(counts, ("a", "b"), "pooled")
    assert est.n == 3000 and est.factor.values.sum() == pytest.approx(1.0)
    # devices get the current tables only; they randomize exactly like the server's state
    dev = from_state(json.loads(json.dumps(last.device_state())))
    assert [dev.table_version(v) for v in range(len(dev.views))] == \
        [last.table_version(v) for v in range(len(last.views))]
    assert len(json.dumps(last.device_state())) < len(json.dumps(last.state()))
    recs = records(500, seed=9)
    np.testing.assert_array_equal(dev.randomize(recs, np.random.default_rng(1)),
                                  last.randomize(recs, np.random.default_rng(1)))
    with pytest.raises(ValueError, match="no table history"):
        dev.estimate_versions(counts, ("a", "b"), "pooled")


# --- config --------------------------------------------------------------------------------------

def _config(mechanism, marginals, estimators, **extra):
    return {"collections": [{"id": "t", "schema": {"attributes": {
        "a": ["x", "y", "z"], "b": ["x", "y", "z"], "c": ["x", "y", "z"]}},
        "mechanism": mechanism, "epsilon": 1.0, "marginals": marginals,
        "estimators": estimators, **extra}]}


def test_config_params_errors_name_the_field():
    with pytest.raises(ConfigError) as ei:
        parse_config(_config("rrba", [["a", "b"]], ["pooled"], params={"block_size": -3}), env={})
    assert ei.value.errors == [
        "collections[0].params.block_size: must be an integer >= 1 (got -3)"]
    with pytest.raises(ConfigError) as ei:
        parse_config(_config("rrba", [["a", "b"]], ["pooled"], params={"blocksize": 3}), env={})
    assert ei.value.errors[0].startswith(
        "collections[0].params.blocksize: unknown parameter for rrba (allowed: k, block_size")
    with pytest.raises(ConfigError) as ei:
        parse_config(_config("rr-indd", [["a", "b"]], ["castell"]), env={})
    assert ei.value.errors[0] == ("collections[0].mechanism: unknown mechanism 'rr-indd' "
                                  "(known: " + ", ".join(PROVIDERS) + "); did you mean 'rr-ind'?")


@pytest.mark.parametrize("mechanism,marginals,estimator,needle", [
    ("corr-rr", [["a", "b", "c"]], "corr-rr", "one-way marginals only (got 3-way)"),
    ("spl", [["a", "b"]], "unbiased", "one-way marginals only (got 2-way)"),
    ("lopub", [["a", "b"]], "em", "needs whole reports"),
])
def test_config_rejects_marginals_the_mechanism_cannot_serve(mechanism, marginals, estimator,
                                                             needle):
    with pytest.raises(ConfigError) as ei:
        parse_config(_config(mechanism, marginals, [estimator]), env={})
    (err,) = ei.value.errors
    assert err.startswith(f"collections[0].marginals: {mechanism} cannot serve "
                          f"{marginals[0]} with {estimator}: ") and needle in err


@pytest.mark.parametrize("name", list(PROVIDERS))
def test_every_family_is_configurable(name):
    cls = mechanism_class(name)
    one_way = name in ("corr-rr", "corr-rr-paper", "spl", "smp", "rs-fd", "rs-rfd", "sw-hm")
    marginals = [["a"], ["b"]] if one_way else [["a", "b"]]
    est = "lasso" if name == "lopub" else cls.estimators[0]
    app = parse_config(_config(name, marginals, [est], params=PARAMS.get(name, {})), env={})
    mech = app.collections["t"].mechanism()
    assert type(mech) is cls and mech.tensors(app.collections["t"].marginals)


def test_corr_rr_paper_refines_p_y_as_phase_two_data_arrives():
    mech = build("corr-rr-paper", refine_reports=600)
    last, counts, versions = _drive(mech, records(3000), np.random.default_rng(5), marginals=())
    # Phase I (500), then a table every 600 Phase II reports: versions 1..5
    assert [(v.version, v.phase, v.table_since) for v in versions] == [
        (0, 0, 0), (1, 1, 1), (2, 1, 2), (3, 1, 3), (4, 1, 4), (5, 1, 5)]
    assert not np.allclose(versions[1].table, versions[2].table)
    # the published estimate decodes Phase II whatever the table: every report is used
    est = last.estimate_versions(counts, ("a",), "paper")
    assert est.n == 3000 and last.accepted_versions() == (0, 1, 2, 3, 4, 5)
    with pytest.raises(ParamError) as ei:
        build("corr-rr", refine_reports=600)
    assert ei.value.field == "refine_reports"
