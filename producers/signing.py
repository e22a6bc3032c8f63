"""Signed mechanism states on ``ldp.config`` (Ed25519).

Any Kafka client that may produce could write to ``ldp.config``; a forged state (identity
channels, ε = ∞) adopted by devices would make them send their true values. So the worker signs
every state it publishes and devices accept only states that verify against the public key they
pinned (``docs/security.md``).

Record value on ``ldp.config`` (key = collection id), JSON::

    {"alg": "ed25519", "key_id": "<16 hex>", "payload": "<canonical JSON of the state>",
     "signature": "<base64 Ed25519 signature of DOMAIN + payload>"}

The payload is the mechanism's ``state()`` plus ``collection``, ``issued_at`` and ``expires_at``
(unix seconds; the worker signs with ``expires_at = issued_at + STATE_TTL_S`` and republishes
well before, docs/security.md "The control topic"); the signature covers the exact payload bytes
(no re-serialization on the device). A device keeps, per collection, the state with the greatest
``(version, issued_at)``: an older signed state replayed later (an earlier version, or the same
version signed earlier) is refused (``replayed``), so is a state past its ``expires_at``
(``expired``: a captured state cannot be replayed to new devices for longer than the TTL), one
without ``expires_at`` (``malformed``), and a state signed for another collection than the
record's key.

Keys: ``ldpstream keygen --out DIR`` writes ``config-signing.key`` (private, mode 0600) and
``config-signing.pub``. The worker reads ``LDP_CONFIG_SIGNING_KEY`` (base64) or
``LDP_CONFIG_SIGNING_KEY_FILE``; devices read ``LDP_CONFIG_PUBLIC_KEY`` or
``LDP_CONFIG_PUBLIC_KEY_FILE``. Both files hold one line of base64 (the raw 32-byte key).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = ["ALG", "ENV_SIGNING_KEY", "ENV_SIGNING_KEY_FILE", "ENV_PUBLIC_KEY",
           "ENV_PUBLIC_KEY_FILE", "StateRejected", "SignedState", "SigningKey", "VerifyKey",
           "load_signing_key", "load_verify_key", "keygen", "REJECT_REASONS", "STATE_TTL_S"]

ALG = "ed25519"
DOMAIN = b"ldpstream/config-state/v1\n"
ENV_SIGNING_KEY = "LDP_CONFIG_SIGNING_KEY"
ENV_SIGNING_KEY_FILE = "LDP_CONFIG_SIGNING_KEY_FILE"
ENV_PUBLIC_KEY = "LDP_CONFIG_PUBLIC_KEY"
ENV_PUBLIC_KEY_FILE = "LDP_CONFIG_PUBLIC_KEY_FILE"
PRIVATE_FILE = "config-signing.key"
PUBLIC_FILE = "config-signing.pub"
MAX_RECORD_BYTES = 4 * 1024 * 1024

#: why a device refused a ``ldp.config`` record
REJECT_REASONS = frozenset({"malformed", "unsigned", "no_public_key", "wrong_key",
                            "bad_signature", "wrong_collection", "replayed", "over_ceiling",
                            "unusable", "expired"})

#: how long a signed state is valid (s); the worker republishes every STATE_TTL_S / 4
STATE_TTL_S = 86_400.0


class StateRejected(ValueError):
    """A ``ldp.config`` record a device must not use; ``reason`` is in :data:`REJECT_REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        assert reason in REJECT_REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class SignedState:
    """A state whose signature verified: ``state`` is the mechanism state (with ``collection``,
    ``version``, ``issued_at`` and ``expires_at``), ``key_id`` the signer's key."""

    collection: str
    version: int
    issued_at: float
    state: Mapping[str, Any]
    key_id: str
    expires_at: float = math.inf

    @property
    def order(self) -> tuple[int, float]:
        """States of one collection are ordered by ``(version, issued_at)``."""
        return (self.version, self.issued_at)


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what} is not base64") from None


def _key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()[:16]


@dataclass(frozen=True)
class VerifyKey:
    """The public key devices pin."""

    key: Ed25519PublicKey

    @classmethod
    def from_text(cls, text: str) -> "VerifyKey":
        raw = _b64decode(text, "public key")
        if len(raw) != 32:
            raise ValueError(f"an Ed25519 public key is 32 bytes, got {len(raw)}")
        return cls(Ed25519PublicKey.from_public_bytes(raw))

    @property
    def raw(self) -> bytes:
        return self.key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def to_text(self) -> str:
        return base64.b64encode(self.raw).decode("ascii")

    @property
    def key_id(self) -> str:
        return _key_id(self.raw)

    @property
    def fingerprint(self) -> str:
        """``sha256:<64 hex>`` of the raw key: what an operator compares out of band before a
        device pins a key it fetched (docs/devices.md "Getting the public key")."""
        return "sha256:" + hashlib.sha256(self.raw).hexdigest()

    def open(self, value: bytes | None, *, collection: str | None = None,
             now: float | None = None) -> SignedState:
        """Verify one ``ldp.config`` record value; ``collection`` is the record key (the state
        must be signed for it), ``now`` the device's clock (None: ``time.time()``). Raises
        :class:`StateRejected`."""
        if value is None:
            raise StateRejected("malformed", "tombstone")
        if len(value) > MAX_RECORD_BYTES:
            raise StateRejected("malformed", f"{len(value)} bytes > {MAX_RECORD_BYTES}")
        try:
            doc = json.loads(value)
        except (ValueError, UnicodeDecodeError) as exc:
            raise StateRejected("malformed", f"not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise StateRejected("malformed", "not a JSON object")
        if "signature" not in doc or "payload" not in doc:
            raise StateRejected("unsigned", "no signature (a state must be signed by the worker)")
        if doc.get("alg") != ALG:
            raise StateRejected("malformed", f"unknown signature algorithm {doc.get('alg')!r}")
        if doc.get("key_id") != self.key_id:
            raise StateRejected("wrong_key", f"signed by key {doc.get('key_id')!r}, pinned key is "
                                             f"{self.key_id}")
        payload, sig = doc["payload"], doc["signature"]
        if not isinstance(payload, str) or not isinstance(sig, str):
            raise StateRejected("malformed", "payload and signature must be strings")
        try:
            signature = _b64decode(sig, "signature")
            self.key.verify(signature, DOMAIN + payload.encode("utf-8"))
        except (ValueError, InvalidSignature):
            raise StateRejected("bad_signature", "the signature does not verify") from None
        state = json.loads(payload)
        if not isinstance(state, dict):
            raise StateRejected("malformed", "the signed payload is not a JSON object")
        try:
            signed_for = str(state["collection"])
            version = int(state["version"])
            issued_at = float(state["issued_at"])
            expires_at = float(state["expires_at"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StateRejected("malformed", f"signed state lacks a field: {exc}") from None
        if not (math.isfinite(issued_at) and math.isfinite(expires_at)):
            raise StateRejected("malformed", "issued_at and expires_at must be finite")
        if collection is not None and signed_for != collection:
            raise StateRejected("wrong_collection", f"state signed for collection {signed_for!r} "
                                                    f"published under {collection!r}")
        now = time.time() if now is None else float(now)
        if now > expires_at:
            raise StateRejected("expired", f"state version {version} of {signed_for!r} expired "
                                           f"{now - expires_at:.0f} s ago (expires_at "
                                           f"{expires_at:.0f})")
        return SignedState(signed_for, version, issued_at, state, self.key_id, expires_at)


@dataclass(frozen=True)
class SigningKey:
    """The worker's private key."""

    key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> "SigningKey":
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_text(cls, text: str) -> "SigningKey":
        raw = _b64decode(text, "signing key")
        if len(raw) != 32:
            raise ValueError(f"an Ed25519 private key is 32 bytes, got {len(raw)}")
        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    def to_text(self) -> str:
        raw = self.key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                     serialization.NoEncryption())
        return base64.b64encode(raw).decode("ascii")

    @property
    def verify_key(self) -> VerifyKey:
        return VerifyKey(self.key.public_key())

    def sign_state(self, state: Mapping[str, Any], collection: str, *,
                   issued_at: float | None = None, ttl_s: float = STATE_TTL_S) -> bytes:
        """The ``ldp.config`` record value of ``state`` (a ``Mechanism.state()``) for
        ``collection``, valid ``ttl_s`` seconds from ``issued_at`` (default now)."""
        body = dict(state)
        body["collection"] = collection
        body["issued_at"] = time.time() if issued_at is None else float(issued_at)
        body["expires_at"] = body["issued_at"] + float(ttl_s)
        if not (math.isfinite(body["issued_at"]) and math.isfinite(body["expires_at"])
                and ttl_s > 0):
            raise ValueError("issued_at must be finite and ttl_s finite and > 0")
        payload = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
        signature = self.key.sign(DOMAIN + payload.encode("utf-8"))
        return json.dumps({"alg": ALG, "key_id": self.verify_key.key_id, "payload": payload,
                           "signature": base64.b64encode(signature).decode("ascii")},
                          separators=(",", ":")).encode("utf-8")


_Key = TypeVar("_Key", "SigningKey", "VerifyKey")


def _load(cls: type[_Key], var: str, file_var: str,
          environ: Mapping[str, str] | None) -> _Key | None:
    env = os.environ if environ is None else environ
    text, path = env.get(var), env.get(file_var)
    if not text and path:
        try:
            text = Path(path).read_text().strip()
        except OSError as exc:
            raise ValueError(f"{file_var}={path!r}: {exc.strerror}") from None
    if not text:
        return None
    try:
        return cls.from_text(text)
    except ValueError as exc:
        raise ValueError(f"{var}(_FILE): {exc}") from None


def load_signing_key(environ: Mapping[str, str] | None = None) -> SigningKey | None:
    """The worker's key from ``LDP_CONFIG_SIGNING_KEY`` or ``LDP_CONFIG_SIGNING_KEY_FILE``
    (None when neither is set; ValueError naming the variable when unusable)."""
    return _load(SigningKey, ENV_SIGNING_KEY, ENV_SIGNING_KEY_FILE, environ)


def load_verify_key(environ: Mapping[str, str] | None = None) -> VerifyKey | None:
    """The pinned public key from ``LDP_CONFIG_PUBLIC_KEY`` or ``LDP_CONFIG_PUBLIC_KEY_FILE``."""
    return _load(VerifyKey, ENV_PUBLIC_KEY, ENV_PUBLIC_KEY_FILE, environ)


def keygen(directory: str | os.PathLike[str], *, public_dir: str | os.PathLike[str] | None = None,
           force: bool = False, if_missing: bool = False) -> tuple[Path, Path]:
    """Write a new key pair: ``config-signing.key`` (0600) into ``directory`` and
    ``config-signing.pub`` into ``public_dir`` (default: the same). Refuses to overwrite an
    existing private key unless ``force``; with ``if_missing`` an existing key is kept (its public
    key rewritten)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    pub_dir = Path(public_dir) if public_dir is not None else out
    pub_dir.mkdir(parents=True, exist_ok=True)
    priv, pub = out / PRIVATE_FILE, pub_dir / PUBLIC_FILE
    if priv.exists() and if_missing and not force:
        pub.write_text(SigningKey.from_text(priv.read_text()).verify_key.to_text() + "\n")
        return priv, pub
    if priv.exists() and not force:
        raise FileExistsError(f"{priv} exists (use --force to replace it)")
    key = SigningKey.generate()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(priv, flags, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(key.to_text() + "\n")
    os.chmod(priv, 0o600)
    pub.write_text(key.verify_key.to_text() + "\n")
    return priv, pub


def main(args: Any) -> int:
    """``ldpstream keygen --out DIR [--public-out DIR] [--force | --if-missing]``."""
    from ldpstream.errors import CliError

    try:
        priv, pub = keygen(args.out, public_dir=args.public_out, force=bool(args.force),
                           if_missing=bool(args.if_missing))
    except (FileExistsError, OSError, ValueError) as exc:
        raise CliError(f"keygen: {exc}") from None
    text = pub.read_text().strip()
    print(f"private key (worker: {ENV_SIGNING_KEY_FILE}={priv})\n"
          f"public key  (devices: {ENV_PUBLIC_KEY_FILE}={pub}): {text}\n"
          f"fingerprint {VerifyKey.from_text(text).fingerprint}")
    return 0
