"""Numeric attributes on the device (docs/device-protocol.md, "Numeric attributes";
docs/numeric.md): the ``wave`` steps an ``sw-hm`` collection publishes draw from exactly the
channel the family inverts, laid out in the cells its count tensors expect; each wave's declared
ε is the ε of the channel it applies; the Python SDK's seeded draws follow that channel; values
are clipped into their range and counted; a report outside the layout is not counted. Pure CPU,
a few seconds (the C and TypeScript SDKs run the same vectors: test_sdk_conformance.py,
test_sdk_audit.py)."""
from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chi2

from ldpstream.estimators import mechanism_class
from ldpstream.estimators.families.numeric import Numeric
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels import device_program as dp
from ldpstream.estimators.kernels import numeric as nm
from ldpstream.estimators.kernels.domain import Domain, SchemaError
from ldpstream.producers.codec import ReportBatch, explain_batch
from ldpstream.producers.program import Program, ProgramError, SplitMix64
from ldpstream.producers.program_steps import _wave_cell

pytestmark = pytest.mark.core

VECTORS = Path(__file__).resolve().parent.parent / "sdk" / "conformance" / "randomize.json"
CASES = {c["name"]: c for c in json.loads(VECTORS.read_text())["cases"]
         if c["family"] == "sw-hm"}


def _waves(prog: dict) -> list[dict]:
    return [t for s in prog["steps"] for t in ([s] if s["op"] != "select" else
                                               [b[0] for b in s["branches"]])
            if t["op"] == "wave"]


def _domain(G: int, lo: float = 0.0, hi: float = 100.0) -> Domain:
    return Domain(("fw", "x"), (3, G), (("a", "b", "c"), nm.numeric_labels(lo, hi, G)),
                  (None, (lo, hi)))


@pytest.mark.parametrize("eps", [0.3, 0.5, 1.0, 2.0, 4.0, 8.0])
@pytest.mark.parametrize("mean", ["auto", "pm", "duchi", "points"])
def test_the_description_is_the_family_channel(eps, mean):
    """Per numeric attribute, every wave's channel (from its parameters alone) is the family's
    task channel and sits at the task's cells; its ε (computed from its parameters, as every SDK
    does) is the ε of that channel and the description's ε the family's, to 1e-9."""
    mech = Numeric.from_config(_domain(65), {"mean": mean, "mean_share": 0.4}, epsilon=eps)
    prog = mech.device_program()
    assert prog is not None and prog["labels"][1] == {"min": 0.0, "max": 100.0, "grid": 65}
    tasks = [t for t in mech.layout(1) if t.weight > 0]
    waves = _waves(prog)
    assert [(w["offset"], w["cells"]) for w in waves] == [(t.offset, t.cells) for t in tasks]
    for w, t in zip(waves, tasks):
        P = dp.wave_channel(w, 65)
        np.testing.assert_allclose(P, nm.task_channel(t, eps, 65), atol=1e-9, err_msg=t.kind)
        assert math.isclose(dp.step_epsilon(w, [3, 65]), ch.epsilon(P), rel_tol=1e-9)
    assert math.isclose(Program(prog).epsilon, mech.epsilon, rel_tol=1e-9)
    # the channel the family inverts is its tasks' side by side (one layout)
    full = np.zeros((65, int(mech.report_bounds()[1])))
    for t in mech.layout(1):
        full[:, t.offset:t.offset + t.cells] = t.weight * nm.task_channel(t, eps, 65)
    np.testing.assert_allclose(mech.channel(1), full, atol=1e-12)


@pytest.mark.parametrize("name", sorted(CASES))
def test_vector_waves_declare_their_channels_epsilon(name):
    """Every wave of the conformance cases (which the C and TypeScript SDKs parse to the same ε,
    rel 1e-12): the ε its parameters declare is the ε of the channel it applies, to 1e-9."""
    dev = CASES[name]["device"]
    sizes = [dp.attribute_size(lab) for lab in dev["labels"]]
    for w in _waves(dev):
        P = dp.wave_channel(w, sizes[w["in"][0]])
        assert math.isclose(dp.step_epsilon(w, sizes), ch.epsilon(P), rel_tol=1e-9), w


def test_hm_layout_is_the_samplers():
    """The family's randomizer puts HM's Duchi cells and Square Wave's where the layout says."""
    mech = Numeric.from_config(_domain(33), {"mean": "hm", "mean_share": 0.5}, epsilon=2.0)
    pm, duchi, sw = mech.layout(1)
    cells = mech.randomize(np.tile([[0, 16]], (4000, 1)), np.random.default_rng(1))[:, 1]
    assert set(np.unique(cells)) <= set(range(sw.offset + sw.cells))
    assert np.any((cells >= duchi.offset) & (cells < duchi.offset + 2))
    assert mech.report_bounds()[1] == sw.offset + sw.cells == mech.mean_cells(1) + sw.cells


@pytest.mark.parametrize("name", sorted(CASES))
def test_python_sdk_draws_follow_the_wave_channels(name):
    """Seeded (SplitMix64) draws of every wave of the conformance cases on at most 65 grid
    points, 1,000 per grid point: χ² against ``wave_channel`` at α = 1e-4."""
    prog = Program(CASES[name]["device"])
    rng = SplitMix64(2024)
    flat = [t for s in prog.steps for t in ((s,) if s.op != "select" else
                                            tuple(b[0] for b in s.branches))]
    raw = _waves(CASES[name]["device"])
    waves = [s for s in flat if s.op == "wave"]
    assert len(waves) == len(raw) > 0
    for s, w in zip(waves, raw):
        G = s.shape[0]
        if G > 65:
            continue
        P = dp.wave_channel(w, G)
        counts = np.zeros_like(P)
        for i in range(G):
            for _ in range(1000):
                counts[i, _wave_cell(s, i, rng)] += 1
        expected = 1000 * P
        used = expected > 0
        assert counts[~used].sum() == 0
        stat = float((((counts - expected) ** 2)[used] / expected[used]).sum())
        assert chi2.sf(stat, int(used.sum()) - G) > 1e-4, (name, w["offset"])


def test_values_clipped_counted_and_refused_when_not_numbers():
    prog = Program(CASES["sw-hm"]["device"])
    assert prog.encode_clipped({"fw": "v1", "battery": 12.5, "temp": "-40"}) == (
        [0, 12, 0], ("temp",))
    assert prog.encode_clipped({"fw": "v2", "battery": "13.5", "temp": 1e9}) == (
        [1, 14, 32], ("temp",))
    for bad in (float("nan"), True, None, "1_000", "0x1p3"):
        with pytest.raises(SchemaError) as exc:
            prog.encode({"fw": "v1", "battery": bad, "temp": "0"})
        assert exc.value.attribute == "battery"


def test_a_memoized_select_takes_no_weights():
    from ldpstream.estimators.families.rr import RRIndependent

    state = mechanism_class("smp").from_config(
        RRIndependent(Domain(("a", "b"), (2, 3)), epsilon=1.0).domain,
        {"memoize": {"rotation_s": 100.0}}, epsilon=1.0, epsilon_scope="record").device_state()
    d = state["device"]
    sel = d["memoize"]["permanent"][0]
    bad = dict(d, memoize=dict(d["memoize"], permanent=[
        dict(sel, weights=[1 / len(sel["branches"])] * len(sel["branches"]))]))
    with pytest.raises(ProgramError) as exc:
        Program(bad)
    assert exc.value.field == "device.memoize.permanent"


def test_device_client_reports_numbers_and_counts_clipping():
    """The Python SDK with a signed sw-hm state: numbers and their text in, clipped values
    counted per attribute, reports the server accepts; a report beyond the layout's cells is
    out of domain (the worker dead-letters it, tests/test_sdk_numeric_live.py)."""
    import importlib.util

    from ldpstream.producers.ledger import Ledger
    from ldpstream.producers.sdk import DeviceClient, RecordingTransport
    from ldpstream.producers.signing import VerifyKey

    spec = importlib.util.spec_from_file_location("gen", VECTORS.parent / "generate.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    from ldpstream.producers.device import ConfigWatcher

    mech = mechanism_class("sw-hm").from_config(gen.NUM, None, epsilon=1.0, version=3)
    w = ConfigWatcher("unused:0", verify_key=VerifyKey.from_text(gen.TEST_KEY.verify_key.to_text()),
                      max_epsilon=8.0)
    w._take(b"num", gen.envelope(mech.device_state(), "num", 1.0).encode())  # noqa: SLF001
    assert "num" in w.states, w.refusals

    async def run():
        sent = RecordingTransport()
        client = DeviceClient("num", watcher=w, transport=sent, ledger=Ledger(":memory:"),
                              device_id=5, batch_size=50, rng=SplitMix64(3))
        res = await client.report_many(
            [{"fw": "v1", "battery": 120, "temp": "21.5"}, {"fw": "v3", "battery": "55",
                                                            "temp": -25.0}]
            + [{"fw": "v2", "battery": float(v), "temp": "0"} for v in range(40)])
        res += await client.report_many({"fw": ["v1", "v2"], "battery": [-1, 3],
                                         "temp": ["1e3", "2"]})
        await client.flush()
        return client, res, sent

    client, res, sent = asyncio.run(run())
    assert [r.clipped for r in res[:2]] == [("battery",), ("temp",)]
    assert client.clipped == {"battery": 2, "temp": 2}
    assert all(r.status == "queued" and math.isclose(r.epsilon, mech.epsilon) for r in res)
    reports = sent.reports()
    assert reports.shape == (44, 3)
    assert explain_batch(ReportBatch("num", 3, reports), {"num": {3: mech}}) is None
    bad = reports.copy()
    bad[0, 1] = mech.report_bounds()[1]
    assert explain_batch(ReportBatch("num", 3, bad), {"num": {3: mech}})[0] == "out_of_domain"
