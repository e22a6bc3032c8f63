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

from ldpstream.estimators.kernels.device_program import PROGRAM_VERSION, memo_fingerprint, program_epsilon, step_epsilon
from ldpstream.estimators.kernels.domain import SchemaError
from ldpstream.producers.draws import DrawSource, NumpyDraws, OsRandom, SplitMix64, bernoulli, categorical, uniform
from ldpstream.producers.program_steps import (
    MAX_ATTRS,
    MAX_MATRIX_ENTRIES,
    MAX_STEPS,
    MAX_WIDTH,
    ProgramError,
    Step,
    parse_steps,
    run_partition,
    run_step,
)

__all__ = ["DrawSource", "SplitMix64", "OsRandom", "NumpyDraws", "uniform", "bernoulli",
           "categorical", "Program", "ProgramError", "Memo", "MAX_WIDTH", "MAX_ATTRS"]



@dataclass(frozen=True)
class Memo:
    """The memoized part of a description: the permanent step of every attribute, its ε, the
    rotation period and the fingerprint memoized responses are kept under."""

    rotation_s: float | None
    permanent: tuple[Step, ...]
    epsilons: tuple[float, ...]
    fingerprint: str

    def period(self, now: float) -> int:
        """``floor(now / rotation_s)``; 0 when responses never rotate."""
        return 0 if self.rotation_s is None else int(math.floor(now / self.rotation_s))

    def draw(self, j: int, value: int, rng: DrawSource) -> int:
        """A new permanent response of attribute ``j`` with true ``value``."""
        report = [0] * (j + 1)
        run_step(self.permanent[j], {j: value}, rng, report)
        return report[j]


def _memo(d: Any, shape: Sequence[int], width: int, budget: list[int]) -> Memo:
    if not isinstance(d, dict):
        raise ProgramError("device.memoize", "must be an object")
    rot = d.get("rotation_s")
    if rot is not None and (isinstance(rot, bool) or not isinstance(rot, (int, float))
                            or not math.isfinite(rot) or rot <= 0):
        raise ProgramError("device.memoize.rotation_s", "must be a number > 0 or null")
    perm = parse_steps(d.get("permanent"), "device.memoize.permanent", shape, width, 1, budget)
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
        self.steps = () if self.memo is not None and d.get("steps") == [] else parse_steps(
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
                run_partition(s, x, rng, report, device_id)
            else:
                run_step(s, x, rng, report)
        return report
