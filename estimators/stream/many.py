"""Every marginal × estimator × window of a refresh in a few numpy calls.

:func:`estimate_many` returns what ``Mechanism.estimate`` returns for each (window, marginal,
estimator), computed the fast way where one exists:

* **batching** — for an independent-channel mechanism (``rr-ind``), the marginal tables of every
  window are grouped by (estimator, channels) and each group runs once through the batched
  kernels of estimators/kernels/batched.py (castell, truncated, ibu, rr-independent). A 37-attribute
  collection with one ε per attribute has 666 2-way marginals but only 9 channel pairs;
* **reuse** — a table identical to one seen before (the same window unchanged since the last
  refresh, or two windows holding the same reports) is not estimated again: an
  :class:`EstimateCache` passed by the caller remembers the last answer per key with a digest of
  the table it came from.

Everything else (other families, other estimators) goes through ``Mechanism.estimate_versions``
one estimate at a time. Counts are :data:`~.mechanism.VersionedCounts`; the batched path reads
the family's ``combined_counts`` (the accepted versions summed), as ``estimate_versions`` does.
A failing estimate never stops the others: its reason is in ``failures``. :func:`drift_many` does
the same for the drift tests (:mod:`.drift`), batching the
bootstrap of the pooled null variances.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ldpstream.estimators.kernels import batched
from ldpstream.estimators.kernels.bounds import Bound, product_channel_bounds, triangle
from ldpstream.estimators.kernels.domain import Factor
from ldpstream.estimators.kernels.proper import project_simplex
from ldpstream.estimators.mechanism import Estimate, Mechanism, VersionedCounts, marginal_key
from ldpstream.estimators.stream.drift import (
    BATCHED_METHODS,
    REPLICATES,
    DriftResult,
    drift_test,
    drift_tests,
    null_size,
    null_variances,
    pooled_tables,
    replicate_rng,
    table_variances,
    terms_test,
)

__all__ = ["Key", "EstimateBatch", "DriftBatch", "EstimateCache", "estimate_many", "drift_many"]

#: (window, marginal attributes, estimator)
Key = tuple[str, tuple[str, ...], str]


@dataclass(frozen=True)
class EstimateBatch:
    """``estimates`` per key; ``failures``: key → reason (``"ValueError: …"``) for the keys that
    could not be estimated; ``computed``: how many estimates were computed (the rest reused)."""

    estimates: dict[Key, Estimate]
    failures: dict[Key, str]
    computed: int


@dataclass(frozen=True)
class DriftBatch:
    """``results`` per key, ``failures`` (key → reason), ``computed`` (variances not reused)."""

    results: dict[Key, DriftResult]
    failures: dict[Key, str]
    computed: int


@dataclass
class EstimateCache:
    """The last answers per key with the digest of their inputs; held by the caller across
    refreshes (an unchanged window is not estimated again). Not locked: one cache per thread
    that refreshes (e.g. per collection)."""

    estimates: dict[Key, tuple[bytes, Estimate]] = field(default_factory=dict)
    variances: dict[Key, tuple[bytes, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)


def _digest(*parts: object) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        if isinstance(p, np.ndarray):
            h.update(str(p.shape).encode())
            h.update(np.ascontiguousarray(p, dtype=np.float64).tobytes())
        else:
            h.update(repr(p).encode())
        h.update(b"\x00")
    return h.digest()


def _counts_parts(counts: VersionedCounts) -> bytes:
    """Digest of every tensor of every version (keys and values)."""
    return _digest(*(x for v in sorted(counts) for k in sorted(counts[v])
                     for x in (v, k, np.asarray(counts[v][k]))))


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _channels(mech: Mechanism, attrs: tuple[str, ...]) -> list[np.ndarray]:
    mats = mech.product_channels(attrs)
    assert mats is not None, "only mechanisms with product channels are batched"
    return mats


def _marginal_table(mech: Mechanism, combined: Mapping[str, np.ndarray],
                    attrs: tuple[str, ...]) -> np.ndarray:
    table = mech.marginal_table(combined, attrs)
    if table is None:
        raise TypeError(f"{mech.name} has product channels but no marginal table")
    return np.asarray(table, dtype=float)


def _batched_estimates(mech: Mechanism, method: str, attrs_list: list[tuple[str, ...]],
                       tables: np.ndarray, memo: dict[bytes, Bound]) -> list[Estimate]:
    """One group (same estimator, shape and channels) through estimators/kernels/batched.py, as
    ``mech.estimate`` answers each (a mechanism with ``product_channels``). ``memo``: the
    bootstrap bound per (channels, table), shared by the estimators of one table (castell,
    truncated and ibu carry it; rr-independent adds its distance to castell)."""
    mats = mech.product_channels(attrs_list[0])
    assert mats is not None, "only mechanisms with product channels are batched"
    invs = batched.inverses(mats)
    n = tables.reshape(len(tables), -1).sum(axis=1)
    keys = [_digest(*mats, t) for t in tables]
    todo = [i for i, k in enumerate(keys) if k not in memo]
    if todo:
        for i, b in zip(todo, product_channel_bounds(tables[todo], mats)):
            memo[keys[i]] = b
    bounds = [memo[k] for k in keys]
    iters: np.ndarray | None = None
    conv: np.ndarray | None = None
    if method == "castell":
        values = batched.castell_batch(tables, invs)
    elif method == "truncated":
        values = batched.truncated_batch(tables, invs)
    elif method == "rr-independent":   # biased: castell's bound plus the distance to castell
        values = batched.rr_independent_batch(tables, invs)
        raws = batched.castell_batch(tables, invs)
        bounds = [triangle(v, u, b) for v, u, b in zip(values, raws, bounds)]
    else:
        r = batched.ibu_batch(tables, mats, invs)
        values, iters, conv = r.estimates, r.iterations, r.converged
    eps = mech.epsilon
    out = []
    for i, attrs in enumerate(attrs_list):
        dom = mech.domain.project(attrs)
        kw: dict = {"error_bound": bounds[i].tvd, "bound": bounds[i]}
        if method == "castell":
            kw["projected"] = Factor(dom, project_simplex(values[i]))
        if method in ("truncated", "ibu"):
            kw["extra"] = {"error_bound_of": "castell (proxy)"}
        if iters is not None and conv is not None:
            kw.update(iterations=int(iters[i]), converged=bool(conv[i]))
        out.append(Estimate(Factor(dom, values[i]), method, int(round(float(n[i]))), eps,
                            **kw))
    return out


def estimate_many(mech: Mechanism, counts_by_window: Mapping[str, VersionedCounts],
                  marginals: Sequence[Sequence[str]], methods: Sequence[str], *,
                  cache: EstimateCache | None = None) -> EstimateBatch:
    """Every (window, marginal, estimator) of ``counts_by_window`` × ``marginals`` ×
    ``methods``, each equal to ``mech.estimate(counts, attrs, method)`` (module docstring)."""
    estimates: dict[Key, Estimate] = {}
    failures: dict[Key, str] = {}
    todo: list[tuple[Key, bytes]] = []                       # reused within this call
    groups: dict[tuple[str, bytes], list[tuple[Key, bytes, np.ndarray]]] = {}
    singles: list[Key] = []
    seen: dict[bytes, Key] = {}
    for window, counts in counts_by_window.items():
        combined: Mapping[str, np.ndarray] | None = None
        for attrs in marginals:
            attrs = tuple(attrs)
            table: np.ndarray | None = None
            mats = mech.product_channels(attrs)
            for method in methods:
                key = (window, attrs, method)
                if mats is None or method not in BATCHED_METHODS:
                    singles.append(key)
                    continue
                try:
                    if combined is None:
                        combined = mech.combined_counts(counts)
                    if table is None:
                        table = _marginal_table(mech, combined, attrs)
                    if not float(table.sum()) > 0:
                        raise ValueError(f"no reports counted for {attrs}")
                except Exception as exc:  # noqa: BLE001 - reported per key
                    failures[key] = _reason(exc)
                    continue
                channels = _digest(*mats)
                fp = _digest(mech.name, mech.version, attrs, method, channels, table)
                if fp in seen:
                    todo.append((key, fp))
                    continue
                seen[fp] = key
                if cache is not None and key in cache.estimates and cache.estimates[key][0] == fp:
                    estimates[key] = cache.estimates[key][1]
                    continue
                groups.setdefault((method, channels), []).append((key, fp, table))
    computed = 0
    memo: dict[bytes, Bound] = {}
    for (method, _shape), items in groups.items():
        keys = [k for k, _, _ in items]
        try:
            ests = _batched_estimates(mech, method, [k[1] for k in keys],
                                      np.stack([t for _, _, t in items]), memo)
        except Exception:  # noqa: BLE001 - find the culprit one estimate at a time
            singles.extend(keys)
            continue
        computed += len(items)
        for (key, fp, _), est in zip(items, ests):
            estimates[key] = est
            if cache is not None:
                cache.estimates[key] = (fp, est)
    for key in singles:
        window, attrs, method = key
        try:
            estimates[key] = mech.estimate_versions(counts_by_window[window], attrs, method)
            computed += 1
        except Exception as exc:  # noqa: BLE001 - reported per key
            failures[key] = _reason(exc)
    for key, fp in todo:
        src = seen[fp]
        if src in estimates:
            estimates[key] = estimates[src]
            if cache is not None:
                cache.estimates[key] = (fp, estimates[src])
        else:
            failures[key] = failures.get(src, "estimate failed")
    return EstimateBatch(estimates, failures, computed)


def drift_many(mech: Mechanism,
               windows: Mapping[str, tuple[VersionedCounts, VersionedCounts]],
               current: Mapping[Key, Estimate], previous: Mapping[Key, Estimate], *,
               alpha: float = 1e-3, min_effect: float = 0.0, seed: int = 0,
               replicates: int = REPLICATES, cache: EstimateCache | None = None) -> DriftBatch:
    """:func:`~.drift.drift_test` for every key present in ``current`` and ``previous`` whose
    window has (current counts, previous counts) in ``windows``, with the pooled null variances
    of :func:`~.drift.null_variances` (one bootstrap per window × marginal, shared by its
    estimators and batched over the marginals that share channels)."""
    results: dict[Key, DriftResult] = {}
    failures: dict[Key, str] = {}
    variances: dict[Key, tuple[np.ndarray, np.ndarray]] = {}
    # (window, attrs) -> its batched estimators; grouped by channels
    tables: dict[tuple[str, tuple[str, ...]], tuple[bytes, np.ndarray, int, int, list[str]]] = {}
    groups: dict[bytes, list[tuple[str, tuple[str, ...]]]] = {}
    singles: list[Key] = []
    combined: dict[str, tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]] = {}
    for key in (k for k in current if k in previous and k[0] in windows):
        window, attrs, method = key
        mats = mech.product_channels(attrs)
        if mats is None or method not in BATCHED_METHODS:
            singles.append(key)
            continue
        wa = (window, attrs)
        if wa not in tables:
            try:
                if window not in combined:
                    cur, prev = windows[window]
                    combined[window] = (mech.combined_counts(cur), mech.combined_counts(prev))
                pooled, totals = pooled_tables(mech, *combined[window], attrs)
                n_cur, n_prev = totals[marginal_key(attrs)]
                null_size(n_cur, n_prev)
            except Exception as exc:  # noqa: BLE001 - reported per key
                failures[key] = _reason(exc)
                continue
            channels = _digest(*mats)
            tables[wa] = (channels, pooled[marginal_key(attrs)], n_cur, n_prev, [])
            groups.setdefault(channels, []).append(wa)
        channels, table, n_cur, n_prev, methods = tables[wa]
        fp = _digest(mech.name, mech.version, attrs, method, seed, replicates, n_cur, n_prev,
                     channels, table)
        if cache is not None and key in cache.variances and cache.variances[key][0] == fp:
            variances[key] = cache.variances[key][1]
        else:
            methods.append(method)
    computed = 0
    for members in groups.values():
        todo = [wa for wa in members if tables[wa][4]]
        for methods in {tuple(sorted(tables[wa][4])) for wa in todo}:
            part = [wa for wa in todo if tuple(sorted(tables[wa][4])) == methods]
            mids = [null_size(tables[wa][2], tables[wa][3]) for wa in part]
            rngs = [replicate_rng(seed, wa[1], "null", tables[wa][1]) for wa in part]
            try:
                var = table_variances(np.stack([tables[wa][1] for wa in part]),
                                      _channels(mech, part[0][1]),
                                      methods, rngs, replicates=replicates, n=mids)
            except Exception:  # noqa: BLE001 - find the culprit one key at a time
                singles.extend((wa[0], wa[1], m) for wa in part for m in methods)
                continue
            for i, wa in enumerate(part):
                channels, table, n_cur, n_prev, _ = tables[wa]
                for m in methods:
                    key = (wa[0], wa[1], m)
                    v = var[m][i]
                    variances[key] = (v * (mids[i] / n_cur), v * (mids[i] / n_prev))
                    computed += 1
                    if cache is not None:
                        fp = _digest(mech.name, mech.version, wa[1], m, seed, replicates, n_cur,
                                     n_prev, channels, table)
                        cache.variances[key] = (fp, variances[key])
    window_digest: dict[str, bytes] = {}
    for key in singles:
        window, attrs, method = key
        try:   # a family's own quantities (numeric: a mean, quantiles), in closed form
            terms = mech.drift_terms(mech.combined_counts(windows[window][0]),
                                     mech.combined_counts(windows[window][1]), attrs, method)
            if terms is not None:
                results[key] = terms_test(terms, alpha=alpha, min_effect=min_effect)
                computed += 1
                continue
        except Exception as exc:  # noqa: BLE001 - reported per key
            failures[key] = _reason(exc)
            continue
        if window not in window_digest:
            window_digest[window] = _digest(*(_counts_parts(c) for c in windows[window]))
        fp = _digest(mech.name, mech.version, attrs, method, seed, replicates,
                     window_digest[window])
        if cache is not None and key in cache.variances and cache.variances[key][0] == fp:
            variances[key] = cache.variances[key][1]
            continue
        try:
            variances[key] = null_variances(mech, *windows[window], attrs, method, seed=seed,
                                            replicates=replicates)
            computed += 1
            if cache is not None:
                cache.variances[key] = (fp, variances[key])
        except Exception as exc:  # noqa: BLE001 - reported per key
            failures[key] = _reason(exc)
    by_shape: dict[tuple[int, ...], list[Key]] = {}
    for key, (vc, _) in variances.items():
        by_shape.setdefault(np.shape(vc), []).append(key)
    for keys in by_shape.values():
        try:
            res = drift_tests(*(np.stack(x) for x in zip(*(
                (current[k].factor.values, variances[k][0], previous[k].factor.values,
                 variances[k][1]) for k in keys))), alpha=alpha, min_effect=min_effect)
            results.update(zip(keys, res))
        except Exception:  # noqa: BLE001 - find the culprit one key at a time
            for key in keys:
                try:
                    results[key] = drift_test(current[key].factor.values, variances[key][0],
                                              previous[key].factor.values, variances[key][1],
                                              alpha=alpha, min_effect=min_effect)
                except Exception as exc:  # noqa: BLE001 - reported per key
                    failures[key] = _reason(exc)
    return DriftBatch(results, failures, computed)
