"""The ε fields every collection and estimate states (docs/mechanisms.md §9): computed from the
mechanism in force, the same for every family, and a weak-privacy note only above ε = 4 per
record (a computed 4.000000000000004 is 4)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ldpstream.config import load_config
from ldpstream.privacy import WEAK_EPSILON, epsilon_fields, privacy_note

pytestmark = pytest.mark.core

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_weak_privacy_note_threshold():
    assert privacy_note(None) is None and privacy_note(1.0) is None
    assert privacy_note(WEAK_EPSILON) is None and privacy_note(4.000000000000004) is None
    note = privacy_note(16.0)
    assert note.startswith("weak privacy: ε = 16 per record, so one report") and "8.89e+06" in note


def test_demo_fields_are_computed_and_not_flagged():
    coll = load_config().collections["adult"]
    f = epsilon_fields(coll, coll.mechanism())
    assert f["epsilon"] == 2.0 and f["epsilon_scope"] == "record"
    assert f["epsilon_per_record"] == pytest.approx(2.0)
    assert f["epsilon_per_attribute"] is None
    assert f["epsilon_per_day"] == pytest.approx(4.0) and f["privacy_note"] is None


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_states_its_epsilon(path):
    for coll in load_config(path).collections.values():
        mech = coll.mechanism()
        f = epsilon_fields(coll, mech)
        assert set(f) == {"epsilon", "epsilon_scope", "epsilon_per_record",
                          "epsilon_per_attribute", "epsilon_per_rotation", "epsilon_per_day",
                          "privacy_note"}
        assert f["epsilon_per_record"] == pytest.approx(float(mech.epsilon))
        per_attribute = f["epsilon_per_attribute"]
        assert per_attribute is None or 0 < per_attribute <= f["epsilon_per_record"] + 1e-9
        judged = f["epsilon_per_day"] if f["epsilon_per_day"] is not None else \
            f["epsilon_per_record"]
        assert (f["privacy_note"] is None) == (judged <= WEAK_EPSILON * (1 + 1e-9))


def memoized_collection(tmp_path, epsilon: float, rotation_s, instantaneous: float):
    path = tmp_path / "memo.yaml"
    path.write_text(yaml.safe_dump({"collections": [{
        "id": "memo", "schema": {"attributes": {"os": ["android", "ios", "other"],
                                                "plan": ["free", "pro"],
                                                "region": ["eu", "us", "asia"]}},
        "mechanism": "rr-ind", "epsilon": epsilon,
        "params": {"memoize": {"rotation_s": rotation_s, "instantaneous_epsilon": instantaneous}},
        "marginals": [["os", "plan"]], "estimators": ["castell"]}]}))
    return load_config(str(path)).collections["memo"]


def test_memoized_collection_states_rotation_and_day_and_judges_the_day(tmp_path):
    """A report costs 2.1 but a device's day 6 (never rotated: 3 attributes × 2): the note is on
    the per-day figure, the one that matters for a device that keeps reporting."""
    coll = memoized_collection(tmp_path, 2.0, None, 1.0)
    mech = coll.mechanism()
    f = epsilon_fields(coll, mech)
    g = mech.guarantee()
    assert f["epsilon_per_record"] == pytest.approx(g.per_report, rel=1e-12)
    assert f["epsilon_per_record"] < WEAK_EPSILON
    assert f["epsilon_per_rotation"] == pytest.approx(6.0, rel=1e-12)
    assert f["epsilon_per_day"] == pytest.approx(6.0, rel=1e-12)
    assert f["privacy_note"].startswith("weak privacy: ε = 6 per device per day")
    # rotated hourly: 25 rotation periods can meet a day
    hourly = memoized_collection(tmp_path, 0.1, 3600, 1.0)
    f = epsilon_fields(hourly, hourly.mechanism())
    assert f["epsilon_per_day"] == pytest.approx(25 * f["epsilon_per_rotation"], rel=1e-12)
    assert f["epsilon_per_day"] == pytest.approx(7.5, rel=1e-9) and "per device per day" in \
        f["privacy_note"]
    # strong over a day: no note, though the fields are there
    daily = memoized_collection(tmp_path, 0.1, 86400, 1.0)
    f = epsilon_fields(daily, daily.mechanism())
    assert f["epsilon_per_day"] == pytest.approx(0.6, rel=1e-9) and f["privacy_note"] is None


def test_fresh_collections_have_no_per_day_cap():
    from ldpstream.config import default_config_path

    coll = load_config(default_config_path().with_name("adult-fast.yaml")).collections["adult"]
    f = epsilon_fields(coll, coll.mechanism())
    assert f["epsilon_per_rotation"] is None and f["epsilon_per_day"] is None


def test_the_documented_memoized_example(tmp_path):
    """docs/api.md's example (docs/devices.md's app-usage collection): the figures it states."""
    coll = memoized_collection(tmp_path, 1.0, 86400, 2.0)
    f = epsilon_fields(coll, coll.mechanism())
    assert f["epsilon"] == 1.0
    assert f["epsilon_per_record"] == pytest.approx(2.11, abs=0.005)
    assert f["epsilon_per_attribute"] == pytest.approx(0.735, abs=0.0005)
    assert f["epsilon_per_rotation"] == pytest.approx(3.0, rel=1e-12)
    assert f["epsilon_per_day"] == pytest.approx(6.0, rel=1e-12)
    assert f["privacy_note"].startswith("weak privacy: ε = 6 per device per day")
