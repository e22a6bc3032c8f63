"""The live page of a worker (docs/api.md, "The live page"): ``GET /`` serves it, ``GET /ui/<file>``
its static assets (agents/serve/static/, installed with the package), ``GET /ui/history/<id>`` the recent
history of one stored estimate.

The page reads the same API as everyone else (``/collections``, ``/estimates``, ``/healthz``); the
only thing it needs that the API did not keep is an estimate's past: each worker samples the
estimates stored in Redis once per refresh interval (:class:`History`, in memory, the last
:data:`HISTORY_POINTS` refreshes per estimate) and answers them per marginal, method and window.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from importlib import resources
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from faust import web

from ldpstream.agents import metrics
from ldpstream.agents.ingest.clients import REDIS_ERRORS
from ldpstream.agents.refresh.payloads import attr_labels, json_cells, none_to_nan
from ldpstream.agents.refresh.refresher import Refresher
from ldpstream.agents.serve.selection import (
    covering_marginal,
    marginalize_payload,
    match_marginal,
    parse_attrs,
    transpose_payload,
)
from ldpstream.agents.worker import Worker
from ldpstream.alerts import firing_alerts, prometheus_url

log = logging.getLogger(__name__)

#: refreshes kept per estimate (at the demo's 5 s interval: the last 30 minutes)
HISTORY_POINTS = 360
#: the fields of a stored estimate that a history point keeps (besides its cells; first the time)
POINT_FIELDS = ("updated_at", "n", "error_bound", "drift_tvd", "drift_statistic",
                "drift_threshold", "drift_alarm", "version", "versions", "error", "empty",
                "numeric")
#: the page's files (agents/serve/static/) and their content types; nothing else is served
ASSETS = {"index.html": "text/html", "app.js": "text/javascript", "charts.js": "text/javascript",
          "api.js": "text/javascript", "style.css": "text/css"}

Key = tuple[str, str, str, tuple[str, ...]]  # collection, window, method, stored marginal


class History:
    """The last ``maxlen`` refreshes of every stored estimate (one point per ``updated_at``).

    A point is kept as a tuple of :data:`POINT_FIELDS` and an array of its cells (the demo's
    60 estimates over 360 refreshes: 15 MB, measured with tracemalloc), handed out as a dict; a
    numeric estimate's point keeps its summary (:func:`numeric_point`) and no cells."""

    def __init__(self, maxlen: int = HISTORY_POINTS) -> None:
        self.maxlen = maxlen
        self._points: dict[Key, deque[tuple[tuple[Any, ...], np.ndarray | None]]] = {}

    def record(self, payloads: Iterable[Mapping[str, Any]]) -> int:
        """Append the payloads not seen yet (a new ``updated_at``); returns how many."""
        added = 0
        for p in payloads:
            key = (str(p["collection"]), str(p["window"]), str(p["method"]), tuple(p["attrs"]))
            points = self._points.setdefault(key, deque(maxlen=self.maxlen))
            if points and points[-1][0][0] == p.get("updated_at"):  # POINT_FIELDS[0]
                continue
            # exactly the stored floats (a null cell is NaN); None cells (a failure) stay None;
            # a numeric estimate keeps its summary instead of its input grid's cells
            fields = {**p, "numeric": numeric_point(p.get("numeric"))}
            cells = None if fields["numeric"] else p.get("cells")
            points.append((tuple(fields.get(f) for f in POINT_FIELDS),
                           None if cells is None else np.array(none_to_nan(cells),
                                                               dtype=float)))
            added += 1
        return added

    def points(self, key: Key) -> list[dict[str, Any]]:
        return [{**dict(zip(POINT_FIELDS, values)), "cells": cells}
                for values, cells in self._points.get(key, ())]


def numeric_point(numeric: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What a history point keeps of a numeric estimate's summary: the means and quantiles with
    their intervals (per category), not the histogram or the CDF."""
    if not numeric:
        return None
    keep = ("mean", "quantiles", "w1_bound")
    out: dict[str, Any] = {k: numeric[k] for k in keep if k in numeric}
    if "categories" in numeric:
        out["categories"] = [{k: r[k] for k in ("category", "share", *keep) if k in r}
                             for r in numeric["categories"]]
    return out


def history_answer(points: Sequence[Mapping[str, Any]], stored: Sequence[str],
                   attrs: Sequence[str], labels: list[list[str]]) -> list[dict[str, Any]]:
    """The points as JSON, their cells summed/transposed from the ``stored`` marginal to ``attrs``
    (as ``GET /estimates`` answers the same query)."""
    out = []
    for p in points:
        point = {f: p[f] for f in POINT_FIELDS}
        if p["cells"] is None:
            point["cells"] = None
        else:
            view = {"attrs": list(stored), "labels": labels,
                    "cells": json_cells(p["cells"])}
            if len(stored) > len(attrs):
                view = marginalize_payload(view, attrs)
                point["numeric"] = None   # per category: not the sub-marginal's (as /estimates)
            point["cells"] = transpose_payload(view, attrs)["cells"]
        out.append(point)
    return out


def stored_marginal(coll: Any, attrs: Sequence[str]) -> tuple[str, ...] | None:
    """The stored marginal that ``GET /estimates`` answers ``attrs`` from, or None."""
    if len(set(attrs)) != len(attrs):
        return None
    return match_marginal(coll.marginals, attrs) or covering_marginal(coll.marginals, attrs)


def read_asset(name: str) -> bytes:
    """One of the page's files (agents/serve/static/, package data)."""
    return resources.files(__package__).joinpath("static", name).read_bytes()


# --- views and the sampler ----------------------------------------------------------------------
def install(app: Any, worker: Worker) -> History:
    """Add the page, its assets and ``/ui/history`` to the faust ``app``, and one sampling timer
    per collection (every ``refresh_interval_s``)."""
    ctx = worker.ctx
    history = History()

    @app.page("/", name="ldp_page")
    class Page(web.View):
        async def get(self, request: web.Request) -> web.Response:
            return self.bytes(read_asset("index.html"),
                              headers={"Content-Type": "text/html; charset=utf-8",
                                       "Cache-Control": "no-cache"})

    @app.page("/ui/alerts", name="ldp_page_alerts")
    class AlertsView(web.View):
        """The firing alerts of ``$LDP_PROMETHEUS_URL`` (``up --obs``; docs/dashboards.md);
        registered before ``/ui/{name}``, which would take the path."""

        async def get(self, request: web.Request) -> web.Response:
            url = prometheus_url()
            if url is None:
                return self.json({"prometheus": None, "alerts": []})
            try:
                alerts = await asyncio.to_thread(firing_alerts, url, 2.0)
            except (OSError, ValueError, KeyError) as exc:
                return self.error(503, f"Prometheus at {url} does not answer: {exc}",
                                  prometheus=url)
            return self.json({"prometheus": url, "alerts": alerts})

    @app.page("/ui/{name}", name="ldp_page_asset")
    class Asset(web.View):
        async def get(self, request: web.Request, name: str) -> web.Response:
            ctype = ASSETS.get(name)
            if ctype is None:
                return self.error(404, f"no page asset {name!r}", assets=sorted(ASSETS))
            return self.bytes(read_asset(name),
                              headers={"Content-Type": f"{ctype}; charset=utf-8",
                                       "Cache-Control": "no-cache"})

    @app.page("/ui/history/{collection}", name="ldp_page_history")
    class HistoryView(web.View):
        async def get(self, request: web.Request, collection: str) -> web.Response:
            coll = ctx.config.collections.get(collection)
            if coll is None:
                return self.error(404, f"unknown collection {collection!r}",
                                  collections=sorted(ctx.config.collections))
            attrs = parse_attrs(request.query.get("attrs"))
            if attrs is None:
                return self.error(400, "attrs: give the attributes of one marginal, e.g. "
                                       "attrs=" + ",".join(coll.marginals[0]))
            method = request.query.get("method") or coll.estimators[0]
            if method not in coll.estimators:
                return self.error(404, f"method {method!r} is not configured for collection "
                                       f"{collection!r}", estimators=list(coll.estimators))
            window = request.query.get("window") or coll.windows[0].name
            if coll.window(window) is None:
                return self.error(404, f"window {window!r} is not configured for collection "
                                       f"{collection!r}", windows=[w.name for w in coll.windows])
            stored = stored_marginal(coll, attrs)
            if stored is None:
                return self.error(404, f"attrs {','.join(attrs)}: not the attributes of a "
                                       f"configured marginal of collection {collection!r}, nor "
                                       f"distinct ones of one",
                                  marginals=[",".join(m) for m in coll.marginals])
            why = ctx.collections[collection].current.check_marginal(attrs, method) if len(
                stored) > len(attrs) else None
            if why is not None:   # as /estimates: e.g. the mean of a categorical attribute
                return self.error(400, f"attrs {','.join(attrs)} with {method!r}: {why}",
                                  marginals=[",".join(m) for m in coll.marginals])
            try:  # since: only the points after it (the page polls for what is new)
                since = float(request.query.get("since", "-inf"))
            except ValueError:
                return self.error(400, f"since: a unix time in seconds, got "
                                       f"{request.query.get('since')!r}")
            points = [p for p in history.points((collection, window, method, tuple(stored)))
                      if p["updated_at"] > since]
            labels = attr_labels(ctx.collections[collection].current, stored)
            out_labels = [labels[list(stored).index(a)] for a in attrs]
            return self.json({"collection": collection, "attrs": list(attrs), "method": method,
                              "window": window, "labels": out_labels,
                              "capacity": history.maxlen,
                              "points": history_answer(points, stored, attrs, labels)})

    for cid, coll in ctx.config.collections.items():
        app.timer(float(coll.refresh_interval_s), name=f"ldp-page-history-{cid}")(
            _sampler(worker.refresher, history, cid))
    return history


def _sampler(refresher: Refresher, history: History, cid: str):
    async def _sample() -> None:
        try:
            history.record(await refresher.stored_payloads(cid))
        except REDIS_ERRORS as exc:  # Redis down: /healthz and the page's other reads show it
            metrics.PAGE_SAMPLE_ERRORS.labels(cid).inc()
            log.warning("page history of %s not sampled: %s: %s", cid,
                        exc.__class__.__name__, exc)
        except Exception:  # noqa: BLE001 - a faust timer that raises crashes the whole app
            metrics.PAGE_SAMPLE_ERRORS.labels(cid).inc()
            log.exception("page history of %s not sampled", cid)
    _sample.__name__ = _sample.__qualname__ = f"page_history_{cid}"
    return _sample
