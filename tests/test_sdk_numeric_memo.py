"""Memoized numeric values on the device (docs/device-protocol.md, "Numeric memoization";
docs/numeric.md "Memoization"): a memoized ``sw-hm`` collection publishes its α-point rounding
(points and α seed) and its permanent steps (the task and its wave, memoized together); its ε is
the channels' (behind the rounding), and a description whose waves' ε is not is not published;
the Python SDK rounds with the family's α, keys its memos by the rounded value, re-sends the same
report while a reading wanders inside one rounded point and charges a new rounded value its
attribute's ε once; its permanent responses follow the unit's channel (χ²). Pure CPU, seconds
(the C and TypeScript SDKs: test_sdk_conformance.py's memo.json, test_sdk_memo_audit.py)."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from memo_helpers import NUMERIC_DOMAIN, NUMERIC_GRID, memoized_numeric
from scipy.stats import chi2
from test_sdk_conformance import DIR, _gen, _watcher
from test_sdk_memo_audit import numeric_unit

from ldpstream.estimators import mechanism_class
from ldpstream.estimators.kernels import device_program as dp
from ldpstream.estimators.kernels import numeric as nm
from ldpstream.producers.ledger import Ledger
from ldpstream.producers.program import Program, ProgramError, SplitMix64
from ldpstream.producers.sdk import DeviceClient, RecordingTransport

pytestmark = pytest.mark.core

G, DOM = NUMERIC_GRID, NUMERIC_DOMAIN


def memoized(eps: float = 1.0, **params):
    return memoized_numeric(eps, version=3, **params)


@pytest.mark.parametrize("eps", [0.5, 1.0, 4.0])
@pytest.mark.parametrize("mean", ["auto", "duchi"])
def test_the_memoized_description_rounds_and_costs_the_channels_epsilon(eps, mean):
    """The description is memoized with no instantaneous steps; per numeric attribute its
    rounding points (the family's) and the seed of the attribute's α, its permanent step the
    weighted select over its waves (one wave when a single task); ε per rotation = the sum of
    the channels' ε behind the rounding (R·C), to 1e-9."""
    mech = memoized(eps, mean=mean)
    prog = mech.device_program()
    assert prog is not None and prog["steps"] == []
    memo = prog["memoize"]
    assert memo["rotation_s"] == 86400.0 and memo["round"][0] is None
    assert memo["round"][1] == {"points": mech.points[1].tolist(),
                                "seed": str(dp.alpha_seed("battery"))}
    assert memo["permanent"][0]["op"] == "grr" and memo["permanent"][1]["op"] == "select"
    assert memo["permanent"][1]["weights"] == [t.weight for t in mech.layout(1) if t.weight > 0]
    assert dp.program_epsilon(prog) == pytest.approx(mech.epsilon, rel=1e-9)
    assert Program(prog).epsilon == pytest.approx(sum(mech.epsilons), rel=1e-9)
    one = memoized(eps, mean=mean, mean_share=0.0).device_program()
    assert one is not None and one["memoize"]["permanent"][1]["op"] == "wave"


def test_a_description_whose_epsilon_is_not_the_channels_is_not_published():
    """A Piecewise grid too coarse for ε to be attained (every report on the mean): the wave's
    ε (from its parameters) exceeds the rounded channel's (0.96), so neither the fresh nor the
    memoized description is published (the C and TypeScript SDKs then refuse the state as
    unusable); at 5 points it is attained and both are."""
    coarse = {"mean": "pm", "mean_grid": 3, "mean_share": 1.0}
    mech = memoized(1.0, **coarse)
    assert nm.epsilon(mech.channel(1)) < 1.0 - 1e-3
    assert mech.device_program() is None
    assert mechanism_class("sw-hm").from_config(DOM, coarse, epsilon=1.0).device_program() \
        is None
    assert memoized(1.0, **dict(coarse, mean_grid=5)).device_program() is not None


def test_the_fingerprint_covers_the_task_weights_and_the_waves():
    """Memos are reused only under the same permanent channels: another task mix or another
    bucket count is another fingerprint; the rounding points are not part of it (a memo is the
    response of a grid value, whatever rounded it there)."""
    base = Program(memoized(1.0).device_program()).memo
    assert base is not None
    for other in ({"mean_share": 0.3}, {"buckets": 256}):
        assert Program(memoized(1.0, **other).device_program()).memo.fingerprint \
            != base.fingerprint
    assert Program(memoized(1.0, alpha_points=8).device_program()).memo.fingerprint \
        == base.fingerprint


def test_rounding_is_the_familys_and_bad_rounding_is_refused():
    """The SDK rounds exactly as the family's device_records (the same α per device id); a
    rounding entry on a categorical attribute, points not ending on the grid's last index, or a
    seed that is not a u64 are refused naming the field."""
    mech = memoized(1.0)
    memo = Program(mech.device_program()).memo
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 2**63, size=200, dtype=np.uint64)
    x = np.stack([rng.integers(0, 3, 200), rng.integers(0, G, 200)], axis=1)
    want = mech.device_records(x, ids)
    got = [memo.rounded(list(r), int(d)) for r, d in zip(x, ids)]
    np.testing.assert_array_equal(np.asarray(got), want)
    doc = mech.device_program()
    for field, bad in (("device.memoize.round[0]", [{"points": [0, 2], "seed": "1"},
                                                    doc["memoize"]["round"][1]]),
                       ("device.memoize.round[1].points", [None, {"points": [0, 128],
                                                                  "seed": "1"}]),
                       ("device.memoize.round[1].seed", [None, {"points": [0, G - 1],
                                                                "seed": "-1"}])):
        with pytest.raises(ProgramError) as exc:
            Program(dict(doc, memoize=dict(doc["memoize"], round=bad)))
        assert exc.value.field == field


def test_a_wandering_reading_resends_its_report_and_a_new_rounded_value_costs_its_epsilon():
    """A device whose battery wanders inside one rounded point: its first report costs the
    record's ε, the next readings are duplicates (nothing sent, nothing spent) until
    ``resend_every_s`` passes, then the very same report is sent again at no cost; a reading
    past its α-point is a new memo of the battery alone (its ε, the firmware's memo kept)."""
    gen = _gen()
    mech = memoized(1.0)
    w = _watcher(8.0)
    w._take(b"num", gen.envelope(mech.device_state(), "num", 1.0).encode())  # noqa: SLF001
    assert "num" in w.states, w.refusals
    ids = np.arange(1, 1000, dtype=np.uint64)
    alphas = dp.device_alpha(ids, dp.alpha_seed("battery"))
    dev = int(ids[(alphas > 0.45) & (alphas < 0.55)][0])   # its α-point mid-interval
    alpha = float(alphas[dev - 1])
    pts = mech.points[1]          # 17 points, 16 grid steps apart (6.25 % of the range)
    lo, hi = float(pts[9]) / (G - 1) * 100, float(pts[10]) / (G - 1) * 100
    below = lo + (hi - lo) * alpha * 0.4          # rounds down: its fraction is under α
    wander = [below + d for d in (0.0, 0.2, -0.2, 0.1)]
    past = lo + (hi - lo) * (alpha + (1 - alpha) / 2)   # past the α-point: rounds up
    now = [1000.0]

    async def run():
        sent = RecordingTransport()
        client = DeviceClient("num", watcher=w, transport=sent, ledger=Ledger(":memory:"),
                              device_id=dev, batch_size=100, resend_every_s=600.0,
                              rng=SplitMix64(5), clock=lambda: now[0])
        out = []
        for i, v in enumerate(wander):
            now[0] = 1000.0 + 10 * i
            out.append(await client.report({"fw": "b", "battery": v}))
        now[0] = 1700.0
        out.append(await client.report({"fw": "b", "battery": wander[-1]}))
        now[0] = 1710.0
        out.append(await client.report({"fw": "b", "battery": past}))
        await client.flush()
        return out, sent

    res, sent = asyncio.run(run())
    assert [r.status for r in res] == ["queued", "duplicate", "duplicate", "duplicate", "queued",
                                       "queued"]
    assert res[0].epsilon == pytest.approx(mech.epsilon, rel=1e-9)
    assert res[4].epsilon == 0.0 and res[4].report.tolist() == res[0].report.tolist()
    assert res[5].epsilon == pytest.approx(mech.epsilons[1], rel=1e-9)
    assert res[5].report[0] == res[0].report[0]
    assert len(sent.reports()) == 3


def test_the_python_sdk_permanent_responses_follow_the_units_channel():
    """The memo.json numeric case's battery unit, drawn by the Python SDK with the test
    generator: 2,000 responses per grid index of device 1 (its α-point rounding, then the task
    and its wave) against the channel built from the description (χ² at α = 10⁻⁴, pooled
    over the grid), and a sampler that forgets the rounding fails it."""
    doc = json.loads((DIR / "memo.json").read_text(encoding="utf-8"))["numeric"]["device"]
    memo = Program(doc).memo
    assert memo is not None
    P = numeric_unit(doc, 1, device_id=1)
    rng = SplitMix64(2024)
    n = 2000
    counts = np.zeros_like(P)
    unrounded = np.zeros_like(P)
    for i in range(P.shape[0]):
        r = memo.rounded([0, i], 1)[1]
        for _ in range(n):
            counts[i, memo.draw((1, r), rng)] += 1
            unrounded[i, memo.draw((1, i), rng)] += 1

    def pvalue(c: np.ndarray) -> float:
        e = n * P
        used = e > 0
        assert np.all(c[~used] == 0)
        stat = float((((c - e) ** 2)[used] / e[used]).sum())
        return float(chi2.sf(stat, int(used.sum()) - len(P)))

    assert pvalue(counts) > 1e-4
    assert pvalue(unrounded) < 1e-4


def test_the_vectors_hold_a_wandering_reading_and_its_resend():
    """memo.json's numeric case, which the C and TypeScript SDKs replay bit for bit: readings
    other than the first one's text that round to its point are duplicates, and after
    ``resend_every_s`` the first report is sent again, costing nothing; a reading past the
    device's α-point is charged the battery's ε alone."""
    case = json.loads((DIR / "memo.json").read_text(encoding="utf-8"))["numeric"]
    ev = case["events"]
    first = ev[0]
    dups = [e for e in ev if e["status"] == "duplicate"
            and e["record"]["battery"] != first["record"]["battery"]]
    assert dups
    resent = [e for e in ev if e["status"] == "queued" and e["cost"] == 0.0
              and e["record"] == first["record"]]
    assert resent and resent[0]["report"] == first["report"]
    assert resent[0]["now"] - first["now"] >= case["resend_every_s"]
    battery = Program(case["device"]).memo.epsilons[1]
    assert any(e["cost"] == battery and e["record"]["fw"] == first["record"]["fw"]
               and e["now"] - first["now"] < 100 for e in ev[1:])
