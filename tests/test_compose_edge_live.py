"""deploy/mosquitto/mosquitto.conf, its ACL file and compose's mqtt-passwords script under a real
mosquitto (docs/security.md "MQTT: TLS, fleet passwords and ACLs"): fleets publish only under
their own prefix and read only their own retained config and public key, a wrong password (seen
by the bridge's user on the broker's log) and a wrong host name are refused, and compose's
Mosquitto healthcheck passes (and fails with a wrong password)."""
from __future__ import annotations

import getpass
import os
import queue
import subprocess
import sys
from pathlib import Path

import pytest
from mqtt_helpers import BRIDGE, FLEETS
from prometheus_client import CollectorRegistry
from test_compose import SERVICES
from test_compose_edge import ACL, CONF
from test_mosquitto import client, close, publish, subscribe

from ldpstream.dev.mosquitto import FleetCreds, MosquittoService, find_mosquitto
from ldpstream.mqtt_client import MqttError
from ldpstream.names import (
    MQTT_BROKER_LOG_TOPIC,
    mqtt_config_topic,
    mqtt_public_key_topic,
    mqtt_reports_topic,
)
from ldpstream.producers.mqtt_broker_log import BrokerLog, refused_counter

pytestmark = pytest.mark.pipeline


def _compose_shell(script: str) -> str:
    """A compose command string as sh sees it (``$$`` is compose's escape of ``$``)."""
    return script.replace("$$", "$")


def _run_password_job(directory: Path, bridge, fleets, passwd: str) -> None:
    """The mqtt-passwords one-shot's script, run here with its volume at ``directory``."""
    script = _compose_shell(SERVICES["mqtt-passwords"]["command"][0])
    script = script.replace("/mosquitto/auth", str(directory))
    script = script.replace("mosquitto_passwd ", f"{passwd} ")
    if os.geteuid() != 0:  # only root may give the file to the broker's user
        script = script.replace("chown 1883:1883", "true")
    env = dict(os.environ, MQTT_BRIDGE_PASSWORD=bridge.password,
               MQTT_FLEET_PASSWORDS=" ".join(f"{c.username}:{c.password}"
                                             for c in fleets.values()))
    assert bridge.username == "ldp-bridge"
    subprocess.run(["sh", "-ec", script], check=True, capture_output=True, env=env)


class ComposeMosquitto(MosquittoService):
    """deploy/mosquitto/mosquitto.conf and its ACL file under a real mosquitto: the container
    paths point into ``tmp_dir``, the listener to the free loopback port, the certificate from
    ``ldpstream edge-certs``, the password file from the mqtt-passwords one-shot's script."""

    def _write_files(self) -> Path:
        broker, passwd = find_mosquitto()
        self._binary = broker
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "data").mkdir(exist_ok=True)
        tls = self.dir / "tls"
        if self.ca_path is None:
            subprocess.run([sys.executable, "-m", "ldpstream.cli", "edge-certs", "--out",
                            str(tls), "--hosts", "localhost"], check=True, capture_output=True)
            self.ca_path = tls / "ca.pem"
        pw = self.dir / "passwords"
        _run_password_job(self.dir, self.bridge, self.fleets, passwd)
        text = (CONF.read_text().replace("/mosquitto/auth/passwords", str(pw))
                .replace("/mosquitto/config/acl", str(ACL))
                .replace("/mosquitto/data/", f"{self.dir / 'data'}/").replace("/tls/", f"{tls}/")
                .replace("log_dest stdout", "log_dest stderr")
                .replace("listener 8883", f"listener {self.port} 127.0.0.1"))
        conf = self.dir / "mosquitto.conf"
        conf.write_text(f"user {getpass.getuser()}\n{text}")  # as root it would drop to 'mosquitto'

        return conf


def test_compose_broker_config_runs_with_fleet_isolation_and_tls(tmp_path):
    svc = ComposeMosquitto(tmp_path / "compose", tls=True, fleets=FLEETS, bridge=BRIDGE,
                           tls_hosts=("localhost",))
    svc.start()
    try:
        bridge = client(svc, BRIDGE, "bridge")
        seen = subscribe(bridge, "$share/ldp-bridge/" + mqtt_reports_topic("+", "+"))
        publish(bridge, mqtt_config_topic("phones", "c1"), b"state-phones", retain=True)
        publish(bridge, mqtt_config_topic("sensors", "c1"), b"state-sensors", retain=True)
        phone = client(svc, FLEETS["phones"], "phone-1")
        publish(phone, mqtt_reports_topic("phones", "c1"), b"own prefix")
        assert seen.get(timeout=10)[:2] == (mqtt_reports_topic("phones", "c1"), b"own prefix")
        for topic in (mqtt_reports_topic("sensors", "c1"), mqtt_config_topic("phones", "c1")):
            with pytest.raises(MqttError, match="(?i)not authorized"):
                publish(phone, topic, b"forged")
        configs = subscribe(phone, mqtt_config_topic("+", "+"))  # a fresh device's first read
        assert configs.get(timeout=10) == (mqtt_config_topic("phones", "c1"), b"state-phones",
                                           True)
        with pytest.raises(queue.Empty):
            configs.get(timeout=1.0)  # not the other fleet's
        assert seen.empty()
        # the public key, retained per fleet: a device reads its own fleet's only
        for fleet in FLEETS:
            publish(bridge, mqtt_public_key_topic(fleet), fleet.encode(), retain=True)
        keys = subscribe(client(svc, FLEETS["phones"], "phone-2"), "ldp/+/public-key")
        assert keys.get(timeout=10) == (mqtt_public_key_topic("phones"), b"phones", True)
        with pytest.raises(queue.Empty):
            keys.get(timeout=1.0)
        close(bridge, phone)
        # the bridge's user reads the broker's refusals (log_dest topic)
        lines = subscribe(client(svc, BRIDGE, "bridge-log"), MQTT_BROKER_LOG_TOPIC)
        with pytest.raises(MqttError, match="(?i)not authorized|bad user name"):
            client(svc, FleetCreds("phones", "wrong-password"), "bad")
        log = BrokerLog(set(FLEETS), refused_counter(CollectorRegistry()))
        reasons = [log.feed(lines.get(timeout=10)[1].decode()) for _ in range(2)]
        assert reasons == [None, "bad_credentials"], reasons  # "New connection", the refusal
        with pytest.raises(MqttError, match="(?i)certificate|hostname|SSL"):
            client(svc, FLEETS["phones"], "wrong-host", host="127.0.0.1")
        # the compose healthcheck, as its container runs it
        check = _compose_shell(SERVICES["mosquitto"]["healthcheck"]["test"][1])
        check = check.replace("/tls/", f"{svc.dir / 'tls'}/").replace("-p 8883",
                                                                       f"-p {svc.port}")
        env = dict(os.environ, MQTT_BRIDGE_PASSWORD=BRIDGE.password)
        assert subprocess.run(["sh", "-c", check], env=env, timeout=30).returncode == 0
        env["MQTT_BRIDGE_PASSWORD"] = "wrong"
        assert subprocess.run(["sh", "-c", check], env=env, timeout=30,
                              capture_output=True).returncode != 0
    finally:
        svc.stop()
