"""What a refresh writes for each estimate (docs/api.md, "Estimates"): the payload of one marginal ×
estimator × window, built from the counts as a pure function (:func:`refresh_payloads`), and the
JSON conversions of its cells that the API and the live page read back."""
from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

import numpy as np

from ldpstream.agents.refresh.bucket_reader import WindowCounts
from ldpstream.estimators.kernels.serving import served_fields
from ldpstream.estimators.mechanism import Estimate, Mechanism
from ldpstream.estimators.stream.many import EstimateCache, drift_many, estimate_many
from ldpstream.privacy import epsilon_fields
from ldpstream.windows import Window

log = logging.getLogger(__name__)


def nan_to_none(obj: Any) -> Any:
    if isinstance(obj, list):
        return [nan_to_none(v) for v in obj]
    return obj if (obj is None or math.isfinite(obj)) else None


def none_to_nan(obj: Any) -> Any:
    if isinstance(obj, list):
        return [none_to_nan(v) for v in obj]
    return float("nan") if obj is None else obj


def json_cells(values: np.ndarray) -> list:
    vals = np.asarray(values, dtype=float)
    return vals.tolist() if np.isfinite(vals).all() else nan_to_none(vals.tolist())


def attr_labels(mechanism: Mechanism, attrs: Sequence[str]) -> list[list[str]]:
    """The labels of the cells of an estimate of ``attrs`` (:meth:`Mechanism.cell_domain`)."""
    dom = mechanism.cell_domain().project(attrs)
    if dom.labels is not None:
        return [list(lab) for lab in dom.labels]
    return [[str(i) for i in range(s)] for s in dom.shape]


def estimate_payload(collection: Any, mechanism: Mechanism, est: Estimate,
                     attrs: Sequence[str], method: str, window: Window, now: float,
                     versions: Sequence[int]) -> dict[str, Any]:
    """One estimate as the JSON payload stored in Redis and served by ``GET /estimates``."""
    attrs = tuple(attrs)
    served = served_fields(est, attrs)   # projected cells, the bound and its quantile
    extra = dict(est.extra or {})
    chosen = extra.get("chosen")
    if chosen is None and method.startswith("hybrid"):
        chosen = extra.get("method")
    return {
        "collection": collection.id,
        "attrs": list(attrs),
        "method": method,
        "window": window.name,
        "window_s": window.seconds,
        "cells": json_cells(served.pop("cells")),
        "labels": attr_labels(mechanism, attrs),
        "n": int(est.n),
        **epsilon_fields(collection, mechanism, float(est.epsilon)),
        **served,
        "updated_at": float(now),
        "iterations": None if est.iterations is None else int(est.iterations),
        "converged": None if est.converged is None else bool(est.converged),
        "chosen": None if chosen is None else str(chosen),
        "version": int(mechanism.version),
        "versions": sorted(int(v) for v in versions),
        **mechanism.summary_fields(est),   # numeric: the mean, quantiles, CDF band, W1 bound
    }


def _stub(collection: Any, attrs: Sequence[str], method: str, window: Window,
          now: float, **fields: Any) -> dict[str, Any]:
    return {"collection": collection.id, "attrs": list(attrs), "method": method,
            "window": window.name, "window_s": window.seconds, "cells": None,
            "updated_at": float(now), **fields}


NO_DRIFT = {"drift_tvd": None, "drift_statistic": None, "drift_threshold": None,
            "drift_alarm": False, "drift_detail": None}
#: suffix of the name under which a window's previous range is read and estimated
PREVIOUS = "/previous"


def refresh_payloads(collection: Any, mechanism: Mechanism, reads: Mapping[str, WindowCounts],
                     now: float, cache: EstimateCache) -> tuple[list[dict[str, Any]], int]:
    """Every configured estimator on every configured marginal for every configured window, and
    each finite window's drift against its previous window (estimators/stream/many.py: batched over the
    marginals, unchanged tables reused through ``cache``). ``reads`` holds each window's counts
    and, under ``<window>/previous``, its previous range's.

    Per (window, marginal, estimator) one payload: the estimate with its drift (tvd, calibrated
    statistic, threshold, alarm; :data:`NO_DRIFT` when the previous window holds no report); a
    failure (``error`` = the reason) when the estimator raised; ``empty`` when the window holds no
    report. Returns the payloads and how many estimates and variances were computed (not
    reused)."""
    counts = {name: wc.counts for name, wc in reads.items() if wc.n > 0}
    batch = estimate_many(mechanism, counts, collection.marginals, collection.estimators,
                          cache=cache)
    pairs = {w.name: (counts[w.name], counts[w.name + PREVIOUS]) for w in collection.windows
             if w.name in counts and w.name + PREVIOUS in counts}
    current = {k: e for k, e in batch.estimates.items() if not k[0].endswith(PREVIOUS)}
    previous = {(k[0].removesuffix(PREVIOUS), k[1], k[2]): e
                for k, e in batch.estimates.items() if k[0].endswith(PREVIOUS)}
    drift = drift_many(mechanism, pairs, current, previous, alpha=collection.drift_alpha,
                       min_effect=collection.drift_min_effect, cache=cache)
    out: list[dict[str, Any]] = []
    for w in collection.windows:
        versions = sorted(reads[w.name].counts)
        for attrs in collection.marginals:
            for method in collection.estimators:
                key = (w.name, tuple(attrs), method)
                if w.name not in counts:
                    out.append(_stub(collection, attrs, method, w, now, n=0, empty=True))
                elif key in batch.failures:
                    log.warning("refresh %s: %s on %s (%s) failed: %s", collection.id, method,
                                attrs, w.name, batch.failures[key])
                    out.append(_stub(collection, attrs, method, w, now,
                                     error=batch.failures[key]))
                else:
                    p = estimate_payload(collection, mechanism, current[key], attrs, method, w,
                                         now, versions)
                    res = drift.results.get(key)
                    p.update(NO_DRIFT if res is None else {
                        "drift_tvd": res.tvd, "drift_statistic": res.statistic,
                        "drift_threshold": res.threshold, "drift_alarm": res.alarm,
                        "drift_detail": list(res.detail) or None})
                    if key in drift.failures:
                        log.warning("refresh %s: drift of %s on %s (%s) not measured: %s",
                                    collection.id, method, attrs, w.name, drift.failures[key])
                        p["drift_error"] = drift.failures[key]
                    out.append(p)
    return out, batch.computed + drift.computed


