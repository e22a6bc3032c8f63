"""The ε fields every collection and estimate states (docs/mechanisms.md §9): computed from the
mechanism in force, the same for every family, and a weak-privacy note only above ε = 4 per
record (a computed 4.000000000000004 is 4)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ldpstream.config import load_config
from ldpstream.privacy import WEAK_EPSILON, epsilon_fields, privacy_note

pytestmark = pytest.mark.core

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_weak_privacy_note_threshold():
    assert privacy_note(None) is None and privacy_note(1.0) is None
    assert privacy_note(WEAK_EPSILON) is None and privacy_note(4.000000000000004) is None
    note = privacy_note(16.0)
    assert note.startswith("weak privacy: ε = 16 per record") and "8.89e+06" in note


def test_demo_fields_are_computed_and_flagged():
    coll = load_config().collections["adult"]
    f = epsilon_fields(coll, coll.mechanism())
    assert f["epsilon"] == 2.0 and f["epsilon_scope"] == "attribute"
    assert f["epsilon_per_record"] == pytest.approx(16.0)
    assert f["epsilon_per_attribute"] == pytest.approx(2.0)
    assert "weak privacy" in f["privacy_note"]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_example_states_its_epsilon(path):
    for coll in load_config(path).collections.values():
        mech = coll.mechanism()
        f = epsilon_fields(coll, mech)
        assert set(f) == {"epsilon", "epsilon_scope", "epsilon_per_record",
                          "epsilon_per_attribute", "privacy_note"}
        assert f["epsilon_per_record"] == pytest.approx(float(mech.epsilon))
        per_attribute = f["epsilon_per_attribute"]
        assert per_attribute is None or 0 < per_attribute <= f["epsilon_per_record"] + 1e-9
        assert (f["privacy_note"] is None) == (f["epsilon_per_record"] <= WEAK_EPSILON * (1 + 1e-9))
