"""What the HTTP gateway offers devices besides reports: TLS on its port and the public key that
signs ``ldp.config`` (docs/devices.md "Getting the public key", docs/security.md "TLS at the
device edge").

``GET /v1/public-key`` answers, without a token (the key is public)::

    {"alg": "ed25519", "public_key": "<base64 of the raw 32 bytes>", "key_id": "<16 hex>",
     "fingerprint": "sha256:<64 hex>"}

``key_id`` is the one every signed state names; ``fingerprint`` is what ``ldpstream keygen``
prints, for an operator to compare out of band before devices pin a key fetched this way.
"""
from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from ldpstream.errors import CliError
from ldpstream.producers.signing import ALG, VerifyKey

__all__ = ["public_key_document", "public_key_handler", "server_tls_context", "PUBLIC_KEY_PATH"]

PUBLIC_KEY_PATH = "/v1/public-key"


def public_key_document(key: VerifyKey) -> dict[str, str]:
    """The JSON body of ``GET /v1/public-key``."""
    return {"alg": ALG, "public_key": key.to_text(), "key_id": key.key_id,
            "fingerprint": key.fingerprint}


def server_tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """A TLS 1.2+ server context from a PEM certificate chain and its private key (``key``
    None: the key is in ``cert``); None when neither is given. Raises :class:`CliError`
    naming the option that is missing or unreadable."""
    if cert is None and key is None:
        return None
    if cert is None:
        raise CliError("--tls-key needs --tls-cert (the certificate chain, PEM)")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        if path is not None and not Path(path).is_file():
            raise CliError(f"{flag}: no such file: {path}")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise CliError(f"--tls-cert/--tls-key: cannot load the certificate and key: {exc}") from None
    return ctx


async def public_key_handler(key: VerifyKey, request: Any) -> Any:
    """aiohttp handler of :data:`PUBLIC_KEY_PATH` (bind ``key`` with functools.partial)."""
    from aiohttp import web

    return web.json_response(public_key_document(key),
                             headers={"Cache-Control": "public, max-age=300"})
