"""The gateway over TLS (docs/security.md "TLS at the device edge") and the public key it serves
(docs/devices.md "Getting the public key"): a client that trusts the CA and names a host of the
certificate fetches the key and posts a batch that Kafka acknowledges, and so do the C (libcurl,
``LDP_CA_FILE``) and TypeScript (fetch, ``NODE_EXTRA_CA_CERTS``) examples; a wrong host name, an
untrusted CA and plain HTTP are refused; bad ``--tls-*`` options fail at start naming the
option."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import socket
import ssl
import subprocess
from pathlib import Path

import pytest
from sdk_helpers import TS_DIR, c_sdk, ts_sdk  # noqa: F401
from test_gateway import TOKEN_A, fleets_doc

from ldpstream.errors import CliError
from ldpstream.estimators.families.rr import RRIndependent
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.producers.codec import encode_batch
from ldpstream.producers.gateway import IngestGateway, parse_fleets, serve
from ldpstream.producers.gateway_edge import PUBLIC_KEY_PATH, server_tls_context
from ldpstream.producers.signing import load_signing_key, load_verify_key

pytestmark = pytest.mark.pipeline

DOM = Domain.from_categories({"os": ["android", "ios", "other"], "plan": ["free", "pro"]})


def test_tls_options_fail_at_start_naming_the_option(tmp_path):
    from ldpstream.credentials.x509 import write_pki

    assert server_tls_context(None, None) is None
    with pytest.raises(CliError, match="--tls-key needs --tls-cert"):
        server_tls_context(None, str(tmp_path / "k.pem"))
    with pytest.raises(CliError, match="--tls-cert: no such file"):
        server_tls_context(str(tmp_path / "missing.pem"), None)
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(CliError, match="cannot load"):
        server_tls_context(str(tmp_path / "junk.pem"), None)
    _, chain = write_pki(tmp_path / "pki")
    ctx = server_tls_context(str(chain), None)
    assert ctx is not None and ctx.minimum_version == ssl.TLSVersion.TLSv1_2


RECORDS = [{"os": "ios", "plan": "pro"}, {"os": "android", "plan": "free"},
           {"os": "other", "plan": "free"}]


def _post_c(build: Path, url: str, cid: str, ca: Path, state: Path):
    state.mkdir()
    text = "".join(",".join(f"{a}={v}" for a, v in r.items()) + "\n" for r in RECORDS)
    return subprocess.run([str(build / "ldp_post"), url, TOKEN_A, cid, load_verify_key().to_text(),
                           "11", str(state)], input=text, capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, LDP_CA_FILE=str(ca)))


def _post_ts(dist: Path, url: str, cid: str, ca: Path, state: Path):
    state.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in RECORDS)
    return subprocess.run(["node", str(dist / "tools" / "post.js"), url, TOKEN_A, cid,
                           load_verify_key().to_text(), "12", str(state)], input=text,
                          capture_output=True, text=True, timeout=60, cwd=TS_DIR,
                          env=dict(os.environ, NODE_EXTRA_CA_CERTS=str(ca)))


def _handshake(port: int, ctx: ssl.SSLContext, host: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname=host):
            pass


def test_gateway_over_tls_serves_the_key_and_refuses_wrong_hosts(
        tmp_path, kafka_broker, unique_name, c_sdk, ts_sdk):  # noqa: F811
    import aiohttp

    from ldpstream.credentials.x509 import write_pki
    from ldpstream.dev.process import free_port
    from ldpstream.kafka_admin import create_topics
    from ldpstream.producers.publisher import Publisher

    cid, cfg = unique_name, f"cfg.{unique_name}"
    ca, chain = write_pki(tmp_path / "pki", hosts=("localhost",))
    other_ca, _ = write_pki(tmp_path / "other", hosts=("localhost", "127.0.0.1"))
    mech = RRIndependent(DOM, epsilon=1.0, version=1)
    trusted = ssl.create_default_context(cafile=str(ca))

    async def run():
        await create_topics(kafka_broker.bootstrap, {cfg: 1, f"ldp.reports.{cid}": 1},
                            compacted={cfg})
        async with Publisher(kafka_broker.bootstrap) as pub:
            await pub.send_and_wait(cfg, load_signing_key().sign_state(mech.device_state(),
                                                                       cid), key=cid.encode())
        gw = IngestGateway(kafka_broker.bootstrap, parse_fleets(fleets_doc(cid), "t"),
                           config_topic=cfg)
        port = free_port()
        runner = await serve(gw, "127.0.0.1", port,
                             ssl_context=server_tls_context(str(chain), None))
        try:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"https://localhost:{port}{PUBLIC_KEY_PATH}",
                                 ssl=trusted) as r:
                    assert r.status == 200
                    doc = await r.json()
                key = load_verify_key()
                assert doc == {"alg": "ed25519", "public_key": key.to_text(),
                               "key_id": key.key_id, "fingerprint": key.fingerprint}
                raw = base64.b64decode(doc["public_key"])
                assert doc["fingerprint"] == "sha256:" + hashlib.sha256(raw).hexdigest()
                assert doc["key_id"] == hashlib.sha256(raw).hexdigest()[:16]
                body = encode_batch(cid, 1, [[1, 0], [2, 1]], device_ids=[5, 5])
                async with s.post(f"https://localhost:{port}/v1/collections/{cid}/reports",
                                  data=body, ssl=trusted,
                                  headers={"Authorization": f"Bearer {TOKEN_A}",
                                           "Content-Type": "application/octet-stream"}) as r:
                    assert r.status == 200, await r.text()
                    assert (await r.json())["accepted"] == 2
                # plain HTTP on the TLS port gets no answer
                with pytest.raises(aiohttp.ClientError):
                    async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                        await r.read()
            # a name the certificate does not carry, and a CA the client does not trust
            loop = asyncio.get_running_loop()
            with pytest.raises(ssl.SSLCertVerificationError, match="[Hh]ostname mismatch"):
                await loop.run_in_executor(None, _handshake, port, trusted, "gateway.example")
            untrusted = ssl.create_default_context(cafile=str(other_ca))
            with pytest.raises(ssl.SSLCertVerificationError):
                await loop.run_in_executor(None, _handshake, port, untrusted, "localhost")
            await loop.run_in_executor(None, _handshake, port, trusted, "localhost")
            # the C (libcurl) and TypeScript (fetch) examples over HTTPS, the CA given to them
            for host, ok in (("localhost", True), ("127.0.0.1", False)):
                c, t = await asyncio.gather(
                    asyncio.to_thread(_post_c, c_sdk, f"https://{host}:{port}", cid, ca,
                                      tmp_path / f"c-{host}"),
                    asyncio.to_thread(_post_ts, ts_sdk, f"https://{host}:{port}", cid, ca,
                                      tmp_path / f"ts-{host}"))
                if ok:
                    assert c.returncode == 0 and t.returncode == 0, (c.stderr, t.stderr)
                    assert json.loads(c.stdout) == json.loads(t.stdout) == {"sent": 3,
                                                                             "batches": 1}
                else:  # the certificate names localhost only
                    assert c.returncode != 0 and "SSL" in c.stderr, c.stderr
                    assert t.returncode != 0 and "altnames" in t.stderr, t.stderr
        finally:
            await runner.cleanup()
            await gw.stop()

    asyncio.run(run())


def test_gateway_cli_refuses_a_key_without_certificate(monkeypatch, capsys, tmp_path):
    import json

    from ldpstream.cli import main

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("LDP_GATEWAY_TOKENS", json.dumps(fleets_doc("c")))
    assert main(["gateway", "--tls-key", str(tmp_path / "k.pem")]) == 2
    assert "--tls-key needs --tls-cert" in capsys.readouterr().err
    assert main(["gateway", "--tls-cert", str(tmp_path / "none.pem")]) == 2
    assert "--tls-cert: no such file" in capsys.readouterr().err


def test_gateway_command_serves_https(tmp_path, kafka_broker):
    """``ldpstream gateway --tls-cert`` as a child process: HTTPS on its port, the key served,
    compose's healthcheck passes."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from ldpstream.credentials.x509 import write_pki
    from ldpstream.dev.process import free_port
    from ldpstream.kafka_admin import create_topics
    from ldpstream.names import CONFIG_TOPIC

    asyncio.run(create_topics(kafka_broker.bootstrap, {CONFIG_TOPIC: 1}, compacted={CONFIG_TOPIC}))
    ca, chain = write_pki(tmp_path / "pki")
    port = free_port()
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_broker.bootstrap,
               LDP_GATEWAY_TOKENS=json.dumps(fleets_doc("c")))
    log = open(tmp_path / "gateway.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "ldpstream.cli", "gateway", "--port",
                             str(port), "--tls-cert", str(chain)], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    ctx = ssl.create_default_context(cafile=str(ca))
    doc = None
    try:
        deadline = time.monotonic() + 60
        while doc is None and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
            try:
                with urllib.request.urlopen(f"https://localhost:{port}{PUBLIC_KEY_PATH}",
                                            context=ctx, timeout=2) as r:
                    doc = json.loads(r.read())
            except OSError:
                time.sleep(0.3)
        assert doc is not None and doc["key_id"] == load_verify_key().key_id
        # docker-compose.yml's healthcheck of the gateway, pointed at this one
        from test_compose import SERVICES

        code = SERVICES["gateway"]["healthcheck"]["test"][-1]
        code = code.replace("/tls/ca.pem", str(ca)).replace(":8443/", f":{port}/")
        assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0
        log.close()
    assert f"https://127.0.0.1:{port}/" in (tmp_path / "gateway.log").read_text()


def test_keygen_prints_the_fingerprint_the_gateway_serves(tmp_path, capsys):
    from ldpstream.cli import main
    from ldpstream.producers.gateway_edge import public_key_document
    from ldpstream.producers.signing import VerifyKey

    assert main(["keygen", "--out", str(tmp_path)]) == 0
    key = VerifyKey.from_text((tmp_path / "config-signing.pub").read_text())
    printed = capsys.readouterr().out
    assert f"fingerprint {public_key_document(key)['fingerprint']}" in printed
    assert main(["keygen", "--out", str(tmp_path), "--if-missing"]) == 0  # compose's restarts
    assert key.fingerprint in capsys.readouterr().out
