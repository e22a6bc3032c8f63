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
