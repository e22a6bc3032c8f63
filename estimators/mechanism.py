"""The one interface every mechanism family implements (channel/ε, randomize, count layout,
estimate), so the pipeline (producers → agents → estimators) is written once.

A mechanism is a value: its parameters and any adaptive state (RRBA tables, Corr-RR p_y tables,
LoPub hash seeds) are captured by :meth:`Mechanism.state`, a JSON-serializable dict carrying a
``version``; :func:`from_state` rebuilds it. Reports are rows of small non-negative integers
(``report_width`` of them, each below ``report_bounds()[i]``).
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from .domain import Domain, Factor


@dataclass(frozen=True)
class TensorSpec:
    """One count tensor kept by the server: a stable ``key``, named ``axes`` and their sizes.

    For a plain marginal, ``axes`` are attribute names and ``columns`` the report columns counted.
    """

    key: str
    axes: tuple[str, ...]
    shape: tuple[int, ...]
    columns: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


@dataclass(frozen=True)
class Estimate:
    """An estimated distribution with what it cost and how good it is."""

    factor: Factor
    method: str
    n: int
    epsilon: float
    error_bound: float | None = None
    iterations: int | None = None
    converged: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


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


class Mechanism(ABC):
    """A multi-attribute LDP mechanism family."""

    name: ClassVar[str]
    #: estimator names accepted by :meth:`estimate`
    estimators: ClassVar[tuple[str, ...]]

    def __init__(self, domain: Domain, version: int = 0) -> None:
        self.domain = domain
        self.version = int(version)

    # --- privacy -------------------------------------------------------------------------------
    @property
    @abstractmethod
    def epsilon(self) -> float:
        """ε one report (one record) costs, computed from the channel(s)."""

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

    # --- state published to devices (ldp.config) -----------------------------------------------
    @abstractmethod
    def state(self) -> dict[str, Any]:
        """JSON-serializable parameters and adaptive state, including ``mechanism`` and
        ``version``."""


MECHANISMS: dict[str, type[Mechanism]] = {}

#: mechanism name → module of this package that registers it (imported on first use, so that
#: loading one family never pays for the others' imports, e.g. scikit-learn for LoPub)
PROVIDERS: dict[str, str] = {
    "rr-ind": "rr_ind", "rr-joint": "rr_ind", "rr-clusters": "rr_ind",
    "rrba": "rrba",
    "corr-rr": "corr_rr", "corr-rr-paper": "corr_rr_paper",
    "spl": "multi_baselines", "smp": "multi_baselines", "rs-fd": "multi_baselines",
    "rs-rfd": "multi_baselines",
    "lopub": "lopub",
}


def register(cls: type[Mechanism]) -> type[Mechanism]:
    """Class decorator: make a mechanism available by its ``name``."""
    MECHANISMS[cls.name] = cls
    return cls


def mechanism_class(name: str) -> type[Mechanism]:
    """The class registered as ``name``, importing its module on first use.

    >>> mechanism_class("rr-ind").name
    'rr-ind'
    """
    if name not in MECHANISMS and name in PROVIDERS:
        importlib.import_module(f"{__package__}.{PROVIDERS[name]}")
    if name not in MECHANISMS:
        known = sorted(set(MECHANISMS) | set(PROVIDERS))
        raise ValueError(f"unknown mechanism {name!r}; known: {', '.join(known)}")
    return MECHANISMS[name]


def from_state(state: Mapping[str, Any]) -> Mechanism:
    """Rebuild a mechanism from :meth:`Mechanism.state` (dispatches on ``state['mechanism']``)."""
    return mechanism_class(str(state.get("mechanism"))).from_state(state)  # type: ignore[attr-defined]
