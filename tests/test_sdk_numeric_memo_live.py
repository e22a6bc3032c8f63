"""A memoized numeric collection end to end from the C and TypeScript SDKs (docs/numeric.md
"Memoization", docs/device-protocol.md "Numeric memoization"): an ``sw-hm`` collection with
``memoize`` and α-point rounding, and a memoized ``partitioned`` one with the battery inside its
marginals (docs/numeric.md "In partitioned marginals"), on one real worker behind ``ldpstream
gateway``; C devices
(``ldp_post``) and TypeScript devices (``post.js``) report a battery reading that wanders, as
text. Each device sends one report per distinct rounded record — what the family's own rounding
with the device's α predicts, so the SDKs' α and rounding are the server's — and the worker
counts each device once, at its latest report: the counts in Redis equal the count of every
device's last report on the topic."""
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

from ldpstream.agents.store.device_memo import last_of
from ldpstream.producers.codec import decode_batch
from ldpstream.producers.signing import ENV_PUBLIC_KEY

pytestmark = pytest.mark.pipeline

#: a battery reading wandering around its device's level, then a jump
WANDER = [0.0, 0.4, -0.3, 0.2, -0.1, 0.3, -0.4, 0.1, 9.0, 9.2]


def _records(level: float, fw: str) -> list[dict[str, str]]:
    return [{"fw": fw, "battery": f"{level + d:.2f}"} for d in WANDER]


#: per family: its mechanism, ε and parameters (memoized for a day, the battery rounded)
FAMILIES = {
    "sw-hm": {"mechanism": "sw-hm", "epsilon": 1.0, "estimators": ["mean"],
              "params": {"memoize": {"rotation_s": 86400}, "alpha_points": 16}},
    "partitioned": {"mechanism": "partitioned", "epsilon": 2.0, "epsilon_scope": "record",
                    "estimators": ["unbiased"],
                    "params": {"memoize": {"rotation_s": 86400, "instantaneous_epsilon": 2.0},
                               "bins": {"battery": 17}}}}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_memoized_numeric_devices_through_the_gateway(tmp_path, kafka_broker, redis_server,
                                                      spawn_worker, service_env, unique_name,
                                                      c_sdk, ts_sdk, family):  # noqa: F811
    from ldpstream.config import load_config
    from ldpstream.dev.process import free_port
    from ldpstream.producers.program import Program

    cid = unique_name
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"collections": [{
        "id": cid, "schema": {"attributes": {"fw": ["v1", "v2", "v3"],
                                             "battery": {"numeric": {"min": 0, "max": 100}}}},
        **FAMILIES[family], "partitions": 1,
        "marginals": [["battery"], ["fw", "battery"]], "refresh_interval_s": 1.0}]}))
    coll = load_config(path).collections[cid]
    mech = coll.mechanism()
    attrs = mech.domain.attrs
    prog = mech.device_program()
    assert prog["memoize"]["round"][attrs.index("battery")] is not None
    encode = Program(prog).encode   # labels and raw readings to grid indices
    worker = spawn_worker(str(path))
    port = free_port()
    gateway = GatewayProcess(dict(service_env, LDP_GATEWAY_TOKENS=json.dumps(fleets_doc(cid))),
                             port, str(tmp_path / "gateway.log"))
    url, key = f"http://127.0.0.1:{port}", os.environ[ENV_PUBLIC_KEY]
    devices = {101: (23.3, "v1"), 102: (47.9, "v2"), 103: (61.2, "v3"), 104: (80.6, "v1"),
               201: (35.5, "v2"), 202: (70.1, "v3")}
    try:
        worker.wait_ready(60)
        gateway.wait_for(cid)
        total = 0
        for dev, (level, fw) in devices.items():
            recs = _records(level, fw)
            x = np.array([encode(r) for r in recs])
            rounded = mech.device_records(x, np.full(len(x), dev, np.uint64))
            distinct = len({tuple(r) for r in rounded.tolist()})
            assert distinct < len(recs)     # the wander stays inside one rounded point
            (tmp_path / str(dev)).mkdir()
            if dev < 200:
                cmd, stdin, cwd = [str(c_sdk / "ldp_post")], "".join(
                    ",".join(f"{a}={v}" for a, v in r.items()) + "\n" for r in recs), None
            else:
                cmd, stdin, cwd = ["node", str(ts_sdk / "tools" / "post.js")], "".join(
                    json.dumps(r) + "\n" for r in recs), TS_DIR
            out = subprocess.run([*cmd, url, TOKEN_A, cid, key, str(dev), str(tmp_path / str(dev)),
                                  "100"], input=stdin, capture_output=True, text=True,
                                 timeout=60, cwd=cwd)
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout) == {"sent": distinct, "batches": 1,
                                              "duplicates": len(recs) - distinct}, dev
            total += distinct

        async def run() -> None:
            batches = [decode_batch(m.value) for m in
                       await _topic_messages(kafka_broker.bootstrap, coll.topic)]
            ids = np.concatenate([b.device_ids for b in batches])
            reports = np.concatenate([b.reports for b in batches])
            assert len(reports) == total and len(set(ids.tolist())) == len(devices)
            _, last = last_of(ids)
            got = await assert_counted(redis_server.url, coll,
                                       mech.count(reports[last], coll.tensors()), total,
                                       timeout=30)
            if family == "partitioned":   # each device once, in its assigned table
                assert sum(int(c[-1]) for c in got.values()) == len(devices)
                return
            for key, counts in got.items():
                assert counts.sum() == len(devices), key   # each device once

        asyncio.run(run())
    finally:
        assert gateway.stop() == 0
