"""A real Redis Cluster on loopback (3 masters + 3 replicas) and the client that talks to it:
formation, the cluster URL / REDIS_CLUSTER_NODES settings, SCAN over every master, a master
killed with SIGKILL and replaced by its replica while the client keeps working."""
from __future__ import annotations

import asyncio
import os

import pytest

from ldpstream.config import ConfigError, parse_config
from ldpstream.dev.redis_cluster import CLUSTER_SLOTS, EmbeddedRedisCluster
from ldpstream.redis_client import (
    TRANSIENT_ERRORS,
    RedisUrlError,
    cluster_url,
    connect,
    display_url,
    health,
    is_cluster_url,
    parse_nodes,
    redis_url_from_env,
)

pytestmark = pytest.mark.pipeline


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(")")[-1].split()[0] != "Z"


def test_cluster_has_three_masters_each_with_a_replica(redis_cluster):
    masters = redis_cluster.masters()
    assert len(masters) == 3 and len(redis_cluster.nodes) == 6
    covered = 0
    for m in masters:
        info = next(i for i in redis_cluster.cluster_nodes(m) if i.port == m.port)
        covered += sum(hi - lo + 1 for lo, hi in info.slots)
        assert len(redis_cluster.replicas_of(m)) == 1
    assert covered == CLUSTER_SLOTS
    assert redis_cluster.url == cluster_url(redis_cluster.seeds)


def test_stop_leaves_no_process_and_no_data():
    c = EmbeddedRedisCluster(masters=1, replicas=1)
    c.start()
    pids, root = [n.pid for n in c.nodes], c.data_root
    assert os.path.isdir(root)
    c.stop()
    assert not any(_alive(p) for p in pids) and not os.path.exists(root)
    c.stop()  # idempotent


def test_cluster_url_and_seed_settings():
    assert parse_nodes("a:1, b:2,") == [("a", 1), ("b", 2)]
    assert cluster_url(["h:7000", "h:7001"]) == "redis+cluster://h:7000,h:7001"
    assert is_cluster_url("rediss+cluster://h:1") and not is_cluster_url("redis://h:1/0")
    for bad in ("", "h", "h:x", "h:70000", ":1"):
        with pytest.raises(RedisUrlError, match="REDIS_CLUSTER_NODES"):
            parse_nodes(bad)
    assert redis_url_from_env({"REDIS_CLUSTER_NODES": "h:1,h:2"}) == "redis+cluster://h:1,h:2"
    assert redis_url_from_env({"REDIS_URL": "redis://x:1/0"}) == "redis://x:1/0"
    assert redis_url_from_env({}) is None
    with pytest.raises(RedisUrlError, match="REDIS_CLUSTER_NODES.*REDIS_URL.*only one"):
        redis_url_from_env({"REDIS_URL": "redis://x:1/0", "REDIS_CLUSTER_NODES": "h:1"})
    assert display_url("redis+cluster://u:secret@h:1,h:2") == "redis+cluster://u:***@h:1,h:2"


def test_config_resolves_cluster_nodes_and_names_a_bad_value():
    doc = {"collections": [{"id": "c", "schema": {"attributes": {"a": ["x", "y"]}},
                            "mechanism": "rr-ind", "epsilon": 1.0, "marginals": [["a"]]}]}
    cfg = parse_config(doc, env={"REDIS_CLUSTER_NODES": "127.0.0.1:7000,127.0.0.1:7001"})
    assert cfg.redis_url == "redis+cluster://127.0.0.1:7000,127.0.0.1:7001"
    with pytest.raises(ConfigError, match="REDIS_CLUSTER_NODES: 'nohost' is not host:port"):
        parse_config(doc, env={"REDIS_CLUSTER_NODES": "nohost"})


def test_client_spreads_keys_over_masters_and_scans_them_all(redis_cluster):
    async def run():
        r = connect(redis_cluster.url)
        try:
            keys = [f"ldp:{{scan-test#{p}}}:x" for p in range(24)]
            for i, k in enumerate(keys):
                await r.set(k, i)
            owners = {redis_cluster.master_of(k).port for k in keys}
            found = {k.decode() async for k in r.scan_iter(match="ldp:{scan-test#*", count=100)}
            deleted = await r.delete(*keys)  # split per slot by the cluster client
            return owners, found, deleted, await r.ping()
        finally:
            await r.aclose()

    owners, found, deleted, pong = asyncio.run(run())
    assert len(owners) == 3, "24 hash tags should land on all three masters"
    assert found == {f"ldp:{{scan-test#{p}}}:x" for p in range(24)}  # each key once (no replicas)
    assert deleted == 24 and pong


def test_master_killed_replica_promoted_client_follows(fresh_redis_cluster):
    c = fresh_redis_cluster
    key = "ldp:{failover#0}:n"

    async def run():
        r = connect(c.url)
        try:
            await r.set(key, 41)
            await r.execute_command("WAIT", 1, 2000, target_nodes=r.get_node_from_key(key))
            master = c.master_of(key)
            replica = c.replicas_of(master)[0]
            assert await health(r) == {"ok": True, "cluster_state": "ok", "masters": 3}
            c.crash_master(master)
            during = await health(r)
            errors: list[str] = []
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while True:  # what the ingest service does: retry transient errors
                try:
                    value = await r.incr(key)
                    break
                except TRANSIENT_ERRORS as exc:
                    errors.append(type(exc).__name__)
                    assert loop.time() < deadline, errors
                    await asyncio.sleep(0.1)
            new = c.wait_failover(master)
            after = await health(r)
            while not after["ok"]:  # the client reloads its slot map after a failed PING
                assert loop.time() < deadline, after
                await asyncio.sleep(0.1)
                after = await health(r)
            assert during["ok"] is False and during["unreachable"] == [f"127.0.0.1:{master.port}"]
            return value, replica.port, new.port, errors
        finally:
            await r.aclose()

    value, replica_port, new_port, errors = asyncio.run(run())
    assert value == 42, "the replicated write survived and the increment went to the new master"
    assert new_port == replica_port


def test_connection_torn_down_under_a_script_call_is_a_connection_error():
    """redis-py leaks AttributeError/TypeError from its asyncio connection when the connection is
    closed while in use; run_script turns exactly those into ConnectionError (retried) and lets
    any other AttributeError through."""
    import redis.exceptions as rexc

    from ldpstream.redis_client import run_script

    ns: dict = {}
    exec(compile("async def leak(keys, args):\n    None.writelines([b''])\n",
                 "/site-packages/redis/asyncio/connection.py", "exec"), ns)

    async def own_bug(keys, args):
        return None.missing  # an AttributeError of our own: not a connection problem

    with pytest.raises(rexc.ConnectionError, match="torn down"):
        asyncio.run(run_script(None, ns["leak"], ["k"], []))
    with pytest.raises(AttributeError):
        asyncio.run(run_script(None, own_bug, ["k"], []))


def test_cluster_url_credentials_reach_the_client():
    client = connect("rediss+cluster://app:p%40ss@10.0.0.1:7000,10.0.0.2:7001")
    kw = client.connection_kwargs
    assert (kw["username"], kw["password"]) == ("app", "p@ss")
    assert sorted(client.nodes_manager.startup_nodes) == ["10.0.0.1:7000", "10.0.0.2:7001"]
    anonymous = connect("redis+cluster://:secret@h:1")
    assert (anonymous.connection_kwargs["username"], anonymous.connection_kwargs["password"]) == \
        (None, "secret")
