"""Both compose files run Apache Kafka as the secure test fixture does (docs/security.md, "Kafka:
TLS, SASL and ACLs"): SASL_SSL on every client listener, SCRAM-SHA-512 users made when the
storage is formatted (scripts/compose-kafka.sh), a CA and broker certificate made once by
``ldpstream kafka-certs`` for every advertised host, host names verified, the StandardAuthorizer
denying what no ACL allows; the workers and the fleet connect as ``worker`` and ``device`` with
the CA. Static checks (no Docker in CI)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ldpstream.dev.kafka import SCRAM

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ("docker-compose.yml", "docker-compose.cluster.yml")
SCRIPT = ROOT / "scripts" / "compose-kafka.sh"
PRINCIPALS = {"admin", "worker", "device"}
#: the device edge of docker-compose.yml: the MQTT bridge has its own principal, the gateway is a device
EDGE_CLIENTS = {"mqtt-bridge": "bridge", "gateway": "device"}


def _services(name: str) -> dict[str, dict]:
    return yaml.safe_load((ROOT / name).read_text(encoding="utf-8"))["services"]


def _brokers(services: dict[str, dict]) -> dict[str, dict]:
    return {k: v for k, v in services.items()
            if "KAFKA_PROCESS_ROLES" in (v.get("environment") or {})}


def _mounts(svc: dict) -> dict[str, str]:
    """Container path → source of a service's volumes."""
    out = {}
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            out[v["target"]] = v["source"]
        else:
            src, tgt = v.split(":")[:2]
            out[tgt] = src
    return out


@pytest.mark.parametrize("name", COMPOSE)
def test_brokers_take_sasl_ssl_with_scram_and_verified_tls(name):
    services = _services(name)
    brokers = _brokers(services)
    assert brokers
    for b, svc in brokers.items():
        env = {k: str(v) for k, v in svc["environment"].items()}
        protocols = dict(x.split(":") for x in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
        for listener, protocol in protocols.items():
            if listener == env["KAFKA_CONTROLLER_LISTENER_NAMES"]:
                continue
            assert protocol == "SASL_SSL", (b, listener)
            jaas = env[f"KAFKA_LISTENER_NAME_{listener}_SCRAM___SHA___512_SASL_JAAS_CONFIG"]
            assert "ScramLoginModule" in jaas and 'username="admin"' in jaas, (b, listener)
        assert env["KAFKA_SASL_ENABLED_MECHANISMS"] == SCRAM
        assert env["KAFKA_SASL_MECHANISM_INTER_BROKER_PROTOCOL"] == SCRAM
        assert env["KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM"] == "https"
        assert env["KAFKA_SSL_KEYSTORE_LOCATION"] == "/certs/broker.pem"
        assert env["KAFKA_SSL_TRUSTSTORE_LOCATION"] == "/certs/ca.pem"
        assert env["KAFKA_AUTHORIZER_CLASS_NAME"].endswith("StandardAuthorizer")
        assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
        assert "User:admin" in env["KAFKA_SUPER_USERS"].split(";")
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
        users = PRINCIPALS | ({"bridge"} if "mqtt-bridge" in services else set())
        for p in users:   # the SCRAM users' passwords, from .env
            assert f"KAFKA_{p.upper()}_PASSWORD:?" in env[f"SASL_{p.upper()}_PASSWORD"], (b, p)
        assert svc["entrypoint"] == ["/ldp/compose-kafka.sh"] and svc["command"] == ["start"]
        mounts = _mounts(svc)
        assert mounts["/certs"] == "kafka-certs"
        assert (ROOT / mounts["/ldp/compose-kafka.sh"]).resolve() == SCRIPT
        assert svc["depends_on"]["kafka-certs"]["condition"] == "service_completed_successfully"
        assert svc["healthcheck"]["test"] == ["CMD", "/ldp/compose-kafka.sh", "healthcheck"]


@pytest.mark.parametrize("name", COMPOSE)
def test_certificate_covers_every_advertised_host(name):
    services = _services(name)
    cmd = services["kafka-certs"]["command"]
    assert cmd[0] == "kafka-certs" and "--if-missing" in cmd
    hosts = set(cmd[cmd.index("--hosts") + 1].split(","))
    assert _mounts(services["kafka-certs"])["/certs"] == "kafka-certs"
    for svc in _brokers(services).values():
        for addr in svc["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(","):
            host = addr.split("://")[1].rsplit(":", 1)[0]
            assert host in hosts, (name, host)


@pytest.mark.parametrize("name", COMPOSE)
def test_workers_and_fleet_connect_as_their_principals_with_the_ca(name):
    services = _services(name)
    clients = {s: "worker" for s in services if s.startswith("worker")} | {"fleet": "device"}
    clients |= {s: u for s, u in EDGE_CLIENTS.items() if s in services}
    for svc, user in clients.items():
        env = services[svc]["environment"]
        assert env["LDP_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL", (name, svc)
        assert env["LDP_KAFKA_SASL_MECHANISM"] == SCRAM
        assert env["LDP_KAFKA_SASL_USERNAME"] == user
        assert f"KAFKA_{user.upper()}_PASSWORD:?" in env["LDP_KAFKA_SASL_PASSWORD"]
        assert env["LDP_KAFKA_SSL_CAFILE"] == "/certs/ca.pem"
        assert _mounts(services[svc])["/certs"] == "kafka-certs", (name, svc)
        assert "kafka-acls" in services[svc].get("depends_on", {}) or svc == "fleet"
    acls = services["kafka-acls"]
    assert "/ldp/compose-kafka.sh client-properties" in acls["command"][0]
    assert _mounts(acls)["/certs"] == "kafka-certs"


def test_script_adds_the_scram_users_the_clients_use():
    text = SCRIPT.read_text(encoding="utf-8")
    assert "scram=" + SCRAM in text
    added = set(re.findall(r'--add-scram "\$scram=\[name=(\w+),password=\$SASL_(\w+)_PASSWORD\]"',
                           text))
    assert added == {(p, p.upper()) for p in PRINCIPALS | {"bridge"}}
    assert "--ignore-formatted" in text and 'exec "$docker_run"' in text
    assert "docker_run=${COMPOSE_KAFKA_RUN:-/etc/kafka/docker/run}" in text


def test_kafka_certs_writes_a_ca_and_a_broker_certificate_for_the_hosts_once(tmp_path):
    from cryptography import x509

    from ldpstream.cli import main

    out = tmp_path / "certs"
    assert main(["kafka-certs", "--out", str(out), "--hosts", "kafka-1,localhost,127.0.0.1"]) == 0
    ca = x509.load_pem_x509_certificate((out / "ca.pem").read_bytes())
    pem = (out / "broker.pem").read_bytes()
    assert b"PRIVATE KEY" in pem
    cert = x509.load_pem_x509_certificates(pem)[0]
    assert cert.issuer == ca.subject
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {"kafka-1", "localhost"}
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    before = pem
    assert main(["kafka-certs", "--out", str(out), "--if-missing"]) == 0
    assert (out / "broker.pem").read_bytes() == before   # kept
