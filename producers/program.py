"""The device-side interpreter of the randomization description (docs/device-protocol.md); the
draws it makes are in :mod:`.draws`.

:class:`Program` parses and checks a description (a :class:`ProgramError` names the field),
computes its ε from the channels it applies, turns labels into indices and randomizes one
record per call.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ldpstream.estimators.kernels.device_program import (
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
    run_partition,
    run_step,
)

__all__ = ["DrawSource", "SplitMix64", "OsRandom", "NumpyDraws", "uniform", "bernoulli",
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
        _check_text(attrs, labels)
        self.attrs: tuple[str, ...] = tuple(attrs)
        self.labels: tuple[tuple[str, ...], ...] = tuple(tuple(lab) for lab in labels)
        self.shape = tuple(len(lab) for lab in self.labels)
        self.width = width
        budget = new_budget()
        self.memo = None if d.get("memoize") is None else parse_memo(d["memoize"], self.shape,
                                                                     width, budget)
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
