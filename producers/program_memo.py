"""The memoized part of a randomization description on the device (docs/device-protocol.md,
"Memoized descriptions"): what one memo holds, what drawing it costs and how a report is made
from the memos [RAPPOR §3].

Three classes, one interface (:meth:`keys`, :meth:`epsilon_of`, :meth:`draw`, :meth:`report`):

* :class:`Memo` (``kind`` absent, or ``cluster``): one permanent ``grr``/``matrix`` step per
  memo unit, the units' ``in`` columns partitioning the attributes (one attribute each without
  ``kind``); a memo is keyed (step index, flat cell of its ``in``) and holds the step's output
  cell; the description's ``steps`` then randomize the permanent record on every report. A
  numeric attribute's unit is its ``wave`` or the weighted ``select`` over its waves, its value
  α-point rounded first (``round``: the device's α from its id), the memo keyed by the rounded
  grid index and holding the column's value.
* :class:`SelectMemo` (``kind: select``, smp): one ``select`` step whose branches are one
  ``grr``/``matrix`` step each; the branch index is fixed per rotation period from (device id,
  period) as the partition's first table is (``seed``); a memo is keyed (branch, cell of its
  ``in``) and holds the output cell; a report writes the index and the output cell, its value
  re-randomized by a fresh GRR of keep ``instantaneous_p[branch]`` (or null).
* :class:`PartitionMemo` (``kind: partition``): one ``partition`` step; the device's first
  table is fixed per rotation period from (device id, period); a memo is keyed (table, cell of
  the table's attributes) and holds the oracle's code (offset excluded); ``instantaneous_p``
  (per table, or null) re-randomizes the reported value of every code with a fresh GRR (the
  cell for a GRR table, the hashed value for an OLH table, its seed kept).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from ldpstream.estimators.kernels.device_program import (
    MAX_MATRIX_ENTRIES,
    alpha_round,
    device_alpha,
    memo_fingerprint,
    round_index,
    step_epsilon,
)
from ldpstream.producers.draws import M64, DrawSource, mix64
from ldpstream.producers.program_steps import (
    ProgramError,
    Step,
    grr_cell,
    olh_code,
    parse_steps,
    ravel,
    run_step,
    unravel,
)

__all__ = ["Memo", "PartitionMemo", "SelectMemo", "parse_memo", "partition_first"]


def _first(mixed_seed: int, device_id: int, period: int, k: int) -> int:
    """mix64(mix64(id ⊕ mixed seed) ⊕ period) mod k: fixed per (device, period)."""
    return mix64(mix64((int(device_id) & M64) ^ mixed_seed) ^ (int(period) & M64)) % k


def partition_first(s: Step, device_id: int, period: int) -> int:
    """The first table of a memoized ``partition`` step (``s.seed`` is already mixed)."""
    return _first(s.seed, device_id, period, len(s.tables))


@dataclass(frozen=True)
class _Rotating:
    """A memo kind's rotation: responses are kept for the period ``floor(now / rotation_s)``."""

    rotation_s: float | None

    def period(self, now: float) -> int:
        """``floor(now / rotation_s)``; 0 when responses never rotate."""
        return 0 if self.rotation_s is None else int(math.floor(now / self.rotation_s))

    def rounded(self, x: Sequence[int], device_id: int) -> list[int]:
        """The record the memos and the sent records are keyed by (unchanged: no rounding)."""
        return [int(v) for v in x]


#: per attribute: (rounding points, α seed) of a rounded numeric one, else None
Rounding = tuple[tuple[np.ndarray, int] | None, ...]


def _alpha_rounded(x: Sequence[int], rounding: Rounding, device_id: int) -> list[int]:
    """``x`` with each value of a rounded attribute α-point rounded with the device's α
    [Ding et al., NeurIPS 2017, §3]: a grid index that is one of the points."""
    out = [int(v) for v in x]
    for j, r in enumerate(rounding):
        if r is not None:
            alpha = device_alpha(np.array([device_id], dtype=np.uint64), r[1])
            out[j] = int(alpha_round(np.array([out[j]]), r[0], alpha)[0])
    return out


@dataclass(frozen=True)
class Memo(_Rotating):
    """Permanent ``grr``/``matrix`` steps, one per memo unit (attribute or cluster)."""

    permanent: tuple[Step, ...]
    epsilons: tuple[float, ...]
    fingerprint: str
    rounding: Rounding = ()

    def rounded(self, x: Sequence[int], device_id: int) -> list[int]:
        """``x`` with each rounded numeric value α-point rounded with the device's α
        (docs/device-protocol.md, "Numeric memoization")."""
        return _alpha_rounded(x, self.rounding, device_id)

    def keys(self, x: Sequence[int], device_id: int, period: int) -> list[tuple[int, int]]:
        """(unit, cell) of every memo the record ``x`` needs."""
        return [(i, ravel(x, s.cols, s.shape)) for i, s in enumerate(self.permanent)]

    def epsilon_of(self, key: tuple[int, int]) -> float:
        return self.epsilons[key[0]]

    def draw(self, key: tuple[int, int], rng: DrawSource) -> int:
        """A new permanent response of unit ``key[0]`` for cell ``key[1]``: its output cell,
        or a numeric unit's column value (the task and its wave's cell, offset included)."""
        s = self.permanent[key[0]]
        if s.op in ("wave", "select"):
            x = [0] * (s.cols[0] + 1)
            x[s.cols[0]] = key[1]
            report = [0] * (s.cols[0] + 1)
            run_step(s, x, rng, report)
            return report[s.cols[0]]
        return _run_cell(s, key[1], rng)

    def permanent_record(self, values: Sequence[int]) -> list[int]:
        """The permanent record the instantaneous steps randomize."""
        rec = [0] * sum(len(s.cols) for s in self.permanent)
        for s, v in zip(self.permanent, values):
            if s.op in ("wave", "select"):
                rec[s.cols[0]] = int(v)
                continue
            assert isinstance(s.out, tuple)
            unravel(v, s.out, s.shape, rec)
        return rec


@dataclass(frozen=True)
class PartitionMemo(_Rotating):
    """A memoized ``partition`` step and the instantaneous keep probability of every table;
    its numeric attributes α-point rounded (``rounding``), then mapped to their point's index
    by the leading ``round`` steps (``rounds``)."""

    step: Step
    width: int
    instantaneous: tuple[float, ...] | None
    epsilons: tuple[float, ...]
    fingerprint: str
    rounding: Rounding = ()
    rounds: tuple[Step, ...] = ()

    def rounded(self, x: Sequence[int], device_id: int) -> list[int]:
        """``x`` with each rounded numeric value α-point rounded with the device's α."""
        return _alpha_rounded(x, self.rounding, device_id)

    def keys(self, x: Sequence[int], device_id: int, period: int) -> list[tuple[int, int]]:
        """(table, cell) of every slot: table (first + slot) mod K; a rounded attribute's
        value (a point, :meth:`rounded`) its point's index, as its ``round`` step maps it
        (no uniform drawn: a point rounds to itself)."""
        k = len(self.step.tables)
        first = partition_first(self.step, device_id, period)
        assert isinstance(self.step.out, tuple)
        x = list(x)
        for r in self.rounds:
            x[r.cols[0]] = int(round_index(np.array([x[r.cols[0]]]), np.asarray(r.points),
                                           np.zeros(1))[0])
        out = []
        for i in range(len(self.step.out)):
            j = (first + i) % k
            t = self.step.tables[j]
            out.append((j, ravel(x, t.cols, t.shape)))
        return out

    def epsilon_of(self, key: tuple[int, int]) -> float:
        return self.epsilons[key[0]]

    def draw(self, key: tuple[int, int], rng: DrawSource) -> int:
        """The permanent oracle's code of table ``key[0]`` for cell ``key[1]`` (no offset)."""
        t = self.step.tables[key[0]]
        if t.g == 0:
            return grr_cell(key[1], math.prod(t.shape), t.p, rng)
        return olh_code(t, key[1], rng)

    def report(self, keys: Sequence[tuple[int, int]], codes: Sequence[int],
               rng: DrawSource) -> list[int]:
        """Column ``out[i]`` of slot i: table offset + the memoized code, its value
        re-randomized when ``instantaneous`` is set."""
        assert isinstance(self.step.out, tuple)
        out = [0] * self.width
        for col, (j, _), code in zip(self.step.out, keys, codes):
            t = self.step.tables[j]
            if self.instantaneous is not None:
                p = self.instantaneous[j]
                if t.g == 0:
                    code = grr_cell(code, math.prod(t.shape), p, rng)
                else:
                    code = (code // t.g) * t.g + grr_cell(code % t.g, t.g, p, rng)
            out[col] = t.offset + code
        return out


@dataclass(frozen=True)
class SelectMemo(_Rotating):
    """A memoized ``select`` step (smp): its branch fixed per (device, period)."""

    step: Step
    seed: int
    width: int
    instantaneous: tuple[float, ...] | None
    epsilons: tuple[float, ...]
    fingerprint: str

    def keys(self, x: Sequence[int], device_id: int, period: int) -> list[tuple[int, int]]:
        j = _first(self.seed, device_id, period, len(self.step.branches))
        s = self.step.branches[j][0]
        return [(j, ravel(x, s.cols, s.shape))]

    def epsilon_of(self, key: tuple[int, int]) -> float:
        return self.epsilons[key[0]]

    def draw(self, key: tuple[int, int], rng: DrawSource) -> int:
        """The output cell of branch ``key[0]``'s step for cell ``key[1]``."""
        return _run_cell(self.step.branches[key[0]][0], key[1], rng)

    def report(self, keys: Sequence[tuple[int, int]], codes: Sequence[int],
               rng: DrawSource) -> list[int]:
        """The index, then the memoized cell (re-randomized when ``instantaneous`` is set)."""
        (j, _), cell = keys[0], codes[0]
        s = self.step.branches[j][0]
        if self.instantaneous is not None:
            cell = grr_cell(cell, math.prod(s.shape), self.instantaneous[j], rng)
        out = [0] * self.width
        assert isinstance(self.step.out, int) and isinstance(s.out, tuple)
        out[self.step.out] = j
        unravel(cell, s.out, s.shape, out)
        return out


def _run_cell(s: Step, cell: int, rng: DrawSource) -> int:
    """A grr/matrix step on a cell of its ``in``: the output cell."""
    x = [0] * (max(s.cols) + 1)
    unravel(cell, s.cols, s.shape, x)
    assert isinstance(s.out, tuple)
    out = [0] * (max(s.out) + 1)
    run_step(s, x, rng, out)
    return ravel(out, s.out, s.shape)


def _instantaneous(d: dict, n: int) -> tuple[float, ...] | None:
    inst = d.get("instantaneous_p")
    if inst is not None and (not isinstance(inst, list) or len(inst) != n or
                             not all(isinstance(p, (int, float)) and not isinstance(p, bool)
                                     and 0.0 <= p <= 1.0 for p in inst)):
        raise ProgramError("device.memoize.instantaneous_p", f"must be null or {n} numbers in "
                                                             f"[0, 1], one per table or branch")
    return None if inst is None else tuple(float(p) for p in inst)


def _select_memo(d: dict, rotation: float | None, perm: tuple[Step, ...], raw: list,
                 shape: Sequence[int], width: int) -> SelectMemo:
    if (len(perm) != 1 or perm[0].op != "select" or not isinstance(perm[0].out, int)
            or perm[0].weights
            or any(len(b) != 1 or b[0].op not in ("grr", "matrix") for b in perm[0].branches)):
        raise ProgramError("device.memoize.permanent", "kind select: one select step with a "
                                                       "reported index and no weights, each "
                                                       "branch one grr or matrix step")
    seed = d.get("seed")
    if not isinstance(seed, str) or not seed.isdigit() or int(seed) > M64:
        raise ProgramError("device.memoize.seed", "must be a u64 as a decimal string")
    step = perm[0]
    return SelectMemo(rotation, step, mix64(int(seed)), width,
                      _instantaneous(d, len(step.branches)),
                      tuple(step_epsilon(b[0], shape) for b in raw[0]["branches"]),
                      memo_fingerprint(raw, shape))


def parse_memo(d: Any, shape: Sequence[int], width: int, budget: list[int],
               numeric: Sequence[bool] = ()) -> Memo | PartitionMemo | SelectMemo:
    """The ``memoize`` object of a description (a :class:`ProgramError` names the field)."""
    if not isinstance(d, dict):
        raise ProgramError("device.memoize", "must be an object")
    rot = d.get("rotation_s")
    if rot is not None and (isinstance(rot, bool) or not isinstance(rot, (int, float))
                            or not math.isfinite(rot) or rot <= 0):
        raise ProgramError("device.memoize.rotation_s", "must be a number > 0 or null")
    rotation = None if rot is None else float(rot)
    kind = d.get("kind", "attribute")
    if kind not in ("attribute", "cluster", "partition", "select"):
        raise ProgramError("device.memoize.kind", "must be attribute, cluster, partition or "
                                                  "select")
    if kind not in ("attribute", "partition") and d.get("round") is not None:
        raise ProgramError("device.memoize.round", "only with kind attribute or partition")
    rounding = _rounding(d.get("round"), shape, numeric, budget) \
        if kind in ("attribute", "partition") else ()
    depth = 0 if kind in ("partition", "select", "attribute") else 1
    perm = parse_steps(d.get("permanent"), "device.memoize.permanent", shape, width, depth,
                       budget, numeric, rounds=kind == "partition")
    raw = d["permanent"]
    if kind == "partition":
        return _partition_memo(d, rotation, perm, raw, shape, width, rounding)
    if kind == "select":
        return _select_memo(d, rotation, perm, raw, shape, width)
    ok = all(s.op in ("grr", "matrix") and s.out == s.cols or _numeric_unit(s)
             for s in perm) and width == len(shape)
    perm = tuple(replace(s, cols=s.branches[0][0].cols, shape=s.branches[0][0].shape)
                 if ok and s.op == "select" else s for s in perm)   # a numeric unit's column
    cols = [c for s in perm for c in s.cols]
    if kind == "attribute":
        ok = ok and len(perm) == len(shape) and all(s.cols == (j,) for j, s in enumerate(perm))
    else:
        ok = ok and sorted(cols) == list(range(len(shape)))
    if not ok:
        raise ProgramError("device.memoize.permanent", "must hold one grr or matrix step per "
                                                       "attribute j, in and out [j], in order "
                                                       "(a numeric one: its wave, or a select "
                                                       "with out null over one wave per "
                                                       "branch, in [j] and out j; kind "
                                                       "cluster: grr or matrix per cluster, "
                                                       "the clusters covering every attribute "
                                                       "once; width must be the attribute "
                                                       "count)")
    return Memo(rotation, perm, tuple(step_epsilon(s, shape) for s in raw),
                memo_fingerprint(raw, shape), rounding)


def _numeric_unit(s: Step) -> bool:
    """A numeric attribute's permanent step: a wave writing its own column, or a select whose
    index is not reported over one such wave per branch (the step's ``cols`` set to them)."""
    def wave(w: Step) -> bool:
        return w.op == "wave" and w.out == w.cols
    if s.op == "wave":
        return wave(s)
    if s.op != "select" or s.out is not None or not s.branches:
        return False
    col = s.branches[0][0].cols if s.branches[0] else ()
    return all(len(b) == 1 and wave(b[0]) and b[0].cols == col for b in s.branches)


def _rounding(v: Any, shape: Sequence[int], numeric: Sequence[bool], budget: list[int]
              ) -> tuple[tuple[np.ndarray, int] | None, ...]:
    """``round``: null, or per attribute null or a numeric one's ``{points, seed}`` — grid
    indices from 0 to the last, increasing (each counts as a matrix entry), and the α seed, a
    u64 as a decimal string."""
    if v is None:
        return ()
    if not isinstance(v, list) or len(v) != len(shape):
        raise ProgramError("device.memoize.round", f"must be null or {len(shape)} entries, one "
                                                   "per attribute")
    out: list[tuple[np.ndarray, int] | None] = []
    for j, r in enumerate(v):
        f = f"device.memoize.round[{j}]"
        if r is None:
            out.append(None)
            continue
        pts = r.get("points") if isinstance(r, dict) else None
        if not (j < len(numeric) and numeric[j]) or not isinstance(pts, list):
            raise ProgramError(f, "must be null or, for a numeric attribute, {points, seed}")
        budget[0] -= len(pts)
        if (budget[0] < 0 or len(pts) < 2 or not all(
                isinstance(p, int) and not isinstance(p, bool) for p in pts)
                or pts[0] != 0 or pts[-1] != shape[j] - 1
                or any(b <= a for a, b in zip(pts, pts[1:]))):
            raise ProgramError(f"{f}.points", f"must be increasing grid indices from 0 to "
                                              f"{shape[j] - 1} (each counts against the "
                                              f"{MAX_MATRIX_ENTRIES} matrix entries in all)")
        seed = r.get("seed")
        if not isinstance(seed, str) or not seed.isdigit() or int(seed) > M64:
            raise ProgramError(f"{f}.seed", "must be a u64 as a decimal string")
        out.append((np.asarray(pts, dtype=np.int64), int(seed)))
    return tuple(out)


def _partition_memo(d: dict, rotation: float | None, perm: tuple[Step, ...], raw: list,
                    shape: Sequence[int], width: int, rounding: Rounding) -> PartitionMemo:
    """One partition step, after a ``round`` step for exactly the attributes ``round`` α-point
    rounds, with the same points (it maps the rounded value to its point's index)."""
    rounds, step = perm[:-1], perm[-1]
    if step.op != "partition" or any(s.op != "round" for s in rounds):
        raise ProgramError("device.memoize.permanent", "kind partition: one partition step, "
                                                       "after a round step per attribute "
                                                       "memoize.round rounds")
    by_col = {s.cols[0]: s.points for s in rounds}
    want = {j: tuple(int(v) for v in r[0]) for j, r in enumerate(rounding) if r is not None}
    if by_col != want:
        raise ProgramError("device.memoize.round", "kind partition: one entry per attribute "
                                                   "a permanent round step rounds, with its "
                                                   "points")
    inst = _instantaneous(d, len(step.tables))
    seen = list(shape)   # the sizes the tables see: a rounded attribute's points
    for r in rounds:
        seen[r.cols[0]] = len(r.points)
    eps = tuple(step_epsilon({"op": "partition", "out": [0], "tables": [t]}, seen)
                for t in raw[-1]["tables"])
    return PartitionMemo(rotation, step, width, inst, eps, memo_fingerprint(raw, shape),
                         rounding, rounds)
