"""The worker's shared context: configuration, connections and the mechanisms in force.

One :class:`Context` per worker process; the faust app, the ingest service (agents/ingest/service.py), the
refresh timers, the controller and the HTTP views all read it. Nothing in it is the state of
record: counts and offsets live in Redis (agents/store/count_store.py), the mechanism state is published to
``ldp.config``; the mechanism in force of each collection has one owner,
``collections[cid]`` (agents/control/collection_state.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ldpstream.agents.control.collection_state import CollectionStates
from ldpstream.agents.store.count_store import CountStore
from ldpstream.producers.kafka_security import KafkaSecurity
from ldpstream.producers.signing import SigningKey

if TYPE_CHECKING:
    from ldpstream.config import AppConfig


@dataclass
class Context:
    config: AppConfig
    redis_url: str
    kafka_bootstrap: str
    store: CountStore
    #: the mechanism in force of every collection, and the versions it accepts
    collections: CollectionStates = field(init=False)
    started_at: float = field(default_factory=time.time)
    #: signs every mechanism state published to ``ldp.config`` (producers/signing.py)
    signing_key: SigningKey = field(default_factory=SigningKey.generate)
    #: the signing key was generated at start (none configured): devices must pin it
    ephemeral_key: bool = False
    #: TLS/SASL of every Kafka client of the worker (producers/kafka_security.py)
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    #: faust's data directory (removed when the worker exits)
    datadir: str | None = None

    def __post_init__(self) -> None:
        self.collections = CollectionStates(self.config.collections)
