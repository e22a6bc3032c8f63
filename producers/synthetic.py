"""Synthetic correlated categorical data with the settings of [Corr-RR] §5 (m = 2…6 attributes,
d = 2 or 10 values, correlation 0.5…0.9), for ``ldpstream simulate --generator`` and the fleet.

Spec syntax: ``corr:key=value,...`` (keys in any order; all optional)::

    corr:m=4,d=10,rho=0.7,n=20000,model=star,p=skew,seed=1

* ``m`` attributes (default 4, ≥ 2), all with ``d`` values (default 2, ≥ 2), ``n`` records
  (default 20000).
* ``rho`` ∈ [0, 1] (default 0.7): the copy probability of the model.
* ``model`` (default ``star``):

  - ``star`` — X1 ~ p; for j ≥ 2, Xj = X1 with probability ρ, else uniform (the generator of
    the authors' reference code). corr(X1, Xj) = ρ when p is uniform; corr(Xi, Xj) = ρ² for i, j ≥ 2.
  - ``chain`` — X1 ~ p; Xj = X_{j−1} with probability ρ, else uniform (their "progressive" model).
  - ``latent`` — Z ~ p; every Xj = Z with probability √ρ, else uniform: every pair has
    correlation ρ (for uniform p).
* ``p`` — X1's (or Z's) marginal: ``uniform``, ``skew`` (default: weights d, d−1, …, 1, i.e.
  0.4/0.3/0.2/0.1 for d = 4 as in the authors' experiments), or ``zipf`` (weights 1/v).
* ``seed`` — data seed (default: the caller's).

The uniform "else" draws make the marginals differ across attributes whenever p is not uniform
(f_j = ρ·f_1 + (1−ρ)/d in the star model), which is what separates the published Corr-RR decode
from an unbiased one; with ``p=uniform`` every marginal is uniform.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["SyntheticSpec", "SpecError", "parse_spec", "generate", "population_marginals"]

_MODELS = ("star", "chain", "latent")
_P = ("uniform", "skew", "zipf")


class SpecError(ValueError):
    """A generator spec is malformed; the message names the field."""


@dataclass(frozen=True)
class SyntheticSpec:
    m: int = 4
    d: int = 2
    rho: float = 0.7
    n: int = 20000
    model: str = "star"
    p: str = "skew"
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.m < 2:
            raise SpecError(f"generator m: need at least 2 attributes, got {self.m}")
        if self.d < 2:
            raise SpecError(f"generator d: need at least 2 values, got {self.d}")
        if self.d > 65535:
            raise SpecError(f"generator d: at most 65535 values, got {self.d}")
        if not 0.0 <= self.rho <= 1.0:
            raise SpecError(f"generator rho: must be in [0, 1], got {self.rho}")
        if self.n < 1:
            raise SpecError(f"generator n: must be ≥ 1, got {self.n}")
        if self.model not in _MODELS:
            raise SpecError(f"generator model: must be one of {', '.join(_MODELS)}, got {self.model!r}")
        if self.p not in _P:
            raise SpecError(f"generator p: must be one of {', '.join(_P)}, got {self.p!r}")

    @property
    def attrs(self) -> tuple[str, ...]:
        return tuple(f"X{i + 1}" for i in range(self.m))

    def base(self) -> np.ndarray:
        """X1's (Z's) marginal."""
        v = np.arange(self.d, dtype=float)
        w = {"uniform": np.ones(self.d), "skew": self.d - v, "zipf": 1.0 / (v + 1)}[self.p]
        return w / w.sum()

    def text(self) -> str:
        s = f"corr:m={self.m},d={self.d},rho={self.rho:g},n={self.n},model={self.model},p={self.p}"
        return s + (f",seed={self.seed}" if self.seed is not None else "")


def _int(v: str) -> int:
    try:
        return int(v)
    except ValueError:
        f = float(v)  # accepts 2e4
        if not f.is_integer():
            raise
        return int(f)


def parse_spec(spec: str) -> SyntheticSpec:
    """Parse ``corr:m=4,d=10,rho=0.7,n=20000`` (see the module docstring)."""
    if not isinstance(spec, str) or not spec.startswith("corr:") and spec != "corr":
        raise SpecError(f"generator: expected 'corr:key=value,...', got {spec!r}")
    body = spec[5:] if spec.startswith("corr:") else ""
    kw: dict[str, Any] = {}
    conv = {"m": int, "d": int, "n": int, "rho": float, "model": str, "p": str, "seed": int}
    for part in filter(None, (x.strip() for x in body.split(","))):
        if "=" not in part:
            raise SpecError(f"generator: expected key=value, got {part!r}")
        k, v = (x.strip() for x in part.split("=", 1))
        if k not in conv:
            raise SpecError(f"generator: unknown key {k!r}; keys are {', '.join(conv)}")
        if k in kw:
            raise SpecError(f"generator {k}: given twice")
        try:
            kw[k] = _int(v) if conv[k] is int else conv[k](v)
        except ValueError:
            raise SpecError(f"generator {k}: cannot read {v!r} as {conv[k].__name__}") from None
    return SyntheticSpec(**kw)


def generate(spec: SyntheticSpec | str, rng: np.random.Generator | None = None):
    """A :class:`ldpstream.datasets.Dataset` drawn from ``spec`` (vectorized; ``spec.seed``
    overrides ``rng``)."""
    from ldpstream.datasets import Dataset
    from ldpstream.estimators.kernels.domain import Domain
    if isinstance(spec, str):
        spec = parse_spec(spec)
    if spec.seed is not None or rng is None:
        rng = np.random.default_rng(spec.seed)
    n, m, d = spec.n, spec.m, spec.d
    dtype = np.uint8 if d <= 256 else np.uint16
    cum = np.cumsum(spec.base())
    cum[-1] = 1.0
    root = np.searchsorted(cum, rng.random(n), side="right")
    X = np.empty((n, m), dtype=dtype)
    keep = np.sqrt(spec.rho) if spec.model == "latent" else spec.rho
    prev = root
    for j in range(m):
        if j == 0 and spec.model != "latent":
            col = root
        else:
            src = prev if spec.model == "chain" else root
            col = np.where(rng.random(n) < keep, src, rng.integers(0, d, n))
        X[:, j] = col
        prev = col
    labels = tuple(tuple(str(v) for v in range(d)) for _ in range(m))
    return Dataset(Domain(spec.attrs, (d,) * m, labels), X)


def population_marginals(spec: SyntheticSpec | str) -> list[np.ndarray]:
    """The population marginal of every attribute (what an infinite sample would show)."""
    if isinstance(spec, str):
        spec = parse_spec(spec)
    p, d, rho = spec.base(), spec.d, spec.rho
    u = np.full(d, 1.0 / d)
    out = []
    if spec.model == "latent":
        a = np.sqrt(rho)
        return [a * p + (1 - a) * u for _ in range(spec.m)]
    cur = p
    for j in range(spec.m):
        if j == 0:
            out.append(p.copy())
            continue
        src = cur if spec.model == "chain" else p
        cur = rho * src + (1 - rho) * u
        out.append(cur)
    return out
