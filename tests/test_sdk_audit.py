"""Statistical privacy audit of the C and TypeScript SDKs (docs/device-protocol.md, "Privacy
audit"): every grr/matrix channel of the conformance cases with at most 32 cells, every keep
channel with at most 32 cells (wherever it sits, a select's branches too), and the first slot of
every partition table with at most 36 cells and 400 codes (GRR and OLH), is sampled 10⁶ times
with the SDK's production generator (getrandom / crypto.getRandomValues), 10⁶/k draws per true
cell; a table holding a numeric attribute from every grid index of it (10⁶/rows draws per row),
against the description's ``round`` channel then the oracle (``record_table_channel``). A keep
step's declared channel is P[x, y] = p·[x = y] + (1−p)·fake[y]. Every bloom step
is sampled 10⁶ times too (10⁶/values draws per value), its 1s counted per (value, bit): each
bit is a binary channel, P(1 | set) = 1 − f/2, P(1 | unset) = f/2, one row per (value, bit).
The empirical channel must fit the declared one (χ² over all rows, significance α = 10⁻⁴ per
step) and, where the rarest entry expects ≥ 100 draws, the ε computed from it,
max_y ln(max_x P̂[x,y] / min_x P̂[x,y]), must lie within 6σ of the declared ε,
σ = sqrt(1/c_lo + 1/c_hi) for the expected counts of the smallest and largest channel entries
(the delta-method s.d. of one log ratio; 6σ covers the max over columns). For bloom that is the
per-bit ε, ln((1 − f/2)/(f/2)); the step's ε in the docs, the per-bit ε × the largest Hamming
distance between two values' filters, follows from it only because the bits are drawn
independently, which this audit does not test (it counts each bit's marginal). Every wave step
(numeric attributes) on at most 65 grid points is sampled 10⁶ times (10⁶/G draws per grid
point) against the channel its parameters define (estimators/kernels/device_program.py
``wave_channel``), with the same χ² and ε tests."""
from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest
from scipy.stats import chi2
from sdk_helpers import VECTORS, c_sdk, ts_sdk  # noqa: F401

from ldpstream.estimators.kernels.device_program import (
    attribute_size,
    record_table_channel,
    table_channel,
    wave_channel,
)

pytestmark = [pytest.mark.core, pytest.mark.slow]

SAMPLES = 1_000_000
ALPHA = 1e-4
#: the ε check needs this many expected draws in the rarest entry (OLH's codes get fewer)
MIN_COUNT = 100


def _flat_steps(steps: list[dict]) -> list[dict]:
    """Steps in the order the SDKs index them: a select step, then its branches' steps."""
    out = []
    for s in steps:
        out.append(s)
        if s["op"] == "select":
            out.extend(t for b in s["branches"] for t in b)
    return out


def _declared(step: dict, sizes: list[int]) -> np.ndarray:
    k = math.prod(sizes[c] for c in step["in"])
    if step["op"] == "wave":  # grid points × cells, from the step's parameters
        return wave_channel(step, sizes[step["in"][0]])
    if step["op"] == "matrix":
        return np.asarray(step["rows"], dtype=float)
    if step["op"] == "keep":  # the cell with p, else a fake cell: P[x, y] = p·[x = y] + (1−p)·fake[y]
        p = step["p"]
        return p * np.eye(k) + (1 - p) * np.asarray(step["fake"], dtype=float)[None, :]
    if step["op"] == "bloom":
        return _bloom_channel(step)
    assert step["op"] == "grr", step["op"]
    p = step["p"]
    P = np.full((k, k), (1 - p) / (k - 1))
    np.fill_diagonal(P, p)
    return P


def _bloom_channel(step: dict) -> np.ndarray:
    """The per-bit channels of a bloom step, one row per (value, bit) (value-major), columns
    (0, 1): a set bit reads 1 with 1 − f/2, an unset one with f/2."""
    f, bits = step["f"], step["bits"]
    one = np.full((len(step["filters"]), bits), f / 2)
    for v, positions in enumerate(step["filters"]):
        one[v, positions] = 1 - f / 2
    one = one.reshape(-1)
    return np.stack([1 - one, one], axis=1)


def _audit(lines: list[str]) -> list[str]:
    cases = {c["name"]: c for c in json.loads(VECTORS.read_text())["cases"]}
    problems = []
    assert lines, "the sampler printed nothing"
    for line in lines:
        got = json.loads(line)
        prog = cases[got["case"]]["device"]
        sizes = [attribute_size(lab) for lab in prog["labels"]]
        step = _flat_steps(prog["steps"])[got["step"]]
        P = (record_table_channel(prog, step["tables"][got["table"]]) if "table" in got
             else _declared(step, sizes))
        if "ones" in got:  # bloom: rows (value, bit), columns (0s, 1s) over the value's draws
            assert step["op"] == "bloom", got
            draws = np.asarray(got["draws"], dtype=float)
            ones = np.asarray(got["ones"], dtype=float)
            assert ones.shape == (len(step["filters"]), step["bits"]), got["case"]
            assert draws.sum() >= SAMPLES - len(draws), got["case"]
            ones = ones.reshape(-1)
            n_bit = np.repeat(draws, step["bits"])
            counts = np.stack([n_bit - ones, ones], axis=1)
        else:
            counts = np.asarray(got["counts"], dtype=float)
            assert counts.sum() >= SAMPLES - len(P), got["case"]
        problems += check_channel(f"{got['case']} step {got['step']} {got.get('table', '')}",
                                  counts, P)
    return problems


def check_channel(where: str, counts: np.ndarray, P: np.ndarray) -> list[str]:
    """χ² of the sampled ``counts`` (rows: true cells) against the declared channel ``P``
    (significance ALPHA) and the empirical ε within 6σ of the declared one (where the rarest
    entry expects ≥ MIN_COUNT draws); the problems found."""
    problems = []
    n_row = counts.sum(axis=1, keepdims=True)
    expected = n_row * P
    used = expected > 0
    assert np.all(counts[~used] == 0), f"{where}: impossible output"
    stat = float((((counts - expected) ** 2)[used] / expected[used]).sum())
    dof = int(used.sum() - len(P))
    pvalue = float(chi2.sf(stat, dof))
    Phat = counts / n_row
    with np.errstate(divide="ignore"):   # an output never drawn: ε̂ = ∞, judged only when rare
        eps_hat = float(np.max(np.log(Phat.max(axis=0) / Phat.min(axis=0))))
    eps = float(np.max(np.log(P.max(axis=0) / P.min(axis=0))))
    sigma = math.sqrt(1 / (n_row.min() * P.min()) + 1 / (n_row.min() * P.max()))
    if pvalue < ALPHA:
        problems.append(f"{where}: χ² = {stat:.1f} on {dof} dof, p = {pvalue:.2g}")
    if n_row.min() * P.min() >= MIN_COUNT and abs(eps_hat - eps) > 6 * sigma:
        problems.append(f"{where}: empirical ε {eps_hat:.4f} vs declared {eps:.4f} "
                        f"(6σ = {6 * sigma:.4f})")
    return problems


def test_c_sdk_channels_match_their_declaration(c_sdk):  # noqa: F811
    out = subprocess.run([str(c_sdk / "ldp_sample"), "audit", str(VECTORS), str(SAMPLES)],
                         check=True, capture_output=True, text=True).stdout
    assert _audit(out.splitlines()) == []


def test_ts_sdk_channels_match_their_declaration(ts_sdk):  # noqa: F811
    out = subprocess.run(["node", str(ts_sdk / "tools" / "sample.js"), "audit", str(VECTORS),
                          str(SAMPLES)], check=True, capture_output=True, text=True).stdout
    assert _audit(out.splitlines()) == []


def test_the_audit_catches_a_wrong_channel():
    """The audit fails a sampler whose keep probability is off by 1 %."""
    prog = json.loads(VECTORS.read_text())["cases"][0]["device"]
    p = prog["steps"][0]["p"]
    rng = np.random.default_rng(5)
    k = len(prog["labels"][0])
    wrong = np.full((k, k), (1 - (p + 0.01)) / (k - 1))
    np.fill_diagonal(wrong, p + 0.01)
    counts = np.stack([rng.multinomial(SAMPLES // k, row) for row in wrong])
    line = json.dumps({"case": "rr-ind", "step": 0, "counts": counts.tolist()})
    assert _audit([line]) != []


def test_the_audit_catches_a_wrong_bloom_f():
    """The audit fails a bloom sampler whose f is 0.01 below the declared one, and passes one
    drawn with the declared f (the lopub case's first step, 10⁶ draws)."""
    case = next(c for c in json.loads(VECTORS.read_text())["cases"] if c["name"] == "lopub")
    si, step = next((i, s) for i, s in enumerate(_flat_steps(case["device"]["steps"]))
                    if s["op"] == "bloom")
    rng = np.random.default_rng(7)
    values = len(step["filters"])
    per = SAMPLES // values

    def line(f: float) -> str:
        P1 = _bloom_channel({**step, "f": f})[:, 1].reshape(values, step["bits"])
        return json.dumps({"case": "lopub", "step": si, "draws": [per] * values,
                           "ones": rng.binomial(per, P1).tolist()})

    assert _audit([line(step["f"])]) == []
    assert _audit([line(step["f"] - 0.01)]) != []


def test_the_audit_catches_a_wrong_wave():
    """The audit fails a Square Wave sampler whose in-window probability is 2 % low and
    passes one drawn from the declared channel (the sw-hm case's wave on temp, 33 grid points,
    32 buckets, 10⁶ draws)."""
    case = next(c for c in json.loads(VECTORS.read_text())["cases"] if c["name"] == "sw-hm")
    si, step = next((i, s) for i, s in enumerate(_flat_steps(case["device"]["steps"]))
                    if s["op"] == "wave" and not s["round"] and s["in"] == [2])
    G = case["device"]["labels"][2]["grid"]
    rng = np.random.default_rng(8)

    def line(p: float) -> str:
        P = wave_channel({**step, "p": p}, G)
        return json.dumps({"case": "sw-hm", "step": si, "counts": np.stack(
            [rng.multinomial(SAMPLES // G, row) for row in P]).tolist()})

    assert _audit([line(step["p"])]) == []
    assert _audit([line(step["p"] * 0.98)]) != []


def test_the_audit_catches_a_partition_slot_that_skips_the_rounding():
    """The audit passes the partitioned-num case's table drawn from the description's channel
    (rounding, then GRR; 10⁶ draws over its 303 rows: fw × battery's 101 grid indices) and
    fails one whose sampler rounds to the nearest point instead of without bias."""
    case = next(c for c in json.loads(VECTORS.read_text())["cases"]
                if c["name"] == "partitioned-num")
    prog = case["device"]
    table = prog["steps"][1]["tables"][0]
    P = record_table_channel(prog, table)
    pts = np.asarray(prog["steps"][0]["points"])
    nearest = np.zeros((101, len(pts)))
    nearest[np.arange(101), np.abs(np.arange(101)[:, None] - pts).argmin(axis=1)] = 1.0
    Q = np.kron(np.eye(3), nearest) @ table_channel(table, [3, 2, len(pts)])
    rng = np.random.default_rng(13)

    def line(M: np.ndarray) -> str:
        counts = np.stack([rng.multinomial(SAMPLES // len(M), row) for row in M])
        return json.dumps({"case": "partitioned-num", "step": 1, "table": 0,
                           "counts": counts.tolist()})

    assert _audit([line(P)]) == []
    assert _audit([line(Q)]) != []


def test_bench_sdk_quick_runs(capsys):
    """``ldpstream bench sdk --quick --json``: every case measured in C, TypeScript and Python,
    the typical ones (rr-ind, partitioned) in the C firmware profile too, the -Os library's
    size read per profile; the firmware profile keeps at most 16 KiB of RAM per device, the
    scratch state included (docs/device-protocol.md, "Firmware profile"). No timing is
    asserted."""
    from ldpstream.cli import main

    assert main(["bench", "sdk", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cases = [c["name"] for c in json.loads(VECTORS.read_text())["cases"]]
    assert [r["case"] for r in out["reports_per_s"]] == cases
    assert all(r["c"] > 0 and r["ts"] > 0 and r["python"] > 0 for r in out["reports_per_s"])
    rows = {r["case"]: r for r in out["reports_per_s"]}
    assert all(rows[c]["c_firmware"] > 0 for c in ("rr-ind", "partitioned-olh", "partitioned-2"))
    sizes = out["c_size"]
    assert set(sizes) == {"default", "firmware", "firmware-m32"}
    assert all(z["text"] > 0 and z["ldp_state"] > 0 for z in sizes.values())
    assert sizes["firmware"]["ram"] <= 16384 and sizes["firmware-m32"]["ram"] <= 16384
    assert sizes["default"]["ram"] > 16384  # the protocol's limits do not fit


def test_python_sdk_channels_match_their_declaration():
    """The Python interpreter with its production generator (``secrets``), on the rr-ind and
    user-matrix cases' channels (10⁶ draws each; Python is the slow SDK)."""
    from ldpstream.producers.draws import OsRandom
    from ldpstream.producers.program import Program
    from ldpstream.producers.program_steps import run_step

    cases = {c["name"]: c for c in json.loads(VECTORS.read_text())["cases"]}
    rng, lines = OsRandom(), []
    for name in ("rr-ind", "rr-ind-matrix"):
        prog = Program(cases[name]["device"])
        for i, step in enumerate(prog.steps):
            (j,), k = step.cols, step.shape[0]
            counts = np.zeros((k, k), dtype=np.int64)
            report = [0] * prog.width
            for x in range(k):
                record = [0] * len(prog.shape)
                record[j] = x
                for _ in range(SAMPLES // k):
                    run_step(step, record, rng, report)
                    counts[x, report[j]] += 1
            lines.append(json.dumps({"case": name, "step": i, "counts": counts.tolist()}))
    assert _audit(lines) == []
