"""The faust worker (``ldpstream worker``): ingest, refresh timers, HTTP views, metrics.

:func:`create_app` builds the faust :class:`faust.App` and its :class:`~.context.Context`. Faust
runs the worker lifecycle, the web server (agents/serve/web.py) and the refresh timers
(agents/refresh/refresher.py); reports are consumed by :class:`~.ingest.IngestService`, an aiokafka consumer
owned by a mode service that the app starts and stops with itself (agents/ingest/service.py explains why
not a faust agent: exactly-once needs our own offsets in Redis to drive the consumer position).
:func:`build_ingest` wires the ingest service's parts (docs/pipeline.md "The worker's parts").

Environment: ``KAFKA_BOOTSTRAP_SERVERS``, ``REDIS_URL`` (required; ``redis+cluster://h:p,h:p`` or
``REDIS_CLUSTER_NODES=h:p,h:p`` for a Redis Cluster), ``LDP_SESSION_TIMEOUT_S``
(consumer group session timeout; a few seconds for the embedded Tansu broker, which answers a
group join after half of it: needed on Tansu, not on Apache Kafka, whose brokers refuse a session
below ``group.min.session.timeout.ms``, 6 s by default), ``LDP_WEB_BIND`` (default 127.0.0.1), ``LDP_APP_ID``,
``LDP_LOG_LEVEL`` (default WARN).
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import threading
from typing import Any

from ldpstream import termination
from ldpstream.agents import heap
from ldpstream.agents.context import Context
from ldpstream.agents.control.controller import Controller
from ldpstream.agents.control.controller import install as controller_timers
from ldpstream.agents.ingest import faults
from ldpstream.agents.ingest.acks import AckReconciler
from ldpstream.agents.ingest.applier import Applier
from ldpstream.agents.ingest.breaker import Breaker
from ldpstream.agents.ingest.budget import DAILY_BUDGET
from ldpstream.agents.ingest.clients import Clients, RedisGate
from ldpstream.agents.ingest.dedupe_gate import DedupeGate
from ldpstream.agents.ingest.dlq_writer import DlqWriter
from ldpstream.agents.ingest.identity_gate import IdentityGate
from ldpstream.agents.ingest.intake import Intake
from ldpstream.agents.ingest.log_check import LogCheck
from ldpstream.agents.ingest.memo_gate import MemoGate
from ldpstream.agents.ingest.partition import Partitions
from ldpstream.agents.ingest.quota_gate import DEVICE_QUOTA, QuotaGate
from ldpstream.agents.ingest.rebalance import Rebalancer, Seeker
from ldpstream.agents.ingest.service import POLL_MAX_RECORDS, IngestService
from ldpstream.agents.ingest.stats import IngestStats
from ldpstream.agents.refresh.refresher import Refresher
from ldpstream.agents.refresh.refresher import install as refresh_timers
from ldpstream.agents.serve import ui, web
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.worker import Worker
from ldpstream.config import AppConfig, ConfigError
from ldpstream.credentials.device_keys import load_fleet_secrets
from ldpstream.names import ACK_CHECK_S, DEFAULT_BIND, DEFAULT_WEB_PORT, ENV_KAFKA_BOOTSTRAP
from ldpstream.producers import bounded_fetch
from ldpstream.producers.kafka_security import KafkaSecurityError, kafka_security
from ldpstream.producers.signing import ENV_PUBLIC_KEY, ENV_SIGNING_KEY, load_signing_key

log = logging.getLogger(__name__)

DEFAULT_SESSION_TIMEOUT_S = 30.0


def max_decompressed_bytes(max_message_bytes: int) -> int:
    """Bound on the decompressed size of one fetched record batch: 16 messages of the largest
    accepted size (at least 16 MiB). A batch inflating beyond it goes to ``ldp.dlq``."""
    return max(16 * 1_048_576, 16 * int(max_message_bytes))


#: a stop signal ends the worker within this many seconds, even when the broker is gone
STOP_GRACE_S = 10.0


def _broker_urls(bootstrap: str) -> list[str]:
    out = []
    for part in bootstrap.split(","):
        part = part.strip()
        if part:
            out.append(part if "://" in part else f"kafka://{part}")
    return out


def make_store(redis_url: str) -> CountStore:
    """A :class:`~.store.CountStore` on the ``redis.asyncio`` client of ``redis_url``: one server,
    or a Redis Cluster for ``redis+cluster://host:port,...`` (ldpstream/redis_client.py), with short
    socket timeouts (a dead Redis must surface as an error the ingest service retries, not as a
    hang)."""
    from ldpstream.redis_client import connect

    return CountStore(connect(redis_url))


def build_ingest(ctx: Context, *, group_id: str, session_timeout_ms: int
                 ) -> tuple[IngestService, AckReconciler | None]:
    """The ingest service and its parts, each with one job (docs/pipeline.md "The worker's
    parts"), wired here and nowhere else; with fleet secrets, the reconciler of acknowledged
    and taken reports too (agents/ingest/acks.py)."""
    collections = dict(ctx.config.collections)
    cid_of = {c.topic: cid for cid, c in collections.items()}
    clients = Clients()
    partitions = Partitions()
    stats = IngestStats()
    gate = RedisGate(clients, partitions)
    quota = QuotaGate(collections, gate, ctx.store, (DEVICE_QUOTA, DAILY_BUDGET))
    fleets = load_fleet_secrets()
    acks = None if fleets is None else AckReconciler(ctx.store, ctx.kafka_bootstrap,
                                                     ctx.kafka_security.client_kwargs())
    identity = IdentityGate(fleets, acks)
    memo = MemoGate(collections, gate, ctx.store, identity.fleets)
    intake = Intake(collections, ctx.collections, partitions, quota,
                    DedupeGate(gate, ctx.store, acks),
                    stats, ctx.config.ingest.max_message_bytes, memo, identity)
    take = faults.injected(intake.take)  # tests only: a fault object around the intake
    seeker = Seeker(clients, partitions)
    applier = Applier(collections, clients, gate, partitions, ctx.store, quota,
                      DlqWriter(clients), seeker, stats)
    applier.settle = intake.settle
    memo.flush = applier.flush
    max_records = POLL_MAX_RECORDS
    breaker = Breaker(gate, partitions, ctx.store, stats, intake.load, take, applier.flush,
                      max_records)
    log_check = LogCheck(clients, gate, partitions, ctx.store, ctx.kafka_bootstrap,
                         ctx.kafka_security.client_kwargs())
    rebalancer = Rebalancer(cid_of, clients, gate, partitions, log_check, breaker,
                            applier.applying)
    service = IngestService(
        collections=collections, states=ctx.collections, options=ctx.config.ingest,
        clients=clients, gate=gate, partitions=partitions, load=intake.load, take=take,
        breaker=breaker, applier=applier, rebalancer=rebalancer, log_check=log_check,
        stats=stats, bootstrap=ctx.kafka_bootstrap, kafka_security=ctx.kafka_security,
        signing_key=ctx.signing_key, group_id=group_id, session_timeout_ms=session_timeout_ms,
        max_records=max_records)
    return service, acks


def create_app(config: AppConfig, kafka_bootstrap: str, redis_url: str,
               web_port: int = DEFAULT_WEB_PORT, *,
               web_bind: str | None = None, session_timeout_s: float | None = None,
               app_id: str | None = None, install_web: bool = True,
               install_refresh: bool = True, ingest: bool = True) -> tuple[Any, Context]:
    """The faust app of one worker and its context.

    The ingest service joins the consumer group ``<app_id>-ingest`` with ``session_timeout_s``;
    faust's own consumer (and group) is not started.
    """
    import faust

    from ldpstream.agents.serve import http_guard

    app_id = app_id or os.environ.get("LDP_APP_ID", "ldpstream")
    if session_timeout_s is None:
        session_timeout_s = float(os.environ.get("LDP_SESSION_TIMEOUT_S", DEFAULT_SESSION_TIMEOUT_S))
    web_bind = web_bind or os.environ.get("LDP_WEB_BIND", DEFAULT_BIND)
    datadir = tempfile.mkdtemp(prefix="ldpstream-faust-")
    try:
        security = kafka_security()
    except KafkaSecurityError as exc:
        raise ConfigError(str(exc)) from None
    extra: dict[str, Any] = {}
    if security.protocol != "PLAINTEXT":
        extra["broker_credentials"] = security.faust_credentials()
    if web_bind in ("127.0.0.1", "localhost"):
        extra["web_host"] = "127.0.0.1"
    app = faust.App(
        app_id, broker=_broker_urls(kafka_bootstrap), store="memory://",
        value_serializer="raw", key_serializer="raw", web_enabled=True, web_port=int(web_port),
        web_bind=web_bind, web=http_guard.DRIVER_URL,
        web_application_options={"client_max_size": http_guard.MAX_BODY_BYTES}, **extra,
        broker_session_timeout=float(session_timeout_s),
        broker_heartbeat_interval=max(0.1, float(session_timeout_s) / 4),
        topic_partitions=1, topic_replication_factor=1, datadir=datadir,
        producer_max_request_size=4 * 1024 * 1024)
    # faust's own Kafka consumer (its consumer group, leader topic, table manager) serves nothing
    # here: reports are consumed by the ingest service's consumer. Left on, it made the worker's
    # liveness hang on faust's group: faust crashes the whole app (HTTP API included) when its
    # rebalance callbacks or commits fail, as they may while a dead broker's partitions and
    # group coordinator move (docs/pipeline.md "Failover")
    app.boot_strategy = app.BootStrategy(app, enable_kafka_consumer=False)
    bounded_fetch.install(max_decompressed_bytes(config.ingest.max_message_bytes))
    try:
        key = load_signing_key()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    ctx = Context(config=config, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap,
                  store=make_store(redis_url), kafka_security=security, datadir=datadir,
                  ephemeral_key=key is None)
    if key is not None:
        ctx.signing_key = key
    else:
        log.warning("no %s configured: signing ldp.config with an ephemeral key; devices must "
                    "pin %s=%s", ENV_SIGNING_KEY, ENV_PUBLIC_KEY,
                    ctx.signing_key.verify_key.to_text())
    service = acks = None
    if ingest:
        service, acks = build_ingest(ctx, group_id=f"{app_id}-ingest",
                                     session_timeout_ms=int(float(session_timeout_s) * 1000))
        app.add_dependency(service)
        if acks is not None:
            reconciler = acks

            async def reconcile() -> None:
                await reconciler.tick()
            app.timer(ACK_CHECK_S, name="ldp-acks")(reconcile)
    controller = Controller(ctx, service.publish_config if service is not None else None)
    if service is not None:
        service.follow_all = controller.follow_all
    worker = Worker(ctx=ctx, ingest=service, refresher=Refresher(ctx), controller=controller,
                    acks=acks)
    if install_refresh:
        refresh_timers(app, worker.refresher)
        controller_timers(app, worker.controller)
    crash = faults.crash_timer()  # tests only: a timer that crashes the app
    if crash is not None:
        app.timer(crash[0], name="ldp-fault-crash")(crash[1])
    if install_web:
        web.install(app, worker)
        ui.install(app, worker)  # the live page (GET /, /ui/...): it reads the views' API
    return app, ctx


def _listening(bind: str, port: int) -> str:
    """Where the HTTP API listens, said truly (all interfaces is not loopback)."""
    if bind in ("0.0.0.0", "::", ""):
        return f"all interfaces, port {port} (http://127.0.0.1:{port}/ from this machine)"
    host = f"[{bind}]" if ":" in bind else bind
    return f"http://{host}:{port}/"


def _cleanup(ctx: Context) -> None:
    datadir = ctx.datadir
    if datadir:
        shutil.rmtree(datadir, ignore_errors=True)


def _exit_after(grace_s: float, after: str = "the stop signal") -> None:
    """Arm a watchdog: the process exits (status 1) ``grace_s`` from now if a graceful stop has
    not ended it by then (faust's stop waits for a broker that may be gone, for a minute or
    more). Exiting early loses nothing counted: a batch's counts and its Kafka offsets are
    applied to Redis together, so what was not applied is consumed again from the stored
    offsets."""
    def expire() -> None:
        print(f"ldpstream worker: not stopped {grace_s:g}s after {after} (broker or Redis "
              "unreachable?); exiting now", file=sys.stderr, flush=True)
        os._exit(1)

    timer = threading.Timer(grace_s, expire)
    timer.daemon = True
    timer.start()


def _prompt_worker_class() -> type:
    from faust.worker import Worker

    class PromptWorker(Worker):
        """A faust worker whose SIGTERM/SIGINT stop is bounded by :data:`STOP_GRACE_S`, without
        faust's terminal spinner: to spin on every log record it sets the root logger to DEBUG,
        so every debug call of aiokafka's fetcher built a record (about 4 % of the ingest
        loop's time, docs/pipeline.md "Measured")."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.spinner = None

        def _on_sigterm(self) -> None:
            _exit_after(STOP_GRACE_S)
            super()._on_sigterm()

        def _on_sigint(self) -> None:
            _exit_after(STOP_GRACE_S)
            super()._on_sigint()

        def stop_on_signal(self) -> None:
            """Stop as on SIGTERM (what the loop calls until faust installs its own handlers)."""
            self._on_sigterm()

        def _crash(self, reason: BaseException) -> None:
            """Any part of the app crashed (mode marks every node of the tree, this worker
            too): stop, and exit non-zero within :data:`STOP_GRACE_S` whatever the stop waits
            for, so that a supervisor restarts the worker (a crashed app stayed alive in
            ``Producer: Stopping...`` with its HTTP port closed)."""
            if not self.crashed:
                print(f"ldpstream worker: crashed ({reason!r}); stopping, exiting with status 1",
                      file=sys.stderr, flush=True)
                _exit_after(STOP_GRACE_S, "the crash")
            super()._crash(reason)

    return PromptWorker


def main(args) -> int:
    """``ldpstream worker [--config F] [--web-port P]``."""
    from ldpstream.config import load_config
    from ldpstream.errors import CliError

    config = load_config(getattr(args, "config", None))  # ConfigError is a CliError: one line
    bootstrap = config.kafka_bootstrap or os.environ.get(ENV_KAFKA_BOOTSTRAP)
    redis_url = config.redis_url  # REDIS_URL or REDIS_CLUSTER_NODES, resolved by load_config
    if not bootstrap:
        raise CliError("KAFKA_BOOTSTRAP_SERVERS is not set (`ldpstream up` starts an embedded "
                       "broker, Redis and a worker)")
    if not redis_url:
        raise CliError("REDIS_URL (or REDIS_CLUSTER_NODES) is not set (`ldpstream up` starts an "
                       "embedded Redis)")
    from ldpstream.endpoint import require_free_port
    from ldpstream.redis_client import display_url

    require_free_port(os.environ.get("LDP_WEB_BIND", DEFAULT_BIND), int(args.web_port),
                      "worker")
    _PromptWorker = _prompt_worker_class()
    app, ctx = create_app(config, bootstrap, redis_url, int(getattr(args, "web_port", DEFAULT_WEB_PORT)))
    loglevel = os.environ.get("LDP_LOG_LEVEL", "WARN").upper()
    if loglevel == "WARNING":
        loglevel = "WARN"
    pub = ctx.signing_key.verify_key.to_text()
    print(f"ldpstream worker: ldp.config signed by key {ctx.signing_key.verify_key.key_id} "
          + (f"(ephemeral: set {ENV_SIGNING_KEY}_FILE, see `ldpstream keygen`); devices pin "
             f"{ENV_PUBLIC_KEY}={pub}" if ctx.ephemeral_key else f"(public key {pub})"),
          file=sys.stderr, flush=True)
    print(f"ldpstream worker: broker {bootstrap} ({ctx.kafka_security.describe()}), Redis {display_url(redis_url)}, "
          f"HTTP on {_listening(app.conf.web_bind, app.conf.web_port)} "
          f"(collections: {', '.join(config.collections)})",
          file=sys.stderr, flush=True)
    worker = _PromptWorker(app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    # the loop takes the stop signals before it runs: faust installs its handlers only once the
    # worker starts, and the exception SIGTERM raises until then, inside one of the loop's tasks
    # (or in a module compiled while it starts), would be lost and the worker run on
    termination.on_loop(worker.stop_on_signal, loop=worker.loop)
    heap.pin_mmap_threshold()
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
        return code
    finally:
        _cleanup(ctx)
    return 0
