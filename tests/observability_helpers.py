"""Helpers for the observability end-to-end test: a real Prometheus (Debian package,
``/usr/bin/prometheus``) as a child process, the production alert rules with only their ``for:``
hold times shortened, the dashboard's PromQL targets, and Grafana-style template resolution.

Nothing here fakes Prometheus: queries go through its HTTP API (``/api/v1/query``,
``/api/v1/query_range``, ``/api/v1/label/<name>/values``, ``/api/v1/alerts``).
"""
from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import yaml

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "dashboards" / "prometheus" / "rules" / "ldpstream.rules.yml"
GRAFANA_DIR = ROOT / "dashboards" / "grafana" / "dashboards"
DASHBOARD = GRAFANA_DIR / "ldpstream.json"

#: The one substitution applied to the production rules for the e2e test: every ``for: <dur>``
#: line becomes ``for: <hold>``. Expressions, labels and annotations stay byte-identical.
FOR_LINE = re.compile(r"^(?P<indent>\s+)for:\s*\S+\s*$", re.MULTILINE)

_RUNNING: list["PrometheusServer"] = []


def find_prometheus() -> str:
    """Path of the ``prometheus`` server binary (Debian package ``prometheus``); a clear error
    when it is missing (scripts/bootstrap.sh installs it)."""
    path = os.environ.get("LDP_PROMETHEUS_BIN") or shutil.which("prometheus")
    if not path and os.path.exists("/usr/bin/prometheus"):
        path = "/usr/bin/prometheus"
    if not path:
        raise AssertionError("prometheus server binary missing: run scripts/bootstrap.sh "
                             "(apt-get install prometheus provides /usr/bin/prometheus and promtool)")
    return path


def _scale_ranges(expr: str, ranges: dict[str, str]) -> str:
    return re.sub(r"\[(\w+)\]", lambda m: f"[{ranges.get(m.group(1), m.group(1))}]", expr)


def short_hold_rules(src: Path = RULES, hold: str = "5s",
                     ranges: dict[str, str] | None = None) -> str:
    """The production rule file text with every ``for:`` hold time replaced by ``hold`` and, in
    the ``expr`` of every rule, each range selector ``[<from>]`` named in ``ranges`` replaced by
    ``[<to>]`` (e.g. ``{"1m": "15s"}``: the same rules on a faster clock).

    Checks that the result differs from the source only there (same alerts, same ``expr`` up to
    those ranges, same labels and annotations)."""
    ranges = ranges or {}
    text = src.read_text()
    out = FOR_LINE.sub(lambda m: f"{m.group('indent')}for: {hold}", text)
    if ranges:
        a = yaml.safe_load(out)
        for group in a["groups"]:
            for rule in group["rules"]:
                rule["expr"] = _scale_ranges(rule["expr"], ranges)
        out = yaml.safe_dump(a, sort_keys=False)
    a, b = yaml.safe_load(text), yaml.safe_load(out)
    for ga, gb in zip(a["groups"], b["groups"], strict=True):
        for ra, rb in zip(ga["rules"], gb["rules"], strict=True):
            ra, rb = dict(ra), dict(rb)
            had_for = "for" in ra
            ra.pop("for", None)
            got_for = rb.pop("for", None)
            ra["expr"] = _scale_ranges(ra["expr"], ranges)
            assert ra == rb, f"substitution changed more than for: in {ra.get('alert')}"
            assert (got_for == hold) if had_for else got_for is None
    return out


def prometheus_config(targets: list[str], rule_file: str, *, interval: str = "1s",
                      job: str = "ldpstream-workers") -> dict[str, Any]:
    """A Prometheus config scraping ``targets`` (host:port of workers' ``/metrics``)."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "scrape_timeout": interval},
        "rule_files": [rule_file],
        "scrape_configs": [{"job_name": job, "metrics_path": "/metrics",
                            "static_configs": [{"targets": targets}]}],
    }


class PrometheusServer:
    """``prometheus`` on a loopback port with a tmp TSDB; killed (process group) on stop."""

    def __init__(self, workdir: Path, config: dict[str, Any], port: int) -> None:
        self.workdir = Path(workdir)
        self.port = port
        self.config_path = self.workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = self.workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> "PrometheusServer":
        binary = find_prometheus()
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.config_path}",
             f"--storage.tsdb.path={self.workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.close()
        _RUNNING.append(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"prometheus not ready after {timeout}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            except ProcessLookupError:
                pass
        if self in _RUNNING:
            _RUNNING.remove(self)

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    # --- HTTP API ---------------------------------------------------------------------------
    def api(self, path: str, **params: Any) -> Any:
        """GET ``/api/v1/<path>``; returns ``data`` (raises with Prometheus' error otherwise)."""
        query = urllib.parse.urlencode(
            [(k.replace("match", "match[]"), v) for k, vs in params.items()
             for v in (vs if isinstance(vs, (list, tuple)) else [vs])])
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                doc = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            doc = json.loads(exc.read() or b"{}")
            raise AssertionError(f"{url}: HTTP {exc.code} {doc.get('errorType')}: "
                                 f"{doc.get('error')}") from None
        assert doc.get("status") == "success", doc
        return doc["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict]:
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}",
                        step=str(step))
        return data["result"]

    def label_values(self, label: str, match: str, lookback_s: float = 3600) -> list[str]:
        now = time.time()
        return self.api(f"label/{label}/values", match=match, start=f"{now - lookback_s:.3f}",
                        end=f"{now:.3f}")

    def alerts(self) -> list[dict[str, Any]]:
        return self.api("alerts")["alerts"]

    def alert_state(self, name: str, **labels: str) -> str | None:
        """``firing``/``pending`` of the alert with these labels (None when inactive)."""
        states = {a["state"] for a in self.alerts() if a["labels"].get("alertname") == name
                  and all(a["labels"].get(k) == v for k, v in labels.items())}
        return "firing" if "firing" in states else ("pending" if "pending" in states else None)

    def wait_alert(self, name: str, timeout: float, poll: float = 0.5, **labels: str) -> float:
        """Seconds until ``name`` is firing for ``labels`` (AssertionError after ``timeout``)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.alert_state(name, **labels) == "firing":
                return time.monotonic() - t0
            time.sleep(poll)
        raise AssertionError(f"{name}{labels} not firing after {timeout}s; alerts: "
                             f"{json.dumps(self.alerts())[:2000]}")

    def wait_series(self, expr: str, timeout: float, poll: float = 0.5) -> list[dict[str, Any]]:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            res = self.query(expr)
            if res:
                return res
            time.sleep(poll)
        raise AssertionError(f"no data for {expr} after {timeout}s")


@atexit.register
def _stop_all() -> None:
    for p in list(_RUNNING):
        p.stop()


# --- dashboard ----------------------------------------------------------------------------------
def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text())


def panel_targets(dash: dict[str, Any]) -> Iterator[tuple[dict, dict]]:
    """(panel, target) for every target of every panel (rows' nested panels included)."""
    for panel in dash["panels"]:
        for sub in [panel, *panel.get("panels", [])]:
            for target in sub.get("targets", []):
                yield sub, target


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<sel>.+?)\s*,\s*)?(?P<label>\w+)\s*\)\s*$")
_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def interpolate(expr: str, values: dict[str, str]) -> str:
    """Replace ``$var``/``${var}``/``[[var]]`` like Grafana does for single-valued variables
    (backslashes and single quotes escaped)."""
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            raise AssertionError(f"unresolved template variable ${name} in {expr!r}")
        return values[name].replace("\\", "\\\\").replace("'", "\\'")
    return _VAR.sub(sub, expr)


def resolve_variables(dash: dict[str, Any], prom: PrometheusServer,
                      fixed: dict[str, str] | None = None) -> dict[str, str]:
    """Resolve the dashboard's query variables in order, as Grafana does on load: each
    ``label_values(selector, label)`` goes to Prometheus' label values API (``match[]`` =
    the selector with earlier variables substituted); the first value in the variable's sort
    order is picked unless ``fixed`` names one (then it must be among the values)."""
    fixed = fixed or {}
    values: dict[str, str] = {}
    for var in dash["templating"]["list"]:
        if var.get("type") != "query":
            continue
        q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = _LABEL_VALUES.match(q)
        assert m, f"variable {var['name']}: only label_values(...) queries are supported: {q!r}"
        sel = interpolate(m.group("sel"), values) if m.group("sel") else None
        got = prom.label_values(m.group("label"), sel) if sel else prom.label_values(
            m.group("label"), '{__name__=~"ldp_.+"}')
        assert got, f"variable ${var['name']}: {q!r} → no values from Prometheus"
        if var.get("sort") in (2, 4, 6):
            got = sorted(got, reverse=True)
        else:
            got = sorted(got)
        name = var["name"]
        if name in fixed:
            assert fixed[name] in got, (name, fixed[name], got)
            values[name] = fixed[name]
        else:
            values[name] = got[0]
    return values
