"""The example device programs with a device credential (docs/device-protocol.md "Example
programs", docs/security.md "Per-device identity"), on the real stack: Mosquitto → ``ldpstream
mqtt-bridge`` and ``ldpstream gateway`` → Kafka → one worker with the fleet's secret
(``LDP_DEVICE_SECRETS_FILE``, written by ``ldpstream device-credentials --init``) → Redis. For
each of the five programs (C ``ldp_mqtt`` and ``ldp_post`` under AddressSanitizer, TypeScript
``mqtt.js`` and ``post.js``, Python ``mqtt_device``), a run with ``--credential`` (what ``ldpstream
device-credentials`` printed) is counted, the same program without it is dead-lettered as
``unauthenticated``, and a credential of another device id is refused before anything is sent."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml
from conftest import wait_for_n
from kafka_helpers import read_dlq
from mqtt_helpers import DOM, FLEETS, bridge
from sdk_helpers import C_DIR, TS_DIR, ts_sdk  # noqa: F401
from test_gateway import TOKEN_A, GatewayProcess, fleets_doc
from test_sdk_mqtt import SANITIZED

from ldpstream.producers.signing import ENV_PUBLIC_KEY

pytestmark = pytest.mark.pipeline

N, BATCH = 6, 3  # records per run, reports per batch: 2 batches a run
RECORDS = "".join(f"os={DOM.categories('os')[i % 3]},plan={DOM.categories('plan')[i % 2]}\n"
                  for i in range(N))


def _ldpstream(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "ldpstream.cli", *args], capture_output=True,
                          text=True, timeout=60, check=True)
    return done.stdout


@pytest.fixture(scope="module")
def c_examples(tmp_path_factory) -> Path:
    """ldp_mqtt and ldp_post built as ``make test-sdk`` builds them (-fsanitize=address,undefined)."""
    build = tmp_path_factory.mktemp("sdk-c-asan") / "build"
    subprocess.run(["cmake", "-S", str(C_DIR), "-B", str(build), "-DCMAKE_BUILD_TYPE=Debug",
                    "-DLDP_SANITIZE=ON"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "-j2", "--target", "ldp_mqtt", "ldp_post"],
                   check=True, capture_output=True)
    return build


def _program(kind: str, c_build: Path, ts_dist: Path) -> tuple[list[str], dict, Path | None]:
    """argv prefix, extra environment and working directory of one example program."""
    if kind.startswith("c-"):
        return [str(c_build / f"ldp_{kind[2:]}")], dict(SANITIZED), None
    if kind.startswith("ts-"):
        return ["node", str(ts_dist / "tools" / f"{kind[3:]}.js")], {}, TS_DIR
    return [sys.executable, "-m", "ldpstream.producers.mqtt_device"], {}, None


def test_example_programs_with_and_without_a_credential(
        tmp_path, mosquitto, kafka_broker, redis_server, spawn_worker, service_env, unique_name,
        c_examples, ts_sdk):  # noqa: F811
    from ldpstream.agents.app import make_store
    from ldpstream.config import load_config
    from ldpstream.dev.process import free_port

    cid = unique_name
    secrets = tmp_path / "fleets-secrets.yaml"
    _ldpstream("device-credentials", "--init", str(secrets), "--fleets", "phones")
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"collections": [{
        "id": cid, "schema": {"attributes": {a: list(DOM.categories(a)) for a in DOM.attrs}},
        "mechanism": "rr-ind", "epsilon": 1.0, "partitions": 1, "marginals": [["os", "plan"]],
        "estimators": ["castell"], "refresh_interval_s": 1.0}]}))
    coll = load_config(config).collections[cid]
    worker = spawn_worker(str(config), env=dict(service_env,
                                                LDP_DEVICE_SECRETS_FILE=str(secrets)))
    worker.wait_ready(60)
    fleets = tmp_path / "mqtt-fleets.yaml"
    fleets.write_text(yaml.safe_dump({"fleets": {"phones": {"collections": [cid]}}}))
    programs = ((10, "c-mqtt"), (20, "ts-mqtt"), (30, "py-mqtt"), (40, "c-post"), (50, "ts-post"))
    with ExitStack() as running:
        gateway = GatewayProcess(dict(service_env,
                                      LDP_GATEWAY_TOKENS=json.dumps(fleets_doc(cid))),
                                 free_port(), str(tmp_path / "gateway.log"))
        running.callback(lambda: gateway.stop() == 0 or pytest.fail("the gateway failed"))
        proc = bridge(dict(service_env, LDP_MQTT_URL=mosquitto.bridge_url,
                           LDP_MQTT_FLEETS_FILE=str(fleets), LDP_MQTT_CLIENT_ID=f"bridge-{cid}",
                           LDP_MQTT_CA=""), tmp_path, cid)
        running.callback(lambda: proc.stop() == 0 or pytest.fail("the bridge failed"))
        gateway.wait_for(cid)
        where = {"mqtt": [f"mqtt://phones@127.0.0.1:{mosquitto.port}", "-", "phones", cid],
                 "post": [f"http://127.0.0.1:{gateway.port}", TOKEN_A, cid]}
        for base, kind in programs:
            argv, extra, cwd = _program(kind, c_examples, ts_sdk)
            head = where[kind.rsplit("-", 1)[1]]
            env = dict(os.environ, LDP_MQTT_PASSWORD=FLEETS["phones"].password, **extra)
            for dev, signed in ((base + 1, True), (base + 2, False)):
                state = tmp_path / f"{kind}-{dev}"
                state.mkdir()
                opts = []
                if signed:
                    cred = tmp_path / f"{kind}-{dev}.json"
                    cred.write_text(_ldpstream("device-credentials", "--secrets", str(secrets),
                                               "--fleet", "phones", "--device-id", str(dev)))
                    opts = ["--credential", str(cred)]
                done = subprocess.run(
                    [*argv, *opts, *head, os.environ[ENV_PUBLIC_KEY], str(dev), str(state),
                     str(BATCH)], input=RECORDS, capture_output=True, text=True, timeout=120,
                    env=env, cwd=cwd)
                assert done.returncode == 0, (kind, signed, done.stderr)
                assert json.loads(done.stdout) == {"sent": N, "batches": 2}, (kind, done.stdout)
                assert "Sanitizer" not in done.stderr, done.stderr
            # a credential for another device than DEVICE_ID is refused before anything is sent
            other = tmp_path / f"{kind}-{base + 1}.json"
            wrong = subprocess.run([*argv, "--credential", str(other), *head,
                                    os.environ[ENV_PUBLIC_KEY], str(base + 2),
                                    str(tmp_path / f"{kind}-{base + 2}"), str(BATCH)],
                                   input=RECORDS, capture_output=True, text=True, timeout=60,
                                   env=env, cwd=cwd)
            assert wrong.returncode == 2 and "not the credential's" in wrong.stderr, \
                (kind, wrong.returncode, wrong.stderr)
            assert "Sanitizer" not in wrong.stderr, wrong.stderr

        async def counted() -> int:
            store = make_store(redis_server.url)
            try:
                return await wait_for_n(store, cid, len(programs) * N, timeout=60)
            finally:
                await store.close()

        assert asyncio.run(counted()) == len(programs) * N  # the credentialed runs
        deadline = time.monotonic() + 30
        dlq: list[dict] = []
        while time.monotonic() < deadline and len(dlq) < 2 * len(programs):
            dlq = read_dlq(kafka_broker.bootstrap, topic=coll.topic)
            time.sleep(0.5)
        # the runs without a credential: 2 batches each
        assert sorted(r["reason"] for r in dlq) == ["unauthenticated"] * 2 * len(programs), dlq
        assert asyncio.run(counted()) == len(programs) * N  # and nothing more was counted
