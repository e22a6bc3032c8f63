"""A certificate authority and one server certificate signed by it (docs/credentials.md): what
``ldpstream kafka-certs`` writes for the compose files' broker, ``ldpstream edge-certs`` for
Mosquitto and the HTTPS gateway, and the TLS tests and test brokers use with a short validity.

The CA signs one server certificate whose subject alternative names are the given hosts (default
``localhost`` and ``127.0.0.1``), so clients verify the chain *and* the host name. Keys are
unencrypted PKCS#8, the form Kafka's PEM key store reads.
"""
from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

__all__ = ["write_pki"]


def write_pki(directory: Path, *, hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
                   days: int = 2, ca_name: str = "ldpstream test CA",
                   key_mode: int = 0o600) -> tuple[Path, Path]:
    """Write ``ca.pem`` (the CA certificate) and ``broker.pem`` (server key + certificate chain,
    file mode ``key_mode``) into ``directory``; returns their paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    ca = (x509.CertificateBuilder().subject_name(ca_subject).issuer_name(ca_subject)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    directory.mkdir(parents=True, exist_ok=True)
    ca_path, server_path = directory / "ca.pem", directory / "broker.pem"
    ca_path.write_bytes(ca.public_bytes(pem))
    server_path.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + cert.public_bytes(pem) + ca.public_bytes(pem))
    server_path.chmod(key_mode)
    return ca_path, server_path
