"""The worker's Redis client and the Redis that ``ldpstream up`` and the tests run agree
(ldpstream/redis_client.py ``connect``): redis-py sends ``CLIENT SETINFO`` on connect unless told
not to, Redis before 7.2 (Debian 12's 7.0) answers it with an error, and when the client's health
check falls due between the handshake's pipelined commands (an event loop busy for longer than
the check interval, as under a config flood) the PING reads that error: the connection fails
with "unknown subcommand 'SETINFO'". It crashed the worker's live-page sampler. A health check
due before every command forces that timing here."""
from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.pipeline


def test_connect_never_sends_setinfo_to_the_redis_up_runs(redis_target):
    from ldpstream.redis_client import connect

    async def run() -> str:
        client = connect(redis_target.url, health_check_interval=1e-9)
        try:
            for i in range(20):
                await client.set(f"setinfo-probe-{i % 3}", i)
                assert int(await client.get(f"setinfo-probe-{i % 3}")) == i
            info = await client.info("server")
            return str(info["redis_version"])
        finally:
            await client.aclose()

    version = asyncio.run(run())
    print(f"Redis {version}: 20 commands with a health check before each, no SETINFO failure")
