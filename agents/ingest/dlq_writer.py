"""The dead-letter writer of the ingest worker: a delta's refused messages go to ``ldp.dlq``
with their reasons, acknowledged before the offset covering them is applied."""
from __future__ import annotations

import asyncio
import time

from ldpstream.agents.control.control_topic import ControlTopics
from ldpstream.agents.ingest.clients import Clients
from ldpstream.agents.ingest.partition import Pending
from ldpstream.names import DLQ_TOPIC
from ldpstream.producers.codec import dlq_record


class DlqWriter:
    """Files the rejects of pending deltas in ``ldp.dlq``."""

    def __init__(self, clients: Clients) -> None:
        self.clients = clients
        #: set while the service runs: ``ldp.dlq`` is recreated (after broker log loss) before
        #: anything is produced to it
        self.control: ControlTopics | None = None

    async def send(self, cid: str, pend: Pending) -> None:
        """Send ``pend``'s rejects and wait until the broker has them all."""
        producer = self.clients.producer
        assert producer is not None, "the DLQ is written only while the service runs"
        if self.control is not None:
            await self.control.ensure([DLQ_TOPIC])
        now = time.time()
        futs = []
        for r in pend.rejects:
            rec = dlq_record(r.reason, r.detail, collection=cid, topic=pend.tp.topic,
                             partition=pend.tp.partition, offset=r.offset, payload=r.payload,
                             received_at=now)
            futs.append(await producer.send(DLQ_TOPIC, rec, key=cid.encode()))
        # the offset that covers these messages is recorded only after the DLQ has them
        await asyncio.gather(*futs)
