"""The Kafka ACLs of an ldpstream deployment (docs/security.md, "Kafka: TLS, SASL and ACLs"), in
one place: the secure test broker (ldpstream/dev/kafka.py) creates exactly these with Kafka's
``AclCommand``, and the ``kafka-acls`` job of docker-compose.yml runs the same command lines
(tests/test_kafka_settings.py checks that they agree).

A worker may read the report topics, create its topics, read and write ``ldp.config``, write
``ldp.dlq`` and use topics and groups prefixed ``ldpstream``; a device may only write the report
topics and read ``ldp.config``; the MQTT bridge (producers/mqtt_bridge.py), its own principal,
may do what a device does and also write ``ldp.dlq`` (it files the messages it refuses there);
gateways and bridges write their acknowledged counts to ``ldp.acks``, which the workers read.
"""
from __future__ import annotations

from dataclasses import dataclass

from ldpstream.names import ACKS_TOPIC, CONFIG_TOPIC, DLQ_TOPIC, REPORTS_TOPIC_PREFIX

__all__ = ["Acl", "ACLS", "WORKER", "DEVICE", "BRIDGE", "APP_PREFIX"]

WORKER = "worker"
DEVICE = "device"
BRIDGE = "bridge"
APP_PREFIX = "ldpstream"  # the workers' consumer groups and faust's internal topics


@dataclass(frozen=True)
class Acl:
    """``--allow-principal User:<principal>`` with ``operations`` on one resource pattern."""

    principal: str
    operations: tuple[str, ...]
    resource: str            # "topic" or "group"
    name: str
    prefixed: bool = False

    def command_args(self) -> list[str]:
        """The ``AclCommand --add`` arguments (after the connection options)."""
        args = ["--add", "--force", "--allow-principal", f"User:{self.principal}"]
        for op in self.operations:
            args += ["--operation", op]
        if self.prefixed:
            args += ["--resource-pattern-type", "prefixed"]
        return args + [f"--{self.resource}", self.name]


ACLS: tuple[Acl, ...] = (
    Acl(WORKER, ("Read", "Describe"), "topic", REPORTS_TOPIC_PREFIX, prefixed=True),
    Acl(WORKER, ("Create",), "topic", "ldp.", prefixed=True),
    Acl(WORKER, ("Write", "Read", "Describe"), "topic", CONFIG_TOPIC),
    Acl(WORKER, ("Write", "Describe"), "topic", DLQ_TOPIC),
    Acl(WORKER, ("All",), "topic", APP_PREFIX, prefixed=True),
    Acl(WORKER, ("All",), "group", APP_PREFIX, prefixed=True),
    Acl(DEVICE, ("Write", "Describe"), "topic", REPORTS_TOPIC_PREFIX, prefixed=True),
    Acl(DEVICE, ("Read", "Describe"), "topic", CONFIG_TOPIC),
    Acl(BRIDGE, ("Write", "Describe"), "topic", REPORTS_TOPIC_PREFIX, prefixed=True),
    Acl(BRIDGE, ("Read", "Describe"), "topic", CONFIG_TOPIC),
    Acl(BRIDGE, ("Write", "Describe"), "topic", DLQ_TOPIC),
    # acknowledged counts (docs/security.md "Acknowledged equals counted"): the gateway writes
    # them as the device principal, the bridge as its own, the workers read them
    Acl(DEVICE, ("Write", "Describe"), "topic", ACKS_TOPIC),
    Acl(BRIDGE, ("Write", "Describe"), "topic", ACKS_TOPIC),
    Acl(WORKER, ("Read", "Describe"), "topic", ACKS_TOPIC),
)
