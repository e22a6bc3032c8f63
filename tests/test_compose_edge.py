"""The device edge of docker-compose.yml (Mosquitto, the MQTT bridge, the HTTPS gateway) uses the
settings the tests use, statically: TLS everywhere, healthchecks, the certificate names the hosts
services dial, commands the CLI parses, and the broker's settings and ACLs agree with the
embedded broker's (ldpstream/dev/mosquitto.py). tests/test_compose_edge_live.py runs the broker's
config under a real mosquitto."""
from __future__ import annotations

import re
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

pytestmark = pytest.mark.core


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


def test_edge_services_speak_tls_with_a_certificate_for_their_names():
    hosts = _edge_hosts()
    assert {"mosquitto", "gateway", "localhost"} <= set(hosts)
    for name in EDGE:
        assert SERVICES[name].get("healthcheck", {}).get("test"), name
    # the server key's volume only where a TLS server runs; the CA alone where it is verified
    holders = {s for s in SERVICES if "ldp-edge-tls" in _mounts(s).values()}
    assert holders == {"edge-certs", "mosquitto", "gateway"}, holders
    cmd = SERVICES["edge-certs"]["command"]
    public = cmd[cmd.index("--public-out") + 1]
    assert _mounts("edge-certs")[public] == "ldp-public-key"
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
    assert env["LDP_MQTT_CA"] == f"{public}/ca.pem"
    assert _mounts("mqtt-bridge")[public] == "ldp-public-key"
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


def test_prometheus_scrapes_the_bridge_and_the_https_gateway():
    cfg = yaml.safe_load((ROOT / "dashboards/prometheus/prometheus.yml").read_text())
    jobs = {t: job for job in cfg["scrape_configs"] for sc in job.get("static_configs", [])
            for t in sc["targets"]}
    cmd = SERVICES["mqtt-bridge"]["command"]
    assert f"mqtt-bridge:{cmd[cmd.index('--port') + 1]}" in jobs
    assert cmd[cmd.index("--bind") + 1] == "0.0.0.0"  # reachable on the compose network
    gateway = jobs["gateway:8443"]
    assert gateway["scheme"] == "https" and "gateway" in _edge_hosts()
    ca = Path(gateway["tls_config"]["ca_file"])
    assert _mounts("prometheus")[str(ca.parent)] == "ldp-public-key" and ca.name == "ca.pem"


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


def test_compose_broker_agrees_with_the_embedded_one(tmp_path):
    find_mosquitto()
    fixture, fixture_acl = _fixture_files(tmp_path)
    compose = _settings(CONF.read_text())
    # every setting of the embedded broker but where things are (paths, listener, process user,
    # log destination) is the compose broker's too
    where = {"user", "password_file", "acl_file", "persistence_location", "listener", "cafile",
             "certfile", "keyfile", "log_dest"}
    assert {"allow_anonymous", "max_packet_size", "tls_version"} <= set(fixture)
    for key in set(fixture) - where:
        assert compose.get(key) == fixture[key], key
    # both publish their log lines where the bridge counts the refusals
    assert "topic" in fixture["log_dest"] and "topic" in compose["log_dest"]
    users = [BRIDGE.username, *(c.username for c in FLEETS.values())]
    topics = [f"ldp/{f}/c1/{kind}" for f in [*FLEETS, "other"] for kind in ("reports", "config")]
    topics += ["$share/ldp-bridge/ldp/+/+/reports", "$share/ldp-bridge-0123456789abcdef/ldp/+/+/reports",
               "ldp/phones/c1/other", "elsewhere",
               "$SYS/broker/log/N", "ldp/phones/public-key", "ldp/other/public-key"]
    for user in users:
        for topic in topics:
            assert _access(ACL.read_text(), user, topic) == _access(fixture_acl, user, topic), \
                (user, topic)


def test_compose_fleets_file_names_valid_mosquitto_users():
    doc = yaml.safe_load((ROOT / "deploy" / "mqtt" / "fleets.yaml").read_text())
    assert doc["fleets"], "the compose bridge accepts at least one fleet"
    for fleet in doc["fleets"]:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+", fleet), fleet  # a Mosquitto user name, no : or space


def test_edge_certs_name_the_hosts_and_are_written_once(tmp_path):
    from cryptography import x509

    from ldpstream.credentials.edge_certs import write_edge_certs
    from ldpstream.errors import CliError

    hosts = ("localhost", "mosquitto", "gateway", "127.0.0.1")
    ca, server, written = write_edge_certs(tmp_path / "tls", hosts, public_out=tmp_path / "pub")
    assert written and (tmp_path / "pub" / "ca.pem").read_bytes() == ca.read_bytes()
    cert = x509.load_pem_x509_certificates(server.read_bytes())[0]
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(n.value) for n in sans} == set(hosts)
    first = server.read_bytes()
    (tmp_path / "pub" / "ca.pem").unlink()  # a public volume created later gets it again
    _, _, again = write_edge_certs(tmp_path / "tls", ("other",), if_missing=True,
                                   public_out=tmp_path / "pub")
    assert not again and server.read_bytes() == first and (tmp_path / "pub" / "ca.pem").is_file()
    with pytest.raises(CliError, match="--hosts"):
        write_edge_certs(tmp_path / "x", ("a", " "))
    with pytest.raises(CliError, match="--days"):
        write_edge_certs(tmp_path / "x", ("a",), days=0)
