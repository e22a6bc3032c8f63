"""Redis connections for the worker and the tools: one server or a Redis Cluster, chosen by URL.

* ``redis://host:port/db`` (also ``rediss://``, ``unix://``): one server, ``redis.asyncio.Redis``.
* ``redis+cluster://[user:password@]host:port,host:port,...`` (``rediss+cluster://`` for TLS):
  a Redis Cluster, ``redis.asyncio.cluster.RedisCluster`` seeded with those nodes. The client
  discovers the other nodes, sends each command to the master of its key's hash slot, follows
  ``MOVED``/``ASK`` redirections and reloads its slot map when a node dies (failover).
* ``REDIS_CLUSTER_NODES=host:port,host:port`` in the environment means the same as
  ``REDIS_URL=redis+cluster://host:port,host:port`` (set one of the two).

Every client has short socket timeouts, so a dead server surfaces as an error that the ingest
service retries (:data:`TRANSIENT_ERRORS`) instead of a hang. On a cluster, a multi-key command,
a Lua script or a MULTI/EXEC must keep to the keys of one hash slot: the key scheme puts each
shard's keys under one hash tag (agents/store/keys.py).
"""
from __future__ import annotations

import asyncio
from typing import Any, Mapping, Sequence
from urllib.parse import unquote

import redis.exceptions as rexc

from ldpstream.names import ENV_REDIS_URL

__all__ = ["CLUSTER_SCHEMES", "CLUSTER_NODES_ENV", "RedisUrlError", "TRANSIENT_ERRORS",
           "cluster_url", "connect", "display_url", "health", "is_cluster_url", "parse_nodes",
           "redis_url_from_env", "run_script"]

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
CLUSTER_NODES_ENV = "REDIS_CLUSTER_NODES"
SOCKET_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 2.0
HEALTH_CHECK_INTERVAL_S = 5
#: Client-side retries of one command on a cluster (connection errors reload the slot map first);
#: past them the error reaches the caller, whose own retry loop (ingest) pauses consumption.
CLUSTER_RETRIES = 3

#: Errors that mean "Redis is not reachable right now; try again": a dead or restarting server,
#: a timeout, and on a cluster a failover in progress (CLUSTERDOWN / MASTERDOWN replies, a slot
#: whose master is gone from the client's map, and NOSCRIPT: a promoted replica has no script
#: cache — SCRIPT LOAD is not replicated — and redis-py's reload goes to the masters of its old
#: slot map; the next attempt, on the refreshed map, loads the script where the slot now lives).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    rexc.ConnectionError, rexc.TimeoutError, rexc.BusyLoadingError, rexc.TryAgainError,
    rexc.ClusterDownError, rexc.SlotNotCoveredError, rexc.NoScriptError, ConnectionError,
    OSError, asyncio.TimeoutError)


class RedisUrlError(ValueError):
    """A Redis URL or seed-node list that cannot be used (the message names the setting)."""


def is_cluster_url(url: str) -> bool:
    """True for ``redis+cluster://`` and ``rediss+cluster://`` URLs."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def parse_nodes(text: str | Sequence[str], *, what: str = CLUSTER_NODES_ENV
                ) -> list[tuple[str, int]]:
    """``"host:port,host:port"`` (or a list of ``host:port``) → ``[(host, port), ...]``;
    :class:`RedisUrlError` naming ``what`` for an empty list or a malformed entry."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    out: list[tuple[str, int]] = []
    for raw in parts:
        item = str(raw).strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RedisUrlError(f"{what}: {item!r} is not host:port")
        out.append((host, int(port)))
    if not out:
        raise RedisUrlError(f"{what}: no seed node (expected host:port,host:port,...)")
    return out


def cluster_url(nodes: str | Sequence[str], *, tls: bool = False) -> str:
    """The ``redis+cluster://`` URL of seed ``nodes`` (``"h:p,h:p"`` or a list)."""
    seeds = ",".join(f"{h}:{p}" for h, p in parse_nodes(nodes))
    return f"{CLUSTER_SCHEMES[1] if tls else CLUSTER_SCHEMES[0]}://{seeds}"


def redis_url_from_env(env: Mapping[str, str]) -> str | None:
    """``REDIS_URL``, or the cluster URL of ``REDIS_CLUSTER_NODES``; None when neither is set.
    Both set to different things is an error (which one would win is a guess)."""
    url = (env.get(ENV_REDIS_URL) or "").strip() or None
    nodes = (env.get(CLUSTER_NODES_ENV) or "").strip() or None
    if nodes is None:
        return url
    from_nodes = cluster_url(nodes)
    if url is not None and url != from_nodes:
        raise RedisUrlError(f"{CLUSTER_NODES_ENV}: set together with REDIS_URL={display_url(url)!r}"
                            f"; set only one of them")
    return from_nodes


def _split_cluster_url(url: str) -> tuple[bool, str | None, str | None, list[tuple[str, int]]]:
    scheme, _, rest = url.partition("://")
    rest = rest.split("/", 1)[0].split("?", 1)[0]
    user = password = None
    if "@" in rest:
        cred, rest = rest.rsplit("@", 1)
        user, _, password = cred.partition(":")
        user, password = unquote(user) or None, unquote(password) or None
    return scheme.lower() == CLUSTER_SCHEMES[1], user, password, parse_nodes(rest, what=ENV_REDIS_URL)


def display_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for logs and banners)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    cred, at, tail = rest.partition("@")
    user = cred.split(":", 1)[0]
    return f"{scheme}://{user}:***@{tail}" if ":" in cred else url


def connect(url: str, **options: Any) -> Any:
    """A ``redis.asyncio`` client for ``url``: ``RedisCluster`` for a cluster URL, ``Redis``
    otherwise; short socket timeouts and a health check either way (``options`` override)."""
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.backoff import ExponentialWithJitterBackoff
    from redis.retry import Retry

    # driver_info=None: no CLIENT SETINFO on connect. Redis before 7.2 (Debian 12's 7.0, what
    # `ldpstream up` and the tests run) answers it with an error, and redis-py reads that error
    # as the answer to its health-check PING when the check falls due between the handshake's
    # pipelined commands (an event loop busy for HEALTH_CHECK_INTERVAL_S): the connection fails
    # with "unknown subcommand 'SETINFO'" (tests/test_redis_client_setinfo.py)
    common: dict[str, Any] = dict(socket_timeout=SOCKET_TIMEOUT_S,
                                  socket_connect_timeout=CONNECT_TIMEOUT_S,
                                  health_check_interval=HEALTH_CHECK_INTERVAL_S,
                                  driver_info=None)
    if not is_cluster_url(url):
        return aioredis.from_url(url, **{**common, **options})
    tls, user, password, nodes = _split_cluster_url(url)
    kwargs: dict[str, Any] = dict(
        common, username=user, password=password, ssl=tls,
        # a master that died leaves its slots uncovered until its replica is promoted: start
        # anyway and report those slots as unreachable (transient) meanwhile
        require_full_coverage=False,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), CLUSTER_RETRIES))
    kwargs.update(options)
    return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes], **kwargs)


async def health(client: Any, timeout_s: float = 2.0) -> dict[str, Any]:
    """What ``/healthz`` reports about Redis: ``{"ok": bool, ...}``.

    One server: a PING. A cluster: ``CLUSTER INFO`` of every master in the client's slot map, at
    once (``cluster_state`` is ``fail`` when any of them says so), so a dead master (a failover
    in progress) shows as ``{"ok": False, "cluster_state": "fail", "unreachable":
    ["127.0.0.1:7001"], ...}`` instead of the PONG of whichever node answers first; errors are
    named, never raised."""
    from redis.asyncio.cluster import RedisCluster

    if not isinstance(client, RedisCluster):
        try:
            await asyncio.wait_for(client.ping(), timeout_s)
            return {"ok": True}
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            return {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
    init_error = None
    try:
        await asyncio.wait_for(client.initialize(), timeout_s)  # loads the slot map once
    except Exception as exc:  # noqa: BLE001 - e.g. the node it asks is the dead master
        init_error = f"{exc.__class__.__name__}: {exc}"
    masters = client.get_primaries()  # the slot map loaded last (a failed reload keeps it)
    if not masters:
        return {"ok": False, "cluster_state": "unknown",
                "error": init_error or "no master in the slot map"}
    replies = await asyncio.gather(*(asyncio.wait_for(
        client.execute_command("CLUSTER INFO", target_nodes=node), timeout_s) for node in masters),
        return_exceptions=True)  # a dead master is the point of the check: errors are data
    unreachable = [n.name for n, r in zip(masters, replies) if isinstance(r, BaseException)]
    states = {str(r.get("cluster_state", "unknown")) for r in replies
              if not isinstance(r, BaseException)}
    state = "fail" if "fail" in states else "ok" if states == {"ok"} else "unknown"
    ok = init_error is None and not unreachable and state == "ok"
    out: dict[str, Any] = {"ok": ok, "cluster_state": state, "masters": len(masters)}
    if unreachable:
        out["unreachable"] = unreachable
    if init_error is not None:
        out["error"] = init_error
    return out


async def run_script(client: Any, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    """Run a registered Lua ``script`` (``client.register_script``) by EVALSHA, falling back to
    EVAL when the server does not know it (NOSCRIPT). On a cluster the fallback matters: a
    promoted replica has an empty script cache, and redis-py's own reload (SCRIPT LOAD to the
    masters of its slot map) can miss the new master for good; EVAL goes where the key's slot is
    and caches the script there, so the next EVALSHA finds it."""
    try:
        try:
            return await script(keys=list(keys), args=list(args))
        except rexc.NoScriptError:
            return await client.eval(script.script, len(keys), *keys, *args)
    except (AttributeError, TypeError) as exc:
        if not _torn_down(exc):
            raise
        raise rexc.ConnectionError(f"connection torn down during the call: {exc!r}") from exc


async def run_script_after_sets(client: Any, script: Any, keys: Sequence[Any],
                                args: Sequence[Any], sets: Mapping[str, Any], px: int) -> Any:
    """``sets`` (key -> value, each expiring after ``px`` ms) written, then ``script`` run as
    :func:`run_script` does. On one server both go in one pipelined round trip, so Redis takes
    them in one turn of its event loop: under ``appendfsync always`` one fsync instead of two
    (docs/scaling.md "Per-device state"). On a cluster, or without ``sets``, one after the other."""
    from redis.asyncio.cluster import RedisCluster

    if not sets or isinstance(client, RedisCluster):
        for key, value in sets.items():
            await client.set(key, value, px=px)
        return await run_script(client, script, keys, args)
    try:
        pipe = client.pipeline(transaction=False)
        for key, value in sets.items():
            pipe.set(key, value, px=px)
        pipe.evalsha(script.sha, len(keys), *keys, *args)
        try:
            return (await pipe.execute())[-1]
        except rexc.NoScriptError:   # the sets went first and hold: the script alone again
            return await run_script(client, script, keys, args)
    except (AttributeError, TypeError) as exc:
        if not _torn_down(exc):
            raise
        raise rexc.ConnectionError(f"connection torn down during the call: {exc!r}") from exc


def _torn_down(exc: BaseException) -> bool:
    """True when ``exc`` (an AttributeError/TypeError) was raised inside redis-py's asyncio
    connection or the asyncio transport under it: a connection closed while in use (e.g. the
    cluster client dropping a dead node's connections while other calls use them) leaks as
    ``'NoneType' object has no attribute 'writelines'`` instead of a ConnectionError (redis-py
    issue 4287). A failed call like that is retried as a connection error."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return last is not None and (last.endswith(("redis/asyncio/connection.py",
                                                "asyncio/streams.py", "asyncio/selector_events.py")))
