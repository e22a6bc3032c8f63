"""The one place for ldpstream's names and defaults: Kafka topics, environment variables, default
ports and intervals (docs/pipeline.md, "What runs"; docs/configuration.md). Redis keys have their own
single module, agents/store/keys.py. Every other module imports these; none repeats a literal."""
from __future__ import annotations

__all__ = [
    "REPORTS_TOPIC_PREFIX", "DLQ_TOPIC", "CONFIG_TOPIC", "SERVICE_TOPICS", "COMPACTED_TOPICS",
    "reports_topic", "ENV_API_TOKEN", "ENV_KAFKA_BOOTSTRAP", "ENV_REDIS_URL", "ENV_CONFIG",
    "ENV_WEB_PORT", "ENV_API_URL", "ENV_KAFKA_IDEMPOTENCE",
    "DEFAULT_WEB_PORT", "DEFAULT_BIND", "DEFAULT_GATEWAY_PORT", "DEFAULT_PARTITIONS",
    "DEFAULT_ESTIMATORS", "DEFAULT_REFRESH_INTERVAL_S",
    "DEFAULT_CONTROLLER_INTERVAL_S", "DEFAULT_BUCKET_S", "DEFAULT_WINDOWS",
    "DEFAULT_DRIFT_ALPHA", "DEFAULT_QUOTA_WINDOW_S", "DEFAULT_BATCH_REPORTS",
    "DEFAULT_BATCH_SECONDS", "MAX_MESSAGE_BYTES", "DEFAULT_DEVICE_STATE_MAX", "BUDGET_FIELD",
    "FLEET_DEVICES", "ENV_STATE_DIR", "ENV_MQTT_PASSWORD", "ENV_PROMETHEUS_URL",
    "DEFAULT_DEVICE_RETENTION_S",
]

# --- Kafka topics (docs/pipeline.md, "What runs") ---------------------------------------------------

#: a collection's reports: ``ldp.reports.<collection id>``, ``partitions`` partitions
REPORTS_TOPIC_PREFIX = "ldp.reports."
#: malformed or refused records, each with a reason (docs/security.md, "The dead-letter topic is at-least-once")
DLQ_TOPIC = "ldp.dlq"
#: signed mechanism states, compacted, keyed by collection id (docs/security.md)
CONFIG_TOPIC = "ldp.config"
#: what the gateways and MQTT bridges acknowledged, per instance, fleet and collection
#: (cumulative, compacted; docs/security.md "Acknowledged equals counted")
ACKS_TOPIC = "ldp.acks"
#: the topics besides the collections' own, with their partition counts
SERVICE_TOPICS: dict[str, int] = {DLQ_TOPIC: 1, CONFIG_TOPIC: 1, ACKS_TOPIC: 1}
#: topics created with ``cleanup.policy=compact``
COMPACTED_TOPICS = frozenset({CONFIG_TOPIC, ACKS_TOPIC})


#: the field of a signed ``ldp.config`` state carrying the collection's ``max_epsilon_per_day``,
#: which the device SDK's ledger enforces (docs/privacy-over-time.md)
BUDGET_FIELD = "max_epsilon_per_day"


def reports_topic(collection_id: str) -> str:
    """The Kafka topic of a collection's reports."""
    return REPORTS_TOPIC_PREFIX + collection_id


# --- environment (docs/configuration.md) ------------------------------------------

ENV_API_TOKEN = "LDP_API_TOKEN"
ENV_KAFKA_BOOTSTRAP = "KAFKA_BOOTSTRAP_SERVERS"
ENV_REDIS_URL = "REDIS_URL"
ENV_CONFIG = "LDP_CONFIG"
ENV_WEB_PORT = "LDP_WEB_PORT"
ENV_API_URL = "LDP_API_URL"
#: the device publisher's idempotent producer: ``auto`` (default), ``on``, ``off``
#: (producers/publisher.py; docs/pipeline.md "Failover")
ENV_KAFKA_IDEMPOTENCE = "LDP_KAFKA_IDEMPOTENCE"

# --- ports -----------------------------------------------------------------------------------------

#: the worker's HTTP API and /metrics
DEFAULT_WEB_PORT = 6066
#: HTTP servers (worker API, gateway) listen on loopback unless told otherwise (LDP_WEB_BIND,
#: ``--bind``; compose sets 0.0.0.0)
DEFAULT_BIND = "127.0.0.1"
#: the HTTP report gateway (``ldpstream gateway``)
DEFAULT_GATEWAY_PORT = 8080
#: simulated devices per collection (``ldpstream up``, ``ldpstream fleet``, compose's fleet): the
#: demo is memoized, so its estimates count devices (docs/privacy-over-time.md) and need many
FLEET_DEVICES = 100_000
#: the Prometheus whose firing alerts the page and the CLI show (``up --obs`` sets it)
ENV_PROMETHEUS_URL = "LDP_PROMETHEUS_URL"
#: where ``ldpstream up`` keeps its dev identity (signing key) across restarts (docs/devices.md)
ENV_STATE_DIR = "LDP_STATE_DIR"

# --- collection defaults (docs/configuration.md) ----------------------------------------------------

#: Kafka partitions of a collection's topic when the config gives none: up to this many workers
#: share its ingest (docs/scaling.md); more partitions cost one Redis read each per refresh
DEFAULT_PARTITIONS = 4
DEFAULT_ESTIMATORS = ("truncated",)
DEFAULT_REFRESH_INTERVAL_S = 5.0
DEFAULT_CONTROLLER_INTERVAL_S = 1.0
DEFAULT_BUCKET_S = 60.0
DEFAULT_WINDOWS = ("5m", "1h", "24h", "all")
DEFAULT_DRIFT_ALPHA = 1e-3
DEFAULT_QUOTA_WINDOW_S = 86_400.0
#: memoized collections: devices whose latest report one partition keeps (agents/store/device_memo.py)
DEFAULT_DEVICE_STATE_MAX = 1_000_000
#: memoized collections: a device silent this long (s) leaves the estimates and the state
DEFAULT_DEVICE_RETENTION_S = 90 * 86_400.0

# --- ingest defaults ---------------------------------------------------------------------------------

DEFAULT_BATCH_REPORTS = 20_000
DEFAULT_BATCH_SECONDS = 0.5
#: the largest Kafka message (one report batch) a worker accepts, and the wire format's default
MAX_MESSAGE_BYTES = 1_048_576

# --- MQTT ingress (docs/devices.md, "MQTT") -----------------------------------------------------------

__all__ += ["MQTT_REPORTS_TOPIC", "MQTT_CONFIG_TOPIC", "MQTT_SHARE_GROUP", "mqtt_reports_topic",
            "mqtt_config_topic", "ENV_MQTT_URL", "ENV_MQTT_CA", "ENV_MQTT_FLEETS_FILE",
            "ENV_MQTT_CLIENT_ID", "ENV_MQTT_SUBSCRIPTION", "ENV_WEB_BIND", "DEFAULT_MQTT_BRIDGE_PORT",
            "MQTT_RECEIVE_MAXIMUM"]

#: devices publish report batches here (QoS 1); ``{fleet}`` and ``{collection}`` are filled in
MQTT_REPORTS_TOPIC = "ldp/{fleet}/{collection}/reports"
#: the bridge publishes a collection's signed mechanism state here, retained
MQTT_CONFIG_TOPIC = "ldp/{fleet}/{collection}/config"
#: the shared-subscription group of ``ldpstream mqtt-bridge`` (bridges in it split the messages)
MQTT_SHARE_GROUP = "ldp-bridge"
ENV_MQTT_URL = "LDP_MQTT_URL"
#: the example device programs' MQTT password (C, TypeScript, Python: kept out of the process list)
ENV_MQTT_PASSWORD = "LDP_MQTT_PASSWORD"
ENV_MQTT_CA = "LDP_MQTT_CA"
ENV_MQTT_FLEETS_FILE = "LDP_MQTT_FLEETS_FILE"
ENV_MQTT_CLIENT_ID = "LDP_MQTT_CLIENT_ID"
#: the address HTTP servers listen on (worker, bridge; default DEFAULT_BIND)
ENV_WEB_BIND = "LDP_WEB_BIND"
#: ``shared`` (default) or ``exclusive`` (see producers/mqtt_bridge.py ``MqttBridge.subscription``)
ENV_MQTT_SUBSCRIPTION = "LDP_MQTT_SUBSCRIPTION"
#: the bridge's /healthz and /metrics
DEFAULT_MQTT_BRIDGE_PORT = 8081
#: QoS 1 messages a bridge may have unacknowledged (it acknowledges once Kafka has them)
MQTT_RECEIVE_MAXIMUM = 1024


def mqtt_reports_topic(fleet: str, collection_id: str) -> str:
    """The MQTT topic a fleet's devices publish a collection's batches to."""
    return MQTT_REPORTS_TOPIC.format(fleet=fleet, collection=collection_id)


def mqtt_config_topic(fleet: str, collection_id: str) -> str:
    """The MQTT topic carrying a collection's signed state (retained) for one fleet."""
    return MQTT_CONFIG_TOPIC.format(fleet=fleet, collection=collection_id)


# --- broker refusals the bridge counts (docs/security.md, "Refusals the broker counts") ----------
__all__ += ["MQTT_BROKER_LOG_TOPIC", "MQTT_BROKER_LOG_ACL", "ENV_MQTT_BROKER_LOG_FILE"]
#: where Mosquitto (``log_dest topic``) publishes its notice-level log lines, the refusals' level
MQTT_BROKER_LOG_TOPIC = "$SYS/broker/log/N"
#: what the bridge's user may read of the broker's log (ACL)
MQTT_BROKER_LOG_ACL = "$SYS/broker/log/#"
#: the broker's log file, debug level, read by the bridge for the ACL-denied publishes (opt-in)
ENV_MQTT_BROKER_LOG_FILE = "LDP_MQTT_BROKER_LOG_FILE"


# --- the public key on MQTT (docs/devices.md, "Getting the public key") -------------------------
__all__ += ["MQTT_PUBLIC_KEY_TOPIC", "mqtt_public_key_topic"]
#: retained by the bridge: the key that signs ldp.config (``GET /v1/public-key``'s document)
MQTT_PUBLIC_KEY_TOPIC = "ldp/{fleet}/public-key"


def mqtt_public_key_topic(fleet: str) -> str:
    """The MQTT topic carrying the verifying key's document (retained) for one fleet."""
    return MQTT_PUBLIC_KEY_TOPIC.format(fleet=fleet)


# --- per-device identity (docs/security.md, "Per-device identity"; docs/credentials.md) -----------
__all__ += ["ENV_DEVICE_SECRETS", "ENV_DEVICE_SECRETS_FILE", "DEVICE_KEY_LABEL",
            "AUTH_REASONS"]
#: the fleets' secrets the worker derives device keys from: a YAML/JSON file, or its JSON inline
ENV_DEVICE_SECRETS_FILE = "LDP_DEVICE_SECRETS_FILE"
ENV_DEVICE_SECRETS = "LDP_DEVICE_SECRETS"
#: domain separation of a device key: HMAC-SHA256(fleet secret, label ‖ u8 len ‖ fleet ‖ u64 id)
DEVICE_KEY_LABEL = b"ldpstream/device-key/v1\n"
#: the ldp.dlq reasons of a batch the worker does not count as an authenticated device's
AUTH_REASONS = ("unauthenticated", "unknown_fleet", "bad_mac", "sender_mismatch")
__all__ += ["ENV_REQUIRE_DEVICE_AUTH"]
#: ``1``: the gateway and the MQTT bridge refuse batches without a device MAC
ENV_REQUIRE_DEVICE_AUTH = "LDP_REQUIRE_DEVICE_AUTH"
__all__ += ["ACKS_TOPIC", "ACK_FLUSH_S", "ACK_SETTLE_S", "ACK_CHECK_S"]
#: a gateway or bridge publishes its acknowledged counts this often (when they changed)
ACK_FLUSH_S = 2.0
#: a report acknowledged this long ago must have reached a worker (counted or dead-lettered)
ACK_SETTLE_S = 30.0
#: workers reconcile acknowledged and taken reports this often
ACK_CHECK_S = 5.0
