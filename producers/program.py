"""The device-side interpreter of the randomization description (docs/device-protocol.md); the
draws it makes are in :mod:`.draws`.

:class:`Program` parses and checks a description (a :class:`ProgramError` names the field),
computes its ε from the channels it applies, turns labels into indices and randomizes one
record per call.
"""
from __future__ import annotations

import math
import re
from numbers import Real
from typing import Any, Mapping, Sequence

from ldpstream.estimators.kernels.device_program import (
    MAX_GRID,
    MAX_LABEL_BYTES,
    MAX_LABELS,
    PROGRAM_VERSION,
    program_epsilon,
)
from ldpstream.estimators.kernels.domain import SchemaError
from ldpstream.producers.draws import DrawSource, NumpyDraws, OsRandom, SplitMix64, bernoulli, categorical, uniform
from ldpstream.producers.program_memo import Memo, PartitionMemo, SelectMemo, parse_memo
from ldpstream.producers.program_steps import (
    MAX_ATTRS,
    MAX_WIDTH,
    ProgramError,
    new_budget,
    parse_steps,
    quantize_value,
    run_partition,
    run_round,
    run_step,
)

#: the text of a numeric value (docs/device-protocol.md, "Numeric attributes"): an optional
#: sign, digits with an optional fraction (or a fraction alone), an optional exponent
NUMBER_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def numeric_value(v: Any, attr: str) -> float:
    """A record's value of a numeric attribute: a number (not a bool), or its text
    (:data:`NUMBER_TEXT`); NaN is a :class:`SchemaError` naming the attribute, ±∞ is clipped."""
    if isinstance(v, str) and NUMBER_TEXT.fullmatch(v):
        return float(v)
    if isinstance(v, Real) and not isinstance(v, bool) and not math.isnan(float(v)):
        return float(v)
    raise SchemaError(f"attribute {attr!r}: {v!r} is not a number", attr)

__all__ = ["DrawSource", "SplitMix64", "OsRandom", "NumpyDraws", "uniform", "bernoulli",
           "encode_record", "numeric_value",
           "categorical", "Program", "ProgramError", "Memo", "PartitionMemo", "SelectMemo", "MAX_WIDTH",
           "MAX_ATTRS"]



def _check_text(attrs: Sequence[str], labels: Sequence[Sequence[str]]) -> None:
    """The label caps, in the order the C SDK fills its buffers (each name, then its labels):
    at most MAX_LABELS labels and MAX_LABEL_BYTES UTF-8 bytes of names and labels, one more
    per string (docs/device-protocol.md, "Limits")."""
    n_labels = n_bytes = 0
    for j, (name, labs) in enumerate(zip(attrs, labels)):
        n_bytes += len(name.encode("utf-8", "surrogatepass")) + 1
        if n_bytes > MAX_LABEL_BYTES:
            raise ProgramError("device.attrs", f"at most {MAX_LABEL_BYTES} bytes of names and "
                                              "labels")
        n_labels += len(labs)
        if n_labels > MAX_LABELS:
            raise ProgramError(f"device.labels[{j}]", f"at most {MAX_LABELS} labels in all")
        n_bytes += sum(len(lab.encode("utf-8", "surrogatepass")) + 1 for lab in labs)
        if n_bytes > MAX_LABEL_BYTES:
            raise ProgramError(f"device.labels[{j}]", f"at most {MAX_LABEL_BYTES} bytes of "
                                                      "names and labels")


def encode_record(attrs: Sequence[str], index: Sequence[Mapping[str, int]],
                  ranges: Sequence[tuple[float, float, int] | None], record: Mapping[str, Any]
                  ) -> tuple[list[int], tuple[str, ...]]:
    """A record → its indices in attribute order (a categorical label's position, a numeric
    value's grid index: :func:`~.program_steps.quantize_value`) and the numeric attributes
    whose value was clipped; a :class:`SchemaError` names the attribute."""
    for a in record:
        if a not in attrs:
            raise SchemaError(f"unknown attribute {a!r} (known: {', '.join(attrs)})", a)
    out: list[int] = []
    clipped: list[str] = []
    for a, idx, r in zip(attrs, index, ranges):
        if a not in record:
            raise SchemaError(f"missing attribute {a!r}", a)
        if r is not None:
            k, was = quantize_value(numeric_value(record[a], a), *r)
            out.append(k)
            if was:
                clipped.append(a)
            continue
        i = idx.get(str(record[a]))
        if i is None:
            raise SchemaError(f"attribute {a!r}: unknown category {record[a]!r} (allowed: "
                              f"{', '.join(idx)})", a)
        out.append(i)
    return out, tuple(clipped)


def _numeric(d: dict, field: str) -> tuple[float, float, int]:
    """A numeric attribute's ``{min, max, grid}``: finite min < max, 2 ≤ grid ≤ MAX_GRID."""
    lo, hi, g = d.get("min"), d.get("max"), d.get("grid")
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
             for v in (lo, hi)) and lo < hi  # type: ignore[operator]
    if not ok or isinstance(g, bool) or not isinstance(g, int) or not 2 <= g <= MAX_GRID:
        raise ProgramError(field, f"a numeric attribute is {{min, max, grid}}: finite min < "
                                  f"max, grid an integer in [2, {MAX_GRID}]")
    return float(lo), float(hi), int(g)  # type: ignore[arg-type]


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
                isinstance(lab, dict) or isinstance(lab, list) and len(lab) >= 2
                and all(isinstance(s, str) for s in lab) for lab in labels)):
            raise ProgramError("device.labels", "must hold ≥ 2 string labels per attribute "
                                                "(a numeric one: {min, max, grid})")
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= MAX_WIDTH:
            raise ProgramError("device.width", f"must be an integer in [1, {MAX_WIDTH}]")
        #: per attribute: (min, max, grid) of a numeric one, None for a categorical one
        self.ranges: tuple[tuple[float, float, int] | None, ...] = tuple(
            _numeric(lab, f"device.labels[{j}]") if isinstance(lab, dict) else None
            for j, lab in enumerate(labels))
        _check_text(attrs, [[] if isinstance(lab, dict) else lab for lab in labels])
        self.attrs: tuple[str, ...] = tuple(attrs)
        self.labels: tuple[tuple[str, ...], ...] = tuple(
            () if isinstance(lab, dict) else tuple(lab) for lab in labels)
        self.shape = tuple(len(lab) if r is None else r[2]
                           for lab, r in zip(self.labels, self.ranges))
        self.width = width
        numeric = tuple(r is not None for r in self.ranges)
        budget = new_budget()
        self.memo = None if d.get("memoize") is None else parse_memo(d["memoize"], self.shape,
                                                                     width, budget, numeric)
        self.steps = () if self.memo is not None and d.get("steps") == [] else parse_steps(
            d.get("steps"), "device.steps", self.shape, width, 0, budget, numeric,
            rounds=self.memo is None)
        self.epsilon = program_epsilon(d)
        self._index = [{lab: i for i, lab in enumerate(labs)} for labs in self.labels]

    def encode(self, record: Mapping[str, Any]) -> list[int]:
        """Labels (and numeric values) → indices; a :class:`SchemaError` names a missing,
        unknown attribute, unknown category or a numeric attribute's value that is not a
        number."""
        return self.encode_clipped(record)[0]

    def encode_clipped(self, record: Mapping[str, Any]) -> tuple[list[int], tuple[str, ...]]:
        """:meth:`encode`, and the numeric attributes whose value was clipped into the range
        (docs/device-protocol.md, "Numeric attributes")."""
        return encode_record(self.attrs, self._index, self.ranges, record)

    def randomize(self, x: Sequence[int], rng: DrawSource, device_id: int = 0) -> list[int]:
        """One report of the record of indices ``x`` (memoized: of the permanent responses
        ``x``) by the device ``device_id`` (``partition`` assigns by it)."""
        report = [0] * self.width
        x = list(x)
        for s in self.steps:
            if s.op == "round":
                run_round(s, x, rng)
            elif s.op == "partition":
                run_partition(s, x, rng, report, device_id)
            else:
                run_step(s, x, rng, report)
        return report
