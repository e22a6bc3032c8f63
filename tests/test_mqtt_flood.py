"""MQTT memory and backlog stay bounded under a flood (docs/security.md "MQTT: TLS, per-fleet
credentials and ACLs", "Limits"): one fleet user publishes 4,000 messages of 256 KiB (1 GiB) as
fast as the broker takes them, to a running bridge. Mosquitto, under the shipped limits
(per-client queued and in-flight bytes, the heap limit; ldpstream/dev/mosquitto.py), keeps its
peak resident memory under :data:`BROKER_MAX_MB`; the bridge never holds more than its bound of
unacknowledged messages (whatever the broker sends) and stays under :data:`BRIDGE_MAX_MB`; then
an honest device is still served. Before: Mosquitto went from 9 MB to 1,202 MB and the bridge's
pending messages peaked at 7,469, above its Receive Maximum of 1,024."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest
from mqtt_helpers import FLEETS, bridge, check_counts, devices, raw_publisher, setup

from ldpstream.names import MQTT_RECEIVE_MAXIMUM, mqtt_reports_topic

pytestmark = pytest.mark.pipeline

MESSAGES = 4000
SIZE = 256 * 1024
#: peak resident memory (VmHWM) of the broker and of the bridge during the flood
BROKER_MAX_MB = 400
BRIDGE_MAX_MB = 400


def _peak_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, in MB."""
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines()
                  if ":" in line)
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def test_a_256kib_x_4000_flood_keeps_broker_and_bridge_bounded(
        tmp_path, service_env, spawn_worker, mosquitto, unique_name, redis_server):
    cid = unique_name
    coll, worker, env = setup(tmp_path, service_env, spawn_worker, cid, mosquitto)
    proc = bridge(env, tmp_path, cid)
    try:
        broker_before = _peak_mb(mosquitto.pid)[0]
        bridge_before = _peak_mb(proc.proc.pid)[0]

        async def flood() -> float:
            pub = raw_publisher(mosquitto, "phones")
            payload = b"\x00" + bytes(SIZE - 1)   # junk: the bridge dead-letters each
            t0 = time.monotonic()
            sent = 0
            while sent < MESSAGES:
                n = min(200, MESSAGES - sent)
                await asyncio.gather(*(pub.publish(mqtt_reports_topic("phones", cid), payload,
                                                   timeout_s=120) for _ in range(n)))
                sent += n
            pub.client.disconnect()
            pub.client.loop_stop()
            return time.monotonic() - t0

        took = asyncio.run(flood())
        # the bridge works off its backlog (what the broker kept), then is healthy
        deadline = time.monotonic() + 300
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{proc.port}/healthz", timeout=10) as r:
                health = json.loads(r.read())
            if health["unacknowledged"]["messages"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        broker_peak = _peak_mb(mosquitto.pid)[1]
        bridge_peak = _peak_mb(proc.proc.pid)[1]
        held = health["unacknowledged"]
        print(f"flood of {MESSAGES} x {SIZE // 1024} KiB published in {took:.1f} s; mosquitto "
              f"{broker_before:.0f} MB -> peak {broker_peak:.0f} MB; bridge {bridge_before:.0f} "
              f"MB -> peak {bridge_peak:.0f} MB; bridge unacknowledged peak "
              f"{held['peak_messages']} messages, {held['peak_bytes'] / 2**20:.0f} MiB")
        assert held["peak_messages"] <= MQTT_RECEIVE_MAXIMUM, held
        assert held["peak_bytes"] <= held["max_bytes"] + SIZE, held
        assert broker_peak < BROKER_MAX_MB, broker_peak
        assert bridge_peak < BRIDGE_MAX_MB, bridge_peak

        # an honest device is served after the flood: its reports are counted exactly
        async def honest() -> None:
            mech, reports = await devices(mosquitto.url_for(FLEETS["phones"]), cid, 2, 8,
                                          seed=5)
            await check_counts(redis_server.url, coll, mech, reports)

        asyncio.run(honest())
    finally:
        proc.stop()
