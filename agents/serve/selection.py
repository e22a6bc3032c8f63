"""Choosing and reshaping a stored estimate for a request (docs/api.md, "Estimates"): the
configured marginal that answers ``attrs=``, a sub-marginal summed from a larger one, and the axes
in the order asked. Pure functions of the stored payloads, shared by the API (agents/serve/web.py)
and the live page (agents/serve/ui.py)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ldpstream.agents.refresh.payloads import json_cells
from ldpstream.estimators.kernels.serving import CELL_FIELDS, coarsen_payload


def parse_attrs(text: str | None) -> tuple[str, ...] | None:
    """``"a, b"`` → ``("a", "b")``; empty → None."""
    if text is None:
        return None
    attrs = tuple(a.strip() for a in text.split(",") if a.strip())
    return attrs or None


def match_marginal(configured: Sequence[Sequence[str]], attrs: Sequence[str]) -> tuple[str, ...] | None:
    """The configured marginal with the same attribute set as ``attrs`` (any order), or None."""
    want = set(attrs)
    for m in configured:
        if len(m) == len(attrs) and set(m) == want:
            return tuple(m)
    return None


def covering_marginal(configured: Sequence[Sequence[str]],
                      attrs: Sequence[str]) -> tuple[str, ...] | None:
    """The smallest configured marginal containing every attribute of ``attrs`` (the first in
    config order among equals), or None."""
    want = set(attrs)
    found = [tuple(m) for m in configured if want <= set(m)]
    return min(found, key=len) if found else None


def marginalize_payload(payload: dict[str, Any], attrs: Sequence[str]) -> dict[str, Any]:
    """The payload of a sub-marginal: cells summed over the attributes not in ``attrs``, in the
    stored order, with ``marginalized_from`` naming the stored marginal. Summing is linear, so an
    unbiased estimate stays unbiased and a proper one proper; an L1/TVD error bound of the stored
    marginal bounds the sub-marginal's too (marginalizing never increases the L1 distance)."""
    stored = list(payload["attrs"])
    keep = [i for i, a in enumerate(stored) if a in set(attrs)]
    drop = tuple(i for i in range(len(stored)) if i not in keep)
    cells = np.array(payload["cells"], dtype=float)  # a null cell (not finite) becomes NaN
    out = dict(payload)
    out["attrs"] = [stored[i] for i in keep]
    out["labels"] = [payload["labels"][i] for i in keep]
    out["cells"] = json_cells(cells.sum(axis=drop))
    out["marginalized_from"] = stored
    if out.pop("numeric", None) is not None:   # per category: not the attribute's own summary
        out["warnings"] = [*(payload.get("warnings") or []),
                           f"summed from {','.join(stored)}: the per-category mean, quantiles "
                           f"and bounds do not carry over; configure the marginal "
                           f"[{', '.join(out['attrs'])}] for its own"]
    return coarsen_payload(out, drop)


def transpose_payload(payload: dict[str, Any], attrs: Sequence[str]) -> dict[str, Any]:
    """Reorder an estimate payload's axes (cells and labels) to ``attrs``."""
    stored = list(payload["attrs"])
    attrs = list(attrs)
    if stored == attrs:
        return dict(payload)
    perm = [stored.index(a) for a in attrs]
    out = dict(payload)
    out["attrs"] = attrs
    for name in CELL_FIELDS:
        if payload.get(name) is not None:
            out[name] = np.transpose(np.asarray(payload[name], dtype=object), perm).tolist()
    out["labels"] = [payload["labels"][i] for i in perm]
    return out
