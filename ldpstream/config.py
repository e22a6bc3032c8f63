"""Collections config: a YAML or TOML file (by extension) validated into :class:`AppConfig`.

One pydantic model per section (:class:`Collection`, :class:`IngestConfig`, ...) is both the file's
schema and the object the worker uses: validators turn ``schema`` into a
:class:`~ldpstream.estimators.kernels.domain.Domain`, ``windows`` into
:class:`~ldpstream.windows.Window` s and ``marginals`` into attribute tuples. The field
reference in docs/configuration.md is generated from these models (``ldpstream config-reference``).

Every error is a :class:`ConfigError` whose message starts with the path of the offending field,
e.g. ``collections[0].epsilon: must be a number > 0 (got -1)``. Unknown fields, unknown attribute
names in marginals and unknown mechanism / estimator names are rejected, naming them. Every
problem is collected (``ConfigError.errors``): type errors of all fields, and the semantic checks
of every field whose inputs passed their type check.

The API token, Kafka bootstrap and Redis URL never come from the file: ``LDP_API_TOKEN``,
``KAFKA_BOOTSTRAP_SERVERS``, ``REDIS_URL`` (unset = embedded services; a Redis Cluster is
``REDIS_URL=redis+cluster://host:port,host:port`` or ``REDIS_CLUSTER_NODES=host:port,host:port``).
"""
from __future__ import annotations

import os
import re
import tomllib
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SkipValidation,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ldpstream.config_errors import ConfigError, format_errors, problems
from ldpstream.config_semantics import domain_of, marginals_of, windows_of
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.mechanism import (
    DEFAULT_MECHANISM,
    Mechanism,
    ParamError,
    TensorSpec,
    attribute_budget,
    mechanism_class,
    mechanism_names,
)
from ldpstream.names import (
    DEFAULT_BATCH_REPORTS,
    DEFAULT_BATCH_SECONDS,
    DEFAULT_BUCKET_S,
    DEFAULT_CONTROLLER_INTERVAL_S,
    DEFAULT_DEVICE_RETENTION_S,
    DEFAULT_DEVICE_STATE_MAX,
    DEFAULT_DRIFT_ALPHA,
    DEFAULT_ESTIMATORS,
    DEFAULT_PARTITIONS,
    DEFAULT_QUOTA_WINDOW_S,
    DEFAULT_REFRESH_INTERVAL_S,
    DEFAULT_WINDOWS,
    ENV_API_TOKEN,
    ENV_KAFKA_BOOTSTRAP,
    MAX_MESSAGE_BYTES,
    reports_topic,
)
from ldpstream.privacy_windows import budget_problem
from ldpstream.suggest import did_you_mean
from ldpstream.windows import BucketPolicy, Window

__all__ = ["ConfigError", "AppConfig", "ConfigFile", "IngestConfig", "Collection", "CsvSchema",
           "Schema", "DeviceQuota", "load_config", "parse_config", "build_mechanism",
           "default_config_path"]

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class _Strict(BaseModel):
    # strict: ints are accepted as numbers, bools and strings are not; extra="forbid": an unknown
    # field is one more error, the other fields are still validated
    model_config = ConfigDict(strict=True, frozen=True, allow_inf_nan=False, populate_by_name=False,
                              extra="forbid")


class IngestConfig(_Strict):
    """How the worker batches its writes to Redis (docs/pipeline.md, "How a message is counted")."""

    batch_reports: int = Field(DEFAULT_BATCH_REPORTS, ge=1,
                               description="apply a delta to Redis every this many reports (a delta "
                                           "of many cells: 64 a cell, up to 8 times this) ...")
    batch_seconds: float = Field(DEFAULT_BATCH_SECONDS, gt=0.0,
                                 description="... or every this many seconds, whichever is first; a "
                                             "worker that has caught up applies at once "
                                             "(docs/pipeline.md \"Adaptive flushing\")")
    max_message_bytes: int = Field(MAX_MESSAGE_BYTES, ge=1024,
                                   description="largest Kafka message (one report batch) "
                                               "accepted; a larger one goes to `ldp.dlq`")


class CsvSchema(_Strict):
    """Attributes and categories read from a CSV file's columns."""

    path: str | None = Field(None, description="CSV file, relative to the config file; omitted: "
                                                "the bundled UCI Adult data")
    columns: list[str] | None = Field(None, min_length=1,
                                      description="the columns to use, in order (required with "
                                                  "path; default: the 8 Adult attributes)")
    numeric: dict[str, dict[str, Any]] | None = Field(
        None, description="numeric columns: `{column: {min: a, max: b}}` (optional `grid`: "
                          "points of its input grid, default 1025); values outside are clipped "
                          "and counted (docs/numeric.md)")


class Schema(_Strict):
    """The attributes of a record and their categories: exactly one of ``attributes``, ``csv``."""

    attributes: dict[str, Any] | None = Field(
        None, min_length=1, description="attribute name → list of its categories (strings), or "
                                        "`{numeric: {min: a, max: b}}` for a numeric one "
                                        "(docs/numeric.md)")
    csv: CsvSchema | None = Field(None, description="read the categories from a CSV file")

    @model_validator(mode="after")
    def _resolve(self, info: ValidationInfo) -> Schema:
        if (self.attributes is None) == (self.csv is None):
            raise PydanticCustomError("schema_kind", "give exactly one of 'attributes' or 'csv'")
        # derived once here, where the config file's directory is known; stored where the cached
        # properties below find them (plain attribute reads: the worker reads them per batch)
        self.__dict__["domain"], self.__dict__["source"] = self._derive(
            Path((info.context or {}).get("base_dir", ".")))
        return self

    def _derive(self, base_dir: Path) -> tuple[Domain, str]:
        csv = None if self.csv is None else (self.csv.path, self.csv.columns)
        return domain_of(self.attributes, csv, base_dir,
                         None if self.csv is None else self.csv.numeric)

    @cached_property
    def domain(self) -> Domain:
        return self._derive(Path("."))[0]

    @cached_property
    def source(self) -> str:
        """``attributes`` or ``csv:<file>`` (where a fleet samples records from)."""
        return self._derive(Path("."))[1]


class DeviceQuota(_Strict):
    """At most ``reports`` reports per device id are counted per ``window_s`` (fixed windows of
    the Kafka record timestamp); the excess goes to ``ldp.dlq`` as ``over_quota``
    (docs/security.md, "Per-device quotas")."""

    reports: int = Field(ge=1, description="reports counted per device id and window")
    window_s: float = Field(DEFAULT_QUOTA_WINDOW_S, ge=1.0, description="window length, seconds")


class Collection(_Strict):
    """One collection: schema, mechanism and its parameters, marginals to keep, refresh policy."""

    id: str = Field(description="`[A-Za-z0-9][A-Za-z0-9_.-]*`, at most 64 characters; the "
                                "reports topic is `ldp.reports.<id>`")
    schema_: Schema = Field(alias="schema", description="the attributes and their categories")
    mechanism_name: str = Field(DEFAULT_MECHANISM, alias="mechanism",
                                description="a registered mechanism family "
                                            "(docs/mechanisms.md)")
    params: dict[str, Any] = Field(default_factory=dict,
                                   description="the family's parameters, e.g. rrba "
                                               "{block_size: 250}")
    epsilon: float = Field(gt=0.0, description="privacy budget, per attribute or per record "
                                               "(epsilon_scope)")
    epsilon_scope: Literal["attribute", "record"] = Field(
        "attribute", description="attribute: each attribute's channel has epsilon; record: "
                                 "epsilon is split evenly over the attributes")
    partitions: int = Field(DEFAULT_PARTITIONS, ge=1, le=10_000,
                            description="Kafka partitions of the reports topic, the unit of "
                                        "parallelism: at most this many workers share the "
                                        "collection's ingest (more partitions cost one Redis "
                                        "read each per refresh; docs/scaling.md)")
    marginals: Annotated[list[tuple[str, ...]], SkipValidation] = Field(
        description="the marginals to estimate: a list of attribute lists, or "
                    "{all_ways_up_to: W} for every marginal of 2..W attributes",
        json_schema_extra={"file_type": "list of lists of attribute names | {all_ways_up_to: W}"})
    estimators: list[str] = Field(default_factory=lambda: list(DEFAULT_ESTIMATORS), min_length=1,
                                  description="estimators run at every refresh (the mechanism's "
                                              "own names); the first is the API's default")
    refresh_interval_s: float = Field(DEFAULT_REFRESH_INTERVAL_S, gt=0.0,
                                      description="seconds between two estimate refreshes")
    controller_interval_s: float = Field(DEFAULT_CONTROLLER_INTERVAL_S, gt=0.0,
                                         description="adaptive mechanisms: seconds between two "
                                                     "decisions of the controller")
    bucket_s: float = Field(DEFAULT_BUCKET_S, ge=1.0, le=86_400.0,
                            description="width of a time bucket (Kafka record timestamp), seconds")
    windows: Annotated[tuple[Window, ...], SkipValidation] = Field(
        DEFAULT_WINDOWS, validate_default=True,  # the names; _windows parses them
        description="time windows estimated at every refresh: durations (30s, 5m, 1h, 7d), each "
                    "a whole number of buckets, or all; the first is the API's default",
        json_schema_extra={"file_type": "list of durations"})
    drift_alpha: float = Field(DEFAULT_DRIFT_ALPHA, gt=0.0, lt=0.5,
                               description="false-alarm probability of one drift check")
    drift_min_effect: float = Field(0.0, ge=0.0, le=1.0,
                                    description="a total variation distance below this is never a "
                                                "drift alarm")
    expect_traffic: bool = Field(True, description="false: no IngestStalled alert for this "
                                                   "collection (docs/dashboards.md)")
    version: int = Field(0, ge=0, le=2**32 - 1,
                         description="mechanism version devices stamp on their reports")
    device_quota: DeviceQuota | None = Field(
        None, description="count at most `reports` reports per device id per `window_s`; the "
                          "excess goes to `ldp.dlq` as `over_quota`; needs device ids "
                          "(docs/security.md)")
    reports_per_day: float | None = Field(
        None, gt=0.0, description="the reporting rate devices are configured with (reports per "
                                  "device per day): states the ε a device spends per window and "
                                  "per day (docs/privacy-over-time.md)")
    max_epsilon_per_day: float | None = Field(
        None, gt=0.0, description="the most ε a device spends on this collection per day: its "
                                  "SDK ledger refuses reports beyond it, the worker counts at "
                                  "most the reports per device and day that fit (the rest go to "
                                  "`ldp.dlq` as `over_budget`); a declared rate that spends more "
                                  "fails at start (docs/privacy-over-time.md)")
    expected_senders: int = Field(
        1024, ge=0, le=6_000_000,
        description="devices (or senders of keyed batches) one partition expects per window: "
                    "sizes the buckets of the per-device dedupe and quota state (48 devices "
                    "each) of a window whose previous window held fewer; later windows follow "
                    "the fleet (docs/scaling.md)")
    device_state_max: int = Field(
        DEFAULT_DEVICE_STATE_MAX, ge=1,
        description="memoized collections, counted per device: entries (devices' latest "
                    "reports) one partition keeps, about 60 bytes each in Redis and 52 in the "
                    "worker (8 attributes); a device active "
                    "in two consecutive state epochs holds two until the older expires; reports "
                    "of further devices go to `ldp.dlq` as `device_state_full` "
                    "(docs/privacy-over-time.md)")
    device_retention_s: float | None = Field(
        None, gt=0.0, le=100 * 365 * 86_400.0,
        description="memoized collections: a device silent this long (seconds) leaves the "
                    "estimates, the all-time window included, and its state is freed (at the "
                    "latest two state epochs later); at least one state epoch (2 × the "
                    "longest window + one bucket; one day when only `all` is kept); default: 90 "
                    "days, or one epoch if longer (docs/privacy-over-time.md)")

    # --- semantic checks (each runs when the fields it needs passed their type check) ---------

    @field_validator("id")
    @classmethod
    def _id(cls, v: str, info: ValidationInfo) -> str:
        if not _ID_RE.match(v):
            problems(("", f"must match [A-Za-z0-9][A-Za-z0-9_.-]* (at most 64 characters; got "
                          f"{v!r})"))
        seen: set[str] | None = (info.context or {}).get("seen_ids")
        if seen is not None:
            if v in seen:
                problems(("", f"duplicate collection id {v!r}"))
            seen.add(v)
        return v

    @field_validator("mechanism_name")
    @classmethod
    def _mechanism(cls, v: str) -> str:
        try:
            mechanism_class(v)
        except ValueError as exc:
            problems(("", str(exc)))
        return v

    @field_validator("marginals", mode="before")
    @classmethod
    def _marginals(cls, v: Any, info: ValidationInfo) -> list[tuple[str, ...]]:
        schema = info.data.get("schema_")
        # no valid schema: the collection fails on it already; its marginals cannot be checked
        return [] if schema is None else marginals_of(v, schema.domain)

    @field_validator("estimators")
    @classmethod
    def _estimators(cls, v: list[str], info: ValidationInfo) -> list[str]:
        name = info.data.get("mechanism_name")
        if name is None:
            return v
        allowed = mechanism_class(name).estimators
        found = [(f"[{j}]", f"unknown estimator {est!r} for {name} (known: {', '.join(allowed)})"
                            f"{did_you_mean(est, allowed)}")
                 for j, est in enumerate(v) if est not in allowed]
        if len(set(v)) != len(v):
            found.append(("", "lists an estimator twice"))
        if found:
            problems(*found)
        return v

    @field_validator("windows", mode="before")
    @classmethod
    def _windows(cls, v: Any, info: ValidationInfo) -> tuple[Window, ...]:
        return windows_of(v, info.data.get("bucket_s"))

    @model_validator(mode="after")
    def _servable(self) -> Collection:
        """The mechanism builds from ``params`` and serves every (marginal, estimator) pair."""
        numeric = self.domain.numeric_attrs()
        if numeric and not mechanism_class(self.mechanism_name).numeric:
            fits = [n for n in mechanism_names() if mechanism_class(n).numeric]
            problems((".mechanism", f"attribute {numeric[0]!r} is numeric: {self.mechanism_name} "
                                    f"randomizes categories (for numeric attributes: "
                                    f"{', '.join(fits)}; docs/numeric.md)"))
        mech = build_mechanism(self, "")
        found = []
        for attrs in self.marginals:
            for method in self.estimators:
                why = mech.check_marginal(attrs, method)
                if why is not None:
                    found.append((".marginals", f"{mech.name} cannot serve {list(attrs)} with "
                                                f"{method}: {why}"))
        if found:
            problems(*found)
        why = budget_problem(self.max_epsilon_per_day, self.reports_per_day, mech)
        if why is not None:
            problems((".max_epsilon_per_day", why))
        epoch = self.policy.state_epoch_s()
        if mech.memoization() is not None and self.device_retention_s is not None \
                and self.device_retention_s < epoch:
            problems((".device_retention_s", f"{self.device_retention_s:g} s is shorter than one "
                                             f"device state epoch ({epoch:g} s: 2 × the longest "
                                             f"window + one bucket, one day when only `all` is "
                                             f"kept); a device must outlive its windows"))
        return self

    # --- derived ----------------------------------------------------------------------------

    @cached_property
    def domain(self) -> Domain:
        return self.schema_.domain

    @property
    def schema_source(self) -> str:
        return self.schema_.source

    @property
    def topic(self) -> str:
        return reports_topic(self.id)

    @cached_property
    def policy(self) -> BucketPolicy:
        """How reports are bucketed in time and which windows are estimated."""
        return BucketPolicy(self.bucket_s, self.windows)

    def device_retention(self) -> float:
        """Seconds a silent device stays in a memoized collection's state and estimates:
        ``device_retention_s``, default 90 days or one state epoch if longer."""
        if self.device_retention_s is not None:
            return self.device_retention_s
        return max(DEFAULT_DEVICE_RETENTION_S, self.policy.state_epoch_s())

    def window(self, name: str) -> Window | None:
        return next((w for w in self.windows if w.name == name), None)

    @property
    def epsilon_per_attribute(self) -> float:
        """ε of each attribute's channel: ``epsilon`` (attribute scope) or ``epsilon / m``."""
        return attribute_budget(self.epsilon, self.epsilon_scope, len(self.domain))

    def mechanism(self) -> Mechanism:
        """A new mechanism instance for this collection (see :func:`build_mechanism`)."""
        return build_mechanism(self)

    def tensors(self) -> list[TensorSpec]:
        """The count tensors the configured marginals need."""
        return self.mechanism().tensors(self.marginals)


class ConfigFile(_Strict):
    """The config file: its collections and the worker's batching."""

    collections: list[Collection] = Field(min_length=1, description="the collections; ids unique")
    ingest: IngestConfig = Field(default_factory=IngestConfig,
                                 description="the worker's batching of Redis writes")


class AppConfig(BaseModel):
    """The validated file (collections by id) plus what comes from the environment only."""

    model_config = ConfigDict(frozen=True)

    collections: dict[str, Collection]
    ingest: IngestConfig = IngestConfig()
    api_token: str | None = None
    kafka_bootstrap: str | None = None
    redis_url: str | None = None
    source: str | None = None


# --- mechanisms ----------------------------------------------------------------------------------

def build_mechanism(collection: Collection, path: str | None = None) -> Mechanism:
    """Version ``collection.version`` of the collection's mechanism: the registered family's
    ``from_config`` with the collection's ε, scope and ``params``. A bad parameter is a
    :class:`ConfigError` naming it (``<path>.params.<field>``); with ``path=""`` (inside
    validation) it is a semantic validation error of the collection."""
    where = f"collections[{collection.id}]" if path is None else path
    found: tuple[str, str]
    try:
        cls = mechanism_class(collection.mechanism_name)
        return cls.from_config(collection.domain, collection.params, epsilon=collection.epsilon,
                               epsilon_scope=collection.epsilon_scope, version=collection.version)
    except ParamError as exc:
        found = (f".params.{exc.field}", str(exc).removeprefix(f"{exc.field}: "))
    except ValueError as exc:
        found = ("", f"cannot build mechanism {collection.mechanism_name!r}: {exc}")
    if path == "":
        problems(found)
    raise ConfigError(f"{where}{found[0]}: {found[1]}")


# --- loading -------------------------------------------------------------------------------------

def default_config_path() -> Path:
    """The bundled demo config (``ldpstream/data/adult-demo.yaml``)."""
    return Path(str(resources.files("ldpstream") / "data" / "adult-demo.yaml"))


def load_config(path: str | os.PathLike[str] | None = None, *,
                env: Mapping[str, str] | None = None) -> AppConfig:
    """Read and validate a YAML (``.yaml``/``.yml``) or TOML (``.toml``) config file;
    ``None`` → the bundled Adult demo. Raises :class:`ConfigError`."""
    p = Path(path) if path is not None else default_config_path()
    suffix = p.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise ConfigError(f"{p}: config must be .yaml, .yml or .toml (got {suffix or 'no extension'})")
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read ({exc})") from None
    try:
        data = tomllib.loads(text) if suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        kind = "TOML" if suffix == ".toml" else "YAML"
        raise ConfigError(f"{p}: invalid {kind}: " + " ".join(str(exc).split())) from None
    return parse_config(data, base_dir=p.parent, env=env, source=str(p))


def parse_config(data: Any, *, base_dir: str | os.PathLike[str] = ".",
                 env: Mapping[str, str] | None = None, source: str | None = None) -> AppConfig:
    """Validate an already-parsed config mapping (relative CSV paths resolve against
    ``base_dir``) and add the environment's endpoints and token. Raises :class:`ConfigError`
    listing every problem (see the module docstring)."""
    from ldpstream.redis_client import RedisUrlError, redis_url_from_env  # redis-py

    env = os.environ if env is None else env
    if not isinstance(data, Mapping):
        raise ConfigError(f"(top level): must be a mapping with 'collections' (got "
                          f"{type(data).__name__})")
    if "api_token" in data:
        raise ConfigError(f"api_token: never put the token in the file; set {ENV_API_TOKEN}")
    errors: list[str] = []
    file: ConfigFile | None = None
    try:
        file = ConfigFile.model_validate(data, context={"base_dir": Path(base_dir),
                                                        "seen_ids": set()})
    except ValidationError as exc:
        errors = format_errors(exc.errors(), ConfigFile)
    try:
        redis_url = redis_url_from_env(env)
    except RedisUrlError as exc:
        errors.append(str(exc))
    if errors or file is None:
        raise ConfigError(errors or ["(top level): invalid config"])
    return AppConfig(collections={c.id: c for c in file.collections}, ingest=file.ingest,
                     api_token=env.get(ENV_API_TOKEN) or None,
                     kafka_bootstrap=env.get(ENV_KAFKA_BOOTSTRAP) or None,
                     redis_url=redis_url, source=source)
