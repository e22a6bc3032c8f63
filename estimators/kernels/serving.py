"""What an estimate serves (docs/api.md "Estimates"): the cells (an unbiased estimate projected
onto the simplex by default, raw on request), its error bound and which quantile it is, and the
per-cell intervals (estimators/kernels/bounds.py).

>>> import numpy as np
>>> from ldpstream.estimators.kernels.domain import Domain, Factor
>>> from ldpstream.estimators.mechanism import Estimate
>>> from ldpstream.estimators.kernels.bounds import Bound
>>> f = Factor(Domain(["a"], [2]), np.array([1.2, -0.2]))
>>> e = Estimate(f, "castell", 3, 1.0, error_bound=1.4,
...              bound=Bound(1.4, np.zeros(2), np.ones(2)),
...              projected=Factor(f.domain, np.array([1.0, 0.0])))
>>> s = served_fields(e)
>>> s["cells"].tolist(), s["raw_cells"], s["error_bound"], s["raw_error_bound"]
([1.0, 0.0], [1.2, -0.2], 1.0, 1.4)
>>> s["error_bound_quantile"], s["error_bound_coverage"]
(0.95, 'calibrated')
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ldpstream.estimators.kernels.bounds import AT_LEAST
from ldpstream.estimators.mechanism import Estimate

__all__ = ["served_fields", "raw_payload", "coarsen_payload", "CELL_FIELDS", "warnings"]

#: payload fields holding one value per cell (transposed and summed with ``cells``)
CELL_FIELDS = ("cells", "raw_cells", "cells_low", "cells_high")


def _cells(values: np.ndarray, attrs: Sequence[str], domain_attrs: Sequence[str]) -> np.ndarray:
    """``values`` (axes in ``domain_attrs`` order) summed/permuted to ``attrs``."""
    values = np.asarray(values, dtype=float)
    drop = tuple(i for i, a in enumerate(domain_attrs) if a not in attrs)
    if drop:
        values = values.sum(axis=drop)
    kept = [a for a in domain_attrs if a in attrs]
    return np.transpose(values, [kept.index(a) for a in attrs]) if kept != list(attrs) \
        else values


def _finite(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def warnings(est: Estimate) -> list[str]:
    """What the answer must say about ``est`` beyond its numbers: an iterative estimate that
    stopped before converging (its ``converged`` is False); a marginal with a numeric
    attribute served without its summaries, and why (``numeric_note``: docs/numeric.md "In
    partitioned marginals")."""
    note = est.extra.get("numeric_note")
    out = [note] if isinstance(note, str) else []
    if est.converged is not False:
        return out
    gap = est.extra.get("gap")
    return out + [f"{est.method} did not converge: stopped after {est.iterations} iterations"
            + (f" with its marginals up to {gap:.3g} from their targets"
               if isinstance(gap, float) else "")
            + "; the estimate is where it stopped"]


def served_fields(est: Estimate, attrs: Sequence[str] | None = None) -> dict[str, Any]:
    """The payload fields of ``est`` for the marginal ``attrs`` (default: its own):

    * ``cells`` — the projection onto the simplex when the estimate is an unbiased one that has
      it (``projected: true``), else the estimate; ``raw_cells`` — the unprojected cells (None
      when not projected);
    * ``error_bound`` — with ``error_bound_quantile`` q set: an upper q quantile of the TVD
      between the served cells and the truth (at most 1 when the cells are a distribution);
      with q null: the expected TVD, or None; ``raw_error_bound`` — the bound of ``raw_cells``;
      ``error_bound_of`` — the estimate the bound was computed for when it is a proxy;
      ``error_bound_coverage`` — ``"calibrated"`` (Pr[TVD ≤ bound] ≈ q, measured),
      ``"at least"`` (≥ q: by construction, or a proxy bound, ``error_bound_of`` ending in
      "(proxy)", measured to over-cover: docs/estimators.md "Error bounds") or ``"noise only"``
      (≈ q for the noise of a marginal derived by a model, whose bias it does not bound:
      docs/partitioned.md "Bootstrap bounds"); None without q; ``error_bound_method`` — how
      the bound was obtained, in words (``Bound.method``; None without a bound);
    * ``cells_low`` / ``cells_high`` — per-cell ``q`` intervals for the true cells (None
      without a calibrated bound);
    * ``warnings`` — :func:`warnings` (e.g. an iterative fit that did not converge).
    """
    dom = list(est.factor.domain.attrs)
    attrs = list(dom if attrs is None else attrs)
    raw = _cells(est.factor.values, attrs, dom)
    b = est.bound
    of = est.extra.get("error_bound_of")
    out: dict[str, Any] = {
        "projected": est.projected is not None,
        "raw_cells": None,
        "error_bound": _finite(est.error_bound),
        "raw_error_bound": _finite(est.error_bound),
        "error_bound_quantile": None if b is None else float(b.level),
        "error_bound_of": of,
        "error_bound_coverage": None if b is None else (
            AT_LEAST if str(of).endswith("(proxy)") else b.coverage),
        "error_bound_method": None if b is None else b.method,
        "cells_low": None,
        "cells_high": None,
        "warnings": warnings(est),
    }
    cells = raw
    if est.projected is not None:
        cells = _cells(est.projected.values, attrs, dom)
        out["raw_cells"] = raw.tolist()
    proper = bool(np.all(cells >= 0) and abs(float(cells.sum()) - 1.0) <= 1e-9)
    if proper and est.error_bound is not None:   # the TVD of two distributions is at most 1
        out["error_bound"] = _finite(min(1.0, float(est.error_bound)))
    if b is not None:
        if len(attrs) == len(dom):
            out["cells_low"] = _cells(b.low, attrs, dom).tolist()
            out["cells_high"] = _cells(b.high, attrs, dom).tolist()
        else:   # a sub-marginal: |p_c − q_c| ≤ TVD (estimators/kernels/bounds.py coarsened)
            out["cells_low"] = np.clip(cells - b.tvd, 0.0, 1.0).tolist()
            out["cells_high"] = np.clip(cells + b.tvd, 0.0, 1.0).tolist()
    out["cells"] = cells
    return out


def raw_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """A stored payload answered with ``raw=1``: the unprojected cells and their bound (the
    per-cell intervals, for the true cells, are the same). Unchanged when not projected."""
    out = dict(payload)
    if payload.get("projected") and payload.get("raw_cells") is not None:
        out["cells"] = payload["raw_cells"]
        out["error_bound"] = payload.get("raw_error_bound")
        out["projected"] = False
    return out


def coarsen_payload(payload: dict[str, Any], drop: tuple[int, ...]) -> dict[str, Any]:
    """``raw_cells`` summed over the axes ``drop`` and the per-cell intervals of the summed
    ``cells`` (already in ``payload``) widened to cells ± ``error_bound`` (a TVD bound bounds
    every cell of a sub-marginal; estimators/kernels/bounds.py :func:`~.bounds.coarsened`)."""
    out = dict(payload)
    if payload.get("raw_cells") is not None:
        out["raw_cells"] = np.asarray(payload["raw_cells"], dtype=float).sum(axis=drop).tolist()
    eb = payload.get("error_bound")
    if payload.get("cells_low") is not None and eb is not None:
        cells = np.asarray(payload["cells"], dtype=float)
        out["cells_low"] = np.clip(cells - eb, 0.0, 1.0).tolist()
        out["cells_high"] = np.clip(cells + eb, 0.0, 1.0).tolist()
    return out
