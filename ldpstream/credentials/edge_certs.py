"""``ldpstream edge-certs``: a private CA and one server certificate for the device edge, the
Mosquitto broker and the HTTPS gateway of docker-compose.yml (docs/security.md "TLS at the device
edge"; docs/credentials.md).

Writes ``ca.pem`` (what devices pin) and ``server.pem`` (the server's key and certificate chain,
PEM) into ``--out``, and ``ca.pem`` also into ``--public-out`` (where services that only verify,
like the MQTT bridge and Prometheus, read it without seeing the server key); the certificate
names every host of ``--hosts`` (DNS names or IP addresses), so clients verify the chain and the
host name. The CA's private key is not kept:
nothing else can be signed by it. ``--if-missing`` keeps existing files (the compose one-shot).
For hosts on a real network, use certificates of your own CA instead (mount them at the same
paths).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ldpstream.credentials.x509 import write_pki
from ldpstream.errors import CliError

__all__ = ["CA_FILE", "SERVER_FILE", "DEFAULT_DAYS", "DEFAULT_HOSTS", "write_edge_certs"]

CA_FILE = "ca.pem"
SERVER_FILE = "server.pem"
DEFAULT_HOSTS = ("localhost", "mosquitto", "gateway", "127.0.0.1")
DEFAULT_DAYS = 825  # the longest validity clients commonly accept for a server certificate


def write_edge_certs(out: Path, hosts: tuple[str, ...], days: int = DEFAULT_DAYS, *,
                     if_missing: bool = False,
                     public_out: Path | None = None) -> tuple[Path, Path, bool]:
    """(ca.pem, server.pem, whether they were written now) under ``out``; ca.pem copied into
    ``public_out`` too (always, so a volume created later gets it)."""
    ca, server = out / CA_FILE, out / SERVER_FILE
    if if_missing and ca.is_file() and server.is_file():
        _publish(ca, public_out)
        return ca, server, False
    if not hosts or any(not h.strip() for h in hosts):
        raise CliError("--hosts: a comma-separated list of host names or addresses")
    if days < 1:
        raise CliError(f"--days must be >= 1, got {days}")
    written_ca, written_server = write_pki(out, hosts=hosts, days=days)
    written_ca.replace(ca)
    written_server.replace(server)
    # readable by the broker's and the gateway's users (other uids than this one-shot's); the
    # volume is mounted read-only into those two services only
    server.chmod(0o644)
    _publish(ca, public_out)
    return ca, server, True


def _publish(ca: Path, public_out: Path | None) -> None:
    if public_out is not None:
        public_out.mkdir(parents=True, exist_ok=True)
        (public_out / CA_FILE).write_bytes(ca.read_bytes())


def main(args: Any) -> int:
    """``ldpstream edge-certs --out DIR [--public-out DIR] [--hosts a,b] [--days N]
    [--if-missing]``."""
    hosts = tuple(h.strip() for h in args.hosts.split(","))
    try:
        ca, server, written = write_edge_certs(
            Path(args.out), hosts, args.days, if_missing=args.if_missing,
            public_out=Path(args.public_out) if args.public_out else None)
    except OSError as exc:
        raise CliError(f"edge-certs: {exc}") from None
    print(f"{'wrote' if written else 'kept'} {ca} (devices pin it) and {server} (hosts: "
          f"{', '.join(hosts) if written else 'unchanged'})")
    return 0
