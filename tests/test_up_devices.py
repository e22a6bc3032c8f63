"""``make up MQTT=1`` as a device operator meets it: the banner prints the dev identity (public
key and where it is kept, the same across restarts) and ends with one device command per SDK;
each printed command, run as printed by a shell, reports to the real embedded stack (Tansu,
Redis, worker, Mosquitto, bridge) under the SDKs' default ε ceiling, and the worker counts the
three devices (docs/devices.md "A real device on `make up MQTT=1`")."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]


def _metric(url: str, name: str) -> float:
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def _banner(log: Path, proc: subprocess.Popen, until: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        text = log.read_text(errors="replace")
        if until in text:
            return text
        time.sleep(0.5)
    raise AssertionError(f"no {until!r} in the output of up:\n{log.read_text(errors='replace')}")


def _start_up(tmp_path: Path, state: Path, name: str, *extra: str) -> tuple[subprocess.Popen, Path]:
    from ldpstream.dev.process import free_port
    from ldpstream.producers.signing import ENV_PUBLIC_KEY, ENV_SIGNING_KEY

    env = {k: v for k, v in os.environ.items()
           if k not in ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL", ENV_SIGNING_KEY, ENV_PUBLIC_KEY)}
    env["LDP_STATE_DIR"] = str(state)
    log = tmp_path / f"{name}.log"
    proc = subprocess.Popen([sys.executable, "-m", "ldpstream.cli", "up", "--no-fleet",
                             "--duration", "400", "--web-port", str(free_port()), *extra],
                            env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=tmp_path)
    return proc, log


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(2)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _docs_block() -> str:
    """The first sh block of docs/device-protocol.md's "Example programs"."""
    doc = (ROOT / "docs" / "device-protocol.md").read_text()
    section = doc.split("### Example programs", 1)[1]
    return section.split("```sh\n", 1)[1].split("```", 1)[0]


def test_c_example_frees_everything_on_its_error_path(tmp_path):
    """ldp_post under AddressSanitizer with no gateway to reach: one line, exit 1, no leak
    (libcurl's handles are cleaned up at exit on every path)."""
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(ROOT / "sdk" / "c"), "-B", str(build), "-DLDP_SANITIZE=ON",
                    "-DCMAKE_BUILD_TYPE=Debug"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "-j2", "--target", "ldp_post"], check=True,
                   capture_output=True)
    from ldpstream.producers.signing import SigningKey

    key = SigningKey.generate().verify_key.to_text()
    (tmp_path / "state").mkdir()
    done = subprocess.run([str(build / "ldp_post"), "http://127.0.0.1:9", "t", "adult", key, "1",
                           str(tmp_path / "state")], input="sex=Male\n", capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and "GET http://127.0.0.1:9/v1/collections/adult/config" in \
        done.stderr, done.stderr
    assert "LeakSanitizer" not in done.stderr and "leaked" not in done.stderr, done.stderr
    usage = subprocess.run([str(build / "ldp_post")], capture_output=True, text=True)
    assert usage.returncode == 2 and "attr=label" in usage.stderr


def test_printed_device_commands_work_as_printed(tmp_path):
    state = tmp_path / "state"
    proc, log = _start_up(tmp_path, state, "up", "--mqtt")
    try:
        text = _banner(log, proc, "Ctrl-C stops everything")
        key = re.search(r"signing: devices pin the public key (\S+)", text).group(1)
        assert (state / "config-signing.pub").read_text().strip() == key
        assert f"kept in {state}" in text
        web = re.search(r"page:\s+(http://\S+?)/\s", text).group(1)
        lines = text.splitlines()
        commands = {lines[i].strip().rstrip(":"): lines[i + 1].strip()
                    for i, line in enumerate(lines[:-1])
                    if line.strip() in ("C:", "TypeScript:", "Python:")}
        assert set(commands) == {"C", "TypeScript", "Python"}, text
        # the demo's state is under every SDK's default ceiling: no --max-epsilon anywhere
        for name, cmd in commands.items():
            # run by a shell exactly as printed, from another directory, with a clean PATH's venv
            done = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=300)
            assert done.returncode == 0, (name, cmd, done.stdout, done.stderr)
            assert json.loads(done.stdout.strip().splitlines()[-1]) == {"sent": 1, "batches": 1}, \
                (name, done.stdout)
            assert "LeakSanitizer" not in done.stderr and "runtime error" not in done.stderr
            # again: the memoized record was reported this period, nothing is sent or spent
            again = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, capture_output=True,
                                   text=True, timeout=300)
            assert again.returncode == 0, (name, again.stderr)
            assert json.loads(again.stdout.strip().splitlines()[-1]) == \
                {"sent": 0, "batches": 0, "duplicates": 1}, (name, again.stdout)
        # docs/device-protocol.md "Example programs": its shell block, as written, from the checkout
        mqtt_url = re.search(r"(mqtt://devices@127\.0\.0\.1:\d+)", text).group(1)
        password = re.search(r"LDP_MQTT_PASSWORD=(\S+)", text).group(1)
        done = subprocess.run(["bash", "-ec", _docs_block()], cwd=ROOT, capture_output=True,
                              text=True, timeout=600,
                              env=dict(os.environ, MQTT_URL=mqtt_url, LDP_MQTT_PASSWORD=password,
                                       PUBLIC_KEY=key, WORK=str(tmp_path / "docs")))
        assert done.returncode == 0, (done.stdout, done.stderr)
        summaries = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        assert summaries == [{"sent": 1, "batches": 1, "duplicates": 1}] * 3, done.stdout
        assert done.stdout.count("usage:") == 3, done.stdout
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and \
                _metric(web, "ldp_reports_ingested_total") < 6:
            time.sleep(1)
        assert _metric(web, "ldp_reports_ingested_total") == 6
        assert _metric(web, "ldp_reports_rejected_total") == 0
    finally:
        _stop(proc)
    assert proc.returncode == 0, log.read_text(errors="replace")
    # a healthy start and stop is quiet (docs/devices.md "What `up` prints"): here and in the
    # worker's log, none of the lines that used to frighten on the embedded stack
    worker_log = Path(re.search(r"worker: pid \d+, log (\S+)", text).group(1))
    for name, body in (("up", log.read_text(errors="replace")),
                       ("worker", worker_log.read_text(errors="replace"))):
        for noise in ("Unable connect", "InitProducerIdRequest", "leader failover", "ERROR",
                      "Traceback"):
            assert noise not in body, (name, noise, body[-3000:])
    # a restart keeps the identity and the fleet password: the printed commands stay valid
    proc, log2 = _start_up(tmp_path, state, "up2", "--mqtt")
    try:
        text2 = _banner(log2, proc, "Ctrl-C stops everything")
        assert f"devices pin the public key {key}" in text2
        password = re.search(r"LDP_MQTT_PASSWORD=(\S+)", text).group(1)
        assert f"LDP_MQTT_PASSWORD={password}" in text2
    finally:
        _stop(proc)
