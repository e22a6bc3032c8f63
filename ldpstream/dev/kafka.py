"""Apache Kafka (KRaft) as child processes on loopback, for tests and benchmarks (docs/pipeline.md,
"Apache Kafka next to the embedded broker").

:class:`ApacheKafka` starts ``nodes`` combined broker+controller JVMs (``process.roles=
broker,controller``) from the jars of ``ldpstream/data/kafka-pom.xml`` (fetched once by
scripts/bootstrap.sh into :func:`kafka_jars_dir`), each with its storage formatted by Kafka's own
``kafka.tools.StorageTool``, on free ports, with the broker defences of
``ldpstream/data/kafka-broker.properties`` (the file the compose files agree with). With
``secure=True`` the client listener is SASL_SSL (SCRAM-SHA-512, a test CA made with
``cryptography``, certificates for 127.0.0.1/localhost) and the StandardAuthorizer is on; the
principals ``admin`` (super user), ``worker`` and ``device`` exist from the start, and the KRaft
controller listener takes only the nodes' own SASL PLAIN user (:func:`controller_listener`). Kafka's CLI tools
(topics, ACLs, configs) run through their main classes (:meth:`ApacheKafka.cli`).
"""
from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from ldpstream.dev.process import LOOPBACK, _Child, free_port
from ldpstream.errors import ServiceError

__all__ = ["KAFKA_VERSION", "ApacheKafka", "KafkaNode", "broker_defences", "kafka_jars_dir",
           "ensure_kafka_jars", "Principal", "controller_listener"]

KAFKA_VERSION = "4.1.1"
ROOT = Path(__file__).resolve().parent.parent
DEFENCES_FILE = ROOT / "data" / "kafka-broker.properties"
LOG4J_FILE = ROOT / "data" / "kafka-log4j2.properties"
POM = ROOT / "data" / "kafka-pom.xml"
JARS_ENV = "LDP_KAFKA_JARS"
HEAP = os.environ.get("LDP_KAFKA_HEAP", "256m")
STARTED = "Kafka Server started"
SCRAM = "SCRAM-SHA-512"
# class names of Kafka's command-line tools (bin/kafka-*.sh run these)
TOPICS_TOOL = "org.apache.kafka.tools.TopicCommand"
ACLS_TOOL = "org.apache.kafka.tools.AclCommand"
CONFIGS_TOOL = "kafka.admin.ConfigCommand"
ELECTION_TOOL = "org.apache.kafka.tools.LeaderElectionCommand"
STORAGE_TOOL = "kafka.tools.StorageTool"


def kafka_jars_dir() -> Path:
    """Where the Kafka jars live: ``$LDP_KAFKA_JARS`` or ``~/.cache/ldpstream/kafka-VERSION``."""
    raw = os.environ.get(JARS_ENV)
    return Path(raw) if raw else Path.home() / ".cache" / "ldpstream" / f"kafka-{KAFKA_VERSION}"


def ensure_kafka_jars() -> Path:
    """The jar directory, fetched with Maven from ``ldpstream/data/kafka-pom.xml`` (package
    data: an installed package needs no source checkout) when missing."""
    out = kafka_jars_dir()
    if (out / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file():
        return out
    mvn = shutil.which("mvn")
    if mvn is None or not POM.is_file():
        raise ServiceError(f"Apache Kafka {KAFKA_VERSION} jars not in {out} and no "
                           f"{'mvn' if mvn is None else POM} to fetch them: run scripts/bootstrap.sh "
                           f"or set {JARS_ENV}")
    proc = subprocess.run([mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
                           f"-DoutputDirectory={out}", "-DincludeScope=runtime"],
                          capture_output=True, text=True)
    if proc.returncode != 0 or not (out / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file():
        raise ServiceError(f"mvn could not fetch the Kafka jars into {out}:\n{proc.stdout[-2000:]}"
                           f"{proc.stderr[-2000:]}")
    return out


def _properties(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def broker_defences() -> dict[str, str]:
    """The broker settings every deployment shares (ldpstream/data/kafka-broker.properties)."""
    return _properties(DEFENCES_FILE.read_text(encoding="utf-8"))


def _write_properties(path: Path, props: Mapping[str, object]) -> None:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()), encoding="utf-8")


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise ServiceError("java not found: Apache Kafka needs a Java 17+ runtime "
                           "(apt-get install openjdk-17-jre-headless)")
    return java


def _jvm(jars: Path, heap: str = HEAP) -> list[str]:
    """``java`` with a small heap and quick start-up (2-core machines), Kafka's jars on the class
    path."""
    return [_java(), f"-Xmx{heap}", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true", "-cp", f"{jars}/*"]


@dataclass(frozen=True)
class Principal:
    """A SASL/SCRAM user of the secure cluster."""

    name: str
    password: str


def controller_listener(who: Principal) -> dict[str, str]:
    """The settings that close the KRaft controller listener ``CONTROLLER`` to clients: SASL_SSL
    with the PLAIN mechanism (KRaft controllers cannot use SCRAM, whose users live in the
    metadata log they serve), one user, ``who``, whose password only the nodes' configuration
    holds. docker-compose.yml sets the same (docs/security.md "Kafka: TLS, SASL and ACLs")."""
    return {
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config":
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{who.name}" password="{who.password}" '
            f'user_{who.name}="{who.password}";',
    }


class KafkaNode(_Child):
    """One combined broker+controller JVM (``kafka.Kafka server.properties``)."""

    name = "apache-kafka"

    def __init__(self, node_id: int, port: int, controller_port: int, config: Path,
                 jars: Path, log4j: Path) -> None:
        super().__init__(port)
        self.node_id = node_id
        self.controller_port = controller_port
        self.config = config
        self.jars = jars
        self.log4j = log4j
        self._log_start = 0

    def _argv(self) -> list[str]:
        return [*_jvm(self.jars), f"-Dlog4j2.configurationFile={self.log4j}", "kafka.Kafka",
                str(self.config)]

    def _ready(self) -> bool:
        return True  # the cluster waits for "Kafka Server started" in each node's log

    def launch(self) -> None:
        """Start the JVM without waiting (a KRaft quorum needs its peers to come up)."""
        if self._log_path is not None and os.path.exists(self._log_path):
            self._log_start = os.path.getsize(self._log_path)
        self._spawn(5.0)

    def started(self) -> bool:
        if not self._log_path:
            return False
        with open(self._log_path, "rb") as fh:
            fh.seek(self._log_start)
            return STARTED.encode() in fh.read()


class ApacheKafka:
    """Apache Kafka ``KAFKA_VERSION`` in KRaft mode: ``nodes`` broker+controller JVMs on loopback.

    ``bootstrap`` lists every node's client listener. With ``nodes=3`` internal topics are
    replicated 3 times and ``min.insync.replicas=2``; unclean leader election is off (the
    broker-settings file) unless a test turns it on per topic (:meth:`alter_topic`).
    ``overrides`` are extra ``server.properties`` entries (e.g. a short retention check).
    """

    def __init__(self, nodes: int = 1, *, secure: bool = False,
                 overrides: Mapping[str, object] | None = None,
                 startup_timeout: float = 120.0) -> None:
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1 (got {nodes})")
        self.n = int(nodes)
        self.secure = bool(secure)
        self.overrides = dict(overrides or {})
        self.startup_timeout = float(startup_timeout)
        self.nodes: list[KafkaNode] = []
        self.root: Path | None = None
        self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        self.admin = Principal("admin", "admin-" + uuid.uuid4().hex[:12])
        self.worker = Principal("worker", "worker-" + uuid.uuid4().hex[:12])
        self.device = Principal("device", "device-" + uuid.uuid4().hex[:12])
        #: what the nodes authenticate as on the controller listener (SASL PLAIN, known only to
        #: the nodes' own configuration: no client principal, not in the metadata log)
        self.controller = Principal("controller", "controller-" + uuid.uuid4().hex[:16])
        self.ca_file: Path | None = None
        self.nodes_ports: list[tuple[int, int]] = []

    # --- addresses and client settings ----------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return ",".join(f"{LOOPBACK}:{n.port}" for n in self.nodes)

    def client_env(self, who: Principal | None = None) -> dict[str, str]:
        """The ``LDP_KAFKA_*`` variables (producers/kafka_security.py) of a client acting as
        ``who`` (default: the worker) on the secure cluster; empty on a plaintext one."""
        if not self.secure:
            return {}
        who = who or self.worker
        return {"LDP_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "LDP_KAFKA_SASL_MECHANISM": SCRAM,
                "LDP_KAFKA_SASL_USERNAME": who.name, "LDP_KAFKA_SASL_PASSWORD": who.password,
                "LDP_KAFKA_SSL_CAFILE": str(self.ca_file), "LDP_KAFKA_SSL_CHECK_HOSTNAME": "true"}

    # --- configuration ----------------------------------------------------------------------
    def _server_properties(self, node: int, port: int, voters: str, log_dir: Path) -> dict:
        replicas = min(self.n, 3)
        props: dict[str, object] = dict(broker_defences())
        props.update({
            "process.roles": "broker,controller", "node.id": node,
            "controller.quorum.voters": voters, "controller.listener.names": "CONTROLLER",
            "log.dirs": log_dir, "num.partitions": 1,
            "offsets.topic.replication.factor": replicas, "offsets.topic.num.partitions": 3,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min(replicas, 2),
            "min.insync.replicas": min(replicas, 2), "default.replication.factor": replicas,
            "group.initial.rebalance.delay.ms": 0,
            # the tests' workers use a 3 s consumer session (LDP_SESSION_TIMEOUT_S) to hand
            # partitions over quickly; Kafka's default floor is 6 s
            "group.min.session.timeout.ms": 1000, "log.segment.bytes": 16 * 1024 * 1024,
            # small machines: few threads per broker
            "num.network.threads": 2, "num.io.threads": 2, "num.recovery.threads.per.data.dir": 1,
            "background.threads": 2, "log.cleaner.threads": 1,
            "log.cleaner.dedupe.buffer.size": 4 * 1024 * 1024,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min(replicas, 2),
        })
        ctl = self.nodes_ports[node - 1][1]
        if self.secure:
            assert self.root is not None
            props.update({
                "listeners": f"SASL_SSL://{LOOPBACK}:{port},CONTROLLER://{LOOPBACK}:{ctl}",
                "advertised.listeners": f"SASL_SSL://{LOOPBACK}:{port}",
                "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SASL_SSL",
                "inter.broker.listener.name": "SASL_SSL",
                "sasl.enabled.mechanisms": SCRAM, "sasl.mechanism.inter.broker.protocol": SCRAM,
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required "
                    f'username="{self.admin.name}" password="{self.admin.password}";',
                **controller_listener(self.controller),
                "ssl.keystore.type": "PEM", "ssl.keystore.location": self.root / "broker.pem",
                "ssl.truststore.type": "PEM", "ssl.truststore.location": self.ca_file,
                "ssl.endpoint.identification.algorithm": "https",
                "authorizer.class.name":
                    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                # the nodes' own principal on the controller listener is the only other super
                # user: a client without the controllers' password is refused there
                "super.users": f"User:{self.admin.name};User:{self.controller.name}",
                "allow.everyone.if.no.acl.found": "false",
            })
        else:
            props.update({
                "listeners": f"PLAINTEXT://{LOOPBACK}:{port},CONTROLLER://{LOOPBACK}:{ctl}",
                "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{port}",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name": "PLAINTEXT",
            })
        props.update(self.overrides)
        return props

    def _write_tls(self) -> None:
        from ldpstream.credentials.x509 import write_pki

        assert self.root is not None
        self.ca_file, _ = write_pki(self.root)

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> str:
        """Format each node's storage, start every JVM, wait until each logs "Kafka Server
        started"; returns :attr:`bootstrap`. A JVM that exits or stays silent raises
        :class:`ServiceError` naming its log file."""
        if self.nodes:
            return self.bootstrap
        jars = ensure_kafka_jars()
        self.root = Path(tempfile.mkdtemp(prefix="ldpstream-kafka-"))
        try:
            if self.secure:
                self._write_tls()
            self.nodes_ports = [(free_port(), free_port()) for _ in range(self.n)]
            voters = ",".join(f"{i + 1}@{LOOPBACK}:{c}" for i, (_, c) in enumerate(self.nodes_ports))
            for i, (port, ctl) in enumerate(self.nodes_ports):
                d = self.root / f"node{i + 1}"
                d.mkdir()
                cfg = d / "server.properties"
                _write_properties(cfg, self._server_properties(i + 1, port, voters, d / "data"))
                self._format(jars, cfg)
                self.nodes.append(KafkaNode(i + 1, port, ctl, cfg, jars, LOG4J_FILE))
            for node in self.nodes:
                node.launch()
            self.wait_started(self.nodes)
        except BaseException:
            for node in self.nodes:   # SIGKILL, keeping the log files the error names
                node.crash()
            self.nodes = []
            self.stop()
            raise
        return self.bootstrap

    def _format(self, jars: Path, cfg: Path) -> None:
        # "--cluster-id=ID": a base64 id may start with "-", which the tool would take for a flag
        argv = [*_jvm(jars, "128m"), STORAGE_TOOL, "format", f"--cluster-id={self.cluster_id}",
                "-c", str(cfg), "--ignore-formatted"]
        if self.secure:
            for p in (self.admin, self.worker, self.device):
                argv += ["--add-scram", f"{SCRAM}=[name={p.name},password={p.password}]"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise ServiceError(f"kafka storage format ({cfg}) failed:\n{proc.stdout}{proc.stderr}")

    def wait_started(self, nodes: Sequence[KafkaNode], timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.startup_timeout)
        waiting = list(nodes)
        while waiting:
            for node in list(waiting):
                if not node.running:
                    raise ServiceError(f"Apache Kafka node {node.node_id} exited at startup; "
                                       f"log {node.log_path}:\n{node.log_tail(30)}")
                if node.started():
                    waiting.remove(node)
            if waiting and time.monotonic() > deadline:
                node = waiting[0]
                raise ServiceError(f"Apache Kafka node {node.node_id} not started after "
                                   f"{timeout or self.startup_timeout:.0f}s; log {node.log_path}:\n"
                                   f"{node.log_tail(30)}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop every JVM and delete the data; idempotent."""
        for node in self.nodes:
            node.stop()
        self.nodes = []
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def crash(self, node: KafkaNode) -> None:
        """SIGKILL one node (its log directory stays)."""
        node.crash()

    def restart(self, node: KafkaNode, timeout: float | None = None) -> None:
        """Start a crashed or stopped node again on its ports and data."""
        node.launch()
        self.wait_started([node], timeout)

    def __enter__(self) -> "ApacheKafka":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- Kafka's own tools --------------------------------------------------------------------
    def admin_config(self) -> Path:
        """A client properties file for the CLI tools (the admin principal on the secure cluster)."""
        assert self.root is not None
        path = self.root / "admin.properties"
        if not path.exists():
            props: dict[str, object] = {}
            if self.secure:
                props = {"security.protocol": "SASL_SSL", "sasl.mechanism": SCRAM,
                         "sasl.jaas.config":
                             "org.apache.kafka.common.security.scram.ScramLoginModule required "
                             f'username="{self.admin.name}" password="{self.admin.password}";',
                         "ssl.truststore.type": "PEM", "ssl.truststore.location": self.ca_file}
            _write_properties(path, props)
        return path

    def cli(self, tool: str, *args: str, timeout: float = 120.0) -> str:
        """Run one of Kafka's CLI tools by main class against this cluster (as admin); returns
        its output, raises :class:`ServiceError` with it when the tool fails."""
        flag = "--admin.config" if tool == ELECTION_TOOL else "--command-config"
        argv = [*_jvm(ensure_kafka_jars(), "128m"), tool, "--bootstrap-server", self.bootstrap,
                flag, str(self.admin_config()), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise ServiceError(f"{tool} {' '.join(args)} failed ({proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        return proc.stdout

    def apply_acls(self) -> None:
        """Create the deployment's ACLs (ldpstream/kafka_acls.py) with Kafka's ``AclCommand``."""
        from ldpstream.kafka_acls import ACLS

        for acl in ACLS:
            self.cli(ACLS_TOOL, *acl.command_args())

    def set_client_quota(self, client_id: str, **quotas: int) -> None:
        """A quota for one client id (``producer_byte_rate=...``, ``consumer_byte_rate=...``),
        with ``kafka-configs --alter --entity-type clients``."""
        pairs = ",".join(f"{k}={int(v)}" for k, v in quotas.items())
        self.cli(CONFIGS_TOOL, "--alter", "--entity-type", "clients", "--entity-name", client_id,
                 "--add-config", pairs)

    def alter_topic(self, topic: str, **configs: object) -> None:
        """``kafka-configs --alter --entity-type topics`` (keys with ``_`` for ``.``)."""
        pairs = ",".join(f"{k.replace('_', '.')}={v}" for k, v in configs.items())
        self.cli(CONFIGS_TOOL, "--alter", "--entity-type", "topics", "--entity-name", topic,
                 "--add-config", pairs)

    def leader_of(self, topic: str, partition: int = 0) -> tuple[KafkaNode | None, list[int]]:
        """The node leading ``topic``/``partition`` (None: no leader) and the in-sync replica
        ids (``kafka-topics --describe``)."""
        out = self.cli(TOPICS_TOOL, "--describe", "--topic", topic)
        for line in out.splitlines():
            fields = dict(part.split(": ", 1) for part in line.strip().split("\t")
                          if ": " in part)
            if fields.get("Partition") == str(partition):
                isr = [int(x) for x in fields["Isr"].split(",") if x.strip().isdigit()]
                return next((n for n in self.nodes if str(n.node_id) == fields["Leader"]),
                            None), isr
        raise ServiceError(f"no partition {partition} of {topic!r} in:\n{out}")

