"""A Redis lease: ``SET NX PX`` with a random token, released by compare-and-delete, so that one of
several workers refreshes or adapts a collection per interval (docs/windows.md, "Several
workers")."""
from __future__ import annotations

import uuid
from typing import Any

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


async def acquire(redis: Any, key: str, ttl_ms: int) -> str | None:
    """``SET key token NX PX ttl``: the token when acquired, else None."""
    token = uuid.uuid4().hex
    ok = await redis.set(key, token, nx=True, px=max(1, int(ttl_ms)))
    return token if ok else None


async def release(redis: Any, key: str, token: str) -> bool:
    """Delete ``key`` only if it still holds ``token`` (compare-and-delete in Lua)."""
    return bool(await redis.eval(_RELEASE, 1, key, token))


