"""Named categorical domains and tables with named axes (after Private-PGM's ``Domain``/``Factor``).

Axes are always named by attribute, never by position alone.

>>> dom = Domain(("a", "b", "c"), (2, 3, 4))
>>> dom.project(("c", "a"))
Domain(c: 4, a: 2)
>>> dom.marginalize(("b",)).size()
8
>>> dom.axes(("c", "a"))
(2, 0)
>>> Domain.from_dict(dom.to_dict()) == dom
True
>>> sal = Domain.from_categories({"sex": ["F", "M"], "Salary": ["<=50K", ">50K"]})
>>> sal.encode([{"sex": "M", "Salary": ">50K"}, {"Salary": "<=50K", "sex": "F"}]).tolist()
[[1, 1], [0, 0]]
>>> f = Factor(dom, np.arange(24.0).reshape(2, 3, 4))
>>> f.project(("a",)).values.tolist()
[66.0, 210.0]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ldpstream.suggest import did_you_mean, plain


@dataclass(frozen=True)
class Domain:
    """Ordered attribute names with their domain sizes (and optional category labels).

    ``ranges``: per attribute, None (categorical) or (min, max) of a numeric attribute whose
    ``shape`` points are an even grid on [min, max] (docs/numeric.md)."""

    attrs: tuple[str, ...]
    shape: tuple[int, ...]
    labels: tuple[tuple[str, ...], ...] | None = field(default=None, compare=False)
    ranges: tuple[tuple[float, float] | None, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "attrs", tuple(str(a) for a in self.attrs))
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if len(self.attrs) != len(self.shape):
            raise ValueError(f"domain: {len(self.attrs)} attributes but {len(self.shape)} sizes")
        if len(set(self.attrs)) != len(self.attrs):
            raise ValueError(f"domain: duplicate attribute names in {self.attrs}")
        for a, s in zip(self.attrs, self.shape):
            if s < 2:
                raise ValueError(f"domain: attribute {a!r} needs at least 2 categories, has {s}")
        if self.labels is not None:
            labels = tuple(tuple(str(v) for v in lab) for lab in self.labels)
            if len(labels) != len(self.attrs) or any(len(l) != s for l, s in zip(labels, self.shape)):
                raise ValueError("domain: labels must list exactly shape[i] categories per attribute")
            object.__setattr__(self, "labels", labels)
        if self.ranges is not None:
            if len(self.ranges) != len(self.attrs):
                raise ValueError("domain: ranges must give one entry (or None) per attribute")
            rs = tuple(None if r is None else (float(r[0]), float(r[1])) for r in self.ranges)
            for a, r in zip(self.attrs, rs):
                if r is not None and not r[0] < r[1]:
                    raise ValueError(f"domain: attribute {a!r}: min must be below max, got {r}")
            object.__setattr__(self, "ranges", rs if any(r is not None for r in rs) else None)

    @classmethod
    def from_categories(cls, categories: Mapping[str, Sequence[str]]) -> "Domain":
        """Build from ``{attribute: [category, ...]}`` (insertion order kept)."""
        return cls(tuple(categories), tuple(len(v) for v in categories.values()),
                   tuple(tuple(v) for v in categories.values()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form (attrs, shape, labels or None, ranges when an attribute is
        numeric); :meth:`from_dict` inverts it."""
        out: dict[str, Any] = {
            "attrs": list(self.attrs), "shape": list(self.shape),
            "labels": None if self.labels is None else [list(lab) for lab in self.labels]}
        if self.ranges is not None:
            out["ranges"] = [None if r is None else list(r) for r in self.ranges]
        return out

    def to_compact_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` with a numeric attribute's labels (its grid points' values) left out
        (null): what a signed state carries, small enough for the firmware profile's record
        limit (docs/device-protocol.md); :meth:`from_dict` makes them again."""
        out = self.to_dict()
        if out["labels"] is not None and self.ranges is not None:
            out["labels"] = [None if r is not None else lab
                             for lab, r in zip(out["labels"], self.ranges)]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Domain":
        labels = d.get("labels")
        ranges = d.get("ranges")
        rs = None if ranges is None else tuple(None if r is None else (r[0], r[1])
                                               for r in ranges)
        if labels is not None and any(lab is None for lab in labels):
            from ldpstream.estimators.kernels.numeric import numeric_labels
            labels = [numeric_labels(*rs[j], d["shape"][j]) if lab is None and rs and rs[j]
                      else lab for j, lab in enumerate(labels)]
        return cls(tuple(d["attrs"]), tuple(d["shape"]),
                   None if labels is None else tuple(tuple(lab) for lab in labels), rs)

    def numeric_range(self, attr: str) -> tuple[float, float] | None:
        """(min, max) of a numeric attribute, None for a categorical one."""
        return None if self.ranges is None else self.ranges[self.axes((attr,))[0]]

    def numeric_attrs(self) -> tuple[str, ...]:
        """The numeric attributes, in domain order."""
        return tuple(a for a in self.attrs if self.numeric_range(a) is not None)

    def categories(self, attr: str) -> tuple[str, ...]:
        """The category labels of ``attr`` (``"0"…"d-1"`` when the domain has no labels)."""
        j = self.axes((attr,))[0]
        return self.labels[j] if self.labels is not None else tuple(str(i) for i in
                                                                    range(self.shape[j]))

    def encode(self, records: Iterable[Mapping[str, Any]] | Mapping[str, Sequence[Any]]
               ) -> np.ndarray:
        """Category labels → category indices, ``(n, len(self))`` int64 in domain order.

        ``records`` is an iterable of rows (mappings ``{attribute: label}``, e.g. dicts or the
        rows of a DataFrame's ``to_dict("records")``) or one mapping of columns
        ``{attribute: [label, ...]}``. Labels are compared as strings (``1`` matches ``"1"``).
        Raises :class:`SchemaError` naming the unknown or missing attribute, or the unknown
        category and the allowed ones. Vectorized per attribute (a sorted-label search).
        """
        columns = _columns(records, self.attrs)
        n = len(columns[self.attrs[0]]) if self.attrs else 0
        out = np.empty((n, len(self)), dtype=np.int64)
        for j, a in enumerate(self.attrs):
            col = columns[a]
            if len(col) != n:
                raise SchemaError(f"attribute {a!r}: {len(col)} values, expected {n}", a)
            cats = np.asarray(self.categories(a))
            order = np.argsort(cats)
            given = np.asarray([str(v) for v in col] if n else [], dtype=str)
            pos = np.searchsorted(cats[order], given).clip(0, len(cats) - 1)
            idx = order[pos]
            bad = np.flatnonzero(cats[idx] != given) if n else np.empty(0, dtype=np.intp)
            if bad.size:
                k = int(bad[0])
                raise SchemaError(f"record {k}: attribute {a!r} has unknown category "
                                  f"{plain(col[k])!r} (allowed: "
                                  f"{', '.join(repr(str(c)) for c in cats)})"
                                  f"{did_you_mean(col[k], cats)}", a)
            out[:, j] = idx
        return out

    def axes(self, attrs: Iterable[str]) -> tuple[int, ...]:
        """Positions of ``attrs`` in this domain (in the order given)."""
        out = []
        for a in attrs:
            try:
                out.append(self.attrs.index(a))
            except ValueError:
                raise KeyError(f"attribute {a!r} not in domain {self.attrs}"
                               f"{did_you_mean(a, self.attrs)}") from None
        return tuple(out)

    def project(self, attrs: Iterable[str]) -> "Domain":
        """The sub-domain on ``attrs``, in the order given."""
        attrs = tuple(attrs)
        ax = self.axes(attrs)
        labels = None if self.labels is None else tuple(self.labels[i] for i in ax)
        ranges = None if self.ranges is None else tuple(self.ranges[i] for i in ax)
        return Domain(attrs, tuple(self.shape[i] for i in ax), labels, ranges)

    def marginalize(self, attrs: Iterable[str]) -> "Domain":
        """The sub-domain without ``attrs``."""
        drop = set(attrs)
        return self.project(a for a in self.attrs if a not in drop)

    def size(self, attrs: Iterable[str] | None = None) -> int:
        """Number of cells of the (sub-)domain."""
        dom = self if attrs is None else self.project(attrs)
        return int(np.prod(dom.shape, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.attrs)

    def __iter__(self):
        return iter(self.attrs)

    def __contains__(self, attr: object) -> bool:
        return attr in self.attrs

    def __getitem__(self, attr: str) -> int:
        return self.shape[self.axes((attr,))[0]]

    def __repr__(self) -> str:
        return "Domain(" + ", ".join(f"{a}: {s}" for a, s in zip(self.attrs, self.shape)) + ")"


class SchemaError(ValueError):
    """A record that does not fit a :class:`Domain`; ``attribute`` names the offending field."""

    def __init__(self, message: str, attribute: str | None = None) -> None:
        super().__init__(message)
        self.attribute = attribute


def _columns(records: Any, attrs: Sequence[str]) -> dict[str, Sequence[Any]]:
    """Rows or a column mapping → ``{attribute: values}``, checking the attribute names."""
    if isinstance(records, Mapping):
        cols = {str(k): list(v) if not isinstance(v, (str, bytes)) else [v]
                for k, v in records.items()}
        rows_desc = "columns"
    else:
        cols = {a: [] for a in attrs}
        for k, row in enumerate(records):
            if not isinstance(row, Mapping):
                raise SchemaError(f"record {k}: expected a mapping {{attribute: category}}, got "
                                  f"{type(row).__name__}")
            extra = [a for a in row if a not in cols]
            if extra:
                raise SchemaError(f"record {k}: unknown attribute {extra[0]!r} (attributes: "
                                  f"{', '.join(attrs)})", str(extra[0]))
            if len(row) != len(attrs):
                miss = next(a for a in attrs if a not in row)
                raise SchemaError(f"record {k}: missing attribute {miss!r} (attributes: "
                                  f"{', '.join(attrs)})", miss)
            for a in attrs:
                cols[a].append(row[a])
        return cols
    extra = [a for a in cols if a not in attrs]
    if extra:
        raise SchemaError(f"{rows_desc}: unknown attribute {extra[0]!r} (attributes: "
                          f"{', '.join(attrs)})", extra[0])
    miss = [a for a in attrs if a not in cols]
    if miss:
        raise SchemaError(f"{rows_desc}: missing attribute {miss[0]!r} (attributes: "
                          f"{', '.join(attrs)})", miss[0])
    return cols


@dataclass(frozen=True)
class Factor:
    """A dense table over a :class:`Domain`; ``values.shape == domain.shape``."""

    domain: Domain
    values: np.ndarray

    def __post_init__(self) -> None:
        vals = np.asarray(self.values)
        if vals.shape != self.domain.shape:
            raise ValueError(f"factor: values of shape {vals.shape} do not match {self.domain}")
        object.__setattr__(self, "values", vals)

    def project(self, attrs: Iterable[str]) -> "Factor":
        """Sum out every other attribute and order the axes as ``attrs``."""
        attrs = tuple(attrs)
        keep = self.domain.axes(attrs)
        drop = tuple(i for i in range(len(self.domain)) if i not in keep)
        vals = self.values.sum(axis=drop) if drop else self.values
        remaining = [i for i in range(len(self.domain)) if i in keep]
        vals = np.transpose(vals, [remaining.index(i) for i in keep])
        return Factor(self.domain.project(attrs), vals)

    def transpose(self, attrs: Sequence[str]) -> "Factor":
        return self.project(attrs)

    def normalize(self) -> "Factor":
        total = self.values.sum()
        return Factor(self.domain, self.values / total if total else self.values)

    def total(self) -> float:
        return float(self.values.sum())
