"""The randomization description a device interprets (docs/device-protocol.md, "Randomization
description"): a small, versioned, language-neutral JSON value published inside the signed
mechanism state (key ``device``), so a device SDK needs one generic interpreter instead of a copy
of every mechanism family.

A description lists the attributes with their category labels (a numeric attribute:
``{min, max, grid}``, its value clipped into the range and put on the grid), the report width
and *steps* applied in order to a record of category (or grid) indices:

* ``grr``: the cell of the attributes ``in`` (mixed radix, first attribute most significant) is
  kept with probability ``p``, else replaced by one of the other cells uniformly; the result is
  written, in the same mixed radix, to the report columns ``out``.
* ``matrix``: the cell goes through the row-stochastic matrix ``rows`` (inverse-CDF sampling).
* ``select``: an index j uniform in ``[0, len(branches))`` (or drawn by ``weights``, one
  probability > 0 per branch) is written to column ``out`` (unless ``out`` is null), then the
  steps of branch j run.
* ``uniform``: a uniform cell of the attributes ``in``, whatever the record (fake data).
* ``keep``: the cell of ``in`` kept with probability ``p``, else a fake cell from ``fake``; the
  flat cell is written to column ``out``.
* ``bloom``: the set bits ``filters[x]`` of attribute ``in``'s Bloom filter in the ``bits``
  columns from ``out``, every bit then kept with 1 − f, else set to 1 or 0 with f/2 each.
* ``copy``: column ``out`` drawn from row ``report[from]`` of ``rows`` (post-processing of a
  value already reported); ``const``: column ``out`` set to ``value``.

* ``wave`` (numeric attributes, docs/numeric.md): the grid position z ∈ [0, 1] of attribute
  ``in``'s value opens the window [l, l + ``width``], l = ``at[0]``·z + ``at[1]``, inside
  ``range``; the output is uniform in the window with probability ``p``, else uniform on the
  rest of the range, then bucketed into ``cells`` equal cells (or, ``round``, rounded without
  bias to a ``cells``-point grid), plus ``offset``, in column ``out``: Square Wave, the
  Piecewise mechanism and (a window of width 0) Duchi et al.'s are each one ``wave``; a
  ``select`` with ``weights`` picks the task of a report (:func:`numeric_steps`).

* ``round`` (numeric attributes inside ``partitioned``'s marginals, docs/numeric.md): attribute
  ``in``'s grid index is rounded without bias to one of the grid indices ``points`` (a fresh
  uniform u per report, :func:`round_index`) and replaced by that point's index, so the
  attribute has ``len(points)`` cells for every later step; leading top-level steps only (or
  leading a ``kind: partition`` memo's permanent steps), costs nothing (pre-processing of the
  record: every point is a grid value).

* ``partition``: the device's id picks the first of the ``tables`` (a fixed assignment); each
  report column ``out[s]`` carries table (first + s) mod K through its oracle (GRR, or OLH with
  its hash), offset by the table's ``offset``; ε: ``len(out)`` × the dearest oracle.

A memoized description adds ``memoize``: ``rotation_s`` and one ``permanent`` step per
attribute (``kind: cluster``: per cluster of attributes), whose response is drawn once per
rotation period and kept; ``steps`` then apply to the permanent responses on every report
[RAPPOR §3]. A numeric attribute's permanent step is its ``wave`` (or the weighted ``select``
over its waves: the task is part of the permanent response), and ``round`` α-point rounds its
value first [Ding et al., NeurIPS 2017, §3]: ``points`` on its grid and the ``seed`` of the
device's α (:func:`round_spec`, :func:`device_alpha`), so a memo is keyed by the rounded
value. ``kind: partition`` memoizes one ``partition`` step instead: the first table fixed per
(device, period), the code of each (table, cell) kept, ``instantaneous_p`` re-randomizing its
value per report (producers/program_memo.py); with numeric attributes ``round`` α-point rounds
them as above and a ``round`` step per rounded attribute (the same points) leads the
``partition`` step, mapping the rounded value, a point, to its index (no uniform needed: a
point rounds to itself).

ε of a description is computed from the channels it applies (:func:`program_epsilon`), never
read from a declared field: steps compose sequentially (sum), ``select`` costs its dearest
branch (the index is independent of the record).
"""
from __future__ import annotations

import hashlib
import math
import struct
from typing import Any, Mapping, Sequence

import numpy as np

from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.domain import Domain

__all__ = ["PROGRAM_VERSION", "MAX_GRID", "grr_step", "round_spec", "alpha_seed", "device_alpha",
           "alpha_round", "device_rounded", "round_index", "round_step", "round_channel", "MAX_ROUND_POINTS",
           "step_shapes", "table_channel", "record_table_channel", "mix64", "wave_step", "wave_epsilon", "wave_channel",
           "numeric_attribute",
           "attribute_size", "matrix_step", "select_step", "uniform_step",
           "copy_step", "const_step", "keep_step", "bloom_step", "program", "program_epsilon",
           "memo_fingerprint", "is_grr", "MAX_ATTRS", "MAX_WIDTH", "MAX_CELLS",
           "MAX_MATRIX_ENTRIES", "MAX_STEPS", "MAX_TABLES", "MAX_LABELS", "MAX_LABEL_BYTES",
           "bloom_hamming"]

#: limits every SDK enforces (docs/device-protocol.md, "Limits": the C library's static
#: buffers, sdk/c/include/ldp_limits.h, and sdk/ts/src/steps.ts hold the same values;
#: producers/program.py and producers/program_steps.py check a description against them)
MAX_ATTRS = 32
MAX_WIDTH = 1024
MAX_CELLS = 1 << 32
MAX_MATRIX_ENTRIES = 4096
MAX_STEPS = 64
#: partition tables in all
MAX_TABLES = 64
#: category labels in all
MAX_LABELS = 1024
#: UTF-8 bytes of the attribute names and labels, one more per string
MAX_LABEL_BYTES = 16384
#: points of a numeric attribute's input grid (``labels[j] = {min, max, grid}``)
MAX_GRID = 65536

#: points of a ``round`` step (a numeric attribute inside a partitioned marginal)
MAX_ROUND_POINTS = 64

#: the version ``v`` of the description format
PROGRAM_VERSION = 1


def grr_step(cols: Sequence[int], p: float, out: Sequence[int] | None = None) -> dict[str, Any]:
    """GRR over the product of the attributes ``cols`` with keep probability ``p``."""
    return {"op": "grr", "in": [int(c) for c in cols],
            "out": [int(c) for c in (cols if out is None else out)], "p": float(p)}


def matrix_step(cols: Sequence[int], P: np.ndarray,
                out: Sequence[int] | None = None) -> dict[str, Any]:
    """The channel ``P`` (rows: true cells, columns: reported cells) over the attributes
    ``cols``."""
    return {"op": "matrix", "in": [int(c) for c in cols],
            "out": [int(c) for c in (cols if out is None else out)],
            "rows": np.asarray(P, dtype=float).tolist()}


def select_step(out: int | None, branches: Sequence[Sequence[Mapping[str, Any]]],
                weights: Sequence[float] | None = None) -> dict[str, Any]:
    """Draw a branch index (uniform, or by ``weights``: probabilities > 0 summing to 1),
    report it in column ``out`` (None: not reported), then run that branch."""
    out_: dict[str, Any] = {"op": "select", "out": None if out is None else int(out),
                            "branches": [list(b) for b in branches]}
    if weights is not None:
        out_["weights"] = [float(w) for w in weights]
    return out_


def numeric_attribute(lo: float, hi: float, grid: int) -> dict[str, Any]:
    """``labels[j]`` of a numeric attribute: its range and the points of its input grid (a
    value is clipped into the range and put on the nearest point; docs/numeric.md)."""
    return {"min": float(lo), "max": float(hi), "grid": int(grid)}


def attribute_size(labels: Any) -> int:
    """Cells of an attribute: its labels, or a numeric attribute's grid points."""
    return int(labels["grid"]) if isinstance(labels, Mapping) else len(labels)


def wave_step(col: int, out: int, offset: int, cells: int, lo: float, hi: float,
              at: tuple[float, float], width: float, p: float, rounded: bool) -> dict[str, Any]:
    """A numeric attribute ``col``'s value through a window mechanism (module docstring)."""
    return {"op": "wave", "in": [int(col)], "out": int(out), "offset": int(offset),
            "cells": int(cells), "range": [float(lo), float(hi)],
            "at": [float(at[0]), float(at[1])], "width": float(width), "p": float(p),
            "round": bool(rounded)}


def wave_epsilon(lo: float, hi: float, at: Sequence[float], width: float, p: float,
                 cells: int, rounded: bool) -> float:
    """ε of a ``wave`` step: with a window, ln of the ratio of the output densities inside
    (p / width) and outside ((1 − p) / (range − width)), the bucketing or rounding being
    post-processing; a point (width 0) rounded to two cells: ln of the largest ratio of a cell's
    probability between the ends z = 0 and z = 1; anything else ∞. The same operations in every
    SDK."""
    if width > 0.0:
        rest = (hi - lo) - width
        if not 0.0 < p < 1.0 or rest <= 0.0:
            return math.inf
        return abs(math.log((p / width) / ((1.0 - p) / rest)))
    if not rounded or cells != 2:
        return math.inf
    y0, y1 = at[1], at[0] + at[1]
    if y1 < y0:
        y0, y1 = y1, y0
    if y0 <= lo or y1 >= hi:
        return math.inf
    return math.log(max((y1 - lo) / (y0 - lo), (hi - y0) / (hi - y1)))


#: the domain separation of an attribute's α seed (:func:`alpha_seed`)
ALPHA_DOMAIN = b"ldpstream/alpha-point/v1\n"
_M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """The SplitMix64 finalizer (no increment), on a u64: the hash the partition assignment and
    α use in every SDK."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def alpha_seed(attr: str) -> int:
    """The seed of attribute ``attr``'s α: BLAKE2b-64 of :data:`ALPHA_DOMAIN` ‖ its UTF-8 name,
    read as a little-endian u64 — a function of the name alone, so a device's α for the
    attribute is the same in every state version (docs/device-protocol.md, "Numeric
    memoization")."""
    h = hashlib.blake2b(ALPHA_DOMAIN + attr.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "little")


def device_alpha(device_ids: np.ndarray, seed: int) -> np.ndarray:
    """Each device's α ∈ [0, 1) under ``seed``: (mix64(id XOR mix64(seed)) >> 11)·2⁻⁵³, the
    same operations in every SDK (fixed for ever; uniform over a fleet)."""
    z = np.asarray(device_ids, dtype=np.uint64) ^ np.uint64(mix64(int(seed) & _M64))
    with np.errstate(over="ignore"):   # the finalizer, modulo 2⁶⁴
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(2 ** 53)


def alpha_round(x: np.ndarray, pts: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """α-point rounding [Ding et al., NeurIPS 2017, §3]: grid index x to the rounding point
    below it (the last point ≤ x, at most the second last), or to the next one when its
    fraction of the way there, (x − a)/(b − a) in doubles, exceeds α. A rounding point stays
    itself; with α uniform the rounding is unbiased."""
    x = np.asarray(x, dtype=np.int64)
    k = np.clip(np.searchsorted(pts, x, side="right") - 1, 0, len(pts) - 2)
    frac = (x - pts[k]) / (pts[k + 1] - pts[k])
    return np.where(frac > np.asarray(alpha), pts[k + 1], pts[k])


def device_rounded(records: np.ndarray, points: Mapping[int, np.ndarray],
                   attrs: Sequence[str], device_ids: np.ndarray) -> np.ndarray:
    """Grid indices ``(n, m)`` with each column j of ``points`` α-point rounded to them with
    each device's α for attribute ``attrs[j]`` (:func:`alpha_seed`): what a memoizing device
    keys its memos by [Ding et al., NeurIPS 2017, §3]; a copy."""
    out = np.array(records, dtype=np.int64)
    ids = np.asarray(device_ids, dtype=np.uint64)
    for j, pts in points.items():
        out[:, j] = alpha_round(out[:, j], pts, device_alpha(ids, alpha_seed(attrs[j])))
    return out


def round_index(x: np.ndarray, pts: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The index (into ``pts``) of the point grid indices ``x`` round to without bias with the
    uniforms ``u``: :func:`alpha_round` with a fresh α per value (the ``round`` step)."""
    return np.searchsorted(pts, alpha_round(x, pts, u))


def round_channel(points: Sequence[int], grid: int) -> np.ndarray:
    """R (grid × points): Pr(point index | grid index) of the ``round`` step, from its points
    alone: the hat weights of the two points around each grid index (a point: a unit row)."""
    pts = np.asarray(points, dtype=np.int64)
    x = np.arange(grid)
    k = np.clip(np.searchsorted(pts, x, side="right") - 1, 0, len(pts) - 2)
    frac = (x - pts[k]) / (pts[k + 1] - pts[k])
    R = np.zeros((grid, len(pts)))
    R[x, k] = 1.0 - frac
    R[x, k + 1] += frac
    return R


def round_step(col: int, points: Sequence[int]) -> dict[str, Any]:
    """Attribute ``col``'s grid index rounded without bias to ``points`` (grid indices from 0
    to the last, increasing), replaced by the point's index."""
    return {"op": "round", "in": [int(col)], "points": [int(p) for p in points]}


def round_spec(points: Sequence[int], seed: int) -> dict[str, Any]:
    """``memoize.round[j]`` of a numeric attribute: its rounding points (grid indices, from 0
    to the last, increasing) and its α seed as a decimal string."""
    return {"points": [int(p) for p in points], "seed": str(int(seed))}


def uniform_step(cols: Sequence[int]) -> dict[str, Any]:
    """A uniform cell of the attributes ``cols``, whatever the record (fake data)."""
    return {"op": "uniform", "in": [int(c) for c in cols], "out": [int(c) for c in cols]}


def is_grr(P: np.ndarray) -> bool:
    """True when ``P`` has one diagonal value and one off-diagonal value (bit-exact)."""
    P = np.asarray(P, dtype=float)
    off = ~np.eye(len(P), dtype=bool)
    return bool(np.all(np.diag(P) == P[0, 0]) and np.all(P[off] == P[0, 1]))


def channel_step(cols: Sequence[int], P: np.ndarray,
                 out: Sequence[int] | None = None) -> dict[str, Any]:
    """``grr`` when ``P`` is exactly GRR-shaped, else ``matrix``."""
    return grr_step(cols, float(P[0, 0]), out) if is_grr(P) else matrix_step(cols, P, out)


def copy_step(source: int, out: int, M: np.ndarray) -> dict[str, Any]:
    """Column ``out`` drawn from row ``report[source]`` of ``M`` (post-processing of a reported
    value: costs nothing)."""
    return {"op": "copy", "from": int(source), "out": int(out),
            "rows": np.asarray(M, dtype=float).tolist()}


def keep_step(cols: Sequence[int], out: int, p: float, fake: np.ndarray) -> dict[str, Any]:
    """The cell of ``cols`` kept with probability ``p``, else a fake cell drawn from ``fake``
    (a distribution over the cells); the flat cell goes to column ``out``."""
    return {"op": "keep", "in": [int(c) for c in cols], "out": int(out), "p": float(p),
            "fake": np.asarray(fake, dtype=float).ravel().tolist()}


def bloom_step(col: int, start: int, B: np.ndarray, f: float) -> dict[str, Any]:
    """Attribute ``col``'s Bloom filter ``B`` (values × bits), written to the ``len(B[0])``
    columns from ``start``, every bit flipped with ``f`` (kept with 1 − f, set to 1 or 0 with
    f/2 each)."""
    B = np.asarray(B)
    return {"op": "bloom", "in": [int(col)], "out": int(start), "bits": int(B.shape[1]),
            "f": float(f), "filters": [np.flatnonzero(row).tolist() for row in B]}


def const_step(out: int, value: int) -> dict[str, Any]:
    """Column ``out`` set to ``value``."""
    return {"op": "const", "out": int(out), "value": int(value)}


def wave_channel(step: Mapping[str, Any], grid: int) -> np.ndarray:
    """The channel a ``wave`` step applies, ``P[i, k]`` (grid points × cells) from its
    parameters alone, exactly: the output density p/width on the window of grid point i
    (z = i/(grid − 1)) and (1 − p)/(rest of the range) elsewhere, integrated over each bucket,
    or against each rounding grid point's hat (linear weights); a point (width 0) is its hat
    weights. What the privacy audits compare the SDKs' draws and ε with."""
    lo, hi = (float(v) for v in step["range"])
    a, b = (float(v) for v in step["at"])
    w, p, K = float(step["width"]), float(step["p"]), int(step["cells"])
    left_edge = a * (np.arange(grid) / (grid - 1)) + b
    rest = np.maximum(left_edge - lo, 0.0) + np.maximum(hi - (left_edge + w), 0.0)
    dout = np.divide(1.0 - p, rest, out=np.zeros_like(rest), where=rest > 0)[:, None]
    if step["round"]:
        y = np.linspace(lo, hi, K)
        h = y[1] - y[0]

        def hat(u: np.ndarray) -> np.ndarray:   # ∫_{−∞}^{u} max(0, 1 − |s|) ds
            u = np.clip(u, -1.0, 1.0)
            return np.where(u <= 0, (1 + u) ** 2 / 2, 1 - (1 - u) ** 2 / 2)

        def mass(u: np.ndarray, v: np.ndarray) -> np.ndarray:
            return h * (hat((v[:, None] - y) / h) - hat((u[:, None] - y) / h))
        if w == 0.0:
            P = np.clip(1 - np.abs(left_edge[:, None] - y) / h, 0.0, None)
        else:
            P = (p / w * mass(left_edge, left_edge + w)
                 + dout * (mass(np.full(grid, lo), left_edge)
                           + mass(left_edge + w, np.full(grid, hi))))
    else:
        e = np.linspace(lo, hi, K + 1)

        def overlap(u: np.ndarray, v: np.ndarray) -> np.ndarray:
            return np.clip(np.minimum(e[1:], v[:, None]) - np.maximum(e[:-1], u[:, None]), 0.0,
                           None)
        P = (p / w * overlap(left_edge, left_edge + w) if w > 0 else 0.0) + dout * (
            overlap(np.full(grid, lo), left_edge) + overlap(left_edge + w, np.full(grid, hi)))
    P = np.asarray(P, dtype=float)
    return P / P.sum(axis=1, keepdims=True)


def table_channel(table: Mapping[str, Any], shape: Sequence[int]) -> np.ndarray:
    """The channel of one ``partition`` table from its parameters alone (rows: cells of its
    attributes at sizes ``shape``, columns: codes without the offset): GRR over the cells, or
    OLH, code a·g + y with a uniform over gʳ and y the GRR over g of the hash
    h = Σᵢ digitᵢ(a)·digitᵢ(cell) mod g."""
    cells, p = _cells(shape, table["in"]), float(table["p"])
    if table["oracle"] == "grr":
        P = np.full((cells, cells), (1.0 - p) / (cells - 1))
        np.fill_diagonal(P, p)
        return P
    g, r = int(table["g"]), int(table["r"])
    digits = lambda v: (v[:, None] // g ** np.arange(r)) % g  # noqa: E731
    h = (digits(np.arange(cells)) @ digits(np.arange(g ** r)).T) % g      # cells × a
    P = np.full((cells, g ** r, g), (1.0 - p) / (g - 1))
    np.put_along_axis(P, h[:, :, None], p, axis=2)
    return P.reshape(cells, -1) / g ** r


def record_table_channel(prog: Mapping[str, Any], table: Mapping[str, Any]) -> np.ndarray:
    """The channel of one table of the description's ``partition`` step from a record's values
    of its attributes (rows, mixed radix: labels, a numeric attribute's grid indices) to its
    codes: the ``round`` steps' channels (:func:`round_channel`, the identity for an attribute
    not rounded) ⊗ over the attributes, then :func:`table_channel`. What the privacy audits
    compare sampled reports and the declared ε with. Memoized (``kind: partition``): the
    permanent steps; with α uniform over a fleet, ``memoize.round`` then the ``round`` steps
    (deterministic on a point) are the same channel R as a fresh ``round``."""
    steps = _top_steps(prog)
    at = next(i for i, s in enumerate(steps) if s["op"] == "partition")
    shape = step_shapes(prog)[at]
    rounds = {s["in"][0]: s["points"] for s in steps if s["op"] == "round"}
    R = np.ones((1, 1))
    for c in table["in"]:
        R = np.kron(R, round_channel(rounds[c], attribute_size(prog["labels"][c]))
                    if c in rounds else np.eye(shape[c]))
    return R @ table_channel(table, shape)


def program(family: str, domain: Domain, width: int,
            steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A version-1 description of ``family`` over ``domain``."""
    return {"v": PROGRAM_VERSION, "family": family, "attrs": list(domain.attrs),
            "labels": [list(domain.categories(a)) if domain.numeric_range(a) is None else
                       numeric_attribute(*domain.numeric_range(a),  # type: ignore[misc]
                                         domain.shape[j])
                       for j, a in enumerate(domain.attrs)], "width": int(width),
            "steps": [dict(s) for s in steps]}


def _cells(shape: Sequence[int], cols: Sequence[int]) -> int:
    return math.prod(int(shape[c]) for c in cols)


def _grr_epsilon(p: float, k: int) -> float:
    q = (1.0 - p) / (k - 1)
    lo, hi = min(p, q), max(p, q)
    return math.inf if lo <= 0.0 else math.log(hi / lo)


def step_epsilon(step: Mapping[str, Any], shape: Sequence[int]) -> float:
    """ε of one step (``inf`` for a channel that can reveal the value)."""
    op = step["op"]
    if op == "select":
        return max((sum(step_epsilon(s, shape) for s in b) for b in step["branches"]),
                   default=0.0)
    if op == "grr":
        return _grr_epsilon(float(step["p"]), _cells(shape, step["in"]))
    if op == "matrix":
        return ch.epsilon(np.asarray(step["rows"], dtype=float))
    if op in ("uniform", "copy", "const", "round"):
        return 0.0
    if op == "wave":
        return wave_epsilon(*step["range"], step["at"], float(step["width"]), float(step["p"]),
                            int(step["cells"]), bool(step["round"]))
    if op == "bloom":
        f, ham = float(step["f"]), bloom_hamming(step["filters"], int(step["bits"]))
        return 0.0 if ham == 0 else math.inf if f <= 0.0 else math.log((2.0 - f) / f) * ham
    if op == "keep":
        p, lo = float(step["p"]), min(float(f) for f in step["fake"])
        if p == 0.0:
            return 0.0
        return math.inf if p >= 1.0 or lo <= 0.0 else math.log1p(p / ((1.0 - p) * lo))
    if op == "partition":
        return len(step["out"]) * max(_grr_epsilon(float(t["p"]), int(t["g"]) if t["oracle"]
                                                   == "olh" else _cells(shape, t["in"]))
                                      for t in step["tables"])
    raise ValueError(f"unknown step op {op!r}")


def bloom_hamming(filters: Sequence[Sequence[int]], bits: int) -> int:
    """The largest Hamming distance between two values' filters (lists of set bit positions
    below ``bits``): |A| + |B| − 2 |A ∩ B| for every pair in one product of the values × bits
    indicator matrix, not a loop over pairs of sets."""
    if len(filters) < 2:
        return 0
    ind = np.zeros((len(filters), bits), dtype=np.float32)
    for v, pos in enumerate(filters):
        ind[v, list(pos)] = 1.0
    size = ind.sum(axis=1)
    return int((size[:, None] + size[None, :] - 2.0 * (ind @ ind.T)).max())


def _top_steps(prog: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    """The steps a record goes through first: a memoized description's permanent ones."""
    return prog["memoize"]["permanent"] if prog.get("memoize") else prog["steps"]


def step_shapes(prog: Mapping[str, Any]) -> list[list[int]]:
    """The attribute sizes each top-level step sees (a memoized description: each permanent
    step): the labels' (a numeric attribute's grid points), a ``round`` step's attribute its
    points' count from the next step on."""
    shape = [attribute_size(lab) for lab in prog["labels"]]
    out = []
    for s in _top_steps(prog):
        out.append(list(shape))
        if s["op"] == "round":
            shape[s["in"][0]] = len(s["points"])
    return out


def program_epsilon(prog: Mapping[str, Any]) -> float:
    """ε of one report of the description (sum over its steps, each on the attribute sizes it
    sees: :func:`step_shapes`); memoized: the sum over the permanent steps (what any number of
    reports of one rotation period cost together)."""
    return float(sum(step_epsilon(s, shape)
                     for s, shape in zip(_top_steps(prog), step_shapes(prog))))


def _leaves(steps: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Steps in order, a select followed by its branches' steps."""
    out: list[Mapping[str, Any]] = []
    for s in steps:
        out.append(s)
        if s["op"] == "select":
            out.extend(t for b in s["branches"] for t in b)
    return out


def memo_fingerprint(permanent: Sequence[Mapping[str, Any]], shape: Sequence[int]) -> str:
    """16 hex digits of BLAKE2b-64 over every permanent step: op byte (1 grr, 2 matrix), cells
    u32 LE, then ``p`` or the matrix entries row by row as f64 LE; a ``partition`` step: per
    table op byte 3, oracle byte (0 grr, 1 olh), cells u32, g u32, p f64 (all LE); a ``select``
    step: byte 4 (with ``weights``: byte 6, their count u32 and each f64), then its branches'
    steps in order; a ``wave``: byte 5, its grid points, offset and cells u32, round u8, then
    range, at, width and p f64; a ``round`` step (leading a ``partition`` one) is not hashed,
    the tables after it counting its attribute's points. Memoized responses are reused only
    under the same permanent channels."""
    h = hashlib.blake2b(digest_size=8)
    shape = list(shape)
    for s in _leaves(permanent):
        if s["op"] == "round":   # not hashed: its attribute has its points' count of cells
            shape[s["in"][0]] = len(s["points"])
            continue
        if s["op"] == "select":   # its branches' steps follow, each hashed as a step
            w = s.get("weights")
            h.update(b"\x04" if w is None else struct.pack(f"<BI{len(w)}d", 6, len(w), *w))
            continue
        if s["op"] == "wave":
            h.update(struct.pack("<BIIIB6d", 5, _cells(shape, s["in"]), s["offset"], s["cells"],
                                 bool(s["round"]), *s["range"], *s["at"], s["width"], s["p"]))
            continue
        if s["op"] == "partition":
            for t in s["tables"]:   # per table: op 3, oracle (0 grr, 1 olh), cells, g, p
                h.update(struct.pack("<BBIId", 3, t["oracle"] == "olh", _cells(shape, t["in"]),
                                     int(t.get("g") or 0), float(t["p"])))
            continue
        k = _cells(shape, s["in"])
        h.update(struct.pack("<BI", 1 if s["op"] == "grr" else 2, k))
        values = [s["p"]] if s["op"] == "grr" else [x for row in s["rows"] for x in row]
        h.update(struct.pack(f"<{len(values)}d", *values))
    return h.hexdigest()
