"""The steps of a randomization description on the device: their checked form, parsing (a
:class:`ProgramError` names the field) and how each is run (docs/device-protocol.md,
"Randomization description"); :mod:`.program` assembles them."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ldpstream.estimators.kernels.device_program import (
    MAX_ATTRS,
    MAX_CELLS,
    MAX_GRID,
    MAX_MATRIX_ENTRIES,
    MAX_ROUND_POINTS,
    MAX_STEPS,
    MAX_TABLES,
    MAX_WIDTH,
    round_index,
    wave_epsilon,
)
from ldpstream.producers.draws import M64, TWO53, DrawSource, bernoulli, categorical, mix64, uniform

#: 2⁻⁵³: a word's top 53 bits as a fraction in [0, 1)
_UNIT = 1.0 / TWO53

__all__ = ["Step", "ProgramError", "parse_steps", "run_step", "run_partition", "run_round",
           "olh_code",
           "grr_cell", "ravel", "unravel", "MAX_ATTRS", "MAX_GRID", "quantize_value",
           "MAX_WIDTH", "MAX_CELLS", "MAX_MATRIX_ENTRIES", "MAX_STEPS", "MAX_TABLES", "new_budget"]



class ProgramError(ValueError):
    """A description the device cannot run; ``field`` names the offending part."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class Step:
    op: str
    cols: tuple[int, ...]
    shape: tuple[int, ...]
    out: tuple[int, ...] | int | None
    p: float = 0.0
    cum: tuple[tuple[float, ...], ...] = ()
    branches: tuple[tuple["Step", ...], ...] = ()
    #: partition: the mixed seed and the tables
    seed: int = 0
    tables: tuple["Table", ...] = ()
    #: select: cumulative branch weights (empty: uniform)
    weights: tuple[float, ...] = ()
    #: wave: (lo, hi, at0, at1, width), the first cell, the cells, rounded (else bucketed)
    wave: tuple[float, ...] = ()
    offset: int = 0
    cells: int = 0
    rounded: bool = False
    #: round: the points (grid indices) attribute ``cols[0]`` is rounded to
    points: tuple[int, ...] = ()


@dataclass(frozen=True)
class Table:
    """One table of a ``partition`` step: its cell's oracle (GRR over the cells, or OLH)."""

    cols: tuple[int, ...]
    shape: tuple[int, ...]
    offset: int
    p: float
    g: int = 0
    r: int = 0


def _number(v: Any, field: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise ProgramError(field, f"must be a number in [{lo:g}, {hi:g}]")
    return float(v)


def new_budget() -> list[int]:
    """What a description may still use, in all: matrix entries, steps, partition tables."""
    return [MAX_MATRIX_ENTRIES, MAX_STEPS, MAX_TABLES]


def _cells(sub: Sequence[int], field: str) -> int:
    k = math.prod(sub)
    if k > MAX_CELLS:
        raise ProgramError(field, f"{k} cells > {MAX_CELLS}")
    return k


def _partition(d: dict, field: str, shape: Sequence[int], width: int,
               budget: list[int]) -> Step:
    seed = d.get("seed")
    if not isinstance(seed, str) or not seed.isdigit() or int(seed) > M64:
        raise ProgramError(f"{field}.seed", "must be a u64 as a decimal string")
    out = _ints(d.get("out"), f"{field}.out", width)
    tabs = d.get("tables")
    budget[2] -= len(tabs) if isinstance(tabs, list) else 0
    if not isinstance(tabs, list) or not tabs or budget[2] < 0:
        raise ProgramError(f"{field}.tables", f"must be a list of 1..{MAX_TABLES} tables (in "
                                              "all)")
    if len(out) > len(tabs):
        raise ProgramError(f"{field}.out", "more slots than tables")
    tables = []
    for i, t in enumerate(tabs):
        f = f"{field}.tables[{i}]"
        if not isinstance(t, dict) or t.get("oracle") not in ("grr", "olh"):
            raise ProgramError(f"{f}.oracle", "must be grr or olh")
        cols = _ints(t.get("in"), f"{f}.in", len(shape))
        sub = tuple(int(shape[c]) for c in cols)
        _cells(sub, f"{f}.in")
        off = t.get("offset")
        if isinstance(off, bool) or not isinstance(off, int) or not 0 <= off < MAX_CELLS:
            raise ProgramError(f"{f}.offset", f"must be an integer in [0, {MAX_CELLS})")
        p = _number(t.get("p"), f"{f}.p", 0.0, 1.0)
        g = r = 0
        codes = math.prod(sub)
        if t["oracle"] == "olh":
            gv, rv = t.get("g"), t.get("r")
            if (isinstance(gv, bool) or not isinstance(gv, int) or isinstance(rv, bool)
                    or not isinstance(rv, int) or gv < 2 or rv < 1 or gv ** rv > MAX_CELLS
                    or gv ** rv < codes):
                raise ProgramError(f"{f}.g", "g ≥ 2 and r ≥ 1 with cells ≤ g^r ≤ 2^32")
            g, r = gv, rv
            codes = g ** (r + 1)
        if off + codes > MAX_CELLS:
            raise ProgramError(f"{f}.offset", "codes beyond 2^32")
        tables.append(Table(cols, sub, off, p, g, r))
    return Step("partition", (), (), out, seed=mix64(int(seed)), tables=tuple(tables))


def _ints(v: Any, field: str, below: int) -> tuple[int, ...]:
    if not isinstance(v, list) or not v or not all(
            isinstance(c, int) and not isinstance(c, bool) and 0 <= c < below for c in v):
        raise ProgramError(field, f"must be a non-empty list of integers in [0, {below})")
    return tuple(v)


def _step(d: Any, field: str, shape: Sequence[int], width: int, depth: int,
          budget: list[int], numeric: Sequence[bool]) -> Step:
    if not isinstance(d, dict):
        raise ProgramError(field, "must be an object")
    budget[1] -= 1
    if budget[1] < 0:
        raise ProgramError(field, f"more than {MAX_STEPS} steps in all")
    op = d.get("op")
    if op == "select":
        out = d.get("out")
        if out is not None and (isinstance(out, bool) or not isinstance(out, int)
                                or not 0 <= out < width):
            raise ProgramError(f"{field}.out", f"must be null or an integer in [0, {width})")
        br = d.get("branches")
        if depth > 0 or not isinstance(br, list) or not 1 <= len(br) <= MAX_STEPS:
            raise ProgramError(f"{field}.branches", "must be 1..64 lists of steps (not nested)")
        weights = _weights(d.get("weights"), len(br), f"{field}.weights", budget)
        return Step("select", (), (), out, branches=tuple(
            parse_steps(b, f"{field}.branches[{i}]", shape, width, depth + 1, budget, numeric)
            for i, b in enumerate(br)), weights=weights)
    if op == "partition" and depth == 0:
        return _partition(d, field, shape, width, budget)
    if op == "const":
        v = d.get("value")
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < MAX_CELLS:
            raise ProgramError(f"{field}.value", f"must be an integer in [0, {MAX_CELLS})")
        return Step("const", (), (), _ints([d.get("out")], f"{field}.out", width), p=float(v))
    if op == "copy":
        return _copy(d, field, width, budget)
    if op == "keep":
        return _keep(d, field, shape, width, budget)
    if op == "bloom":
        return _bloom(d, field, shape, width, budget)
    if op == "wave":
        return _wave(d, field, shape, width, numeric, budget)
    if op not in ("grr", "matrix", "uniform"):
        raise ProgramError(f"{field}.op", f"unknown op {op!r} (known: grr, matrix, uniform, "
                                          "copy, const, keep, bloom, wave, round, select, "
                                          "partition)")
    cols = _ints(d.get("in"), f"{field}.in", len(shape))
    out = _ints(d.get("out"), f"{field}.out", width)
    if len(out) != len(cols):
        raise ProgramError(f"{field}.out", "must have as many columns as in")
    sub = tuple(int(shape[c]) for c in cols)
    k = _cells(sub, f"{field}.in")
    if op == "uniform":
        return Step("uniform", cols, sub, out)
    if op == "grr":
        p = d.get("p")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ProgramError(f"{field}.p", "must be a number in [0, 1]")
        return Step("grr", cols, sub, out, p=float(p))
    cum = _cumulative(d.get("rows"), field, None, budget)
    if len(cum) != k:
        raise ProgramError(f"{field}.rows", f"must be {k}×{k} (at most {MAX_MATRIX_ENTRIES} "
                                            "matrix entries in all)")
    return Step("matrix", cols, sub, out, cum=cum)


def parse_steps(v: Any, field: str, shape: Sequence[int], width: int, depth: int,
                budget: list[int], numeric: Sequence[bool] = (),
                rounds: bool = False) -> tuple[Step, ...]:
    """The steps of a list; ``budget``: matrix entries, steps and tables still allowed (in
    all, :func:`new_budget`); ``numeric[j]``: attribute j is numeric (``wave`` reads it);
    ``rounds``: the list may start with ``round`` steps (the top level of a description
    without ``memoize``, or the permanent steps of a ``kind: partition`` memo), after which
    their attributes have their points' count of cells."""
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_STEPS:
        raise ProgramError(field, f"must be a list of 1..{MAX_STEPS} steps")
    sizes, num = list(shape), list(numeric)
    out: list[Step] = []
    for i, s in enumerate(v):
        f = f"{field}[{i}]"
        if isinstance(s, dict) and s.get("op") == "round":
            if not rounds or depth > 0 or any(t.op != "round" for t in out):
                raise ProgramError(f"{f}.op", "round steps come first, at the top level of a "
                                              "description without memoize or of a "
                                              "partition memo's permanent steps")
            out.append(_round(s, f, sizes, num, budget))
            continue
        out.append(_step(s, f, sizes, width, depth, budget, num))
    return tuple(out)


def _round(d: dict, field: str, sizes: list[int], numeric: list[bool],
           budget: list[int]) -> Step:
    """A ``round`` step (docs/device-protocol.md): attribute ``in`` numeric and not rounded
    yet, ``points`` 2..MAX_ROUND_POINTS grid indices strictly increasing from 0 to the grid's
    last (each a matrix entry); the attribute then has ``len(points)`` cells (``sizes``) and is
    no longer read as a grid (``numeric``)."""
    budget[1] -= 1
    if budget[1] < 0:
        raise ProgramError(field, f"more than {MAX_STEPS} steps in all")
    col = d.get("in")
    if (not isinstance(col, list) or len(col) != 1 or isinstance(col[0], bool)
            or not isinstance(col[0], int) or not 0 <= col[0] < len(sizes)
            or not (col[0] < len(numeric) and numeric[col[0]])):
        raise ProgramError(f"{field}.in", "must be [j], j a numeric attribute not rounded yet")
    j, grid, pts = col[0], sizes[col[0]], d.get("points")
    ok = (isinstance(pts, list) and 2 <= len(pts) <= MAX_ROUND_POINTS
          and all(isinstance(k, int) and not isinstance(k, bool) for k in pts)
          and pts[0] == 0 and pts[-1] == grid - 1
          and all(a < b for a, b in zip(pts, pts[1:])))
    if ok and isinstance(pts, list):
        budget[0] -= len(pts)
    if not ok or not isinstance(pts, list) or budget[0] < 0:
        raise ProgramError(f"{field}.points", f"must be 2..{MAX_ROUND_POINTS} grid indices "
                                              f"strictly increasing from 0 to {grid - 1} "
                                              f"(each counts against the {MAX_MATRIX_ENTRIES} "
                                              "matrix entries in all)")
    sizes[j], numeric[j] = len(pts), False
    return Step("round", (j,), (grid,), None, points=tuple(pts))


def run_round(s: Step, x: list[int], rng: DrawSource) -> None:
    """x[j] → the index of the point it rounds to: u from one word, always (``round_index``:
    the point above when the fraction of the way there exceeds u)."""
    u = float(rng.next_u64() >> 11) * _UNIT
    j = s.cols[0]
    x[j] = int(round_index(np.array([x[j]]), np.asarray(s.points), np.array([u]))[0])


def _weights(v: Any, n: int, field: str, budget: list[int]) -> tuple[float, ...]:
    """A select's branch weights (None: uniform): n numbers > 0 summing to 1 within 1e-9, as
    their left-to-right cumulative sums (drawn with ``categorical``; one matrix entry each)."""
    if v is None:
        return ()
    if (not isinstance(v, list) or len(v) != n or budget[0] - n < 0 or not all(
            isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0 for w in v)):
        raise ProgramError(field, f"must be null or {n} numbers > 0 (one per branch)")
    budget[0] -= n
    acc, cum = 0.0, []
    for w in v:
        acc += float(w)
        cum.append(acc)
    if abs(acc - 1.0) > 1e-9:
        raise ProgramError(field, f"sums to {acc!r}, not 1")
    return tuple(cum)


def _finite(v: Any, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ProgramError(field, "must be a finite number")
    return float(v)


def _wave(d: dict, field: str, shape: Sequence[int], width: int,
          numeric: Sequence[bool], budget: list[int]) -> Step:
    """A ``wave`` step (docs/device-protocol.md): ``wave`` = (lo, hi, at0, at1, width), which
    count as 5 matrix entries."""
    col = d.get("in")
    if (not isinstance(col, list) or len(col) != 1 or isinstance(col[0], bool)
            or not isinstance(col[0], int) or not 0 <= col[0] < len(shape)
            or not (col[0] < len(numeric) and numeric[col[0]])):
        raise ProgramError(f"{field}.in", "must be [j], j a numeric attribute")
    out = _ints([d.get("out")], f"{field}.out", width)
    rounded = d.get("round")
    if not isinstance(rounded, bool):
        raise ProgramError(f"{field}.round", "must be true or false")
    cells, off = d.get("cells"), d.get("offset")
    if (isinstance(cells, bool) or not isinstance(cells, int)
            or not (2 if rounded else 1) <= cells <= MAX_CELLS):
        raise ProgramError(f"{field}.cells", f"must be an integer in [{2 if rounded else 1}, "
                                             f"{MAX_CELLS}]")
    if (isinstance(off, bool) or not isinstance(off, int) or off < 0
            or off + cells > MAX_CELLS):
        raise ProgramError(f"{field}.offset", f"must be an integer ≥ 0 with offset + cells ≤ "
                                              f"{MAX_CELLS}")
    rng_, at = d.get("range"), d.get("at")
    if not isinstance(rng_, list) or len(rng_) != 2:
        raise ProgramError(f"{field}.range", "must be [lo, hi], finite, lo < hi")
    lo, hi = _finite(rng_[0], f"{field}.range"), _finite(rng_[1], f"{field}.range")
    if not lo < hi:
        raise ProgramError(f"{field}.range", "must be [lo, hi], finite, lo < hi")
    if not isinstance(at, list) or len(at) != 2:
        raise ProgramError(f"{field}.at", "must be [a, b], finite")
    a, b = _finite(at[0], f"{field}.at"), _finite(at[1], f"{field}.at")
    w = _finite(d.get("width"), f"{field}.width")
    p = _number(d.get("p"), f"{field}.p", 0.0, 1.0)
    if w < 0 or (w == 0 and p != 1.0):
        raise ProgramError(f"{field}.width", "must be ≥ 0 (0: a point, with p 1)")
    tol = 1e-9 * (hi - lo)
    for z in (0.0, 1.0):
        left = a * z + b
        if not (left >= lo - tol and left + w <= hi + tol):
            raise ProgramError(f"{field}.at", f"the window at z = {z:g} must lie inside the "
                                              "range")
    budget[0] -= 5
    if budget[0] < 0:
        raise ProgramError(f"{field}.range", "beyond the matrix entries in all (a wave holds 5)")
    return Step("wave", (col[0],), (int(shape[col[0]]),), out, p=p,
                wave=(lo, hi, a, b, w), offset=off, cells=cells, rounded=rounded)


def wave_step_epsilon(s: Step) -> float:
    """ε of a parsed ``wave`` step (:func:`~.device_program.wave_epsilon`)."""
    lo, hi, a, b, w = s.wave
    return wave_epsilon(lo, hi, (a, b), w, s.p, s.cells, s.rounded)


def _round_half_even(v: float) -> int:
    """The nearest integer, ties to the even one (as numpy's rint)."""
    f = math.floor(v)
    d = v - f
    return int(f + 1 if d > 0.5 or (d == 0.5 and f % 2 == 1) else f)


def quantize_value(v: float, lo: float, hi: float, grid: int) -> tuple[int, bool]:
    """A numeric value → (its grid index, whether it was clipped): clipped into [lo, hi],
    z = (v − lo)/(hi − lo), the index rint(z·(grid − 1)) (ties to even), as
    :func:`~.numeric.quantize`; the same operations in every SDK."""
    clipped = v < lo or v > hi
    c = lo if v < lo else hi if v > hi else v
    return _round_half_even((c - lo) / (hi - lo) * (grid - 1)), clipped


def _cumulative(rows: Any, field: str, n_rows: int | None, budget: list[int]
                ) -> tuple[tuple[float, ...], ...]:
    """Cumulative sums of a row-stochastic matrix (``n_rows`` rows of any one length when
    given, else square), charged to the matrix-entry budget."""
    ok = isinstance(rows, list) and len(rows) >= 1 and all(isinstance(r, list) for r in rows)
    k = len(rows[0]) if ok and rows[0] else 0
    ok = ok and k >= 1 and all(len(r) == k for r in rows) and (
        len(rows) == (n_rows if n_rows is not None else k))
    budget[0] -= len(rows) * k if ok else 0
    if not ok or budget[0] < 0:
        shape = f"{n_rows}×L" if n_rows is not None else "K×K"
        raise ProgramError(f"{field}.rows", f"must be {shape} (at most {MAX_MATRIX_ENTRIES} "
                                            "matrix entries in all)")
    cum = []
    for i, r in enumerate(rows):
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0
                   for x in r):
            raise ProgramError(f"{field}.rows[{i}]", "must hold non-negative numbers")
        acc, c = 0.0, []
        for x in r:
            acc += float(x)
            c.append(acc)
        if abs(acc - 1.0) > 1e-9:
            raise ProgramError(f"{field}.rows[{i}]", f"sums to {acc!r}, not 1")
        cum.append(tuple(c))
    return tuple(cum)


def _keep(d: dict, field: str, shape: Sequence[int], width: int, budget: list[int]) -> Step:
    cols = _ints(d.get("in"), f"{field}.in", len(shape))
    out = _ints([d.get("out")], f"{field}.out", width)
    sub = tuple(int(shape[c]) for c in cols)
    k = _cells(sub, f"{field}.in")
    p = _number(d.get("p"), f"{field}.p", 0.0, 1.0)
    fake = d.get("fake")
    if not isinstance(fake, list) or len(fake) != k:
        raise ProgramError(f"{field}.fake", f"must hold {k} probabilities")
    return Step("keep", cols, sub, out, p=p,
                 cum=_cumulative([fake], f"{field}.fake", 1, budget))


def _bloom(d: dict, field: str, shape: Sequence[int], width: int, budget: list[int]) -> Step:
    """A Bloom step: ``cols`` = (attribute,), ``out`` = (first column, bits), ``p`` = f,
    ``branches`` unused; the filters as sorted bit positions per value in ``cum``."""
    cols = _ints(d.get("in"), f"{field}.in", len(shape))
    bits, start = d.get("bits"), d.get("out")
    if (isinstance(bits, bool) or not isinstance(bits, int) or isinstance(start, bool)
            or not isinstance(start, int) or bits < 1 or start < 0 or start + bits > width):
        raise ProgramError(f"{field}.bits", f"out and bits must place the filter inside the "
                                            f"{width} report columns")
    f = _number(d.get("f"), f"{field}.f", 0.0, 1.0)
    filters = d.get("filters")
    ok = (len(cols) == 1 and isinstance(filters, list) and len(filters) == shape[cols[0]]
          and all(isinstance(v, list) and all(isinstance(b, int) and not isinstance(b, bool)
                                              and 0 <= b < bits for b in v) for v in filters))
    if ok and isinstance(filters, list):
        budget[0] -= len(filters) + 1 + sum(len(v) for v in filters)
    if not ok or not isinstance(filters, list) or budget[0] < 0:
        raise ProgramError(f"{field}.filters", f"must list, per value of one attribute, bit "
                                               f"positions below {bits} (values + 1 + "
                                               f"positions count against the "
                                               f"{MAX_MATRIX_ENTRIES} matrix entries in all)")
    return Step("bloom", cols, (shape[cols[0]],), (start, bits), p=f,
                 cum=tuple(tuple(float(b) for b in v) for v in filters))


def _copy(d: dict, field: str, width: int, budget: list[int]) -> Step:
    src = _ints([d.get("from")], f"{field}.from", width)
    out = _ints([d.get("out")], f"{field}.out", width)
    rows = d.get("rows")
    return Step("copy", src, (), out, cum=_cumulative(
        rows, field, len(rows) if isinstance(rows, list) else 0, budget))


def _ravel(x: Sequence[int] | Mapping[int, int], cols: Sequence[int],
           shape: Sequence[int]) -> int:
    cell = 0
    for c, d in zip(cols, shape):
        cell = cell * d + int(x[c])
    return cell


def _unravel(cell: int, out: Sequence[int], shape: Sequence[int], report: list[int]) -> None:
    for c, d in zip(reversed(out), reversed(shape)):
        report[c] = cell % d
        cell //= d



def run_step(s: Step, x: Sequence[int] | Mapping[int, int], rng: DrawSource,
         report: list[int]) -> None:
    if s.op == "const":
        assert isinstance(s.out, tuple)
        report[s.out[0]] = int(s.p)
        return
    if s.op == "copy":
        assert isinstance(s.out, tuple)
        row = min(report[s.cols[0]], len(s.cum) - 1)
        report[s.out[0]] = categorical(rng, s.cum[row])
        return
    if s.op == "bloom":
        assert isinstance(s.out, tuple)
        start, bits = s.out
        for b in range(bits):
            report[start + b] = 0
        for pos in s.cum[_ravel(x, s.cols, s.shape)]:
            report[start + int(pos)] = 1
        for b in range(bits):
            draw = float(rng.next_u64() >> 11)
            if draw < s.p * 0.5 * TWO53:
                report[start + b] = 1
            elif draw < s.p * TWO53:
                report[start + b] = 0
        return
    if s.op == "keep":
        assert isinstance(s.out, tuple)
        cell = _ravel(x, s.cols, s.shape)
        report[s.out[0]] = cell if bernoulli(rng, s.p) else categorical(rng, s.cum[0])
        return
    if s.op == "wave":
        assert isinstance(s.out, tuple)
        report[s.out[0]] = s.offset + _wave_cell(s, int(x[s.cols[0]]), rng)
        return
    if s.op == "select":
        j = categorical(rng, s.weights) if s.weights else uniform(rng, len(s.branches))
        if isinstance(s.out, int):
            report[s.out] = j
        for t in s.branches[j]:
            run_step(t, x, rng, report)
        return
    assert isinstance(s.out, tuple)
    cell = _ravel(x, s.cols, s.shape)
    if s.op == "grr":
        cell = _grr(cell, math.prod(s.shape), s.p, rng)
    elif s.op == "uniform":
        cell = uniform(rng, math.prod(s.shape))
    else:
        cell = categorical(rng, s.cum[cell])
    _unravel(cell, s.out, s.shape, report)


def _wave_cell(s: Step, i: int, rng: DrawSource) -> int:
    """A ``wave`` step's cell (no offset) for grid index i: z = i/(G − 1), l = at0·z + at1;
    ``inner = bernoulli(p)``, then u = (w >> 11)·2⁻⁵³ of one word: y = l + u·width inside,
    else the point s = u·(left + right) of the rest ([lo, l) then (l + width, hi]); bucket
    ``floor((y − lo)/(hi − lo)·cells)``, or round: k = floor of pos = (y − lo)/(hi − lo)·
    (cells − 1), k + bernoulli(pos − k); clamped to the cells."""
    lo, hi, a, b, w = s.wave
    z = i / (s.shape[0] - 1)
    left_edge = a * z + b
    inner = bernoulli(rng, s.p)
    u = float(rng.next_u64() >> 11) * _UNIT
    if inner:
        y = left_edge + u * w
    else:
        left = max(left_edge - lo, 0.0)
        right = max(hi - (left_edge + w), 0.0)
        t = u * (left + right)
        y = lo + t if t < left else (left_edge + w) + (t - left)
    if s.rounded:
        pos = (y - lo) / (hi - lo) * (s.cells - 1)
        k = min(max(math.floor(pos), 0), s.cells - 2)
        return k + bernoulli(rng, pos - k)
    return min(max(math.floor((y - lo) / (hi - lo) * s.cells), 0), s.cells - 1)


def _grr(cell: int, k: int, p: float, rng: DrawSource) -> int:
    """Keep ``cell`` with probability p, else one of the other k − 1 cells uniformly."""
    if bernoulli(rng, p):
        return cell
    other = uniform(rng, k - 1)
    return other + (other >= cell)


def run_partition(s: Step, x: Sequence[int], rng: DrawSource, report: list[int],
                   device_id: int) -> None:
    """Slot i reports table (first + i) mod K, first = mix64(device id ^ mix64(seed)) mod K;
    GRR: the cell; OLH: a = uniform(g^r), h = Σ digit_i(a)·digit_i(cell) mod g (base-g digits),
    code a·g + GRR_g(h)."""
    assert isinstance(s.out, tuple)
    k = len(s.tables)
    first = mix64((int(device_id) & M64) ^ s.seed) % k
    for i, col in enumerate(s.out):
        t = s.tables[(first + i) % k]
        cell = _ravel(x, t.cols, t.shape)
        code = _grr(cell, math.prod(t.shape), t.p, rng) if t.g == 0 else olh_code(t, cell, rng)
        report[col] = t.offset + code


def olh_code(t: Table, cell: int, rng: DrawSource) -> int:
    """An OLH table's code of ``cell`` (no offset): a = uniform(g^r), h = Σ digit_i(a)·
    digit_i(cell) mod g (base-g digits), code a·g + GRR_g(h)."""
    a = uniform(rng, t.g ** t.r)
    h, aa, cc = 0, a, cell
    for _ in range(t.r):
        h += (aa % t.g) * (cc % t.g)
        aa, cc = aa // t.g, cc // t.g
    return a * t.g + _grr(h % t.g, t.g, t.p, rng)


#: the names the memoized part of a description (:mod:`.program_memo`) shares
grr_cell, ravel, unravel = _grr, _ravel, _unravel
