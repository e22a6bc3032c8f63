"""``ldpstream gateway`` (or ``mqtt-bridge``: same /healthz) as a child process, for tests."""
from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request


class GatewayProcess:
    """``ldpstream gateway`` as a child process."""

    def __init__(self, env: dict, port: int, log_path: str, *,
                 command: tuple[str, ...] = ("gateway",)) -> None:
        self.port = port
        self._log = open(log_path, "ab")
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ldpstream.cli", *command, "--port", str(port)], env=env,
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)

    def wait_for(self, cid: str, timeout: float = 60.0,
                 tls: ssl.SSLContext | None = None) -> None:
        """Wait until /healthz names ``cid`` (over HTTPS with the client context ``tls``)."""
        scheme = "http" if tls is None else "https"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited {self.proc.returncode}: "
                                   f"{open(self.log_path).read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{scheme}://127.0.0.1:{self.port}/healthz",
                                            timeout=2, context=tls) as r:
                    if cid in json.loads(r.read())["collections"]:
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.3)
        raise TimeoutError(f"gateway does not know {cid!r}: {open(self.log_path).read()[-2000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode
