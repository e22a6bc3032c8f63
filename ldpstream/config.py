"""Collections config: a YAML or TOML file (by extension) validated into :class:`AppConfig`.

Every error is a :class:`ConfigError` whose message starts with the path of the offending field,
e.g. ``collections[0].epsilon: must be a number > 0 (got -1)``. Unknown fields, unknown attribute
names in marginals and unknown mechanism / estimator names are rejected, naming them. Every
problem is collected (``ConfigError.errors``): type errors of all fields, and the semantic checks
of every collection on the fields that passed their type check.

File layout (YAML; TOML has the same keys)::

    ingest: {batch_reports: 20000, batch_seconds: 0.5, max_message_bytes: 1048576}   # optional
    collections:
      - id: adult                         # [A-Za-z0-9][A-Za-z0-9_.-]*, topic ldp.reports.<id>
        schema:
          csv: {path: adult.csv, columns: [sex, Salary]}   # path relative to this file;
                                                         # no path = bundled UCI Adult
          # or: attributes: {sex: [Female, Male], Salary: ["<=50K", ">50K"]}
        mechanism: rr-ind                 # any registered family (see estimators/mechanism.py)
        params: {}                        # the family's parameters, e.g. rrba {block_size: 250}
        epsilon: 2                        # per attribute (epsilon_scope: attribute, default)
        epsilon_scope: attribute          # or record: epsilon is split evenly over attributes
        partitions: 4
        marginals: [[sex, Salary], [race, sex]]      # or {all_ways_up_to: 3}
        estimators: [castell, truncated]
        refresh_interval_s: 5
        controller_interval_s: 1          # adaptive mechanisms: how often the controller decides
        bucket_s: 60                      # time bucket width (Kafka record timestamp)
        windows: [5m, 1h, 24h, all]       # estimated every refresh; first = the API's default
        drift_alpha: 0.001                # false-alarm probability of a drift check
        drift_min_effect: 0.0             # a tvd below this is never a drift alarm
        expect_traffic: true
        version: 0
        device_quota: {reports: 100, window_s: 86400}  # optional: reports counted per device id
                                                       # per window; needs device ids (security.md)

The API token, Kafka bootstrap and Redis URL never come from the file: ``LDP_API_TOKEN``,
``KAFKA_BOOTSTRAP_SERVERS``, ``REDIS_URL`` (unset = embedded services; a Redis Cluster is
``REDIS_URL=redis+cluster://host:port,host:port`` or ``REDIS_CLUSTER_NODES=host:port,host:port``).
"""
from __future__ import annotations

import itertools
import math
import os
import re
import tomllib
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from .agents.windows import DEFAULT_BUCKET_S, DEFAULT_WINDOWS, BucketPolicy, Window, parse_window
from .cli import CliError
from .datasets import ADULT_COLUMNS, DatasetError, adult_path, load_csv
from .suggest import did_you_mean
from .estimators.domain import Domain
from .estimators.mechanism import (Mechanism, ParamError, TensorSpec, attribute_budget,
                                   mechanism_class)

__all__ = ["ConfigError", "AppConfig", "IngestConfig", "Collection", "load_config",
           "parse_config", "build_mechanism", "default_config_path", "REPORTS_TOPIC_PREFIX",
           "DLQ_TOPIC", "CONFIG_TOPIC"]

REPORTS_TOPIC_PREFIX = "ldp.reports."
DLQ_TOPIC = "ldp.dlq"
CONFIG_TOPIC = "ldp.config"
#: Kafka partitions of a collection's topic when the config gives none: up to this many workers
#: share its ingest (docs/scaling.md); more partitions cost one Redis read each per refresh
DEFAULT_PARTITIONS = 4
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ConfigError(CliError, ValueError):
    """An invalid config. ``errors`` lists every problem found, each starting with its field
    path; ``str()`` is the first (and a count of the others) on one line."""

    def __init__(self, errors: str | Sequence[str]) -> None:
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        msg = self.errors[0]
        if len(self.errors) > 1:
            msg += f" (and {len(self.errors) - 1} more: " + "; ".join(self.errors[1:4]) + \
                ("; ..." if len(self.errors) > 4 else "") + ")"
        super().__init__(msg)


# --- file models (pydantic v2, strict) -----------------------------------------------------------

class _Strict(BaseModel):
    # extra="forbid": an unknown field is one more error, the other fields are still validated
    model_config = ConfigDict(strict=True, frozen=True, allow_inf_nan=False, populate_by_name=False,
                              extra="forbid")


Number = float  # strict: ints are accepted as numbers, bools and strings are not


class _IngestFile(_Strict):
    batch_reports: int = Field(20_000, ge=1)
    batch_seconds: Number = Field(0.5, gt=0.0)
    max_message_bytes: int = Field(1_048_576, ge=1024)


class _CsvFile(_Strict):
    path: str | None = None
    columns: list[str] | None = Field(None, min_length=1)


class _SchemaFile(_Strict):
    attributes: dict[str, list[Any]] | None = Field(None, min_length=1)
    csv: _CsvFile | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "_SchemaFile":
        if (self.attributes is None) == (self.csv is None):
            raise PydanticCustomError("schema_kind", "give exactly one of 'attributes' or 'csv'")
        return self


class _DeviceQuotaFile(_Strict):
    reports: int = Field(ge=1)
    window_s: Number = Field(86_400.0, ge=1.0)


class _CollectionFile(_Strict):
    id: str
    schema_: _SchemaFile = Field(alias="schema")
    mechanism: str = "rr-ind"
    params: dict[str, Any] = Field(default_factory=dict)
    epsilon: Number = Field(gt=0.0)
    epsilon_scope: Literal["attribute", "record"] = "attribute"
    partitions: int = Field(DEFAULT_PARTITIONS, ge=1, le=10_000)
    marginals: Any
    estimators: list[str] = Field(default_factory=lambda: ["truncated"], min_length=1)
    refresh_interval_s: Number = Field(5.0, gt=0.0)
    controller_interval_s: Number = Field(1.0, gt=0.0)
    bucket_s: Number = Field(DEFAULT_BUCKET_S, ge=1.0, le=86_400.0)
    windows: list[str] = Field(default_factory=lambda: list(DEFAULT_WINDOWS), min_length=1)
    drift_alpha: Number = Field(1e-3, gt=0.0, lt=0.5)
    drift_min_effect: Number = Field(0.0, ge=0.0, le=1.0)
    expect_traffic: bool = True
    version: int = Field(0, ge=0, le=2**32 - 1)
    device_quota: _DeviceQuotaFile | None = None


class _AppFile(_Strict):
    collections: list[_CollectionFile] = Field(min_length=1)
    ingest: _IngestFile = Field(default_factory=_IngestFile)


# --- runtime objects -----------------------------------------------------------------------------

@dataclass(frozen=True)
class IngestConfig:
    batch_reports: int = 20_000
    batch_seconds: float = 0.5
    max_message_bytes: int = 1_048_576


@dataclass(frozen=True)
class DeviceQuota:
    """At most ``reports`` reports per device id are counted per ``window_s`` (fixed windows of
    the Kafka record timestamp); the excess goes to ``ldp.dlq`` as ``over_quota``
    (docs/security.md, "Per-device quotas")."""

    reports: int
    window_s: float = 86_400.0


@dataclass(frozen=True)
class Collection:
    """One collection: schema, mechanism and its parameters, marginals to keep, refresh policy."""

    id: str
    domain: Domain
    mechanism_name: str
    epsilon: float
    epsilon_scope: str
    marginals: list[tuple[str, ...]]
    estimators: list[str]
    partitions: int = DEFAULT_PARTITIONS
    refresh_interval_s: float = 5.0
    #: seconds between two decisions of an adaptive mechanism's controller (agents/controller.py)
    controller_interval_s: float = 1.0
    bucket_s: float = DEFAULT_BUCKET_S
    windows: tuple[Window, ...] = tuple(parse_window(w) for w in DEFAULT_WINDOWS)
    drift_alpha: float = 1e-3
    drift_min_effect: float = 0.0
    expect_traffic: bool = True
    version: int = 0
    #: per-device quota (None: none; then device ids are optional)
    device_quota: DeviceQuota | None = None
    schema_source: str = ""
    #: the family's ``params:`` (validated by its ``from_config``)
    params: Mapping[str, Any] = field(default_factory=dict)
    _mech: list = field(default_factory=list, init=False, repr=False, compare=False)

    @property
    def topic(self) -> str:
        return REPORTS_TOPIC_PREFIX + self.id

    @property
    def policy(self) -> BucketPolicy:
        """How reports are bucketed in time and which windows are estimated."""
        return BucketPolicy(self.bucket_s, self.windows)

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
        if not self._mech:
            self._mech.append(self.mechanism())
        return self._mech[0].tensors(self.marginals)


@dataclass(frozen=True)
class AppConfig:
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
    :class:`ConfigError` naming it (``<path>.params.<field>``)."""
    path = path or f"collections[{collection.id}]"
    try:
        cls = mechanism_class(collection.mechanism_name)
    except ValueError as exc:
        raise ConfigError(f"{path}.mechanism: {exc}") from None
    try:
        return cls.from_config(collection.domain, collection.params, epsilon=collection.epsilon,
                               epsilon_scope=collection.epsilon_scope, version=collection.version)
    except ParamError as exc:
        raise ConfigError(f"{path}.params.{exc}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: cannot build mechanism {collection.mechanism_name!r}: "
                          f"{exc}") from None


def _unservable(mech: Mechanism, marginals: Sequence[tuple[str, ...]], estimators: Sequence[str],
                path: str) -> list[str]:
    """One error per (marginal, estimator) pair the mechanism cannot serve, with its reason."""
    out = []
    for attrs in marginals:
        for method in estimators:
            why = mech.check_marginal(attrs, method)
            if why is not None:
                out.append(f"{path}.marginals: {mech.name} cannot serve {list(attrs)} with "
                           f"{method}: {why}")
    return out


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
    ``base_dir``).

    Every problem is reported (``ConfigError.errors``): the type errors of every field, and the
    semantic checks (id syntax, schema, unknown attributes in marginals, unknown mechanism or
    estimator, drift history size, duplicate ids) of every collection on the fields that passed
    their type check — a check that needs a field with a type error is skipped."""
    env = os.environ if env is None else env
    if not isinstance(data, Mapping):
        raise ConfigError(f"(top level): must be a mapping with 'collections' (got "
                          f"{type(data).__name__})")
    if "api_token" in data:
        raise ConfigError("api_token: never put the token in the file; set LDP_API_TOKEN")
    app: _AppFile | None
    try:
        app = _AppFile.model_validate(data)
        type_errors: list[Mapping[str, Any]] = []
    except ValidationError as exc:
        app, type_errors = None, exc.errors()
    # type errors not inside one collection first (top level, ingest, an empty list), then per
    # collection: its type errors, then its semantic errors
    per_coll: dict[int, list[Mapping[str, Any]]] = {}
    errors: list[str] = []
    for e in type_errors:
        loc = tuple(e.get("loc", ()))
        if len(loc) >= 2 and loc[0] == "collections" and isinstance(loc[1], int):
            per_coll.setdefault(loc[1], []).append(e)
        else:
            errors.append(_format_error(e))
    raw_colls = data.get("collections")
    collections: dict[str, Collection] = {}
    seen_ids: set[str] = set()
    for i, raw in enumerate(raw_colls if isinstance(raw_colls, list) else []):
        path = f"collections[{i}]"
        mine = per_coll.get(i, [])
        errors.extend(_format_error(e) for e in mine)
        if not isinstance(raw, Mapping) or any(len(e["loc"]) == 2 for e in mine):
            continue  # the collection itself is not a mapping: nothing to check inside
        bad = {str(e["loc"][2]) for e in mine}
        coll_errors: list[str] = []
        coll = _build_collection(_collection_values(raw, bad), path, Path(base_dir), coll_errors)
        errors.extend(coll_errors)
        cid = raw.get("id") if "id" not in bad else None
        if isinstance(cid, str) and _ID_RE.match(cid):
            if cid in seen_ids:
                errors.append(f"{path}.id: duplicate collection id {cid!r}")
                continue
            seen_ids.add(cid)
        if coll is not None:
            collections[coll.id] = coll
    from .agents.redis_client import RedisUrlError, redis_url_from_env  # imports redis-py

    try:
        redis_url = redis_url_from_env(env)
    except RedisUrlError as exc:
        errors.append(str(exc))
    if errors or app is None:
        raise ConfigError(errors or ["(top level): invalid config"])
    ing = app.ingest
    return AppConfig(collections=collections,
                     ingest=IngestConfig(ing.batch_reports, float(ing.batch_seconds),
                                         ing.max_message_bytes),
                     api_token=env.get("LDP_API_TOKEN") or None,
                     kafka_bootstrap=env.get("KAFKA_BOOTSTRAP_SERVERS") or None,
                     redis_url=redis_url,
                     source=source)


def _device_quota(raw: Any) -> DeviceQuota | None:
    if raw is None:
        return None
    q = raw if isinstance(raw, _DeviceQuotaFile) else _DeviceQuotaFile.model_validate(raw)
    return DeviceQuota(int(q.reports), float(q.window_s))


def _collection_values(raw: Mapping[str, Any], bad: set[str]) -> dict[str, Any]:
    """The collection's fields for the semantic checks: the file's values of the fields that
    passed their type check, defaults for omitted optional ones; fields in ``bad`` (a type error)
    and missing required ones are absent."""
    out: dict[str, Any] = {}
    for name, f in _CollectionFile.model_fields.items():
        key = f.alias or name
        if key in bad:
            continue
        if key in raw:
            out[key] = raw[key]
        elif not f.is_required():
            out[key] = f.get_default(call_default_factory=True)
    return out


def _build_collection(v: Mapping[str, Any], path: str, base_dir: Path,
                      errors: list[str]) -> Collection | None:
    """Run every semantic check whose fields are present in ``v`` (see
    :func:`_collection_values`), appending problems to ``errors``; the :class:`Collection` when
    every field is present and valid, else None."""
    n_errors = len(errors)

    def check(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except ConfigError as exc:
            errors.extend(exc.errors)
            return None

    if "id" in v and not _ID_RE.match(v["id"]):
        errors.append(f"{path}.id: must match [A-Za-z0-9][A-Za-z0-9_.-]* (at most 64 "
                      f"characters; got {v['id']!r})")
    domain = source = None
    if "schema" in v:
        schema = v["schema"] if isinstance(v["schema"], _SchemaFile) else \
            _SchemaFile.model_validate(v["schema"])
        domain, source = check(_domain, schema, f"{path}.schema", base_dir) or (None, None)
    marginals = None
    if domain is not None and "marginals" in v:
        marginals = check(_marginals, v["marginals"], domain, f"{path}.marginals")
    if "mechanism" in v:
        try:
            cls: type[Mechanism] | None = mechanism_class(v["mechanism"])
        except ValueError as exc:
            errors.append(f"{path}.mechanism: {exc}")
            cls = None
        if cls is not None and "estimators" in v:
            allowed = cls.estimators
            for j, est in enumerate(v["estimators"]):
                if est not in allowed:
                    errors.append(f"{path}.estimators[{j}]: unknown estimator {est!r} for "
                                  f"{v['mechanism']} (known: {', '.join(allowed)})"
                                  f"{did_you_mean(est, allowed)}")
            if len(set(v["estimators"])) != len(v["estimators"]):
                errors.append(f"{path}.estimators: lists an estimator twice")
    windows = None
    if "windows" in v and "bucket_s" in v:
        windows = check(_windows, v["windows"], float(v["bucket_s"]), f"{path}.windows")
    names = [f.alias or n for n, f in _CollectionFile.model_fields.items()]
    if len(errors) > n_errors or marginals is None or windows is None or \
            any(k not in v for k in names):
        return None
    coll = Collection(id=v["id"], domain=domain, mechanism_name=v["mechanism"],
                      epsilon=float(v["epsilon"]), epsilon_scope=v["epsilon_scope"],
                      marginals=marginals, estimators=list(v["estimators"]),
                      partitions=v["partitions"], refresh_interval_s=float(v["refresh_interval_s"]),
                      controller_interval_s=float(v["controller_interval_s"]),
                      bucket_s=float(v["bucket_s"]), windows=windows,
                      drift_alpha=float(v["drift_alpha"]),
                      drift_min_effect=float(v["drift_min_effect"]),
                      expect_traffic=v["expect_traffic"], version=v["version"],
                      device_quota=_device_quota(v["device_quota"]),
                      schema_source=source, params=dict(v["params"]))
    try:
        mech = build_mechanism(coll, path)
    except ConfigError as exc:
        errors.extend(exc.errors)
        return None
    unservable = _unservable(mech, marginals, coll.estimators, path)
    if unservable:
        errors.extend(unservable)
        return None
    coll._mech.append(mech)
    return coll


#: the most coarse buckets one window may span (a refresh reads at most twice this many per
#: shard and version, plus the fine buckets at the edges)
MAX_COARSE_PER_WINDOW = 10_000


def _windows(names: Sequence[str], bucket_s: float, path: str) -> tuple[Window, ...]:
    """Parse ``windows`` (durations or ``all``): each a whole number of buckets, no duplicates,
    at most :data:`MAX_COARSE_PER_WINDOW` coarse buckets long."""
    out: list[Window] = []
    errors: list[str] = []
    for j, name in enumerate(names):
        try:
            w = parse_window(name)
        except ValueError as exc:
            errors.append(f"{path}[{j}]: {exc}")
            continue
        if any(o.name == w.name or (o.seconds == w.seconds) for o in out):
            errors.append(f"{path}[{j}]: window {name!r} is listed twice")
            continue
        if w.seconds is not None:
            q = w.seconds / bucket_s
            if abs(q - round(q)) > 1e-9 or round(q) < 1:
                errors.append(f"{path}[{j}]: {name} is not a whole number of buckets of "
                              f"bucket_s = {_got(bucket_s)} s")
                continue
            policy = BucketPolicy(bucket_s, (w,))
            if w.seconds / policy.coarse_s > MAX_COARSE_PER_WINDOW:
                errors.append(f"{path}[{j}]: {name} spans more than {MAX_COARSE_PER_WINDOW} "
                              f"coarse buckets of {_got(policy.coarse_s)} s; raise bucket_s")
                continue
        out.append(w)
    if errors:
        raise ConfigError(errors)
    return tuple(out)


def _domain(schema: _SchemaFile, path: str, base_dir: Path) -> tuple[Domain, str]:
    if schema.attributes is not None:
        cats: dict[str, list[str]] = {}
        for name, values in schema.attributes.items():
            p = f"{path}.attributes.{name}"
            if not name.strip() or "|" in name:
                raise ConfigError(f"{p}: attribute names must be non-empty and contain no '|'")
            out = []
            for k, v in enumerate(values):
                if isinstance(v, bool) or v is None:
                    raise ConfigError(f"{p}[{k}]: category must be a string (got {v!r}; quote it: "
                                      f"YAML reads yes/no/on/off/null as non-strings)")
                if not isinstance(v, (str, int, float)):
                    raise ConfigError(f"{p}[{k}]: category must be a string (got {v!r})")
                out.append(str(v))
            if len(out) < 2:
                raise ConfigError(f"{p}: needs at least 2 categories (got {len(out)})")
            dup = next((c for c in out if out.count(c) > 1), None)
            if dup is not None:
                raise ConfigError(f"{p}: category {dup!r} is listed twice")
            cats[name] = out
        return Domain.from_categories(cats), "attributes"
    csv = schema.csv
    assert csv is not None
    if csv.path is None:
        file = adult_path()
        columns = tuple(csv.columns) if csv.columns is not None else ADULT_COLUMNS
    else:
        file = Path(csv.path) if Path(csv.path).is_absolute() else base_dir / csv.path
        if csv.columns is None:
            raise ConfigError(f"{path}.csv.columns: required when csv.path is given")
        columns = tuple(csv.columns)
    try:
        return _load_domain(str(file), columns), f"csv:{file}"
    except DatasetError as exc:
        field_ = "columns" if "column" in str(exc) and "unknown column" in str(exc) else "path"
        raise ConfigError(f"{path}.csv.{field_}: {exc}") from None


_DOMAIN_CACHE: dict[tuple[str, tuple[str, ...], float], Domain] = {}


def _load_domain(file: str, columns: tuple[str, ...]) -> Domain:
    try:
        mtime = os.stat(file).st_mtime
    except OSError:
        mtime = -1.0
    key = (file, columns, mtime)
    if key not in _DOMAIN_CACHE:
        _DOMAIN_CACHE[key] = load_csv(file, columns).domain
    return _DOMAIN_CACHE[key]


def _marginals(spec: Any, domain: Domain, path: str) -> list[tuple[str, ...]]:
    attrs = domain.attrs
    if isinstance(spec, Mapping):
        extra = [k for k in spec if k != "all_ways_up_to"]
        if extra:
            raise ConfigError(f"{path}.{extra[0]}: unknown field (allowed: all_ways_up_to)")
        if "all_ways_up_to" not in spec:
            raise ConfigError(f"{path}.all_ways_up_to: required field missing")
        w = spec["all_ways_up_to"]
        if isinstance(w, bool) or not isinstance(w, int) or not 2 <= w <= len(attrs):
            raise ConfigError(f"{path}.all_ways_up_to: must be an integer in 2..{len(attrs)} "
                              f"(the number of attributes; got {w!r})")
        return [c for k in range(2, w + 1) for c in itertools.combinations(attrs, k)]
    if not isinstance(spec, list) or not spec:
        raise ConfigError(f"{path}: must be a non-empty list of attribute lists or "
                          f"{{all_ways_up_to: W}} (got {spec!r})")
    out: list[tuple[str, ...]] = []
    errors: list[str] = []
    for j, m in enumerate(spec):
        p = f"{path}[{j}]"
        if isinstance(m, str):
            m = [m]
        if not isinstance(m, list) or not m or not all(isinstance(a, str) for a in m):
            errors.append(f"{p}: must be a non-empty list of attribute names (got {m!r})")
            continue
        unknown = [a for a in m if a not in attrs]
        if unknown:
            errors.append(f"{p}: unknown attribute{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(repr(a) for a in unknown)} (attributes: "
                          f"{', '.join(attrs)}){did_you_mean(unknown[0], attrs)}")
        elif len(set(m)) != len(m):
            errors.append(f"{p}: lists an attribute twice ({m})")
        elif tuple(m) not in out:
            out.append(tuple(m))
    if errors:
        raise ConfigError(errors)
    return out


# --- pydantic error → "path: message" -------------------------------------------------------------

def _loc(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _allowed_at(loc: Sequence[Any]) -> str:
    """The field names of the file model at ``loc`` (for "unknown field" errors)."""
    model: Any = _AppFile
    for part in loc:
        if isinstance(part, int):
            continue
        field_ = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        model = None if field_ is None else _model_in(field_.annotation)
        if model is None:
            return "?"
    return ", ".join(f.alias or n for n, f in model.model_fields.items())


def _model_in(tp: Any) -> Any:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    for arg in typing.get_args(tp):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _got(v: Any) -> str:
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return str(int(v))
    return repr(v) if isinstance(v, str) else str(v)


def _format_error(e: Mapping[str, Any]) -> str:
    loc = list(e.get("loc", ()))
    typ = e.get("type", "")
    ctx = e.get("ctx") or {}
    inp = e.get("input")
    if typ == "extra_forbidden":
        allowed = _allowed_at(loc[:-1])
        return (f"{_loc(loc)}: unknown field (allowed: {allowed})"
                f"{did_you_mean(loc[-1], allowed.split(', '))}")
    where = _loc(loc)
    if typ == "missing":
        return f"{where}: required field missing"
    bounds = {"greater_than": (">", "gt"), "greater_than_equal": (">=", "ge"),
              "less_than": ("<", "lt"), "less_than_equal": ("<=", "le")}
    if typ in bounds:
        op, key = bounds[typ]
        bound = ctx.get(key)
        kind = "a number" if isinstance(bound, float) else "an integer"
        return f"{where}: must be {kind} {op} {_got(bound)} (got {_got(inp)})"
    if typ in ("float_type", "float_parsing", "finite_number"):
        return f"{where}: must be a finite number (got {_got(inp)})"
    if typ in ("int_type", "int_parsing", "int_from_float"):
        return f"{where}: must be an integer (got {_got(inp)})"
    if typ in ("bool_type", "bool_parsing"):
        return f"{where}: must be true or false (got {_got(inp)})"
    if typ in ("string_type",):
        return f"{where}: must be a string (got {_got(inp)})"
    if typ in ("list_type",):
        return f"{where}: must be a list (got {_got(inp)})"
    if typ in ("dict_type", "model_type", "model_attributes_type"):
        return f"{where}: must be a mapping (got {_got(inp)})"
    if typ == "literal_error":
        return f"{where}: must be one of {ctx.get('expected')} (got {_got(inp)})"
    if typ == "too_short":
        return f"{where}: must not be empty"
    msg = str(e.get("msg", "invalid"))
    return f"{where}: {msg[0].lower() + msg[1:] if msg else 'invalid'}"
