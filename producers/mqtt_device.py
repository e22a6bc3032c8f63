"""A Python device publishing over MQTT, the twin of the C and TypeScript example programs
(``sdk/c/examples/mqtt.c``, ``sdk/ts/tools/mqtt.ts``; docs/device-protocol.md "Example
programs"): same arguments, same record lines, same summary line::

    LDP_MQTT_PASSWORD=... python -m ldpstream.producers.mqtt_device [--credential FILE] \\
        MQTT_URL CA_FILE FLEET COLLECTION PUBLIC_KEY_B64 DEVICE_ID STATE_DIR [BATCH] < records

With ``--credential`` (the JSON ``ldpstream device-credentials`` printed) every batch carries the
device's MAC (docs/security.md "Per-device identity").
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

from ldpstream.credentials.device_keys import DeviceCredential
from ldpstream.names import ENV_MQTT_PASSWORD
from ldpstream.producers.ledger import Ledger
from ldpstream.producers.mqtt_transport import MqttConfigWatcher, MqttTransport
from ldpstream.producers.sdk import DeviceClient
from ldpstream.producers.signing import VerifyKey

USAGE_TAIL = """\
The password comes from LDP_MQTT_PASSWORD. Reads the retained signed state, then one record per
line from stdin, attr=label,attr=label (e.g. os=ios,plan=pro), publishes batches at QoS 1 and
prints {"sent": n, "batches": b} at the end ("duplicates": d when memoized records were already
sent this period, "clipped": {attribute: n} when numeric values were clipped into their range)."""


def parse_record(line: str, index: int) -> dict[str, str]:
    """``attr=label,attr=label`` (empty fields skipped, as the C examples do) → a record."""
    record = {}
    for field in line.rstrip("\r\n").split(","):
        if not field:
            continue
        name, eq, label = field.partition("=")
        if not eq:
            raise ValueError(f"record {index}: bad record field {field!r} (want attr=label)")
        record[name] = label
    return record


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ldpstream.producers.mqtt_device", epilog=USAGE_TAIL,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A device publishing randomized reports over MQTT (docs/devices.md).")
    p.add_argument("url", metavar="MQTT_URL", help="mqtts://USER@HOST:PORT (TLS, checked against "
                   "CA_FILE) or mqtt://USER@HOST:PORT (loopback only, e.g. make up MQTT=1)")
    p.add_argument("ca", metavar="CA_FILE", help="the broker's CA (PEM); ignored for mqtt:// (-)")
    p.add_argument("fleet", metavar="FLEET", help="the fleet (topics ldp/FLEET/COLLECTION/...)")
    p.add_argument("collection", metavar="COLLECTION", help="the collection id, e.g. adult")
    p.add_argument("public_key", metavar="PUBLIC_KEY_B64", help="the pinned public key")
    p.add_argument("device_id", metavar="DEVICE_ID", type=int, help="this device's id")
    p.add_argument("state_dir", metavar="STATE_DIR", help="directory of the device's ledger")
    p.add_argument("batch", metavar="BATCH", type=int, nargs="?", default=100,
                   help="reports per batch, 1 to 1000 (default 100)")
    p.add_argument("--credential", metavar="FILE",
                   help="the device's credential, the JSON `ldpstream device-credentials` "
                   "printed: every batch is authenticated with its key (docs/security.md "
                   "\"Per-device identity\"); FLEET and DEVICE_ID must be the credential's")
    return p


def load_credential(path: str, fleet: str, device_id: int) -> DeviceCredential:
    """The credential in ``path``, checked against the FLEET and DEVICE_ID arguments."""
    try:
        cred = DeviceCredential.from_json(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"credential {path}: {exc}") from None
    if (cred.fleet, cred.device_id) != (fleet, device_id):
        raise ValueError(f"FLEET {fleet} and DEVICE_ID {device_id} are not the credential's "
                         f"{cred.fleet} and {cred.device_id}")
    return cred


async def run(args: argparse.Namespace, lines: TextIO, env: Mapping[str, str],
              credential: DeviceCredential | None = None) -> dict[str, Any]:
    """Report every record of ``lines`` (each batch authenticated with ``credential`` when
    given); the summary printed at the end."""
    from urllib.parse import quote

    url = args.url
    password = env.get(ENV_MQTT_PASSWORD)
    if password and "@" in url:  # the user of the URL logs in with the password
        scheme, rest = url.split("://", 1)
        user, host = rest.rsplit("@", 1)
        url = f"{scheme}://{user}:{quote(password, safe='')}@{host}"
    ca = args.ca if url.startswith("mqtts:") else None
    state = Path(args.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(state / "ledger.sqlite")
    watcher = await MqttConfigWatcher(url, args.fleet, [args.collection], ca=ca,
                                      verify_key=VerifyKey.from_text(args.public_key),
                                      floor=ledger).start()
    client = DeviceClient(args.collection, watcher=watcher, ledger=ledger,
                          device_id=args.device_id, batch_size=args.batch, credential=credential,
                          transport=MqttTransport(url, args.fleet, ca=ca,
                                                  client_id=f"{args.fleet}-{args.device_id}"))
    sent = duplicates = 0
    try:
        async with client:
            for line in lines:
                if not line.strip():
                    continue
                res = await client.report(parse_record(line, sent + duplicates))
                if res.status == "duplicate":
                    duplicates += 1
                elif res.status != "queued":
                    raise ValueError(f"record {sent + duplicates}: {res.reason}")
                else:
                    sent += 1
    finally:
        await watcher.stop()
    out: dict[str, Any] = {"sent": sent, "batches": client.sent_batches}
    if duplicates:
        out["duplicates"] = duplicates
    if client.clipped:   # numeric values clipped into their range, per attribute
        out["clipped"] = dict(client.clipped)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 1 <= args.batch <= 1000:
        print(f"BATCH must be 1 to 1000, got {args.batch}", file=sys.stderr)
        return 2
    try:
        credential = None if args.credential is None else \
            load_credential(args.credential, args.fleet, args.device_id)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        print(json.dumps(asyncio.run(run(args, sys.stdin, os.environ, credential)),
                         separators=(",", ":")), flush=True)
    except Exception as exc:  # noqa: BLE001 - one line, no traceback (the C and TS tools alike)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
