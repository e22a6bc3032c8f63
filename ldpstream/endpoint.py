"""Where a worker's HTTP API is: the web port (``--web-port``, else ``$LDP_WEB_PORT``, else
the default port), the URL the CLI queries (``--url``, else ``$LDP_API_URL``, else the URL a running
``ldpstream up`` recorded, else the default port), and a free port to suggest when one is busy
(docs/api.md, "Ports and URLs").
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

from ldpstream.errors import CliError
from ldpstream.names import DEFAULT_WEB_PORT, ENV_API_URL, ENV_STATE_DIR, ENV_WEB_PORT

#: ports tried after a busy one before giving up on a suggestion
SUGGEST_SPAN = 100


def web_port_default() -> int:
    """``$LDP_WEB_PORT`` (a port number, else a CliError naming the variable), else the default port."""
    raw = os.environ.get(ENV_WEB_PORT, "").strip()
    if not raw:
        return DEFAULT_WEB_PORT
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise CliError(f"{ENV_WEB_PORT}={raw!r}: not a TCP port (1-65535)")
    return int(raw)


def up_record_path() -> Path:
    """The file where a running ``ldpstream up`` records its API URL (per user)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"ldpstream-{os.getuid()}" / "up.json"


def state_dir() -> Path:
    """Where ``ldpstream up`` keeps what must survive a restart, its dev signing key
    (docs/devices.md, "The dev identity"): ``$LDP_STATE_DIR``, else
    ``$XDG_STATE_HOME/ldpstream``, else ``~/.local/state/ldpstream``."""
    explicit = os.environ.get(ENV_STATE_DIR, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "ldpstream"


def record_up(url: str) -> Path:
    """Record ``url`` as the API of this process's ``ldpstream up``."""
    path = up_record_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    tmp.replace(path)
    return path


def clear_up() -> None:
    """Remove this process's record (another ``up``'s record is left alone)."""
    path = up_record_path()
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recorded_up_url() -> str | None:
    """The URL recorded by an ``ldpstream up`` that is still running, else None."""
    try:
        doc = json.loads(up_record_path().read_text())
        url, pid = str(doc["url"]), int(doc["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return url if _alive(pid) else None


def api_url_default() -> str:
    """The URL ``ldpstream estimates`` queries without ``--url``."""
    return (os.environ.get(ENV_API_URL, "").strip() or recorded_up_url()
            or f"http://127.0.0.1:{web_port_default()}")


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


def suggest_free_port(host: str, busy: int) -> int | None:
    """The first port after ``busy`` that is free on ``host`` now, or None."""
    for port in range(busy + 1, min(65536, busy + 1 + SUGGEST_SPAN)):
        if port_free(host, port):
            return port
    return None


def require_free_port(host: str, port: int, command: str) -> None:
    """A CliError when ``host:port`` is taken, naming a free port and how to pass it."""
    if port_free(host, port):
        return
    free = suggest_free_port(host, port)
    hint = ("stop it or pick another port" if free is None else
            f"port {free} is free: `ldpstream {command} --web-port {free}`"
            + (f", `make up ARGS='--web-port {free}'`" if command == "up" else "")
            + f" or `{ENV_WEB_PORT}={free}`")
    raise CliError(f"--web-port {port}: already in use on {host} (another `ldpstream up` or "
                   f"worker?); {hint}")
