"""The worker's heap (agents/heap.py): the start-up's objects frozen out of the collector's
generations."""
from __future__ import annotations

import gc

import pytest

from ldpstream.agents import heap

pytestmark = pytest.mark.core


def test_freeze_takes_what_is_alive_out_of_the_collections():
    made = [[i] for i in range(10_000)]   # 10,000 tracked lists
    try:
        frozen = heap.freeze()
        assert frozen == gc.get_freeze_count() >= len(made)
        # a full collection no longer counts them among what it scans
        assert sum(len(gc.get_objects(g)) for g in range(3)) < frozen
    finally:
        gc.unfreeze()

