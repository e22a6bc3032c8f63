"""Alerts without Docker: Prometheus and Alertmanager from their Debian packages (``prometheus``,
``prometheus-alertmanager``) as child processes on free loopback ports, with the project's alert
rules (dashboards/prometheus/rules/) and Alertmanager config (dashboards/alertmanager/), for
``ldpstream up --obs`` (docs/dashboards.md, "Alerts without Docker"). Grafana stays with
docker compose.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import urllib.request
from pathlib import Path
from typing import Any, Sequence

import yaml

from ldpstream.dev.process import LOOPBACK, _Child
from ldpstream.errors import ServiceError

__all__ = ["ObsStack", "PrometheusChild", "AlertmanagerChild", "rules_dir"]

#: how often the embedded Prometheus scrapes and evaluates the rules (compose: 5 s / 15 s)
INTERVAL = "5s"


def rules_dir() -> Path | None:
    """dashboards/ of the source checkout (the rules are not in the Python package), or None."""
    root = Path(__file__).resolve().parents[2] / "dashboards"
    return root if (root / "prometheus" / "rules").is_dir() else None


def _binary(names: Sequence[str], package: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise ServiceError(f"{names[0]} not found: install the Debian package {package} "
                       f"(make install does)")


def _get_json(url: str, timeout: float = 3.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


class _ServerChild(_Child):
    """A Prometheus-project server on loopback: ready when ``/-/ready`` answers 200."""

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
            return bool(resp.status == 200)

    def start(self) -> str:
        self._spawn(60.0)
        return self.url


class PrometheusChild(_ServerChild):
    """``prometheus`` with a generated config: scrape ``targets`` (job ``ldpstream-workers``) and
    the MQTT bridges listed in ``bridges.json`` (job ``ldpstream-mqtt-bridge``, file discovery:
    :meth:`set_bridges` adds them while it runs), evaluate ``rule_files``, send to
    ``alertmanager`` (host:port)."""

    name = "prometheus"

    def __init__(self, workdir: Path, targets: Sequence[str], rule_files: Sequence[Path],
                 alertmanager: str | None, bridge_targets: Sequence[str] = ()) -> None:
        super().__init__(None)
        self.workdir = workdir
        self.binary = _binary(["prometheus"], "prometheus")
        self.bridges = workdir / "bridges.json"
        self.set_bridges(bridge_targets)
        jobs = [{"job_name": "ldpstream-workers", "static_configs": [{"targets": list(targets)}]},
                {"job_name": "ldpstream-mqtt-bridge",
                 "file_sd_configs": [{"files": [str(self.bridges)], "refresh_interval": INTERVAL}]}]
        doc: dict[str, Any] = {
            "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL},
            "rule_files": [str(p) for p in rule_files], "scrape_configs": jobs}
        if alertmanager:
            doc["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(doc))

    def set_bridges(self, targets: Sequence[str]) -> None:
        """The bridges to scrape (host:port), picked up within one scrape interval."""
        tmp = self.bridges.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": list(targets)}] if targets else []))
        tmp.replace(self.bridges)

    def _argv(self) -> list[str]:
        return [self.binary, f"--config.file={self.config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address={LOOPBACK}:{self.port}", "--log.level=warn"]

    def alerts(self) -> list[dict[str, Any]]:
        """``/api/v1/alerts``: every pending or firing alert."""
        return list(_get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"])


class AlertmanagerChild(_ServerChild):
    """``prometheus-alertmanager`` with ``config`` (no cluster: one instance on loopback)."""

    name = "alertmanager"

    def __init__(self, workdir: Path, config: Path) -> None:
        super().__init__(None)
        self.workdir = workdir
        self.binary = _binary(["prometheus-alertmanager", "alertmanager"],
                              "prometheus-alertmanager")
        self.config = workdir / "alertmanager.yml"
        shutil.copyfile(config, self.config)

    def _argv(self) -> list[str]:
        return [self.binary, f"--config.file={self.config}",
                f"--storage.path={self.workdir / 'am-data'}",
                f"--web.listen-address={LOOPBACK}:{self.port}", "--cluster.listen-address=",
                "--log.level=warn"]

    def alerts(self) -> list[dict[str, Any]]:
        """``/api/v2/alerts``: the alerts Alertmanager holds (active, silenced, inhibited)."""
        return list(_get_json(f"{self.url}/api/v2/alerts"))


class ObsStack:
    """Alertmanager, then Prometheus scraping ``targets`` with the project's rules."""

    def __init__(self, targets: Sequence[str], bridge_targets: Sequence[str] = ()) -> None:
        dashboards = rules_dir()
        if dashboards is None:
            raise ServiceError("the alert rules (dashboards/prometheus/rules/) are not here: "
                               "--obs runs from a source checkout")
        self.dir = Path(tempfile.mkdtemp(prefix="ldpstream-obs-"))
        self.alertmanager = AlertmanagerChild(self.dir, dashboards / "alertmanager" /
                                              "alertmanager.yml")
        self.rules = sorted((dashboards / "prometheus" / "rules").glob("*.rules.yml"))
        self.targets, self.bridge_targets = list(targets), list(bridge_targets)
        self.prometheus: PrometheusChild | None = None

    def start(self) -> "ObsStack":
        try:
            self.alertmanager.start()
            self.prometheus = PrometheusChild(self.dir, self.targets, self.rules,
                                              f"{LOOPBACK}:{self.alertmanager.port}",
                                              self.bridge_targets)
            self.prometheus.start()
        except ServiceError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()
        self.alertmanager.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
