"""TLS/SASL settings for every Kafka client, from the environment: validated with errors naming
the variable, and really applied (a TLS client against the plaintext loopback broker fails to
connect; a worker with SASL but no credentials refuses to start)."""
from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys

import pytest
from conftest import write_config

from ldpstream.producers.kafka_security import KafkaSecurityError, kafka_security

pytestmark = pytest.mark.pipeline


def test_plaintext_by_default_and_sasl_ssl_kwargs(tmp_path):
    assert kafka_security({}).client_kwargs() == {"security_protocol": "PLAINTEXT"}
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    sec = kafka_security({"LDP_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
                          "LDP_KAFKA_SASL_USERNAME": "device",
                          "LDP_KAFKA_SASL_PASSWORD_FILE": str(pw)})
    kw = sec.client_kwargs()
    assert kw["security_protocol"] == "SASL_SSL" and isinstance(kw["ssl_context"], ssl.SSLContext)
    assert (kw["sasl_mechanism"], kw["sasl_plain_username"], kw["sasl_plain_password"]) == \
        ("SCRAM-SHA-256", "device", "s3cret")
    assert kw["ssl_context"].check_hostname and kw["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    assert sec.describe() == "SASL_SSL as 'device' (SCRAM-SHA-256)"
    creds = sec.faust_credentials()
    assert creds.username == "device" and creds.mechanism.value == "SCRAM-SHA-256"


@pytest.mark.parametrize("env,needle", [
    ({"LDP_KAFKA_SECURITY_PROTOCOL": "TLS"}, "LDP_KAFKA_SECURITY_PROTOCOL"),
    ({"LDP_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "LDP_KAFKA_SASL_USERNAME": "w"},
     "LDP_KAFKA_SASL_PASSWORD"),
    ({"LDP_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "LDP_KAFKA_SASL_MECHANISM": "GSSAPI",
      "LDP_KAFKA_SASL_USERNAME": "w", "LDP_KAFKA_SASL_PASSWORD": "p"}, "LDP_KAFKA_SASL_MECHANISM"),
    ({"LDP_KAFKA_SECURITY_PROTOCOL": "SSL", "LDP_KAFKA_SSL_CAFILE": "/nonexistent/ca.pem"},
     "LDP_KAFKA_SSL_CAFILE"),
    ({"LDP_KAFKA_SSL_CHECK_HOSTNAME": "maybe"}, "LDP_KAFKA_SSL_CHECK_HOSTNAME"),
])
def test_bad_settings_name_the_variable(env, needle):
    with pytest.raises(KafkaSecurityError, match=needle):
        kafka_security(env)


def test_tls_settings_reach_publisher_watcher_and_admin(tmp_path, monkeypatch):
    """Each client, given TLS settings, completes a TLS handshake with a loopback TLS server
    (verifying its certificate against the CA file) and sends a Kafka request inside it."""
    from ldpstream.credentials.x509 import write_pki
    from ldpstream.errors import ServiceError
    from ldpstream.kafka_admin import create_topics
    from ldpstream.producers.device import ConfigWatcher
    from ldpstream.producers.publisher import Publisher, PublishError

    ca, server_pem = write_pki(tmp_path)
    env = {"LDP_KAFKA_SECURITY_PROTOCOL": "SSL", "LDP_KAFKA_SSL_CAFILE": str(ca)}
    tls = kafka_security(env)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(server_pem)

    async def run():
        api_keys: list[int] = []

        async def serve(reader, writer):
            try:
                head = await reader.readexactly(6)  # size (i32) + api key (i16), decrypted
                api_keys.append(int.from_bytes(head[4:6], "big"))
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
        boot = "127.0.0.1:%d" % server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(PublishError):
                await Publisher(boot, security=tls).start(timeout_s=1)
            n_pub = len(api_keys)
            with pytest.raises(ConnectionError):
                await ConfigWatcher(boot, security=tls).start(timeout_s=1)
            n_watch = len(api_keys) - n_pub
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            with pytest.raises(ServiceError):
                await create_topics(boot, {"t": 1}, timeout_s=1)
            n_admin = len(api_keys) - n_pub - n_watch
        finally:
            server.close()
        assert n_pub and n_watch and n_admin, api_keys
        assert set(api_keys) <= {3, 18}, api_keys  # Metadata / ApiVersions: Kafka inside TLS

    asyncio.run(run())


def test_worker_with_sasl_but_no_credentials_refuses_to_start(tmp_path, service_env, unique_name):
    path = write_config(tmp_path / "c.yaml", unique_name, partitions=1)
    env = dict(service_env, LDP_KAFKA_SECURITY_PROTOCOL="SASL_SSL", LDP_KAFKA_SASL_USERNAME="worker")
    out = subprocess.run([sys.executable, "-m", "ldpstream.cli", "worker", "--config", path],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "LDP_KAFKA_SASL_PASSWORD" in out.stderr and "Traceback" not in out.stderr
