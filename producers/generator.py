"""Built-in synthetic populations over a collection's domain (for the fleet simulator).

Two seeded families, both sampled fully vectorized:

- ``product``: independent attributes, each with its own Dirichlet(1) category distribution;
- ``skewed``: a Zipf-weighted mixture of ``clusters`` prototypes; a record copies each attribute of
  its cluster's prototype with probability ``stick`` and otherwise draws it uniformly, so the joint
  distribution is skewed and the attributes are correlated.

Spec strings (``--data`` / ``--drift-to``): ``generator`` (= ``generator:product``),
``generator:skewed``, with options ``generator:skewed,seed=3,clusters=8,stick=0.8,zipf=1.2``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ldpstream.estimators.kernels.domain import Domain

KINDS = ("product", "skewed")


class GeneratorSpecError(ValueError):
    """A generator spec string cannot be parsed; the message names the field."""


@dataclass(frozen=True)
class Population:
    """A sampleable population of true records over ``domain``."""

    domain: Domain
    kind: str
    seed: int = 0
    clusters: int = 8
    stick: float = 0.8
    zipf: float = 1.2

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GeneratorSpecError(f"generator kind: must be one of {', '.join(KINDS)} (got {self.kind!r})")
        if self.clusters < 1:
            raise GeneratorSpecError(f"generator clusters: must be >= 1 (got {self.clusters})")
        if not 0.0 <= self.stick <= 1.0:
            raise GeneratorSpecError(f"generator stick: must be in [0, 1] (got {self.stick})")
        rng = np.random.default_rng([self.seed, 0x6C6470])
        shape = self.domain.shape
        if self.kind == "product":
            probs = [rng.dirichlet(np.ones(k)) for k in shape]
            # frozen dataclass: derived tables set once here, invisible to mypy (the ignores below)
            object.__setattr__(self, "_cdfs", [np.cumsum(p) for p in probs])
        else:
            protos = np.stack([rng.integers(0, k, size=self.clusters) for k in shape], axis=1)
            w = 1.0 / np.arange(1, self.clusters + 1) ** self.zipf
            object.__setattr__(self, "_protos", protos)
            object.__setattr__(self, "_weights", w / w.sum())

    @property
    def dtype(self) -> type:
        return np.uint8 if max(self.domain.shape) < 256 else np.uint16

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` records, ``(n, m)`` category indices in domain order (vectorized)."""
        shape = np.asarray(self.domain.shape)
        m = len(shape)
        if self.kind == "product":
            u = rng.random((n, m))
            cols = [np.minimum(np.searchsorted(cdf, u[:, j], side="right"), shape[j] - 1)
                    for j, cdf in enumerate(self._cdfs)]  # type: ignore[attr-defined]
            return np.stack(cols, axis=1).astype(self.dtype) if n else np.zeros((0, m), self.dtype)
        c = rng.choice(self.clusters, size=n, p=self._weights)  # type: ignore[attr-defined]
        out = self._protos[c].copy()  # type: ignore[attr-defined]
        noise = rng.random((n, m)) >= self.stick
        uniform = (rng.random((n, m)) * shape).astype(np.int64)
        out[noise] = uniform[noise]
        return out.astype(self.dtype)

    def distribution(self) -> np.ndarray | None:
        """The exact joint distribution (only for small domains, else ``None``)."""
        if self.domain.size() > 2_000_000:
            return None
        shape = self.domain.shape
        if self.kind == "product":
            out = np.ones(())
            for cdf in self._cdfs:  # type: ignore[attr-defined]
                p = np.diff(np.concatenate([[0.0], cdf]))
                out = np.multiply.outer(out, p)
            return out
        out = np.zeros(shape)
        for w, proto in zip(self._weights, self._protos):  # type: ignore[attr-defined]
            t = np.ones(())
            for j, k in enumerate(shape):
                p = np.full(k, (1.0 - self.stick) / k)
                p[proto[j]] += self.stick
                t = np.multiply.outer(t, p)
            out += w * t
        return out


def is_generator_spec(spec: str | None) -> bool:
    return spec is not None and (spec == "generator" or spec.startswith("generator:"))


def parse_spec(spec: str, domain: Domain, default_seed: int = 0) -> Population:
    """Parse ``generator[:kind][,key=value...]`` into a :class:`Population` over ``domain``."""
    if not is_generator_spec(spec):
        raise GeneratorSpecError(f"generator: spec must start with 'generator' (got {spec!r})")
    rest = spec[len("generator"):].lstrip(":")
    parts = [p.strip() for p in rest.split(",") if p.strip()]
    kind = "product"
    opts: dict[str, object] = {"seed": default_seed}
    for p in parts:
        if "=" not in p:
            kind = p
            continue
        key, _, value = p.partition("=")
        key = key.strip()
        try:
            if key in ("seed", "clusters"):
                opts[key] = int(value)
            elif key in ("stick", "zipf"):
                opts[key] = float(value)
            else:
                raise GeneratorSpecError(f"generator {key}: unknown option (known: seed, clusters, "
                                         "stick, zipf)")
        except ValueError:
            raise GeneratorSpecError(f"generator {key}: not a number ({value!r})") from None
    # opts holds seed/clusters (int) and stick/zipf (float), each matching its field's type
    return Population(domain, kind, **opts)  # type: ignore[arg-type]
