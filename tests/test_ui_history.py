"""The page's estimate history (agents/serve/ui.py): one point per refresh, bounded, and answered for
any order or subset of a stored marginal exactly as ``GET /estimates`` answers it."""
from __future__ import annotations

import numpy as np
import pytest

from ldpstream.agents.serve.selection import marginalize_payload, transpose_payload
from ldpstream.agents.serve.ui import ASSETS, History, history_answer, read_asset

pytestmark = pytest.mark.core

LABELS = [["F", "M"], ["low", "high"], ["a", "b", "c"]]


def payload(t: float, cells, **kw) -> dict:
    return {"collection": "c", "window": "5m", "method": "castell", "attrs": ["sex", "income",
            "region"], "labels": LABELS, "updated_at": t, "n": 10, "cells": cells,
            "error_bound": 0.01, "version": 0, "versions": [0], **kw}


def test_one_point_per_refresh_and_bounded():
    rng = np.random.default_rng(0)
    h = History(maxlen=3)
    cells = [rng.random((2, 2, 3)).tolist() for _ in range(5)]
    assert h.record([payload(1.0, cells[0])]) == 1
    assert h.record([payload(1.0, cells[0])]) == 0          # the same refresh sampled twice
    for t in range(2, 6):
        h.record([payload(float(t), cells[t - 1])])
    pts = h.points(("c", "5m", "castell", ("sex", "income", "region")))
    assert [p["updated_at"] for p in pts] == [3.0, 4.0, 5.0]
    np.testing.assert_array_equal(pts[-1]["cells"], np.array(cells[4]))
    assert h.points(("c", "all", "castell", ("sex", "income", "region"))) == []


def test_failures_and_nulls_are_kept_as_points():
    h = History()
    h.record([payload(1.0, None, error="LinAlgError: singular"),
              payload(2.0, [[[0.1, None, 0.2], [0.1, 0.1, 0.1]], [[0.1] * 3, [0.1] * 3]])])
    failed, ok = h.points(("c", "5m", "castell", ("sex", "income", "region")))
    assert failed["error"] == "LinAlgError: singular" and failed["cells"] is None
    assert np.isnan(ok["cells"][0, 0, 1])
    (out_failed, out_ok) = history_answer([failed, ok], ("sex", "income", "region"),
                                          ("sex", "income", "region"), LABELS)
    assert out_failed["cells"] is None and out_ok["cells"][0][0][1] is None   # JSON null


@pytest.mark.parametrize("attrs", [("region", "sex", "income"), ("income",), ("region", "sex")])
def test_answered_like_the_estimates_endpoint(attrs):
    rng = np.random.default_rng(1)
    cells = rng.random((2, 2, 3)).tolist()
    h = History()
    stored = ("sex", "income", "region")
    h.record([payload(1.0, cells)])
    (point,) = history_answer(h.points(("c", "5m", "castell", stored)), stored, attrs, LABELS)
    p = payload(1.0, cells)
    if len(attrs) < 3:
        p = marginalize_payload(p, attrs)
    want = transpose_payload(p, attrs)["cells"]
    np.testing.assert_allclose(point["cells"], want, rtol=1e-12)


def test_every_asset_ships():
    for name in ASSETS:
        assert read_asset(name)
    assert b'src="/ui/app.js"' in read_asset("index.html")
