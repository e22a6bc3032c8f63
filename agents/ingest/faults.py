"""Fault injection for tests of the worker's crash handling (the poison-pill breaker): never on
the path of a worker started without it.

A worker whose environment sets ``LDP_FAULT_ABORT_ON_HEX`` aborts (SIGABRT) when it takes a
message whose value starts with those bytes: agents/app.py wraps the intake's ``take`` with
:func:`abort_on` only then.
"""
from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping

from aiokafka.structs import ConsumerRecord

from ldpstream.agents.ingest.partition import PartitionState

ENV_ABORT_ON_HEX = "LDP_FAULT_ABORT_ON_HEX"

Take = Callable[[PartitionState, list[ConsumerRecord]], None]
#: reads what a take needs from Redis (agents/ingest/intake.py ``Intake.load``)
Load = Callable[[PartitionState], Awaitable[None]]


def abort_on(prefix: bytes, take: Take) -> Take:
    """``take`` that first aborts the process if a record's value starts with ``prefix``."""
    def faulty(state: PartitionState, msgs: list[ConsumerRecord]) -> None:
        seen = state.seen
        if seen is not None and any(m.offset > seen and (m.value or b"").startswith(prefix)
                                    for m in msgs):
            os.abort()
        take(state, msgs)
    return faulty


def injected(take: Take, env: Mapping[str, str] = os.environ) -> Take:
    """``take`` with the faults the environment asks for (none: ``take`` itself)."""
    hexed = env.get(ENV_ABORT_ON_HEX)
    return abort_on(bytes.fromhex(hexed), take) if hexed else take
