"""The device commands ``ldpstream up --mqtt`` prints: one copy-paste command per SDK (C,
TypeScript, Python) that builds its example program if needed and reports one record of the
collection to the embedded Mosquitto as device 1, 2 or 3 (docs/devices.md, "A real device on
`make up MQTT=1`"). Each command works as printed from any directory; tests/test_up_devices.py
runs them.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from ldpstream.names import ENV_MQTT_PASSWORD

__all__ = ["DeviceCommands", "checkout_root"]


def checkout_root() -> Path | None:
    """The source checkout ``ldpstream`` runs from (it holds sdk/c and sdk/ts), or None for an
    installed package without the SDKs."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "sdk" / "c" / "CMakeLists.txt").is_file() else None


class DeviceCommands:
    """Commands for a device of ``fleet`` on ``url`` (``mqtt://USER@HOST:PORT``, password
    ``password``) reporting ``record`` to ``collection``, states signed by ``public_key``; device
    ledgers under ``state_dir``."""

    def __init__(self, url: str, password: str, fleet: str, collection: str, public_key: str,
                 record: dict[str, str], state_dir: Path) -> None:
        self.url, self.password, self.fleet = url, password, fleet
        self.collection, self.public_key = collection, public_key
        self.record_line = ",".join(f"{k}={v}" for k, v in record.items())
        self.state_dir = state_dir
        self.root = checkout_root()

    def _args(self, device: int, kind: str) -> str:
        state = self.state_dir / f"device-{kind}-{device}"
        return " ".join(shlex.quote(a) for a in (
            self.url, "-", self.fleet, self.collection, self.public_key, str(device), str(state)))

    def _feed(self) -> str:
        return f"echo {shlex.quote(self.record_line)} | "

    def _pw(self) -> str:
        return f"{ENV_MQTT_PASSWORD}={shlex.quote(self.password)} "

    def c(self, device: int = 1) -> str | None:
        if self.root is None:
            return None
        src, build = self.root / "sdk" / "c", self.root / "sdk" / "c" / "build"
        state = self.state_dir / f"device-c-{device}"
        return (f"cmake -S {shlex.quote(str(src))} -B {shlex.quote(str(build))} >/dev/null && "
                f"cmake --build {shlex.quote(str(build))} --target ldp_mqtt >/dev/null && "
                f"mkdir -p {shlex.quote(str(state))} && {self._feed()}{self._pw()}"
                f"{shlex.quote(str(build / 'ldp_mqtt'))} {self._args(device, 'c')}")

    def ts(self, device: int = 2) -> str | None:
        if self.root is None:
            return None
        ts = self.root / "sdk" / "ts"
        state = self.state_dir / f"device-ts-{device}"
        return (f"(cd {shlex.quote(str(ts))} && npm run --silent build && mkdir -p "
                f"{shlex.quote(str(state))} && {self._feed()}{self._pw()}"
                f"node dist/tools/mqtt.js {self._args(device, 'ts')})")

    def python(self, device: int = 3) -> str:
        return (f"{self._feed()}{self._pw()}{shlex.quote(sys.executable)} -m "
                f"ldpstream.producers.mqtt_device {self._args(device, 'py')}")

    def lines(self) -> str:
        """The block ``up --mqtt`` prints last."""
        out = [f"A device reports one record (state dirs under {self.state_dir}; docs/devices.md "
               f"\"A real device on `make up MQTT=1`\"):"]
        for name, cmd in (("C", self.c()), ("TypeScript", self.ts()), ("Python", self.python())):
            if cmd is not None:
                out += [f"  {name}:", f"    {cmd}"]
        return "\n".join(out)
