"""Fault injection for tests of the worker's crash handling (the poison-pill breaker): never on
the path of a worker started without it.

A worker whose environment sets ``LDP_FAULT_ABORT_ON_HEX`` aborts (SIGABRT) when it takes a
message whose value starts with those bytes: agents/app.py wraps the intake's ``take`` with
:func:`abort_on` only then.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Mapping

from aiokafka.structs import ConsumerRecord

from ldpstream.agents.ingest.partition import PartitionState

ENV_ABORT_ON_HEX = "LDP_FAULT_ABORT_ON_HEX"
#: a worker whose environment sets this raises in a faust timer that many seconds after start
#: (the app crashes: the worker must then exit, agents/app.py ``PromptWorker``) ...
ENV_CRASH_APP_AFTER_S = "LDP_FAULT_CRASH_APP_AFTER_S"
#: ... and then blocks its event loop for this many seconds (as a flood of work would)
ENV_BLOCK_LOOP_S = "LDP_FAULT_BLOCK_LOOP_S"

Take = Callable[[PartitionState, list[ConsumerRecord]], None]
#: reads what a take needs from Redis (agents/ingest/intake.py ``Intake.load``)
Load = Callable[[PartitionState, list[ConsumerRecord]], Awaitable[None]]


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


class InjectedCrash(RuntimeError):
    """The exception of :func:`crash_timer`."""


def crash_timer(env: Mapping[str, str] = os.environ) -> tuple[float, Callable[[], Awaitable[None]]] | None:
    """(interval, timer body) of a faust timer that raises :class:`InjectedCrash` on its first
    tick (after blocking the event loop for ``LDP_FAULT_BLOCK_LOOP_S`` from the next iteration
    on, if set), when the environment asks for one; None otherwise."""
    raw = env.get(ENV_CRASH_APP_AFTER_S)
    if not raw:
        return None
    block_s = float(env.get(ENV_BLOCK_LOOP_S, "0"))

    async def crash() -> None:
        if block_s > 0:
            asyncio.get_running_loop().call_soon(time.sleep, block_s)
        raise InjectedCrash(f"{ENV_CRASH_APP_AFTER_S}={raw}")
    return float(raw), crash
