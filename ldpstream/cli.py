"""The ldpstream command line: up, worker, fleet, simulate, estimates, bench.

Every subcommand lives in its own module and is imported lazily, so ``ldpstream simulate`` needs no
Kafka or Redis libraries at start-up.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from typing import Any

from ldpstream import termination
from ldpstream.errors import CliError
from ldpstream.names import (
    DEFAULT_BIND,
    DEFAULT_GATEWAY_PORT,
    DEFAULT_WEB_PORT,
    ENV_CONFIG,
    ENV_REQUIRE_DEVICE_AUTH,
    FLEET_DEVICES,
    MAX_MESSAGE_BYTES,
)

__all__ = ["CliError", "build_parser", "main"]


def _simulate_args(p: argparse.ArgumentParser) -> None:
    # imported here, not at the top: the CLI starts (and takes SIGTERM) before numpy loads
    from ldpstream.estimators.mechanism import DEFAULT_MECHANISM, DEFAULT_NUMERIC_MECHANISM

    p.add_argument("--data", default=None,
                   help="CSV file (default: the bundled UCI Adult); '?' is a category")
    p.add_argument("--columns", default=None,
                   help="comma-separated column names (default: the 8 Adult attributes)")
    p.add_argument("--generator", default=None,
                   help="synthetic correlated data instead of a CSV, e.g. 'corr:m=4,d=10,rho=0.7,n=20000'")
    p.add_argument("--mechanism", default=None,
                   help=f"any registered mechanism (an unknown name lists them; default "
                        f"{DEFAULT_MECHANISM}, with --numeric {DEFAULT_NUMERIC_MECHANISM})")
    p.add_argument("--numeric", default=None, metavar="COLS",
                   help="numeric columns as they are, e.g. 'age,hours-per-week' or 'age=17:90' "
                        "(a range; default the data's min and max): W1, mean and quantile "
                        "errors per attribute (docs/numeric.md)")
    p.add_argument("--estimator", action="append", default=None,
                   help="repeatable: any estimator of the mechanism (an unknown one lists them)")
    p.add_argument("--ways", default=None,
                   help="comma-separated w values (marginal sizes; default 2,3, or 1 for "
                        "mechanisms that estimate one-way marginals only)")
    p.add_argument("--subsets", type=int, default=10, help="random attribute subsets per w")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--runs", type=int, default=1, help="seeded repetitions (JSON adds standard errors)")
    p.add_argument("--epsilon", type=float, default=None,
                   help="privacy budget (default 1.0, unless the parameters fix ε: rrba --p and "
                        "--gamma, lopub --f); rrba solves p (or γ, with --p) and lopub f from it")
    p.add_argument("--epsilon-scope", choices=("attribute", "record"), default="attribute",
                   help="attribute: every attribute gets ε (a record costs m·ε); record: ε per "
                        "record")
    p.add_argument("--param", action="append", default=None, metavar="NAME=VALUE",
                   help="repeatable: a mechanism parameter, as in a collection's params: "
                        "(value read as YAML, e.g. --param neighbours=attribute)")
    p.add_argument("--proper", action="store_true", help="apply the proper-distribution repair")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--compare", action="store_true",
                   help="which mechanism for this data: split (rr-ind) vs partitioned at the same "
                        "ε per record, side by side (ignores --mechanism)")
    # RRBA
    p.add_argument("--k", type=int, default=None, help="RRBA combination size (default 2)")
    p.add_argument("--p", type=float, default=None, help="RRBA truth probability p")
    p.add_argument("--gamma", type=float, default=None,
                   help="RRBA floor γ on fake-cell tables (default 0.05)")
    p.add_argument("--block-size", action="append", type=int, default=None, help="RRBA block size(s)")
    # Corr-RR
    p.add_argument("--phase1-fraction", type=float, default=None,
                   help="two-phase mechanisms (corr-rr, corr-rr-paper, rs-rfd, rr-clusters): the "
                        "share β of the devices in the first phase (default 0.1)")
    # LoPub
    p.add_argument("--f", type=float, default=None, help="LoPub bit-flip probability f")
    p.add_argument("--bloom-bits", type=int, default=None, help="LoPub Bloom bits per attribute")
    p.add_argument("--hashes", type=int, default=None, help="LoPub hash functions h")
    p.add_argument("--synthesize", default=None,
                   help="write a synthetic dataset CSV here (LoPub Algs. 4 and 6, joints from the "
                        "first estimator)")
    # memoization (ldpstream/simulate/memo.py)
    p.add_argument("--memoize", action="store_true",
                   help="memoized vs fresh randomization at equal ε per device per day "
                        "(--epsilon), every device reporting its record R times a day")
    p.add_argument("--reports-per-device", default="1,10,100",
                   help="--memoize: comma-separated reports per device per day (default 1,10,100)")
    p.add_argument("--memo-mechanisms", default=None,
                   help="--memoize: comma-separated mechanisms (default partitioned,rr-ind)")
    p.add_argument("--rotation-s", type=float, default=86400.0,
                   help="--memoize: rotation period of the memoized responses (default 86400)")
    p.add_argument("--instantaneous-epsilon", type=float, default=None,
                   help="--memoize: ε of the instantaneous layer per report (default: none)")


DESCRIPTION = ("Live joint-distribution estimates from telemetry under local differential "
               "privacy. Start with `ldpstream up` (the whole stack on this machine) or "
               "`ldpstream simulate` (offline).")


def build_parser() -> argparse.ArgumentParser:
    from ldpstream import __version__

    parser = argparse.ArgumentParser(prog="ldpstream", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"ldpstream {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("simulate", help="offline: randomize a dataset, estimate, print metrics")
    _simulate_args(p)

    _bench_parsers(sub)

    p = sub.add_parser("up", help="embedded stack: broker, Redis, worker and fleet on this machine")
    _config_arg(p)
    p.add_argument("--data", default=None,
                   help="true records the fleet samples, for every collection: a CSV with the "
                        "collections' columns, or 'generator[:skewed]' (default: each "
                        "collection's schema CSV; a collection without one gets 'generator')")
    p.add_argument("--rate", type=float, default=2000.0,
                   help="fleet reports per second, per collection (default 2000)")
    p.add_argument("--devices", type=int, default=FLEET_DEVICES,
                   help=f"simulated devices per collection (default {FLEET_DEVICES:,}: a memoized "
                        "collection counts devices, not reports)")
    _web_port_arg(p)
    p.add_argument("--no-fleet", action="store_true",
                   help="start no fleet (send reports yourself, e.g. with the device SDK)")
    p.add_argument("--duration", type=float, default=None,
                   help="stop after this many seconds (default: run until Ctrl-C)")
    p.add_argument("--mqtt", action="store_true",
                   help="also start an embedded Mosquitto and the MQTT bridge, and print how a "
                        "device connects (docs/devices.md, \"MQTT\")")
    p.add_argument("--obs", action="store_true",
                   help="also start Prometheus and Alertmanager (Debian packages) with the "
                        "project's alert rules; the page shows firing alerts "
                        "(docs/dashboards.md, \"Alerts without Docker\")")

    p = sub.add_parser("worker", help="run a worker (needs KAFKA_BOOTSTRAP_SERVERS, REDIS_URL)")
    _config_arg(p)
    _web_port_arg(p)

    p = sub.add_parser("fleet", help="simulate devices sending randomized reports")
    _config_arg(p)
    p.add_argument("--collection", default=None,
                   help="collection id to feed (default: the first one in the config)")
    p.add_argument("--data", default=None,
                   help="CSV of true records or 'generator[:skewed]' (default: the collection's "
                        "schema CSV, else 'generator')")
    p.add_argument("--devices", type=int, default=FLEET_DEVICES,
                   help=f"number of simulated devices (default {FLEET_DEVICES:,})")
    p.add_argument("--rate", type=float, default=2000.0,
                   help="reports per second (default 2000; 0 = as fast as possible)")
    p.add_argument("--batch", type=int, default=None, help="reports per Kafka message (default 500)")
    p.add_argument("--device-fleet", default=None,
                   help="sign each simulated device's batch as a device of this fleet, with "
                        "keys derived from LDP_DEVICE_SECRETS_FILE (docs/security.md)")
    p.add_argument("--total", type=int, default=None, help="stop after this many reports")
    p.add_argument("--drift-at", type=float, default=None,
                   help="switch the population this many seconds after the start")
    p.add_argument("--drift-to", default=None,
                   help="CSV or generator spec after the drift (default 'generator:skewed'; "
                        "needs --drift-at)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: fresh entropy)")
    p.add_argument("--max-epsilon", type=float, default=None,
                   help="refuse a published mechanism state costing more ε per report than this "
                        "(default: the ε of the locally configured mechanism)")

    p = sub.add_parser("gateway", help="HTTP ingest gateway for devices (docs/devices.md)")
    p.add_argument("--port", type=int, default=DEFAULT_GATEWAY_PORT,
                   help=f"port to listen on (default {DEFAULT_GATEWAY_PORT})")
    p.add_argument("--bind", default=DEFAULT_BIND,
                   help=f"address to listen on (default {DEFAULT_BIND}; 0.0.0.0 for every "
                        "interface)")
    p.add_argument("--tokens", default=None,
                   help="fleet tokens file (default: $LDP_GATEWAY_TOKENS_FILE or "
                        "$LDP_GATEWAY_TOKENS)")
    p.add_argument("--max-body-bytes", type=int, default=MAX_MESSAGE_BYTES,
                   help="largest request body accepted (default 1 MiB)")
    p.add_argument("--tls-cert", default=None,
                   help="serve HTTPS with this PEM certificate chain (docs/security.md)")
    p.add_argument("--tls-key", default=None,
                   help="the private key of --tls-cert, PEM (default: inside --tls-cert)")
    p.add_argument("--require-device-auth", action="store_true",
                   default=os.environ.get(ENV_REQUIRE_DEVICE_AUTH, "") in ("1", "true"),
                   help="refuse batches without a device MAC (401 unauthenticated; "
                        f"{ENV_REQUIRE_DEVICE_AUTH}=1; docs/security.md)")

    _mqtt_bridge_parser(sub)

    p = sub.add_parser("keygen", help="write the key pair that signs ldp.config (docs/security.md)")
    p.add_argument("--out", default=".", help="directory for config-signing.key and .pub")
    p.add_argument("--public-out", default=None, help="directory for the public key (default: --out)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--force", action="store_true", help="replace an existing key")
    g.add_argument("--if-missing", action="store_true", help="keep an existing key (exit 0)")

    from ldpstream.credentials.edge_certs import DEFAULT_DAYS, DEFAULT_HOSTS

    p = sub.add_parser("edge-certs", help="a CA and server certificate for Mosquitto and the "
                       "gateway (docs/security.md)")
    p.add_argument("--out", required=True, help="directory for ca.pem and server.pem")
    p.add_argument("--public-out", default=None, help="another directory for ca.pem alone")
    p.add_argument("--hosts", default=",".join(DEFAULT_HOSTS),
                   help="host names and addresses the certificate names (comma-separated)")
    p.add_argument("--days", type=int, default=DEFAULT_DAYS,
                   help=f"validity in days (default {DEFAULT_DAYS})")
    p.add_argument("--if-missing", action="store_true", help="keep existing files (exit 0)")

    p = sub.add_parser("device-credentials", help="a new fleet secret, or a device's own key "
                       "derived from it (docs/credentials.md)")
    p.add_argument("--new-secret", action="store_true", help="print a new random fleet secret")
    p.add_argument("--init", default=None, metavar="FILE",
                   help="write (or extend) the fleets' secrets file with a new secret for each "
                        "of --fleets it lacks (the compose one-shot)")
    p.add_argument("--fleets", default=None, help="with --init: fleet names (comma-separated)")
    p.add_argument("--fleet", default=None, help="the device's fleet")
    p.add_argument("--device-id", type=int, default=None, help="the device's id (u64)")
    p.add_argument("--count", type=int, default=None,
                   help="print the credentials of COUNT devices from --device-id on, one a line")
    p.add_argument("--secrets", default=None,
                   help="the fleets' secrets file (default: LDP_DEVICE_SECRETS_FILE, "
                        "LDP_DEVICE_SECRETS)")

    p = sub.add_parser("kafka-certs", help="write a CA and the Kafka broker's TLS certificate "
                                           "(docker-compose.yml; docs/security.md)")
    p.add_argument("--out", required=True, help="directory for ca.pem and broker.pem")
    p.add_argument("--hosts", default="kafka,localhost,127.0.0.1",
                   help="host names and addresses the certificate is valid for (comma-separated)")
    p.add_argument("--days", type=int, default=825, help="validity (default 825 days)")
    p.add_argument("--if-missing", action="store_true", help="keep existing files (exit 0)")

    p = sub.add_parser("estimates", help="query a running worker's estimates over HTTP")
    p.add_argument("collection", nargs="?",
                   help="collection id (omit to list the collections)")
    p.add_argument("--attrs", default=None,
                   help="comma-separated attributes of one marginal, e.g. sex,Salary")
    p.add_argument("--method", default=None,
                   help="estimator (default: the collection's first configured one)")
    p.add_argument("--window", default=None,
                   help="time window (one of the collection's windows, e.g. 5m, 1h, all; "
                        "default: its first)")
    p.add_argument("--url", default=None,
                   help="base URL of a worker's API (default: $LDP_API_URL, else the URL of the "
                        "running `ldpstream up`, else http://127.0.0.1:$LDP_WEB_PORT, port "
                        f"{DEFAULT_WEB_PORT} when that is unset)")
    p.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")

    p = sub.add_parser("config-reference",
                       help="print the config field reference generated from the config models")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", default=None, metavar="PAGE",
                   help="replace the generated part of PAGE (docs/configuration.md)")
    g.add_argument("--check", default=None, metavar="PAGE",
                   help="exit 1 when the generated part of PAGE differs from the models")
    return parser


def _bench_parsers(sub: Any) -> None:
    """``ldpstream bench NAME``: one sub-command per benchmark, its --help from its docstring."""
    from ldpstream.bench.run import BENCHES, EXTRA_OPTIONS, describe

    p = sub.add_parser("bench", help="benchmarks: " + " | ".join(BENCHES),
                       description="Benchmarks; `ldpstream bench NAME --help` says what one "
                                   "measures and how.")
    names = p.add_subparsers(dest="name", metavar="NAME", required=True,
                             help="which benchmark to run (`ldpstream bench NAME --help`)")
    for name in BENCHES:
        summary, text = describe(name)
        b = names.add_parser(name, help=summary, description=text,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        b.add_argument("--json", action="store_true", help="print JSON instead of a table")
        b.add_argument("--quick", action="store_true", help="smaller sizes (for smoke tests)")
        if "--redis-cluster" in EXTRA_OPTIONS.get(name, ()):
            b.add_argument("--redis-cluster", action="store_true",
                           help="also ingest into a Redis Cluster and time applies on 1 and 3 "
                                "masters")
        if "--broker" in EXTRA_OPTIONS.get(name, ()):
            b.add_argument("--broker", choices=("tansu", "kafka"), default="tansu",
                           help="kafka: also run the raw/ingest pairs on Apache Kafka (JVM, "
                                "ldpstream/dev/kafka.py), next to the embedded broker's")
        if "--live" in EXTRA_OPTIONS.get(name, ()):
            b.add_argument("--live", action="store_true",
                           help="instead: ingest of a numeric collection against a categorical "
                                "one of the same width, worker and broker running "
                                "(bench/numeric_live.py)")
        if "--drift" in EXTRA_OPTIONS.get(name, ()):
            b.add_argument("--drift", action="store_true",
                           help="instead: calibration of the drift test of a numeric attribute "
                                "inside partitioned marginals (bench/numeric_drift.py)")
        if "--generate" in EXTRA_OPTIONS.get(name, ()):
            _heldout_options(b)
        if "--steps" in EXTRA_OPTIONS.get(name, ()):
            b.add_argument("--steps", default=None,
                           help="comma-separated device counts to grow to (default "
                                "1000000,3000000,10000000)")
            b.add_argument("--restart-at", default=None,
                           help="comma-separated device counts whose state is written straight "
                                "to Redis, then a worker restarted on it (restart time, RSS)")
            b.add_argument("--senders", default=None,
                           help="instead: the side-state run (bench/device_side.py): keyed "
                                "batches of a collection with a device quota, with the dedupe and "
                                "quota state of this many senders (comma-separated) in Redis")
            b.add_argument("--compare-python", default=None, metavar="PYTHON",
                           help="with --senders: also run the workers of the ldpstream installed "
                                "for this Python (an earlier version), alternating, on state "
                                "written in the earlier single-hash format both read")


def _heldout_options(b: Any) -> None:
    """``bench marginals``'s held-out runs (bench/heldout.py): any CSV, BIF or fresh networks."""
    b.add_argument("--data", action="append", default=[], metavar="CSV",
                   help="held-out run on this CSV (its records are the population; repeatable)")
    b.add_argument("--columns", default=None,
                   help="comma-separated columns of --data (default: every column)")
    b.add_argument("--bif", action="append", default=[], metavar="FILE",
                   help="held-out run on records sampled from this BIF network (repeatable)")
    b.add_argument("--generate", type=int, default=0, metavar="K",
                   help="held-out run on K fresh random networks (skewed, near-deterministic, "
                        "dense CPTs in turn), network i from seed --seed + i")
    b.add_argument("--seed", type=int, default=0,
                   help="first seed of the generated networks and of the samples (default 0)")
    b.add_argument("--epsilons", default="0.5,1,2,4,8",
                   help="ε per record of the held-out runs (default 0.5,1,2,4,8)")
    b.add_argument("--runs", type=int, default=3,
                   help="randomizations per dataset and ε in the held-out runs (default 3)")
    b.add_argument("--bounds", action="store_true",
                   help="instead: the coverage and width of the default estimator's error "
                        "bounds, proxy and bootstrap, each run a fresh sample and randomization "
                        "(bench/heldout_bounds.py)")


def _mqtt_bridge_parser(sub: Any) -> None:
    """``ldpstream mqtt-bridge`` (producers/mqtt_bridge.py; docs/devices.md, "MQTT")."""
    from ldpstream.names import (
        DEFAULT_MQTT_BRIDGE_PORT,
        ENV_MQTT_CA,
        ENV_MQTT_CLIENT_ID,
        ENV_MQTT_FLEETS_FILE,
        ENV_MQTT_SUBSCRIPTION,
        ENV_MQTT_URL,
    )

    p = sub.add_parser("mqtt-bridge", help="MQTT ingress: relay device batches from an MQTT "
                                           "broker into Kafka (docs/devices.md)")
    p.add_argument("--mqtt-url", default=None,
                   help=f"broker and the bridge's credentials, mqtt:// or "
                        f"mqtts://user:pass@host:port (default: ${ENV_MQTT_URL})")
    p.add_argument("--mqtt-ca", default=None,
                   help=f"CA certificate (PEM) for mqtts:// (default: ${ENV_MQTT_CA}, else the "
                        f"system trust store)")
    p.add_argument("--fleets", default=None,
                   help=f"fleets file: the gateway's tokens file, tokens optional (default: "
                        f"${ENV_MQTT_FLEETS_FILE})")
    p.add_argument("--client-id", default=None,
                   help=f"MQTT client id, one per bridge, stable across restarts (default: "
                        f"${ENV_MQTT_CLIENT_ID}, else ldp-bridge-<hostname>)")
    p.add_argument("--subscription", choices=("shared", "exclusive"), default=None,
                   help=f"shared: $share/ldp-bridge/ldp/+/+/reports, bridges split the messages; "
                        f"exclusive: ldp/+/+/reports, one bridge, survives restarts of "
                        f"Mosquitto 2.0.11 (default: ${ENV_MQTT_SUBSCRIPTION}, else shared)")
    p.add_argument("--port", type=int, default=None,
                   help=f"port of /healthz and /metrics (default: $LDP_WEB_PORT, else "
                        f"{DEFAULT_MQTT_BRIDGE_PORT})")
    p.add_argument("--bind", default=None,
                   help=f"address of /healthz and /metrics (default: $LDP_WEB_BIND, else "
                        f"{DEFAULT_BIND})")
    p.add_argument("--max-body-bytes", type=int, default=MAX_MESSAGE_BYTES,
                   help="largest MQTT message accepted (default 1 MiB)")
    p.add_argument("--retire", action="store_true",
                   help="take this client id out of the group for good: handle what its session "
                        "holds, end the session, exit")
    p.add_argument("--broker-log", default=None,
                   help="the broker's log file written with log_type debug: count its ACL-denied "
                        "publishes (default: $LDP_MQTT_BROKER_LOG_FILE; docs/security.md)")


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=os.environ.get(ENV_CONFIG) or None,
                   help="collections config, YAML or TOML (default: $LDP_CONFIG, else the "
                        "bundled Adult demo)")


def _web_port_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--web-port", type=int, default=None,
                   help="port of the worker's HTTP API, live page and /metrics (default: "
                        f"$LDP_WEB_PORT, else {DEFAULT_WEB_PORT})")


def _endpoint_defaults(args: argparse.Namespace) -> None:
    """``--web-port`` and ``--url`` left out: from the environment (ldpstream/endpoint.py)."""
    from ldpstream import endpoint

    if "web_port" in vars(args) and args.web_port is None:
        args.web_port = endpoint.web_port_default()
    if args.command == "estimates" and args.url is None:
        args.url = endpoint.api_url_default()


_COMMANDS = {
    "simulate": "ldpstream.simulate",
    "bench": "ldpstream.bench.run",
    "up": "ldpstream.embedded",
    "worker": "ldpstream.agents.app",
    "fleet": "ldpstream.producers.fleet",
    "estimates": "ldpstream.query",
    "keygen": "ldpstream.producers.signing",
    "gateway": "ldpstream.producers.gateway",
    "edge-certs": "ldpstream.credentials.edge_certs",
    "mqtt-bridge": "ldpstream.producers.mqtt_bridge_cli",
    "config-reference": "ldpstream.config_docs",
    "kafka-certs": "ldpstream.credentials.kafka_certs",
    "device-credentials": "ldpstream.credentials.device_keys",
}


def main(argv: list[str] | None = None) -> int:
    # SIGTERM stops a command cleanly: the long-running ones install their own handler (a clean
    # stop); until then (from the first line, before the parser imports anything heavy), and in
    # batch commands (simulate, bench), it unwinds like Ctrl-C does
    previous = signal.signal(signal.SIGTERM, termination.on_sigterm) \
        if threading.current_thread() is threading.main_thread() else None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:  # bare `ldpstream`: what it can do, not an error
            parser.print_help()
            return 0
        _endpoint_defaults(args)
        module = importlib.import_module(_COMMANDS[args.command])
        termination.raise_if_received()   # its exception may be lost in a module's compilation
        return int(module.main(args) or 0)
    except CliError as exc:
        print(f"ldpstream: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except termination.Terminated:
        print("ldpstream: stopped by SIGTERM", file=sys.stderr)
        return 143
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
