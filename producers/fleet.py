"""``ldpstream fleet``: simulate N devices sending randomized reports at a target rate.

Vectorized: each tick of the token bucket samples all of the tick's true records at once (rows of
a CSV, by default the bundled UCI Adult encoded against the collection's domain, or a seeded
built-in generator), randomizes them with the collection's mechanism in one numpy call, assigns
them to random devices of the fleet and hands them to a :class:`~.device.Gateway`, which packs
``--batch`` reports per Kafka message. ``--drift-at T --drift-to SRC`` switches the population T
seconds after the start. The mechanism state (and its version, stamped on every report) comes
from the compacted topic ``ldp.config``; while no worker has published one yet, the fleet waits
a few seconds, then falls back to the state built from the local config.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import numpy as np

from ldpstream import termination
from ldpstream.credentials.device_keys import DeviceSigner, load_fleet_secrets
from ldpstream.estimators.mechanism import Mechanism, histogram
from ldpstream.names import ENV_DEVICE_SECRETS_FILE, ENV_KAFKA_BOOTSTRAP
from ldpstream.producers.device import ConfigWatcher, Gateway
from ldpstream.producers.generator import is_generator_spec, parse_spec
from ldpstream.producers.publisher import Publisher
from ldpstream.producers.signing import SignedState, VerifyKey, load_verify_key

log = logging.getLogger(__name__)

DEFAULT_BATCH = 500
TICK_S = 0.05

Source = Callable[[int, np.random.Generator], np.ndarray]


DEFAULT_DRIFT_TO = "generator:skewed"
#: after a stop signal, the fleet flushes for at most this long, then gives up on what is left
STOP_GRACE_S = 5.0


def default_data(collection) -> str:
    """The true records a fleet samples when none are named: the collection's schema CSV, else
    (a schema given as attribute lists) the built-in generator."""
    source = collection.schema_source
    return source[len("csv:"):] if source.startswith("csv:") else "generator"


def make_source(spec: str | None, domain, seed: int = 0) -> tuple[Source, str]:
    """A sampler of true records over ``domain``: a CSV path (``None`` = bundled Adult) or a
    generator spec (``generator[:product|skewed][,seed=..]``). Returns (sampler, description)."""
    if is_generator_spec(spec):
        # is_generator_spec is True only for a str (mypy cannot narrow through it)
        pop = parse_spec(spec, domain, default_seed=seed)  # type: ignore[arg-type]
        return pop.sample, f"generator:{pop.kind}(seed={pop.seed})"
    from ldpstream.datasets import load_csv

    ds = load_csv(spec, columns=domain.attrs, domain=domain)
    records = ds.records

    def sample(n: int, rng: np.random.Generator) -> np.ndarray:
        return records[rng.integers(0, len(records), size=n)]

    return sample, f"csv:{spec or 'adult'}({ds.n} rows)"


@dataclass
class FleetStats:
    sent_reports: int = 0
    sent_messages: int = 0
    seconds: float = 0.0
    drifted_at: float | None = None
    version: int | None = None
    source: str = ""
    counts: dict[str, np.ndarray] | None = None
    #: with ``keep_truth``: the histogram of the true records sent, over the whole domain
    truth: np.ndarray | None = None
    #: whether the publisher was idempotent (producers/publisher.py; docs/pipeline.md "Failover")
    idempotent: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.sent_reports / self.seconds if self.seconds > 0 else 0.0


def default_ceiling(collection) -> float:
    """A fleet's ε ceiling when none is given: the ε per report of the locally configured
    mechanism (computed from its channel), i.e. what the devices agreed to."""
    return float(collection.mechanism().epsilon)


async def unless_stopped(aw: Awaitable[Any], stop: asyncio.Event | None) -> Any:
    """``await aw``, or None as soon as ``stop`` is set (``aw`` is then cancelled)."""
    if stop is None:
        return await aw
    task, stopped = asyncio.ensure_future(aw), asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None
    return task.result()


async def resolve_mechanism(bootstrap: str, collection, *, timeout_s: float = 10.0,
                            watcher: ConfigWatcher | None = None,
                            verify_key: VerifyKey | None = None,
                            max_epsilon: float | None = None,
                            stop: asyncio.Event | None = None
                            ) -> tuple[Mechanism, ConfigWatcher | None]:
    """The collection's mechanism as published (signed) in ``ldp.config`` (waiting up to
    ``timeout_s``, or until ``stop`` is set), else the one built from the local config. Without a
    pinned public key (``verify_key`` or ``LDP_CONFIG_PUBLIC_KEY``) nothing published can be
    trusted: the local config is used at once."""
    verify_key = verify_key if verify_key is not None else load_verify_key()
    if watcher is None and verify_key is None:
        log.warning("no public key pinned (LDP_CONFIG_PUBLIC_KEY): ignoring ldp.config, using the "
                    "local config of %s", collection.id)
        return collection.mechanism(), None
    ceiling = default_ceiling(collection) if max_epsilon is None else max_epsilon
    try:
        if watcher is None:
            watcher = await ConfigWatcher(bootstrap, verify_key=verify_key,
                                          max_epsilon={collection.id: ceiling}
                                          ).start(timeout_s=timeout_s)
        state = await unless_stopped(watcher.wait_for(collection.id, timeout_s), stop)
    except (ConnectionError, OSError) as exc:
        log.warning("cannot read ldp.config (%s); using the local config", exc)
        state = None
    if state is not None and watcher is not None:
        return watcher.mechanisms[collection.id], watcher
    if stop is not None and stop.is_set():  # stopped while waiting: nothing will be sent
        return collection.mechanism(), watcher
    log.warning("no usable mechanism state for %s in ldp.config after %.0fs (refused: %s); "
                "using the local config", collection.id, timeout_s,
                (watcher.refusal_summary() if watcher is not None else "") or "none")
    return collection.mechanism(), watcher


async def run_fleet(bootstrap: str, collection, *, data: str | None = None, devices: int = 1000,
                    rate: float = 2000.0, batch: int = DEFAULT_BATCH, total: int | None = None,
                    duration: float | None = None, drift_at: float | None = None,
                    drift_to: str | None = None, seed: int | None = None,
                    keep_counts: bool = False, keep_truth: bool = False,
                    mechanism: Mechanism | None = None,
                    config_timeout_s: float = 10.0, publisher: Publisher | None = None,
                    verify_key: VerifyKey | None = None, max_epsilon: float | None = None,
                    stop: asyncio.Event | None = None,
                    progress: Callable[[FleetStats], None] | None = None,
                    progress_every_s: float = 2.0,
                    signer: DeviceSigner | None = None) -> FleetStats:
    """Run the simulated fleet until ``total`` reports, ``duration`` seconds or ``stop`` is set;
    every message is acknowledged before it returns. ``keep_counts`` tallies the exact count
    tensors of the reports sent (``collection.tensors()``) and ``keep_truth`` the histogram of the
    true records behind them (``stats.truth``), for tests."""
    if devices < 1:
        raise ValueError("devices must be >= 1")
    if rate < 0:
        raise ValueError("rate must be >= 0")
    ss = np.random.SeedSequence(seed)
    rng = np.random.default_rng(ss)
    source, desc = make_source(data, collection.domain, seed=int(ss.generate_state(1)[0]))
    stats = FleetStats(source=desc)
    watcher = None
    if mechanism is None:
        mechanism, watcher = await resolve_mechanism(bootstrap, collection,
                                                     timeout_s=config_timeout_s,
                                                     verify_key=verify_key, max_epsilon=max_epsilon,
                                                     stop=stop)
    mech_box = [mechanism]
    if watcher is not None:
        def on_change(cid: str, signed: SignedState) -> None:
            # the watcher verified the signature, the order and the ε ceiling
            if cid == collection.id and signed.version != mech_box[0].version:
                mech_box[0] = watcher.mechanisms[cid]
                log.info("fleet: mechanism of %s now at version %d", cid, mech_box[0].version)
        watcher.on_change = on_change
    specs = collection.tensors() if keep_counts else []
    if keep_counts:
        stats.counts = {s.key: np.zeros(s.shape, dtype=np.int64) for s in specs}
    dom = collection.domain
    if keep_truth:
        stats.truth = np.zeros(dom.shape, dtype=np.int64)
    own_publisher = publisher is None
    if publisher is None:
        publisher = await Publisher(bootstrap).start()
    stats.idempotent = publisher.idempotent
    # a device-counted (memoized) collection must see each device in one partition: its reports
    # go to device_id % partitions; others keep the producer's spread of whole messages
    gateway = Gateway(collection.id, publisher, batch=batch, topic=collection.topic,
                      by_device=mechanism.memoization() is not None, signer=signer)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    last = t0
    next_progress = t0 + progress_every_s
    tokens = 0.0
    burst = max(rate * 0.5, float(batch))
    chunk_fast = max(batch, min(50 * batch, 100_000))
    try:
        while not stop.is_set():
            now = loop.time()
            elapsed = now - t0
            if duration is not None and elapsed >= duration:
                break
            remaining = None if total is None else total - stats.sent_reports
            if remaining is not None and remaining <= 0:
                break
            if drift_at is not None and stats.drifted_at is None and elapsed >= drift_at:
                source, desc = make_source(drift_to or DEFAULT_DRIFT_TO, collection.domain,
                                           seed=int(ss.generate_state(2)[1]))
                stats.drifted_at = elapsed
                stats.source += f" -> {desc} at {elapsed:.1f}s"
                log.info("fleet: population drifted to %s", desc)
            if rate > 0:
                tokens = min(tokens + rate * (now - last), burst)
                last = now
                n = int(tokens)
                if n < 1:
                    await asyncio.sleep(max(TICK_S, (1.0 - tokens) / rate))
                    continue
            else:
                n = chunk_fast
            if remaining is not None:
                n = min(n, remaining)
            records = source(n, rng)
            mech = mech_box[0]
            reports = mech.randomize(records, rng)
            ids = rng.integers(0, devices, size=n, dtype=np.uint64)
            await gateway.add(reports, mech.version, ids)
            stats.version = mech.version
            if stats.counts is not None:  # keep_counts
                for key, delta in mech.count(reports, specs).items():
                    stats.counts[key] += delta
            if stats.truth is not None:  # keep_truth
                stats.truth += histogram(records, dom.axes(dom.attrs), stats.truth.shape)
            stats.sent_reports += n
            if rate > 0:
                tokens -= n
                await asyncio.sleep(TICK_S)
            else:
                await asyncio.sleep(0)
            if progress is not None and loop.time() >= next_progress:
                stats.sent_messages = gateway.sent_messages
                stats.seconds = loop.time() - t0
                progress(stats)
                next_progress += progress_every_s
        await gateway.flush()
    finally:
        stats.sent_messages = gateway.sent_messages
        stats.seconds = loop.time() - t0
        if own_publisher:
            await publisher.stop()
        if watcher is not None:
            await watcher.stop()
    return stats


def check_source(option: str, spec: str, collection) -> None:
    """A one-line :class:`CliError` naming ``option`` unless ``spec`` can feed ``collection``."""
    from ldpstream.cli import CliError

    try:
        make_source(spec, collection.domain, seed=0)
    except Exception as exc:  # DatasetError, GeneratorSpecError
        raise CliError(f"{option}: {exc} (collection {collection.id!r})") from None


def stop_on_signals(stop: asyncio.Event, task: "asyncio.Task[Any]",
                    grace_s: float = STOP_GRACE_S) -> None:
    """SIGINT/SIGTERM set ``stop`` (the fleet flushes and returns); if ``task`` is still running
    ``grace_s`` later (a broker that no longer acknowledges), or on a second signal, it is
    cancelled."""
    loop = asyncio.get_running_loop()

    def cancel() -> None:  # repeated: a cancelled flush must not hang in its own cleanup
        if not task.done():
            task.cancel()
            loop.call_later(1.0, cancel)

    def on_signal() -> None:
        if stop.is_set():
            cancel()
            return
        stop.set()
        loop.call_later(grace_s, cancel)

    termination.on_loop(on_signal)


def _print_progress(stats: FleetStats) -> None:
    print(f"fleet: {stats.sent_reports:,} reports in {stats.sent_messages:,} messages, "
          f"{stats.rate:,.0f}/s, version {stats.version}", file=sys.stderr, flush=True)


def main(args) -> int:
    from ldpstream.cli import CliError
    from ldpstream.config import load_config

    logging.basicConfig(level=os.environ.get("LDP_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(args.config)  # ConfigError is a CliError: one line, exit 2
    if args.collection is None:
        collection = next(iter(config.collections.values()))
    elif args.collection in config.collections:
        collection = config.collections[args.collection]
    else:
        raise CliError(f"--collection: unknown collection {args.collection!r}; configured: "
                       f"{', '.join(config.collections)}")
    bootstrap = config.kafka_bootstrap or os.environ.get(ENV_KAFKA_BOOTSTRAP)
    if not bootstrap:
        raise CliError("KAFKA_BOOTSTRAP_SERVERS is not set (or run `ldpstream up` for the embedded "
                       "stack with a fleet)")
    if args.devices < 1:
        raise CliError(f"--devices: must be >= 1 (got {args.devices})")
    if args.max_epsilon is not None and not args.max_epsilon > 0:
        raise CliError(f"--max-epsilon: must be > 0 (got {args.max_epsilon})")
    if args.rate < 0:
        raise CliError(f"--rate: must be >= 0 (got {args.rate})")
    batch = args.batch if args.batch is not None else DEFAULT_BATCH
    if batch < 1:
        raise CliError(f"--batch: must be >= 1 (got {batch})")
    if args.total is not None and args.total < 1:
        raise CliError(f"--total: must be >= 1 (got {args.total})")
    if args.drift_to is not None and args.drift_at is None:
        raise CliError("--drift-to needs --drift-at SECONDS")
    data = args.data or default_data(collection)
    signer = None
    if args.device_fleet is not None:  # a trusted aggregator: each device's batch signed
        fleets = load_fleet_secrets()
        if fleets is None:
            raise CliError(f"--device-fleet: set {ENV_DEVICE_SECRETS_FILE} (the fleets' secrets)")
        signer = DeviceSigner(fleets, args.device_fleet)
    check_source("--data", data, collection)
    if args.drift_at is not None:  # the drift target matters only when a drift is asked for
        check_source("--drift-to", args.drift_to or DEFAULT_DRIFT_TO, collection)
    quiet = bool(getattr(args, "quiet", False))

    async def run() -> FleetStats:
        stop = asyncio.Event()
        task = asyncio.current_task()
        assert task is not None
        stop_on_signals(stop, task)
        return await run_fleet(bootstrap, collection, data=data, devices=args.devices,
                               rate=args.rate, batch=batch, total=args.total,
                               drift_at=args.drift_at, drift_to=args.drift_to, seed=args.seed,
                               max_epsilon=args.max_epsilon, signer=signer,
                               stop=stop, progress=None if quiet else _print_progress)

    t = time.monotonic()
    try:
        stats = asyncio.run(run())
    except asyncio.CancelledError:
        print(f"fleet: stopped without flushing (no acknowledgement within {STOP_GRACE_S:g}s "
              "of the stop signal; is the broker reachable?)", file=sys.stderr)
        return 1
    if not quiet:
        print(f"fleet: done, {stats.sent_reports:,} reports in {stats.sent_messages:,} messages to "
              f"{collection.topic} in {time.monotonic() - t:.1f}s ({stats.rate:,.0f}/s); source "
              f"{stats.source}", file=sys.stderr)
    return 0
