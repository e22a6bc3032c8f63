"""docker-compose.yml / Dockerfile are consistent (Docker is not available in CI: static checks).

Checks: the stack's services and images, ports, named volumes declared, depends_on targets exist
and wait for healthchecks, no literal secrets, every bind-mounted host path exists in the repo,
every ${VAR} is documented in .env.example and the API docs, Prometheus scrapes every worker.
"""
import re
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
TEXT = COMPOSE.read_text()
SPEC = yaml.safe_load(TEXT)  # safe_load resolves the << merge keys compose uses
SERVICES = SPEC["services"]
WORKERS = sorted(s for s in SERVICES if s.startswith("worker"))
VAR = re.compile(r"\$\{([A-Z0-9_]+)(?::?[-?+][^}]*)?\}")


def _env(svc):
    env = SERVICES[svc].get("environment", {})
    if isinstance(env, list):
        env = dict(e.split("=", 1) if "=" in e else (e, None) for e in env)
    return env


def _default(value: str) -> str:
    """``${VAR:-default}`` → ``default`` (what compose uses when VAR is unset)."""
    m = re.fullmatch(r"\$\{[A-Z0-9_]+:-([^}]*)\}", value)
    return m.group(1) if m else value


def _volumes(svc):
    for v in SERVICES[svc].get("volumes", []):
        if isinstance(v, dict):
            yield _default(v["source"]), v["target"]
        else:
            src, tgt = v.split(":")[:2]
            yield src, tgt


def test_services_present_with_expected_images():
    assert {"kafka", "redis", "fleet", "prometheus", "alertmanager", "grafana"} <= set(SERVICES)
    assert len(WORKERS) >= 2, "at least two workers (scale-out is the point)"
    assert SERVICES["kafka"]["image"].startswith("apache/kafka:")
    assert SERVICES["redis"]["image"].startswith("redis:")
    assert SERVICES["prometheus"]["image"].startswith("prom/prometheus:")
    assert SERVICES["grafana"]["image"].startswith("grafana/grafana:")
    assert SERVICES["alertmanager"]["image"].startswith("prom/alertmanager:")
    for svc in SERVICES.values():  # pinned images, never :latest from a registry
        if "build" not in svc:
            assert not svc["image"].endswith(":latest"), svc["image"]
    for name in WORKERS + ["fleet"]:
        assert SERVICES[name]["build"]["dockerfile"] == "Dockerfile"
        assert (ROOT / SERVICES[name]["build"]["context"] / "Dockerfile").is_file()


def test_kafka_is_single_node_kraft():
    env = _env("kafka")
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{env['KAFKA_NODE_ID']}@kafka:")
    assert "ZOOKEEPER" not in " ".join(env)
    listeners = dict(x.split("://") for x in env["KAFKA_LISTENERS"].split(","))
    for name in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","):
        assert name.split(":")[0] in listeners
    # the workers use the listener that is advertised inside the compose network
    internal = [a for a in env["KAFKA_ADVERTISED_LISTENERS"].split(",") if "//kafka:" in a][0]
    for w in WORKERS:
        assert _env(w)["KAFKA_BOOTSTRAP_SERVERS"] == internal.split("://")[1]
    default_id = re.search(r"KAFKA_CLUSTER_ID:-([^}]+)\}", TEXT).group(1)
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", default_id), "CLUSTER_ID must be a base64 UUID"


ONE_SHOT = sorted(s for s, svc in SERVICES.items() if svc.get("restart") == "no")


def _needs(svc: str) -> set:
    """Every service ``svc`` waits for, directly or through another."""
    out, todo = set(), [svc]
    while todo:
        for dep in SERVICES[todo.pop()].get("depends_on", {}):
            if dep not in out:
                out.add(dep)
                todo.append(dep)
    return out


def test_healthchecks_and_depends_on_conditions():
    assert set(ONE_SHOT) == {"kafka-acls", "kafka-certs", "keygen", "edge-certs", "mqtt-passwords",
                             "device-secrets"}
    for name in ["kafka", "redis", "prometheus", "alertmanager", "grafana", *WORKERS]:
        hc = SERVICES[name].get("healthcheck")
        assert hc and hc["test"], f"{name} needs a healthcheck"
    for name, svc in SERVICES.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: depends_on must use conditions"
        for target, cond in deps.items():
            assert target in SERVICES, f"{name} depends on unknown service {target}"
            if target in ONE_SHOT:  # setup jobs: wait until they finished well
                assert cond["condition"] == "service_completed_successfully", (name, target)
                continue
            assert cond["condition"] == "service_healthy", (name, target)
            assert SERVICES[target].get("healthcheck"), f"{target} has no healthcheck to wait for"
    for w in WORKERS:
        assert _needs(w) >= {"kafka", "redis", "kafka-acls", "kafka-certs", "keygen", "device-secrets"}
    assert "/healthz" in " ".join(SERVICES[WORKERS[0]]["healthcheck"]["test"])


def test_ports_unique_and_valid():
    host_ports = []
    for _name, svc in SERVICES.items():
        for p in svc.get("ports", []):
            host, container = str(p).split(":")[-2:]
            assert 0 < int(host) < 65536 and 0 < int(container) < 65536
            host_ports.append(int(host))
    assert len(host_ports) == len(set(host_ports)), "host port used twice"
    assert {6066, 9090, 3000} <= set(host_ports)
    for w in WORKERS:
        assert any(str(p).endswith(":6066") for p in SERVICES[w]["ports"])


def test_volumes_declared_and_host_paths_exist():
    declared = set(SPEC.get("volumes") or {})
    used = set()
    for name in SERVICES:
        for src, tgt in _volumes(name):
            assert tgt.startswith("/"), (name, tgt)
            if src.startswith((".", "/")):
                path = (ROOT / src).resolve()
                assert path.exists(), f"{name}: mounted host path {src} missing from the repo"
                assert ROOT in path.parents or path == ROOT, f"{name}: {src} outside the repo"
            else:
                assert src in declared, f"{name}: named volume {src} not declared"
                used.add(src)
    assert declared == used, f"declared but unused volumes: {declared - used}"
    for name in ("kafka", "redis", "prometheus", "alertmanager", "grafana"):
        assert any(not s.startswith((".", "/")) for s, _ in _volumes(name)), f"{name}: no data volume"


def test_grafana_and_prometheus_mount_the_repo_dashboards():
    prom = dict((t, s) for s, t in _volumes("prometheus"))
    assert Path(prom["/etc/prometheus"]).as_posix().endswith("dashboards/prometheus")
    cmd = " ".join(SERVICES["prometheus"]["command"])
    assert "--config.file=/etc/prometheus/prometheus.yml" in cmd
    graf = dict((t, s) for s, t in _volumes("grafana"))
    assert graf["/etc/grafana/provisioning"].endswith("dashboards/grafana/provisioning")
    prov = yaml.safe_load((ROOT / "dashboards/grafana/provisioning/dashboards/ldpstream.yml").read_text())
    dash_path = prov["providers"][0]["options"]["path"]
    assert dash_path in graf, "the dashboards folder the provider reads must be mounted"
    ds = yaml.safe_load((ROOT / "dashboards/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"


def test_prometheus_scrapes_every_worker():
    cfg = yaml.safe_load((ROOT / "dashboards/prometheus/prometheus.yml").read_text())
    targets = [t for job in cfg["scrape_configs"] if job.get("metrics_path", "/metrics") == "/metrics"
               for sc in job.get("static_configs", []) for t in sc["targets"]]
    for w in WORKERS:
        assert f"{w}:6066" in targets, f"{w} not scraped"
    for rf in cfg.get("rule_files", []):
        assert (ROOT / "dashboards/prometheus" / rf).is_file(), rf


SECRET_KEY = re.compile(r"(PASSWORD|SECRET|TOKEN|_KEY|CREDENTIAL)", re.I)


def test_no_literal_secrets():
    for name in SERVICES:
        for key, value in _env(name).items():
            # _FILE, _LOCATION: a path; _TYPE: a key store's format
            if SECRET_KEY.search(key) and not key.endswith(("_FILE", "_LOCATION", "_TYPE")):
                assert isinstance(value, str) and re.fullmatch(r"\$\{[A-Z0-9_]+:\?[^}]+\}", value), \
                    f"{name}.{key} must come from the environment with ${{VAR:?...}}, got {value!r}"
    assert "LDP_API_TOKEN" not in _env("fleet"), "devices need no API token"
    env_example = (ROOT / ".env.example").read_text()
    for line in env_example.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            if SECRET_KEY.search(key) and key != "GRAFANA_ADMIN_USER":
                assert value.strip() == "", f".env.example must not ship a value for {key}"
    assert not (ROOT / ".env").exists() or ".env" in (ROOT / ".dockerignore").read_text()


def test_env_var_references_documented():
    names = set(VAR.findall(TEXT))
    assert {"LDP_API_TOKEN", "GRAFANA_ADMIN_PASSWORD"} <= names
    example = (ROOT / ".env.example").read_text()
    docs = (ROOT / "docs/api.md").read_text() + (ROOT / "docs/security.md").read_text()
    for name in names:
        assert re.search(rf"^{name}=", example, re.M), f"{name} missing from .env.example"
        assert name in docs, f"{name} not documented in docs/api.md or docs/security.md"


def test_dockerfile_installs_the_project():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    assert re.search(r"pip install \.", text)
    assert re.search(r"^USER (?!root)\w+", text, re.M), "run unprivileged"
    copied = re.findall(r"^COPY (.+) \./", text, re.M)
    for src in " ".join(copied).split():
        assert (ROOT / src).exists(), f"Dockerfile copies missing {src}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    for pkg_dir in set(re.findall(r'"ldpstream[.\w]*" = "(\w+)"', pyproject)):
        assert pkg_dir in " ".join(copied), f"package folder {pkg_dir} not copied into the image"
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ".env" in ignore and ".venv" in ignore


def test_log_level_defaults_are_valid_logging_levels():
    import logging

    for default in re.findall(r"\$\{LDP_LOG_LEVEL:-([^}]+)\}", TEXT):
        assert isinstance(logging.getLevelName(default), int), default  # 'info' would crash
    example = re.search(r"^LDP_LOG_LEVEL=(.*)$", (ROOT / ".env.example").read_text(), re.M).group(1)
    assert isinstance(logging.getLevelName(example), int)


@pytest.mark.parametrize("svc", ["fleet", "worker-1"])
def test_commands_are_cli_subcommands(svc):
    from ldpstream.cli import build_parser
    cmd = [re.sub(r"\$\{[A-Z_]+:-([^}]+)\}", r"\1", c) for c in SERVICES[svc]["command"]]
    build_parser().parse_args(cmd)  # exits (SystemExit) on an unknown option


# --- security (docs/security.md) -----------------------------------------------------------------

def _acls() -> list[dict]:
    """The ACL lines of the kafka-acls job: principal, operations, topic/group, pattern type."""
    script = SERVICES["kafka-acls"]["command"][0]
    out = []
    for line in script.splitlines():
        if "--allow-principal" not in line:
            continue
        words = line.split()
        out.append({"principal": words[words.index("--allow-principal") + 1],
                    "ops": {words[i + 1] for i, w in enumerate(words) if w == "--operation"},
                    "topic": words[words.index("--topic") + 1] if "--topic" in words else None,
                    "group": words[words.index("--group") + 1] if "--group" in words else None,
                    "prefixed": "prefixed" in words})
    return out


def test_kafka_requires_sasl_acls_and_no_auto_create():
    env = _env("kafka")
    protocols = dict(x.split(":") for x in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    published = {str(p).split(":")[-1] for p in SERVICES["kafka"]["ports"]}
    listeners = dict(x.split("://") for x in env["KAFKA_LISTENERS"].split(","))
    for name, addr in listeners.items():
        if name == env["KAFKA_CONTROLLER_LISTENER_NAMES"]:
            assert addr.rsplit(":", 1)[1] not in published, "controller listener published"
        else:
            assert protocols[name].startswith("SASL_"), f"{name} is {protocols[name]}"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert env["KAFKA_AUTHORIZER_CLASS_NAME"].endswith("StandardAuthorizer")
    for svc, user in [(w, "worker") for w in WORKERS] + [("fleet", "device")]:
        e = _env(svc)
        assert e["LDP_KAFKA_SECURITY_PROTOCOL"].startswith("SASL_")
        assert e["LDP_KAFKA_SASL_USERNAME"] == user


def test_acls_devices_write_only_reports_and_only_workers_write_config():
    acls = _acls()
    assert {a["principal"] for a in acls} == {"User:worker", "User:device", "User:bridge"}
    for a in acls:
        if a["principal"] == "User:bridge" and a["topic"] == "ldp.dlq":  # dead letters
            assert a["ops"] == {"Write", "Describe"} and not a["prefixed"], a
        elif a["topic"] == "ldp.acks":  # acknowledged counts: the gateway and bridge write them
            want = {"Read", "Describe"} if a["principal"] == "User:worker" else {"Write", "Describe"}
            assert a["ops"] == want and not a["prefixed"], a
        elif a["principal"] in ("User:device", "User:bridge"):
            assert a["group"] is None, "devices need no consumer group"
            if a["ops"] & {"Write", "All", "Create", "Alter", "Delete"}:
                assert a["ops"] == {"Write", "Describe"}, a
                assert a["prefixed"] and a["topic"] == "ldp.reports.", a
            else:
                assert a["topic"] == "ldp.config" and not a["prefixed"], a
    writers_of_config = {a["principal"] for a in acls if a["ops"] & {"Write", "All"}
                         and ((a["topic"] == "ldp.config") or
                              (a["prefixed"] and a["topic"] and "ldp.config".startswith(a["topic"])))}
    assert writers_of_config == {"User:worker"}


def test_redis_requires_a_password_and_is_not_published():
    redis = SERVICES["redis"]
    assert not redis.get("ports"), "Redis must not be published"
    assert "--requirepass" in " ".join(redis["command"])
    assert re.fullmatch(r"\$\{REDIS_PASSWORD:\?[^}]+\}", _env("redis")["REDIS_PASSWORD"])
    for w in WORKERS:
        assert _env(w)["REDIS_URL"].startswith("redis://:${REDIS_PASSWORD:?")
    assert "REDIS_URL" not in _env("fleet")


def test_signing_key_only_on_workers_public_key_on_devices():
    keys = {s: {t for src, t in _volumes(s) if src == "ldp-signing-key"} for s in SERVICES}
    assert {s for s, t in keys.items() if t} == {"keygen", *WORKERS}
    for w in WORKERS:
        assert _env(w)["LDP_CONFIG_SIGNING_KEY_FILE"].startswith("/keys/private/")
    assert _env("fleet")["LDP_CONFIG_PUBLIC_KEY_FILE"].startswith("/keys/public/")
    assert "--if-missing" in SERVICES["keygen"]["command"]


def test_gitignore_and_dockerignore_keep_env_out():
    assert ".env" in (ROOT / ".gitignore").read_text().split()
def test_workers_and_fleet_read_a_mountable_config():
    """LDP_CONFIG_DIR (a host directory) is mounted at /config and LDP_CONFIG names the file in
    it; the default is the bundled demo, which the CLI reads through $LDP_CONFIG."""
    import os

    from ldpstream.cli import build_parser
    from ldpstream.config import load_config

    for name in WORKERS + ["fleet"]:
        mounts = dict((t, s) for s, t in _volumes(name))
        assert "/config" in mounts, f"{name}: no /config mount"
        config = _env(name)["LDP_CONFIG"]
        assert config.startswith("/config/"), (name, config)
        default = ROOT / mounts["/config"] / _default(config.removeprefix("/config/"))
        assert default.is_file(), default
        assert load_config(default).collections, default
    old = os.environ.get("LDP_CONFIG")
    os.environ["LDP_CONFIG"] = "/config/mine.yaml"
    try:
        for cmd in ("worker", "fleet", "up"):
            assert build_parser().parse_args([cmd]).config == "/config/mine.yaml", cmd
    finally:
        os.environ.pop("LDP_CONFIG") if old is None else os.environ.update(LDP_CONFIG=old)


def test_prometheus_sends_alerts_to_alertmanager():
    prom = yaml.safe_load((ROOT / "dashboards/prometheus/prometheus.yml").read_text())
    targets = [t for am in prom["alerting"]["alertmanagers"] for sc in am["static_configs"]
               for t in sc["targets"]]
    assert targets == ["alertmanager:9093"]
    assert "127.0.0.1:9093:9093" in SERVICES["alertmanager"]["ports"]
    mounts = dict((t, s) for s, t in _volumes("alertmanager"))
    cmd = " ".join(SERVICES["alertmanager"]["command"])
    conf_file = re.search(r"--config\.file=(\S+)", cmd).group(1)
    host_dir = mounts[str(Path(conf_file).parent)]
    am = yaml.safe_load((ROOT / host_dir / Path(conf_file).name).read_text())
    receivers = {r["name"] for r in am["receivers"]}

    def walk(route):
        assert route.get("receiver", am["route"]["receiver"]) in receivers, route
        for child in route.get("routes", []):
            walk(child)

    walk(am["route"])


def required_secrets(text: str) -> set[str]:
    """The variables a compose file refuses to start without (``${VAR:?...}``)."""
    return set(re.findall(r"\$\{(\w+):\?", text))


def test_docs_list_every_secret_compose_requires():
    """docs/dashboards.md's secrets table and docs/api.md's "required: yes" rows are exactly the
    ``${VAR:?}`` of docker-compose.yml (the cluster file's are among them)."""
    required = required_secrets(TEXT)
    assert required >= {"LDP_API_TOKEN", "REDIS_PASSWORD", "KAFKA_DEVICE_PASSWORD"}
    cluster = required_secrets((ROOT / "docker-compose.cluster.yml").read_text())
    assert cluster <= required
    dashboards = (ROOT / "docs/dashboards.md").read_text()
    table = dashboards[dashboards.index("| Secret |"):]
    table = table[:table.index("\n\n")]
    assert set(re.findall(r"^\| `(\w+)` \|", table, re.M)) == required
    api = (ROOT / "docs/api.md").read_text()
    assert set(re.findall(r"^\| `(\w+)` \| yes \|", api, re.M)) == required


def test_unauthenticated_services_are_published_on_loopback_only():
    """Prometheus and Alertmanager have no login: published on 127.0.0.1, never every interface."""
    for name in ("prometheus", "alertmanager"):
        ports = [str(p) for p in SERVICES[name]["ports"]]
        assert ports and all(p.startswith("127.0.0.1:") for p in ports), (name, ports)
