"""The semantic checks of the config's validators (docs/configuration.md): schema → domain,
marginals → attribute tuples, windows → :class:`~ldpstream.windows.Window` s. Each failure
is :func:`~ldpstream.config_errors.problems` with the offending item's path suffix."""
from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from ldpstream.config_errors import got, problems
from ldpstream.datasets import ADULT_COLUMNS, DatasetError, adult_path, load_csv
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.kernels.numeric import DEFAULT_GRID, numeric_labels
from ldpstream.suggest import did_you_mean
from ldpstream.windows import BucketPolicy, Window, parse_window

__all__ = ["MAX_COARSE_PER_WINDOW", "domain_of", "marginals_of", "windows_of"]

#: the most coarse buckets one window may span (a refresh reads at most twice this many per
#: shard and version, plus the fine buckets at the edges)
MAX_COARSE_PER_WINDOW = 10_000


def windows_of(names: Any, bucket_s: float | None) -> tuple[Window, ...]:
    """Parse ``windows`` (durations or ``all``): no duplicates and, when ``bucket_s`` passed its
    own check, each a whole number of buckets and at most :data:`MAX_COARSE_PER_WINDOW` coarse
    buckets long."""
    if isinstance(names, tuple) and all(isinstance(w, Window) for w in names):
        names = [w.name for w in names]
    if not isinstance(names, (list, tuple)):
        problems(("", f"must be a list (got {got(names)})"))
    if not names:
        problems(("", "must not be empty"))
    out: list[Window] = []
    found: list[tuple[str, str]] = []
    for j, name in enumerate(names):
        try:
            w = parse_window(name)
        except ValueError as exc:
            found.append((f"[{j}]", str(exc)))
            continue
        if any(o.name == w.name or (o.seconds == w.seconds) for o in out):
            found.append((f"[{j}]", f"window {name!r} is listed twice"))
            continue
        if w.seconds is not None and bucket_s is not None:
            q = w.seconds / bucket_s
            if abs(q - round(q)) > 1e-9 or round(q) < 1:
                found.append((f"[{j}]", f"{name} is not a whole number of buckets of "
                                        f"bucket_s = {got(bucket_s)} s"))
                continue
            policy = BucketPolicy(bucket_s, (w,))
            if w.seconds / policy.coarse_s > MAX_COARSE_PER_WINDOW:
                found.append((f"[{j}]", f"{name} spans more than {MAX_COARSE_PER_WINDOW} coarse "
                                        f"buckets of {got(policy.coarse_s)} s; raise bucket_s"))
                continue
        out.append(w)
    if found:
        problems(*found)
    return tuple(out)


def domain_of(attributes: Mapping[str, Any] | None,
              csv: tuple[str | None, list[str] | None] | None, base_dir: Path,
              numeric: Mapping[str, Any] | None = None) -> tuple[Domain, str]:
    """The domain of a schema (``attributes`` or ``csv`` = (path, columns), its ``numeric``
    columns) and its source."""
    if attributes is not None:
        return _attributes_domain(attributes), "attributes"
    assert csv is not None
    path, columns = csv
    if path is None:
        file = adult_path()
        cols = tuple(columns) if columns is not None else ADULT_COLUMNS
    else:
        file = Path(path) if Path(path).is_absolute() else base_dir / path
        if columns is None:
            problems((".csv.columns", "required when csv.path is given"))
        cols = tuple(columns)
    specs = {c: numeric_spec(f".csv.numeric.{c}", v) for c, v in (numeric or {}).items()}
    missing = [c for c in specs if c not in cols]
    if missing:
        problems((f".csv.numeric.{missing[0]}", f"not among the columns {', '.join(cols)}"
                                                f"{did_you_mean(missing[0], cols)}"))
    try:
        dom = _load_domain(str(file), cols, tuple(sorted(specs.items())))
    except DatasetError as exc:
        field_ = "columns" if "unknown column" in str(exc) else "path"
        problems((f".csv.{field_}", str(exc)))
    return dom, f"csv:{file}"


def numeric_spec(path: str, spec: Any) -> tuple[float, float, int]:
    """``{min: a, max: b, grid: G}`` (grid optional) → (a, b, G); each bad field named."""
    if not isinstance(spec, Mapping):
        problems((path, f"must be {{min: a, max: b}} (got {got(spec)})"))
    extra = [k for k in spec if k not in ("min", "max", "grid")]
    if extra:
        problems((f"{path}.{extra[0]}", "unknown field (allowed: min, max, grid)"))
    found = []
    for k in ("min", "max"):
        v = spec.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or abs(v) == float("inf"):
            found.append((f"{path}.{k}", f"must be a finite number (got {got(v)})"))
    g = spec.get("grid", DEFAULT_GRID)
    if isinstance(g, bool) or not isinstance(g, int) or not 3 <= g <= 65_536:
        found.append((f"{path}.grid", f"must be an integer in 3..65536 (got {got(g)})"))
    if found:
        problems(*found)
    if not spec["min"] < spec["max"]:
        problems((path, f"min must be below max (got {spec['min']!r}, {spec['max']!r})"))
    return float(spec["min"]), float(spec["max"]), int(g)


def _attributes_domain(attributes: Mapping[str, Any]) -> Domain:
    cats: dict[str, Sequence[str]] = {}
    ranges: list[tuple[float, float] | None] = []
    for name, values in attributes.items():
        p = f".attributes.{name}"
        if not name.strip() or "|" in name:
            problems((p, "attribute names must be non-empty and contain no '|'"))
        if isinstance(values, Mapping):
            if set(values) != {"numeric"}:
                problems((p, "a numeric attribute is {numeric: {min: a, max: b}} (got keys "
                             f"{', '.join(map(str, values))})"))
            lo, hi, g = numeric_spec(f"{p}.numeric", values["numeric"])
            cats[name] = numeric_labels(lo, hi, g)
            ranges.append((lo, hi))
            continue
        if not isinstance(values, list):
            problems((p, f"must be a list of categories or {{numeric: {{min: a, max: b}}}} (got "
                         f"{got(values)})"))
        ranges.append(None)
        out = []
        for k, v in enumerate(values):
            if isinstance(v, bool) or v is None:
                problems((f"{p}[{k}]", f"category must be a string (got {v!r}; quote it: YAML "
                                       f"reads yes/no/on/off/null as non-strings)"))
            if not isinstance(v, (str, int, float)):
                problems((f"{p}[{k}]", f"category must be a string (got {v!r})"))
            out.append(str(v))
        if len(out) < 2:
            problems((p, f"needs at least 2 categories (got {len(out)})"))
        dup = next((c for c in out if out.count(c) > 1), None)
        if dup is not None:
            problems((p, f"category {dup!r} is listed twice"))
        cats[name] = out
    return Domain(tuple(cats), tuple(len(v) for v in cats.values()),
                  tuple(tuple(v) for v in cats.values()), tuple(ranges))


_DOMAIN_CACHE: dict[tuple[Any, ...], Domain] = {}


def _load_domain(file: str, columns: tuple[str, ...],
                 numeric: tuple[tuple[str, tuple[float, float, int]], ...] = ()) -> Domain:
    try:
        mtime = os.stat(file).st_mtime
    except OSError:
        mtime = -1.0
    key = (file, columns, mtime, numeric)
    if key not in _DOMAIN_CACHE:
        _DOMAIN_CACHE[key] = load_csv(file, columns, numeric=dict(numeric)).domain
    return _DOMAIN_CACHE[key]


def marginals_of(spec: Any, domain: Domain) -> list[tuple[str, ...]]:
    """``marginals``: a list of attribute lists (a bare name is a 1-way marginal; duplicates
    collapse), or ``{all_ways_up_to: W}`` for every marginal of 2..W attributes."""
    attrs = domain.attrs
    if isinstance(spec, Mapping):
        extra = [k for k in spec if k != "all_ways_up_to"]
        if extra:
            problems((f".{extra[0]}", "unknown field (allowed: all_ways_up_to)"))
        if "all_ways_up_to" not in spec:
            problems((".all_ways_up_to", "required field missing"))
        w = spec["all_ways_up_to"]
        if isinstance(w, bool) or not isinstance(w, int) or not 2 <= w <= len(attrs):
            problems((".all_ways_up_to", f"must be an integer in 2..{len(attrs)} (the number of "
                                         f"attributes; got {w!r})"))
        return [c for k in range(2, w + 1) for c in itertools.combinations(attrs, k)]
    if not isinstance(spec, list) or not spec:
        problems(("", f"must be a non-empty list of attribute lists or {{all_ways_up_to: W}} "
                      f"(got {spec!r})"))
    out: list[tuple[str, ...]] = []
    found: list[tuple[str, str]] = []
    for j, m in enumerate(spec):
        if isinstance(m, str):
            m = [m]
        if not isinstance(m, list) or not m or not all(isinstance(a, str) for a in m):
            found.append((f"[{j}]", f"must be a non-empty list of attribute names (got {m!r})"))
            continue
        unknown = [a for a in m if a not in attrs]
        if unknown:
            found.append((f"[{j}]", f"unknown attribute{'s' if len(unknown) > 1 else ''} "
                                    f"{', '.join(repr(a) for a in unknown)} (attributes: "
                                    f"{', '.join(attrs)}){did_you_mean(unknown[0], attrs)}"))
        elif len(set(m)) != len(m):
            found.append((f"[{j}]", f"lists an attribute twice ({m})"))
        elif tuple(m) not in out:
            out.append(tuple(m))
    if found:
        problems(*found)
    return out
