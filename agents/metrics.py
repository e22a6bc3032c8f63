"""Prometheus metrics of the ldpstream worker (documented in docs/dashboards.md and docs/windows.md).

Every metric lives in one :class:`~prometheus_client.CollectorRegistry`, :data:`REGISTRY`, so a
worker exposes exactly these series on ``GET /metrics`` (plus nothing from the default process
collectors of other libraries). Labels are low-cardinality: collection ids, reject reasons,
configured marginals (``a|b``), estimator names, and the cells of configured marginals only.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

try:  # the classic text format every Prometheus (2.x and 3.x) accepts
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4 as CONTENT_TYPE
except ImportError:  # pragma: no cover - older prometheus-client
    from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE

REGISTRY = CollectorRegistry(auto_describe=True)

# --- ingest (written by the ingest agents) ------------------------------------------------------
REPORTS_INGESTED = Counter(
    "ldp_reports_ingested_total", "Reports counted into Redis.",
    ["collection"], registry=REGISTRY)
REPORTS_REJECTED = Counter(
    "ldp_reports_rejected_total",
    "Reports sent to the dead-letter topic (an undecodable message counts 1, under the "
    "collection of its topic).",
    ["collection", "reason"], registry=REGISTRY)
REPORTS_CLAMPED = Counter(
    "ldp_reports_clamped_total",
    "Reports counted in another time bucket than their record timestamp's: 'future' (stamped "
    "ahead of the worker's clock beyond the tolerance: counted now) or 'late' (their bucket "
    "expired: counted in the all-time tensor only).",
    ["collection", "reason"], registry=REGISTRY)
MEMO_DEVICES = Gauge(
    "ldp_memo_devices",
    "Memoized collections: devices whose latest report a partition keeps (agents/store/device_memo.py); "
    "reports of new devices beyond device_state_max go to ldp.dlq as device_state_full.",
    ["collection", "partition"], registry=REGISTRY)
MEMO_DEVICES_EVICTED = Counter(
    "ldp_memo_devices_evicted_total",
    "Memoized collections: devices silent beyond device_retention_s that left the estimates "
    "(the all-time window included) and the state (docs/privacy-over-time.md).",
    ["collection"], registry=REGISTRY)
REPORTS_SUPERSEDED = Counter(
    "ldp_reports_superseded_total",
    "Memoized collections: reports whose device's contribution moved to a newer report (each "
    "device is counted once, at its latest report).",
    ["collection"], registry=REGISTRY)
DEVICE_BATCHES = Counter(
    "ldp_device_batches_total",
    "Report batches whose device MAC verified (agents/ingest/identity_gate.py), by fleet; "
    "refused ones count in ldp_reports_rejected_total (unauthenticated, unknown_fleet, bad_mac, "
    "sender_mismatch).",
    ["collection", "fleet"], registry=REGISTRY)
ACK_GAP = Gauge(
    "ldp_ack_gap_reports",
    "Reports of device-authenticated batches a gateway or MQTT bridge acknowledged more than "
    "30 s ago that no worker took (counted or dead-lettered): agents/ingest/acks.py.",
    ["collection", "fleet"], registry=REGISTRY)
BATCHES_MISSING = Counter(
    "ldp_batches_missing_total",
    "Sequences a device-authenticated sender skipped: batches acknowledged to the device (its "
    "next batch proves it) that no worker received (agents/ingest/acks.py).",
    ["collection", "fleet"], registry=REGISTRY)
BATCHES_LATE = Counter(
    "ldp_batches_late_total",
    "Skipped sequences that arrived later (out of order): subtract from "
    "ldp_batches_missing_total.",
    ["collection", "fleet"], registry=REGISTRY)
SIDE_BUCKET_FILL = Gauge(
    "ldp_side_bucket_fill",
    "Per-device side state (state: dedupe, quota, budget) of a partition's current window: "
    "fields per bucket hash on average (agents/store/side_buckets.py; sized for 48, from the "
    "window before); above about 100 some buckets pass 128 fields and cost a hashtable's "
    "bytes a field: raise expected_senders if the fleet grows this fast.",
    ["collection", "state", "partition"], registry=REGISTRY)
DUPLICATE_BATCHES = Counter(
    "ldp_duplicate_batches_total",
    "Keyed report batches delivered again (same sender and sequence, agents/store/dedupe.py): not "
    "counted a second time.",
    ["collection"], registry=REGISTRY)
CONFIG_REPUBLISHED = Counter(
    "ldp_config_republished_total",
    "Times this worker republished every signed state on ldp.config (agents/control/control_topic.py): "
    "recreated, empty, shrank (broker log loss), flood, expiry (every 6 h).",
    ["why"], registry=REGISTRY)
CONTROL_CHECK_FAILED = Counter(
    "ldp_control_check_failures_total",
    "Broker checks of the control topics (every 5 s) that failed (broker unreachable).",
    registry=REGISTRY)
MESSAGES_CONSUMED = Counter(
    "ldp_messages_consumed_total", "Kafka messages consumed from a collection's report topic.",
    ["collection"], registry=REGISTRY)
BATCH_APPLY_SECONDS = Histogram(
    "ldp_batch_apply_seconds", "Seconds to apply one count delta to Redis (one Lua script call).",
    ["collection"], registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0))
CONSUMER_LAG = Gauge(
    "ldp_consumer_lag_messages",
    "Consumer lag summed over the partitions assigned to this worker (log end - counted; never "
    "clamped: negative while a log ends below what was counted, see ldp_log_resets_total).",
    ["collection"], registry=REGISTRY)
CONFIG_REFUSED = Counter(
    "ldp_config_records_refused_total",
    "ldp.config records this worker refused when checking them like a device does "
    "(producers/signing.py reasons): unsigned, wrong_key, bad_signature and wrong_collection "
    "are forgeries; replayed may be a benign reordering of two workers' publications.",
    ["reason"], registry=REGISTRY)
LOG_RESETS = Counter(
    "ldp_log_resets_total",
    "Partitions whose Kafka log was found recreated, truncated or with a retention gap "
    "(agents/ingest/log_identity.py); the stored offset was re-based and the event is in /healthz.",
    ["collection", "kind"], registry=REGISTRY)
POSITION_GAPS = Counter(
    "ldp_position_gaps_total",
    "First records after a partition was positioned that came later than the position set (the "
    "records between would have been skipped): the partition is checked and sought again "
    "(agents/ingest/service.py).", ["collection"], registry=REGISTRY)
COLLECTION_REPORTS = Gauge(
    "ldp_collection_reports", "Reports counted for the collection (n in Redis).",
    ["collection"], registry=REGISTRY)

# --- refresh (written by agents/refresh/refresher.py) ----------------------------------------------------
REFRESH_SECONDS = Histogram(
    "ldp_estimate_refresh_seconds",
    "Seconds to read a collection's tensors and run every configured estimator.",
    ["collection"], registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0))
REFRESH_ERRORS = Counter(
    "ldp_refresh_errors",
    "Refreshes of a collection that failed as a whole (e.g. Redis unreachable).",
    ["collection"], registry=REGISTRY)
PAGE_SAMPLE_ERRORS = Counter(
    "ldp_page_samples_failed",
    "Samples of the live page's history that failed (Redis unreachable, or any other error: "
    "logged, never fatal to the worker).",
    ["collection"], registry=REGISTRY)
LAST_REFRESH = Gauge(
    "ldp_estimate_last_refresh_timestamp_seconds", "Unix time of the last completed refresh.",
    ["collection"], registry=REGISTRY)
_EST = ["collection", "marginal", "method", "window"]
ESTIMATE_CELL = Gauge(
    "ldp_estimate_cell", "Estimated probability of one cell of a configured marginal in a window.",
    ["collection", "marginal", "method", "window", "cell"], registry=REGISTRY)
ESTIMATE_ERROR_BOUND = Gauge(
    "ldp_estimate_error_bound", "error_bound of the marginal: the 95 % upper quantile of its TVD "
    "(docs/api.md; NaN if none).",
    _EST, registry=REGISTRY)
ESTIMATE_DRIFT = Gauge(
    "ldp_estimate_drift_tvd",
    "Total variation distance between the window's estimate and the previous window's.",
    _EST, registry=REGISTRY)
DRIFT_STATISTIC = Gauge(
    "ldp_estimate_drift_statistic",
    "Drift statistic of the window against the previous window, accounting for both estimates' "
    "sampling variance (compare with ldp_estimate_drift_statistic_threshold).",
    _EST, registry=REGISTRY)
DRIFT_STATISTIC_THRESHOLD = Gauge(
    "ldp_estimate_drift_statistic_threshold",
    "Value of the drift statistic a stationary stream exceeds with probability drift_alpha.",
    _EST, registry=REGISTRY)
DRIFT_ALARM = Gauge(
    "ldp_estimate_drift_alarm",
    "1 when the drift statistic exceeds its threshold and the tvd is at least drift_min_effect.",
    _EST, registry=REGISTRY)
ESTIMATE_FAILURES = Counter(
    "ldp_estimate_failures",
    "Refresh attempts whose estimator raised (the reason is in the API's answer).",
    _EST, registry=REGISTRY)
ESTIMATE_NOT_CONVERGED = Gauge(
    "ldp_estimate_not_converged",
    "1 while the last estimate of this marginal is an iterative fit that did not converge (the "
    "API's answer carries a warning), else 0.",
    _EST, registry=REGISTRY)
ESTIMATE_FAILING = Gauge(
    "ldp_estimate_failing", "1 while the last attempt to estimate this marginal failed, else 0.",
    _EST, registry=REGISTRY)
# numeric attributes (docs/numeric.md "Live"): summaries, not the input grid's cells
_NUM = _EST + ["category"]   # the whole population: ALL_CATEGORIES; a by-category marginal: each
#: the ``category`` label of a numeric gauge of the whole population (an empty label value would
#: be no label to Prometheus, and no value of a dashboard variable)
ALL_CATEGORIES = "(all)"
NUMERIC_MEAN = Gauge(
    "ldp_numeric_mean", "Estimated mean of a numeric attribute (its units): the mean estimator's, "
    "or the distribution's.", _NUM, registry=REGISTRY)
NUMERIC_MEAN_LOW = Gauge(
    "ldp_numeric_mean_low", "Lower end of the mean's 95 % interval (mean estimator).",
    _NUM, registry=REGISTRY)
NUMERIC_MEAN_HIGH = Gauge(
    "ldp_numeric_mean_high", "Upper end of the mean's 95 % interval (mean estimator).",
    _NUM, registry=REGISTRY)
NUMERIC_QUANTILE = Gauge(
    "ldp_numeric_quantile", "Estimated quantile (0.5, 0.9, 0.99) of a numeric attribute "
    "(distribution estimator).", _NUM + ["quantile"], registry=REGISTRY)
NUMERIC_QUANTILE_LOW = Gauge(
    "ldp_numeric_quantile_low", "Lower end of the quantile's 95 % interval.",
    _NUM + ["quantile"], registry=REGISTRY)
NUMERIC_QUANTILE_HIGH = Gauge(
    "ldp_numeric_quantile_high", "Upper end of the quantile's 95 % interval.",
    _NUM + ["quantile"], registry=REGISTRY)
NUMERIC_W1_BOUND = Gauge(
    "ldp_numeric_w1_bound", "Bound on the Wasserstein-1 error of the distribution (its units; "
    "covers at least 95 %).", _NUM, registry=REGISTRY)
NUMERIC_CDF = Gauge(
    "ldp_numeric_cdf", "The distribution's CDF at the bounds' bin edges (le, in the attribute's "
    "units).", _EST + ["le"], registry=REGISTRY)
NUMERIC_CDF_LOW = Gauge(
    "ldp_numeric_cdf_low", "Lower end of the CDF's pointwise 95 % band.", _EST + ["le"],
    registry=REGISTRY)
NUMERIC_CDF_HIGH = Gauge(
    "ldp_numeric_cdf_high", "Upper end of the CDF's pointwise 95 % band.", _EST + ["le"],
    registry=REGISTRY)
NUMERIC_GAUGES = (NUMERIC_MEAN, NUMERIC_MEAN_LOW, NUMERIC_MEAN_HIGH, NUMERIC_QUANTILE,
                  NUMERIC_QUANTILE_LOW, NUMERIC_QUANTILE_HIGH, NUMERIC_W1_BOUND, NUMERIC_CDF,
                  NUMERIC_CDF_LOW, NUMERIC_CDF_HIGH)
MECHANISM_VERSION = Gauge(
    "ldp_mechanism_version", "Version of the collection's mechanism state in force on this worker "
    "(adaptive mechanisms publish new versions: agents/control/controller.py).",
    ["collection"], registry=REGISTRY)
MECHANISM_VERSION_CHANGES = Counter(
    "ldp_mechanism_version_changes_total", "Mechanism versions this worker adopted.",
    ["collection"], registry=REGISTRY)
CONTROLLER_ERRORS = Counter(
    "ldp_controller_errors_total", "Controller ticks that failed (retried at the next tick).",
    ["collection"], registry=REGISTRY)
EPSILON_PER_RECORD = Gauge(
    "ldp_epsilon_per_record", "ε one report costs, computed from the mechanism in force.",
    ["collection"], registry=REGISTRY)
REFRESH_INTERVAL = Gauge(
    "ldp_refresh_interval_seconds", "Configured estimate refresh interval.",
    ["collection"], registry=REGISTRY)
INGEST_EXPECTED = Gauge(
    "ldp_ingest_expected", "1 when the collection is configured to expect traffic, else 0.",
    ["collection"], registry=REGISTRY)
FRESHNESS = Gauge(
    "ldp_estimate_freshness_seconds",
    "Refresh time minus the newest device sent_at included in the estimate.",
    ["collection"], registry=REGISTRY)

#: Every metric name this module defines (as exposed; counters gain ``_total`` already here).
METRIC_NAMES: tuple[str, ...] = (
    "ldp_reports_ingested_total", "ldp_reports_rejected_total", "ldp_messages_consumed_total",
    "ldp_batch_apply_seconds", "ldp_consumer_lag_messages", "ldp_collection_reports",
    "ldp_estimate_refresh_seconds", "ldp_refresh_errors_total",
    "ldp_estimate_last_refresh_timestamp_seconds",
    "ldp_estimate_cell", "ldp_estimate_error_bound", "ldp_estimate_drift_tvd",
    "ldp_estimate_drift_statistic", "ldp_estimate_drift_statistic_threshold",
    "ldp_estimate_drift_alarm", "ldp_estimate_failures_total", "ldp_estimate_failing",
    "ldp_estimate_not_converged",
    "ldp_reports_clamped_total", "ldp_epsilon_per_record", "ldp_refresh_interval_seconds",
    "ldp_ingest_expected", "ldp_estimate_freshness_seconds",
    "ldp_numeric_mean", "ldp_numeric_mean_low", "ldp_numeric_mean_high", "ldp_numeric_quantile",
    "ldp_numeric_quantile_low", "ldp_numeric_quantile_high", "ldp_numeric_w1_bound",
    "ldp_numeric_cdf", "ldp_numeric_cdf_low", "ldp_numeric_cdf_high", "ldp_side_bucket_fill",
)


def marginal_label(attrs: Sequence[str]) -> str:
    """Label value of a marginal: attribute names joined by ``|`` (as in ``marginal_key``)."""
    return "|".join(attrs)


def cell_labels(labels: Sequence[Sequence[str]]) -> list[str]:
    """Cell label values of a marginal in C order: category labels joined by ``|``."""
    out = [""]
    for axis in labels:
        out = [f"{prefix}|{v}" if prefix else str(v) for prefix in out for v in axis]
    return out


def numeric_gauges(labels: Sequence[str], numeric: dict) -> None:
    """Set the numeric gauges of one estimate (``labels``: collection, marginal, method,
    window) from its payload's ``numeric`` block (docs/api.md "Numeric estimates")."""
    rows = numeric.get("categories") or [{**numeric, "category": ALL_CATEGORIES}]
    for row in rows:
        lab = (*labels, str(row["category"]))
        mean = row.get("mean") or {}
        if mean.get("value") is not None:
            NUMERIC_MEAN.labels(*lab).set(float(mean["value"]))
        if mean.get("low") is not None:
            NUMERIC_MEAN_LOW.labels(*lab).set(float(mean["low"]))
            NUMERIC_MEAN_HIGH.labels(*lab).set(float(mean["high"]))
        for q, iv in (row.get("quantiles") or {}).items():
            NUMERIC_QUANTILE.labels(*lab, q).set(float(iv["value"]))
            NUMERIC_QUANTILE_LOW.labels(*lab, q).set(float(iv["low"]))
            NUMERIC_QUANTILE_HIGH.labels(*lab, q).set(float(iv["high"]))
        if row.get("w1_bound") is not None:
            NUMERIC_W1_BOUND.labels(*lab).set(float(row["w1_bound"]))
    cdf = numeric.get("cdf")
    if cdf:
        for at, v, lo, hi in zip(cdf["at"], cdf["value"], cdf["low"], cdf["high"]):
            le = f"{at:g}"
            NUMERIC_CDF.labels(*labels, le).set(float(v))
            NUMERIC_CDF_LOW.labels(*labels, le).set(float(lo))
            NUMERIC_CDF_HIGH.labels(*labels, le).set(float(hi))


def clear_collection(collection: str) -> None:
    """Drop the per-cell/per-marginal estimate series of a collection (after a reset)."""
    for gauge in (ESTIMATE_CELL, ESTIMATE_ERROR_BOUND, ESTIMATE_DRIFT, DRIFT_STATISTIC,
                  DRIFT_STATISTIC_THRESHOLD, DRIFT_ALARM, ESTIMATE_FAILING,
                  ESTIMATE_NOT_CONVERGED, *NUMERIC_GAUGES):
        for labels in list(_label_sets(gauge)):
            if labels and labels[0] == collection:
                try:
                    gauge.remove(*labels)
                except KeyError:
                    pass


def _label_sets(metric) -> Iterable[tuple[str, ...]]:
    # prometheus-client keeps children in ``_metrics`` (label-value tuple → child).
    with metric._lock:
        return list(metric._metrics.keys())


def render() -> tuple[bytes, str]:
    """The Prometheus text exposition of :data:`REGISTRY` and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE
