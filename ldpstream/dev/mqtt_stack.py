"""MQTT ingress on one machine: an embedded Mosquitto (ldpstream/dev/mosquitto.py) and one
``ldpstream mqtt-bridge`` child, for ``ldpstream up --mqtt`` and ``ldpstream bench mqtt``
(docs/devices.md, "MQTT").

One device fleet (``devices`` unless told otherwise) gets a random password and may report to
every collection; the bridge gets its own random password. :meth:`MqttStack.how_to_connect`
says what a device needs.
"""
from __future__ import annotations

import json
import secrets
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path

from ldpstream.dev.mosquitto import FleetCreds, MosquittoService
from ldpstream.dev.process import LOOPBACK, _Child
from ldpstream.errors import ServiceError
from ldpstream.names import (
    ENV_MQTT_CA,
    ENV_MQTT_CLIENT_ID,
    ENV_MQTT_FLEETS_FILE,
    ENV_MQTT_URL,
    MQTT_SHARE_GROUP,
    mqtt_config_topic,
    mqtt_reports_topic,
)

__all__ = ["BridgeChild", "MqttStack", "read_metric"]


def read_metric(url: str, name: str, *labels: str) -> float:
    """The sum of the ``name`` series of ``<url>/metrics`` whose labels contain all ``labels``
    (e.g. ``'fleet="phones"'``)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.split("{")[0].split(" ")[0] == name and all(x in line for x in labels))


class BridgeChild(_Child):
    """``ldpstream mqtt-bridge`` as a child; ready when its ``/healthz`` answers 200."""

    name = "mqtt-bridge"

    def __init__(self, env: dict[str, str], *, port: int | None = None,
                 startup_timeout: float = 60.0) -> None:
        super().__init__(port)
        self.env = env
        self.startup_timeout = startup_timeout

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def _argv(self) -> list[str]:
        return [sys.executable, "-m", "ldpstream.cli", "mqtt-bridge", "--port", str(self.port),
                "--bind", LOOPBACK]

    def _env(self) -> dict[str, str]:
        return dict(self.env)

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as resp:
            return bool(resp.status == 200)

    def start(self) -> str:
        """Start and wait for ``/healthz`` 200; returns the URL of /healthz and /metrics."""
        self._spawn(self.startup_timeout)
        return self.url

    def metric(self, name: str, *labels: str) -> float:
        return read_metric(self.url, name, *labels)

    def health(self) -> dict:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=5) as resp:
                return dict(json.loads(resp.read()))
        except urllib.error.HTTPError as exc:
            return dict(json.loads(exc.read()))


class MqttStack:
    """Mosquitto and one bridge. ``env``: the bridge's environment (Kafka bootstrap, pinned
    public key); ``collections``: those the fleet may report to (None: all); ``password``: the
    fleet's (default: a random one)."""

    def __init__(self, env: dict[str, str], *, fleet: str = "devices",
                 collections: list[str] | None = None, tls: bool = False,
                 password: str | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ldpstream-mqtt-"))
        self.fleet = fleet
        self.device = FleetCreds(fleet, password or secrets.token_urlsafe(12))
        self.mosquitto = MosquittoService(self.dir / "mosquitto", tls=tls,
                                          fleets={fleet: self.device},
                                          bridge=FleetCreds(MQTT_SHARE_GROUP,
                                                            secrets.token_urlsafe(16)))
        fleets = self.dir / "fleets.json"
        fleets.write_text(json.dumps({"fleets": {fleet: {"collections": collections or "*"}}}))
        self.env = dict(env, **{ENV_MQTT_FLEETS_FILE: str(fleets),
                                ENV_MQTT_CLIENT_ID: f"{MQTT_SHARE_GROUP}-embedded"})
        self.bridge: BridgeChild | None = None

    @property
    def device_url(self) -> str:
        return self.mosquitto.url_for(self.device)

    def start_broker(self) -> str:
        return self.mosquitto.start()

    def start_bridge(self) -> BridgeChild:
        """Start the bridge (the broker must run); a bridge that does not get healthy raises
        :class:`~ldpstream.errors.ServiceError` with its log."""
        ca = self.mosquitto.ca_path
        self.bridge = BridgeChild(dict(self.env, **{ENV_MQTT_URL: self.mosquitto.bridge_url,
                                                    ENV_MQTT_CA: str(ca) if ca else ""}))
        self.bridge.start()
        return self.bridge

    def start(self) -> "MqttStack":
        try:
            self.start_broker()
            self.start_bridge()
        except ServiceError:
            self.stop()
            raise
        return self

    def how_to_connect(self, collection: str) -> str:
        """What a device needs to publish to ``collection`` (lines to print)."""
        ca = self.mosquitto.ca_path
        return "\n".join([
            f"MQTT:    {self.device_url}   (fleet {self.fleet!r}; bridge health "
            f"{self.bridge.url if self.bridge else '-'}/healthz)",
            f"         publish batches (QoS 1) to {mqtt_reports_topic(self.fleet, collection)}; "
            f"signed state retained on {mqtt_config_topic(self.fleet, collection)}"
            + (f"; CA {ca}" if ca else ""),
            f"         Python: MqttTransport({self.device_url!r}, {self.fleet!r}) with "
            f"MqttConfigWatcher (producers/mqtt_transport.py, docs/devices.md)"])

    def stop(self) -> None:
        if self.bridge is not None:
            self.bridge.stop()
        self.mosquitto.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
