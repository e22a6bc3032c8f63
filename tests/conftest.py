"""Shared pytest fixtures: a real Redis server and a real Kafka-protocol broker (Tansu) started on
loopback free ports via ``ldpstream.services`` for the whole session.

- ``redis_server`` → the :class:`~ldpstream.services.EmbeddedRedis` (``.url``, ``.restart()``);
  tests that restart it should use ``fresh_redis`` (function scoped, their own server).
- ``kafka_broker`` → the :class:`~ldpstream.services.EmbeddedBroker` (``.bootstrap``).
- ``unique_name`` → a fresh id per test, for topics/collections/consumer groups that must not
  collide across tests sharing the session broker.

A test that cannot find the binaries is skipped with the reason (ServiceError), never faked.
"""
from __future__ import annotations

import os
import uuid

import pytest


def _services():
    from ldpstream import services
    return services


@pytest.fixture(scope="session")
def redis_server():
    services = _services()
    server = services.EmbeddedRedis()
    try:
        server.start()
    except services.ServiceError as exc:
        pytest.skip(f"no Redis server: {exc}")
    yield server
    server.stop()


@pytest.fixture
def fresh_redis():
    """A Redis server of the test's own (for tests that restart or kill it)."""
    services = _services()
    server = services.EmbeddedRedis()
    try:
        server.start()
    except services.ServiceError as exc:
        pytest.skip(f"no Redis server: {exc}")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def kafka_broker():
    services = _services()
    broker = services.EmbeddedBroker()
    try:
        broker.start()
    except services.ServiceError as exc:
        pytest.skip(f"no Kafka broker: {exc}")
    yield broker
    broker.stop()


@pytest.fixture
def unique_name(request) -> str:
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:24].strip("-")
    return f"{base}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def service_env(kafka_broker, redis_server):
    """Environment for a child ``ldpstream`` process talking to the session services."""
    env = dict(os.environ)
    env.update(KAFKA_BOOTSTRAP_SERVERS=kafka_broker.bootstrap, REDIS_URL=redis_server.url,
               LDP_SESSION_TIMEOUT_S="3", LDP_WEB_BIND="127.0.0.1")
    return env
