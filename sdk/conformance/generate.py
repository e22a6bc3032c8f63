"""Write the conformance vectors every device SDK runs (docs/device-protocol.md,
"Conformance suite"): ``rng.json``, ``randomize.json``, ``states.json``, ``ledger.json`` (with
the daily ε budget across a UTC midnight), ``memo.json``, ``identity.json`` (device keys,
credentials, authenticated batches) and ``limits.json`` in this directory, from the Python
implementation.

    .venv/bin/python sdk/conformance/generate.py          # rewrite the files
    .venv/bin/python sdk/conformance/generate.py --check  # exit 1 if a file would change

Everything is deterministic: SplitMix64 seeds, a fixed Ed25519 test key (signatures are
deterministic), fixed timestamps.
"""
from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ldpstream.estimators import mechanism_class
from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.names import BUDGET_FIELD
from ldpstream.producers.codec import encode_batch
from ldpstream.producers.program import Program, SplitMix64, bernoulli, categorical, uniform
from ldpstream.producers.signing import ALG, DOMAIN, SigningKey

HERE = Path(__file__).resolve().parent
#: the test signing key (32 bytes 0x01..0x20); never a production key
TEST_KEY = SigningKey.from_text(base64.b64encode(bytes(range(1, 33))).decode())
OTHER_KEY = SigningKey.from_text(base64.b64encode(bytes(range(101, 133))).decode())
NOW = 1_790_000_000.0
VALID_UNTIL = 4_102_444_800.0        # 2100-01-01
EXPIRED_AT = 1_000_000_000.0         # 2001-09-09
CEILING = 8.0
#: the device of the randomize cases (above 2^63: u64 ids are exact everywhere; the partitioned
#: case's assign_seed sends it to its OLH table)
DEVICE_ID = 2**63 + 7

DOM = Domain(("os", "plan", "region"), (3, 2, 4),
             (("android", "ios", "web"), ("free", "pro"), ("eu", "us", "apac", "latam")))
CITY = Domain(("os", "plan", "city"), (3, 2, 12),
              (("android", "ios", "web"), ("free", "pro"), tuple(f"c{i}" for i in range(12))))
WIDE = Domain(("zip", "plan"), (300, 2),
              (tuple(f"z{i:03d}" for i in range(300)), ("free", "pro")))
#: numeric attributes (docs/numeric.md): a categorical one, battery on a 1-point step (ties at
#: .5 round to even), temp on a 2.5-point step
NUM = Domain(("fw", "battery", "temp"), (3, 101, 33),
             (("v1", "v2", "v3"), tuple(str(i) for i in range(101)),
              tuple(f"{v:g}" for v in np.linspace(-20, 60, 33))),
             (None, (0.0, 100.0), (-20.0, 60.0)))
#: one numeric attribute on 65 points
NUM1 = Domain(("x",), (65,), (tuple(f"{v:.12g}" for v in np.linspace(0, 100, 65)),),
              ((0.0, 100.0),))
#: a numeric attribute inside partitioned marginals (docs/numeric.md "In partitioned
#: marginals"): battery on 101 points, rounded to its points by a ``round`` step
PNUM = Domain(("fw", "plan", "battery"), (3, 2, 101),
              (("v1", "v2", "v3"), ("free", "pro"), tuple(str(i) for i in range(101))),
              (None, None, (0.0, 100.0)))
#: numeric values as a device reads them (text): signs, exponents, a fraction alone, ties on
#: the grid, values clipped below and above the range
NUMERIC_TEXTS = ["21.5", "-3", "1e2", ".5", "+7", "100.000", "250", "-1e3", "63.25", "0", "12.5",
                 "13.5", "1.25", "3.75", "99.9999", "45", "2E1", "0.0001", "59.99", "-20",
                 "60", "7.", "33.3", "1e-3"]


def _mechanisms() -> list[tuple[str, Any]]:
    custom = RRIndependent(Domain(DOM.attrs[:2], DOM.shape[:2], DOM.labels[:2]), channels=[
        np.array([[0.6, 0.3, 0.1], [0.2, 0.6, 0.2], [0.1, 0.3, 0.6]]),
        np.array([[0.7, 0.3], [0.4, 0.6]])], version=2)
    return [
        ("rr-ind", RRIndependent(DOM, epsilon=1.0, version=1)),
        ("rr-ind-matrix", custom),
        ("rr-ind-wide", RRIndependent(WIDE, epsilon=[2.0, 0.5], version=7)),
        ("rr-joint", mechanism_class("rr-joint").from_config(DOM, None, epsilon=0.8)),
        ("rr-clusters", mechanism_class("rr-clusters")(DOM, [["os", "plan"], ["region"]], 1.2)),
        ("spl", mechanism_class("spl").from_config(DOM, None, epsilon=2.0,
                                                   epsilon_scope="record")),
        ("smp", mechanism_class("smp").from_config(DOM, None, epsilon=1.5,
                                                   epsilon_scope="record")),
        ("rs-fd", mechanism_class("rs-fd").from_config(DOM, None, epsilon=1.0)),
        ("rs-rfd", mechanism_class("rs-rfd")(DOM, 2.0, priors=[
            np.array([0.5, 0.3, 0.2]), np.array([0.9, 0.1]), np.array([0.4, 0.3, 0.2, 0.1])],
            phase=1, version=2)),
        ("corr-rr-phase1", mechanism_class("corr-rr").from_config(DOM, None, epsilon=1.0)),
        ("corr-rr-phase2", mechanism_class("corr-rr").from_config(
            DOM, None, epsilon=1.0).with_phase(1)),
        ("rrba", _rrba()),
        ("lopub", mechanism_class("lopub").from_config(DOM, None, epsilon=1.0, version=1)),
        ("partitioned-olh", mechanism_class("partitioned").from_config(
            CITY, {"assign_seed": 12349}, epsilon=2.0, epsilon_scope="record")),
        ("partitioned-2", mechanism_class("partitioned").from_config(
            DOM, {"per_report": 2, "ways": 1}, epsilon=1.0, version=3)),
        ("partitioned-num", mechanism_class("partitioned")(
            PNUM, 2.0, marginals=[["fw", "battery"]], oracles=("grr",), bins={"battery": 9},
            version=2)),
        ("partitioned-num-olh", mechanism_class("partitioned")(
            PNUM, 3.0, marginals=[["fw", "battery"], ["fw", "plan"]], oracles=("olh",),
            per_report=2, bins={"battery": 5}, version=4)),
        ("sw-hm", mechanism_class("sw-hm").from_config(
            NUM, {"buckets": 32, "mean_grid": 17}, epsilon=1.0, version=2)),
        ("sw-hm-duchi", mechanism_class("sw-hm").from_config(
            NUM1, {"mean_share": 0.3}, epsilon=0.5, version=1)),
        # ε 4: the k-point mean mechanism (5 points: a bucketed wave of 5 cells)
        ("sw-hm-points", mechanism_class("sw-hm").from_config(
            NUM, {"buckets": 32}, epsilon=4.0, version=3)),
    ]


def _rrba() -> Any:
    """RRBA with skewed tables (a fake cell's law is not uniform) and view 1 converged."""
    st = mechanism_class("rrba").from_config(DOM, None, epsilon=1.0, version=4).state()
    st["history"] = [[[(np.arange(1, len(t[0]) + 1) ** 2 / np.sum(np.arange(1, len(t[0]) + 1)
                                                                   ** 2)).tolist()]
                      for t in view] for view in st["history"]]
    st["converged"] = [False, True, False]
    return mechanism_class("rrba").from_state(st)


def _records(domain: Domain, n: int) -> list[dict[str, str]]:
    """Labels; a numeric attribute's values from NUMERIC_TEXTS (shifted per attribute)."""
    return [{a: NUMERIC_TEXTS[(i + 5 * j) % len(NUMERIC_TEXTS)]
             if domain.numeric_range(a) is not None else domain.categories(a)[(i * (j + 2) + j) % d]
             for j, (a, d) in enumerate(zip(domain.attrs, domain.shape))} for i in range(n)]


def rng_vectors() -> dict[str, Any]:
    seeds = [0, 1, 42, 2**64 - 1]
    out: dict[str, Any] = {"generator": "splitmix64", "words": [], "uniform": [],
                           "bernoulli": [], "categorical": []}
    for s in seeds:
        g = SplitMix64(s)
        out["words"].append({"seed": str(s), "words": [str(g.next_u64()) for _ in range(8)]})
    for s, k in ((7, 1), (7, 2), (7, 3), (8, 1000), (9, 2**32), (10, 2**31 + 1)):
        g = SplitMix64(s)
        out["uniform"].append({"seed": str(s), "k": k, "draws": [uniform(g, k) for _ in range(16)]})
    for s, p in ((11, 0.0), (11, 1.0), (12, 0.5), (13, 0.7310585786300048), (14, 1e-9)):
        g = SplitMix64(s)
        out["bernoulli"].append({"seed": str(s), "p": p,
                                 "draws": [bernoulli(g, p) for _ in range(16)]})
    g = SplitMix64(15)
    row = [0.1, 0.2, 0.3, 0.4]
    cum = list(np.cumsum(row))
    out["categorical"].append({"seed": "15", "row": row,
                               "draws": [categorical(g, cum) for _ in range(16)]})
    return out


def randomize_vectors() -> dict[str, Any]:
    cases = []
    for i, (name, mech) in enumerate(_mechanisms()):
        prog_doc = mech.device_program()
        prog = Program(prog_doc)
        seed = 1000 + i
        g = SplitMix64(seed)
        records = _records(mech.domain, 24)
        device_id, sequence, sent_at = DEVICE_ID, 5 + i, NOW + 0.25
        encoded = [prog.encode_clipped(r) for r in records]
        reports = [prog.randomize(x, g, device_id) for x, _ in encoded]
        batch = encode_batch(name, mech.version, np.asarray(reports),
                             device_ids=np.full(len(reports), device_id, dtype=np.uint64),
                             sent_at=sent_at, key=(device_id, sequence))
        cases.append({"name": name, "family": mech.name, "version": mech.version,
                      "device": prog_doc, "epsilon": prog.epsilon, "seed": str(seed),
                      "records": records, "reports": reports,
                      **({"clipped": [list(c) for _, c in encoded]}
                         if mech.domain.ranges is not None else {}),
                      "batch": {"collection": name, "device_id": str(device_id),
                                "sequence": str(sequence), "sent_at": sent_at,
                                "hex": batch.hex()}})
    mech = _mechanisms()[0][1]
    errors = [{"record": {"os": "ios", "plan": "free"}, "attribute": "region"},
              {"record": {"os": "ios", "plan": "free", "region": "eu", "age": "3"},
               "attribute": "age"},
              {"record": {"os": "beos", "plan": "free", "region": "eu"}, "attribute": "os"}]
    num = next(c["device"] for c in cases if c["name"] == "sw-hm")
    bad = ["abc", "NaN", "nan", "inf", "0x10", "", " 5", "5 ", "1e", "1,5", "--1", "."]
    numeric = [{"record": {"fw": "v1", "battery": b, "temp": "20"}, "attribute": "battery"}
               for b in bad] + [{"record": {"fw": "v1", "battery": "20"}, "attribute": "temp"}]
    return {"cases": cases, "schema_errors": {"device": mech.device_program(), "errors": errors},
            "numeric_errors": {"device": num, "errors": numeric}}


def envelope(state: dict[str, Any], collection: str, issued_at: float, *,
             expires_at: float | None = VALID_UNTIL, key: SigningKey = TEST_KEY,
             key_id: str | None = None) -> str:
    """A signed ``ldp.config`` record value (producers/signing.py) with ``expires_at``."""
    body = dict(state, collection=collection, issued_at=issued_at)
    if expires_at is not None:
        body["expires_at"] = expires_at
    payload = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    sig = key.key.sign(DOMAIN + payload.encode("utf-8"))
    return json.dumps({"alg": ALG, "key_id": key_id or key.verify_key.key_id, "payload": payload,
                       "signature": base64.b64encode(sig).decode("ascii")},
                      separators=(",", ":"))


def state_vectors() -> dict[str, Any]:
    dom = Domain(DOM.attrs[:2], DOM.shape[:2], DOM.labels[:2])

    def st(mech: Any) -> dict[str, Any]:
        return mech.device_state()

    v1, v2 = st(RRIndependent(dom, epsilon=1.0, version=1)), st(RRIndependent(dom, epsilon=1.0,
                                                                            version=2))
    # the downgrade attack: identity channels (reports = true values) declaring ε = 1
    base = st(RRIndependent(dom, epsilon=1.0, version=3))
    ident = dict(base, channels=[np.eye(d).tolist() for d in dom.shape],
                 device=dict(base["device"], steps=[dict(s, p=1.0) for s in
                                                    base["device"]["steps"]]))
    over = st(RRIndependent(dom, epsilon=4.5, version=3))        # ε = 9 > 8
    undescribed = {k: v for k, v in dict(v2, mechanism="lopub", version=4).items()
                   if k != "device"}
    future = dict(v2, version=3, device=dict(v2["device"], v=2))
    good = envelope(v1, "app", 100.0)
    tampered = json.loads(envelope(v2, "app", 200.0))
    tampered["payload"] = tampered["payload"].replace('"version":2', '"version":9')
    forged = json.loads(envelope(v2, "app", 200.0, key=OTHER_KEY))
    forged["key_id"] = TEST_KEY.verify_key.key_id
    steps = [
        ("good", "app", good, "accept"),
        ("not JSON", "app", "{not json", "malformed"),
        ("unsigned", "app", json.dumps(dict(v2, collection="app", issued_at=200.0)), "unsigned"),
        ("wrong key", "app", envelope(v2, "app", 200.0, key=OTHER_KEY), "wrong_key"),
        ("forged (pinned key id, other key's signature)", "app", json.dumps(forged),
         "bad_signature"),
        ("tampered payload", "app", json.dumps(tampered), "bad_signature"),
        ("signed for another collection", "app", envelope(v2, "other", 200.0),
         "wrong_collection"),
        ("no expires_at", "app", envelope(v2, "app", 200.0, expires_at=None), "malformed"),
        ("expired", "app", envelope(v2, "app", 200.0, expires_at=EXPIRED_AT), "expired"),
        ("over the ceiling", "app", envelope(over, "app", 300.0), "over_ceiling"),
        ("identity channel", "app", envelope(ident, "app", 300.0), "over_ceiling"),
        ("newer version", "app", envelope(v2, "app", 200.0), "accept"),
        ("same record again", "app", envelope(v2, "app", 200.0), "accept"),
        ("replayed older version", "app", good, "replayed"),
        ("replayed: same version signed earlier", "app", envelope(v2, "app", 150.0),
         "replayed"),
    ]
    sdk_only = [
        ("family without a description (lopub)", "app", envelope(undescribed, "app", 400.0),
         "unusable"),
        ("description version 2", "app", envelope(future, "app", 400.0), "unusable"),
        ("max_epsilon_per_day not a positive number", "app",
         envelope(dict(v2, version=5, **{BUDGET_FIELD: -1.0}), "app", 500.0), "malformed"),
        ("with max_epsilon_per_day", "app",
         envelope(dict(v2, version=5, **{BUDGET_FIELD: 2.5}), "app", 500.0), "accept"),
        ("a partition table of 4^32 cells (limits.json)", "app",
         envelope(dict(v2, version=6, device=limits_vectors()["cases"][0]["device"]), "app",
                  600.0), "unusable"),
        ("a numeric collection (sw-hm, battery on 1,025 points by firmware)", "app",
         envelope(_numeric_state(), "app", 700.0), "accept"),
        ("partitioned with a numeric attribute (a round step, then the partition step)",
         "app", envelope(_partitioned_numeric_state(), "app", 800.0), "accept"),
    ]
    return {"public_key": TEST_KEY.verify_key.to_text(), "ceiling": CEILING, "now": NOW,
            "steps": [{"name": n, "collection": c, "record": r, "expect": e}
                      for n, c, r, e in steps],
            "sdk_only_steps": [{"name": n, "collection": c, "record": r, "expect": e,
                                BUDGET_FIELD: json.loads(json.loads(r)["payload"]).get(
                                    BUDGET_FIELD)} for n, c, r, e in sdk_only]}


def _numeric_state() -> dict[str, Any]:
    """A real sw-hm state with its description (grid points left out of the domain: small
    enough for the firmware profile's parse arena, 32- and 64-bit)."""
    from ldpstream.estimators.kernels.numeric import numeric_labels

    dom = Domain(("fw", "battery"), (3, 1025), (("v1", "v2", "v3"), numeric_labels(0, 100, 1025)),
                 (None, (0.0, 100.0)))
    return mechanism_class("sw-hm").from_config(dom, None, epsilon=1.0, version=7).device_state()


def _partitioned_numeric_state() -> dict[str, Any]:
    """A real partitioned state with a numeric attribute: its description rounds the value to
    its points (a ``round`` step), then the partition step (docs/numeric.md "In partitioned
    marginals")."""
    from ldpstream.estimators.kernels.numeric import numeric_labels

    dom = Domain(("fw", "battery"), (3, 1025), (("v1", "v2", "v3"), numeric_labels(0, 100, 1025)),
                 (None, (0.0, 100.0)))
    return mechanism_class("partitioned").from_config(
        dom, {"bins": {"battery": 9}}, epsilon=2.0, epsilon_scope="record",
        version=8).device_state()


def ledger_vectors() -> dict[str, Any]:
    """Budget decisions: ε spent in (now − window, ∞) plus the cost must stay ≤ the budget;
    a clock stepped back never frees budget."""
    events = [(0.0, 1.0, "accept"), (10.0, 1.0, "accept"), (20.0, 1.5, "refuse"),
              (20.0, 1.0, "accept"), (50.0, 0.5, "refuse"), (101.0, 1.0, "accept"),
              (5.0, 1.0, "refuse"), (111.0, 1.0, "accept"), (300.0, 2.5, "accept"),
              (300.0, 0.6, "refuse")]
    return {"budget": {"epsilon": 3.0, "window_s": 100.0},
            "events": [{"now": t, "cost": c, "expect": e} for t, c, e in events],
            "daily": daily_vectors()}


#: the end of a budget day (a UTC midnight): reports on both sides of it
MIDNIGHT = 1_790_035_200.0
#: (seconds from MIDNIGHT, ε): a budget of 3 per 600 s and max_epsilon_per_day 2.5; a clock
#: stepped back across midnight stays in the new day
DAILY_EVENTS = [(-500.0, 1.0), (-400.0, 1.0), (-300.0, 1.0), (-300.0, 0.5), (-10.0, 0.1),
                (10.0, 1.0), (150.0, 1.0), (-100.0, 0.4), (400.0, 1.2), (400.0, 1.1),
                (86_405.0, 2.5)]


def daily_vectors() -> dict[str, Any]:
    """The collection's ``max_epsilon_per_day`` (docs/privacy-over-time.md): ε spent in the
    budget day (UTC calendar day) of the ledger's time plus the cost must stay ≤ it; the window
    budget is checked first (``expect`` ``refuse``, ``reason`` ``budget`` or ``over_budget``)."""
    from ldpstream.producers.ledger import Budget, Ledger

    per_day, out = 2.5, []
    with Ledger(":memory:", budget=Budget(3.0, 600.0)) as ledger:
        for dt, cost in DAILY_EVENTS:
            now = MIDNIGHT + dt
            reason = "budget" if ledger.refusal(cost, now) else (
                "over_budget" if ledger.daily_refusal("c", cost, now, per_day) else None)
            if reason is None:
                ledger.commit("c", now, cost)
            out.append({"now": now, "cost": cost, "expect": "refuse" if reason else "accept",
                        "reason": reason})
    return {"budget": {"epsilon": 3.0, "window_s": 600.0}, "max_epsilon_per_day": per_day,
            "events": out}


MEMO_EVENTS = [  # (now, record): rotation 100 s, budget 3.5 per 60 s, resend after 50 s
    (1000.0, ("android", "free")), (1010.0, ("android", "free")), (1020.0, ("android", "pro")),
    (1030.0, ("ios", "pro")), (1061.0, ("android", "free")), (1100.0, ("android", "free")),
    (1050.0, ("android", "free")), (1055.0, ("ios", "free")), (1200.0, ("ios", "free"))]


#: memoized across midnight (seconds from MIDNIGHT), max_epsilon_per_day 3 (the window budget
#: of 100 never binds): only new permanent responses are charged to the day, a clock stepped
#: back stays in the new day and period
DAILY_MEMO_EVENTS = [
    (-300.0, ("android", "free")), (-290.0, ("android", "free")), (-250.0, ("android", "pro")),
    (-240.0, ("ios", "pro")), (10.0, ("ios", "pro")), (-50.0, ("android", "free")),
    (20.0, ("ios", "free")), (86_430.0, ("ios", "free"))]


#: memoized partitioned (rotation 100 s, budget 8 per 300 s): a new period re-assigns the
#: marginal, a changed value inside it is a new memo
PARTITION_EVENTS = [
    (1000.0, ("android", "free", "eu")), (1010.0, ("android", "free", "eu")),
    (1020.0, ("ios", "free", "eu")), (1030.0, ("android", "pro", "us")),
    (1110.0, ("android", "free", "eu")), (1210.0, ("web", "pro", "apac")),
    (1310.0, ("web", "pro", "apac")), (1410.0, ("android", "free", "latam"))]


#: a memoized numeric collection (rotation 100 s, budget 4 per 60 s, resend after 50 s): a
#: battery reading wandering inside one rounded point (duplicates, then the same report sent
#: again), crossing the device's α-point (a new memo, its attribute's ε), a new period, a clock
#: stepped back, a value clipped
NUMERIC_MEMO_EVENTS = [
    (1000.0, ("v1", "57")), (1010.0, ("v1", "58.5")), (1020.0, ("v1", "55.9")),
    (1030.0, ("v1", "53.2")), (1040.0, ("v1", "60.1")), (1061.0, ("v1", "57")),
    (1070.0, ("v2", "57.5")), (1080.0, ("v2", "61")), (1100.0, ("v1", "57")),
    (1050.0, ("v1", "90")), (1110.0, ("v3", "91.2")), (1200.0, ("v3", "120")),
    (1210.0, ("v3", "99.5"))]
#: its domain: a categorical attribute and a battery on 33 points (8 rounding intervals of
#: 4 grid steps: small enough for the memo audit)
NUM_MEMO = Domain(("fw", "battery"), (3, 33),
                  (("v1", "v2", "v3"), tuple(f"{v:g}" for v in np.linspace(0, 100, 33))),
                  (None, (0.0, 100.0)))


def _numeric_memo() -> dict[str, Any]:
    """The memoized numeric case: its description, the replayed events, and per device id its
    α and the rounded value of every battery grid index (docs/device-protocol.md, "Numeric
    memoization")."""
    from ldpstream.estimators.kernels.device_program import alpha_round, device_alpha

    st = mechanism_class("sw-hm").from_config(
        NUM_MEMO, {"buckets": 32, "mean_grid": 17, "alpha_points": 8,
                   "memoize": {"rotation_s": 100.0}}, epsilon=1.0, version=8).device_state()
    rnd = st["device"]["memoize"]["round"][1]
    pts, seed = np.asarray(rnd["points"]), int(rnd["seed"])
    alphas = []
    for dev in (DEVICE_ID, 0, 1, 2**64 - 1):
        a = device_alpha(np.array([dev], dtype=np.uint64), seed)
        alphas.append({"device_id": str(dev), "attribute": 1, "alpha": float(a[0]),
                       "rounded": alpha_round(np.arange(33), pts, a[0]).tolist()})
    return {"device": st["device"], "seed": "83", "device_id": str(DEVICE_ID),
            "budget": {"epsilon": 4.0, "window_s": 60.0}, "resend_every_s": 50.0,
            "fingerprint": Program(st["device"]).memo.fingerprint, "alpha": alphas,
            "events": _replay(st, NUM_MEMO, NUMERIC_MEMO_EVENTS, DEVICE_ID, 83, (4.0, 60.0),
                              50.0)}


def _partition_numeric_memo() -> dict[str, Any]:
    """A memoized partitioned collection with the battery inside its marginals: α-point
    rounded to 9 points (``memoize.round``), its ``round`` step then mapping the point to its
    index before the partition step; the numeric events replayed (docs/device-protocol.md,
    "Numeric memoization")."""
    st = mechanism_class("partitioned").from_config(
        NUM_MEMO, {"marginals": [["battery"], ["fw", "battery"]], "bins": {"battery": 9},
                   "memoize": {"rotation_s": 100.0, "instantaneous_epsilon": 2.0}},
        epsilon=2.0, epsilon_scope="record", version=9).device_state()
    return {"device": st["device"], "seed": "84", "device_id": str(DEVICE_ID),
            "budget": {"epsilon": 8.0, "window_s": 60.0}, "resend_every_s": 50.0,
            "fingerprint": Program(st["device"]).memo.fingerprint,
            "events": _replay(st, NUM_MEMO, NUMERIC_MEMO_EVENTS, DEVICE_ID, 84, (8.0, 60.0),
                              50.0)}


def _replay(state: dict[str, Any], domain: Domain, events: list, device_id: int, seed: int,
            budget: tuple[float, float], resend_every_s: float | None,
            max_per_day: float | None = None) -> list[dict[str, Any]]:
    """``events`` (now, labels) through the Python SDK with ``state`` (signed with
    ``max_epsilon_per_day`` when given): what each became."""
    import asyncio

    from ldpstream.producers.device import ConfigWatcher
    from ldpstream.producers.ledger import Budget, Ledger
    from ldpstream.producers.sdk import DeviceClient, RecordingTransport

    watcher = ConfigWatcher("unused:0", verify_key=TEST_KEY.verify_key, max_epsilon=CEILING)
    if max_per_day is not None:
        state = {**state, BUDGET_FIELD: max_per_day}
    watcher._take(b"memo", envelope(state, "memo", 1.0).encode())  # noqa: SLF001
    now = [0.0]
    client = DeviceClient("memo", watcher=watcher, transport=RecordingTransport(),
                          ledger=Ledger(":memory:", budget=Budget(*budget)), device_id=device_id,
                          resend_every_s=resend_every_s, rng=SplitMix64(seed),
                          clock=lambda: now[0])
    out = []
    for t, labels in events:
        now[0] = t
        record = dict(zip(domain.attrs, labels))
        res = asyncio.run(client.report(record))
        out.append({"now": t, "record": record, "status": res.status, "cost": res.epsilon,
                    "report": None if res.report is None else [int(v) for v in res.report]})
    return out


def memo_vectors() -> dict[str, Any]:
    """Memoized reports through the Python SDK: duplicates, partial charges, resends, rotation,
    a clock stepped back, budget refusals — with the reports of the test generator. Under
    ``partition``, ``partition_olh``, ``cluster`` and ``select``: memoized partitioned,
    rr-clusters and smp collections (``memoize.kind`` partition, cluster, select) of the
    device ``DEVICE_ID``; under ``numeric``, a memoized sw-hm collection (α-point rounding,
    the task memoized with its wave) and the rounding of four device ids; under
    ``partition_numeric``, a memoized partitioned one with the battery α-point rounded."""
    from ldpstream.estimators.stream.longitudinal import Memoize

    dom = Domain(DOM.attrs[:2], DOM.shape[:2], DOM.labels[:2])
    state = RRIndependent(dom, epsilon=1.0, version=5,
                          memoize=Memoize(100.0, (2.0, 2.0))).device_state()
    part = mechanism_class("partitioned").from_config(
        DOM, {"ways": 2, "memoize": {"rotation_s": 100.0, "instantaneous_epsilon": 2.0}},
        epsilon=2.0, epsilon_scope="record", version=3).device_state()
    olh = mechanism_class("partitioned").from_config(
        DOM, {"ways": 2, "oracles": ["olh"], "per_report": 2,
              "memoize": {"rotation_s": 100.0, "instantaneous_epsilon": 3.0}},
        epsilon=3.0, epsilon_scope="record", version=4).device_state()
    smp = mechanism_class("smp").from_config(
        DOM, {"memoize": {"rotation_s": 100.0, "instantaneous_epsilon": 1.0}}, epsilon=2.0,
        epsilon_scope="record", version=6).device_state()
    clus = mechanism_class("rr-clusters").from_config(
        DOM, {"clusters": [["os", "region"], ["plan"]],
              "memoize": {"rotation_s": 100.0, "instantaneous_epsilon": 1.5}},
        epsilon=1.0, version=2).device_state()

    def case(st: dict[str, Any], seed: int, budget: float) -> dict[str, Any]:
        return {"device": st["device"], "seed": str(seed), "device_id": str(DEVICE_ID),
                "budget": {"epsilon": budget, "window_s": 300.0}, "resend_every_s": None,
                "fingerprint": Program(st["device"]).memo.fingerprint,
                "events": _replay(st, DOM, PARTITION_EVENTS, DEVICE_ID, seed, (budget, 300.0),
                                  None)}

    daily = [(MIDNIGHT + dt, labels) for dt, labels in DAILY_MEMO_EVENTS]
    return {"device": state["device"], "seed": "77", "budget": {"epsilon": 3.5, "window_s": 60.0},
            "resend_every_s": 50.0, "fingerprint": Program(state["device"]).memo.fingerprint,
            "events": _replay(state, dom, MEMO_EVENTS, 1, 77, (3.5, 60.0), 50.0),
            "partition": case(part, 78, 8.0), "partition_olh": case(olh, 80, 12.0),
            "cluster": case(clus, 79, 9.0), "select": case(smp, 81, 7.0),
            "numeric": _numeric_memo(), "partition_numeric": _partition_numeric_memo(),
            "daily": {"device": state["device"], "seed": "82", "max_epsilon_per_day": 3.0,
                      "budget": {"epsilon": 100.0, "window_s": 60.0}, "resend_every_s": None,
                      "fingerprint": Program(state["device"]).memo.fingerprint,
                      "events": _replay(state, dom, daily, 1, 82, (100.0, 60.0), None, 3.0)}}


def identity_vectors() -> dict[str, Any]:
    """Per-device identity (docs/security.md "Per-device identity"): device keys derived from
    fleet secrets, the credential the provisioning command prints, and authenticated batches
    (flag bit 2: fleet and HMAC-SHA256 under the device key)."""
    import numpy as np

    from ldpstream.credentials.device_keys import derive_device_key
    from ldpstream.producers.codec import encode_batch

    secrets = [bytes(range(32)), bytes.fromhex("a5" * 16), "é".encode() * 40]
    derive = [{"fleet_secret": sec.hex(), "fleet": fleet, "device_id": str(dev),
               "key": derive_device_key(sec, fleet, dev).hex()}
              for sec in secrets for fleet, dev in (("phones", 7), ("phones", 2**64 - 1),
                                                    ("flotte-é", 0), ("x" * 255, 12345))]
    batches = []
    for name, fleet, dev, seq, reports, sent_at in (
            ("one report", "phones", 7, 0, [[1, 0, 2]], 1714550400.25),
            ("u16 values, a large sequence", "phones", 2**64 - 1, 2**63, [[300, 1], [0, 65535]],
             1.5),
            ("a UTF-8 fleet", "flotte-é", 42, 9, [[0]] * 5, 0.0)):
        key = derive_device_key(secrets[0], fleet, dev)
        rows = np.asarray(reports)
        batches.append({"name": name, "collection": "app", "version": 3, "sent_at": sent_at,
                        "reports": reports, "device_id": str(dev), "sequence": str(seq),
                        "fleet": fleet, "key": key.hex(),
                        "hex": encode_batch("app", 3, rows, sent_at=sent_at,
                                            device_ids=np.full(len(rows), dev, np.uint64),
                                            key=(dev, seq), auth=(fleet, key)).hex()})
    cred = derive[0]
    return {"derive": derive,
            "credential": {"json": json.dumps({"device_id": int(cred["device_id"]),
                                               "fleet": cred["fleet"], "key": cred["key"]},
                                              sort_keys=True),
                           "fleet": cred["fleet"], "device_id": cred["device_id"],
                           "key": cred["key"]},
            "batches": batches}

def _desc(labels: list[list[str]], steps: list[dict[str, Any]], width: int = 1,
          attrs: list[str] | None = None) -> dict[str, Any]:
    return {"v": 1, "family": "limits", "attrs": attrs or [f"a{j}" for j in range(len(labels))],
            "labels": labels, "width": width, "steps": steps}


def limits_vectors() -> dict[str, Any]:
    """Descriptions at and beyond the limits of docs/device-protocol.md ("Limits"): every SDK
    refuses each ``unusable`` one naming (a prefix of) ``field``, and parses each ``accept`` one
    to ``epsilon`` within a second (the parse is linear in the description's size)."""
    four = [["0", "1", "2", "3"]]
    grr_table = {"oracle": "grr", "in": [0], "offset": 0, "p": 0.5}
    bloom_labels = [[f"v{i:03d}" for i in range(1000)]]
    bloom = {"op": "bloom", "in": [0], "out": 0, "bits": 1024, "f": 0.5,
             "filters": [sorted({(7 * i + 341 * k) % 1024 for k in range(3)})
                         for i in range(1000)]}
    refused = [
        ("partition table of 4^32 cells (wraps to 0 in 64 bits)", _desc(four, [
            {"op": "partition", "seed": "1", "out": [0],
             "tables": [dict(grr_table, **{"in": [0] * 32})]}]),
         "device.steps[0].tables[0].in"),
        ("keep step of 4^32 cells", _desc(four, [
            {"op": "keep", "in": [0] * 32, "out": 0, "p": 0.5, "fake": []}]),
         "device.steps[0].in"),
        ("grr step of 4^17 cells", _desc(four, [
            {"op": "grr", "in": [0] * 17, "out": [0] * 17, "p": 0.5}]), "device.steps[0].in"),
        ("olh table of 4^17 cells", _desc(four, [
            {"op": "partition", "seed": "1", "out": [0],
             "tables": [dict(grr_table, oracle="olh", g=2, r=32, **{"in": [0] * 17})]}]),
         "device.steps[0].tables[0].in"),
        ("1,025 labels in all", _desc([[f"x{i}" for i in range(513)],
                                       [f"y{i}" for i in range(512)]],
                                      [{"op": "uniform", "in": [0], "out": [0]}]),
         "device.labels[1]"),
        ("labels over 16 KiB", _desc([[f"{i:020d}" for i in range(800)]],
                                     [{"op": "uniform", "in": [0], "out": [0]}]),
         "device.labels[0]"),
        ("labels over 16 KiB in UTF-8, not in characters",
         _desc([[f"{i:03d}" + "é" * 10 for i in range(700)]],
               [{"op": "uniform", "in": [0], "out": [0]}]), "device.labels[0]"),
        ("attribute names over 16 KiB", _desc([["a", "b"], ["c", "d"]],
                                              [{"op": "uniform", "in": [0], "out": [0]}],
                                              attrs=["n" * 16384, "m"]), "device.attrs"),
        ("65 partition tables in all", _desc(four, [
            {"op": "partition", "seed": "1", "out": [0], "tables": [grr_table] * 33},
            {"op": "partition", "seed": "2", "out": [0], "tables": [grr_table] * 32}]),
         "device.steps[1].tables"),
        ("bloom over 5,000 values (refused by the label cap)",
         _desc([[f"{i}" for i in range(5000)]],
               [dict(bloom, bits=1, f=0.5, filters=[[] for _ in range(5000)])]),
         "device.labels[0]"),
    ]
    num = {"min": 0, "max": 10, "grid": 11}
    wave = {"op": "wave", "in": [0], "out": 0, "offset": 0, "cells": 8, "range": [-0.5, 1.5],
            "at": [1, -0.5], "width": 1.0, "p": 0.75, "round": False}
    refused += [
        ("numeric grid of 65,537 points", _desc([dict(num, grid=65537)], [wave]),
         "device.labels[0]"),
        ("numeric min not below max", _desc([dict(num, max=0)], [wave]), "device.labels[0]"),
        ("wave on a categorical attribute", _desc([["a", "b"]], [wave]), "device.steps[0].in"),
        ("wave window outside its range", _desc([num], [dict(wave, at=[1, 0])]),
         "device.steps[0].at"),
        ("wave of width 0 with p below 1", _desc([num], [dict(wave, width=0, p=0.5)]),
         "device.steps[0].width"),
        ("wave rounding to 1 cell", _desc([num], [dict(wave, cells=1, round=True)]),
         "device.steps[0].cells"),
        ("select weights not summing to 1", _desc([num], [
            {"op": "select", "out": None, "weights": [0.5, 0.6], "branches": [[wave], [wave]]}]),
         "device.steps[0].weights"),
        ("select weight 0", _desc([num], [
            {"op": "select", "out": None, "weights": [1.0, 0.0], "branches": [[wave], [wave]]}]),
         "device.steps[0].weights"),
    ]
    big = {"min": 0, "max": 1, "grid": 5000}
    memo_wave = {"rotation_s": None, "permanent": [wave]}
    refused += [
        ("α-point rounding of a categorical attribute", dict(
            _desc([["a", "b"]], []), memoize={"rotation_s": None, "permanent": [
                {"op": "grr", "in": [0], "out": [0], "p": 0.75}],
                "round": [{"points": [0, 1], "seed": "1"}]}), "device.memoize.round[0]"),
        ("α-point rounding points not ending on the grid's last index", dict(
            _desc([num], []), memoize=dict(memo_wave, round=[{"points": [0, 5], "seed": "1"}])),
         "device.memoize.round[0].points"),
        ("4,099 rounding points (beyond the matrix entries in all)", dict(
            _desc([big], []), memoize=dict(memo_wave, round=[
                {"points": list(range(4098)) + [4999], "seed": "1"}])),
         "device.memoize.round[0].points"),
    ]
    rnd = {"op": "round", "in": [0], "points": [0, 5, 10]}
    part = {"op": "partition", "seed": "1", "out": [0],
            "tables": [dict(grr_table, **{"in": [0, 1], "p": 0.4})]}
    refused += [
        ("round of a categorical attribute", _desc([["a", "b"]], [dict(rnd, points=[0, 1])]),
         "device.steps[0].in"),
        ("round points not ending on the grid's last index", _desc(
            [num], [dict(rnd, points=[0, 5])]), "device.steps[0].points"),
        ("round points not strictly increasing", _desc(
            [num], [dict(rnd, points=[0, 5, 5, 10])]), "device.steps[0].points"),
        ("65 round points", _desc([dict(num, grid=100)], [dict(rnd, points=list(range(64))
                                                                + [99])]),
         "device.steps[0].points"),
        ("an attribute rounded twice", _desc([num], [rnd, dict(rnd, points=[0, 2])]),
         "device.steps[1].in"),
        ("round after the partition step", _desc([num, ["a", "b"]], [part, rnd]),
         "device.steps[1].op"),
        ("round in a select's branch", _desc([num], [
            {"op": "select", "out": None, "branches": [[rnd]]}]),
         "device.steps[0].branches[0][0].op"),
        ("round in a memoized description", dict(_desc([num], [rnd]), memoize=memo_wave),
         "device.steps[0].op"),
        ("wave on a rounded attribute", _desc([num], [rnd, wave]), "device.steps[1].in"),
    ]
    accepted = [
        ("a round step, then a partition table over its 3 × 2 cells (ε ln(10/3))",
         _desc([num, ["a", "b"]], [rnd, part])),
        ("a wave (Square Wave, ε ln 3 on its window)", _desc([num], [wave])),
        ("a point rounded to two cells (Duchi's, ε ln 3)", _desc([num], [
            dict(wave, cells=2, round=True, range=[-2, 2], at=[2, -1], width=0, p=1.0)])),
        ("bloom, 1,000 values x 1,024 bits (4,001 entries)", _desc(bloom_labels, [bloom],
                                                                  width=1024)),
        ("bloom filter listing a position twice", _desc(
            [["a", "b"]], [dict(bloom, bits=3, filters=[[1, 1, 2], [2]])], width=3)),
    ]
    return {"max_parse_s": 1.0,
            "cases": [{"name": n, "device": d, "expect": "unusable", "field": f}
                      for n, d, f in refused]
            + [{"name": n, "device": d, "expect": "accept", "epsilon": Program(d).epsilon}
               for n, d in accepted]}


FILES = {"rng.json": rng_vectors, "randomize.json": randomize_vectors,
         "states.json": state_vectors, "ledger.json": ledger_vectors, "memo.json": memo_vectors,
         "identity.json": identity_vectors, "limits.json": limits_vectors}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a file would change")
    args = ap.parse_args(argv)
    stale = []
    for name, make in FILES.items():
        text = json.dumps(make(), indent=1, ensure_ascii=False) + "\n"
        path = HERE / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"stale conformance vectors: {', '.join(stale)} (run {Path(__file__).name})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
