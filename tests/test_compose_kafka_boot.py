"""The Kafka service of docker-compose.yml, run from the fixture's jars the way the apache/kafka
image runs it: scripts/compose-kafka.sh formats the storage with the SCRAM users, the image's
own renderer (``kafka.docker.KafkaDockerWrapper setup``) turns the service's ``KAFKA_*``
variables into server.properties, the broker starts on loopback (host name ``kafka`` →
``localhost``, ports → free ports, ``/certs`` → a ``kafka-certs`` directory). The ``kafka-acls``
job's script then runs against it, and a device and a worker connect as compose's clients do:
SASL_SSL, SCRAM-SHA-512, the CA, host names verified (docs/security.md, "Compose")."""
from __future__ import annotations

import asyncio
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.pipeline, pytest.mark.kafka]

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compose-kafka.sh"
PASSWORDS = {"KAFKA_ADMIN_PASSWORD": "adm-1x", "KAFKA_WORKER_PASSWORD": "wrk-2y",
             "KAFKA_DEVICE_PASSWORD": "dev-3z", "KAFKA_BRIDGE_PASSWORD": "brg-4w",
             "KAFKA_CONTROLLER_PASSWORD": "ctl-5v"}


LOG4J2_YAML = """Configuration:
  Appenders:
    Console: {name: STDOUT, PatternLayout: {pattern: "%m%n"}}
  Loggers:
    Root: {level: INFO, AppenderRef: [{ref: STDOUT}]}
    Logger: [{name: kafka, level: INFO}]
"""


def _resolve(value: str) -> str:
    """``${VAR:?...}`` → the test's password, ``${VAR:-d}`` → ``d`` (compose's substitution)."""
    value = re.sub(r"\$\{(\w+):\?[^}]*\}", lambda m: PASSWORDS[m.group(1)], value)
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value).replace("$$", "$")


def _shim(path: Path, body: str) -> Path:
    path.write_text("#!/usr/bin/env bash\nset -euo pipefail\n" + body + "\n", encoding="utf-8")
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def compose_kafka(tmp_path_factory):
    """The compose Kafka service on loopback, one for the module (its start is the slow part);
    yields (bootstrap, ca file, services, the controller listener's address)."""
    tmp_path = tmp_path_factory.mktemp("compose-kafka")
    from ldpstream.cli import main as cli
    from ldpstream.dev.kafka import LOG4J_FILE, _jvm, ensure_kafka_jars
    from ldpstream.dev.process import free_port

    jars = ensure_kafka_jars()
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))["services"]
    certs = tmp_path / "certs"
    assert cli(["kafka-certs", "--out", str(certs), "--hosts", "localhost,127.0.0.1"]) == 0
    ports = {"19092": free_port(), "9092": free_port(), "9093": free_port()}
    env = {k: _resolve(str(v)) for k, v in services["kafka"]["environment"].items()}
    for key in ("KAFKA_LISTENERS", "KAFKA_ADVERTISED_LISTENERS", "KAFKA_CONTROLLER_QUORUM_VOTERS"):
        value = env[key].replace("0.0.0.0:", "127.0.0.1:").replace("kafka:", "localhost:")
        env[key] = re.sub(r":(19092|9092|9093)\b", lambda m: f":{ports[m.group(1)]}", value)
    env = {k: v.replace("/certs/", f"{certs}/") for k, v in env.items()}
    env["KAFKA_LOG_DIRS"] = str(tmp_path / "data")
    # the image's start: render KAFKA_* (its wrapper also formats: "already formatted" is fine)
    for d in ("default", "mounted", "final"):
        (tmp_path / d).mkdir()
    (tmp_path / "default" / "server.properties").write_text("")
    for name in ("log4j2.yaml", "tools-log4j2.yaml"):  # the wrapper edits its loggers
        (tmp_path / "default" / name).write_text(LOG4J2_YAML)
    java = " ".join(_jvm(jars, "128m")[:-1]) + f' "{jars}/*"'
    home = tmp_path / "kafka-home"
    (home / "bin").mkdir(parents=True)
    _shim(home / "bin" / "kafka-storage.sh", f'exec {java} kafka.tools.StorageTool "$@"')
    _shim(home / "bin" / "kafka-acls.sh", f'exec {java} org.apache.kafka.tools.AclCommand "$@"')
    run = _shim(tmp_path / "run.sh", (
        f'out=$({java} kafka.docker.KafkaDockerWrapper setup -D {tmp_path}/default '
        f'-M {tmp_path}/mounted -F {tmp_path}/final 2>&1) || echo "$out" | '
        'grep -qi "already formatted" || { echo "$out"; exit 1; }\n'
        f'exec {" ".join(_jvm(jars)[:-1])} "{jars}/*" -Dlog4j2.configurationFile={LOG4J_FILE} '
        f'kafka.Kafka {tmp_path}/final/server.properties'))
    child_env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
                 "TMPDIR": str(tmp_path), **env, "COMPOSE_KAFKA_HOME": str(home),
                 "COMPOSE_KAFKA_RUN": str(run), "COMPOSE_KAFKA_CA": str(certs / "ca.pem")}
    log_path = tmp_path / "kafka.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(SCRIPT), "start"], env=child_env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while b"Kafka Server started" not in log_path.read_bytes():
            assert proc.poll() is None, f"the compose Kafka exited; {log_path}:\n" \
                                        f"{log_path.read_text(errors='replace')[-3000:]}"
            assert time.monotonic() < deadline, f"not started; {log_path}"
            time.sleep(0.5)
        # the kafka-acls job's script, its paths and host moved to this machine
        acls = services["kafka-acls"]["command"][0].replace("$$", "$")
        acls = acls.replace("/opt/kafka/bin/", f"{home}/bin/").replace(
            "/ldp/compose-kafka.sh", str(SCRIPT)).replace(
            "kafka:19092", f"localhost:{ports['19092']}")
        done = subprocess.run(["bash", "-ec", acls], env=child_env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        yield f"localhost:{ports['9092']}", certs / "ca.pem", services, \
            f"localhost:{ports['9093']}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait(30)


def _client_env(services: dict, svc: str, ca: Path, password: str | None = None) -> dict:
    """The ``LDP_KAFKA_*`` settings of a compose client, its CA file moved here."""
    env = {k: _resolve(str(v)) for k, v in services[svc]["environment"].items()
           if k.startswith("LDP_KAFKA_")}
    env["LDP_KAFKA_SSL_CAFILE"] = str(ca)
    if password is not None:
        env["LDP_KAFKA_SASL_PASSWORD"] = password
    return env


def test_compose_kafka_starts_and_takes_its_clients_over_sasl_ssl(compose_kafka, unique_name,
                                                                    monkeypatch):
    from aiokafka.errors import KafkaError

    from ldpstream.kafka_admin import create_topics
    from ldpstream.names import CONFIG_TOPIC, reports_topic
    from ldpstream.producers.kafka_security import kafka_security
    from ldpstream.producers.publisher import Publisher, PublishError

    bootstrap, ca, services, _ = compose_kafka
    for k, v in _client_env(services, "worker-1", ca).items():   # the topic admin: as a worker
        monkeypatch.setenv(k, v)
    device = kafka_security(_client_env(services, "fleet", ca))
    wrong = kafka_security(_client_env(services, "fleet", ca, "nope"))
    topic = reports_topic(unique_name)

    async def run() -> None:
        await create_topics(bootstrap, {topic: 1, CONFIG_TOPIC: 1})
        async with Publisher(bootstrap, security=device) as pub:
            assert pub.idempotent
            await pub.send_and_wait(topic, b"report", partition=0)   # ACL: devices write reports
            with pytest.raises((KafkaError, PublishError)):          # but never ldp.config
                await pub.send_and_wait(CONFIG_TOPIC, b"forged", partition=0)
        with pytest.raises(PublishError):                            # a wrong password
            await Publisher(bootstrap, security=wrong).start(timeout_s=5)

    asyncio.run(run())


def test_compose_controller_listener_refuses_clients(compose_kafka, tmp_path):
    """Compose's KRaft controller listener takes only the brokers' SASL PLAIN user: Kafka's
    ``AclCommand --bootstrap-controller`` without credentials, or with a device's SCRAM ones,
    neither lists nor adds ACLs (tests/test_kafka_controller.py does the same on the fixture)."""
    from test_kafka_controller import TIMEOUTS, assert_refused

    _, ca, services, controller = compose_kafka
    assert_refused(controller, tmp_path, "anonymous", dict(TIMEOUTS))
    device = _resolve(str(services["fleet"]["environment"]["LDP_KAFKA_SASL_PASSWORD"]))
    assert_refused(controller, tmp_path, "device", dict(TIMEOUTS, **{
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "ssl.truststore.type": "PEM", "ssl.truststore.location": ca,
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
                            f'required username="device" password="{device}";'}))
