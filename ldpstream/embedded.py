"""``ldpstream up``: the whole stack on one machine, no Docker.

With no ``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL`` in the environment it starts the embedded
Kafka-protocol broker (Tansu) and a Redis server as child processes (ldpstream/dev/),
creates the topics, starts a worker (``ldpstream worker`` as a child process, consumer-group
session timeout of a few seconds because Tansu answers a group join after half of it) and one
simulated fleet per collection (in this process; each samples ``--data`` or its collection's
schema CSV), prints where the API and /metrics are and a live one-line status (reports/s, n,
last refresh), and stops everything on Ctrl-C (SIGINT), SIGTERM, SIGHUP or after ``--duration``
seconds: fleets first (their messages flushed), then the worker (SIGTERM, clean faust shutdown,
bounded), then the broker and Redis. Bad ``--data`` and a busy ``--web-port`` are refused before
anything starts; a fleet or worker that fails stops everything with exit status 1. If ``up``
itself is killed, every child gets a signal from the kernel (``PR_SET_PDEATHSIG``). ``--mqtt``
also starts an embedded Mosquitto and ``ldpstream mqtt-bridge`` and prints a device command per
SDK; ``--obs`` starts Prometheus and Alertmanager with the alert rules. Without a configured key
the states are signed by the dev identity kept in the state directory (docs/devices.md, "On
`make up`").
"""
from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ldpstream import termination
from ldpstream.names import DEFAULT_BIND, ENV_KAFKA_IDEMPOTENCE, ENV_PROMETHEUS_URL

if TYPE_CHECKING:  # pragma: no cover
    from ldpstream.producers.signing import VerifyKey

log = logging.getLogger(__name__)

EMBEDDED_SESSION_TIMEOUT_S = 3.0

try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None
except (OSError, AttributeError):  # pragma: no cover
    _PRCTL = None


class ExpectedKafkaNoise(logging.Filter):
    """Drops aiokafka's "Unable connect to ..." while ``quiet``: expected while the stack
    starts (clients retry until the broker answers) and while it stops (the broker goes before
    the last client has closed); while the stack runs it is a real error and is shown
    (docs/devices.md, "What `up` prints")."""

    def __init__(self) -> None:
        super().__init__()
        self.quiet = True

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.quiet and record.getMessage().startswith("Unable connect"))


KAFKA_NOISE = ExpectedKafkaNoise()


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG


class WorkerChild:
    """``ldpstream worker`` as a child process in its own process group."""

    def __init__(self, config_path: str | None, web_port: int, env: dict[str, str]) -> None:
        argv = [sys.executable, "-m", "ldpstream.cli", "worker", "--web-port", str(web_port)]
        if config_path:
            argv += ["--config", config_path]
        fd, self.log_path = tempfile.mkstemp(prefix="ldpstream-worker-", suffix=".log")
        os.close(fd)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_die_with_parent if _PRCTL is not None else None)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, n: int = 15) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                lines = fh.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        return "\n".join(l for l in lines[-n:] if l.strip() not in ("", "\x1b[?25l", "\x1b[?25h"))

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            except ProcessLookupError:
                pass
        try:  # grandchildren, if any, go with the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._log.close()
        return self.proc.returncode


#: the status line's reports/s is taken over this many seconds: Kafka messages of 500 reports
#: and 0.5 s ingest batches make a 1 s difference jump around a steady rate
RATE_SPAN_S = 5.0


def _rate(points: deque[tuple[float, int]], now: float, n: int) -> float:
    """Reports/s over the last :data:`RATE_SPAN_S` seconds of ``points`` (appended to)."""
    points.append((now, n))
    while len(points) > 2 and now - points[1][0] >= RATE_SPAN_S:
        points.popleft()
    t0, n0 = points[0]
    return (n - n0) / (now - t0) if now > t0 else 0.0


def _fmt_age(ts: float | None) -> str:
    if ts is None:
        return "never"
    return f"{max(0.0, time.time() - ts):.0f}s ago"


async def _last_refresh(store: Any, coll: Any) -> float | None:
    """``updated_at`` of the newest estimate of the collection's first marginal."""
    best = None
    for method in coll.estimators[:2]:
        try:
            doc = await store.get_estimate(coll.id, coll.windows[0].name, method, coll.marginals[0])
        except Exception:  # noqa: BLE001 - Redis busy / not there yet
            return best
        if doc and doc.get("updated_at") is not None:
            best = max(best or 0.0, float(doc["updated_at"]))
    return best


async def _run(args: Any, config: Any, bootstrap: str, redis_url: str, worker: WorkerChild,
               stop: asyncio.Event, data: dict[str, str], verify_key: VerifyKey) -> bool:
    """Feed every collection (one fleet each, sampling ``data[cid]``) and print a status line
    until ``stop``; returns False when a fleet or the worker failed."""
    from ldpstream.agents.app import make_store
    from ldpstream.producers.fleet import run_fleet

    colls = list(config.collections.values())
    store = make_store(redis_url)
    fleets: dict[str, asyncio.Task] = {}
    if not args.no_fleet:
        for coll in colls:
            fleets[coll.id] = asyncio.create_task(run_fleet(
                bootstrap, coll, data=data[coll.id], rate=float(args.rate),
                devices=int(args.devices), stop=stop, config_timeout_s=60.0,
                verify_key=verify_key), name=f"fleet-{coll.id}")
    ok = True
    tty = sys.stdout.isatty()
    t_start = time.monotonic()
    seen: dict[str, deque[tuple[float, int]]] = {}  # (time, n) of the last RATE_SPAN_S
    next_plain = 0.0
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
            if args.duration is not None and time.monotonic() - t_start >= float(args.duration):
                stop.set()
            if not worker.alive():
                print(f"\nldpstream up: the worker exited with code {worker.proc.returncode}:\n"
                      f"{worker.tail()}", file=sys.stderr)
                ok = False
                stop.set()
                break
            failed = [(cid, t) for cid, t in fleets.items() if t.done() and t.exception()]
            if failed:
                for cid, t in failed:
                    print(f"\nldpstream up: the fleet of collection {cid!r} failed: "
                          f"{t.exception().__class__.__name__}: {t.exception()}", file=sys.stderr)
                    del fleets[cid]
                ok = False
                stop.set()
                break
            parts = []
            now = time.monotonic()
            for coll in colls:
                try:
                    n = int(await store.n(coll.id, coll.partitions))
                except Exception:  # noqa: BLE001 - Redis not answering right now
                    parts.append(f"{coll.id}: n = ?")
                    continue
                rate = _rate(seen.setdefault(coll.id, deque()), now, n)
                parts.append(f"{coll.id}: {rate:8,.0f} reports/s   n = {n:>10}")
            KAFKA_NOISE.quiet = False  # running: a lost broker is news
            refreshed = await _last_refresh(store, colls[0])
            line = "   ".join(parts) + f"   last refresh {_fmt_age(refreshed)}"
            if tty:
                print("\r" + line + "   ", end="", flush=True)
            elif now >= next_plain:
                print(line, flush=True)
                next_plain = now + 5.0
    finally:
        stop.set()
        KAFKA_NOISE.quiet = True
        if tty:
            print()
        for cid, task in fleets.items():
            try:
                stats = await asyncio.wait_for(task, 30)
                print(f"fleet {cid}: sent {stats.sent_reports:,} reports in "
                      f"{stats.sent_messages:,} messages ({stats.source})", flush=True)
            except Exception as exc:  # noqa: BLE001
                ok = False
                print(f"fleet {cid}: failed ({exc.__class__.__name__}: {exc})", file=sys.stderr)
        await store.close()
    return ok


async def _warn_stale_offsets(config: Any, redis_url: str) -> None:
    """A fresh in-memory broker starts its logs at offset 0: offsets an external Redis kept from
    an earlier broker would make the worker skip the new reports below them."""
    from ldpstream.agents.app import make_store

    store = make_store(redis_url)
    try:
        for cid, coll in config.collections.items():
            offsets = await store.offsets(cid, coll.partitions)
            if offsets:
                print(f"warning: REDIS_URL holds Kafka offsets of collection {cid!r} from an earlier "
                      f"broker {offsets}; with the new embedded broker, reports below them would be "
                      f"skipped. Use a fresh Redis, or delete that collection's keys "
                      f"(redis-cli --scan --pattern 'ldp:{{{cid}[#|}}]*' | xargs redis-cli del; "
                      f"POST /collections/{cid}/reset keeps the offsets on purpose).",
                      file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001 - the worker reports Redis problems itself
        log.debug("offset check skipped: %s", exc)
    finally:
        await store.close()


def _start_mqtt(env: dict[str, str], key: Any) -> Any:
    """``up --mqtt``: an embedded Mosquitto and ``ldpstream mqtt-bridge`` (ldpstream/dev/mqtt_stack.py);
    the fleet's password is kept in the state directory, so printed device commands keep working
    across restarts."""
    from ldpstream.cli import CliError
    from ldpstream.dev.mqtt_stack import MqttStack
    from ldpstream.errors import ServiceError
    from ldpstream.producers.signing import ENV_PUBLIC_KEY

    stack = MqttStack(dict(env, **{ENV_PUBLIC_KEY: key.verify_key.to_text()}),
                      password=_kept_secret("mqtt-devices.password"))
    try:
        return stack.start()
    except ServiceError as exc:
        raise CliError(str(exc)) from None


def _start_obs(web_port: int) -> Any:
    """``up --obs``: Alertmanager and Prometheus scraping the worker, with the project's rules
    (ldpstream/dev/observability.py)."""
    from ldpstream.cli import CliError
    from ldpstream.dev.observability import ObsStack
    from ldpstream.errors import ServiceError

    try:
        return ObsStack([f"127.0.0.1:{web_port}"]).start()
    except ServiceError as exc:
        raise CliError(str(exc)) from None


def _kept_secret(name: str) -> str:
    """A random secret created once in the state directory (0600) and read back afterwards."""
    import secrets

    from ldpstream.endpoint import state_dir

    path = state_dir() / name
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        value = secrets.token_urlsafe(12)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(value + "\n")
        return value


def _device_commands(mqtt: Any, coll: Any, data: str | None, key: Any) -> str:
    """The C, TypeScript and Python commands that report one record of ``coll`` (a row of the
    fleet's data) through ``mqtt`` (ldpstream/dev/device_commands.py)."""
    import numpy as np

    from ldpstream.dev.device_commands import DeviceCommands
    from ldpstream.endpoint import state_dir
    from ldpstream.producers.fleet import make_source

    dom = coll.domain
    source, _ = make_source(data, dom, seed=0)
    row = source(1, np.random.default_rng(0))[0]
    record = {a: dom.labels[j][int(row[j])] for j, a in enumerate(dom.attrs)} if dom.labels \
        else {a: str(int(row[j])) for j, a in enumerate(dom.attrs)}
    url = mqtt.mosquitto.url.replace("://", f"://{mqtt.fleet}@", 1)
    return DeviceCommands(url, mqtt.device.password, mqtt.fleet, coll.id,
                          key.verify_key.to_text(), record, state_dir() / "devices").lines()


def _dev_identity() -> tuple[Any, tuple[Path, Path]]:
    """The signing key of ``up`` without ``LDP_CONFIG_SIGNING_KEY(_FILE)``: created once in the
    state directory (:func:`~ldpstream.endpoint.state_dir`), reused by every later ``up``, so a
    device that pinned its public key keeps accepting the states (docs/devices.md, "The dev
    identity"). Returns the key and (private, public) paths."""
    from ldpstream.cli import CliError
    from ldpstream.endpoint import state_dir
    from ldpstream.producers.signing import SigningKey, keygen

    try:
        priv, pub = keygen(state_dir(), if_missing=True)
        return SigningKey.from_text(priv.read_text().strip()), (priv, pub)
    except (OSError, ValueError) as exc:
        raise CliError(f"the dev signing key in {state_dir()}: {exc} (set LDP_STATE_DIR to a "
                       f"writable directory)") from None


def _identity_lines(key: Any, identity: tuple[Path, Path] | None) -> str:
    """What a device operator pins: the public key, and where the key pair is kept."""
    where = (f"kept in {identity[0].parent} ({identity[1].name}; LDP_STATE_DIR moves it)"
             if identity else "from LDP_CONFIG_SIGNING_KEY(_FILE)")
    return (f"signing: devices pin the public key {key.verify_key.to_text()}\n"
            f"         fingerprint {key.verify_key.fingerprint}, {where}")


def main(args: Any) -> int:
    from ldpstream.cli import CliError
    from ldpstream.config import load_config
    from ldpstream.dev.broker import EmbeddedBroker
    from ldpstream.dev.redis import EmbeddedRedis
    from ldpstream.endpoint import clear_up, record_up, require_free_port
    from ldpstream.errors import ServiceError
    from ldpstream.kafka_admin import create_ldp_topics
    from ldpstream.privacy import epsilon_fields
    from ldpstream.producers.fleet import check_source, default_data
    from ldpstream.producers.signing import ENV_SIGNING_KEY, ENV_SIGNING_KEY_FILE, load_signing_key

    logging.basicConfig(level=os.environ.get("LDP_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").addFilter(KAFKA_NOISE)
    config = load_config(args.config)  # ConfigError is a CliError: one line, exit 2
    if args.duration is not None and args.duration <= 0:
        raise CliError(f"--duration: must be > 0 seconds (got {args.duration})")
    if args.rate < 0:
        raise CliError(f"--rate: must be >= 0 (got {args.rate})")
    if args.devices < 1:
        raise CliError(f"--devices: must be >= 1 (got {args.devices})")
    data = {}
    if not args.no_fleet:  # the fleets' data is checked before anything starts
        for coll in config.collections.values():
            data[coll.id] = args.data or default_data(coll)
            check_source("--data", data[coll.id], coll)
    web_bind = os.environ.get("LDP_WEB_BIND", DEFAULT_BIND)
    web_port = int(args.web_port)
    require_free_port(web_bind, web_port, "up")
    bootstrap = config.kafka_bootstrap
    redis_url = config.redis_url
    broker = redis = worker = mqtt = obs = None
    ok = True
    try:
        try:
            if not bootstrap:
                broker = EmbeddedBroker()
                bootstrap = broker.start()
                print(f"embedded Kafka broker (Tansu): {bootstrap}", flush=True)
            if not redis_url:
                redis = EmbeddedRedis()
                redis_url = redis.start()
                print(f"embedded Redis: {redis_url}", flush=True)
        except ServiceError as exc:
            raise CliError(str(exc)) from None
        if broker is not None and redis is None:
            asyncio.run(_warn_stale_offsets(config, redis_url))
        asyncio.run(create_ldp_topics(bootstrap, config.collections.values()))
        try:
            key = load_signing_key()
        except ValueError as exc:
            raise CliError(str(exc)) from None
        env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=bootstrap, REDIS_URL=redis_url)
        identity = None
        if key is None:  # the dev identity: one key pair kept in the state directory
            key, identity = _dev_identity()
            env[ENV_SIGNING_KEY_FILE] = str(identity[0])
            env.pop(ENV_SIGNING_KEY, None)
        env["LDP_WEB_BIND"] = web_bind
        if broker is not None:
            # this process's fleets: Tansu refuses an idempotent producer (docs/pipeline.md
            # "Failover"), so none is asked for
            # and the children's (worker, bridge): no refused InitProducerId, no failover warning
            os.environ.setdefault(ENV_KAFKA_IDEMPOTENCE, "off")
            env.setdefault(ENV_KAFKA_IDEMPOTENCE, os.environ[ENV_KAFKA_IDEMPOTENCE])
            env.setdefault("LDP_SESSION_TIMEOUT_S", str(EMBEDDED_SESSION_TIMEOUT_S))
        if args.obs:  # Prometheus + Alertmanager first: the worker's page asks Prometheus
            obs = _start_obs(web_port)
            env[ENV_PROMETHEUS_URL] = obs.prometheus.url
        worker = WorkerChild(args.config, web_port, env)
        host = "127.0.0.1" if env["LDP_WEB_BIND"] in ("0.0.0.0", "127.0.0.1") else env["LDP_WEB_BIND"]
        cids = list(config.collections)
        print(f"worker: pid {worker.proc.pid}, log {worker.log_path}", flush=True)
        record_up(f"http://{host}:{web_port}")  # `ldpstream estimates` follows this port
        print(f"page:    http://{host}:{web_port}/   (live estimates, drift and ε in a browser)",
              flush=True)
        print(f"API:     http://{host}:{web_port}/collections   "
              f"http://{host}:{web_port}/estimates/{cids[0]}", flush=True)
        print(f"metrics: http://{host}:{web_port}/metrics   health: http://{host}:{web_port}/healthz",
              flush=True)
        print(_identity_lines(key, identity), flush=True)
        if obs is not None:
            print(f"alerts:  Prometheus {obs.prometheus.url}/alerts   Alertmanager "
                  f"{obs.alertmanager.url}   (rules: dashboards/prometheus/rules; firing ones on "
                  f"the page)", flush=True)
        if args.mqtt:  # Mosquitto + bridge, for devices that speak MQTT (docs/devices.md)
            mqtt = _start_mqtt(env, key)
            if obs is not None and obs.prometheus is not None and mqtt.bridge is not None:
                # the bridge's refusal and backlog metrics (MqttBrokerRefusals) are scraped too
                obs.prometheus.set_bridges([mqtt.bridge.url.split("//", 1)[1]])
            print(mqtt.how_to_connect(cids[0]), flush=True)
            first = config.collections[cids[0]]
            print(_device_commands(mqtt, first, data.get(first.id) or args.data
                                   or default_data(first), key), flush=True)
        for coll in config.collections.values():
            note = epsilon_fields(coll, coll.mechanism())["privacy_note"]
            if note:
                print(f"{coll.id}: {note}", flush=True)
        print("Ctrl-C stops everything." + ("" if args.duration is None else
                                             f" (stopping by itself after {args.duration:g}s)"),
              flush=True)

        async def runner() -> bool:
            stop = asyncio.Event()
            # SIGHUP (terminal closed) stops everything too, instead of orphaning the children
            termination.on_loop(stop.set, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
            return await _run(args, config, bootstrap, redis_url, worker, stop, data,
                              key.verify_key)

        ok = asyncio.run(runner())
        print("stopping: worker ...", flush=True)
    finally:
        # ignore further Ctrl-C while shutting down, so the children are always reaped
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGHUP)}
        try:
            clear_up()
            if mqtt is not None:
                mqtt.stop()
            code = worker.stop() if worker is not None else None
            if obs is not None:
                obs.stop()
            if code not in (None, 0):
                print(f"worker exited with code {code}", file=sys.stderr)
            if broker is not None:
                broker.stop()
            if redis is not None:
                redis.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    print("stopped." if ok else "stopped after a failure (see above).", flush=True)
    return 0 if ok else 1
