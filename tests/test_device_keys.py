"""Per-device identity, the pure parts (docs/security.md "Per-device identity",
docs/credentials.md): the key derivation, the authenticated batch of the wire format (flag bit 2:
fleet and HMAC-SHA256), the fleets' secrets file and ``ldpstream device-credentials``."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ldpstream.credentials.device_keys import (
    DeviceCredential,
    batch_mac,
    derive_device_key,
    fleet_tag,
    parse_fleet_secrets,
    server_id,
    tag_range,
)
from ldpstream.errors import CliError
from ldpstream.producers.codec import DecodeError, decode_batch, encode_batch

pytestmark = pytest.mark.core

SECRET = bytes(range(32))


def test_key_derivation_is_hmac_of_the_labelled_fleet_and_id():
    import hashlib
    import hmac

    want = hmac.new(SECRET, b"ldpstream/device-key/v1\n\x06phones" + (7).to_bytes(8, "little"),
                    hashlib.sha256).hexdigest()
    assert derive_device_key(SECRET, "phones", 7).hex() == want
    assert derive_device_key(SECRET, "phones", 8) != derive_device_key(SECRET, "phones", 7)
    assert derive_device_key(SECRET, "phone", 7) != derive_device_key(SECRET, "phones", 7)
    with pytest.raises(ValueError):
        derive_device_key(SECRET, "", 1)
    with pytest.raises(ValueError):
        derive_device_key(SECRET, "f", 2**64)


def test_authenticated_batch_round_trips_and_every_prefix_is_refused():
    key = derive_device_key(SECRET, "phones", 7)
    rep = np.array([[1, 0], [0, 1], [1, 1]])
    blob = encode_batch("c", 3, rep, device_ids=np.full(3, 7, np.uint64), key=(7, 42),
                        sent_at=1.5, auth=("phones", key))
    b = decode_batch(blob)
    assert (b.fleet, b.key, b.n) == ("phones", (7, 42), 3)
    assert b.mac == blob[-32:] == batch_mac(key, blob[:-32])
    plain = encode_batch("c", 3, rep, device_ids=np.full(3, 7, np.uint64), key=(7, 42),
                         sent_at=1.5)
    assert blob[:len(plain)][6:] == plain[6:] and blob[5] == plain[5] | 0x04
    for cut in range(len(blob)):
        with pytest.raises(DecodeError):
            decode_batch(blob[:cut])
    with pytest.raises(DecodeError, match="trailing"):
        decode_batch(blob + b"x")
    with pytest.raises(ValueError, match="batch key"):
        encode_batch("c", 3, rep, auth=("phones", key))
    # a flipped value byte still decodes, its MAC no longer verifies
    bad = bytearray(blob)
    bad[len(plain) - 1] ^= 1
    assert batch_mac(key, bytes(bad[:-32])) != decode_batch(bytes(bad)).mac


def test_server_ids_carry_the_fleet_tag():
    lo, hi = tag_range("phones")
    ids = [server_id("phones", d) for d in range(1000)]
    assert all(lo <= i < hi for i in ids) and len(set(ids)) == 1000
    assert server_id("sensors", 5) >> 48 == fleet_tag("sensors") != fleet_tag("phones")


def test_fleet_secrets_file_errors_name_the_field():
    doc = {"fleets": {"a": {"secret": SECRET.hex()}, "b": {"secret": SECRET.hex(), "share": 0.2}}}
    fs = parse_fleet_secrets(doc, "s.yaml")
    assert fs.shares == pytest.approx({"a": 0.8, "b": 0.2}, rel=1e-12)
    assert fs.credential("a", 3).key == derive_device_key(SECRET, "a", 3)
    for bad, msg in (({"fleets": {"a": {"secret": "abc"}}}, "fleets.a.secret"),
                     ({"fleets": {"a": {"secret": SECRET.hex(), "share": 2}}}, "fleets.a.share"),
                     ({"fleets": {"a": {"secret": SECRET.hex(), "share": 0.7},
                                  "b": {"secret": SECRET.hex(), "share": 0.7}}}, "more than 1"),
                     ({"fleets": {"a": {"secret": SECRET.hex(), "token": "x"}}}, "fleets.a"),
                     ({"nope": 1}, "one key 'fleets'")):
        with pytest.raises(CliError, match=msg):
            parse_fleet_secrets(bad, "s.yaml")


def test_device_credentials_command(tmp_path, capsys):
    from ldpstream.cli import main

    assert main(["device-credentials", "--new-secret"]) == 0
    secret = capsys.readouterr().out.strip()
    assert len(bytes.fromhex(secret)) == 32
    path = tmp_path / "fleets.yaml"
    path.write_text(json.dumps({"fleets": {"phones": {"secret": secret}}}))
    assert main(["device-credentials", "--secrets", str(path), "--fleet", "phones",
                 "--device-id", "9", "--count", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    creds = [DeviceCredential.from_json(line) for line in lines]
    assert [c.device_id for c in creds] == [9, 10]
    assert creds[0].key == derive_device_key(bytes.fromhex(secret), "phones", 9)
    assert main(["device-credentials", "--secrets", str(path), "--fleet", "cars",
                 "--device-id", "1"]) == 2
    assert "'cars' is not in the secrets" in capsys.readouterr().err


def test_identity_conformance_vectors():
    """sdk/conformance/identity.json, which the C and TypeScript SDKs run too: the Python
    derivation, credential and authenticated batch bytes (a DeviceClient holding the credential
    sends the same bytes)."""
    from pathlib import Path


    v = json.loads((Path(__file__).parents[1] / "sdk" / "conformance" / "identity.json")
                   .read_text(encoding="utf-8"))
    for c in v["derive"]:
        assert derive_device_key(bytes.fromhex(c["fleet_secret"]), c["fleet"],
                                 int(c["device_id"])).hex() == c["key"]
    cred = DeviceCredential.from_json(v["credential"]["json"])
    assert (cred.fleet, str(cred.device_id), cred.key.hex()) == \
        (v["credential"]["fleet"], v["credential"]["device_id"], v["credential"]["key"])
    for b in v["batches"]:
        dev = int(b["device_id"])
        rows = np.asarray(b["reports"])
        assert encode_batch(b["collection"], b["version"], rows, sent_at=b["sent_at"],
                            device_ids=np.full(len(rows), dev, np.uint64),
                            key=(dev, int(b["sequence"])),
                            auth=(b["fleet"], bytes.fromhex(b["key"]))).hex() == b["hex"]


def test_init_writes_secrets_once_and_keeps_them(tmp_path):
    from ldpstream.cli import main
    from ldpstream.credentials.device_keys import load_fleet_secrets

    path = tmp_path / "secrets" / "fleets.yaml"
    assert main(["device-credentials", "--init", str(path), "--fleets", "demo"]) == 0
    first = load_fleet_secrets({"LDP_DEVICE_SECRETS_FILE": str(path)})
    assert first is not None and list(first.secrets) == ["demo"]
    assert path.stat().st_mode & 0o777 == 0o600
    assert main(["device-credentials", "--init", str(path), "--fleets", "demo,cars"]) == 0
    again = load_fleet_secrets({"LDP_DEVICE_SECRETS_FILE": str(path)})
    assert again is not None and again.secrets["demo"] == first.secrets["demo"]
    assert sorted(again.secrets) == ["cars", "demo"]
