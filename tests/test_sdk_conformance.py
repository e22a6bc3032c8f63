"""The Python side of the device-SDK conformance suite (sdk/conformance/*.json,
docs/device-protocol.md): the vectors are current, and the Python SDK reproduces them exactly —
the same draws from the test generator, the same reports and batch bytes, the same accept/refuse
decisions on signed states and the same budget decisions. The C (sdk/c) and TypeScript (sdk/ts)
SDKs run the same files."""
from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import numpy as np
import pytest

from ldpstream.estimators import mechanism_class, mechanism_names
from ldpstream.estimators.kernels.domain import Domain, SchemaError
from ldpstream.producers.codec import decode_batch, encode_batch
from ldpstream.producers.device import ConfigWatcher
from ldpstream.producers.ledger import Budget, Ledger
from ldpstream.producers.program import Program, ProgramError, SplitMix64, bernoulli, categorical, uniform
from ldpstream.producers.sdk import DeviceClient, RecordingTransport
from ldpstream.producers.signing import VerifyKey

pytestmark = pytest.mark.core

DIR = Path(__file__).resolve().parent.parent / "sdk" / "conformance"


def _gen():
    """sdk/conformance/generate.py as a module (its test key and envelope)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sdk_conformance", DIR / "generate.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def _load(name: str) -> dict:
    return json.loads((DIR / name).read_text(encoding="utf-8"))


def test_vectors_are_current():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(DIR / "generate.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_rng_vectors():
    v = _load("rng.json")
    for case in v["words"]:
        g = SplitMix64(int(case["seed"]))
        assert [str(g.next_u64()) for _ in case["words"]] == case["words"]
    for case in v["uniform"]:
        g = SplitMix64(int(case["seed"]))
        assert [uniform(g, case["k"]) for _ in case["draws"]] == case["draws"]
    for case in v["bernoulli"]:
        g = SplitMix64(int(case["seed"]))
        assert [bernoulli(g, case["p"]) for _ in case["draws"]] == case["draws"]
    for case in v["categorical"]:
        g = SplitMix64(int(case["seed"]))
        cum = list(np.cumsum(case["row"]))
        assert [categorical(g, cum) for _ in case["draws"]] == case["draws"]


@pytest.mark.parametrize("case", _load("randomize.json")["cases"], ids=lambda c: c["name"])
def test_randomize_and_batch_vectors(case):
    prog = Program(case["device"])
    assert prog.epsilon == pytest.approx(case["epsilon"], rel=1e-12)
    g = SplitMix64(int(case["seed"]))
    b = case["batch"]
    dev = int(b["device_id"])
    encoded = [prog.encode_clipped(r) for r in case["records"]]
    reports = [prog.randomize(x, g, dev) for x, _ in encoded]
    assert reports == case["reports"]
    if "clipped" in case:  # numeric values clipped into their range
        assert [list(c) for _, c in encoded] == case["clipped"]
    blob = encode_batch(b["collection"], case["version"], np.asarray(reports),
                        device_ids=np.full(len(reports), dev, dtype=np.uint64),
                        sent_at=b["sent_at"], key=(dev, int(b["sequence"])))
    assert blob.hex() == b["hex"]


@pytest.mark.parametrize("which", ["schema_errors", "numeric_errors"])
def test_schema_errors_name_the_attribute(which):
    v = _load("randomize.json")[which]
    prog = Program(v["device"])
    for e in v["errors"]:
        with pytest.raises(SchemaError) as exc:
            prog.encode(e["record"])
        assert exc.value.attribute == e["attribute"] and e["attribute"] in str(exc.value)


def test_malformed_descriptions_name_the_field():
    good = _load("randomize.json")["cases"][0]["device"]
    for patch, field in ((dict(v=2), "device.v"), (dict(width=0), "device.width"),
                         (dict(steps=[{"op": "oue"}]), "device.steps[0].op"),
                         (dict(steps=[{"op": "grr", "in": [0], "out": [0], "p": 1.5}]),
                          "device.steps[0].p"),
                         (dict(steps=[{"op": "grr", "in": [9], "out": [0], "p": 0.5}]),
                          "device.steps[0].in")):
        with pytest.raises(ProgramError) as exc:
            Program(dict(good, **patch))
        assert exc.value.field == field


def test_limits_refused_and_linear():
    """limits.json (docs/device-protocol.md, "Limits"): every description beyond a limit is
    refused naming the field, in the same order as the C and TypeScript SDKs; those at the
    limits parse to their ε within ``max_parse_s`` (a pairwise Bloom distance in Python sets took
    seconds)."""
    import time

    v = _load("limits.json")
    for case in v["cases"]:
        t0 = time.perf_counter()
        if case["expect"] == "accept":
            eps = Program(case["device"]).epsilon
            assert eps == pytest.approx(case["epsilon"], rel=1e-12), case["name"]
        else:
            with pytest.raises(ProgramError) as exc:
                Program(case["device"])
            assert exc.value.field.startswith(case["field"]), (case["name"], str(exc.value))
        assert time.perf_counter() - t0 <= v["max_parse_s"], case["name"]


def _watcher(ceiling: float) -> ConfigWatcher:
    v = _load("states.json")
    return ConfigWatcher("unused:0", verify_key=VerifyKey.from_text(v["public_key"]),
                         max_epsilon=ceiling)


def test_state_decisions():
    """Signed states (good, forged, wrong key, replayed, expired, over the ceiling, identity)
    → accept or refuse with the reason, in order against one device. The ``expired`` and
    ``malformed`` (no ``expires_at``) rules need the expiry check of producers/signing.py."""
    v = _load("states.json")
    w = _watcher(v["ceiling"])
    got = []
    for step in v["steps"]:
        before = dict(w.rejected)
        w._take(step["collection"].encode(), step["record"].encode())  # noqa: SLF001
        refused = [r for r in w.rejected if w.rejected[r] != before.get(r, 0)]
        got.append((step["name"], refused[0] if refused else "accept"))
    assert got == [(s["name"], s["expect"]) for s in v["steps"]]


def test_ledger_decisions():
    v = _load("ledger.json")
    led = Ledger(":memory:", budget=Budget(**v["budget"]))
    got = []
    for e in v["events"]:
        ok = led.refusal(e["cost"], e["now"]) is None
        if ok:
            led.commit("c", e["now"], e["cost"])
        got.append("accept" if ok else "refuse")
    assert got == [e["expect"] for e in v["events"]]


def test_daily_ledger_decisions():
    """The Python ledger makes the daily-cap decisions the C and TS SDKs check (ledger.json
    ``daily``): the window budget first, then ``max_epsilon_per_day`` in the budget day."""
    v = _load("ledger.json")["daily"]
    led = Ledger(":memory:", budget=Budget(**v["budget"]))
    got = []
    for e in v["events"]:
        reason = led.refusal(e["cost"], e["now"]) or led.daily_refusal(
            "c", e["cost"], e["now"], v["max_epsilon_per_day"])
        if reason is None:
            led.commit("c", e["now"], e["cost"])
        got.append(("accept", None) if reason is None else
                   ("refuse", "over_budget" if reason.startswith("over_budget") else "budget"))
    assert got == [(e["expect"], e["reason"]) for e in v["events"]]
    assert {r for _, r in got} == {None, "budget", "over_budget"}


@pytest.mark.parametrize("name", mechanism_names())
def test_every_family_describes_itself_or_says_it_cannot(name):
    """A family's description costs the ε the family computes (rtol 1e-9)."""
    dom = Domain(("a", "b", "c"), (2, 3, 4))
    cls = mechanism_class(name)
    try:
        mech = cls.from_config(dom, None, epsilon=1.0)
    except (ValueError, TypeError) as exc:
        pytest.skip(f"{name} needs parameters: {exc}")
    prog = mech.device_program()
    if prog is None:
        assert "device" not in mech.device_state()
        return
    assert mech.device_state()["device"] == prog
    p = Program(prog)
    assert p.width == mech.report_width
    if name in ("corr-rr", "corr-rr-paper", "rrba"):  # declared: over phases / any table
        assert p.epsilon <= mech.epsilon * (1 + 1e-9)
    else:
        assert math.isclose(p.epsilon, mech.epsilon, rel_tol=1e-9)
    # the reports are valid for the server (codec.explain_batch against the mechanism)
    rng, gen = SplitMix64(9), np.random.default_rng(9)
    reports = np.array([p.randomize([int(gen.integers(d)) for d in dom.shape], rng, dev)
                        for dev in range(200)])
    from ldpstream.producers.codec import ReportBatch, explain_batch

    batch = ReportBatch("c", mech.version, reports)
    assert explain_batch(batch, {"c": {mech.version: mech}}) is None


def test_device_client_randomizes_from_the_signed_description():
    """The Python SDK runs the published description: the conformance reports come out of
    :class:`DeviceClient` with the test generator, with a batch key."""
    from ldpstream.estimators.families.rr import RRIndependent

    gen = _gen()
    DOM, envelope = gen.DOM, gen.envelope
    case = _load("randomize.json")["cases"][0]
    w = _watcher(8.0)
    mech = RRIndependent(DOM, epsilon=1.0, version=1)
    w._take(b"rr-ind", envelope(mech.device_state(), "rr-ind", 1.0).encode())  # noqa: SLF001
    assert "rr-ind" in w.states, w.refusals

    async def run():
        sent = RecordingTransport()
        client = DeviceClient("rr-ind", watcher=w, transport=sent, ledger=Ledger(":memory:"),
                              device_id=3, batch_size=100, rng=SplitMix64(int(case["seed"])))
        res = await client.report_many(case["records"])
        await client.flush()
        assert all(r.epsilon == pytest.approx(case["epsilon"]) for r in res)
        return sent

    sent = asyncio.run(run())
    assert sent.reports().tolist() == case["reports"]
    assert sent.batches[0].key is not None and sent.batches[0].key[0] == 3


def test_device_client_refuses_a_description_beyond_the_limits():
    """A signed state whose description has a partition table of 4³² cells (the C SDK once
    wrapped it to 0 and ran it at ε 44.36): the Python SDK refuses to report with it,
    ``unusable`` naming the field, as the C and TypeScript SDKs refuse the state."""
    from ldpstream.estimators.families.rr import RRIndependent
    from ldpstream.producers.signing import StateRejected

    gen = _gen()
    w = _watcher(8.0)
    state = RRIndependent(gen.DOM, epsilon=1.0, version=1).device_state()
    bad = dict(state, device=_load("limits.json")["cases"][0]["device"])
    w._take(b"rr-ind", gen.envelope(bad, "rr-ind", 1.0).encode())  # noqa: SLF001

    async def run():
        client = DeviceClient("rr-ind", watcher=w, transport=RecordingTransport(),
                              ledger=Ledger(":memory:"), device_id=3, rng=SplitMix64(1))
        return await client.report({"os": "ios", "plan": "free", "region": "eu"})

    with pytest.raises(StateRejected) as exc:
        asyncio.run(run())
    assert exc.value.reason == "unusable" and "device.steps[0].tables[0].in" in exc.value.detail


def test_batch_sequence_survives_a_restart(tmp_path):
    from ldpstream.producers.sequence import BatchSequence

    path = str(tmp_path / "sequence")
    a = BatchSequence(path)
    assert [a.take(), a.take()] == [0, 1]
    assert BatchSequence(path).take() == 2  # a restarted device never reuses a number
    assert BatchSequence(None, clock=lambda: 12.5).take() == 12_500_000


def test_partition_olh_slot_has_the_oracle_channel():
    """The description's partition step, sampled with the production generator, reproduces the
    family's OLH channel (χ² at α = 1e-4 over its 343 codes, 60,000 reports of one value)."""
    from scipy.stats import chisquare

    from ldpstream.estimators.oracles import frequency_oracles as fo
    from ldpstream.producers.program import OsRandom

    case = next(c for c in _load("randomize.json")["cases"] if c["name"] == "partitioned-olh")
    prog = Program(case["device"])
    table = case["device"]["steps"][0]["tables"][1]
    oracle = fo.OLH(2.0, 36, g=table["g"])
    dev, rng, n = int(case["batch"]["device_id"]), OsRandom(), 60_000
    x = [1, 0, 5]  # os = 1, city = 5: cell 1·12 + 5 of the (os, city) table
    codes = np.array([prog.randomize(x, rng, dev)[0] for _ in range(n)]) - table["offset"]
    obs = np.bincount(codes, minlength=oracle.n_codes)
    assert chisquare(obs, n * oracle.channel()[17]).pvalue > 1e-4


def test_a_failed_batch_is_sent_again_with_its_key(tmp_path):
    from ldpstream.estimators.families.rr import RRIndependent
    from ldpstream.producers.sequence import BatchSequence

    class Flaky:
        def __init__(self) -> None:
            self.fail, self.sent = True, []

        async def send(self, collection: str, batch: bytes, device_id: int) -> None:
            if self.fail:
                self.fail = False
                raise ConnectionError("reset")
            self.sent.append(batch)

        async def flush(self) -> None:
            return None

        async def close(self) -> None:
            return None

    w = _watcher(8.0)
    mech = RRIndependent(Domain(("a",), (3,)), epsilon=1.0)
    w._take(b"c", _gen().envelope(mech.device_state(), "c", 1.0).encode())  # noqa: SLF001
    t = Flaky()

    async def run():
        client = DeviceClient("c", watcher=w, transport=t, ledger=Ledger(":memory:"),
                              device_id=4, batch_size=2, rng=SplitMix64(1),
                              sequence=BatchSequence(str(tmp_path / "seq")))
        await client.report({"a": "0"})
        with pytest.raises(ConnectionError):
            await client.report({"a": "1"})
        await client.report({"a": "2"})
        await client.flush()
        return client

    client = asyncio.run(run())
    keys = [decode_batch(b).key for b in t.sent]
    assert keys == [(4, 0), (4, 1)] and client.sent_reports == 3


@pytest.mark.parametrize("name", [c["name"] for c in _load("randomize.json")["cases"]])
def test_description_reports_have_the_family_distribution(name):
    """For one record, 20,000 reports from the description and 20,000 from the family's own
    ``randomize_device`` follow one distribution (two-sample χ² over the distinct reports,
    α = 1e-4, and over every column, α = 1e-4 / width): the description says what the family
    does."""
    from scipy.stats import chi2_contingency

    gen = _gen()
    mech = dict(gen._mechanisms())[name]
    prog = Program(mech.device_program())
    x = [1 % d for d in mech.domain.shape]
    dev, n = gen.DEVICE_ID, 20_000
    rng = SplitMix64(11)
    ours = [tuple(prog.randomize(x, rng, dev)) for _ in range(n)]
    theirs = [tuple(int(v) for v in r) for r in mech.randomize_device(
        np.tile(x, (n, 1)), np.full(n, dev, dtype=np.uint64), np.random.default_rng(11))]
    cells = sorted(set(ours) | set(theirs))
    index = {c: i for i, c in enumerate(cells)}
    table = np.zeros((2, len(cells)))
    for row, reports in enumerate((ours, theirs)):
        np.add.at(table[row], [index[r] for r in reports], 1)
    if len(cells) > 1:
        assert chi2_contingency(table).pvalue > 1e-4, name
    # column by column too (wide reports — Bloom bits — are nearly all distinct as wholes)
    a, b = np.array(ours), np.array(theirs)
    for c in range(a.shape[1]):
        values = np.union1d(a[:, c], b[:, c])
        if len(values) > 1:
            t = np.array([[np.sum(r[:, c] == v) for v in values] for r in (a, b)])
            assert chi2_contingency(t).pvalue > 1e-4 / a.shape[1], (name, c)
