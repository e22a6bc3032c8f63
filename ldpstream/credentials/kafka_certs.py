"""``ldpstream kafka-certs``: the CA and broker certificate of the compose files' Apache Kafka
(docs/credentials.md, docs/security.md "Kafka: TLS, SASL and ACLs")."""
from __future__ import annotations

import argparse
from pathlib import Path

from ldpstream.credentials.x509 import write_pki
from ldpstream.errors import CliError

__all__ = ["main"]


def main(args: argparse.Namespace) -> int:
    """``ldpstream kafka-certs --out DIR [--hosts h,h] [--days N] [--if-missing]``: the CA and
    broker certificate of the compose files' Kafka (docker-compose.yml ``kafka-certs``)."""
    out = Path(args.out)
    if args.if_missing and (out / "ca.pem").is_file() and (out / "broker.pem").is_file():
        print(f"kafka-certs: keeping {out / 'ca.pem'} and {out / 'broker.pem'}")
        return 0
    hosts = tuple(h.strip() for h in args.hosts.split(",") if h.strip())
    if not hosts:
        raise CliError("kafka-certs: --hosts names no host")
    # the broker runs as another user than this command (compose: two images); the key file is
    # readable by both, on a volume only they mount
    ca, broker = write_pki(out, hosts=hosts, days=int(args.days),
                           ca_name="ldpstream Kafka CA", key_mode=0o644)
    print(f"CA (clients: LDP_KAFKA_SSL_CAFILE={ca}); broker key and chain {broker} for "
          f"{', '.join(hosts)}, valid {int(args.days)} days")
    return 0
