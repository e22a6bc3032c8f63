"""The RR family as :class:`~.mechanism.Mechanism` classes (MECHANISMS.md §2–3):

* :class:`RRIndependent` (``rr-ind``) — every attribute through its own channel (GRR(ε_i) by
  default, or validated user matrices); the server runs any Castell-family estimator on the
  w-way tables of randomized values [Castell Alg. 2–4; MDRR Protocol 1].
* :class:`RRJoint` (``rr-joint``) — the whole attribute set as one GRR over the product with the
  risk-equivalent ε_C = Σ ε_A [MDRR Protocol 2, §6.3.2].
* :class:`RRClusters` (``rr-clusters``) — clusters of dependent attributes from [MDRR] Alg. 1,
  RR-Joint inside each cluster with ε_C = Σ_{A∈C} ε_A, clusters independent [MDRR §4].

Every report is one randomized value per attribute (``report_width = m``), so the count tensors
are plain marginals of randomized values (key :func:`~.mechanism.marginal_key`). A marginal may be
estimated from its own tensor or from any stored superset tensor (randomized counts marginalise
exactly). ε is always computed from the channel entries, never echoed.

``error_bound`` is the expected TVD of the unbiased inverse estimate (castell) under a normal
approximation of its closed-form variance. It is attached to castell and, as a conservative
proxy, to truncated and ibu (their errors are typically smaller). ``hybrid`` / ``hybrid-auto``
carry castell's bound when they chose castell; when they chose the biased RR-Independent product
they carry :func:`~.hybrid.product_tvd_bound`, ½·sqrt(|Ω|·(estimated bias² + variance)) by
Cauchy–Schwarz (``extra["error_bound_of"]`` names which). The plain rr-independent and
rr-adjustment estimators carry none.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from . import channels as ch
from .castell import castell, castell_variance, expected_tvd
from .domain import Domain, Factor
from .mechanism import Estimate, Mechanism, TensorSpec, marginal_key, register
from .proper import clip_rescale, repair
from .rr_adjustment import rr_adjustment_table
from .rr_clusters import (Block, blocks_for, castell_blocks, castell_blocks_variance, from_blocks,
                          ibu_blocks, independent_blocks, to_blocks, truncated_blocks)
from .rr_joint import joint_pq, randomize_joint

__all__ = ["RRIndependent", "RRJoint", "RRClusters", "marginal_counts"]


# --- helpers ------------------------------------------------------------------------------------

def _eps_list(epsilon: float | Sequence[float], m: int) -> list[float]:
    eps = [float(epsilon)] * m if np.isscalar(epsilon) else [float(e) for e in epsilon]  # type: ignore[union-attr]
    if len(eps) != m:
        raise ValueError(f"{m} attributes but {len(eps)} epsilons")
    for e in eps:
        if not np.isfinite(e) or e <= 0:
            raise ValueError(f"epsilon must be a finite number > 0, got {e!r}")
    return eps


def _report_dtype(shape: Sequence[int]):
    return np.uint8 if max(shape) <= 256 else np.uint16 if max(shape) <= 65536 else np.uint32


def marginal_counts(domain: Domain, counts: Mapping[str, np.ndarray],
                    attrs: Sequence[str]) -> np.ndarray:
    """The randomized count table of ``attrs`` (axes in that order): the tensor of that marginal,
    else the smallest stored superset marginal with the other axes summed out."""
    attrs = tuple(attrs)
    key = marginal_key(attrs)
    if key in counts:
        return np.asarray(counts[key])
    best: tuple[int, tuple[str, ...], np.ndarray] | None = None
    for k, t in counts.items():
        if not k.startswith("m:"):
            continue
        axes = tuple(k[2:].split("|"))
        if set(attrs) <= set(axes):
            t = np.asarray(t)
            if best is None or t.size < best[0]:
                best = (t.size, axes, t)
    if best is None:
        raise KeyError(f"no count tensor holds the marginal {attrs}; tensors: {sorted(counts)}")
    _, axes, t = best
    return Factor(domain.project(axes), t).project(attrs).values


class _RRBase(Mechanism):
    """Shared layout: one randomized value per attribute; tensors are marginals."""

    @property
    def report_width(self) -> int:
        return len(self.domain)

    def report_bounds(self) -> np.ndarray:
        return np.asarray(self.domain.shape, dtype=np.int64)

    def tensors(self, marginals: Sequence[Sequence[str]]) -> list[TensorSpec]:
        out, seen = [], set()
        for attrs in marginals:
            attrs = tuple(attrs)
            key = marginal_key(attrs)
            if key in seen:
                continue
            seen.add(key)
            cols = self.domain.axes(attrs)
            out.append(TensorSpec(key, attrs, tuple(self.domain.shape[c] for c in cols), cols))
        return out

    def _check_method(self, method: str) -> None:
        if method not in self.estimators:
            raise ValueError(f"{self.name}: unknown estimator {method!r}; choose one of "
                             + ", ".join(self.estimators))

    def _records(self, records: np.ndarray) -> np.ndarray:
        records = np.asarray(records)
        if records.ndim != 2 or records.shape[1] != len(self.domain):
            raise ValueError(f"records must be (n, {len(self.domain)}), got {records.shape}")
        if len(records):
            if records.dtype.kind not in "iu":
                raise ValueError(f"records must be integer category indices, got {records.dtype}")
            hi = records.max(axis=0)
            bad = np.flatnonzero(hi >= np.asarray(self.domain.shape))
            if bad.size or (records.dtype.kind == "i" and records.min() < 0):
                j = int(bad[0]) if bad.size else int(np.argmin(records.min(axis=0)))
                raise ValueError(f"attribute {self.domain.attrs[j]!r}: value outside 0…"
                                 f"{self.domain.shape[j] - 1}")
        return records

    def _estimate(self, values: np.ndarray, attrs: Sequence[str], method: str, n: float,
                  options: Mapping[str, Any], **kw: Any) -> Estimate:
        values = repair(np.asarray(values, dtype=float), options.get("proper"))
        return Estimate(Factor(self.domain.project(attrs), values), method, int(round(n)),
                        self.epsilon, **kw)


# --- RR-Independent -----------------------------------------------------------------------------

@register
class RRIndependent(_RRBase):
    """RR-Independent / RR-Ind-Joint: an independent channel per attribute [MDRR Protocol 1;
    Castell Alg. 2–4]. One report = the m randomized values; ε = Σ ε(P_i)."""

    name = "rr-ind"
    estimators = ("castell", "truncated", "hybrid", "hybrid-auto", "ibu", "rr-independent",
                  "rr-adjustment")

    def __init__(self, domain: Domain, epsilon: float | Sequence[float] | None = None,
                 channels: Sequence[np.ndarray] | None = None, version: int = 0) -> None:
        super().__init__(domain, version)
        m = len(domain)
        if channels is not None:
            if len(channels) != m:
                raise ValueError(f"{m} attributes but {len(channels)} channels")
            self.channels = [ch.validate(P, d) for P, d in zip(channels, domain.shape)]
        else:
            if epsilon is None:
                raise ValueError("rr-ind needs epsilon (per attribute) or channels")
            self.channels = [ch.grr(e, d) for e, d in zip(_eps_list(epsilon, m), domain.shape)]
        self.epsilons = [ch.epsilon(P) for P in self.channels]

    @property
    def epsilon(self) -> float:
        return ch.epsilon_of_report(self.channels)

    def channels_of(self, attrs: Sequence[str]) -> list[np.ndarray]:
        return [self.channels[i] for i in self.domain.axes(attrs)]

    def randomize(self, records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        records = self._records(records)
        dtype = _report_dtype(self.domain.shape)
        x = records.astype(dtype, copy=False)
        out = np.empty(x.shape, dtype=dtype)
        for j, P in enumerate(self.channels):
            out[:, j] = ch.randomize(x[:, j], P, rng)
        return out

    def adjustment_targets(self, counts: np.ndarray, channels: Sequence[np.ndarray]
                           ) -> list[np.ndarray]:
        """Alg. 2 targets: the clip-rescaled RR-Independent marginal of every axis of
        ``counts``."""
        w = counts.ndim
        out = []
        for i in range(w):
            c = counts.sum(axis=tuple(k for k in range(w) if k != i)) if w > 1 else counts
            out.append(clip_rescale(castell(c, [channels[i]])))
        return out

    def estimate(self, counts: Mapping[str, np.ndarray], attrs: Sequence[str], method: str,
                 **options: Any) -> Estimate:
        """Options: ``proper`` ('clip' | 'simplex'), ``tol``/``max_iter`` (ibu, rr-adjustment),
        ``init``/``accelerate`` (ibu)."""
        self._check_method(method)
        attrs = tuple(attrs)
        c = np.asarray(marginal_counts(self.domain, counts, attrs), dtype=float)
        P = self.channels_of(attrs)
        n = float(c.sum())
        if n <= 0:
            raise ValueError(f"no reports counted for {attrs}")
        bound = (expected_tvd(castell_variance(c, P))
                 if method not in ("rr-independent", "rr-adjustment") else None)
        if method == "castell":
            return self._estimate(castell(c, P), attrs, method, n, options, error_bound=bound)
        if method == "truncated":
            from .truncated import truncated
            return self._estimate(truncated(c, P), attrs, method, n, options, error_bound=bound)
        if method in ("hybrid", "hybrid-auto"):
            from .hybrid import hybrid, hybrid_auto, product_tvd_bound
            est, chosen = (hybrid(c, P, [self.epsilons[i] for i in self.domain.axes(attrs)])
                           if method == "hybrid" else hybrid_auto(c, P))
            if chosen == "rr-independent":  # biased: castell's variance says nothing about it
                bound, of = product_tvd_bound(c, P), "rr-independent (bias² + variance)"
            else:
                of = "castell"
            return self._estimate(est, attrs, method, n, options, error_bound=bound,
                                  extra={"chosen": chosen, "error_bound_of": of})
        if method == "rr-independent":
            from .rr_independent import rr_independent
            return self._estimate(rr_independent(c, P), attrs, method, n, options)
        if method == "ibu":
            from .ibu import ibu
            kw = {k: options[k] for k in ("tol", "max_iter", "init", "accelerate") if k in options}
            r = ibu(c, P, **kw)
            return self._estimate(r.estimate, attrs, method, n, options, error_bound=bound,
                                  iterations=int(r.iterations), converged=bool(r.converged),
                                  extra={"error_bound_of": "castell (proxy)"})
        # rr-adjustment: Alg. 2 on the distinct randomized patterns of this table
        kw = {k: options[k] for k in ("tol", "max_iter") if k in options}
        table, r = rr_adjustment_table(c, self.adjustment_targets(c, P), **kw)
        return self._estimate(table, attrs, method, n, options, iterations=r.iterations,
                              converged=r.converged, extra={"gap": r.gap})

    def state(self) -> dict[str, Any]:
        return {"mechanism": self.name, "version": self.version,
                "domain": self.domain.to_dict(),
                "channels": [P.tolist() for P in self.channels],
                "epsilons": list(self.epsilons)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "RRIndependent":
        return cls(Domain.from_dict(state["domain"]),
                   channels=[np.asarray(P, dtype=float) for P in state["channels"]],
                   version=int(state.get("version", 0)))


# --- clustered GRR (RR-Joint, RR-Clusters) ------------------------------------------------------

class _Clustered(_RRBase):
    """Attributes partitioned into clusters; each cluster one GRR over its product with
    ε_C = Σ_{A∈C} ε_A; clusters randomized independently."""

    def __init__(self, domain: Domain, clusters: Sequence[Sequence[str]],
                 epsilon: float | Sequence[float], version: int = 0) -> None:
        super().__init__(domain, version)
        self.epsilons = _eps_list(epsilon, len(domain))
        clusters = [tuple(str(a) for a in c) for c in clusters]
        flat = [a for c in clusters for a in c]
        if sorted(flat) != sorted(domain.attrs) or len(flat) != len(set(flat)):
            raise ValueError(f"clusters {clusters} must partition the attributes {domain.attrs}")
        # keep domain order inside a cluster, clusters ordered by their first attribute
        pos = {a: i for i, a in enumerate(domain.attrs)}
        self.clusters = sorted((tuple(sorted(c, key=pos.get)) for c in clusters),
                               key=lambda c: pos[c[0]])
        self._cols = [domain.axes(c) for c in self.clusters]
        self.cluster_eps = [float(sum(self.epsilons[i] for i in cols)) for cols in self._cols]
        self._shape = {a: s for a, s in zip(domain.attrs, domain.shape)}
        self._pq = [joint_pq(e, [domain.shape[i] for i in cols])
                    for e, cols in zip(self.cluster_eps, self._cols)]

    @property
    def epsilon(self) -> float:
        """Σ over clusters of ε(GRR_C) = ln(p_C/q_C), computed from the channel entries."""
        return float(sum(np.log(p / q) for p, q in self._pq))

    def randomize(self, records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        records = self._records(records)
        dtype = _report_dtype(self.domain.shape)
        x = records.astype(dtype, copy=False)
        out = np.empty(x.shape, dtype=dtype)
        for cols, e in zip(self._cols, self.cluster_eps):
            cols = list(cols)
            out[:, cols] = randomize_joint(x[:, cols], [self.domain.shape[i] for i in cols], e, rng)
        return out

    def blocks(self, attrs: Sequence[str]) -> tuple[list[tuple[str, ...]], list[Block]]:
        """The blocks (S ∩ C) of marginal ``attrs`` and the GRR each induces."""
        return blocks_for(attrs, self.clusters, self._shape, self._pq)

    def adjustment_targets(self, counts: np.ndarray, attrs: Sequence[str]
                           ) -> list[tuple[tuple[int, ...], np.ndarray]]:
        """Alg. 2 targets for a table over ``attrs``: the clip-rescaled estimate of every block."""
        attrs = list(attrs)
        groups, blocks = self.blocks(attrs)
        out = []
        for g, b in zip(groups, blocks):
            cols = tuple(attrs.index(a) for a in g)
            drop = tuple(i for i in range(len(attrs)) if i not in cols)
            c = counts.sum(axis=drop) if drop else counts
            c = np.transpose(c, np.argsort(np.argsort(cols)))  # axes in group order
            est = castell_blocks(c.reshape(-1), [b]).reshape(c.shape)
            out.append((cols, clip_rescale(est)))
        return out

    def estimate(self, counts: Mapping[str, np.ndarray], attrs: Sequence[str], method: str,
                 **options: Any) -> Estimate:
        """Options: ``proper`` ('clip' | 'simplex'), ``tol``/``max_iter``/``init`` (ibu)."""
        self._check_method(method)
        attrs = tuple(attrs)
        c = np.asarray(marginal_counts(self.domain, counts, attrs), dtype=float)
        n = float(c.sum())
        if n <= 0:
            raise ValueError(f"no reports counted for {attrs}")
        groups, blocks = self.blocks(attrs)
        cb = to_blocks(c, attrs, groups)
        back = lambda t: from_blocks(t, attrs, groups, self._shape)  # noqa: E731
        if method == "rr-independent":
            return self._estimate(back(independent_blocks(cb, blocks)), attrs, method, n, options)
        if method == "rr-adjustment":
            kw = {k: options[k] for k in ("tol", "max_iter") if k in options}
            table, r = rr_adjustment_table(c, self.adjustment_targets(c, attrs), **kw)
            return self._estimate(table, attrs, method, n, options, iterations=r.iterations,
                                  converged=r.converged, extra={"gap": r.gap})
        bound = expected_tvd(castell_blocks_variance(cb, blocks))  # cell order does not matter
        if method == "ibu":
            kw = {k: options[k] for k in ("tol", "max_iter", "init") if k in options}
            r = ibu_blocks(cb, blocks, **kw)
            return self._estimate(back(r.estimate), attrs, method, n, options, error_bound=bound,
                                  iterations=r.iterations, converged=r.converged,
                                  extra={"error_bound_of": "castell (proxy)"})
        raw = back(castell_blocks(cb, blocks))
        if method == "castell":
            return self._estimate(raw, attrs, method, n, options, error_bound=bound)
        return self._estimate(truncated_blocks(raw), attrs, method, n, options,
                              error_bound=bound)


@register
class RRJoint(_Clustered):
    """RR-Joint [MDRR Protocol 2]: one GRR over the product of all attributes with
    ε_C = Σ ε_A (``epsilon`` is per attribute, as for rr-ind, or a list)."""

    name = "rr-joint"
    estimators = ("castell", "truncated", "ibu")

    def __init__(self, domain: Domain, epsilon: float | Sequence[float], version: int = 0) -> None:
        super().__init__(domain, [domain.attrs], epsilon, version)

    def state(self) -> dict[str, Any]:
        return {"mechanism": self.name, "version": self.version,
                "domain": self.domain.to_dict(), "epsilons": list(self.epsilons),
                "epsilon_c": self.cluster_eps[0]}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "RRJoint":
        return cls(Domain.from_dict(state["domain"]), state["epsilons"],
                   version=int(state.get("version", 0)))


@register
class RRClusters(_Clustered):
    """RR-Clusters [MDRR §4]: RR-Joint inside each cluster, independence across clusters.

    The clusters come from [MDRR] Alg. 1 on the randomized data of a prior RR-Independent round
    (:meth:`from_randomized`); they are adaptive state, published with the mechanism."""

    name = "rr-clusters"
    estimators = ("rr-independent", "castell", "truncated", "ibu", "rr-adjustment")

    def __init__(self, domain: Domain, clusters: Sequence[Sequence[str]] | None = None,
                 epsilon: float | Sequence[float] | None = None, version: int = 0,
                 max_cells: int | None = None, min_dependence: float | None = None) -> None:
        """``clusters=None``: all singletons (RR-Independent with GRR) until a clustering round
        publishes clusters in a new version."""
        if epsilon is None:
            raise ValueError("rr-clusters needs epsilon (per attribute)")
        if clusters is None:
            clusters = [(a,) for a in domain.attrs]
        super().__init__(domain, clusters, epsilon, version)
        self.max_cells = max_cells
        self.min_dependence = min_dependence

    @classmethod
    def from_randomized(cls, domain: Domain, randomized: np.ndarray,
                        epsilon: float | Sequence[float], *, max_cells: int = 1000,
                        min_dependence: float = 0.1, kinds: str | Sequence[str] = "nominal",
                        version: int = 0) -> "RRClusters":
        """Alg. 1 on RR-Independent reports ``randomized`` (``(n, m)``, domain order)."""
        from .rr_clusters import clusters_from_randomized
        cl, _ = clusters_from_randomized(randomized, domain.shape, max_cells, min_dependence,
                                         kinds)
        return cls(domain, [[domain.attrs[i] for i in c] for c in cl], epsilon, version,
                   max_cells, min_dependence)

    def state(self) -> dict[str, Any]:
        return {"mechanism": self.name, "version": self.version,
                "domain": self.domain.to_dict(), "epsilons": list(self.epsilons),
                "clusters": [list(c) for c in self.clusters],
                "max_cells": self.max_cells, "min_dependence": self.min_dependence}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "RRClusters":
        return cls(Domain.from_dict(state["domain"]), state["clusters"], state["epsilons"],
                   version=int(state.get("version", 0)), max_cells=state.get("max_cells"),
                   min_dependence=state.get("min_dependence"))
