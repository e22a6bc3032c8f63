"""The Mosquitto fixtures of the MQTT tests: a real ``mosquitto`` (Debian package) on a free
loopback port with per-fleet passwords and ACLs (ldpstream/dev/mosquitto.py).

- ``mosquitto`` → a :class:`~ldpstream.dev.mosquitto.MosquittoService` without TLS, fleets
  ``FLEETS`` and the bridge user ``BRIDGE``, stopped after the test.
- ``mosquitto_tls`` → the same with its TLS listener (``.ca_path`` is the test CA).

The fixtures are in tests/conftest.py.
"""
from __future__ import annotations

from typing import Iterator

from ldpstream.dev.mosquitto import FleetCreds, MosquittoService

FLEETS = {"phones": FleetCreds("phones", "phones-secret-0123"),
          "sensors": FleetCreds("sensors", "sensors-secret-0123")}
BRIDGE = FleetCreds("ldp-bridge", "bridge-secret-0123")


def running_mosquitto(tmp_path, *, tls: bool) -> Iterator[MosquittoService]:
    """Start a Mosquitto with ``FLEETS`` and ``BRIDGE`` under ``tmp_path``, yield it, stop it."""
    svc = MosquittoService(tmp_path / ("mosquitto-tls" if tls else "mosquitto"), tls=tls,
                           fleets=FLEETS, bridge=BRIDGE)
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()
