"""End to end with the C and TypeScript device SDKs (docs/device-protocol.md): the C example
(libcurl) and the TypeScript package's fetch transport fetch the signed state from the real
HTTP gateway, verify it, randomize seeded records with the OS CSPRNG and post batches with
their batch keys; gateway → Kafka → worker → Redis. The counts equal the counts of the reports
the batches carry (read back from the report topic, with the gateway's stamps of the two
device ids), and the
estimate the worker serves equals the estimate computed offline
(the mechanism's ``estimate`` on the same reports, as ``ldpstream simulate`` does) to 1e-9."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess

import numpy as np
import pytest
import yaml
from sdk_helpers import TS_DIR, c_sdk, ts_sdk  # noqa: F401
from store_helpers import assert_counted
from test_gateway import TOKEN_A, GatewayProcess, _topic_messages, fleets_doc

from ldpstream.estimators.kernels.domain import Domain
from ldpstream.producers.codec import decode_batch
from ldpstream.producers.gateway import stamp
from ldpstream.producers.signing import ENV_PUBLIC_KEY

pytestmark = pytest.mark.pipeline

DOM = Domain.from_categories({"os": ["android", "ios", "other"], "plan": ["free", "pro"]})
N = 150  # records per SDK


def _records(seed: int) -> list[dict[str, str]]:
    rng = np.random.default_rng(seed)
    return [{a: str(rng.choice(DOM.categories(a))) for a in DOM.attrs} for _ in range(N)]


def test_c_and_ts_devices_through_the_gateway(tmp_path, kafka_broker, redis_server,
                                              spawn_worker, service_env, unique_name,
                                              c_sdk, ts_sdk):  # noqa: F811
    from ldpstream.config import load_config
    from ldpstream.dev.process import free_port

    cid = unique_name
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"collections": [{
        "id": cid, "schema": {"attributes": {a: list(DOM.categories(a)) for a in DOM.attrs}},
        "mechanism": "rr-ind", "epsilon": 1.0, "partitions": 2, "marginals": [["os", "plan"]],
        "estimators": ["castell"], "refresh_interval_s": 1.0}]}))
    coll = load_config(path).collections[cid]
    worker = spawn_worker(str(path))
    worker.wait_ready(60)
    port = free_port()
    gateway = GatewayProcess(dict(service_env, LDP_GATEWAY_TOKENS=json.dumps(fleets_doc(cid))),
                             port, str(tmp_path / "gateway.log"))
    url, key = f"http://127.0.0.1:{port}", os.environ[ENV_PUBLIC_KEY]
    try:
        gateway.wait_for(cid)
        (tmp_path / "c-dev").mkdir()
        (tmp_path / "ts-dev").mkdir()
        c_in = "".join(",".join(f"{a}={v}" for a, v in r.items()) + "\n" for r in _records(1))
        c = subprocess.run([str(c_sdk / "ldp_post"), url, TOKEN_A, cid, key, "101",
                            str(tmp_path / "c-dev"), "40"], input=c_in, capture_output=True,
                           text=True, timeout=120)
        assert c.returncode == 0, c.stderr
        assert json.loads(c.stdout) == {"sent": N, "batches": 4}
        ts_in = "".join(json.dumps(r) + "\n" for r in _records(2))
        t = subprocess.run(["node", str(ts_sdk / "tools" / "post.js"), url, TOKEN_A, cid, key,
                            "202", str(tmp_path / "ts-dev"), "40"], input=ts_in,
                           capture_output=True, text=True, timeout=120, cwd=TS_DIR)
        assert t.returncode == 0, t.stderr
        assert json.loads(t.stdout) == {"sent": N, "batches": 4}

        async def run():
            batches = [decode_batch(m.value) for m in
                       await _topic_messages(kafka_broker.bootstrap, f"ldp.reports.{cid}")]
            ids = np.concatenate([b.device_ids for b in batches])
            assert sorted(set(ids.tolist())) == sorted(stamp("phones", np.array([101, 202],
                                                                               np.uint64)))
            reports = np.concatenate([b.reports for b in batches])
            assert len(reports) == 2 * N
            mech = coll.mechanism()
            expected = mech.count(reports, coll.tensors())
            await assert_counted(redis_server.url, coll, expected, 2 * N, timeout=60)
            return mech.estimate(expected, ("os", "plan"), "castell")

        offline = asyncio.run(run())
        served = None
        for _ in range(60):
            served = json.loads(worker.get(f"/estimates/{cid}?attrs=os,plan&method=castell&raw=1",
                                           any_status=True))
            if served.get("n") == 2 * N:
                break
            asyncio.run(asyncio.sleep(0.5))
        assert served is not None and served.get("n") == 2 * N, served
        np.testing.assert_allclose(np.asarray(served["cells"]), offline.factor.values,
                                   rtol=1e-9, atol=1e-12)
    finally:
        assert gateway.stop() == 0
