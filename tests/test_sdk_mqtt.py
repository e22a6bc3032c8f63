"""The C and TypeScript device SDKs over MQTT (docs/devices.md, "Devices over MQTT"): the C example
(libmosquitto, built with AddressSanitizer and UBSan) and the TypeScript MqttTransport connect to a
real Mosquitto over TLS with their fleet's password, read the retained signed state, verify it,
and publish keyed batches at QoS 1. Every message a subscriber receives decodes with
producers/codec.py and passes the gateway's ``validate_batch``; each device's records arrive as
one randomized report each, in batches with distinct batch keys of that device; and through the
bridge, Kafka and a worker, the counts are exact. A wrong password and a host name
the broker's certificate does not carry are refused."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mqtt_helpers import BRIDGE, FLEETS
from sdk_helpers import C_DIR, TS_DIR, ts_sdk  # noqa: F401
from test_mosquitto import client, close, publish, subscribe

from ldpstream.dev.mosquitto import MosquittoService
from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.names import mqtt_config_topic, mqtt_reports_topic
from ldpstream.producers.gateway import validate_batch
from ldpstream.producers.signing import ENV_PUBLIC_KEY, load_signing_key

pytestmark = pytest.mark.pipeline

DOM = Domain.from_categories({"os": ["android", "ios", "other"], "plan": ["free", "pro"]})
N, BATCH = 150, 40  # records per device, reports per batch: 4 batches each
SANITIZED = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
             "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


@pytest.fixture(scope="module")
def c_asan(tmp_path_factory) -> Path:
    """sdk/c built as ``make test-sdk`` builds it (Debug, -fsanitize=address,undefined)."""
    build = tmp_path_factory.mktemp("sdk-c-asan") / "build"
    subprocess.run(["cmake", "-S", str(C_DIR), "-B", str(build), "-DCMAKE_BUILD_TYPE=Debug",
                    "-DLDP_SANITIZE=ON"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "-j2", "--target", "ldp_mqtt"], check=True,
                   capture_output=True)
    assert (build / "ldp_mqtt").is_file(), "libmosquitto-dev missing: run make install"
    return build


@pytest.fixture
def broker(tmp_path):
    """Mosquitto with TLS whose certificate names only ``localhost`` (not 127.0.0.1)."""
    svc = MosquittoService(tmp_path / "mosquitto", tls=True, fleets=FLEETS, bridge=BRIDGE,
                           tls_hosts=("localhost",))
    svc.start()
    yield svc
    svc.stop()


def _records(seed: int) -> list[dict[str, str]]:
    rng = np.random.default_rng(seed)
    return [{a: str(rng.choice(DOM.categories(a))) for a in DOM.attrs} for _ in range(N)]


def _c(build: Path, url: str, ca: str, cid: str, dev: int, state: Path, records, password: str):
    text = "".join(",".join(f"{a}={v}" for a, v in r.items()) + "\n" for r in records)
    return subprocess.run([str(build / "ldp_mqtt"), url, ca, "phones", cid,
                           os.environ[ENV_PUBLIC_KEY], str(dev), str(state), str(BATCH)],
                          input=text, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, LDP_MQTT_PASSWORD=password, **SANITIZED))


def _ts(dist: Path, url: str, ca: str, cid: str, dev: int, state: Path, records, password: str):
    text = "".join(json.dumps(r) + "\n" for r in records)
    return subprocess.run(["node", str(dist / "tools" / "mqtt.js"), url, ca, "phones", cid,
                           os.environ[ENV_PUBLIC_KEY], str(dev), str(state), str(BATCH)],
                          input=text, capture_output=True, text=True, timeout=120, cwd=TS_DIR,
                          env=dict(os.environ, LDP_MQTT_PASSWORD=password))


def test_c_and_ts_devices_publish_keyed_batches_over_mqtt_tls(broker, c_asan, ts_sdk,  # noqa: F811
                                                               tmp_path, unique_name):
    cid = unique_name
    mech = RRIndependent(DOM, epsilon=1.0, version=3)
    bridge = client(broker, BRIDGE, "edge-test-bridge")
    try:
        publish(bridge, mqtt_config_topic("phones", cid),
                load_signing_key().sign_state(mech.device_state(), cid), retain=True)
        seen = subscribe(bridge, mqtt_reports_topic("phones", cid))
        url, ca = f"mqtts://phones@localhost:{broker.port}", str(broker.ca_path)
        password = FLEETS["phones"].password
        devices = {101: (_records(1), _c), 202: (_records(2), _ts)}
        for dev, (records, run) in devices.items():
            (tmp_path / str(dev)).mkdir()
            sdk = c_asan if run is _c else ts_sdk
            done = run(sdk, url, ca, cid, dev, tmp_path / str(dev), records, password)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout) == {"sent": N, "batches": 4}, done.stdout
        got = []
        while len(got) < 8:
            got.append(seen.get(timeout=10))
        with pytest.raises(queue.Empty):
            seen.get(timeout=0.5)  # QoS 1 may redeliver; on a healthy connection it did not
    finally:
        close(bridge)

    known = {cid: {3: mech}}
    by_dev: dict[int, list] = {101: [], 202: []}
    for topic, payload, _retain in got:
        assert topic == mqtt_reports_topic("phones", cid)
        batch = validate_batch(cid, None, payload, known, 1 << 20)  # the gateway's one check
        assert batch.version == 3 and batch.key is not None
        sender, sequence = batch.key
        assert set(batch.device_ids.tolist()) == {sender}
        by_dev[sender].append((sequence, batch.reports))
    for dev in devices:
        seqs = [s for s, _ in by_dev[dev]]
        assert len(seqs) == 4 == len(set(seqs)), seqs  # one batch key per batch
        reports = np.concatenate([r for _, r in sorted(by_dev[dev], key=lambda x: x[0])])
        assert reports.shape == (N, 2)
        assert reports.max(axis=0).tolist() <= [2, 1]  # randomized, inside the domain


def test_wrong_password_and_wrong_host_name_are_refused(broker, c_asan, ts_sdk,  # noqa: F811
                                                         tmp_path, unique_name):
    ca, good = str(broker.ca_path), FLEETS["phones"].password
    records = _records(3)[:2]
    cases = [  # (url, password, what the C example says)
        (f"mqtts://phones@localhost:{broker.port}", "wrong-password", "refused the connection"),
        (f"mqtts://phones@127.0.0.1:{broker.port}", good,  # not in the certificate
         "certificate verify failed"),
    ]
    for i, (url, password, said) in enumerate(cases):
        state = tmp_path / f"s{i}"
        state.mkdir()
        c = _c(c_asan, url, ca, unique_name, 7, state, records, password)
        assert c.returncode == 1, (c.returncode, c.stderr)
        assert said in c.stderr and "ERROR: AddressSanitizer" not in c.stderr, c.stderr
        t = _ts(ts_sdk, url, ca, unique_name, 7, state, records, password)
        assert t.returncode != 0 and t.stdout == "", t.stderr
        assert ("Not authorized" in t.stderr or "Bad User Name or Password" in t.stderr
                if password != good else "altnames" in t.stderr.lower() or
                "IP: 127.0.0.1 is not in the cert" in t.stderr), t.stderr


def test_c_and_ts_devices_counted_exactly_through_the_bridge(
        tmp_path, mosquitto_tls, kafka_broker, redis_server, spawn_worker, service_env,
        unique_name, c_asan, ts_sdk):  # noqa: F811
    """End to end: the examples → Mosquitto (TLS) → ``ldpstream mqtt-bridge`` → Kafka → worker →
    Redis. The state comes retained from the bridge; the counts equal the counts of the reports
    the bridge produced (read back from the report topic, stamped with the fleet's ids)."""
    import asyncio

    from test_gateway import _topic_messages
    from test_mqtt_bridge import bridge, check_counts, metric, setup

    from ldpstream.producers.codec import decode_batch
    from ldpstream.producers.gateway import stamp

    cid = unique_name
    ca = str(mosquitto_tls.ca_path)
    coll, _worker, env = setup(tmp_path, service_env, spawn_worker, cid, mosquitto_tls, ca=ca)
    proc = bridge(env, tmp_path, cid)
    try:
        url = f"mqtts://phones@localhost:{mosquitto_tls.port}"
        for dev, seed, run, sdk in ((101, 1, _c, c_asan), (202, 2, _ts, ts_sdk)):
            (tmp_path / str(dev)).mkdir()
            done = run(sdk, url, ca, cid, dev, tmp_path / str(dev), _records(seed),
                       FLEETS["phones"].password)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout) == {"sent": N, "batches": 4}, done.stdout
        batches = [decode_batch(m.value) for m in
                   asyncio.run(_topic_messages(kafka_broker.bootstrap, f"ldp.reports.{cid}"))]
        assert len(batches) == 8 and all(b.key is not None for b in batches)
        ids = np.concatenate([b.device_ids for b in batches])
        assert sorted(set(ids.tolist())) == sorted(
            stamp("phones", np.array([101, 202], np.uint64)).tolist())
        reports = np.concatenate([b.reports for b in batches])
        assert len(reports) == 2 * N
        asyncio.run(check_counts(redis_server.url, coll, coll.mechanism(), reports))
        assert metric(proc.port, "ldp_mqtt_reports_total", 'fleet="phones"') == 2 * N
        from test_compose import SERVICES  # compose's bridge healthcheck, pointed at this one

        code = SERVICES["mqtt-bridge"]["healthcheck"]["test"][-1].replace(":8081/",
                                                                          f":{proc.port}/")
        assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0
    finally:
        assert proc.stop() == 0


def _start(build: Path, kind: str, url: str, ca: str, cid: str, dev: int, state: Path,
           password: str) -> subprocess.Popen:
    if kind == "c":
        argv, env, cwd = [str(build / "ldp_mqtt")], dict(os.environ, **SANITIZED), None
    else:
        argv, env, cwd = ["node", str(build / "tools" / "mqtt.js")], dict(os.environ), TS_DIR
    env["LDP_MQTT_PASSWORD"] = password
    return subprocess.Popen([*argv, url, ca, "phones", cid, os.environ[ENV_PUBLIC_KEY], str(dev),
                             str(state), str(BATCH)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=cwd)


def _line(kind: str, record: dict[str, str]) -> str:
    return (",".join(f"{a}={v}" for a, v in record.items()) if kind == "c"
            else json.dumps(record)) + "\n"


@pytest.mark.parametrize("kind", ["c", "ts"])
def test_a_broker_restart_mid_stream_loses_no_batch(kind, broker, c_asan, ts_sdk,  # noqa: F811
                                                    tmp_path, unique_name):
    """The device reconnects (persistent session) and sends again what was not acknowledged:
    after a Mosquitto restart between two batches, every batch key arrives (at least once:
    QoS 1; the worker counts a key once, docs/security.md "Idempotent batches")."""
    cid = unique_name
    mech = RRIndependent(DOM, epsilon=1.0, version=3)
    sub = client(broker, BRIDGE, "edge-restart-sub", persistent=True)
    publish(sub, mqtt_config_topic("phones", cid),
            load_signing_key().sign_state(mech.device_state(), cid), retain=True)
    seen = subscribe(sub, mqtt_reports_topic("phones", cid))
    (tmp_path / "dev").mkdir()
    records = _records(7)
    proc = _start(c_asan if kind == "c" else ts_sdk, kind,
                  f"mqtts://phones@localhost:{broker.port}", str(broker.ca_path), cid, 9,
                  tmp_path / "dev", FLEETS["phones"].password)
    got = []
    try:
        assert proc.stdin is not None
        proc.stdin.write("".join(_line(kind, r) for r in records[:2 * BATCH + 1]))
        proc.stdin.flush()
        got.append(seen.get(timeout=30))  # the first batch is through
        close(sub)
        broker.restart()  # the device is connected and idle
        out, err = proc.communicate("".join(_line(kind, r) for r in records[2 * BATCH + 1:]),
                                    timeout=90)
        assert proc.returncode == 0, err
        assert json.loads(out) == {"sent": N, "batches": 4}, out
        sub = client(broker, BRIDGE, "edge-restart-sub", persistent=True)
        seen = sub.user_data_get()
        sub.subscribe(mqtt_reports_topic("phones", cid), qos=1)
        while True:
            try:
                got.append(seen.get(timeout=3))
            except queue.Empty:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        close(sub)
    log = Path(broker.log_path).read_text(errors="replace")
    assert log.count(" as phones-9 ") >= 2, "the device did not reconnect"
    by_key = {}
    for _topic, payload, _retain in got:
        batch = validate_batch(cid, None, payload, {cid: {3: mech}}, 1 << 20)
        by_key.setdefault(batch.key, batch.n)
    assert len(by_key) == 4 and sum(by_key.values()) == N, by_key
