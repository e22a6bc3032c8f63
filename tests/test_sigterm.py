"""SIGTERM ends every long-running command cleanly: exit status 0 and no traceback, whether it
arrives while the command starts or once it runs (gateway, worker, fleet, up, simulate, bench)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.e2e


def _answers(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


def run_and_term(argv: list[str], env: dict, after_s: float, tmp_path,
                 ready: str | None = None, timeout: float = 60.0,
                 ready_url: str | None = None) -> tuple[int, str]:
    """Start ``ldpstream ARGV``; SIGTERM it ``after_s`` seconds after ``ready`` appears in its
    output and ``ready_url`` answers 200 (or after its start); (exit status, output). Started
    is judged by what the command says, never by a time: a loaded machine starts slowly."""
    log = tmp_path / f"{argv[0]}-{time.monotonic_ns()}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ldpstream.cli", *argv], env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while (ready and ready not in log.read_text(errors="replace")) or \
                    (ready_url and not _answers(ready_url)):
                assert proc.poll() is None, log.read_text(errors="replace")
                assert time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.1)
            time.sleep(after_s)
            assert proc.poll() is None, log.read_text(errors="replace")
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(60)
            except subprocess.TimeoutExpired:
                pytest.fail("still running 60 s after SIGTERM; its output:\n"
                            + log.read_text(errors="replace"))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return code, log.read_text(errors="replace")


def assert_clean(code: int, output: str, started: bool = True) -> None:
    """No traceback, no leak warning; a service stopped while starting may also say so (143)."""
    assert "Traceback" not in output and "Task was destroyed" not in output, output
    assert "Unclosed" not in output, output
    if started:
        assert code == 0, (code, output)
    else:
        assert code == 0 or (code == 143 and "stopped by SIGTERM" in output), (code, output)


@pytest.fixture
def gateway_env(tmp_path, kafka_broker):
    import asyncio

    from ldpstream.kafka_admin import create_topics

    asyncio.run(create_topics(kafka_broker.bootstrap, {"ldp.config": 1}, compacted={"ldp.config"}))
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"fleets": {"phones": {"token": "t" * 24,
                                                        "collections": ["adult"]}}}))
    return dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_broker.bootstrap,
                LDP_GATEWAY_TOKENS_FILE=str(tokens))


@pytest.mark.parametrize("when", ["starting", "serving"])
def test_gateway(tmp_path, gateway_env, when):
    from ldpstream.dev.process import free_port

    argv = ["gateway", "--port", str(free_port())]
    code, out = (run_and_term(argv, gateway_env, 0.3, tmp_path) if when == "starting" else
                 run_and_term(argv, gateway_env, 1.0, tmp_path, ready="ldpstream gateway: http"))
    assert_clean(code, out, started=when != "starting")


@pytest.mark.parametrize("when", ["starting", "running"])
def test_fleet(tmp_path, service_env, when):
    argv = ["fleet", "--rate", "500", "--devices", "50"]
    code, out = (run_and_term(argv, service_env, 0.5, tmp_path) if when == "starting" else
                 run_and_term(argv, service_env, 0.5, tmp_path, ready="messages, "))
    assert_clean(code, out, started=when != "starting")


@pytest.mark.parametrize("after_s", [0.5, 2.0, 3.5, "ready"])
def test_worker(tmp_path, service_env, after_s):
    """From importing to joining the group to consuming: wherever the signal lands ("ready":
    once its /healthz answers 200)."""
    from ldpstream.dev.process import free_port

    port = free_port()
    argv = ["worker", "--web-port", str(port)]
    if after_s == "ready":
        code, out = run_and_term(argv, service_env, 1.0, tmp_path,
                                 ready_url=f"http://127.0.0.1:{port}/healthz")
    else:
        code, out = run_and_term(argv, service_env, after_s, tmp_path)
    assert_clean(code, out, started=after_s == "ready")


def test_simulate(tmp_path):
    argv = ["simulate", "--ways", "2,3", "--subsets", "50", "--runs", "20"]
    code, out = run_and_term(argv, dict(os.environ), 3.0, tmp_path)
    assert_clean(code, out, started=False)
    assert code == 143, (code, out)   # a batch job cut short: stopped, not done


def test_up(tmp_path):
    from ldpstream.dev.process import free_port

    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL")}
    code, out = run_and_term(["up", "--no-fleet", "--web-port", str(free_port())], env, 1.0,
                             tmp_path, ready="Ctrl-C stops everything", timeout=120)
    assert_clean(code, out)
    assert out.rstrip().endswith("stopped."), out
