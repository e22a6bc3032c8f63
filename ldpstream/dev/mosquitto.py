"""The embedded MQTT broker: Debian's ``mosquitto`` as a child on a free loopback port with a
generated configuration (docs/devices.md, "MQTT"; docs/security.md, "MQTT").

The generated config has no anonymous access: a password file (``mosquitto_passwd -b``) with one
user per fleet plus the bridge's user, and an ACL file where a fleet may publish only under
``ldp/<fleet>/+/reports`` and read only ``ldp/<fleet>/+/config``, while the bridge reads every
fleet's reports (through the shared subscription ``$share/ldp-bridge/...``) and writes every
config topic and reads the broker's log (``log_dest topic``: its refusals, counted by the
bridge, producers/mqtt_broker_log.py). Persistence is on (a data directory, autosaved every
few seconds and at shutdown), so :meth:`MosquittoService.restart` keeps persistent sessions
and their queued QoS 1 messages.
With ``tls=True`` the listener speaks TLS only, its certificate signed by the throw-away CA of
:func:`ldpstream.credentials.x509.write_pki` for the names in ``tls_hosts``.
"""
from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from ldpstream.credentials.x509 import write_pki
from ldpstream.dev.process import LOOPBACK, _Child
from ldpstream.errors import ServiceError
from ldpstream.names import (
    MQTT_BROKER_LOG_ACL,
    mqtt_config_topic,
    mqtt_public_key_topic,
    mqtt_reports_topic,
)
from ldpstream.names import (
    MQTT_RECEIVE_MAXIMUM as RECEIVE_MAXIMUM,
)

__all__ = ["FleetCreds", "MosquittoService", "find_mosquitto", "limit_lines"]

# --- broker limits (memory and backlog; docs/security.md "MQTT: TLS, per-fleet credentials and
# ACLs", "Limits"). deploy/mosquitto/mosquitto.conf sets the same values (tests/test_compose_edge.py)
#: the largest MQTT packet: a report batch of the bridge's limit (names.MAX_MESSAGE_BYTES) with
#: room for its topic and properties; a larger one closes the connection
MAX_PACKET_BYTES = 1_048_576 + 65_536
#: per client session, the messages and bytes queued beyond those in flight (the bridge's backlog
#: while it is slow or restarting); beyond either, the broker drops what arrives for that client
MAX_QUEUED_MESSAGES = 200_000
MAX_QUEUED_BYTES = 128 * 1_048_576
#: per client, unacknowledged QoS 1 messages sent to it (the bridge acknowledges after Kafka)
MAX_INFLIGHT_BYTES = 32 * 1_048_576
#: the whole broker's heap: past it the broker refuses what it would have to allocate
MEMORY_LIMIT_BYTES = 512 * 1_048_576


def limit_lines(max_packet_size: int = MAX_PACKET_BYTES,
                max_queued_messages: int = MAX_QUEUED_MESSAGES) -> list[str]:
    """The broker's limit settings, one ``mosquitto.conf`` line each."""
    return [f"max_packet_size {max_packet_size}",
            f"max_queued_messages {max_queued_messages}",
            f"max_queued_bytes {MAX_QUEUED_BYTES}",
            f"max_inflight_messages {RECEIVE_MAXIMUM}",
            f"max_inflight_bytes {MAX_INFLIGHT_BYTES}",
            f"memory_limit {MEMORY_LIMIT_BYTES}"]
# --- end of broker limits


@dataclass(frozen=True)
class FleetCreds:
    """One MQTT user: ``username`` and ``password`` (password-file authentication)."""

    username: str
    password: str


def find_mosquitto() -> tuple[str, str]:
    """Paths of ``mosquitto`` and ``mosquitto_passwd`` (Debian packages mosquitto and
    mosquitto-clients; ``/usr/sbin`` is searched too since it is not on every user's PATH)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
    broker, passwd = shutil.which("mosquitto", path=search), shutil.which("mosquitto_passwd", path=search)
    if broker is None or passwd is None:
        raise ServiceError("mosquitto not found: install the Debian packages "
                           "(apt-get install mosquitto mosquitto-clients; scripts/bootstrap.sh does)")
    return broker, passwd


class MosquittoService(_Child):
    """``mosquitto -c <generated config>`` on 127.0.0.1 (a free port unless ``port`` is given).

    ``fleets`` maps a fleet name to its credentials; ``bridge`` are the bridge's credentials.
    ``tmp_dir`` holds the config, password, ACL, persistence and (with TLS) PKI files; it survives
    :meth:`restart` and :meth:`stop` (the caller owns it). ``max_packet_size`` bounds every MQTT
    packet in bytes: a larger one makes the broker drop the connection; ``max_queued_messages``
    bounds the QoS 1 messages queued per session (the bridge's while it restarts); the other
    limits are :func:`limit_lines`'.
    ``debug_log`` adds ``log_type debug``: :attr:`log_path` then has ``Denied PUBLISH`` lines
    (the bridge's ``--broker-log``; several lines per message, so off by default).
    """

    name = "mosquitto"

    def __init__(self, tmp_dir: str | os.PathLike[str], *, tls: bool = False,
                 fleets: dict[str, FleetCreds], bridge: FleetCreds,
                 max_packet_size: int = MAX_PACKET_BYTES,
                 max_queued_messages: int = MAX_QUEUED_MESSAGES,
                 port: int | None = None,
                 tls_hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
                 startup_timeout: float = 20.0, debug_log: bool = False) -> None:
        super().__init__(port)
        for fleet in fleets:
            if not fleet or any(c in fleet for c in "/+#"):
                raise ValueError(f"fleet name {fleet!r} must be non-empty without / + #")
        self.dir = Path(tmp_dir)
        self.tls = tls
        self.fleets = dict(fleets)
        self.bridge = bridge
        self.max_packet_size = int(max_packet_size)
        self.max_queued_messages = int(max_queued_messages)
        self.tls_hosts = tls_hosts
        self.startup_timeout = startup_timeout
        self.debug_log = debug_log
        self.ca_path: Path | None = None
        self._server_pem: Path | None = None
        self._log_start = 0
        self._binary = ""

    @property
    def host(self) -> str:
        """The host name clients connect to: ``localhost`` with TLS (a name in the certificate),
        else ``127.0.0.1``."""
        return self.tls_hosts[0] if self.tls else LOOPBACK

    @property
    def url(self) -> str:
        """``mqtt://127.0.0.1:PORT`` or ``mqtts://localhost:PORT`` (no credentials)."""
        return f"{'mqtts' if self.tls else 'mqtt'}://{self.host}:{self.port}"

    def url_for(self, creds: FleetCreds) -> str:
        """:attr:`url` with ``creds`` in it (the form ``--mqtt-url`` / ``LDP_MQTT_URL`` take)."""
        scheme, rest = self.url.split("://", 1)
        return f"{scheme}://{quote(creds.username, safe='')}:{quote(creds.password, safe='')}@{rest}"

    @property
    def bridge_url(self) -> str:
        return self.url_for(self.bridge)

    def _write_files(self) -> Path:
        broker, passwd = find_mosquitto()
        self.dir.mkdir(parents=True, exist_ok=True)
        data = self.dir / "data"
        data.mkdir(exist_ok=True)
        pw_file, acl_file = self.dir / "passwords", self.dir / "acl"
        pw_file.unlink(missing_ok=True)
        users = [self.bridge, *self.fleets.values()]
        for i, creds in enumerate(users):
            argv = [passwd, *(["-c"] if i == 0 else []), "-b", str(pw_file), creds.username,
                    creds.password]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                raise ServiceError(f"mosquitto_passwd failed for user {creds.username!r}: "
                                   f"{done.stderr.strip() or done.stdout.strip()}")
        acl = [f"user {self.bridge.username}",
               f"topic read {mqtt_reports_topic('+', '+')}",
               # the bridges' group is ldp-bridge-<tag of their password> (mqtt_bridge.py)
               f"topic read $share/+/{mqtt_reports_topic('+', '+')}",
               f"topic readwrite {mqtt_config_topic('+', '+')}",
               f"topic readwrite {mqtt_public_key_topic('+')}",
               f"topic read {MQTT_BROKER_LOG_ACL}", ""]
        for fleet, creds in self.fleets.items():
            acl += [f"user {creds.username}", f"topic write {mqtt_reports_topic(fleet, '+')}",
                    f"topic read {mqtt_config_topic(fleet, '+')}",
                    f"topic read {mqtt_public_key_topic(fleet)}", ""]
        acl_file.write_text("\n".join(acl), encoding="utf-8")
        lines = [f"user {getpass.getuser()}", "per_listener_settings false",
                 "allow_anonymous false", f"password_file {pw_file}", f"acl_file {acl_file}",
                 "persistence true", f"persistence_location {data}/", "autosave_interval 2",
                 # a bridge's session may be offline for a while (restart, crash): keep what
                 # arrives meanwhile (the default 1000 messages would drop the rest), bounded in
                 # bytes too, and let a bridge have many unacknowledged messages in flight (it
                 # acknowledges after Kafka)
                 *limit_lines(self.max_packet_size, self.max_queued_messages),
                 "log_dest stderr",
                 # the notice-level lines on $SYS/broker/log/N: the refusals the bridge counts
                 "log_dest topic",
                 "log_type error", "log_type warning", "log_type notice", "log_type information",
                 # opt-in: the log file (log_path) then has the ACL-denied publishes too
                 *(["log_type debug"] if self.debug_log else []),
                 "connection_messages true", f"listener {self.port} {LOOPBACK}"]
        if self.tls:
            if self.ca_path is None:
                self.ca_path, self._server_pem = write_pki(self.dir / "pki", hosts=self.tls_hosts)
            assert self._server_pem is not None
            lines += [f"cafile {self.ca_path}", f"certfile {self._server_pem}",
                      f"keyfile {self._server_pem}", "tls_version tlsv1.2"]
        conf = self.dir / "mosquitto.conf"
        conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self._binary = broker
        return conf

    def _argv(self) -> list[str]:
        return [self._binary, "-c", str(self.dir / "mosquitto.conf")]

    def _ready(self) -> bool:
        # the log says it is running (a port taken by another server would accept the probe
        # while this broker is failing to bind it) and the listener accepts connections
        if self.port is None or self._log_path is None:
            return False
        with open(self._log_path, "rb") as fh:
            fh.seek(self._log_start)
            if b" running" not in fh.read():
                return False
        with socket.create_connection((LOOPBACK, self.port), timeout=0.5):
            return True

    def start(self) -> str:
        """Write the config (first start) and start; returns :attr:`url`. A broker that does not
        start raises :class:`~ldpstream.errors.ServiceError` naming its log."""
        if self.running:
            return self.url
        if self.port is None:
            from ldpstream.dev.process import free_port
            self.port = free_port()
        self._write_files()
        self._log_start = os.path.getsize(self._log_path) if self._log_path else 0
        self._spawn(self.startup_timeout)
        return self.url

    def restart(self) -> str:
        """Stop gracefully (SIGTERM: mosquitto saves its persistence file) and start again on the
        same port with the same data: persistent sessions and queued messages survive."""
        self._kill()
        return self.start()
