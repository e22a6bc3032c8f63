"""The device edge of docker-compose.yml (Mosquitto, the MQTT bridge, the HTTPS gateway) uses the
settings the tests use: statically (TLS everywhere, healthchecks, the certificate names the hosts
services dial, commands the CLI parses), the broker's settings and ACLs agree with the embedded
broker's (ldpstream/dev/mosquitto.py), and deploy/mosquitto/mosquitto.conf with its ACL file runs
under a real mosquitto: fleets publish only under their own prefix and read only their own
config, a wrong password and a wrong host name are refused."""
from __future__ import annotations

import getpass
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mqtt_helpers import BRIDGE, FLEETS
from test_compose import SERVICES, _env, _volumes

from ldpstream.dev.mosquitto import MosquittoService, find_mosquitto

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "deploy" / "mosquitto" / "mosquitto.conf"
ACL = ROOT / "deploy" / "mosquitto" / "acl"
EDGE = ("mosquitto", "mqtt-bridge", "gateway")


def _settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.strip().partition(" ")
            out.setdefault(key, []).append(value)
    return out


def _edge_hosts() -> list[str]:
    cmd = SERVICES["edge-certs"]["command"]
    value = cmd[cmd.index("--hosts") + 1]
    return re.fullmatch(r"\$\{LDP_EDGE_HOSTS:-([^}]+)\}", value).group(1).split(",")


def _mounts(svc: str) -> dict[str, str]:
    return {tgt: src for src, tgt in _volumes(svc)}


@pytest.mark.core
def test_edge_services_speak_tls_with_a_certificate_for_their_names():
    hosts = _edge_hosts()
    assert {"mosquitto", "gateway", "localhost"} <= set(hosts)
    for name in EDGE:
        assert SERVICES[name].get("healthcheck", {}).get("test"), name
        assert _mounts(name)["/tls"] == "ldp-edge-tls", name
    # Mosquitto: TLS only, published on 8883, the files of deploy/ mounted where the conf says
    conf = _settings(CONF.read_text())
    assert conf["listener"] == ["8883"] and conf["allow_anonymous"] == ["false"]
    assert "8883:8883" in SERVICES["mosquitto"]["ports"]
    mounts = _mounts("mosquitto")
    assert Path(mounts["/mosquitto/config/mosquitto.conf"]).resolve() == CONF
    assert Path(mounts[conf["acl_file"][0]]).resolve() == ACL
    assert str(Path(conf["password_file"][0]).parent) in mounts
    assert conf["certfile"] == conf["keyfile"] == ["/tls/server.pem"]
    assert conf["cafile"] == ["/tls/ca.pem"]
    # the bridge dials mqtts://...@mosquitto:8883 and pins the same CA
    env = _env("mqtt-bridge")
    url = re.sub(r"\$\{[^}]+\}", "secret", env["LDP_MQTT_URL"])
    assert re.fullmatch(r"mqtts://ldp-bridge:secret@mosquitto:8883", url), url
    assert env["LDP_MQTT_CA"] == "/tls/ca.pem"
    assert env["LDP_MQTT_CLIENT_ID"], "a stable client id keeps the bridge's session"
    assert (ROOT / _mounts("mqtt-bridge")["/mqtt"] / Path(env["LDP_MQTT_FLEETS_FILE"]).name
            ).is_file()
    # the gateway serves HTTPS with the edge certificate; its healthcheck verifies the host name
    cmd = SERVICES["gateway"]["command"]
    assert cmd[cmd.index("--tls-cert") + 1] == "/tls/server.pem"
    assert "8443:8443" in SERVICES["gateway"]["ports"]
    check = " ".join(SERVICES["gateway"]["healthcheck"]["test"])
    assert "https://localhost:8443/healthz" in check and "cafile='/tls/ca.pem'" in check
    assert _env("gateway")["LDP_CONFIG_PUBLIC_KEY_FILE"].startswith("/keys/public/")
    # the bridge's and Mosquitto's healthchecks log in as the bridge user of the ACL file
    assert "-u ldp-bridge" in " ".join(SERVICES["mosquitto"]["healthcheck"]["test"])
    assert f"user {BRIDGE.username}" in ACL.read_text()


@pytest.mark.core
def test_edge_commands_are_cli_subcommands():
    from ldpstream.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    for name in ("gateway", "edge-certs", "mqtt-bridge"):
        if name not in commands:  # the bridge's command lives in its own module
            pytest.skip(f"no {name} subcommand in this checkout")
        cmd = [re.sub(r"\$\{[A-Z_]+:-([^}]+)\}", r"\1", c) for c in SERVICES[name]["command"]]
        parser.parse_args(cmd)


def _fixture_files(tmp_path) -> tuple[dict[str, list[str]], str]:
    svc = MosquittoService(tmp_path / "fixture", tls=True, fleets=FLEETS, bridge=BRIDGE)
    svc._write_files()  # noqa: SLF001 - the generated files, no broker needed
    return (_settings((svc.dir / "mosquitto.conf").read_text()),
            (svc.dir / "acl").read_text())


def _topic_matches(pattern: str, topic: str) -> bool:
    p, t = pattern.split("/"), topic.split("/")
    for i, part in enumerate(p):
        if part == "#":
            return True
        if i >= len(t) or (part != "+" and part != t[i]):
            return False
    return len(p) == len(t)


def _access(acl: str, user: str, topic: str) -> set[str]:
    """read/write rights of ``user`` on ``topic`` under a mosquitto acl_file."""
    rights, current = set(), None
    for line in acl.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "user":
            current = words[1]
            continue
        kind, access, pattern = (words[0], words[1], words[2]) if len(words) == 3 else \
            (words[0], "readwrite", words[1])
        if kind == "topic" and current != user:
            continue
        if kind == "pattern":
            pattern = pattern.replace("%u", user)
        if _topic_matches(pattern, topic):
            rights |= {"read", "write"} if access == "readwrite" else {access}
    return rights


@pytest.mark.core
def test_compose_broker_agrees_with_the_embedded_one(tmp_path):
    find_mosquitto()
    fixture, fixture_acl = _fixture_files(tmp_path)
    compose = _settings(CONF.read_text())
    for key in ("per_listener_settings", "allow_anonymous", "persistence", "autosave_interval",
                "max_packet_size", "tls_version"):
        assert compose[key] == fixture[key], key
    users = [BRIDGE.username, *(c.username for c in FLEETS.values())]
    topics = [f"ldp/{f}/c1/{kind}" for f in [*FLEETS, "other"] for kind in ("reports", "config")]
    topics += ["$share/ldp-bridge/ldp/+/+/reports", "ldp/phones/c1/other", "elsewhere"]
    for user in users:
        for topic in topics:
            assert _access(ACL.read_text(), user, topic) == _access(fixture_acl, user, topic), \
                (user, topic)


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


@pytest.mark.pipeline
def test_compose_broker_config_runs_with_fleet_isolation_and_tls(tmp_path):
    import queue

    from test_mosquitto import client, close, publish, subscribe

    from ldpstream.dev.mosquitto import FleetCreds
    from ldpstream.mqtt_client import MqttError
    from ldpstream.names import mqtt_config_topic, mqtt_reports_topic

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
        close(bridge, phone)
        with pytest.raises(MqttError, match="(?i)not authorized|bad user name"):
            client(svc, FleetCreds("phones", "wrong-password"), "bad")
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


@pytest.mark.core
def test_compose_fleets_file_names_valid_mosquitto_users():
    doc = yaml.safe_load((ROOT / "deploy" / "mqtt" / "fleets.yaml").read_text())
    assert doc["fleets"], "the compose bridge accepts at least one fleet"
    for fleet in doc["fleets"]:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+", fleet), fleet  # a Mosquitto user name, no : or space
