"""Reading the dead-letter topic in tests."""
from __future__ import annotations

import asyncio
import json


def read_dlq(bootstrap: str, *, topic: str | None = None, since_ms: int = 0) -> list[dict]:
    """Every ``ldp.dlq`` record (parsed JSON) written at or after ``since_ms`` about ``topic``
    (None: any)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def read() -> list[dict]:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                             auto_offset_reset="earliest", enable_auto_commit=False)
        await c.start()
        try:
            tp = TopicPartition("ldp.dlq", 0)
            c.assign([tp])
            await c.seek_to_beginning(tp)
            end = (await c.end_offsets([tp]))[tp]
            out = []
            while await c.position(tp) < end:
                for msgs in (await c.getmany(timeout_ms=1000)).values():
                    out += [r for r in (json.loads(m.value) for m in msgs
                                        if m.timestamp >= since_ms)
                            if topic is None or r["topic"] == topic]
            return out
        finally:
            await c.stop()

    return asyncio.run(read())


class OwnBrokerWorker:
    """A worker on a broker of the test's own (for tests that restart the broker or flood a
    shared topic) with a signing key of its own: ``broker``, ``key``, ``path`` (config), ``env``
    (to spawn more workers), ``worker``. Stop with :meth:`stop`."""

    def __init__(self, tmp_path, cid: str, spawn_worker, service_env: dict, redis_url: str
                 ) -> None:
        from conftest import write_config

        from ldpstream.dev.broker import EmbeddedBroker
        from ldpstream.producers.signing import SigningKey

        self.key = SigningKey.generate()
        self.broker = EmbeddedBroker()
        self.broker.start()
        self.path = write_config(tmp_path / "c.yaml", cid, columns=("sex", "Salary"),
                                 partitions=1, marginals=[("sex", "Salary")])
        self.env = dict(service_env, KAFKA_BOOTSTRAP_SERVERS=self.broker.bootstrap,
                        REDIS_URL=redis_url, LDP_CONFIG_SIGNING_KEY=self.key.to_text())
        self.worker = spawn_worker(self.path, self.env)
        self.worker.wait_ready(60)

    def stop(self) -> None:
        self.broker.stop()
