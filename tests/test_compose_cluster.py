"""docker-compose.cluster.yml (3-broker KRaft Kafka, Redis Cluster 3 masters + 3 replicas, three
workers) is consistent. Docker is not available in CI: static checks of what would break it."""
import re
from pathlib import Path

import pytest
import yaml

from ldpstream.redis_client import is_cluster_url, parse_nodes

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "docker-compose.cluster.yml").read_text()
SPEC = yaml.safe_load(TEXT)  # resolves the << merge keys
SERVICES = SPEC["services"]
BROKERS = sorted(s for s in SERVICES if re.fullmatch(r"kafka-\d+", s))
REDIS = sorted(s for s in SERVICES if re.fullmatch(r"redis-\d+", s))
WORKERS = sorted(s for s in SERVICES if s.startswith("worker"))


def _env(svc):
    return SERVICES[svc].get("environment", {})


def _flag(cmd, name):
    words = cmd[2].split() if cmd[:2] == ["sh", "-c"] else cmd
    return words[words.index(name) + 1]


def test_three_kraft_brokers_form_one_quorum():
    assert len(BROKERS) == 3
    ids = {str(_env(b)["KAFKA_NODE_ID"]): b for b in BROKERS}
    assert len(ids) == 3
    voters = {_env(b)["KAFKA_CONTROLLER_QUORUM_VOTERS"] for b in BROKERS}
    assert len(voters) == 1, "every node must list the same voters"
    for voter in voters.pop().split(","):
        node_id, addr = voter.split("@")
        host, port = addr.split(":")
        assert ids[node_id] == host and SERVICES[host]["hostname"] == host
        listeners = dict(x.split("://") for x in _env(host)["KAFKA_LISTENERS"].split(","))
        assert listeners["CONTROLLER"].endswith(f":{port}")
    assert len({_env(b)["CLUSTER_ID"] for b in BROKERS}) == 1
    for b in BROKERS:
        env = _env(b)
        assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
        for name in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","):
            assert name.split(":")[0] in env["KAFKA_LISTENERS"]
        assert f"INTERNAL://{b}:19092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
        rf = int(env["KAFKA_DEFAULT_REPLICATION_FACTOR"])
        assert rf == int(env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == 3
        assert 1 < int(env["KAFKA_MIN_INSYNC_REPLICAS"]) < rf, "one broker may fail, writes go on"
    external = [a for b in BROKERS for a in _env(b)["KAFKA_ADVERTISED_LISTENERS"].split(",")
                if a.startswith("EXTERNAL://")]
    host_ports = {int(a.rsplit(":", 1)[1]) for a in external}
    published = {int(str(p).split(":")[0]) for b in BROKERS for p in SERVICES[b]["ports"]}
    assert host_ports == published and len(host_ports) == 3


def test_workers_and_fleet_reach_every_broker_with_replicated_topics():
    internal = {f"{b}:19092" for b in BROKERS}
    for svc in WORKERS + ["fleet"]:
        assert set(_env(svc)["KAFKA_BOOTSTRAP_SERVERS"].split(",")) == internal
        assert _env(svc)["LDP_TOPIC_REPLICATION"] == "3"
    assert len(WORKERS) == 3


def test_redis_cluster_nodes_and_init():
    assert len(REDIS) == 6
    for r in REDIS:
        cmd = SERVICES[r]["command"]
        assert _flag(cmd, "--cluster-enabled") == "yes"
        assert _flag(cmd, "--cluster-announce-hostname") == r
        assert _flag(cmd, "--cluster-preferred-endpoint-type") == "hostname"
        assert _flag(cmd, "--appendonly") == "yes"
        assert _flag(cmd, "--requirepass") == _flag(cmd, "--masterauth") == '"$$REDIS_PASSWORD"'
        assert _env(r)["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
        assert "REDISCLI_AUTH" in " ".join(SERVICES[r]["healthcheck"]["test"])
    init = SERVICES["redis-cluster-init"]
    script = init["command"][0]
    assert "--cluster-replicas 1" in script and "--cluster-yes" in script
    assert re.search(r"for h in ([\w -]+); do", script).group(1).split() == REDIS
    assert set(init["depends_on"]) == set(REDIS)
    assert init["restart"] == "no"
    assert 'export REDISCLI_AUTH="$$REDIS_PASSWORD"' in script and "REDIS_PASSWORD" in _env(
        "redis-cluster-init")
    seeds = {f"{h}:6379" for h in REDIS}
    for w in WORKERS:
        env = _env(w)
        assert "REDIS_CLUSTER_NODES" not in env, "REDIS_URL and REDIS_CLUSTER_NODES exclude each other"
        url = env["REDIS_URL"]
        assert is_cluster_url(url)
        cred, nodes = url.split("://", 1)[1].rsplit("@", 1)
        assert re.fullmatch(r":\$\{REDIS_PASSWORD:\?[^}]+\}", cred), "password from the environment"
        assert {f"{h}:{p}" for h, p in parse_nodes(nodes)} == seeds
        assert SERVICES[w]["depends_on"]["redis-cluster-init"]["condition"] == \
            "service_completed_successfully"


def test_dependencies_volumes_and_ports():
    for name, svc in SERVICES.items():
        for target, cond in svc.get("depends_on", {}).items():
            assert target in SERVICES, f"{name} depends on unknown service {target}"
            if cond["condition"] == "service_healthy":
                assert SERVICES[target].get("healthcheck"), f"{target} has no healthcheck"
            else:
                assert cond["condition"] == "service_completed_successfully"
                assert SERVICES[target]["restart"] == "no", f"{target} must be one-shot"
    declared = set(SPEC["volumes"])
    used = {v.split(":")[0] for s in SERVICES.values() for v in s.get("volumes", [])
            if not v.startswith((".", "/"))}   # bind mounts: paths, not named volumes
    assert declared == used
    host_ports = [int(str(p).split(":")[0]) for s in SERVICES.values() for p in s.get("ports", [])]
    assert len(host_ports) == len(set(host_ports))
    for w in WORKERS:
        assert "/healthz" in " ".join(SERVICES[w]["healthcheck"]["test"])
        assert any(str(p).endswith(":6066") for p in SERVICES[w]["ports"])


def test_secrets_from_environment_and_documented():
    for name in WORKERS:
        value = _env(name)["LDP_API_TOKEN"]
        assert re.fullmatch(r"\$\{LDP_API_TOKEN:\?[^}]+\}", value)
    assert "LDP_API_TOKEN" not in _env("fleet")
    example = (ROOT / ".env.example").read_text()
    for var in set(re.findall(r"\$\{([A-Z0-9_]+)", TEXT)):
        assert re.search(rf"^{var}=", example, re.M), f"{var} missing from .env.example"
    for image in {s["image"] for s in SERVICES.values()}:
        assert not image.endswith(":latest") or image == "ldpstream:latest"


@pytest.mark.parametrize("svc", ["fleet", "worker-1"])
def test_commands_are_cli_subcommands(svc):
    from ldpstream.cli import build_parser
    cmd = [re.sub(r"\$\{[A-Z_]+:-([^}]+)\}", r"\1", c) for c in SERVICES[svc]["command"]]
    build_parser().parse_args(cmd)


def test_topic_replication_setting_is_checked(monkeypatch):
    import asyncio

    from ldpstream.errors import ServiceError
    from ldpstream.kafka_admin import create_topics
    monkeypatch.setenv("LDP_TOPIC_REPLICATION", "zero")
    with pytest.raises(ServiceError, match="LDP_TOPIC_REPLICATION: must be an integer >= 1"):
        asyncio.run(create_topics("127.0.0.1:1", {"t": 1}))
