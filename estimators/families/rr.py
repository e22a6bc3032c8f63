"""The RR family as :class:`~.mechanism.Mechanism` classes (docs/mechanisms.md §2–3):

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

``error_bound`` of castell is the upper 95 % quantile of the TVD of the unbiased inverse
estimate, with per-cell intervals, from a parametric bootstrap through the channels
(:func:`~.bounds.product_channel_bound`, through the block channels for ``rr-joint`` /
``rr-clusters``; ``Estimate.bound``); castell is also served projected onto the simplex
(``Estimate.projected``) with the same bound. It is attached, as a proxy, to truncated and ibu
(their errors are smaller: measured coverage above 95 %). The biased rr-independent and
rr-adjustment estimates, and a ``hybrid`` / ``hybrid-auto`` that chose the RR-Independent
product, carry castell's bound plus their TVD to castell (:func:`~.bounds.triangle`: coverage at
least 95 %); ``extra["error_bound_of"]`` names which estimate a hybrid's bound is for.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels import device_program as dp
from ldpstream.estimators.kernels.bounds import Bound, product_channel_bound, triangle
from ldpstream.estimators.kernels.castell import castell
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.joint_grr import joint_pq, randomize_joint
from ldpstream.estimators.kernels.proper import clip_rescale, project_simplex, repair
from ldpstream.estimators.kernels.rr_adjustment import rr_adjustment_table
from ldpstream.estimators.kernels.rr_clusters import (
    Block,
    blocks_for,
    castell_blocks,
    from_blocks,
    ibu_blocks,
    independent_blocks,
    to_blocks,
    truncated_blocks,
)
from ldpstream.estimators.mechanism import (
    Estimate,
    Mechanism,
    Memoization,
    ParamError,
    Params,
    TensorSpec,
    VersionedCounts,
    attribute_budget,
    histogram,
    marginal_key,
    marginal_tensors,
    register,
)
from ldpstream.estimators.memo import (
    composed_grr_pq,
    memoize_of,
    memoize_per_attribute,
    memoize_state,
    only_memoize,
    per_attribute,
)
from ldpstream.estimators.stream.longitudinal import DAY_S, Guarantee, Memoize, compose, periods_per_window

__all__ = ["RRIndependent", "RRJoint", "RRClusters", "marginal_counts"]


# --- helpers ------------------------------------------------------------------------------------

def _eps_list(epsilon: float | Sequence[float], m: int) -> list[float]:
    eps = [float(epsilon)] * m if np.isscalar(epsilon) else [float(e) for e in epsilon]  # type: ignore[union-attr]  # a sequence here
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

    #: (reports, patterns, raking result) of the last ``rr-adjustment-full`` raking
    _raking: tuple | None = None

    def marginal_table(self, counts: Mapping[str, np.ndarray],
                       attrs: Sequence[str]) -> np.ndarray:
        """The marginal's randomized table (the one the estimate reads: :func:`marginal_counts`)."""
        return marginal_counts(self.domain, counts, attrs)

    @property
    def report_width(self) -> int:
        return len(self.domain)

    def report_bounds(self) -> np.ndarray:
        return np.asarray(self.domain.shape, dtype=np.int64)

    def tensors(self, marginals: Sequence[Sequence[str]]) -> list[TensorSpec]:
        return marginal_tensors(self.domain, marginals, self.domain.shape)

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

    def full_targets(self, reports: np.ndarray) -> list:
        """[MDRR] Alg. 2 targets over all m attributes of whole reports."""
        raise NotImplementedError

    def estimate_reports(self, reports: np.ndarray, attrs: Sequence[str], method: str,
                         **options: Any) -> Estimate:
        """``rr-adjustment-full``: [MDRR] Alg. 2 as the paper runs it, one raking over the
        distinct randomized patterns of all m attributes of the whole reports (a server keeps
        w-way tables, not whole reports: simulate only); the marginal is the sum of pattern
        weights. The raking is done once per reports array and reused for every marginal."""
        if method != "rr-adjustment-full":
            return super().estimate_reports(reports, attrs, method, **options)
        from ldpstream.estimators.kernels.rr_adjustment import adjusted_marginal, distinct_patterns, rr_adjustment
        memo = self._raking
        if memo is None or memo[0] is not reports:
            patterns, counts, _ = distinct_patterns(reports, self.domain.shape)
            res = rr_adjustment(patterns, counts, self.full_targets(reports))
            memo = self._raking = (reports, patterns, res)
        _, patterns, res = memo
        cols = self.domain.axes(attrs)
        values = adjusted_marginal(patterns, res.weights, cols,
                                   [self.domain.shape[c] for c in cols])
        # biased: castell's bound on the reports' table plus the distance to castell
        cast = self.estimate(self.count(reports, self.tensors([attrs])), attrs, "castell")
        assert cast.bound is not None, "castell carries its bootstrap bound"
        tb = triangle(values, cast.factor.values, cast.bound)
        return self._estimate(values, attrs, method, len(reports), options, error_bound=tb.tvd,
                              bound=tb, iterations=int(res.iterations),
                              converged=bool(res.converged))

    def _estimate(self, values: np.ndarray, attrs: Sequence[str], method: str, n: float,
                  options: Mapping[str, Any], **kw: Any) -> Estimate:
        values = repair(np.asarray(values, dtype=float), options.get("proper"))
        dom = self.domain.project(attrs)
        projected = (Factor(dom, project_simplex(values))
                     if method == "castell" and not options.get("proper") else None)
        return Estimate(Factor(dom, values), method, int(round(n)), self.epsilon,
                        projected=projected, **kw)


# --- RR-Independent -----------------------------------------------------------------------------

@register
class RRIndependent(_RRBase):
    """RR-Independent / RR-Ind-Joint: an independent channel per attribute [MDRR Protocol 1;
    Castell Alg. 2–4]. One report = the m randomized values; ε = Σ ε(P_i)."""

    name = "rr-ind"
    estimators = ("castell", "truncated", "hybrid", "hybrid-auto", "ibu", "rr-independent",
                  "rr-adjustment")
    report_estimators = ("rr-adjustment-full",)
    default_estimators = ("castell", "truncated", "ibu")

    def full_targets(self, reports: np.ndarray) -> list:
        """Clip-rescaled 1-way RR-Independent estimates of every attribute."""
        return [clip_rescale(castell(np.bincount(reports[:, j].astype(np.intp), minlength=d), [P]))
                for j, (P, d) in enumerate(zip(self.channels, self.domain.shape))]

    def __init__(self, domain: Domain, epsilon: float | Sequence[float] | None = None,
                 channels: Sequence[np.ndarray] | None = None, version: int = 0,
                 memoize: Memoize | None = None,
                 instantaneous: Sequence[np.ndarray] | None = None) -> None:
        """``epsilon`` or ``channels`` give the channel of every attribute. With ``memoize`` that
        channel is the permanent (memoized) response and, when ``memoize.instantaneous_epsilon``
        or ``instantaneous`` (user matrices) is given, a fresh instantaneous channel follows it
        on every report: the server then inverts the composition (see
        :mod:`.longitudinal`)."""
        super().__init__(domain, version)
        m = len(domain)
        if channels is not None:
            if len(channels) != m:
                raise ValueError(f"{m} attributes but {len(channels)} channels")
            self.permanent = [ch.validate(P, d) for P, d in zip(channels, domain.shape)]
        else:
            if epsilon is None:
                raise ValueError("rr-ind needs epsilon (per attribute) or channels")
            self.permanent = [ch.grr(e, d) for e, d in zip(_eps_list(epsilon, m), domain.shape)]
        self.memoize = memoize
        self.instantaneous: list[np.ndarray] | None = None
        if instantaneous is not None or (memoize is not None
                                         and memoize.instantaneous_epsilon is not None):
            if memoize is None:
                raise ValueError("an instantaneous channel needs memoize (it randomizes the "
                                 "memoized response)")
            if instantaneous is None:
                assert memoize.instantaneous_epsilon is not None
                instantaneous = [ch.grr(e, d) for e, d in zip(
                    _eps_list(list(memoize.instantaneous_epsilon), m), domain.shape)]
            if len(instantaneous) != m:
                raise ValueError(f"{m} attributes but {len(instantaneous)} instantaneous channels")
            self.instantaneous = [ch.validate(Q, d) for Q, d in zip(instantaneous, domain.shape)]
        #: the channel every report goes through (what the estimators invert)
        self.channels = [ch.validate(compose(P, Q), d) for P, Q, d in zip(
            self.permanent, self.instantaneous or [None] * m, domain.shape)]
        self.epsilons = [ch.epsilon(P) for P in self.channels]

    @property
    def epsilon(self) -> float:
        return ch.epsilon_of_report(self.channels)

    def guarantee(self) -> Guarantee:
        if self.memoize is None:
            return Guarantee.fresh(self.epsilon)
        return Guarantee.memoized_channels(self.permanent, self.instantaneous, self.memoize)

    def channels_of(self, attrs: Sequence[str]) -> list[np.ndarray]:
        return [self.channels[i] for i in self.domain.axes(attrs)]

    def product_channels(self, attrs: Sequence[str]) -> list[np.ndarray]:
        return self.channels_of(attrs)

    def epsilon_per_attribute(self) -> float:
        return float(max(self.epsilons))

    def memoization(self) -> Memoization | None:
        if self.memoize is None:
            return None
        return Memoization(self.memoize, self.permanent, self.randomize_instantaneous)

    def randomize(self, records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Every record through the permanent channel, then the instantaneous one if any (one
        report per record: the device SDK memoizes the permanent response across reports)."""
        records = self._records(records)
        dtype = _report_dtype(self.domain.shape)
        x = records.astype(dtype, copy=False)
        out = np.empty(x.shape, dtype=dtype)
        for j, P in enumerate(self.permanent):
            out[:, j] = ch.randomize(x[:, j], P, rng)
        return self.randomize_instantaneous(out, rng)

    def randomize_instantaneous(self, permanent: np.ndarray, rng: np.random.Generator
                                ) -> np.ndarray:
        """The instantaneous channel applied to permanent responses ``(n, m)`` (a copy; the
        input itself when there is none)."""
        return per_attribute(permanent, self.instantaneous, rng)

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
        ``init``/``accelerate``/``support`` (ibu)."""
        self._check_method(method)
        attrs = tuple(attrs)
        c = np.asarray(marginal_counts(self.domain, counts, attrs), dtype=float)
        P = self.channels_of(attrs)
        n = float(c.sum())
        if n <= 0:
            raise ValueError(f"no reports counted for {attrs}")
        cb = product_channel_bound(c, P)
        bound = cb.tvd
        if method == "castell":
            return self._estimate(castell(c, P), attrs, method, n, options, error_bound=bound,
                                  bound=cb)
        if method == "truncated":
            from ldpstream.estimators.kernels.truncated import truncated
            return self._estimate(truncated(c, P), attrs, method, n, options, error_bound=bound,
                                  bound=cb, extra={"error_bound_of": "castell (proxy)"})
        if method in ("hybrid", "hybrid-auto"):
            from ldpstream.estimators.kernels.hybrid import hybrid, hybrid_auto
            est, chosen = (hybrid(c, P, [self.epsilons[i] for i in self.domain.axes(attrs)])
                           if method == "hybrid" else hybrid_auto(c, P))
            if chosen == "rr-independent":  # biased: castell's bound plus the distance to it
                cb, of = triangle(est, castell(c, P), cb), "rr-independent (castell + distance)"
            else:
                of = "castell"
            return self._estimate(est, attrs, method, n, options, error_bound=cb.tvd, bound=cb,
                                  extra={"chosen": chosen, "error_bound_of": of})
        if method == "rr-independent":
            from ldpstream.estimators.kernels.rr_independent import rr_independent
            est = rr_independent(c, P)
            tb = triangle(est, castell(c, P), cb)
            return self._estimate(est, attrs, method, n, options, error_bound=tb.tvd, bound=tb)
        if method == "ibu":
            from ldpstream.estimators.kernels.ibu import ibu
            kw = {k: options[k] for k in ("tol", "max_iter", "init", "accelerate", "support")
                  if k in options}
            r = ibu(c, P, **kw)
            return self._estimate(r.estimate, attrs, method, n, options, error_bound=bound,
                                  bound=cb, iterations=int(r.iterations),
                                  converged=bool(r.converged),
                                  extra={"error_bound_of": "castell (proxy)"})
        # rr-adjustment: Alg. 2 on the distinct randomized patterns of this table
        kw = {k: options[k] for k in ("tol", "max_iter") if k in options}
        table, r = rr_adjustment_table(c, self.adjustment_targets(c, P), **kw)
        tb = triangle(table, castell(c, P), cb)
        return self._estimate(table, attrs, method, n, options, error_bound=tb.tvd, bound=tb,
                              iterations=r.iterations, converged=r.converged,
                              extra={"gap": r.gap})

    def state(self) -> dict[str, Any]:
        """``channels`` is the channel of a report (composed when memoized); a memoized
        mechanism adds ``memoize``, its ``permanent_channels`` and ``instantaneous_channels``."""
        out: dict[str, Any] = {"mechanism": self.name, "version": self.version,
                               "domain": self.domain.to_dict(),
                               "channels": [P.tolist() for P in self.channels],
                               "epsilons": list(self.epsilons)}
        if self.memoize is not None:
            out["memoize"] = self.memoize.to_dict()
            out["permanent_channels"] = [P.tolist() for P in self.permanent]
            out["instantaneous_channels"] = (None if self.instantaneous is None
                                             else [Q.tolist() for Q in self.instantaneous])
        return out

    def device_program(self) -> dict[str, Any]:
        """Every attribute through its channel; memoized: the permanent channels under
        ``memoize``, the instantaneous ones as the steps (docs/device-protocol.md)."""
        m = len(self.domain)
        if self.memoize is None:
            return dp.program(self.name, self.domain, m,
                              [dp.channel_step([j], P) for j, P in enumerate(self.channels)])
        out = dp.program(self.name, self.domain, m, [
            dp.channel_step([j], Q) for j, Q in enumerate(self.instantaneous or [])])
        out["memoize"] = {"rotation_s": self.memoize.rotation_s, "permanent": [
            dp.channel_step([j], P) for j, P in enumerate(self.permanent)]}
        return out

    @classmethod
    def from_config(cls, domain: Domain, params: Mapping[str, Any] | None, *,
                    epsilon: float | None, epsilon_scope: str = "attribute",
                    version: int = 0) -> "RRIndependent":
        """GRR per attribute with ε = :func:`~.mechanism.attribute_budget`. Parameter
        ``memoize: {rotation_s, instantaneous_epsilon}`` (both optional: daily rotation, no
        instantaneous randomization; ``instantaneous_epsilon`` follows ``epsilon_scope``)
        memoizes the randomized response on devices (:mod:`.longitudinal`)."""
        m = len(domain)
        return cls(domain, epsilon=attribute_budget(epsilon, epsilon_scope, m), version=version,
                   memoize=only_memoize(cls.name, params, epsilon_scope, m))

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "RRIndependent":
        domain = Domain.from_dict(state["domain"])
        version = int(state.get("version", 0))
        if state.get("memoize") is None:
            return cls(domain, channels=[np.asarray(P, dtype=float) for P in state["channels"]],
                       version=version)
        inst = state.get("instantaneous_channels")
        return cls(domain, channels=[np.asarray(P, dtype=float)
                                     for P in state["permanent_channels"]],
                   version=version, memoize=Memoize.from_dict(state["memoize"]),
                   instantaneous=None if inst is None else [np.asarray(Q, dtype=float)
                                                            for Q in inst])


# --- clustered GRR (RR-Joint, RR-Clusters) ------------------------------------------------------

class _Clustered(_RRBase):
    """Attributes partitioned into clusters; each cluster one GRR over its product with
    ε_C = Σ_{A∈C} ε_A; clusters randomized independently."""

    def __init__(self, domain: Domain, clusters: Sequence[Sequence[str]],
                 epsilon: float | Sequence[float], version: int = 0,
                 memoize: Memoize | None = None) -> None:
        """With ``memoize`` each cluster's GRR is the permanent channel (one memo per cluster
        cell) and ``memoize.instantaneous_epsilon`` (per attribute, summed per cluster) a fresh
        GRR over the cluster's cells on every report; the estimators invert the composition
        (a GRR over the same cells, :func:`~.memo.composed_grr_pq`)."""
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
        self.memoize = memoize
        #: the permanent (p, q) of every cluster; ``_pq`` is then what a report goes through
        self.permanent_pq = list(self._pq)
        self.instantaneous_eps: list[float] | None = None
        inst = None if memoize is None else memoize.instantaneous_epsilon
        if inst is not None:
            self.instantaneous_eps = [float(sum(inst[i] for i in cols)) for cols in self._cols]
            self._pq = [composed_grr_pq(p, joint_pq(e, self._sizes(cols))[0],
                                        math.prod(self._sizes(cols)))
                        for (p, _), e, cols in zip(self._pq, self.instantaneous_eps,
                                                   self._cols)]

    def _sizes(self, cols: Sequence[int]) -> list[int]:
        return [self.domain.shape[i] for i in cols]

    def guarantee(self) -> Guarantee:
        """Memoized: per rotation the permanent clusters' ε summed (one memo per cluster cell),
        per day times the periods a day meets; adaptive (rr-clusters): a new clustering draws
        new memos, up to the per-rotation ε again."""
        if self.memoize is None:
            return Guarantee.fresh(self.epsilon)
        per_rotation = float(sum(np.log(p / q) for p, q in self.permanent_pq))
        return Guarantee(self.epsilon, True, self.memoize.rotation_s, per_rotation,
                         per_rotation * periods_per_window(DAY_S, self.memoize.rotation_s),
                         per_rotation if self.adaptive else None)

    def memoization(self) -> Memoization | None:
        """One memo per (cluster, cell of the cluster)."""
        if self.memoize is None:
            return None
        return Memoization(self.memoize, (), self.randomize_instantaneous, unit="cluster",
                           epsilons=tuple(float(np.log(p / q)) for p, q in self.permanent_pq),
                           draw=lambda x, ids, period, rng: self._joint(x, self.cluster_eps,
                                                                        rng))

    def _joint(self, records: np.ndarray, eps: Sequence[float],
               rng: np.random.Generator) -> np.ndarray:
        """Every cluster through GRR over its cells at ``eps[c]``."""
        records = self._records(records)
        dtype = _report_dtype(self.domain.shape)
        x = records.astype(dtype, copy=False)
        out = np.empty(x.shape, dtype=dtype)
        for cols, e in zip(self._cols, eps):
            cols = list(cols)
            out[:, cols] = randomize_joint(x[:, cols], self._sizes(cols), e, rng)
        return out

    def randomize_instantaneous(self, permanent: np.ndarray, rng: np.random.Generator
                                ) -> np.ndarray:
        """The instantaneous GRR of every cluster on permanent responses (themselves when
        there is none)."""
        if self.instantaneous_eps is None:
            return permanent
        return self._joint(permanent, self.instantaneous_eps, rng)

    @property
    def epsilon(self) -> float:
        """Σ over clusters of ε(GRR_C) = ln(p_C/q_C), computed from the channel entries."""
        return float(sum(np.log(p / q) for p, q in self._pq))

    def epsilon_per_attribute(self) -> float:
        """The largest cluster's ε (changing one attribute changes its cluster's cell)."""
        return float(max(self.cluster_eps))

    def device_program(self) -> dict[str, Any]:
        """One GRR step over the product of every cluster (docs/device-protocol.md); memoized:
        those steps under ``memoize`` (``kind: cluster``), the instantaneous ones as steps."""
        m = len(self.domain)
        if self.memoize is None:
            return dp.program(self.name, self.domain, m, [
                dp.grr_step(cols, p) for cols, (p, _) in zip(self._cols, self._pq)])
        out = dp.program(self.name, self.domain, m, [
            dp.grr_step(cols, joint_pq(e, self._sizes(cols))[0])
            for cols, e in zip(self._cols, self.instantaneous_eps or [])])
        out["memoize"] = {"rotation_s": self.memoize.rotation_s, "kind": "cluster",
                          "permanent": [dp.grr_step(cols, p) for cols, (p, _) in
                                        zip(self._cols, self.permanent_pq)]}
        return out

    def randomize(self, records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Every cluster through its GRR (memoized: the permanent one, then the instantaneous
        one; one report per record)."""
        return self.randomize_instantaneous(self._joint(records, self.cluster_eps, rng), rng)

    def full_targets(self, reports: np.ndarray) -> list:
        """Clip-rescaled joint estimate of every cluster."""
        from ldpstream.estimators.kernels.joint_grr import estimate_joint
        out = []
        for cols, (p, q) in zip(self._cols, self._pq):
            sub = tuple(self.domain.shape[c] for c in cols)
            out.append((tuple(cols), clip_rescale(estimate_joint(
                histogram(reports, cols, sub), p, q))))
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
        # the castell estimate's bootstrap bound through the block channels (one product
        # channel over the blocks), its cells mapped back to the marginal's axes
        bb = product_channel_bound(cb, [b.to_matrix() for b in blocks])
        cbound = Bound(bb.tvd, back(bb.low), back(bb.high), bb.level, bb.coverage, bb.method)
        proxy = {"error_bound_of": "castell (proxy)"}
        raw = back(castell_blocks(cb, blocks))
        if method == "rr-independent":
            est = back(independent_blocks(cb, blocks))
            tb = triangle(est, raw, cbound)
            return self._estimate(est, attrs, method, n, options, error_bound=tb.tvd, bound=tb)
        if method == "rr-adjustment":
            kw = {k: options[k] for k in ("tol", "max_iter") if k in options}
            table, r = rr_adjustment_table(c, self.adjustment_targets(c, attrs), **kw)
            tb = triangle(table, raw, cbound)
            return self._estimate(table, attrs, method, n, options, error_bound=tb.tvd,
                                  bound=tb, iterations=r.iterations, converged=r.converged,
                                  extra={"gap": r.gap})
        if method == "ibu":
            kw = {k: options[k] for k in ("tol", "max_iter", "init") if k in options}
            r = ibu_blocks(cb, blocks, **kw)
            return self._estimate(back(r.estimate), attrs, method, n, options,
                                  error_bound=cbound.tvd, bound=cbound, iterations=r.iterations,
                                  converged=r.converged, extra=proxy)
        if method == "castell":
            return self._estimate(raw, attrs, method, n, options, error_bound=cbound.tvd,
                                  bound=cbound)
        return self._estimate(truncated_blocks(raw), attrs, method, n, options,
                              error_bound=cbound.tvd, bound=cbound, extra=proxy)


@register
class RRJoint(_Clustered):
    """RR-Joint [MDRR Protocol 2]: one GRR over the product of all attributes with
    ε_C = Σ ε_A (``epsilon`` is per attribute, as for rr-ind, or a list)."""

    name = "rr-joint"
    estimators = ("castell", "truncated", "ibu")
    default_estimators = ("castell", "ibu")

    def __init__(self, domain: Domain, epsilon: float | Sequence[float], version: int = 0,
                 memoize: Memoize | None = None) -> None:
        super().__init__(domain, [domain.attrs], epsilon, version, memoize)

    def state(self) -> dict[str, Any]:
        return {"mechanism": self.name, "version": self.version,
                "domain": self.domain.to_dict(), "epsilons": list(self.epsilons),
                "epsilon_c": self.cluster_eps[0], **memoize_state(self.memoize)}

    @classmethod
    def from_config(cls, domain: Domain, params: Mapping[str, Any] | None, *,
                    epsilon: float | None, epsilon_scope: str = "attribute", version: int = 0) -> "RRJoint":
        """One GRR over the product, ε_C = Σ per-attribute budgets; ``memoize`` as rr-ind's."""
        m = len(domain)
        return cls(domain, attribute_budget(epsilon, epsilon_scope, m), version=version,
                   memoize=only_memoize(cls.name, params, epsilon_scope, m))

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "RRJoint":
        return cls(Domain.from_dict(state["domain"]), state["epsilons"],
                   version=int(state.get("version", 0)), memoize=memoize_of(state))


@register
class RRClusters(_Clustered):
    """RR-Clusters [MDRR §4]: RR-Joint inside each cluster, independence across clusters.

    The clusters come from [MDRR] Alg. 1 on randomized RR-Independent data. As an adaptive
    mechanism: version 0 (``clustered=False``) is all singletons — RR-Independent with GRR — and
    also keeps every pair's randomized table; once ``cluster_reports`` reports are counted,
    :meth:`adapt` runs Alg. 1 on those pair tables (Cramér's V, thresholds ``max_cells`` and
    ``min_dependence``) and publishes the clusters as the next version. Only the clustered
    version's reports are estimated from (the singleton round is used for the dependence only, as
    in [MDRR] §6)."""

    name = "rr-clusters"
    estimators = ("rr-independent", "castell", "truncated", "ibu", "rr-adjustment")
    report_estimators = ("rr-adjustment-full",)
    default_estimators = ("rr-independent", "castell", "ibu")
    adaptive = True
    #: defaults of [MDRR] §6: T_v cells, T_d Cramér's V, reports of the clustering round
    MAX_CELLS, MIN_DEPENDENCE, CLUSTER_REPORTS = 1000, 0.1, 1000

    def __init__(self, domain: Domain, clusters: Sequence[Sequence[str]] | None = None,
                 epsilon: float | Sequence[float] | None = None, version: int = 0,
                 max_cells: int | None = None, min_dependence: float | None = None,
                 cluster_reports: int | None = None, clustered: bool | None = None,
                 phase1_fraction: float | None = None, memoize: Memoize | None = None) -> None:
        """``clusters=None``: all singletons until :meth:`adapt` publishes clusters.
        ``clustered``: the clusters are final (default: they were given)."""
        if epsilon is None:
            raise ValueError("rr-clusters needs epsilon (per attribute)")
        self.clustered = clusters is not None if clustered is None else bool(clustered)
        if clusters is None:
            clusters = [(a,) for a in domain.attrs]
        super().__init__(domain, clusters, epsilon, version, memoize)
        self.max_cells = self.MAX_CELLS if max_cells is None else int(max_cells)
        self.min_dependence = (self.MIN_DEPENDENCE if min_dependence is None
                               else float(min_dependence))
        self.cluster_reports = (self.CLUSTER_REPORTS if cluster_reports is None
                                else int(cluster_reports))
        self.phase1_fraction = None if phase1_fraction is None else float(phase1_fraction)

    @classmethod
    def from_randomized(cls, domain: Domain, randomized: np.ndarray,
                        epsilon: float | Sequence[float], *, max_cells: int = 1000,
                        min_dependence: float = 0.1, kinds: str | Sequence[str] = "nominal",
                        version: int = 0) -> "RRClusters":
        """Alg. 1 on RR-Independent reports ``randomized`` (``(n, m)``, domain order)."""
        from ldpstream.estimators.kernels.rr_clusters import clusters_from_randomized
        cl, _ = clusters_from_randomized(randomized, domain.shape, max_cells, min_dependence,
                                         kinds)
        return cls(domain, [[domain.attrs[i] for i in c] for c in cl], epsilon, version,
                   max_cells, min_dependence)

    @classmethod
    def from_config(cls, domain: Domain, params: Mapping[str, Any] | None, *,
                    epsilon: float | None, epsilon_scope: str = "attribute", version: int = 0) -> "RRClusters":
        """``params``: ``max_cells`` (T_v, 1000), ``min_dependence`` (T_d, 0.1),
        ``cluster_reports`` (reports of the singleton round before clustering, 1000), or fixed
        ``clusters`` (lists of attribute names; then nothing adapts)."""
        pr = Params(cls.name, params)
        max_cells = pr.integer("max_cells", cls.MAX_CELLS, ge=1)
        min_dep = pr.number("min_dependence", cls.MIN_DEPENDENCE, ge=0.0, le=1.0)
        reports = pr.integer("cluster_reports", None, ge=1)
        beta = pr.number("phase1_fraction", None, gt=0.0, lt=1.0)
        n_plan = pr.integer("n_plan", None, ge=2)
        clusters = pr.value("clusters")
        raw = pr.value("memoize")
        pr.done()
        if reports is not None and beta is not None:
            raise ParamError("phase1_fraction", "give cluster_reports or phase1_fraction (of "
                                                "n_plan devices), not both")
        if clusters is not None:
            if (not isinstance(clusters, list) or not all(
                    isinstance(c, list) and c and all(isinstance(a, str) for a in c)
                    for c in clusters)):
                raise ParamError("clusters", f"must be a list of attribute lists (got {clusters!r})")
            flat = [a for c in clusters for a in c]
            if sorted(flat) != sorted(domain.attrs):
                raise ParamError("clusters", f"must partition the attributes {list(domain.attrs)}"
                                             f" (got {clusters})")
        mech = cls(domain, clusters, attribute_budget(epsilon, epsilon_scope, len(domain)),
                   version, max_cells, min_dep, reports, phase1_fraction=beta,
                   memoize=None if raw is None else memoize_per_attribute(raw, epsilon_scope,
                                                                   len(domain)))
        return mech.planned_for(n_plan) if n_plan is not None else mech

    def planned_for(self, n: int) -> "RRClusters":
        """The singleton round sized to ``phase1_fraction`` (default 0.1) of ``n`` devices,
        unless ``cluster_reports`` was given."""
        if self.clustered or self.phase1_fraction is None and \
                self.cluster_reports != self.CLUSTER_REPORTS:
            return self
        beta = 0.1 if self.phase1_fraction is None else self.phase1_fraction
        return RRClusters(self.domain, None, self.epsilons, self.version, self.max_cells,
                          self.min_dependence, max(1, int(round(beta * n))), False, beta,
                          self.memoize)

    # -- the clustering round
    def tensors(self, marginals: Sequence[Sequence[str]]) -> list[TensorSpec]:
        """The marginals' tensors; before clustering also every pair (Alg. 1's dependence)."""
        extra = [] if self.clustered else [
            (a, b) for i, a in enumerate(self.domain.attrs) for b in self.domain.attrs[i + 1:]]
        return super().tensors(list(marginals) + extra)

    def _reports(self, counts: VersionedCounts) -> int:
        cur = counts.get(self.version, {})
        return int(next((np.asarray(t).sum() for t in cur.values()), 0))

    def reports_until_adapt(self, counts: VersionedCounts) -> int | None:
        if self.clustered:
            return None
        return max(1, self.cluster_reports - self._reports(counts))

    def adapt(self, counts: VersionedCounts) -> "RRClusters | None":
        """Alg. 1 on the singleton round's pair tables once ``cluster_reports`` are counted."""
        if self.clustered or self._reports(counts) < self.cluster_reports:
            return None
        from ldpstream.estimators.kernels.dependence import dependence_from_tables
        from ldpstream.estimators.kernels.rr_clusters import cluster_attributes
        cur = counts[self.version]
        at = self.domain.attrs
        dep = dependence_from_tables(lambda a, b: cur[marginal_key((at[a], at[b]))], len(at))
        cl = cluster_attributes(dep, self.domain.shape, self.max_cells, self.min_dependence)
        return RRClusters(self.domain, [[at[i] for i in c] for c in cl], self.epsilons,
                          self.version + 1, self.max_cells, self.min_dependence,
                          self.cluster_reports, True, self.phase1_fraction, self.memoize)

    def state(self) -> dict[str, Any]:
        return {"mechanism": self.name, "version": self.version,
                "domain": self.domain.to_dict(), "epsilons": list(self.epsilons),
                "clusters": [list(c) for c in self.clusters], "clustered": self.clustered,
                "max_cells": self.max_cells, "min_dependence": self.min_dependence,
                "cluster_reports": self.cluster_reports, "phase1_fraction": self.phase1_fraction,
                **memoize_state(self.memoize)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "RRClusters":
        return cls(Domain.from_dict(state["domain"]), state["clusters"], state["epsilons"],
                   version=int(state.get("version", 0)), max_cells=state.get("max_cells"),
                   min_dependence=state.get("min_dependence"),
                   cluster_reports=state.get("cluster_reports"),
                   clustered=bool(state.get("clustered", True)),
                   phase1_fraction=state.get("phase1_fraction"), memoize=memoize_of(state))
