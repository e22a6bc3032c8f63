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
>>> f = Factor(dom, np.arange(24.0).reshape(2, 3, 4))
>>> f.project(("a",)).values.tolist()
[66.0, 210.0]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class Domain:
    """Ordered attribute names with their domain sizes (and optional category labels)."""

    attrs: tuple[str, ...]
    shape: tuple[int, ...]
    labels: tuple[tuple[str, ...], ...] | None = field(default=None, compare=False)

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

    @classmethod
    def from_categories(cls, categories: Mapping[str, Sequence[str]]) -> "Domain":
        """Build from ``{attribute: [category, ...]}`` (insertion order kept)."""
        return cls(tuple(categories), tuple(len(v) for v in categories.values()),
                   tuple(tuple(v) for v in categories.values()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable form (attrs, shape, labels or None); :meth:`from_dict` inverts it."""
        return {"attrs": list(self.attrs), "shape": list(self.shape),
                "labels": None if self.labels is None else [list(lab) for lab in self.labels]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Domain":
        labels = d.get("labels")
        return cls(tuple(d["attrs"]), tuple(d["shape"]),
                   None if labels is None else tuple(tuple(lab) for lab in labels))

    def axes(self, attrs: Iterable[str]) -> tuple[int, ...]:
        """Positions of ``attrs`` in this domain (in the order given)."""
        out = []
        for a in attrs:
            try:
                out.append(self.attrs.index(a))
            except ValueError:
                raise KeyError(f"attribute {a!r} not in domain {self.attrs}") from None
        return tuple(out)

    def project(self, attrs: Iterable[str]) -> "Domain":
        """The sub-domain on ``attrs``, in the order given."""
        attrs = tuple(attrs)
        ax = self.axes(attrs)
        labels = None if self.labels is None else tuple(self.labels[i] for i in ax)
        return Domain(attrs, tuple(self.shape[i] for i in ax), labels)

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
