"""The one interface every mechanism family implements (construction, channel/ε, randomize,
count layout, adaptive step, estimate), so the pipeline (producers → agents → estimators) and
``ldpstream simulate`` are written once.

A mechanism is a value: its parameters and any adaptive state (RRBA tables, Corr-RR phase and p_y
tables, RR-Clusters clusters, LoPub hash seeds) are captured by :meth:`Mechanism.state`, a
JSON-serializable dict carrying a ``version``; :meth:`Mechanism.from_state` rebuilds it and
:meth:`Mechanism.from_config` builds version 0 from a collection's config. Reports are rows of
small non-negative integers (``report_width`` of them, each below ``report_bounds()[i]``).

The adaptive loop, the same offline and on the stream::

    counts[v] += mech.count(mech.randomize(block, rng), mech.tensors(marginals))  # v = mech.version
    new = mech.adapt(counts)              # None: keep collecting; else the next version
    est = mech.estimate_versions(counts, attrs, method)   # combines every accepted version

``counts`` is a :data:`VersionedCounts` (version → tensor key → int64 counts). Static families
never adapt and accept their one version.
"""
from __future__ import annotations

import importlib
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Mapping, Sequence, TypeAlias

import numpy as np

from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.bounds import Bound
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.stream.longitudinal import Guarantee, Memoize
from ldpstream.suggest import did_you_mean


@dataclass(frozen=True)
class TensorSpec:
    """One count tensor kept by the server: a stable ``key``, named ``axes`` and their sizes.

    For a plain marginal, ``axes`` are attribute names and ``columns`` the report columns counted.
    """

    key: str
    axes: tuple[str, ...]
    shape: tuple[int, ...]
    columns: tuple[int, ...] = ()
    #: what of the channel behind the counts the key and shape do not say ("": nothing), so
    #: that counts of another channel are kept apart (agents/store/layout.py)
    channel: str = ""

    @property
    def size(self) -> int:
        return math.prod(int(x) for x in self.shape)


@dataclass(frozen=True)
class Estimate:
    """An estimated distribution with what it cost and how good it is.

    ``bound``: the calibrated bound (estimators/kernels/bounds.py) when the family has one, then
    ``error_bound`` is ``bound.tvd``, an upper quantile of the TVD at ``bound.level``;
    otherwise ``error_bound`` is an expected TVD (or None). ``projected``: for an unbiased
    (raw) ``factor``, its projection onto the simplex, the form served by default, which
    carries the same bound."""

    factor: Factor
    method: str
    n: int
    epsilon: float
    error_bound: float | None = None
    iterations: int | None = None
    converged: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    bound: Bound | None = None
    projected: Factor | None = None


@dataclass(frozen=True)
class DriftTerms:
    """A family's own drift test of one estimate (:meth:`Mechanism.drift_terms`): per tested
    quantity (``names``) its value in the current and the previous window, the variance of each
    under "no change" (both windows sample one population), the size of its change as a share
    (``effect``, in [0, 1], compared with ``drift_min_effect``) and what the answer says about
    it (``detail``, JSON-ready, one dict per quantity)."""

    names: tuple[str, ...]
    cur: np.ndarray
    cur_var: np.ndarray
    prev: np.ndarray
    prev_var: np.ndarray
    effect: np.ndarray
    detail: tuple[dict[str, Any], ...] = ()


#: mechanism version → tensor key → int64 counts
VersionedCounts: TypeAlias = Mapping[int, Mapping[str, np.ndarray]]


class ParamError(ValueError):
    """A bad mechanism parameter; ``field`` names it inside the collection's ``params:``."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


class Params:
    """Typed reads of a family's ``params:`` mapping; every error is a :class:`ParamError`
    naming the field, and :meth:`done` rejects fields the family did not read."""

    def __init__(self, family: str, params: Mapping[str, Any] | None) -> None:
        if params is not None and not isinstance(params, Mapping):
            raise ParamError("(params)", f"must be a mapping (got {type(params).__name__})")
        self.family = family
        self.raw = dict(params or {})
        self.read: list[str] = []

    def has(self, name: str) -> bool:
        if name not in self.read:
            self.read.append(name)
        return name in self.raw and self.raw[name] is not None

    def number(self, name: str, default: float | None, *, gt: float | None = None,
               ge: float | None = None, lt: float | None = None,
               le: float | None = None) -> float | None:
        if not self.has(name):
            return default
        v = self.raw[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
            raise ParamError(name, f"must be a finite number (got {v!r})")
        for bound, ok, op in ((gt, lambda b: v > b, ">"), (ge, lambda b: v >= b, ">="),
                              (lt, lambda b: v < b, "<"), (le, lambda b: v <= b, "<=")):
            if bound is not None and not ok(bound):
                raise ParamError(name, f"must be {op} {bound:g} (got {v!r})")
        return float(v)

    def integer(self, name: str, default: int | None, *, ge: int | None = None,
                le: int | None = None) -> int | None:
        if not self.has(name):
            return default
        v = self.raw[name]
        if isinstance(v, bool) or not isinstance(v, int):
            raise ParamError(name, f"must be an integer (got {v!r})")
        if ge is not None and v < ge:
            raise ParamError(name, f"must be an integer >= {ge} (got {v})")
        if le is not None and v > le:
            raise ParamError(name, f"must be an integer <= {le} (got {v})")
        return int(v)

    def flag(self, name: str, default: bool) -> bool:
        if not self.has(name):
            return default
        v = self.raw[name]
        if not isinstance(v, bool):
            raise ParamError(name, f"must be true or false (got {v!r})")
        return v

    def choice(self, name: str, default: str | None, options: Sequence[str]) -> str | None:
        if not self.has(name):
            return default
        v = self.raw[name]
        if v not in options:
            raise ParamError(name, f"must be one of {', '.join(options)} (got {v!r})")
        return str(v)

    def value(self, name: str) -> Any:
        """The raw value (None when absent), for structured fields the family checks itself."""
        return self.raw[name] if self.has(name) else None

    def done(self) -> None:
        unknown = [k for k in self.raw if k not in self.read]
        if unknown:
            allowed = ", ".join(self.read) or "none"
            raise ParamError(unknown[0], f"unknown parameter for {self.family} (allowed: "
                                         f"{allowed})")


#: ε when neither the config nor the family's parameters fix it (``simulate`` without --epsilon)
DEFAULT_EPSILON = 1.0


def record_budget(epsilon: float | None, epsilon_scope: str, m: int) -> float:
    """The ε of one whole record from a config's ``epsilon`` (None: :data:`DEFAULT_EPSILON`):
    itself for ``record`` scope, m·ε for ``attribute`` scope (every attribute gets ε)."""
    _check_scope(epsilon_scope)
    eps = DEFAULT_EPSILON if epsilon is None else float(epsilon)
    return eps if epsilon_scope == "record" else eps * m


def attribute_budget(epsilon: float | None, epsilon_scope: str, m: int) -> float:
    """The ε of each attribute's channel: ε (``attribute``) or ε/m (``record``)."""
    _check_scope(epsilon_scope)
    eps = DEFAULT_EPSILON if epsilon is None else float(epsilon)
    return eps if epsilon_scope == "attribute" else eps / m


def _check_scope(scope: str) -> None:
    if scope not in ("attribute", "record"):
        raise ValueError(f"epsilon_scope must be 'attribute' or 'record', got {scope!r}")


def histogram(reports: np.ndarray, columns: Sequence[int], shape: Sequence[int]) -> np.ndarray:
    """Dense count tensor of the given report columns (vectorized; int64)."""
    shape = tuple(int(s) for s in shape)
    if len(reports) == 0:
        return np.zeros(shape, dtype=np.int64)
    flat = np.ravel_multi_index(tuple(reports[:, c].astype(np.intp) for c in columns), shape)
    return np.bincount(flat, minlength=int(np.prod(shape))).reshape(shape).astype(np.int64)


def marginal_key(attrs: Sequence[str]) -> str:
    """Canonical tensor key of a marginal: ``m:`` + attribute names joined by ``|``."""
    return "m:" + "|".join(attrs)


def marginal_tensors(domain: Domain, marginals: Sequence[Sequence[str]],
                     sizes: Sequence[int]) -> list[TensorSpec]:
    """One count tensor per distinct marginal, over the report columns of its attributes, each
    axis ``sizes[column]`` cells (the report's alphabet per column)."""
    out, seen = [], set()
    for attrs in marginals:
        attrs = tuple(attrs)
        key = marginal_key(attrs)
        if key in seen:
            continue
        seen.add(key)
        cols = domain.axes(attrs)
        out.append(TensorSpec(key, attrs, tuple(int(sizes[c]) for c in cols), cols))
    return out


class CountBook(dict):
    """:data:`VersionedCounts` that also keeps the running total over every version, so that
    families whose versions share one count layout (RRBA: hundreds of block versions) combine
    them in O(1) at each adaptive step. :meth:`add` is the only way to count into it."""

    def __init__(self) -> None:
        super().__init__()
        self.total: dict[str, np.ndarray] = {}

    def add(self, version: int, counts: Mapping[str, np.ndarray]) -> None:
        mine = self.setdefault(int(version), {})
        for k, t in counts.items():
            t = np.asarray(t, dtype=np.int64)
            mine[k] = mine[k] + t if k in mine else t.copy()
            self.total[k] = self.total[k] + t if k in self.total else t.copy()


@dataclass(frozen=True)
class Memoization:
    """Memoized responses (estimators/stream/longitudinal.py, docs/mechanisms.md §8): a device
    answers with the permanent response it drew in the current period (``rule``) for each of
    its memo units, then ``instantaneous`` randomizes the permanent responses afresh per report.

    ``unit`` says what one memo holds: ``attribute`` (``permanent[j]`` randomizes attribute j,
    memoized per value), ``cluster`` (``permanent[c]`` one cluster's joint cell) or
    ``marginal`` (partitioned: the assigned marginal's oracle code, the marginal fixed per
    device and period). ``epsilons``: the permanent ε of every unit (default: of
    ``permanent``); ``draw(records, device_ids, period, rng)``: the permanent responses of
    devices holding ``records`` in rotation ``period`` (default: attribute j through
    ``permanent[j]``)."""

    rule: Memoize
    permanent: Sequence[np.ndarray]
    instantaneous: Callable[[np.ndarray, np.random.Generator], np.ndarray]
    unit: Literal["attribute", "cluster", "marginal"] = "attribute"
    epsilons: tuple[float, ...] = ()
    draw: Callable[[np.ndarray, np.ndarray, int, np.random.Generator], np.ndarray] | None = None

    def unit_epsilons(self) -> tuple[float, ...]:
        """The permanent ε of every memo unit."""
        return self.epsilons or tuple(ch.epsilon(P) for P in self.permanent)

    def responses(self, records: np.ndarray, device_ids: np.ndarray, period: int,
                  rng: np.random.Generator) -> np.ndarray:
        """The permanent responses of one rotation period (rows of ``records``)."""
        if self.draw is not None:
            return self.draw(records, device_ids, period, rng)
        out = np.empty(np.shape(records), dtype=np.int64)
        for j, P in enumerate(self.permanent):
            out[:, j] = ch.randomize(np.asarray(records)[:, j], P, rng)
        return out


class Mechanism(ABC):
    """A multi-attribute LDP mechanism family."""

    name: ClassVar[str]
    #: estimator names accepted by :meth:`estimate`
    estimators: ClassVar[tuple[str, ...]]
    #: estimators that need whole reports (:meth:`estimate_reports`; ``simulate`` only)
    report_estimators: ClassVar[tuple[str, ...]] = ()
    #: what ``simulate`` runs when no estimator is named (default: the first estimator)
    default_estimators: ClassVar[tuple[str, ...]] = ()
    #: the family overrides :meth:`adapt` (a worker runs its controller: agents/control/controller.py)
    adaptive: ClassVar[bool] = False
    #: capability: the family randomizes numeric attributes as numbers (docs/numeric.md); the
    #: config refuses a numeric attribute for a family without it
    numeric: ClassVar[bool] = False
    #: capability: the family overrides :meth:`count` (set for it by ``__init_subclass__``); the
    #: worker's fast histogram count (agents/ingest/intake.py) is used only when False
    custom_count: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "count" in cls.__dict__:
            cls.custom_count = True

    def __init__(self, domain: Domain, version: int = 0) -> None:
        self.domain = domain
        self.version = int(version)

    # --- privacy -------------------------------------------------------------------------------
    @property
    @abstractmethod
    def epsilon(self) -> float:
        """ε one report (one record) costs, computed from the channel(s)."""

    def guarantee(self) -> Guarantee:
        """What a device's reports cost over time (default: randomized afresh every report)."""
        return Guarantee.fresh(self.epsilon)

    # --- device side ---------------------------------------------------------------------------
    @property
    @abstractmethod
    def report_width(self) -> int:
        """Number of integers in one report."""

    @abstractmethod
    def report_bounds(self) -> np.ndarray:
        """Exclusive upper bound of every report field (shape ``(report_width,)``)."""

    @abstractmethod
    def randomize(self, records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Randomize true records (``(n, m)`` category indices in domain order) into reports
        (``(n, report_width)``), vectorized."""

    def randomize_device(self, records: np.ndarray, device_ids: np.ndarray,
                         rng: np.random.Generator) -> np.ndarray:
        """:meth:`randomize` for callers that know each record's device id (the device SDK);
        families whose randomization depends on the device (partitioned: which marginal a
        device reports) override it. Default: the ids are not used."""
        return self.randomize(records, rng)

    # --- server side ---------------------------------------------------------------------------
    @abstractmethod
    def tensors(self, marginals: Sequence[Sequence[str]]) -> list[TensorSpec]:
        """The count tensors needed to estimate ``marginals``."""

    def count(self, reports: np.ndarray, specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
        """Count a batch of reports into every tensor of ``specs`` (default: histograms of
        ``spec.columns``)."""
        return {s.key: histogram(reports, s.columns, s.shape) for s in specs}

    @abstractmethod
    def estimate(self, counts: Mapping[str, np.ndarray], attrs: Sequence[str], method: str,
                 **options: Any) -> Estimate:
        """Estimate the marginal over ``attrs`` from count tensors with ``method``."""

    def analytic_variance(self, counts: Mapping[str, np.ndarray], attrs: Sequence[str],
                          method: str) -> np.ndarray | None:
        """Per-cell variance of ``estimate(counts, attrs, method)`` in closed form, shaped like
        its values, where the family has one (the drift test then needs no bootstrap of the
        estimator); None: no closed form (default)."""
        return None

    def drift_terms(self, cur: Mapping[str, np.ndarray], prev: Mapping[str, np.ndarray],
                    attrs: Sequence[str], method: str) -> DriftTerms | None:
        """The quantities the drift test of ``method`` on ``attrs`` compares between two
        windows' counts (:meth:`combined_counts` of each), with their variances under "no
        change", where the family tests something other than the estimate's cells (numeric:
        the mean, the quantiles); None: the cells are compared (default;
        estimators/stream/drift.py)."""
        return None

    def cell_domain(self) -> Domain:
        """The domain the estimates' cells are on (labels of the served cells): the reported
        domain, except where the family counts an attribute on fewer cells (partitioned: a
        numeric attribute on its points, docs/numeric.md)."""
        return self.domain

    def summary_fields(self, est: Estimate) -> dict[str, Any]:
        """Payload fields the family serves beside an estimate's cells (docs/api.md
        "Estimates"; numeric: the mean, quantiles, CDF band and W1 bound under ``numeric``),
        JSON-ready; default none."""
        return {}

    # --- optional capabilities (default: the family does not have it) ---------------------------
    def product_channels(self, attrs: Sequence[str]) -> list[np.ndarray] | None:
        """The channel matrix of each attribute of ``attrs`` when the marginal's reports are
        randomized attribute by attribute, independently, and counted in one table (the batched
        castell/IBU kernels of estimators/kernels/batched.py then apply: estimators/stream/many.py,
        estimators/stream/drift.py); None: not such a mechanism (default)."""
        return None

    def marginal_table(self, counts: Mapping[str, np.ndarray],
                       attrs: Sequence[str]) -> np.ndarray | None:
        """The randomized count table of the marginal ``attrs`` when it is one multinomial
        table that the marginal's estimate reads alone (the drift bootstrap then resamples just
        it: estimators/stream/drift.py); None: the bootstrap resamples every tensor (default)."""
        return None

    def epsilon_per_attribute(self) -> float | None:
        """The largest ε protecting one attribute where attributes are randomized by separate
        channels (ldpstream/privacy.py); None: only the per-record ε applies (default)."""
        return None

    def memoization(self) -> Memoization | None:
        """How devices memoize this mechanism's permanent responses (the device SDK charges the
        ε ledger per new memo: producers/sdk.py); None: every report randomized afresh."""
        return None

    def check_marginal(self, attrs: Sequence[str], method: str) -> str | None:
        """Why this mechanism cannot serve the marginal ``attrs`` with ``method`` from its count
        tensors (None: it can). Config load rejects what this refuses."""
        if method not in self.estimators:
            return (f"{self.name} has no estimator {method!r} (known: "
                    f"{', '.join(self.estimators)})")
        unknown = [a for a in attrs if a not in self.domain.attrs]
        if unknown:
            return f"unknown attribute {unknown[0]!r}"
        return None

    # --- construction ----------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def from_config(cls, domain: Domain, params: Mapping[str, Any] | None, *,
                    epsilon: float | None, epsilon_scope: str = "attribute",
                    version: int = 0) -> "Mechanism":
        """Version ``version`` of the mechanism for a collection: ``epsilon`` per attribute or
        per record (``epsilon_scope``; None: the family's parameters fix ε where they can, else
        :data:`DEFAULT_EPSILON`), family parameters from ``params`` (validated with
        :class:`Params`; a bad or unknown one raises :class:`ParamError` naming it)."""

    @classmethod
    @abstractmethod
    def from_state(cls, state: Mapping[str, Any]) -> "Mechanism":
        """Rebuild from :meth:`state` (what devices and workers read from ``ldp.config``)."""

    # --- the adaptive step -----------------------------------------------------------------------
    def accepted_versions(self) -> tuple[int, ...]:
        """The report versions this state accepts (counted, and combined by
        :meth:`estimate_versions`); reports of other versions go to the dead-letter topic."""
        return (self.version,)

    def adapt(self, counts: VersionedCounts) -> "Mechanism | None":
        """The next state (version + 1) given every accepted version's counts so far, or None to
        keep collecting. Pure. Static families: always None."""
        return None

    def reports_until_adapt(self, counts: VersionedCounts) -> int | None:
        """How many more reports :meth:`adapt` needs before it can change the state (a lower
        bound, ≥ 1), or None when it never will: lets a driver randomize in blocks."""
        return None

    def planned_for(self, n: int) -> "Mechanism":
        """This version-0 state sized for ``n`` expected devices (e.g. the Phase I share of a
        two-phase family, RRBA's table versions); ``simulate`` knows n, a live collection may
        state it in its params. Default: unchanged."""
        return self

    def collecting(self) -> bool:
        """False once the protocol needs no more reports (RRBA: every view converged)."""
        return True

    def combined_counts(self, counts: VersionedCounts) -> dict[str, np.ndarray]:
        """The count tensors of every accepted version summed (families whose versions share
        one count layout and channel bookkeeping; others override :meth:`estimate_versions`)."""
        if isinstance(counts, CountBook) and counts.total and set(counts) <= set(
                self.accepted_versions()):
            return dict(counts.total)
        out: dict[str, np.ndarray] = {}
        for v in self.accepted_versions():
            for k, t in counts.get(v, {}).items():
                out[k] = out[k] + np.asarray(t) if k in out else np.array(t, dtype=np.int64)
        if not out:
            raise ValueError(f"{self.name}: no reports counted under versions "
                             f"{list(self.accepted_versions())} (have {sorted(counts)})")
        return out

    def estimate_versions(self, counts: VersionedCounts, attrs: Sequence[str], method: str,
                          **options: Any) -> Estimate:
        """:meth:`estimate` on the counts of every accepted version."""
        return self.estimate(self.combined_counts(counts), attrs, method, **options)

    def estimate_reports(self, reports: np.ndarray, attrs: Sequence[str], method: str,
                         **options: Any) -> Estimate:
        """Estimate from whole reports (``simulate``, estimators in :attr:`report_estimators`).
        Default: :meth:`estimate` on the reports' counts."""
        return self.estimate(self.count(np.asarray(reports), self.tensors([tuple(attrs)])),
                             attrs, method, **options)

    @classmethod
    def simulate_estimators(cls) -> tuple[str, ...]:
        """The estimators ``simulate`` runs by default."""
        return cls.default_estimators or cls.estimators[:1]

    # --- state published to devices (ldp.config) -----------------------------------------------
    @abstractmethod
    def state(self) -> dict[str, Any]:
        """JSON-serializable parameters and adaptive state, including ``mechanism`` and
        ``version``."""

    def device_state(self) -> dict[str, Any]:
        """What devices need to randomize (published to ``ldp.config``; ``from_state`` of it
        randomizes exactly like this state). Default: :meth:`state` plus, under ``device``, the
        :meth:`device_program` when the family has one; families whose server state grows
        (RRBA's table history) publish less."""
        out = self.state()
        prog = self.device_program()
        if prog is not None:
            out["device"] = prog
        return out

    def device_program(self) -> dict[str, Any] | None:
        """The randomization description devices interpret (:mod:`.device_program`,
        docs/device-protocol.md); None: this family (or this configuration of it) cannot be
        expressed yet, and the C and TypeScript SDKs refuse it."""
        return None


#: THE list of mechanism names: name → module of this package that defines it (imported on
#: first use, so loading one family never pays for the others' imports, e.g. scikit-learn for
#: LoPub). Nothing else lists mechanism names.
PROVIDERS: dict[str, str] = {
    "rr-ind": "families.rr", "rr-joint": "families.rr", "rr-clusters": "families.rr",
    "rrba": "families.rrba",
    "corr-rr": "families.corr_rr", "corr-rr-paper": "families.corr_rr_paper",
    "spl": "families.multi_baselines", "smp": "families.multi_baselines", "rs-fd": "families.multi_baselines",
    "rs-rfd": "families.multi_baselines",
    "lopub": "families.lopub",
    "partitioned": "families.partitioned",
    "sw-hm": "families.numeric",
}


#: the classes imported so far (filled by :func:`register`); use :func:`mechanism_class`
MECHANISMS: dict[str, type[Mechanism]] = {}


def mechanism_names() -> tuple[str, ...]:
    """Every mechanism name, in registry order."""
    return tuple(PROVIDERS)


def register(cls: type[Mechanism]) -> type[Mechanism]:
    """Class decorator: make a mechanism available by its ``name`` (which must be listed in
    :data:`PROVIDERS`)."""
    if cls.name not in PROVIDERS:
        raise ValueError(f"mechanism {cls.name!r} is not listed in PROVIDERS")
    MECHANISMS[cls.name] = cls
    return cls


def mechanism_class(name: str) -> type[Mechanism]:
    """The class registered as ``name``, importing its module on first use; an unknown name
    raises ValueError listing the known ones.

    >>> mechanism_class("rr-ind").name
    'rr-ind'
    """
    if name not in PROVIDERS:
        raise ValueError(f"unknown mechanism {name!r} (known: {', '.join(PROVIDERS)})"
                         f"{did_you_mean(name, PROVIDERS)}")
    if name not in MECHANISMS:
        importlib.import_module(f"{__package__}.{PROVIDERS[name]}")
    return MECHANISMS[name]


def from_state(state: Mapping[str, Any]) -> Mechanism:
    """Rebuild a mechanism from :meth:`Mechanism.state` (dispatches on ``state['mechanism']``)."""
    return mechanism_class(str(state.get("mechanism"))).from_state(state)


#: the mechanism of a collection (or ``simulate`` run) that names none
DEFAULT_MECHANISM = "rr-ind"
#: the mechanism of a ``simulate --numeric`` run that names none (docs/numeric.md)
DEFAULT_NUMERIC_MECHANISM = "sw-hm"
