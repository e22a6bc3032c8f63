"""The mechanism protocol's optional capabilities (estimators/mechanism.py) replace every branch
on a family: the registry is the only list of family names, and nothing outside the family
modules asks which family a mechanism is."""
import ast
from pathlib import Path

import numpy as np
import pytest
from tolerance import assert_close

from ldpstream.agents.ingest.intake import count_reports
from ldpstream.estimators.families.rr import RRIndependent, marginal_counts
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.mechanism import DEFAULT_MECHANISM, PROVIDERS, Mechanism, mechanism_class

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parent.parent
#: the package's source folders (pyproject.toml's package-dir); bench/ names the families each
#: benchmark measures (its subject), so it is not scanned
SOURCES = ("agents", "estimators", "ldpstream", "producers")
REGISTRY = ROOT / "estimators" / "mechanism.py"
DOM = Domain.from_categories({"a": ["x", "y", "z"], "b": ["x", "y"], "c": ["x", "y", "z", "w"]})
SMALL = {"rrba": {"block_size": 50}, "rr-clusters": {"cluster_reports": 500},
         "corr-rr": {"phase1_reports": 500}, "corr-rr-paper": {"phase1_reports": 500},
         "lopub": {"bits": 16, "hashes": 2}, "rs-rfd": {"phase1_reports": 300}}


def sources():
    for folder in SOURCES:
        yield from sorted((ROOT / folder).rglob("*.py"))


def own_names(path: Path) -> set[str]:
    """The family names a module may spell: its own families' (the registry: all of them)."""
    if path == REGISTRY:
        return set(PROVIDERS)
    module = ".".join(path.relative_to(ROOT / "estimators").with_suffix("").parts) \
        if path.is_relative_to(ROOT / "estimators") else None
    return {n for n, mod in PROVIDERS.items() if mod == module}


def test_the_registry_is_the_only_place_family_names_appear():
    found = []
    for path in sources():
        allowed = own_names(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in PROVIDERS \
                    and node.value not in allowed:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, "family names outside the registry and their own module:\n" + \
        "\n".join(found)


def test_no_isinstance_on_a_family_outside_the_family_modules():
    families = {mechanism_class(n).__name__ for n in PROVIDERS}
    found = []
    for path in sources():
        if path.is_relative_to(ROOT / "estimators" / "families") and own_names(path):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" \
                    and len(node.args) == 2:
                named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                if named & families:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "branches on a mechanism family: " + ", ".join(found)


def test_the_default_mechanism_is_registered():
    assert DEFAULT_MECHANISM in PROVIDERS


def build(name: str) -> Mechanism:
    return mechanism_class(name).from_config(DOM, SMALL.get(name, {}), epsilon=2.0,
                                             epsilon_scope="record")


@pytest.mark.parametrize("name", list(PROVIDERS))
def test_custom_count_is_declared_by_overriding_count(name):
    cls = mechanism_class(name)
    assert cls.custom_count == any("count" in k.__dict__ for k in cls.__mro__
                                   if k is not Mechanism and issubclass(k, Mechanism))


@pytest.mark.parametrize("name", list(PROVIDERS))
def test_worker_count_equals_the_mechanism_count(name):
    mech = build(name)
    marginals = [("a", "b"), ("b", "c")]
    specs = mech.tensors(marginals)
    rng = np.random.default_rng(3)
    recs = np.stack([rng.integers(0, d, 2000) for d in DOM.shape], axis=1)
    reports = mech.randomize_device(recs, np.arange(2000, dtype=np.uint64), rng)
    want, got = mech.count(reports, specs), count_reports(mech, reports, specs)
    assert set(want) == set(got)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.parametrize("name", list(PROVIDERS))
def test_capability_defaults_and_overrides(name):
    mech = build(name)
    counts = mech.count(mech.randomize(np.zeros((10, 3), dtype=np.int64),
                                       np.random.default_rng(0)), mech.tensors([("a", "b")]))
    channels = mech.product_channels(("a", "b"))
    table = mech.marginal_table(counts, ("a", "b"))
    per_attribute = mech.epsilon_per_attribute()
    if isinstance(mech, RRIndependent):
        assert [P.shape for P in channels] == [(3, 3), (2, 2)]
        assert_close(per_attribute, max(mech.epsilons), rel=1e-12)
    else:
        assert channels is None
    if name in ("rr-ind", "rr-joint", "rr-clusters"):
        np.testing.assert_array_equal(table, marginal_counts(DOM, counts, ("a", "b")))
        assert per_attribute is not None and 0 < per_attribute <= mech.epsilon * (1 + 1e-12)
    elif name == "sw-hm":   # one channel per attribute, no multinomial table of a marginal
        assert table is None and per_attribute == pytest.approx(mech.epsilon / 3, rel=1e-9)
    else:
        assert table is None and per_attribute is None
    assert mech.memoization() is None


def test_memoization_of_a_memoized_rr_ind():
    mech = RRIndependent.from_config(DOM, {"memoize": {"rotation_s": 3600,
                                                       "instantaneous_epsilon": 4.0}},
                                     epsilon=1.0)
    memo = mech.memoization()
    assert memo is not None and memo.rule is mech.memoize and memo.permanent is mech.permanent
    rng = np.random.default_rng(1)
    perm = np.zeros((5, 3), dtype=np.int64)
    assert memo.instantaneous(perm, rng).shape == (5, 3)
