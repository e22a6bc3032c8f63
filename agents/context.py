"""The worker's shared context: configuration, connections and the mechanisms in force.

One :class:`Context` per worker process; the faust app, the ingest service (agents/ingest.py), the
refresh timers and the HTTP views all read it. Nothing in it is the state of record: counts and
offsets live in Redis (agents/store.py), the mechanism state is published to ``ldp.config``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..estimators.mechanism import Mechanism
from ..producers.kafka_security import KafkaSecurity
from ..producers.signing import SigningKey
from .layout import Layout


@dataclass
class Context:
    config: Any  # ldpstream.config.AppConfig
    redis_url: str
    kafka_bootstrap: str
    store: Any = None  # agents.store.CountStore, created on app start
    mechanisms: dict[str, Mechanism] = field(default_factory=dict)
    #: collection → {version: mechanism} accepted on the wire (see :meth:`versions`)
    accepted: dict[str, dict[int, Mechanism]] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    #: signs every mechanism state published to ``ldp.config`` (producers/signing.py)
    signing_key: SigningKey = field(default_factory=SigningKey.generate)
    #: TLS/SASL of every Kafka client of the worker (producers/kafka_security.py)
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    #: the ingest service (agents/ingest.py) once the app has started it
    ingest: Any = None
    _layouts: dict[tuple[str, int], Layout] = field(default_factory=dict)
    #: anything other modules want to hang on the context (keyed by module name)
    extras: dict[str, Any] = field(default_factory=dict)

    def mechanism(self, collection: str) -> Mechanism:
        """The mechanism in force for ``collection`` (built from the config on first use)."""
        mech = self.mechanisms.get(collection)
        if mech is None:
            mech = self.mechanisms[collection] = self.config.collections[collection].mechanism()
        return mech

    def versions(self, collection: str) -> dict[int, Mechanism]:
        """The mechanism versions whose reports are counted now (version → mechanism): the one
        in force and the earlier ones it still accepts."""
        vs = self.accepted.get(collection)
        if vs is None:
            mech = self.mechanism(collection)
            vs = self.accepted[collection] = {mech.version: mech}
        return vs

    def layout(self, collection: str, version: int) -> Layout:
        """The count layout of ``collection``'s mechanism ``version``: its tensors for the
        configured marginals (agents/layout.py)."""
        lay = self._layouts.get((collection, version))
        if lay is None:
            mech = self.versions(collection)[version]
            lay = self._layouts[(collection, version)] = Layout.of(
                version, mech.tensors(self.config.collections[collection].marginals))
        return lay
