"""Shared pytest fixtures: a real Redis server and a real Kafka-protocol broker (Tansu) started on
loopback free ports via ``ldpstream.dev`` for the whole session.

- ``redis_server`` → the :class:`~ldpstream.dev.redis.EmbeddedRedis` (``.url``, ``.restart()``);
  tests that restart it should use ``fresh_redis`` (function scoped, their own server).
- ``redis_cluster`` / ``fresh_redis_cluster`` → an
  :class:`~ldpstream.dev.redis_cluster.EmbeddedRedisCluster` (3 masters + 3 replicas; ``.url``, ``.seeds``).
- ``kafka_broker`` → the :class:`~ldpstream.dev.broker.EmbeddedBroker` (``.bootstrap``); a module
  that sets ``kafka_broker = over_both_brokers()`` runs each test on Tansu, then on Apache Kafka.
- ``apache_kafka`` → an :class:`~ldpstream.dev.kafka.ApacheKafka` (one KRaft broker+controller JVM,
  ``.bootstrap``) shared by the session; tests that use it are marked ``kafka``.
- ``unique_name`` → a fresh id per test, for topics/collections/consumer groups that must not
  collide across tests sharing the session broker.

A test that cannot find the binaries FAILS with the reason (ServiceError): scripts/bootstrap.sh
installs them; a skipped pipeline test would be a green CI that proves nothing.
"""
from __future__ import annotations

import os
import tempfile
import uuid

import pytest


def pytest_configure(config) -> None:
    """One ldp.config signing key pair for the session (like one deployment): workers started by
    the tests sign with it, devices and fleets in the tests pin its public key."""
    from ldpstream.names import ENV_STATE_DIR
    from ldpstream.producers.signing import ENV_PUBLIC_KEY, ENV_SIGNING_KEY, SigningKey

    # what `ldpstream up` keeps across restarts goes to a throw-away directory, not the user's
    os.environ.setdefault(ENV_STATE_DIR, tempfile.mkdtemp(prefix="ldpstream-test-state-"))
    if not os.environ.get(ENV_SIGNING_KEY):
        key = SigningKey.generate()
        os.environ[ENV_SIGNING_KEY] = key.to_text()
        os.environ[ENV_PUBLIC_KEY] = key.verify_key.to_text()


def declared_marks(path) -> set[str]:
    """The marks a test file declares at module level (``pytestmark``), read without importing it."""
    import ast

    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark"
                                                for t in node.targets):
            return {n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}
    return set()


def pytest_ignore_collect(collection_path, config):
    """With ``-m EXPR``, a test file whose declared tier cannot match is not even imported (the
    pipeline modules' imports would make ``make test-fast`` spend most of its time collecting).
    Only files whose module marks, and every mark named anywhere in them (``kafka`` for a module
    using :func:`over_both_brokers`), fail EXPR are skipped."""
    import re

    from _pytest.mark.expression import Expression

    expr = config.getoption("markexpr")
    if not expr or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    marks = declared_marks(collection_path)
    if not marks:
        return None
    text = collection_path.read_text(encoding="utf-8")
    named = set(re.findall(r"pytest\.mark\.(\w+)", text))
    if "over_both_brokers()" in text:  # its tests' Apache Kafka leg is marked kafka
        named.add("kafka")
    compiled = Expression.compile(expr)
    if compiled.evaluate(marks.__contains__) or compiled.evaluate((marks | named).__contains__):
        return None
    return True


def _running(kind: str):
    """Start an embedded ``EmbeddedRedis`` / ``EmbeddedBroker``, yield it, stop it. A missing binary
    fails the test with the bootstrap hint (never a skip)."""
    from ldpstream.dev.broker import EmbeddedBroker
    from ldpstream.dev.redis import EmbeddedRedis
    from ldpstream.dev.redis_cluster import EmbeddedRedisCluster
    from ldpstream.errors import ServiceError
    kinds = {"EmbeddedRedis": EmbeddedRedis, "EmbeddedBroker": EmbeddedBroker,
             "EmbeddedRedisCluster": EmbeddedRedisCluster}
    server = kinds[kind]()
    try:
        server.start()
    except ServiceError as exc:
        pytest.fail(f"cannot start {kind} (run scripts/bootstrap.sh): {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server():
    yield from _running("EmbeddedRedis")


@pytest.fixture
def fresh_redis():
    """A Redis server of the test's own (for tests that restart or kill it)."""
    yield from _running("EmbeddedRedis")


@pytest.fixture(scope="session")
def redis_cluster():
    """A Redis Cluster (3 masters + 3 replicas, :class:`~ldpstream.dev.redis_cluster.EmbeddedRedisCluster`)
    shared by the session; tests that kill nodes use ``fresh_redis_cluster``."""
    yield from _running("EmbeddedRedisCluster")


@pytest.fixture
def fresh_redis_cluster():
    """A Redis Cluster of the test's own (for tests that kill masters)."""
    yield from _running("EmbeddedRedisCluster")


@pytest.fixture(scope="module", params=["redis", "redis-cluster"])
def redis_url(request):
    """``REDIS_URL`` of a Redis of the test module's own, then of a Redis Cluster (3 masters + 3
    replicas): store-level tests that take it run on both."""
    for server in _running("EmbeddedRedis" if request.param == "redis" else "EmbeddedRedisCluster"):
        yield server.url


@pytest.fixture(params=["redis", "redis-cluster"])
def redis_target(request):
    """The session's single Redis, then the session's Redis Cluster: a test that takes this
    fixture runs on both (``.url`` is the ``REDIS_URL`` of either)."""
    return request.getfixturevalue("redis_server" if request.param == "redis" else "redis_cluster")


@pytest.fixture(scope="session")
def tansu_broker():
    """The session's embedded broker (Tansu)."""
    yield from _running("EmbeddedBroker")


@pytest.fixture(scope="session")
def kafka_broker(tansu_broker):
    return tansu_broker


@pytest.fixture(scope="session")
def apache_kafka():
    """Apache Kafka (one KRaft broker+controller, ldpstream/dev/kafka.py) for the session. Its
    retention check and log cleaner run every second (defaults: 5 min, 15 s) so the tests of
    retention and compaction see them act."""
    yield from running_kafka(overrides={"log.retention.check.interval.ms": 1000,
                                        "log.cleaner.backoff.ms": 500})


def running_kafka(**kwargs):
    """Start an :class:`~ldpstream.dev.kafka.ApacheKafka` (``kwargs``: nodes, secure, overrides),
    yield it, stop it; a JVM that does not start fails the test naming its log."""
    from ldpstream.dev.kafka import ApacheKafka
    from ldpstream.errors import ServiceError

    kafka = ApacheKafka(**kwargs)
    try:
        kafka.start()
    except ServiceError as exc:
        pytest.fail(f"cannot start Apache Kafka (run scripts/bootstrap.sh): {exc}")
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def secure_kafka():
    """One SASL_SSL Apache Kafka with the deployment's ACLs (ldpstream/kafka_acls.py), shared by
    the modules that test the secure listeners (its start is the slow part)."""
    for kafka in running_kafka(secure=True):
        kafka.apply_acls()
        yield kafka


BROKERS = ["tansu", pytest.param("kafka", marks=pytest.mark.kafka)]


def over_both_brokers():
    """A ``kafka_broker`` fixture for a test module: each test runs on the session's embedded
    broker (Tansu), then on the session's Apache Kafka (marked ``kafka``). Assign it to the
    module's ``kafka_broker``; ``service_env`` and the workers then use that broker."""
    @pytest.fixture(params=BROKERS, name="kafka_broker")
    def kafka_broker(request):
        return request.getfixturevalue("tansu_broker" if request.param == "tansu"
                                       else "apache_kafka")
    return kafka_broker


@pytest.fixture
def unique_name(request) -> str:
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:24].strip("-")
    return f"{base}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def service_env(kafka_broker, redis_server):
    """Environment for a child ``ldpstream`` process talking to the session services."""
    import uuid

    env = dict(os.environ)
    # one consumer group per test: the workers of one test share it (handovers), but a worker
    # another test left behind (or one still leaving its group) never holds up this test's
    # rebalance on the shared session broker
    env.update(KAFKA_BOOTSTRAP_SERVERS=kafka_broker.bootstrap, REDIS_URL=redis_server.url,
               LDP_SESSION_TIMEOUT_S="3", LDP_WEB_BIND="127.0.0.1",
               LDP_APP_ID=f"ldp-test-{uuid.uuid4().hex[:10]}")
    return env


# --- worker processes and configs (generic helpers for pipeline tests) ---------------------------

def api_json(url: str, path: str, timeout: float = 10.0) -> tuple[int, dict]:
    """(status, JSON body) of a GET of ``url + path``; HTTP errors returned, not raised."""
    import json
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url + path, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def write_config(path, collection_id: str, *, columns=("sex", "race", "relationship", "Salary"),
                 partitions: int = 3, marginals=None, version: int = 0, epsilon: float = 1.0,
                 estimators=("castell",), refresh_interval_s: float = 2.0, ingest=None,
                 extra: dict | None = None) -> str:
    """Write a YAML config with one collection over Adult ``columns`` (bundled CSV); ``extra``:
    more fields of the collection."""
    import yaml

    coll = {"id": collection_id, "schema": {"csv": {"columns": list(columns)}},
            "mechanism": "rr-ind", "epsilon": epsilon, "partitions": partitions,
            "marginals": [list(m) for m in marginals] if marginals is not None
            else {"all_ways_up_to": 2},
            "estimators": list(estimators), "refresh_interval_s": refresh_interval_s,
            "version": version, **(extra or {})}
    doc = {"collections": [coll]}
    if ingest:
        doc["ingest"] = dict(ingest)
    with open(path, "w") as fh:
        yaml.safe_dump(doc, fh)
    return str(path)


class WorkerProcess:
    """``ldpstream worker`` as a child process (own process group, log file)."""

    def __init__(self, config_path: str, env: dict, log_path: str, web_port: int | None = None):
        import subprocess
        import sys

        from ldpstream.dev.process import free_port

        self.config_path = config_path
        self.env = env
        self.log_path = log_path
        self.web_port = web_port or free_port()
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ldpstream.cli", "worker", "--config", config_path,
             "--web-port", str(self.web_port)],
            env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def get(self, path: str, timeout: float = 5.0, *, any_status: bool = False) -> str:
        """GET a path of the worker's web server; ``any_status`` returns error bodies too."""
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
                return resp.read().decode()
        except urllib.error.HTTPError as exc:
            if any_status:
                return exc.read().decode()
            raise

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until /healthz shows the ingest service holding partitions."""
        import json
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                doc = json.loads(self.get("/healthz", timeout=2.0))
                if (doc.get("checks", {}).get("ingest") or {}).get("assigned"):
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.2)
        raise TimeoutError(f"worker not ready after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        self._log.flush()
        with open(self.log_path, "rb") as fh:
            return "\n".join(fh.read().decode("utf-8", "replace").splitlines()[-n:])

    def kill(self, sig=None) -> None:
        import os
        import signal

        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig or signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait for a clean exit (SIGKILL after ``timeout``); returns the exit code."""
        import os
        import signal
        import subprocess

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def spawn_worker(service_env, tmp_path):
    """``spawn_worker(config_path, env=None) -> WorkerProcess``; all are killed after the test."""
    procs: list[WorkerProcess] = []

    def spawn(config_path: str, env: dict | None = None) -> WorkerProcess:
        w = WorkerProcess(config_path, env or service_env, str(tmp_path / f"worker-{len(procs)}.log"))
        procs.append(w)
        return w

    yield spawn
    for w in procs:
        try:
            w.kill()
        except Exception:  # noqa: BLE001
            pass


async def wait_for_n(store, collection: str, n: int, timeout: float = 60.0) -> int:
    """Poll ``store.n(collection, 16)`` until it reaches ``n`` (returns the last value)."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    got = -1
    while time.monotonic() < deadline:
        got = await store.n(collection, 16)
        if got >= n:
            return got
        await asyncio.sleep(0.1)
    return got


@pytest.fixture
def mosquitto(tmp_path):
    """An embedded Mosquitto (plain TCP) with the test fleets and bridge user (tests/mqtt_helpers.py)."""
    from mqtt_helpers import running_mosquitto

    yield from running_mosquitto(tmp_path, tls=False)


@pytest.fixture
def mosquitto_tls(tmp_path):
    """The same with its TLS listener (``.ca_path`` is the test CA)."""
    from mqtt_helpers import running_mosquitto

    yield from running_mosquitto(tmp_path, tls=True)
