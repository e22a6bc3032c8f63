"""Collections config: a YAML or TOML file (by extension) validated into :class:`AppConfig`.

Every error is a :class:`ConfigError` whose message starts with the path of the offending field,
e.g. ``collections[0].epsilon: must be a number > 0 (got -1)``. Unknown fields, unknown attribute
names in marginals and unknown mechanism / estimator names are rejected, naming them.

File layout (YAML; TOML has the same keys)::

    ingest: {batch_reports: 20000, batch_seconds: 0.5, max_message_bytes: 1048576}   # optional
    collections:
      - id: adult                         # [A-Za-z0-9][A-Za-z0-9_.-]*, topic ldp.reports.<id>
        schema:
          csv: {path: adult.csv, columns: [sex, Salary]}   # path relative to this file;
                                                         # no path = bundled UCI Adult
          # or: attributes: {sex: [Female, Male], Salary: ["<=50K", ">50K"]}
        mechanism: rr-ind
        epsilon: 2                        # per attribute (epsilon_scope: attribute, default)
        epsilon_scope: attribute          # or record: epsilon is split evenly over attributes
        partitions: 4
        marginals: [[sex, Salary], [race, sex]]      # or {all_ways_up_to: 3}
        estimators: [castell, truncated]
        refresh_interval_s: 5
        drift_window_s: 60
        drift_threshold: 0.05
        expect_traffic: true
        version: 0

The API token, Kafka bootstrap and Redis URL never come from the file: ``LDP_API_TOKEN``,
``KAFKA_BOOTSTRAP_SERVERS``, ``REDIS_URL`` (unset = embedded services).
"""
from __future__ import annotations

import itertools
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from .agents.store import MAX_HISTORY_CAP, history_cap_for
from .cli import CliError
from .datasets import ADULT_COLUMNS, DatasetError, adult_path, load_csv
from .estimators.domain import Domain
from .estimators.mechanism import MECHANISMS, PROVIDERS, Mechanism, TensorSpec, mechanism_class

__all__ = ["ConfigError", "AppConfig", "IngestConfig", "Collection", "load_config",
           "parse_config", "build_mechanism", "default_config_path", "REPORTS_TOPIC_PREFIX",
           "DLQ_TOPIC", "CONFIG_TOPIC", "known_mechanisms"]

REPORTS_TOPIC_PREFIX = "ldp.reports."
DLQ_TOPIC = "ldp.dlq"
CONFIG_TOPIC = "ldp.config"
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
    model_config = ConfigDict(strict=True, frozen=True, allow_inf_nan=False, populate_by_name=False)

    @model_validator(mode="before")
    @classmethod
    def _no_unknown_fields(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            allowed = [f.alias or name for name, f in cls.model_fields.items()]
            extra = [k for k in data if k not in allowed]
            if extra:
                raise PydanticCustomError("unknown_field", "unknown field (allowed: {allowed})",
                                          {"field": str(extra[0]), "allowed": ", ".join(allowed)})
        return data


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


class _CollectionFile(_Strict):
    id: str
    schema_: _SchemaFile = Field(alias="schema")
    mechanism: str = "rr-ind"
    epsilon: Number = Field(gt=0.0)
    epsilon_scope: Literal["attribute", "record"] = "attribute"
    partitions: int = Field(1, ge=1, le=10_000)
    marginals: Any
    estimators: list[str] = Field(default_factory=lambda: ["truncated"], min_length=1)
    refresh_interval_s: Number = Field(5.0, gt=0.0)
    drift_window_s: Number = Field(60.0, gt=0.0)
    drift_threshold: Number = Field(0.05, gt=0.0, le=1.0)
    expect_traffic: bool = True
    version: int = Field(0, ge=0, le=2**32 - 1)


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
class Collection:
    """One collection: schema, mechanism and its parameters, marginals to keep, refresh policy."""

    id: str
    domain: Domain
    mechanism_name: str
    epsilon: float
    epsilon_scope: str
    marginals: list[tuple[str, ...]]
    estimators: list[str]
    partitions: int = 1
    refresh_interval_s: float = 5.0
    drift_window_s: float = 60.0
    drift_threshold: float = 0.05
    expect_traffic: bool = True
    version: int = 0
    schema_source: str = ""
    _mech: list = field(default_factory=list, init=False, repr=False, compare=False)

    @property
    def topic(self) -> str:
        return REPORTS_TOPIC_PREFIX + self.id

    @property
    def epsilon_per_attribute(self) -> float:
        """ε of each attribute's channel: ``epsilon`` (attribute scope) or ``epsilon / m``."""
        return self.epsilon if self.epsilon_scope == "attribute" else self.epsilon / len(self.domain)

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

def known_mechanisms(name: str | None = None) -> dict[str, type[Mechanism]]:
    """The mechanism registry, with ``name``'s module imported (all of them when ``name`` is
    None). An unknown ``name`` is simply absent from the result."""
    for n in ([name] if name is not None else list(PROVIDERS)):
        try:
            mechanism_class(n)
        except ValueError:
            pass
    return MECHANISMS


def build_mechanism(collection: Collection) -> Mechanism:
    """Construct the collection's mechanism from the registry. ``rr-ind``: one GRR channel per
    attribute with ε = :attr:`Collection.epsilon_per_attribute` [Castell §III; MDRR Protocol 1]."""
    cls = known_mechanisms(collection.mechanism_name).get(collection.mechanism_name)
    if cls is None:
        raise ConfigError(f"collections[{collection.id}].mechanism: unknown mechanism "
                          f"{collection.mechanism_name!r}")
    eps = collection.epsilon_per_attribute
    if collection.mechanism_name == "rr-ind":
        return cls(collection.domain, epsilon=eps, version=collection.version)  # type: ignore[call-arg]
    if collection.mechanism_name == "rr-joint":
        return cls(collection.domain, [eps] * len(collection.domain),  # type: ignore[call-arg]
                   version=collection.version)
    try:  # other families: the common (domain, epsilon=, version=) signature, if they have it
        return cls(collection.domain, epsilon=eps, version=collection.version)  # type: ignore[call-arg]
    except TypeError as exc:
        raise ConfigError(f"collections[{collection.id}].mechanism: {collection.mechanism_name!r} "
                          f"cannot be built from this config yet ({exc})") from None


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
    ``base_dir``)."""
    env = os.environ if env is None else env
    if not isinstance(data, Mapping):
        raise ConfigError(f"(top level): must be a mapping with 'collections' (got "
                          f"{type(data).__name__})")
    if "api_token" in data:
        raise ConfigError("api_token: never put the token in the file; set LDP_API_TOKEN")
    try:
        app = _AppFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([_format_error(e) for e in exc.errors()]) from None
    errors: list[str] = []
    collections: dict[str, Collection] = {}
    for i, cf in enumerate(app.collections):
        path = f"collections[{i}]"
        try:
            coll = _build_collection(cf, path, Path(base_dir))
        except ConfigError as exc:
            errors.extend(exc.errors)
            continue
        if coll.id in collections:
            errors.append(f"{path}.id: duplicate collection id {coll.id!r}")
            continue
        collections[coll.id] = coll
    if errors:
        raise ConfigError(errors)
    ing = app.ingest
    return AppConfig(collections=collections,
                     ingest=IngestConfig(ing.batch_reports, float(ing.batch_seconds),
                                         ing.max_message_bytes),
                     api_token=env.get("LDP_API_TOKEN") or None,
                     kafka_bootstrap=env.get("KAFKA_BOOTSTRAP_SERVERS") or None,
                     redis_url=env.get("REDIS_URL") or None,
                     source=source)


def _build_collection(cf: _CollectionFile, path: str, base_dir: Path) -> Collection:
    if not _ID_RE.match(cf.id):
        raise ConfigError(f"{path}.id: must match [A-Za-z0-9][A-Za-z0-9_.-]* (at most 64 "
                          f"characters; got {cf.id!r})")
    domain, source = _domain(cf.schema_, f"{path}.schema", base_dir)
    marginals = _marginals(cf.marginals, domain, f"{path}.marginals")
    mechs = known_mechanisms(cf.mechanism)
    if cf.mechanism not in mechs:
        raise ConfigError(f"{path}.mechanism: unknown mechanism {cf.mechanism!r} (known: "
                          f"{', '.join(sorted(mechs))})")
    allowed = tuple(getattr(mechs[cf.mechanism], "estimators", ()))
    for j, est in enumerate(cf.estimators):
        if est not in allowed:
            raise ConfigError(f"{path}.estimators[{j}]: unknown estimator {est!r} for "
                              f"{cf.mechanism} (known: {', '.join(allowed)})")
    if len(set(cf.estimators)) != len(cf.estimators):
        raise ConfigError(f"{path}.estimators: lists an estimator twice")
    _check_drift_history(cf.drift_window_s, cf.refresh_interval_s, path)
    coll = Collection(id=cf.id, domain=domain, mechanism_name=cf.mechanism,
                      epsilon=float(cf.epsilon), epsilon_scope=cf.epsilon_scope,
                      marginals=marginals, estimators=list(cf.estimators),
                      partitions=cf.partitions, refresh_interval_s=float(cf.refresh_interval_s),
                      drift_window_s=float(cf.drift_window_s),
                      drift_threshold=float(cf.drift_threshold),
                      expect_traffic=cf.expect_traffic, version=cf.version, schema_source=source)
    try:
        mech = build_mechanism(coll)
        coll._mech.append(mech)
    except ConfigError as exc:
        raise ConfigError(f"{path}.mechanism: " + str(exc).split(": ", 1)[-1]) from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: cannot build mechanism {cf.mechanism!r}: {exc}") from None
    return coll


def _check_drift_history(window: float, interval: float, path: str) -> None:
    """Drift compares with an estimate ``drift_window_s`` old, so the history keeps
    :func:`~ldpstream.agents.store.history_cap_for` entries per marginal and estimator; more than
    ``MAX_HISTORY_CAP`` is refused rather than kept unbounded (or capped, which would silently
    turn drift off)."""
    cap = history_cap_for(window, interval)
    if cap > MAX_HISTORY_CAP:
        most = (MAX_HISTORY_CAP - 4) // 2
        raise ConfigError(f"{path}.drift_window_s: must be at most {most} × refresh_interval_s "
                          f"(got {_got(window)} s with refresh_interval_s {_got(interval)}: drift "
                          f"would need {cap} past estimates per marginal and estimator, the limit "
                          f"is {MAX_HISTORY_CAP}); shorten drift_window_s or raise "
                          f"refresh_interval_s")


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
    for j, m in enumerate(spec):
        p = f"{path}[{j}]"
        if isinstance(m, str):
            m = [m]
        if not isinstance(m, list) or not m or not all(isinstance(a, str) for a in m):
            raise ConfigError(f"{p}: must be a non-empty list of attribute names (got {m!r})")
        unknown = [a for a in m if a not in attrs]
        if unknown:
            raise ConfigError(f"{p}: unknown attribute{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(repr(a) for a in unknown)} (attributes: "
                              f"{', '.join(attrs)})")
        if len(set(m)) != len(m):
            raise ConfigError(f"{p}: lists an attribute twice ({m})")
        t = tuple(m)
        if t not in out:
            out.append(t)
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


def _got(v: Any) -> str:
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return str(int(v))
    return repr(v) if isinstance(v, str) else str(v)


def _format_error(e: Mapping[str, Any]) -> str:
    loc = list(e.get("loc", ()))
    typ = e.get("type", "")
    ctx = e.get("ctx") or {}
    inp = e.get("input")
    if typ == "unknown_field":
        return f"{_loc(loc + [ctx['field']])}: unknown field (allowed: {ctx['allowed']})"
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
