"""Statistical privacy audit of memoized reports in the C and TypeScript SDKs (docs/device-
protocol.md, "Memoized descriptions"): for every memoized case of ``memo.json`` (per attribute,
per cluster, partitioned with GRR and with OLH tables, smp's select, each with an
instantaneous layer, sw-hm's numeric memo: α-point rounding, then the task and its wave, and
partitioned with a numeric attribute: α-point rounding, its point's index, then the table)
every
memo unit is sampled 10⁶ times with the SDK's production generator, each report in a new
rotation period (a new memo), every record of the domain in turn. The sampled channel from a
unit's true cell to what the report carries must fit the composed channel permanent @
instantaneous computed here from the description (χ² at α = 10⁻⁴ per unit, and the empirical ε
within 6σ of the declared one: :func:`test_sdk_audit.check_channel`)."""
from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest
from sdk_helpers import ROOT, c_sdk, ts_sdk  # noqa: F401
from test_sdk_audit import SAMPLES, _declared, check_channel

from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.device_program import (
    alpha_round,
    attribute_size,
    device_alpha,
    step_shapes,
    table_channel,
    wave_channel,
)
from ldpstream.estimators.memo import composed_grr_pq

pytestmark = [pytest.mark.core, pytest.mark.slow]

MEMO = ROOT / "sdk" / "conformance" / "memo.json"


def _grr(p: float, k: int) -> np.ndarray:
    return np.where(np.eye(k, dtype=bool), p, (1 - p) / (k - 1))


def _cases() -> dict[str, dict]:
    doc = json.loads(MEMO.read_text())
    return {"memo": doc["device"], **{k: v["device"] for k, v in doc.items()
                                      if isinstance(v, dict) and "device" in v}}


def numeric_unit(device: dict, unit: int, device_id: int = 1) -> np.ndarray:
    """The channel of a numeric memo unit for one device (grid index × column value): the
    device's α-point rounding (deterministic given its α), then the task drawn by the select's
    weights and its wave (wave_channel at the wave's offset)."""
    memo, G = device["memoize"], attribute_size(device["labels"][unit])
    step = memo["permanent"][unit]
    waves = [step] if step["op"] == "wave" else [b[0] for b in step["branches"]]
    weights = [1.0] if step["op"] == "wave" else step.get("weights") or [1 / len(waves)] * len(
        waves)
    C = np.zeros((G, max(w["offset"] + w["cells"] for w in waves)))
    for w, p in zip(waves, weights):
        C[:, w["offset"]:w["offset"] + w["cells"]] += p * wave_channel(w, G)
    rnd = (memo.get("round") or [None] * len(device["labels"]))[unit]
    if rnd is None:
        return C
    alpha = device_alpha(np.array([device_id], dtype=np.uint64), int(rnd["seed"]))
    return C[alpha_round(np.arange(G), np.asarray(rnd["points"]), alpha[0])]


def _rounded_index(rounding: dict, grid: int, device_id: int = 1) -> np.ndarray:
    """Per grid index, the index of the point the device α-point rounds it to."""
    pts = np.asarray(rounding["points"])
    alpha = device_alpha(np.array([device_id], dtype=np.uint64), int(rounding["seed"]))
    return np.searchsorted(pts, alpha_round(np.arange(grid), pts, alpha[0]))


def composed(device: dict, unit: int) -> np.ndarray:
    """The channel of one memo unit: permanent step (or partition table) @ instantaneous."""
    sizes = [attribute_size(lab) for lab in device["labels"]]
    memo = device["memoize"]
    if memo.get("kind") == "partition":   # rows: the table's cells on the devices' input
        t = memo["permanent"][-1]["tables"][unit]
        P = table_channel(t, step_shapes(device)[-1])
        rounding = memo.get("round") or [None] * len(sizes)
        R = np.ones((1, 1))
        for c in t["in"]:   # device 1's α-point rounding to the point's index, else identity
            R = np.kron(R, np.eye(sizes[c]) if rounding[c] is None else np.eye(
                len(rounding[c]["points"]))[_rounded_index(rounding[c], sizes[c])])
        P = R @ P
        inst = memo.get("instantaneous_p")
        if inst is None:
            return P
        if t["oracle"] == "grr":
            return P @ _grr(inst[unit], P.shape[1])
        return P @ np.kron(np.eye(t["g"] ** t["r"]), _grr(inst[unit], t["g"]))
    if memo.get("kind") == "select":   # branch `unit`: its step, then the instantaneous GRR
        P = _declared(memo["permanent"][0]["branches"][unit][0], sizes)
        inst = memo.get("instantaneous_p")
        return P if inst is None else P @ _grr(inst[unit], len(P))
    step = memo["permanent"][unit]
    if step["op"] in ("wave", "select"):
        return numeric_unit(device, unit)
    P = _declared(step, sizes)
    for s in device["steps"]:   # the instantaneous step over the same columns, if any
        if s["in"] == step["in"]:
            P = P @ _declared(s, sizes)
    return P


def _audit(lines: list[str]) -> list[str]:
    cases = _cases()
    seen, problems = set(), []
    for line in lines:
        got = json.loads(line)
        counts = np.asarray(got["counts"], dtype=float)
        P = composed(cases[got["case"]], got["unit"])
        assert counts.shape == P.shape, got["case"]
        problems += check_channel(f"{got['case']} unit {got['unit']}", counts, P)
        seen.add(got["case"])
    assert seen == set(cases), seen
    return problems


def test_composed_channels_are_what_the_estimators_invert():
    """The channels the audit compares against are row-stochastic, and each partition table's
    composed channel costs the ε of the GRR composition the estimators invert
    (estimators/memo.py: keep p₁p₂ + (k − 1)q₁q₂ over k = cells, or g for OLH; rtol 1e-9)."""
    for dev in _cases().values():
        memo = dev["memoize"]
        partition = memo.get("kind") == "partition"
        tables = (memo["permanent"][-1]["tables"] if partition else
                  memo["permanent"][0]["branches"] if memo.get("kind") == "select"
                  else memo["permanent"])
        for u, t in enumerate(tables):
            C = composed(dev, u)
            np.testing.assert_allclose(C.sum(axis=1), 1.0, rtol=1e-12)
            if not partition or memo.get("instantaneous_p") is None:
                continue
            k = t["g"] if t["oracle"] == "olh" else C.shape[1]
            p, q = composed_grr_pq(t["p"], memo["instantaneous_p"][u], k)
            assert ch.epsilon(C) == pytest.approx(math.log(p / q), rel=1e-9)


@pytest.mark.parametrize("sdk", ["c", "ts"])
def test_sdk_memoized_channels_match(sdk, request):
    if sdk == "c":
        cmd = [str(request.getfixturevalue("c_sdk") / "ldp_sample")]
    else:
        cmd = ["node", str(request.getfixturevalue("ts_sdk") / "tools" / "sample.js")]
    out = subprocess.run([*cmd, "memo-audit", str(MEMO), str(SAMPLES)], check=True,
                         capture_output=True, text=True).stdout
    assert _audit(out.splitlines()) == []


def test_the_audit_catches_a_wrong_instantaneous_layer():
    """Counts drawn from the permanent channel alone do not pass for the composed one."""
    dev = _cases()["partition"]
    rng = np.random.default_rng(4)
    P = composed(dev, 0)
    t = dev["memoize"]["permanent"][0]["tables"][0]
    perm = table_channel(t, [len(lab) for lab in dev["labels"]])
    counts = np.stack([rng.multinomial(50_000, row) for row in perm]).astype(float)
    assert check_channel("wrong", counts, P) != []
    good = np.stack([rng.multinomial(50_000, row) for row in P]).astype(float)
    assert check_channel("right", good, P) == []
