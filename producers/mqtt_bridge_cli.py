"""``ldpstream mqtt-bridge``: options and environment checked before anything starts, then the
bridge of producers/mqtt_bridge.py with its ``/healthz`` and ``/metrics`` (docs/devices.md,
"MQTT")."""
from __future__ import annotations

import asyncio
import os
import socket
import sys
from typing import Any

from ldpstream import termination
from ldpstream.endpoint import require_free_port
from ldpstream.errors import CliError
from ldpstream.http_guard import GATEWAY_ENV, ConnectionGuard, HardenedSite
from ldpstream.mqtt_client import MqttError, parse_mqtt_url
from ldpstream.names import (
    DEFAULT_BIND,
    DEFAULT_MQTT_BRIDGE_PORT,
    ENV_KAFKA_BOOTSTRAP,
    ENV_MQTT_BROKER_LOG_FILE,
    ENV_MQTT_CA,
    ENV_MQTT_CLIENT_ID,
    ENV_MQTT_SUBSCRIPTION,
    ENV_MQTT_URL,
    ENV_REQUIRE_DEVICE_AUTH,
    ENV_WEB_BIND,
    ENV_WEB_PORT,
    MQTT_SHARE_GROUP,
)
from ldpstream.producers.fleet import unless_stopped
from ldpstream.producers.mqtt_bridge import MqttBridge, load_mqtt_fleets
from ldpstream.producers.publisher import PublishError
from ldpstream.producers.signing import ENV_PUBLIC_KEY, ENV_PUBLIC_KEY_FILE, load_verify_key


def main(args: Any) -> int:
    """``ldpstream mqtt-bridge [--mqtt-url U] [--mqtt-ca F] [--fleets F] [--port P] ...``."""
    bootstrap = os.environ.get(ENV_KAFKA_BOOTSTRAP)
    if not bootstrap:
        raise CliError("KAFKA_BOOTSTRAP_SERVERS is not set")
    url = args.mqtt_url or os.environ.get(ENV_MQTT_URL)
    if not url:
        raise CliError(f"no MQTT broker: give --mqtt-url or {ENV_MQTT_URL} "
                       f"(mqtts://user:pass@host:port)")
    endpoint = parse_mqtt_url(url, "--mqtt-url" if args.mqtt_url else ENV_MQTT_URL)
    ca = args.mqtt_ca or os.environ.get(ENV_MQTT_CA) or None
    if ca is not None and not os.path.isfile(ca):
        raise CliError(f"--mqtt-ca: {ca!r} is not a file")
    fleets = load_mqtt_fleets(args.fleets)
    if load_verify_key() is None:
        raise CliError(f"no public key pinned: set {ENV_PUBLIC_KEY} or {ENV_PUBLIC_KEY_FILE} (the "
                       f"bridge relays only mechanism states signed by that key)")
    subscription = args.subscription or os.environ.get(ENV_MQTT_SUBSCRIPTION) or "shared"
    if subscription not in ("shared", "exclusive"):
        raise CliError(f"{ENV_MQTT_SUBSCRIPTION}: {subscription!r} must be shared or exclusive")
    broker_log = args.broker_log or os.environ.get(ENV_MQTT_BROKER_LOG_FILE) or None
    if broker_log is not None and not os.path.isfile(broker_log):
        source = "--broker-log" if args.broker_log else ENV_MQTT_BROKER_LOG_FILE
        raise CliError(f"{source}: {broker_log!r} is not a file (the broker's log file)")
    port = args.port or int(os.environ.get(ENV_WEB_PORT) or DEFAULT_MQTT_BRIDGE_PORT)
    bind = args.bind or os.environ.get(ENV_WEB_BIND) or DEFAULT_BIND
    if not args.retire:  # --retire serves no HTTP
        require_free_port(bind, port, "mqtt-bridge")
    client_id = (args.client_id or os.environ.get(ENV_MQTT_CLIENT_ID)
                 or f"{MQTT_SHARE_GROUP}-{socket.gethostname()}")

    async def run() -> None:
        from aiohttp import web

        stop = asyncio.Event()
        termination.on_loop(stop.set)
        bridge = MqttBridge(bootstrap, fleets, endpoint, client_id=client_id, ca=ca,
                            shared=subscription == "shared", max_body_bytes=args.max_body_bytes,
                            broker_log_file=broker_log,
                            require_device_auth=os.environ.get(ENV_REQUIRE_DEVICE_AUTH, "")
                            in ("1", "true"))
        try:  # a stop signal while connecting stops cleanly too
            started = await unless_stopped(bridge.start(), stop)
        except (ConnectionError, PublishError, MqttError) as exc:
            await bridge.stop()
            raise CliError(str(exc)) from None
        if started is None:
            await bridge.stop()
            return
        if args.retire:
            await unless_stopped(bridge.retire(), stop)
            print(f"ldpstream mqtt-bridge: {client_id!r} retired (session ended)",
                  file=sys.stderr, flush=True)
            await bridge.stop()
            return
        runner = web.AppRunner(bridge.app(), access_log=None)
        await runner.setup()
        await HardenedSite(runner, bind, port,
                           guard=ConnectionGuard.from_env(GATEWAY_ENV)).start()
        print(f"ldpstream mqtt-bridge: {endpoint} as {client_id!r}, subscribed to "
              f"{bridge.subscription}; health on http://{bind}:{port}/healthz "
              f"(fleets: {', '.join(bridge.fleets)})", file=sys.stderr, flush=True)
        await stop.wait()
        await runner.cleanup()
        await bridge.stop()

    asyncio.run(run())
    return 0
