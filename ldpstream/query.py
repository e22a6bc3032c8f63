"""``ldpstream estimates``: query a running worker's HTTP API.

    ldpstream estimates                         collections (GET /collections)
    ldpstream estimates adult                   the estimates stored for a collection
    ldpstream estimates adult --attrs sex,income [--method truncated] [--json]
"""
from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ldpstream.cli import CliError

TIMEOUT_S = 10.0


def fetch(url: str, path: str, params: dict[str, str] | None = None) -> Any:
    """GET ``url + path`` and decode its JSON; HTTP errors become :class:`CliError` with the
    server's ``error`` message."""
    query = "?" + urllib.parse.urlencode(params) if params else ""
    full = url.rstrip("/") + path + query
    try:
        with urllib.request.urlopen(full, timeout=TIMEOUT_S) as resp:
            return json.loads(resp.read().decode())
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read().decode())
            msg = body.get("error", str(body))
            for key in ("collections", "marginals", "estimators", "attributes"):
                if key in body:
                    msg += f" (available {key}: {', '.join(map(str, body[key]))})"
        except Exception:  # noqa: BLE001 - not JSON
            msg = f"HTTP {exc.code} {exc.reason}"
        raise CliError(msg) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CliError(f"--url: cannot reach {url} ({reason}); is a worker running? "
                       f"(`ldpstream up` or `ldpstream worker`)") from None


def _fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def _age(ts: float | None) -> str:
    if ts is None:
        return "-"
    return f"{max(0.0, time.time() - float(ts)):.1f}s ago"


def _console():
    from rich.console import Console
    return Console(file=sys.stdout, soft_wrap=True)


def print_collections(data: dict[str, Any]) -> None:
    """A table of short columns that fits 80 terminal columns, then each collection's marginals,
    estimators and windows as wrapped lines (a table cell would truncate them)."""
    from rich.table import Table
    t = Table(title="collections")
    for col in ("id", "mechanism", "version", "ε/report", "ε/day", "n", "refresh"):
        t.add_column(col, justify="right" if col in ("version", "n") else "left")
    details = []
    for c in data["collections"]:
        per_day = c.get("epsilon_per_day")
        t.add_row(c["id"], str(c.get("mechanism")), _fmt(c.get("version")),
                  _fmt(c.get("epsilon_per_record"), 3),
                  "no cap" if per_day is None else _fmt(per_day, 3),
                  "-" if c.get("n") is None else f"{c['n']:,}",
                  f"{c.get('refresh_interval_s', 0):g}s")
        details.append(f"{c['id']}: marginals "
                       f"{', '.join('×'.join(m) for m in c.get('marginals', []))}; estimators "
                       f"{', '.join(c.get('estimators', []))}; windows "
                       f"{', '.join(c.get('windows', []))}")
        if c.get("privacy_note"):
            details.append(f"{c['id']}: {c['privacy_note']}")
        details += _over_time_lines(c)
    console = _console()
    console.print(t)
    for line in details:
        console.print(line, soft_wrap=False, highlight=False, markup=False)


def _over_time_lines(c: dict[str, Any]) -> list[str]:
    """What a collection counts and, at its declared rate, ε per device per window and day
    (docs/privacy-over-time.md); its device-state warning."""
    ot = c.get("over_time") or {}
    if not ot:
        return []
    lines = []
    if ot.get("counted_by") == "device":
        lines.append(f"{c['id']}: counts devices (each once per window, at its latest report)")
    per = {w: e for w, e in (ot.get("epsilon_per_window") or {}).items() if e is not None}
    day = ot.get("epsilon_per_device_day")
    if per or day is not None:
        rate = ot.get("reports_per_day")
        lines.append(f"{c['id']}: ε per device" + (f" at {rate:g} reports/day" if rate else "")
                     + ": " + ", ".join([f"{w} {e:.3g}" for w, e in per.items()]
                                        + ([] if day is None else [f"day {day:.3g}"])))
    if ot.get("warning"):
        lines.append(f"{c['id']}: {ot['warning']}")
    return lines


def print_index(data: dict[str, Any]) -> None:
    from rich.table import Table
    t = Table(title=f"estimates of {data['collection']}")
    for col in ("attrs", "method", "window", "n", "updated"):
        t.add_column(col)
    for e in data["estimates"]:
        state = (_age(e.get("updated_at")) if e.get("available") else
                 f"failed: {e['error']}" if e.get("error") else "not yet")
        t.add_row(",".join(e["attrs"]), e["method"], str(e.get("window", "")), _fmt(e.get("n")),
                  state)
    _console().print(t)


def cell_rows(est: dict[str, Any]) -> list[tuple[tuple[str, ...], Any]]:
    """Flatten an estimate into ``(labels per attribute, value)`` rows in C order."""
    rows: list[tuple[tuple[str, ...], Any]] = []

    def walk(cells: Any, depth: int, prefix: tuple[str, ...]) -> None:
        if depth == len(est["labels"]):
            rows.append((prefix, cells))
            return
        for lab, sub in zip(est["labels"][depth], cells):
            walk(sub, depth + 1, prefix + (str(lab),))

    walk(est["cells"], 0, ())
    return rows


def drift_text(est: dict[str, Any]) -> str:
    """The drift test in one phrase, as the page says it (docs/windows.md): statistic against
    threshold, the alarm, and the total-variation change."""
    if est.get("drift_statistic") is None:
        return "drift: not measured (needs this window and the one before it)" \
            if est.get("window") != "all" else "drift: none on the all-time window"
    verdict = "ALARM" if est.get("drift_alarm") else "no alarm"
    return (f"drift: {verdict}, statistic {_fmt(est.get('drift_statistic'), 2)} against threshold "
            f"{_fmt(est.get('drift_threshold'), 2)} (TVD change {_fmt(est.get('drift_tvd'), 3)})")


def print_estimate(est: dict[str, Any]) -> None:
    from rich.table import Table
    attrs = est["attrs"]
    head = (f"{est['collection']}: {','.join(attrs)} by {est['method']}"
            + (f" over {est['window']}" if est.get("window") else "")
            + (f" (chose {est['chosen']})" if est.get("chosen") else ""))
    if est.get("marginalized_from"):
        head += f", summed from {','.join(est['marginalized_from'])}"
    info = (f"n={est.get('n')}  ε={_fmt(est.get('epsilon_per_record'), 3)} per record, "
            f"{_fmt(est.get('epsilon_per_attribute'), 3)} per attribute"
            f"  error bound={_fmt(est.get('error_bound'))}"
            + (f" (TVD q{100 * est['error_bound_quantile']:g}"
               + (f", {est['error_bound_coverage']}" if est.get("error_bound_coverage") else "")
               + ")" if est.get("error_bound_quantile") else "")
            + f"  {drift_text(est)}  updated {_age(est.get('updated_at'))}")
    if est.get("iterations") is not None:
        info += f"  iterations={est['iterations']} converged={est.get('converged')}"
    if len(attrs) == 2:
        t = Table(title=head, caption=info)
        t.add_column(f"{attrs[0]} \\ {attrs[1]}")
        for lab in est["labels"][1]:
            t.add_column(str(lab), justify="right")
        for lab, row in zip(est["labels"][0], est["cells"]):
            t.add_row(str(lab), *(_fmt(v) for v in row))
    else:
        t = Table(title=head, caption=info)
        for a in attrs:
            t.add_column(a)
        t.add_column("p", justify="right")
        for labels, v in cell_rows(est):
            t.add_row(*labels, _fmt(v))
    _console().print(t)
    if est.get("privacy_note"):
        print(est["privacy_note"])


def print_alerts(url: str) -> None:
    """The worker's firing alerts (``GET /ui/alerts``: its Prometheus, ``up --obs``), one line
    each; nothing when it has no Prometheus."""
    try:
        ans = fetch(url, "/ui/alerts")
    except CliError as exc:  # an older worker, or its Prometheus not answering
        print(f"alerts: {exc}")
        return
    if not ans.get("prometheus"):
        return
    alerts = ans.get("alerts") or []
    if not alerts:
        print(f"alerts: none firing (Prometheus {ans['prometheus']})")
    for a in alerts:
        print(f"alert firing: {a.get('name')} ({a.get('severity') or '-'}): {a.get('summary') or ''}")


def main(args: Any) -> int:
    url = args.url
    if not args.collection:
        if args.attrs or args.method or args.window:
            raise CliError("collection: name a collection to use --attrs/--method/--window")
        data = fetch(url, "/collections")
        print(json.dumps(data, indent=2)) if args.json else print_collections(data)
        if not args.json:
            print_alerts(url)
        return 0
    cid = urllib.parse.quote(args.collection, safe="")
    params: dict[str, str] = {}
    if args.method:
        params["method"] = args.method
    if args.window:
        params["window"] = args.window
    if args.attrs:
        params["attrs"] = args.attrs
        data = fetch(url, f"/estimates/{cid}", params)
        print(json.dumps(data, indent=2)) if args.json else print_estimate(data)
    else:
        data = fetch(url, f"/estimates/{cid}", params)
        print(json.dumps(data, indent=2)) if args.json else print_index(data)
    return 0
