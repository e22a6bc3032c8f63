"""Config loading: the bundled demo, YAML/TOML equivalence, marginal expansion, and errors that
start with the field path."""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import yaml

from ldpstream.config import AppConfig, ConfigError, default_config_path, load_config, parse_config
from ldpstream.datasets import ADULT_COLUMNS

pytestmark = pytest.mark.core

BASE = {
    "collections": [{
        "id": "toy",
        "schema": {"attributes": {"a": ["x", "y"], "b": ["p", "q", "r"], "c": ["0", "1"],
                                  "d": ["u", "v", "w", "z"]}},
        "mechanism": "rr-ind",
        "epsilon": 1.5,
        "marginals": [["a", "b"], ["c", "d", "a"]],
        "estimators": ["castell", "truncated"],
    }]
}


def err(data, env=None, base_dir=".") -> str:
    with pytest.raises(ConfigError) as ei:
        parse_config(data, env=env or {}, base_dir=base_dir)
    return str(ei.value)


def with_(path: str, value, base=BASE):
    """A copy of ``base`` with the dotted ``path`` (list indices as ints) set (value ... = delete)."""
    d = copy.deepcopy(base)
    parts = [int(p) if p.isdigit() else p for p in path.split(".")]
    cur = d
    for p in parts[:-1]:
        cur = cur[p]
    if value is ...:
        del cur[parts[-1]]
    else:
        cur[parts[-1]] = value
    return d


def test_demo_config_loads():
    """The demo is what we would recommend (docs/devices.md "The demo collection"): partitioned at
    ε = 2 per report, memoized for a day, at most ε = 4 per device per day: under every SDK's
    default ceiling of 8 per report and with no weak-privacy note."""
    from ldpstream.privacy import epsilon_fields
    from ldpstream.producers.device import DEFAULT_MAX_EPSILON

    cfg = load_config(env={})
    assert isinstance(cfg, AppConfig) and list(cfg.collections) == ["adult"]
    c = cfg.collections["adult"]
    assert c.domain.attrs == ADULT_COLUMNS
    assert c.topic == "ldp.reports.adult" and c.partitions == 4 and c.version == 0
    assert c.mechanism_name == "partitioned" and c.epsilon_scope == "record"
    assert c.estimators == ["consistent", "unbiased", "norm-sub", "calm"]
    assert ("relationship", "marital-status", "sex") in c.marginals
    assert (c.refresh_interval_s, c.bucket_s, c.drift_alpha, c.expect_traffic) == \
        (5.0, 10.0, 0.001, True)
    assert [w.name for w in c.windows] == ["5m", "1h", "all"]
    assert [w.seconds for w in c.windows] == [300.0, 3600.0, None]
    mech = c.mechanism()
    assert mech.name == "partitioned" and mech.version == 0
    assert mech.memoization() is not None
    assert math.isclose(mech.epsilon, 2.0)  # computed from the channels
    assert mech.epsilon <= DEFAULT_MAX_EPSILON
    f = epsilon_fields(c, mech)
    assert math.isclose(f["epsilon_per_day"], 4.0) and f["privacy_note"] is None
    assert c.max_epsilon_per_day == 4.0 and c.reports_per_day == 1440
    specs = c.tensors()
    assert specs and all(s.key for s in specs)
    assert cfg.ingest.batch_reports == 20000 and cfg.ingest.max_message_bytes == 1 << 20
    assert cfg.api_token is None and cfg.kafka_bootstrap is None and cfg.redis_url is None
    assert load_config(default_config_path(), env={}).collections["adult"].domain == c.domain


def test_fast_demo_variant_is_the_weak_one():
    """adult-fast.yaml beside the demo: rr-ind at ε = 16 per record, flagged."""
    from ldpstream.privacy import epsilon_fields

    c = load_config(default_config_path().with_name("adult-fast.yaml"), env={}).collections["adult"]
    mech = c.mechanism()
    assert mech.name == "rr-ind" and math.isclose(mech.epsilon, 2.0 * len(ADULT_COLUMNS))
    assert "weak privacy" in epsilon_fields(c, mech)["privacy_note"]


def test_environment_supplies_secrets_and_endpoints():
    cfg = parse_config(BASE, env={"LDP_API_TOKEN": "s3cret", "KAFKA_BOOTSTRAP_SERVERS": "k:9092",
                                  "REDIS_URL": "redis://r:6379/0"})
    assert (cfg.api_token, cfg.kafka_bootstrap, cfg.redis_url) == \
        ("s3cret", "k:9092", "redis://r:6379/0")
    assert err({**BASE, "api_token": "x"}).startswith("api_token: ")


def test_toml_equivalent_loads(tmp_path):
    toml = tmp_path / "demo.toml"
    toml.write_text('''
[ingest]
batch_reports = 20000
batch_seconds = 0.5
max_message_bytes = 1048576

[[collections]]
id = "adult"
mechanism = "rr-ind"
epsilon = 2
epsilon_scope = "attribute"
partitions = 4
marginals = [["sex", "Salary"], ["race", "sex"], ["education", "Salary"],
             ["relationship", "marital-status", "sex"]]
estimators = ["castell", "truncated", "ibu", "hybrid-auto", "rr-independent"]
refresh_interval_s = 5
bucket_s = 10
windows = ["5m", "1h", "all"]
drift_alpha = 0.001
expect_traffic = true
version = 0

[collections.schema.csv]
columns = ["workclass", "education", "marital-status", "occupation", "relationship", "race",
           "sex", "Salary"]
''')
    a = load_config(toml, env={})
    b = load_config(default_config_path().with_name("adult-fast.yaml"), env={})
    assert a.collections == b.collections and a.ingest == b.ingest


def test_all_ways_expansion():
    cfg = parse_config(with_("collections.0.marginals", {"all_ways_up_to": 3}), env={})
    m = cfg.collections["toy"].marginals
    assert len(m) == 6 + 4  # C(4,2) + C(4,3)
    assert m[0] == ("a", "b") and m[-1] == ("b", "c", "d")  # schema order
    assert all(list(t) == sorted(t, key="abcd".index) for t in m)
    demo = yaml.safe_load(default_config_path().with_name("adult-fast.yaml").read_text())
    demo["collections"][0]["marginals"] = {"all_ways_up_to": 4}
    cfg = parse_config(demo, env={}, base_dir=default_config_path().parent)
    assert len(cfg.collections["adult"].marginals) == 28 + 56 + 70


def test_csv_schema_relative_path(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.csv").write_text("color, size,extra\nred, S,1\nblue,M,2\nred,L,3\n")
    cfgfile = tmp_path / "sub" / "c.yaml"
    cfgfile.write_text(yaml.safe_dump({"collections": [{
        "id": "shop", "schema": {"csv": {"path": "d.csv", "columns": ["size", "color"]}},
        "epsilon": 1, "epsilon_scope": "record", "marginals": [["color", "size"]]}]}))
    c = load_config(cfgfile, env={}).collections["shop"]
    assert c.domain.attrs == ("size", "color") and c.domain.labels == (("L", "M", "S"),
                                                                        ("blue", "red"))
    assert c.epsilon_per_attribute == 0.5
    mech = c.mechanism()
    assert math.isclose(mech.epsilon, 1.0) and c.estimators == ["truncated"]
    rng = np.random.default_rng(0)
    rep = mech.randomize(np.array([[0, 1], [2, 0]]), rng)
    assert rep.shape == (2, 2)


@pytest.mark.parametrize("path,value,expect", [
    ("collections.0.epsilon", -1, "collections[0].epsilon: must be a number > 0 (got -1)"),
    ("collections.0.epsilon", "2", "collections[0].epsilon: must be a finite number (got '2')"),
    ("collections.0.epsilon", True, "collections[0].epsilon: must be a finite number (got True)"),
    ("collections.0.epsilon", float("inf"), "collections[0].epsilon: must be a finite number"),
    ("collections.0.epsilon", ..., "collections[0].epsilon: required field missing"),
    ("collections.0.partitions", 0, "collections[0].partitions: must be an integer >= 1 (got 0)"),
    ("collections.0.partitions", 2.5, "collections[0].partitions: must be an integer"),
    ("collections.0.drift_min_effect", 1.5, "collections[0].drift_min_effect: must be a number <= 1"),
    ("collections.0.drift_alpha", 0.0, "collections[0].drift_alpha: must be a number > 0"),
    ("collections.0.windows", ["5m", "5x"],
     "collections[0].windows[1]: a window is a duration like 30s, 5m, 1h, 7d or 'all' (got '5x')"),
    ("collections.0.windows", ["90s", "all"],
     "collections[0].windows[0]: 90s is not a whole number of buckets of bucket_s = 60 s"),
    ("collections.0.windows", ["1h", "60m"], "collections[0].windows[1]: window '60m' is listed twice"),
    ("collections.0.windows", ["500d"],
     "collections[0].windows[0]: 500d spans more than 10000 coarse buckets of 3600 s; raise bucket_s"),
    ("collections.0.refresh_interval_s", 0, "collections[0].refresh_interval_s: must be a number > 0"),
    ("collections.0.epsilon_scope", "device",
     "collections[0].epsilon_scope: must be one of 'attribute' or 'record' (got 'device')"),
    ("collections.0.expect_traffic", "yes", "collections[0].expect_traffic: must be true or false"),
    ("collections.0.version", -2, "collections[0].version: must be an integer >= 0"),
    ("collections.0.epsilonn", 1, "collections[0].epsilonn: unknown field (allowed: id, schema,"),
    ("collections.0.schema.attributes.a", ["x"],
     "collections[0].schema.attributes.a: needs at least 2 categories"),
    ("collections.0.schema.attributes.a", ["x", False],
     "collections[0].schema.attributes.a[1]: category must be a string"),
    ("collections.0.schema.attributes.a", ["x", "x"],
     "collections[0].schema.attributes.a: category 'x' is listed twice"),
    ("collections.0.schema.csv", {"columns": ["sex"]},
     "collections[0].schema: give exactly one of 'attributes' or 'csv'"),
    ("collections.0.schema.attributes", ..., "collections[0].schema: give exactly one of"),
    ("collections.0.schema.attributes.a", "xy", "collections[0].schema.attributes.a: must be a list"),
    ("collections.0.mechanism", "rr-magic",
     "collections[0].mechanism: unknown mechanism 'rr-magic' (known: "),
    ("collections.0.estimators", ["castell", "magic"],
     "collections[0].estimators[1]: unknown estimator 'magic' for rr-ind (known: castell,"),
    ("collections.0.estimators", [], "collections[0].estimators: must not be empty"),
    ("collections.0.marginals", [["a", "bb", "zz"]],
     "collections[0].marginals[0]: unknown attributes 'bb', 'zz' (attributes: a, b, c, d)"),
    ("collections.0.marginals", [["a", "b"], ["a", "a"]],
     "collections[0].marginals[1]: lists an attribute twice"),
    ("collections.0.marginals", [], "collections[0].marginals: must be a non-empty list"),
    ("collections.0.marginals", {"all_ways_up_to": 5},
     "collections[0].marginals.all_ways_up_to: must be an integer in 2..4"),
    ("collections.0.marginals", {"all_ways": 2}, "collections[0].marginals.all_ways: unknown field"),
    ("collections.0.marginals", ..., "collections[0].marginals: required field missing"),
    ("collections.0.id", "bad id{x}", "collections[0].id: must match"),
    ("collections", [], "collections: must not be empty"),
    ("ingest", {"batch_reports": 0}, "ingest.batch_reports: must be an integer >= 1 (got 0)"),
    ("ingest", {"batch_sec": 1}, "ingest.batch_sec: unknown field (allowed: batch_reports,"),
    ("kafka", "x", "kafka: unknown field (allowed: collections, ingest)"),
])
def test_errors_name_their_field(path, value, expect):
    assert err(with_(path, value)).startswith(expect)


def test_error_collects_several_and_duplicate_ids():
    data = copy.deepcopy(BASE)
    data["collections"].append(copy.deepcopy(BASE["collections"][0]))
    assert err(data).startswith("collections[1].id: duplicate collection id 'toy'")
    data["collections"][0]["epsilon"] = 0
    data["collections"][1]["partitions"] = -1
    with pytest.raises(ConfigError) as ei:
        parse_config(data, env={})
    assert ei.value.errors == ["collections[0].epsilon: must be a number > 0 (got 0)",
                               "collections[1].partitions: must be an integer >= 1 (got -1)",
                               "collections[1].id: duplicate collection id 'toy'"]
    assert "and 2 more" in str(ei.value)


def test_semantic_errors_are_reported_alongside_type_errors():
    """Type errors do not hide the semantic checks of the fields that parsed: an unknown attribute
    in a marginal, an unknown estimator, an unknown field, a second collection's problems."""
    data = copy.deepcopy(BASE)
    c0 = data["collections"][0]
    c0.update(epsilon="2", partitions=0, colour="red",
              marginals=[["a", "zz"], ["b", "c"], ["a", "a"]], estimators=["castell", "magic"])
    data["collections"].append(dict(copy.deepcopy(BASE["collections"][0]), id="two",
                                    mechanism="rr-magic", windows=["2h", "3y"]))
    with pytest.raises(ConfigError) as ei:
        parse_config(data, env={})
    assert ei.value.errors == [
        "collections[0].epsilon: must be a finite number (got '2')",
        "collections[0].partitions: must be an integer >= 1 (got 0)",
        "collections[0].colour: unknown field (allowed: id, schema, mechanism, params, epsilon, "
        "epsilon_scope, partitions, marginals, estimators, refresh_interval_s, "
        "controller_interval_s, bucket_s, windows, drift_alpha, drift_min_effect, "
        "expect_traffic, version, device_quota, reports_per_day, max_epsilon_per_day, expected_senders, "
        "device_state_max, device_retention_s)",
        "collections[0].marginals[0]: unknown attribute 'zz' (attributes: a, b, c, d)",
        "collections[0].marginals[2]: lists an attribute twice (['a', 'a'])",
        "collections[0].estimators[1]: unknown estimator 'magic' for rr-ind (known: castell, "
        "truncated, hybrid, hybrid-auto, ibu, rr-independent, rr-adjustment)",
        ei.value.errors[6],  # the registry's mechanism list, checked below
        "collections[1].windows[1]: a window is a duration like 30s, 5m, 1h, 7d or 'all' "
        "(got '3y')",
    ]
    assert ei.value.errors[6].startswith("collections[1].mechanism: unknown mechanism 'rr-magic'")


def test_checks_needing_a_field_with_a_type_error_are_skipped():
    # the schema does not parse: its marginals cannot be checked (no spurious "unknown attribute")
    bad = with_("collections.0.schema", {"attributes": {"a": "xy"}})
    bad["collections"][0]["estimators"] = ["magic"]
    with pytest.raises(ConfigError) as ei:
        parse_config(bad, env={})
    assert [e.split(":")[0] for e in ei.value.errors] == [
        "collections[0].schema.attributes.a", "collections[0].estimators[0]"]
    # estimators that do not parse are not checked against the mechanism
    bad = with_("collections.0.estimators", "castell")
    with pytest.raises(ConfigError) as ei:
        parse_config(bad, env={})
    assert ei.value.errors == ["collections[0].estimators: must be a list (got 'castell')"]
    # a collection that is not a mapping at all
    bad = copy.deepcopy(BASE)
    bad["collections"].append("toy2")
    with pytest.raises(ConfigError) as ei:
        parse_config(bad, env={})
    assert ei.value.errors == ["collections[1]: must be a mapping (got 'toy2')"]


def test_csv_errors(tmp_path):
    bad = with_("collections.0.schema", {"csv": {"path": "nope.csv", "columns": ["a"]}})
    assert err(bad, base_dir=tmp_path).startswith("collections[0].schema.csv.path: ")
    bad = with_("collections.0.schema", {"csv": {"columns": ["sex", "salary"]}})
    assert err(bad).startswith("collections[0].schema.csv.columns: ")
    assert "unknown column 'salary'" in err(bad)
    bad = with_("collections.0.schema", {"csv": {"path": "x.csv"}})
    assert err(bad, base_dir=tmp_path).startswith("collections[0].schema.csv.columns: required")


def test_file_level_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "c.json").write_text("{}")
    with pytest.raises(ConfigError, match="must be .yaml, .yml or .toml"):
        load_config(tmp_path / "c.json")
    (tmp_path / "c.yaml").write_text("collections: [\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(tmp_path / "c.yaml")
    (tmp_path / "c.toml").write_text("collections = [\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(tmp_path / "c.toml")
    (tmp_path / "e.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=r"^\(top level\): must be a mapping"):
        load_config(tmp_path / "e.yaml")


def test_config_error_is_a_cli_error():
    from ldpstream.cli import CliError

    assert issubclass(ConfigError, CliError)


def test_expected_senders_sizes_the_side_buckets_and_is_checked():
    """``expected_senders`` (docs/scaling.md "Per-device state"): 1,024 by default; a negative
    or absurd value is refused naming the field."""
    assert parse_config(BASE, env={}).collections["toy"].expected_senders == 1024
    assert parse_config(with_("collections.0.expected_senders", 50_000),
                        env={}).collections["toy"].expected_senders == 50_000
    for bad in (-1, 10**9, "many"):
        assert err(with_("collections.0.expected_senders", bad)).startswith(
            "collections[0].expected_senders: "), bad
