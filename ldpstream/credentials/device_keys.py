"""Per-device identity (docs/security.md "Per-device identity", docs/credentials.md): every
device holds its own key, derived from its fleet's secret and its device id, and authenticates
each report batch it sends with HMAC-SHA256 over the batch's bytes (producers/codec.py, flag
bit 2). The worker holds the fleets' secrets and derives the key of the batch's sender to verify
it, so the gateway, the MQTT bridge and any Kafka writer only relay: no per-device table
anywhere.

    key(fleet, device) = HMAC-SHA256(fleet secret, "ldpstream/device-key/v1\\n" ‖ u8 len(fleet)
                                     ‖ fleet (UTF-8) ‖ device id (u64 LE))

A verified batch is counted under the *server id* of its device (:func:`server_id`): the fleet's
16-bit tag in the top bits and 48 bits of BLAKE2b(fleet, device id) below, so fleets never share
ids and the worker can count a fleet's devices in its sorted per-device tables (a fleet's share
of ``device_state_max``).

``ldpstream device-credentials`` prints a new fleet secret (``--new-secret``) or a device's
credential (``--fleet F --device-id N``) as JSON, which the SDKs load.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from ldpstream.errors import CliError
from ldpstream.names import DEVICE_KEY_LABEL, ENV_DEVICE_SECRETS, ENV_DEVICE_SECRETS_FILE

__all__ = ["MAC_BYTES", "SECRET_BYTES", "DeviceCredential", "DeviceSigner", "FleetSecrets",
           "derive_device_key",
           "batch_mac", "fleet_tag", "server_id", "load_fleet_secrets", "parse_fleet_secrets"]

MAC_BYTES = 32
SECRET_BYTES = 32
_TAG_SHIFT = 48
_LOW = (1 << _TAG_SHIFT) - 1


def derive_device_key(fleet_secret: bytes, fleet: str, device_id: int) -> bytes:
    """The 32-byte key of ``device_id`` in ``fleet`` (the formula in the module docstring)."""
    name = fleet.encode("utf-8")
    if not 1 <= len(name) <= 255:
        raise ValueError(f"a fleet name is 1..255 UTF-8 bytes, got {len(name)}")
    if not 0 <= int(device_id) < 2**64:
        raise ValueError(f"a device id is a u64, got {device_id}")
    msg = DEVICE_KEY_LABEL + bytes([len(name)]) + name + struct.pack("<Q", int(device_id))
    return hmac.new(fleet_secret, msg, hashlib.sha256).digest()


def batch_mac(key: bytes, signed: bytes) -> bytes:
    """HMAC-SHA256 of a batch's bytes before its MAC (producers/codec.py)."""
    return hmac.new(key, signed, hashlib.sha256).digest()


def fleet_tag(fleet: str) -> int:
    """The 16-bit tag of a fleet: the top bits of its devices' server ids."""
    return int.from_bytes(hashlib.blake2b(b"ldpstream/fleet-tag\n" + fleet.encode("utf-8"),
                                          digest_size=2).digest(), "big")


def server_id(fleet: str, device_id: int) -> int:
    """The id the worker counts an authenticated device's reports under (quota, dedupe, state)."""
    low = int.from_bytes(hashlib.blake2b(fleet.encode("utf-8") + b"\x00"
                                         + int(device_id).to_bytes(8, "big"),
                                         digest_size=8).digest(), "big") & _LOW
    return (fleet_tag(fleet) << _TAG_SHIFT) | low


def tag_range(fleet: str) -> tuple[int, int]:
    """The server ids of ``fleet``'s devices: ``[lo, hi)``."""
    tag = fleet_tag(fleet)
    return tag << _TAG_SHIFT, (tag + 1) << _TAG_SHIFT


@dataclass(frozen=True)
class DeviceCredential:
    """What one device holds: its fleet, its id and its key (never the fleet's secret)."""

    fleet: str
    device_id: int
    key: bytes

    def to_json(self) -> str:
        return json.dumps({"fleet": self.fleet, "device_id": self.device_id,
                           "key": self.key.hex()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "DeviceCredential":
        """Parse what ``ldpstream device-credentials --fleet F --device-id N`` printed."""
        try:
            doc = json.loads(text)
            key = bytes.fromhex(doc["key"])
            fleet, dev = doc["fleet"], doc["device_id"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"not a device credential ({{fleet, device_id, key}}): {exc}") \
                from None
        if not isinstance(fleet, str) or isinstance(dev, bool) or not isinstance(dev, int) \
                or len(key) != MAC_BYTES:
            raise ValueError("a device credential has a fleet name, an integer device_id and a "
                             "32-byte hex key")
        return cls(fleet, dev, key)


@dataclass(frozen=True)
class FleetSecrets:
    """The fleets' secrets (worker side) and each fleet's share of ``device_state_max``."""

    secrets: Mapping[str, bytes]
    shares: Mapping[str, float]

    def credential(self, fleet: str, device_id: int) -> DeviceCredential:
        secret = self.secrets.get(fleet)
        if secret is None:
            raise KeyError(fleet)
        return DeviceCredential(fleet, int(device_id), derive_device_key(secret, fleet, device_id))

    def key(self, fleet: str, device_id: int) -> bytes | None:
        secret = self.secrets.get(fleet)
        return None if secret is None else derive_device_key(secret, fleet, device_id)


class DeviceSigner:
    """A trusted aggregator's signing (the simulated fleet, docs/security.md "Per-device
    identity"): it holds its fleet's secret and sends each device's reports as that device's own
    authenticated batch. Its devices are ``(run << 32) | id`` with a random 31-bit ``run`` per
    process, so a restarted simulator starts new devices at sequence 0 instead of reusing
    sequences; each device's sequence grows by one per batch."""

    def __init__(self, fleets: FleetSecrets, fleet: str) -> None:
        if fleet not in fleets.secrets:
            raise CliError(f"fleet {fleet!r} has no secret (known: "
                           f"{', '.join(sorted(fleets.secrets))})")
        self.fleets, self.fleet = fleets, fleet
        self.run = secrets.randbits(31) << 32
        self.sequences: dict[int, int] = {}

    def next(self, device: int) -> tuple[int, int, bytes]:
        """(device id, sequence, key) of ``device``'s next batch."""
        dev = self.run | (int(device) & 0xFFFFFFFF)
        seq = self.sequences.get(dev, 0)
        self.sequences[dev] = seq + 1
        key = self.fleets.key(self.fleet, dev)
        assert key is not None
        return dev, seq, key


def parse_fleet_secrets(doc: Any, source: str) -> FleetSecrets:
    """``{"fleets": {name: {"secret": hex (32 bytes), "share": fraction?}}}``; shares left out
    split what the given ones leave equally; errors name the field."""
    if not isinstance(doc, Mapping) or set(doc) != {"fleets"} \
            or not isinstance(doc["fleets"], Mapping) or not doc["fleets"]:
        raise CliError(f"{source}: must be a mapping with one key 'fleets' "
                       f"({{name: {{secret, share}}}})")
    out: dict[str, bytes] = {}
    given: dict[str, float] = {}
    tags: dict[int, str] = {}
    for name, spec in doc["fleets"].items():
        where = f"{source}: fleets.{name}"
        if not isinstance(spec, Mapping) or set(spec) - {"secret", "share"}:
            raise CliError(f"{where}: must be a mapping {{secret, share}}")
        try:
            secret = bytes.fromhex(str(spec.get("secret", "")))
        except ValueError:
            secret = b""
        if len(secret) < 16:
            raise CliError(f"{where}.secret: must be at least 16 bytes in hex "
                           f"(`ldpstream device-credentials --new-secret`)")
        name = str(name)
        if not 1 <= len(name.encode("utf-8")) <= 255:
            raise CliError(f"{where}: a fleet name is 1..255 UTF-8 bytes")
        tag = fleet_tag(name)
        if tag in tags:
            raise CliError(f"{where}: fleets {tags[tag]!r} and {name!r} have the same 16-bit "
                           f"tag; rename one")
        tags[tag] = name
        out[name] = secret
        if "share" in spec:
            share = spec["share"]
            if isinstance(share, bool) or not isinstance(share, (int, float)) \
                    or not 0 < share <= 1:
                raise CliError(f"{where}.share: a fraction of device_state_max in (0, 1]")
            given[name] = float(share)
    rest = 1.0 - sum(given.values())
    if rest < -1e-9:
        raise CliError(f"{source}: the fleets' shares add up to more than 1")
    free = [n for n in out if n not in given]
    shares = dict(given)
    for n in free:
        shares[n] = max(rest, 0.0) / len(free)
    if free and rest <= 1e-9:
        raise CliError(f"{source}: the given shares leave nothing for {', '.join(free)}")
    return FleetSecrets(out, shares)


def load_fleet_secrets(environ: Mapping[str, str] | None = None) -> FleetSecrets | None:
    """The fleets' secrets from ``LDP_DEVICE_SECRETS_FILE`` or ``LDP_DEVICE_SECRETS``; None when
    neither is set (batches are then not authenticated per device)."""
    env = os.environ if environ is None else environ
    path = env.get(ENV_DEVICE_SECRETS_FILE)
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise CliError(f"{ENV_DEVICE_SECRETS_FILE}: cannot read {path} ({exc})") from None
        try:
            return parse_fleet_secrets(yaml.safe_load(text), path)
        except yaml.YAMLError as exc:
            raise CliError(f"{path}: invalid YAML/JSON: " + " ".join(str(exc).split())) from None
    if env.get(ENV_DEVICE_SECRETS):
        try:
            return parse_fleet_secrets(json.loads(env[ENV_DEVICE_SECRETS]), ENV_DEVICE_SECRETS)
        except ValueError as exc:
            raise CliError(f"{ENV_DEVICE_SECRETS}: invalid JSON: {exc}") from None
    return None


def init_secrets(path: Path, fleets: str | None) -> int:
    """``--init FILE --fleets a,b``: a secrets file with a new secret for every fleet it lacks
    (existing secrets are kept: the compose one-shot runs at every start), mode 0600."""
    names = [f.strip() for f in (fleets or "").replace(" ", ",").split(",") if f.strip()]
    if not names:
        raise CliError("--init: give the fleets (--fleets a,b)")
    doc: dict[str, Any] = {"fleets": {}}
    if path.is_file():
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or doc
        parse_fleet_secrets(doc, str(path))   # refuse to extend a broken file
    for name in names:
        doc["fleets"].setdefault(name, {"secret": secrets.token_hex(SECRET_BYTES)})
    parse_fleet_secrets(doc, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=True), encoding="utf-8")
    tmp.chmod(0o600)
    tmp.replace(path)
    return 0


def main(args: Any) -> int:
    """``ldpstream device-credentials --new-secret`` | ``--fleet F --device-id N [--secrets
    FILE]``: a new fleet secret (hex), or a device's credential as JSON on stdout."""
    if args.new_secret:
        print(secrets.token_hex(SECRET_BYTES))
        return 0
    if args.init is not None:
        return init_secrets(Path(args.init), args.fleets)
    if args.fleet is None or args.device_id is None:
        raise CliError("give --new-secret, or --fleet NAME and --device-id N")
    env = dict(os.environ)
    if args.secrets:
        env[ENV_DEVICE_SECRETS_FILE] = args.secrets
    fleets = load_fleet_secrets(env)
    if fleets is None:
        raise CliError(f"no fleet secrets: give --secrets FILE, {ENV_DEVICE_SECRETS_FILE} or "
                       f"{ENV_DEVICE_SECRETS}")
    ids = [args.device_id] if args.count is None else \
        list(range(args.device_id, args.device_id + args.count))
    for dev in ids:
        if not 0 <= dev < 2**64:
            raise CliError(f"--device-id: a u64, got {dev}")
        try:
            print(fleets.credential(args.fleet, dev).to_json())
        except KeyError:
            raise CliError(f"--fleet: {args.fleet!r} is not in the secrets (known: "
                           f"{', '.join(sorted(fleets.secrets))})") from None
    sys.stdout.flush()
    return 0
