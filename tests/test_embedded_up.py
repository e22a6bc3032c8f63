"""``ldpstream up`` with no KAFKA_BOOTSTRAP_SERVERS/REDIS_URL: starts the embedded broker, Redis,
a worker and a fleet, serves /healthz and /metrics with reports ingested, and exits cleanly (after
--duration, or on Ctrl-C) leaving no child process behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.e2e


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.read().decode()
    except Exception:  # noqa: BLE001 - not up yet
        return None


def _ingested(metrics: str | None) -> float:
    for line in (metrics or "").splitlines():
        if line.startswith("ldp_reports_ingested_total{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("how", ["duration", "sigint"])
def test_up_serves_and_exits_cleanly(tmp_path, how):
    from ldpstream.dev.process import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL")}
    # where `up` records its URL for `estimates` (per runtime directory): this test's own, so
    # another `up` running at the same time is not followed
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "run")
    duration = "25" if how == "duration" else "120"
    out = open(tmp_path / "up.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "ldpstream.cli", "up", "--duration", duration,
                             "--web-port", str(port), "--rate", "3000"], env=env, stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        health = metrics = None
        while time.monotonic() < deadline and proc.poll() is None:
            seen |= _descendants(proc.pid)
            health = _get(f"http://127.0.0.1:{port}/healthz")
            metrics = _get(f"http://127.0.0.1:{port}/metrics")
            if health and _ingested(metrics) > 0:
                break
            time.sleep(0.5)
        log = (tmp_path / "up.log").read_text(errors="replace")
        assert health and '"ok"' in health, log
        assert _ingested(metrics) > 0, log
        # the page, and `ldpstream estimates` without --url follows the port `up` chose
        assert "<title>ldpstream" in (_get(f"http://127.0.0.1:{port}/") or ""), log
        cli_env = {k: v for k, v in env.items() if k not in ("LDP_API_URL", "LDP_WEB_PORT")}
        listed = subprocess.run([sys.executable, "-m", "ldpstream.cli", "estimates", "--json"],
                                env=cli_env, capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0 and '"adult"' in listed.stdout, listed.stderr
        seen |= _descendants(proc.pid)
        assert len(seen) >= 3, seen  # broker, Redis, worker
        if how == "sigint":
            proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
    log = (tmp_path / "up.log").read_text(errors="replace")
    assert "API:" in log and "metrics: http://127.0.0.1:" in log and "stopped." in log, log
    assert f"page:    http://127.0.0.1:{port}/" in log, log
    assert "reports/s" in log
    time.sleep(0.5)
    left = [p for p in seen if _alive(p)]
    assert not left, (left, log)
