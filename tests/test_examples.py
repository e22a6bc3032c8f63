"""Every example config under examples/ loads (what ``ldpstream up --config`` reads first), there
is one per mechanism family, and its mechanism builds, randomizes and counts."""
from pathlib import Path

import numpy as np
import pytest

from ldpstream.config import load_config
from ldpstream.estimators.mechanism import mechanism_names

pytestmark = [pytest.mark.core, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_one_example_per_mechanism():
    assert sorted(p.stem for p in EXAMPLES.glob("*.yaml")) == sorted(mechanism_names())


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_example_config_loads_and_its_mechanism_runs(path):
    app = load_config(path, env={})
    (coll,) = app.collections.values()
    mech = coll.mechanism()
    assert mech.name == path.stem and mech.version == 0 and mech.epsilon > 0
    rng = np.random.default_rng(0)
    records = np.stack([rng.integers(0, d, 200) for d in coll.domain.shape], axis=1)
    reports = mech.randomize(records, rng)
    counts = mech.count(reports, coll.tensors())
    assert {s.key for s in coll.tensors()} == set(counts)
