"""The device-side interpreter of the randomization description (docs/device-protocol.md); the
draws it makes are in :mod:`.draws`.

:class:`Program` parses and checks a description (a :class:`ProgramError` names the field),
computes its ε from the channels it applies, turns labels into indices and randomizes one
record per call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..estimators.device_program import PROGRAM_VERSION, memo_fingerprint, program_epsilon
from ..estimators.device_program import step_epsilon
from ..estimators.domain import SchemaError
from .draws import (M64, DrawSource, NumpyDraws, OsRandom, SplitMix64, bernoulli, categorical,
                    mix64, uniform)

__all__ = ["DrawSource", "SplitMix64", "OsRandom", "NumpyDraws", "uniform", "bernoulli",
           "categorical", "Program", "ProgramError", "Memo", "MAX_WIDTH", "MAX_ATTRS"]

#: limits every SDK enforces (the C library's static buffers)
MAX_ATTRS = 32
MAX_WIDTH = 64
MAX_CELLS = 1 << 32
MAX_MATRIX_ENTRIES = 4096
MAX_STEPS = 64


class ProgramError(ValueError):
    """A description the device cannot run; ``field`` names the offending part."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class _Step:
    op: str
    cols: tuple[int, ...]
    shape: tuple[int, ...]
    out: tuple[int, ...] | int | None
    p: float = 0.0
    cum: tuple[tuple[float, ...], ...] = ()
    branches: tuple[tuple["_Step", ...], ...] = ()
    #: partition: the mixed seed and the tables
    seed: int = 0
    tables: tuple["_Table", ...] = ()


@dataclass(frozen=True)
class _Table:
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


def _partition(d: dict, field: str, shape: Sequence[int], width: int) -> _Step:
    seed = d.get("seed")
    if not isinstance(seed, str) or not seed.isdigit() or int(seed) > M64:
        raise ProgramError(f"{field}.seed", "must be a u64 as a decimal string")
    out = _ints(d.get("out"), f"{field}.out", width)
    tabs = d.get("tables")
    if not isinstance(tabs, list) or not 1 <= len(tabs) <= MAX_STEPS:
        raise ProgramError(f"{field}.tables", f"must be a list of 1..{MAX_STEPS} tables")
    if len(out) > len(tabs):
        raise ProgramError(f"{field}.out", "more slots than tables")
    tables = []
    for i, t in enumerate(tabs):
        f = f"{field}.tables[{i}]"
        if not isinstance(t, dict) or t.get("oracle") not in ("grr", "olh"):
            raise ProgramError(f"{f}.oracle", "must be grr or olh")
        cols = _ints(t.get("in"), f"{f}.in", len(shape))
        sub = tuple(int(shape[c]) for c in cols)
        off = t.get("offset")
        if isinstance(off, bool) or not isinstance(off, int) or not 0 <= off < MAX_CELLS:
            raise ProgramError(f"{f}.offset", f"must be an integer in [0, {MAX_CELLS})")
        p = _number(t.get("p"), f"{f}.p", 0.0, 1.0)
        g = r = 0
        codes = math.prod(sub)
        if t["oracle"] == "olh":
            g, r = t.get("g"), t.get("r")
            if (isinstance(g, bool) or not isinstance(g, int) or isinstance(r, bool)
                    or not isinstance(r, int) or g < 2 or r < 1 or g ** r > MAX_CELLS
                    or g ** r < codes):
                raise ProgramError(f"{f}.g", "g ≥ 2 and r ≥ 1 with cells ≤ g^r ≤ 2^32")
            codes = g ** (r + 1)
        if off + codes > MAX_CELLS:
            raise ProgramError(f"{f}.offset", "codes beyond 2^32")
        tables.append(_Table(cols, sub, off, p, g, r))
    return _Step("partition", (), (), out, seed=mix64(int(seed)), tables=tuple(tables))


def _ints(v: Any, field: str, below: int) -> tuple[int, ...]:
    if not isinstance(v, list) or not v or not all(
            isinstance(c, int) and not isinstance(c, bool) and 0 <= c < below for c in v):
        raise ProgramError(field, f"must be a non-empty list of integers in [0, {below})")
    return tuple(v)


def _step(d: Any, field: str, shape: Sequence[int], width: int, depth: int,
          budget: list[int]) -> _Step:
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
        return _Step("select", (), (), out, branches=tuple(
            _steps(b, f"{field}.branches[{i}]", shape, width, depth + 1, budget)
            for i, b in enumerate(br)))
    if op == "partition" and depth == 0:
        return _partition(d, field, shape, width)
    if op == "const":
        v = d.get("value")
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < MAX_CELLS:
            raise ProgramError(f"{field}.value", f"must be an integer in [0, {MAX_CELLS})")
        return _Step("const", (), (), _ints([d.get("out")], f"{field}.out", width), p=float(v))
    if op == "copy":
        return _copy(d, field, width, budget)
    if op == "keep":
        return _keep(d, field, shape, width, budget)
    if op not in ("grr", "matrix", "uniform"):
        raise ProgramError(f"{field}.op", f"unknown op {op!r} (known: grr, matrix, uniform, "
                                          "copy, const, select, partition)")
    cols = _ints(d.get("in"), f"{field}.in", len(shape))
    out = _ints(d.get("out"), f"{field}.out", width)
    if len(out) != len(cols):
        raise ProgramError(f"{field}.out", "must have as many columns as in")
    sub = tuple(int(shape[c]) for c in cols)
    k = math.prod(sub)
    if k > MAX_CELLS:
        raise ProgramError(f"{field}.in", f"{k} cells > {MAX_CELLS}")
    if op == "uniform":
        return _Step("uniform", cols, sub, out)
    if op == "grr":
        p = d.get("p")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ProgramError(f"{field}.p", "must be a number in [0, 1]")
        return _Step("grr", cols, sub, out, p=float(p))
    cum = _cumulative(d.get("rows"), field, None, budget)
    if len(cum) != k:
        raise ProgramError(f"{field}.rows", f"must be {k}×{k} (at most {MAX_MATRIX_ENTRIES} "
                                            "matrix entries in all)")
    return _Step("matrix", cols, sub, out, cum=cum)


def _steps(v: Any, field: str, shape: Sequence[int], width: int, depth: int,
           budget: list[int]) -> tuple[_Step, ...]:
    """The steps of a list; ``budget``: matrix entries and steps still allowed (in all)."""
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_STEPS:
        raise ProgramError(field, f"must be a list of 1..{MAX_STEPS} steps")
    return tuple(_step(s, f"{field}[{i}]", shape, width, depth, budget)
                 for i, s in enumerate(v))


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


def _keep(d: dict, field: str, shape: Sequence[int], width: int, budget: list[int]) -> _Step:
    cols = _ints(d.get("in"), f"{field}.in", len(shape))
    out = _ints([d.get("out")], f"{field}.out", width)
    sub = tuple(int(shape[c]) for c in cols)
    p = _number(d.get("p"), f"{field}.p", 0.0, 1.0)
    fake = d.get("fake")
    if not isinstance(fake, list) or len(fake) != math.prod(sub):
        raise ProgramError(f"{field}.fake", f"must hold {math.prod(sub)} probabilities")
    return _Step("keep", cols, sub, out, p=p,
                 cum=_cumulative([fake], f"{field}.fake", 1, budget))


def _copy(d: dict, field: str, width: int, budget: list[int]) -> _Step:
    src = _ints([d.get("from")], f"{field}.from", width)
    out = _ints([d.get("out")], f"{field}.out", width)
    rows = d.get("rows")
    return _Step("copy", src, (), out, cum=_cumulative(
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


@dataclass(frozen=True)
class Memo:
    """The memoized part of a description: the permanent step of every attribute, its ε, the
    rotation period and the fingerprint memoized responses are kept under."""

    rotation_s: float | None
    permanent: tuple[_Step, ...]
    epsilons: tuple[float, ...]
    fingerprint: str

    def period(self, now: float) -> int:
        """``floor(now / rotation_s)``; 0 when responses never rotate."""
        return 0 if self.rotation_s is None else int(math.floor(now / self.rotation_s))

    def draw(self, j: int, value: int, rng: DrawSource) -> int:
        """A new permanent response of attribute ``j`` with true ``value``."""
        report = [0] * (j + 1)
        _run(self.permanent[j], {j: value}, rng, report)
        return report[j]


def _memo(d: Any, shape: Sequence[int], width: int, budget: list[int]) -> Memo:
    if not isinstance(d, dict):
        raise ProgramError("device.memoize", "must be an object")
    rot = d.get("rotation_s")
    if rot is not None and (isinstance(rot, bool) or not isinstance(rot, (int, float))
                            or not math.isfinite(rot) or rot <= 0):
        raise ProgramError("device.memoize.rotation_s", "must be a number > 0 or null")
    perm = _steps(d.get("permanent"), "device.memoize.permanent", shape, width, 1, budget)
    if width != len(shape) or len(perm) != len(shape) or any(
            s.cols != (j,) or s.out != (j,) for j, s in enumerate(perm)):
        raise ProgramError("device.memoize.permanent", "must hold one grr or matrix step per "
                                                       "attribute j, in and out [j], in order "
                                                       "(and width must be the attribute count)")
    raw = d["permanent"]
    return Memo(None if rot is None else float(rot), perm,
                tuple(step_epsilon(s, shape) for s in raw), memo_fingerprint(raw, shape))


class Program:
    """A checked randomization description (``state["device"]``)."""

    def __init__(self, d: Mapping[str, Any]) -> None:
        if not isinstance(d, Mapping):
            raise ProgramError("device", "must be an object")
        if d.get("v") != PROGRAM_VERSION:
            raise ProgramError("device.v", f"unsupported version {d.get('v')!r} (this SDK "
                                           f"runs {PROGRAM_VERSION})")
        self.family = str(d.get("family"))
        attrs, labels, width = d.get("attrs"), d.get("labels"), d.get("width")
        if (not isinstance(attrs, list) or not 1 <= len(attrs) <= MAX_ATTRS
                or not all(isinstance(a, str) for a in attrs)):
            raise ProgramError("device.attrs", f"must be 1..{MAX_ATTRS} attribute names")
        if (not isinstance(labels, list) or len(labels) != len(attrs) or not all(
                isinstance(lab, list) and len(lab) >= 2 and all(isinstance(s, str) for s in lab)
                for lab in labels)):
            raise ProgramError("device.labels", "must hold ≥ 2 string labels per attribute")
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= MAX_WIDTH:
            raise ProgramError("device.width", f"must be an integer in [1, {MAX_WIDTH}]")
        self.attrs: tuple[str, ...] = tuple(attrs)
        self.labels: tuple[tuple[str, ...], ...] = tuple(tuple(lab) for lab in labels)
        self.shape = tuple(len(lab) for lab in self.labels)
        self.width = width
        budget = [MAX_MATRIX_ENTRIES, MAX_STEPS]
        self.memo = None if d.get("memoize") is None else _memo(d["memoize"], self.shape, width,
                                                                budget)
        self.steps = () if self.memo is not None and d.get("steps") == [] else _steps(
            d.get("steps"), "device.steps", self.shape, width, 0, budget)
        self.epsilon = program_epsilon(d)
        self._index = [{lab: i for i, lab in enumerate(labs)} for labs in self.labels]

    def encode(self, record: Mapping[str, Any]) -> list[int]:
        """Labels → indices; a :class:`SchemaError` names a missing, unknown attribute or
        unknown category."""
        for a in record:
            if a not in self.attrs:
                raise SchemaError(f"unknown attribute {a!r} (known: {', '.join(self.attrs)})", a)
        out = []
        for a, index in zip(self.attrs, self._index):
            if a not in record:
                raise SchemaError(f"missing attribute {a!r}", a)
            i = index.get(str(record[a]))
            if i is None:
                raise SchemaError(f"attribute {a!r}: unknown category {record[a]!r} (allowed: "
                                  f"{', '.join(index)})", a)
            out.append(i)
        return out

    def randomize(self, x: Sequence[int], rng: DrawSource, device_id: int = 0) -> list[int]:
        """One report of the record of indices ``x`` (memoized: of the permanent responses
        ``x``) by the device ``device_id`` (``partition`` assigns by it)."""
        report = [0] * self.width
        for s in self.steps:
            if s.op == "partition":
                _partition_run(s, x, rng, report, device_id)
            else:
                _run(s, x, rng, report)
        return report


def _run(s: _Step, x: Sequence[int] | Mapping[int, int], rng: DrawSource,
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
    if s.op == "keep":
        assert isinstance(s.out, tuple)
        cell = _ravel(x, s.cols, s.shape)
        report[s.out[0]] = cell if bernoulli(rng, s.p) else categorical(rng, s.cum[0])
        return
    if s.op == "select":
        j = uniform(rng, len(s.branches))
        if isinstance(s.out, int):
            report[s.out] = j
        for t in s.branches[j]:
            _run(t, x, rng, report)
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


def _grr(cell: int, k: int, p: float, rng: DrawSource) -> int:
    """Keep ``cell`` with probability p, else one of the other k − 1 cells uniformly."""
    if bernoulli(rng, p):
        return cell
    other = uniform(rng, k - 1)
    return other + (other >= cell)


def _partition_run(s: _Step, x: Sequence[int], rng: DrawSource, report: list[int],
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
        if t.g == 0:
            code = _grr(cell, math.prod(t.shape), t.p, rng)
        else:
            a = uniform(rng, t.g ** t.r)
            h, aa, cc = 0, a, cell
            for _ in range(t.r):
                h += (aa % t.g) * (cc % t.g)
                aa, cc = aa // t.g, cc // t.g
            code = a * t.g + _grr(h % t.g, t.g, t.p, rng)
        report[col] = t.offset + code
