"""Loading categorical datasets (CSV) into a :class:`~ldpstream.estimators.Domain` and an integer
record matrix. I/O lives here, outside the functional core.

Every distinct string of a column is a category (``?`` included); categories are sorted so that
the encoding is stable across runs and machines.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.kernels.numeric import DEFAULT_GRID, numeric_labels, quantize
from ldpstream.suggest import did_you_mean, plain

#: the eight categorical Adult attributes used by [Castell] Table VI and [MDRR] §6
ADULT_COLUMNS = ("workclass", "education", "marital-status", "occupation", "relationship", "race",
                 "sex", "Salary")


#: a column whose values are all numbers and that has more distinct values than this is refused
#: (each distinct value would be one category: estimates over it would be mostly noise)
MAX_NUMERIC_CATEGORIES = 64


def adult_path() -> Path:
    """The bundled copy of UCI Adult (CC BY 4.0; see ``ldpstream/data/ADULT-LICENSE.md``)."""
    return Path(str(resources.files("ldpstream") / "data" / "adult.csv"))


class DatasetError(ValueError):
    """A dataset cannot be read; the message names the file or column."""


@dataclass(frozen=True)
class Dataset:
    domain: Domain
    records: np.ndarray  # (n, m) category indices, dtype uint8/uint16, column order = domain.attrs
    #: numeric columns: their values as read (before clipping and the grid)
    values: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: numeric columns: how many values were clipped into the range
    clipped: Mapping[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.records.shape[0])

    def column(self, attr: str) -> np.ndarray:
        return self.records[:, self.domain.axes((attr,))[0]]


def _smallest_uint(max_value: int) -> type:
    return np.uint8 if max_value < 256 else np.uint16 if max_value < 65536 else np.uint32


def load_csv(path: str | Path | None = None, columns: Sequence[str] | None = None,
             domain: Domain | None = None,
             numeric: Mapping[str, tuple[float, ...] | None] | None = None) -> Dataset:
    """Read ``columns`` of a CSV (header row; fields stripped of surrounding spaces).

    With ``domain`` (which must carry labels) values are encoded against it and a value outside it
    raises :class:`DatasetError`; otherwise the domain is built from the sorted distinct values.
    A numeric column (``domain`` gives it a range, or ``numeric`` names it: with its (min, max)
    or (min, max, grid points), or None for the column's own min and max) is read as numbers, clipped into the range
    (counted in ``clipped``) and put on the nearest of the grid's points (docs/numeric.md).
    ``columns=None``: the domain's attributes, else every column of the header of ``path``, else
    (no path) the bundled Adult file and its eight categorical attributes.
    """
    if columns is None and domain is not None:
        columns = domain.attrs
    elif columns is None and path is None:
        columns = ADULT_COLUMNS
    path = Path(path) if path is not None else adult_path()
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh, skipinitialspace=True)
            first = next(reader, None)
            if first is None or not any(c.strip() for c in first):
                raise DatasetError(f"{path}: no header (the file is empty or its first line is "
                                   "blank)")
            header = [h.strip() for h in first]
            rows = [r for r in reader if r and any(c.strip() for c in r)]
    except FileNotFoundError:
        raise DatasetError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DatasetError(f"{path}: cannot read CSV ({exc.__class__.__name__}: {exc})") from None
    if columns is None:  # a CSV without --columns: every column of its header
        if any(not h for h in header):
            raise DatasetError(f"{path}: header has an empty column name (column "
                               f"{[not h for h in header].index(True) + 1}); name it or pass "
                               "the columns to use")
        columns = header
    columns = tuple(columns)
    missing = [c for c in columns if c not in header]
    if missing:
        raise DatasetError(f"{path}: unknown column {missing[0]!r}; columns are: {', '.join(header)}"
                           f"{did_you_mean(missing[0], header)}")
    if len(set(columns)) != len(columns):
        raise DatasetError(f"{path}: duplicate column in {columns}")
    idx = [header.index(c) for c in columns]
    width = len(header)
    bad = next((i for i, r in enumerate(rows) if len(r) != width), None)
    if bad is not None:
        raise DatasetError(f"{path}: line {bad + 2} has {len(rows[bad])} fields, header has {width}")
    if not rows:
        raise DatasetError(f"{path}: no records")
    table = np.array(rows, dtype=object)[:, idx].astype(str)
    table = np.char.strip(table)
    cats, codes = [], []
    ranges: list[tuple[float, float] | None] = []
    values, clipped = {}, {}
    numeric = dict(numeric or {})
    unknown = [c for c in numeric if c not in columns]
    if unknown:
        raise DatasetError(f"{path}: numeric column {unknown[0]!r} is not among the columns "
                           f"{', '.join(columns)}{did_you_mean(unknown[0], columns)}")
    for j, name in enumerate(columns):
        given = domain.numeric_range(name) if domain is not None else None
        if given is not None or name in numeric:
            x = _numbers(path, name, table[:, j])
            spec = given or numeric[name] or (float(x.min()), float(x.max()))
            lo, hi = float(spec[0]), float(spec[1])
            if not lo < hi:
                raise DatasetError(f"{path}: numeric column {name!r} needs min < max (got "
                                   f"{lo:g}, {hi:g})")
            G = (domain.shape[domain.axes((name,))[0]] if domain is not None
                 else int(spec[2]) if len(spec) > 2 else DEFAULT_GRID)
            code, clipped[name] = quantize(x, lo, hi, G)
            values[name] = x
            cats.append(numeric_labels(lo, hi, G))
            codes.append(code)
            ranges.append((lo, hi))
            continue
        ranges.append(None)
        if domain is not None:
            known = domain.project((name,)).labels
            if known is None:
                raise DatasetError(f"{path}: the schema of column {name!r} has no categories")
            labels = np.array(known[0])
            order = np.argsort(labels)
            pos = np.searchsorted(labels, table[:, j], sorter=order)
            pos = np.clip(pos, 0, len(labels) - 1)
            code = order[pos]
            wrong = labels[code] != table[:, j]
            if wrong.any():
                value = plain(table[wrong, j][0])
                raise DatasetError(f"{path}: column {name!r} has value {value!r} outside the "
                                   f"configured domain (categories: {', '.join(labels)})"
                                   f"{did_you_mean(value, labels)}")
            cats.append(tuple(labels))
        else:
            uniq, code = np.unique(table[:, j], return_inverse=True)
            if len(uniq) < 2:
                raise DatasetError(f"{path}: column {name!r} has a single category")
            if len(uniq) > MAX_NUMERIC_CATEGORIES and _numeric(uniq):
                raise DatasetError(
                    f"{path}: column {name!r} looks numeric with {len(uniq):,} distinct values; "
                    f"every distinct value would be a category. Declare it numeric (schema.csv."
                    f"numeric: {{{name}: {{min: ..., max: ...}}}}, or simulate --numeric {name}; "
                    f"docs/numeric.md), bin it into at most {MAX_NUMERIC_CATEGORIES} ranges first, "
                    f"or list its categories under schema.attributes")
            cats.append(tuple(uniq.tolist()))
        codes.append(code)
    dom = Domain(columns, tuple(len(c) for c in cats), tuple(cats), tuple(ranges))
    dtype = _smallest_uint(max(dom.shape))
    return Dataset(dom, np.stack(codes, axis=1).astype(dtype), values, clipped)


def _numbers(path: Path, name: str, column: np.ndarray) -> np.ndarray:
    """A numeric column's values as floats; a missing or non-numeric one raises naming it."""
    try:
        x = column.astype(float)
    except ValueError:
        bad = next(i for i, v in enumerate(column.tolist()) if not _is_number(v))
        raise DatasetError(f"{path}: numeric column {name!r} has value {plain(column[bad])!r} on "
                           f"line {bad + 2}, not a number") from None
    if not np.all(np.isfinite(x)):
        bad = int(np.flatnonzero(~np.isfinite(x))[0])
        raise DatasetError(f"{path}: numeric column {name!r} has value {plain(column[bad])!r} on "
                           f"line {bad + 2}, not a finite number")
    return x


def _is_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def _numeric(values: np.ndarray) -> bool:
    """True when every value parses as a number (``?`` and blanks, i.e. missing, are ignored)."""
    present = [v for v in values.tolist() if v not in ("", "?")]
    return bool(present) and all(_is_number(v) for v in present)
