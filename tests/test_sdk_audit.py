"""Statistical privacy audit of the C and TypeScript SDKs (docs/device-protocol.md, "Privacy
audit"): every grr/matrix channel of the conformance cases with at most 32 cells, and the
first slot of every partition table with at most 36 cells and 400 codes (GRR and OLH), is
sampled 10⁶ times with the SDK's production generator (getrandom / crypto.getRandomValues),
10⁶/k draws per true cell. The empirical channel must fit the declared one (χ² over all rows,
significance α = 10⁻⁴ per channel) and, where the rarest entry expects ≥ 100 draws, the ε
computed from it, max_y ln(max_x P̂[x,y] / min_x P̂[x,y]), must lie within 6σ of the declared ε,
σ = sqrt(1/c_lo + 1/c_hi) for the expected counts of the smallest and largest channel entries
(the delta-method s.d. of one log ratio; 6σ covers the max over columns)."""
from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest
from scipy.stats import chi2
from sdk_helpers import VECTORS, c_sdk, ts_sdk  # noqa: F401

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
    if step["op"] == "matrix":
        return np.asarray(step["rows"], dtype=float)
    p = step["p"]
    P = np.full((k, k), (1 - p) / (k - 1))
    np.fill_diagonal(P, p)
    return P


def _partition_channel(table: dict, sizes: list[int]) -> np.ndarray:
    """The channel of one partition table's slot: GRR over its cells, or OLH (rows: cells,
    columns: codes a·g + y)."""
    cells = math.prod(sizes[c] for c in table["in"])
    p = table["p"]
    if table["oracle"] == "grr":
        return _declared({"op": "grr", "in": table["in"], "p": p}, sizes)
    g, r = table["g"], table["r"]
    q = (1 - p) / (g - 1)
    digits = lambda v: [(v // g ** i) % g for i in range(r)]  # noqa: E731
    P = np.empty((cells, g ** (r + 1)))
    for c in range(cells):
        dc = digits(c)
        for a in range(g ** r):
            h = sum(x * y for x, y in zip(digits(a), dc)) % g
            P[c, a * g:(a + 1) * g] = q
            P[c, a * g + h] = p
    return P / g ** r


def _audit(lines: list[str]) -> list[str]:
    cases = {c["name"]: c for c in json.loads(VECTORS.read_text())["cases"]}
    problems = []
    assert lines, "the sampler printed nothing"
    for line in lines:
        got = json.loads(line)
        prog = cases[got["case"]]["device"]
        sizes = [len(lab) for lab in prog["labels"]]
        step = _flat_steps(prog["steps"])[got["step"]]
        P = (_partition_channel(step["tables"][got["table"]], sizes) if "table" in got
             else _declared(step, sizes))
        counts = np.asarray(got["counts"], dtype=float)
        n_row = counts.sum(axis=1, keepdims=True)
        assert n_row.sum() >= SAMPLES - len(P), got["case"]
        expected = n_row * P
        used = expected > 0
        assert np.all(counts[~used] == 0), f"{got['case']} step {got['step']}: impossible output"
        stat = float((((counts - expected) ** 2)[used] / expected[used]).sum())
        dof = int(used.sum() - len(P))
        pvalue = float(chi2.sf(stat, dof))
        Phat = counts / n_row
        eps_hat = float(np.max(np.log(Phat.max(axis=0) / Phat.min(axis=0))))
        eps = float(np.max(np.log(P.max(axis=0) / P.min(axis=0))))
        sigma = math.sqrt(1 / (n_row.min() * P.min()) + 1 / (n_row.min() * P.max()))
        where = f"{got['case']} step {got['step']} {got.get('table', '')}"
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


def test_bench_sdk_quick_runs(capsys):
    """``ldpstream bench sdk --quick --json``: every case measured in C, TypeScript and Python,
    the -Os library's size read. No timing is asserted."""
    from ldpstream.cli import main

    assert main(["bench", "sdk", "--quick", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cases = [c["name"] for c in json.loads(VECTORS.read_text())["cases"]]
    assert [r["case"] for r in out["reports_per_s"]] == cases
    assert all(r["c"] > 0 and r["ts"] > 0 and r["python"] > 0 for r in out["reports_per_s"])
    assert out["c_size"]["text"] > 0 and out["c_size"]["ldp_state"] > 0


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
