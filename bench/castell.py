"""``ldpstream bench castell``: speed of the Castell estimator [Castell Table II].

Part 1 — castell (w mode products) vs ``reduced`` (P₁⁻¹⊗…⊗P_w⁻¹ formed, one mat-vec) vs ``naive``
(solve of the full |Ω|×|Ω| Kronecker system) for d = 3, w = 2…8 (``--quick``: w = 2…5), GRR
channels with ε = 1 per attribute, seeded multinomial counts. Each time is the best of a few
repeats; a baseline is skipped (``null``) when its |Ω|² matrix would exceed 2 GB or when the
previous w's time, grown by its complexity (|Ω|³ for naive, |Ω|² for reduced), predicts more
than ``BUDGET_S`` seconds. ``max_abs_diff`` is max |castell − naive| (null when naive skipped).

Part 2 — castell on a large tensor (d = 10, w = 7: 10⁷ cells; ``--quick``: d = 10, w = 5) against a
memory-bound reference measured in the same run on the same machine: w passes of
``np.add(T, 0, out=buf)`` over a float64 tensor of the same size (the least any w-pass method must
move). ``ratio = castell_s / reference_s``.

Extra study, not part of ``ldpstream bench castell`` (minutes, not seconds): IBU convergence on
every 2…6-way marginal of the bundled Adult, ε = 4 and ε = 4/8 per attribute::

    .venv/bin/python -m ldpstream.bench.castell ibu-adult --seed 0 [--plain] [--max-w 6]
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable

import numpy as np

from ldpstream.estimators.kernels.castell import castell, castell_naive, castell_reduced
from ldpstream.estimators.kernels.channels import grr

D = 3
EPS = 1.0
SEED = 0
MAX_MATRIX_BYTES = 2 * 1024 ** 3
BUDGET_S = 30.0


def _best(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _repeats(expected_s: float | None) -> int:
    if expected_s is None or expected_s < 0.05:
        return 5
    return 3 if expected_s < 1.0 else 1


def compare(ways: range, rng: np.random.Generator) -> list[dict[str, Any]]:
    rows = []
    prev_naive = prev_reduced = None  # (cells, seconds)
    for w in ways:
        cells = D ** w
        shape = (D,) * w
        counts = rng.multinomial(100 * cells, np.full(cells, 1.0 / cells)).reshape(shape)
        chans = [grr(EPS, D)] * w
        castell_s, est = _best(lambda: castell(counts, chans), 7)
        fits = cells * cells * 8 <= MAX_MATRIX_BYTES
        row: dict[str, Any] = {"w": w, "cells": cells, "castell_s": castell_s, "reduced_s": None,
                               "naive_s": None, "max_abs_diff": None}
        guess = None if prev_reduced is None else prev_reduced[1] * (cells / prev_reduced[0]) ** 2
        if fits and (guess is None or guess < BUDGET_S):
            row["reduced_s"], _ = _best(lambda: castell_reduced(counts, chans), _repeats(guess))
            prev_reduced = (cells, row["reduced_s"])
        guess = None if prev_naive is None else prev_naive[1] * (cells / prev_naive[0]) ** 3
        if fits and (guess is None or guess < BUDGET_S):
            row["naive_s"], naive = _best(lambda: castell_naive(counts, chans), _repeats(guess))
            prev_naive = (cells, row["naive_s"])
            row["max_abs_diff"] = float(np.abs(est - naive).max())
        rows.append(row)
    return rows


def large(d: int, w: int, rng: np.random.Generator) -> dict[str, Any]:
    shape = (d,) * w
    counts = rng.integers(0, 8, size=shape, dtype=np.int64)
    chans = [grr(EPS, d)] * w
    castell_s, _ = _best(lambda: castell(counts, chans), 3)
    T = rng.random(shape)
    buf = np.empty_like(T)

    def reference() -> None:
        for _ in range(w):
            np.add(T, 0.0, out=buf)

    reference_s, _ = _best(reference, 3)
    return {"d": d, "w": w, "cells": int(T.size), "castell_s": castell_s,
            "reference_s": reference_s, "ratio": castell_s / reference_s,
            "reference": f"{w} × np.add(T, 0, out=buf) over {T.size:,} float64 cells"}


def run(quick: bool = False) -> dict[str, Any]:
    rng = np.random.default_rng(SEED)
    rows = compare(range(2, 6) if quick else range(2, 9), rng)
    big = large(10, 5 if quick else 7, rng)
    return {"rows": rows, "large": big}


def _fmt(x: float | None, unit: str = "s") -> str:
    if x is None:
        return "skipped"
    if unit == "s":
        return f"{x * 1e3:.3f} ms" if x < 1 else f"{x:.2f} s"
    return f"{x:.1e}"


def _print(doc: dict[str, Any]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a dependency
        Console = None
    header = ["w", "cells", "castell", "reduced", "naive", "naive/castell", "max |diff|"]
    body = []
    for r in doc["rows"]:
        speed = (f"{r['naive_s'] / r['castell_s']:.0f}×" if r["naive_s"] is not None else "—")
        body.append([str(r["w"]), f"{r['cells']:,}", _fmt(r["castell_s"]), _fmt(r["reduced_s"]),
                     _fmt(r["naive_s"]), speed, _fmt(r["max_abs_diff"], "e")])
    g = doc["large"]
    tail = (f"large: d={g['d']}, w={g['w']} ({g['cells']:,} cells): castell {_fmt(g['castell_s'])}, "
            f"reference {_fmt(g['reference_s'])} ({g['reference']}), "
            f"ratio castell/reference = {g['ratio']:.2f}")
    if Console is not None:
        table = Table(title=f"castell vs reduced vs naive (d={D}, GRR ε={EPS})")
        for h in header:
            table.add_column(h, justify="right")
        for row in body:
            table.add_row(*row)
        con = Console()
        con.print(table)
        con.print(tail)
    else:
        print("\t".join(header))
        for row in body:
            print("\t".join(row))
        print(tail)


def ibu_adult(seed: int = 0, epsilons: tuple[float, ...] = (4.0, 0.5), max_w: int = 6,
              accelerate: bool = True) -> list[dict[str, Any]]:
    """IBU (default options) on every w-way marginal of Adult, w = 2…max_w; one seeded GRR
    randomization of all 8 attributes per ε (ε per attribute)."""
    import itertools

    from ldpstream.datasets import load_csv
    from ldpstream.estimators.kernels.channels import randomize
    from ldpstream.estimators.kernels.ibu import ibu
    from ldpstream.estimators.mechanism import histogram

    ds = load_csv()
    m = len(ds.domain)
    rows = []
    for eps in epsilons:
        rng = np.random.default_rng(seed)
        chans = [grr(eps, d) for d in ds.domain.shape]
        y = np.stack([randomize(ds.records[:, i], chans[i], rng) for i in range(m)], axis=1)
        for w in range(2, max_w + 1):
            runs = []
            for attrs in itertools.combinations(range(m), w):
                shape = tuple(ds.domain.shape[i] for i in attrs)
                counts = histogram(y, attrs, shape)
                t0 = time.perf_counter()
                r = ibu(counts, [chans[i] for i in attrs], accelerate=accelerate)
                dt = time.perf_counter() - t0
                mono = bool(np.all(np.diff(r.loglik) >= -1e-12 * np.abs(r.loglik[:-1])))
                runs.append((r.converged, r.iterations, dt, mono, int(np.prod(shape))))
            rows.append({"epsilon": eps, "w": w, "runs": len(runs),
                         "converged": sum(x[0] for x in runs),
                         "mean_iterations": float(np.mean([x[1] for x in runs])),
                         "max_iterations": max(x[1] for x in runs),
                         "mean_s": float(np.mean([x[2] for x in runs])),
                         "max_s": max(x[2] for x in runs),
                         "monotone": all(x[3] for x in runs),
                         "max_cells": max(x[4] for x in runs)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(args: Any) -> int:
    doc = run(quick=bool(getattr(args, "quick", False)))
    if getattr(args, "json", False):
        print(json.dumps(doc))
    else:
        _print(doc)
    return 0


if __name__ == "__main__":  # the IBU study (see module docstring)
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ldpstream.bench.castell")
    ap.add_argument("study", choices=("ibu-adult",))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-w", type=int, default=6)
    ap.add_argument("--plain", action="store_true", help="plain EM (no SQUAREM)")
    a = ap.parse_args()
    ibu_adult(seed=a.seed, max_w=a.max_w, accelerate=not a.plain)
