"""Multi-attribute frequency-estimation baselines of [Corr-RR] §5 (Arcolezi et al.; docs/mechanisms.md §5):

* :class:`SPL` (``spl``) — split: GRR with ε/m on every attribute.
* :class:`SMP` (``smp``) — sample: one uniformly chosen attribute j, report (j, GRR_ε(x_j)).
* :class:`RSFD` (``rs-fd``) — random sampling plus fake data: the sampled attribute through
  GRR(ε'), every other attribute a uniform fake value, the index not reported.
* :class:`RSRFD` (``rs-rfd``) — the same with fakes drawn from a prior (a published distribution).

ε is computed from the channel, never echoed. Two neighbour relations are named apart:

* ``epsilon`` — any two records (the usual LDP guarantee of one report);
* ``epsilon_attribute`` — records that differ in one attribute.

Arcolezi et al.'s amplification ε' = ln(m(e^ε−1)+1) makes RS+FD ε-LDP **for records differing in
one attribute only**: computed from the exact channel, two records that differ in every attribute
are distinguishable with ε' (all reported values matching one record and none the other). So
``RSFD(scope="attribute")`` (the published form) has ``epsilon_attribute == ε`` and
``epsilon == ε'``; ``scope="record"`` uses GRR(ε) and is ε-LDP on whole records. For RS+RFD the
amplification is solved numerically for the actual priors (Arcolezi's closed form only holds for
uniform fakes; with a skewed prior it would overstate the privacy).

Every estimator here is the unbiased inverse (raw, may leave [0, 1]); the analytic per-cell
variances are stated for a fixed dataset (``fixed_data=True``: the randomness is the mechanism's,
what a Monte Carlo on one dataset measures) or i.i.d. users (adds f(1−f)/n). ``error_bound`` is
the calibrated 95 % bootstrap bound (estimators/kernels/bounds.py) through the attribute's
effective channel: a column of reports is a multinomial of f·Q (:meth:`_Multi.column`); rs-rfd's
combination of its SPL and RS+RFD phases gets :func:`~.bounds.mixture` of both.
"""
from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import optimize

from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels import device_program as dp
from ldpstream.estimators.kernels.bounds import (
    AT_LEAST,
    LEVEL,
    NO_REPORTS,
    Bound,
    affine_bound,
    mixture,
    split_level,
)
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.proper import clip_rescale, repair
from ldpstream.estimators.mechanism import (
    Estimate,
    Mechanism,
    Memoization,
    ParamError,
    Params,
    TensorSpec,
    VersionedCounts,
    marginal_key,
    record_budget,
    register,
)
from ldpstream.estimators.memo import memoize_of, memoize_param, memoize_state, only_memoize, per_attribute
from ldpstream.estimators.stream.longitudinal import DAY_S, Guarantee, Memoize, compose, periods_per_window

__all__ = ["SPL", "SMP", "RSFD", "RSRFD", "grr_decode", "grr_decode_variance",
           "amplified_epsilon", "amplification_for", "attribute_epsilon", "neighbour_epsilons",
           "marginal_mse", "one_way_axis", "one_way_reason", "report_dtype"]


# --- small shared helpers -------------------------------------------------------------------------

def report_dtype(shape: Sequence[int]):
    m = max(int(s) for s in shape)
    return np.uint8 if m <= 256 else np.uint16 if m <= 65536 else np.uint32


def one_way_axis(mech: Mechanism, attrs: Sequence[str], method: str) -> int:
    """Axis of the single attribute in ``attrs`` after checking ``method`` is one of
    ``mech.estimators`` (the families of [Corr-RR] §5 estimate one-way marginals only)."""
    if method not in mech.estimators:
        raise ValueError(f"{mech.name}: unknown estimator {method!r}; choose one of "
                         + ", ".join(mech.estimators))
    attrs = tuple(attrs)
    if len(attrs) != 1:
        raise ValueError(f"{mech.name} estimates one-way marginals only, got {attrs}")
    return mech.domain.axes(attrs)[0]


def one_way_reason(mech: Mechanism, attrs: Sequence[str], method: str) -> str | None:
    """:meth:`Mechanism.check_marginal` of the one-way families of [Corr-RR] §5."""
    if len(tuple(attrs)) != 1:
        return f"{mech.name} estimates one-way marginals only (got {len(tuple(attrs))}-way)"
    return None


def marginal_mse(estimates: Sequence[np.ndarray], truth: Sequence[np.ndarray]) -> float:
    """[Corr-RR] eq. 5: the squared error averaged over the values of each attribute, then over
    the attributes."""
    from ldpstream.estimators.kernels.metrics import mse
    return float(np.mean([mse(e, t) for e, t in zip(estimates, truth)]))


def _check_eps(eps: float) -> float:
    eps = float(eps)
    if not np.isfinite(eps) or eps <= 0:
        raise ValueError(f"epsilon must be a finite number > 0, got {eps!r}")
    return eps


def grr_decode(counts: np.ndarray, n: float, eps: float, d: int) -> np.ndarray:
    """Unbiased GRR inverse π̂_v = (c_v/n − q)/(p − q) (docs/mechanisms.md §1)."""
    p, q = ch.grr_pq(eps, d)
    return (np.asarray(counts, dtype=float) / n - q) / (p - q)


def grr_decode_variance(f: np.ndarray, n: float, eps: float, d: int,
                        fixed_data: bool = True) -> np.ndarray:
    """Per-cell variance of :func:`grr_decode` with n reports: λ(1−λ)/(nΔ²), λ = q + Δf, minus
    f(1−f)/n on a fixed dataset (= Wang et al.'s q(1−q)/(nΔ²) + f(1−p−q)/(nΔ))."""
    p, q = ch.grr_pq(eps, d)
    f = np.asarray(f, dtype=float)
    lam = q + (p - q) * f
    v = lam * (1 - lam) / (n * (p - q) ** 2)
    return v - f * (1 - f) / n if fixed_data else v


def amplified_epsilon(eps: float, m: int) -> float:
    """Arcolezi et al.'s ε' = ln(m·(e^ε − 1) + 1) for RS+FD with m attributes."""
    return float(np.log(m * np.expm1(_check_eps(eps)) + 1))


def _rs_attribute_eps(eps_prime: float, shape: Sequence[int],
                      priors: Sequence[np.ndarray] | None) -> float:
    """Exact ε for records differing in one attribute i of the (sampled GRR(ε'), fakes ~ π)
    report: Pr(y|x) ∝ Σ_j P_j(x_j, y_j)/π_j(y_j); the worst case has y_i at π_i's smallest value,
    every other y_j at π_j's largest value and not equal to x_j."""
    m = len(shape)
    pri = [np.full(d, 1.0 / d) for d in shape] if priors is None else [np.asarray(p) for p in priors]
    pq = [ch.grr_pq(eps_prime, d) for d in shape]
    worst = 0.0
    for i in range(m):
        a = 1.0 / pri[i].min()
        s = sum(pq[j][1] / pri[j].max() for j in range(m) if j != i)
        worst = max(worst, np.log((pq[i][0] * a + s) / (pq[i][1] * a + s)))
    return float(worst)


def amplification_for(eps: float, shape: Sequence[int],
                      priors: Sequence[np.ndarray] | None = None) -> float:
    """The GRR budget ε' of the sampled attribute that makes the (sampled, fakes) report exactly
    ε-LDP for records differing in one attribute (bisection on :func:`_rs_attribute_eps`). Equals
    :func:`amplified_epsilon` for uniform fakes and one common domain size."""
    eps = _check_eps(eps)
    if len(shape) == 1:
        return eps
    f = lambda e: _rs_attribute_eps(e, shape, priors) - eps  # noqa: E731
    hi = eps
    while f(hi) < 0:
        if hi > 350:
            raise ValueError(f"no amplification reaches ε = {eps} for these priors")
        hi *= 2
    return float(optimize.brentq(f, 1e-12, hi, xtol=1e-14, rtol=4 * np.finfo(float).eps))


def attribute_epsilon(P: np.ndarray, shape: Sequence[int]) -> float:
    """ε of an explicit channel ``P`` (rows = input records in C order over ``shape``) for
    records that differ in one attribute: max over attributes i, the other coordinates and the
    outputs of ln(max over x_i / min over x_i)."""
    P = np.asarray(P, dtype=float)
    T = P.reshape(tuple(shape) + (P.shape[1],))
    worst = 0.0
    for i in range(len(shape)):
        hi, lo = T.max(axis=i), T.min(axis=i)
        used = hi > 0
        if np.any(lo[used] <= 0):
            return float("inf")
        worst = max(worst, float(np.max(np.log(hi[used] / lo[used]))))
    return worst


def neighbour_epsilons(P: np.ndarray, shape: Sequence[int]) -> tuple[float, float]:
    """(record ε, attribute ε) of an explicit channel over all records of ``shape``."""
    return ch.epsilon(P), attribute_epsilon(P, shape)


def _all_records(shape: Sequence[int]) -> np.ndarray:
    return np.array(list(itertools.product(*[range(d) for d in shape])), dtype=np.int64)


# --- shared base ---------------------------------------------------------------------------------

class _Multi(Mechanism):
    """One-way marginals of m attributes from one report per record."""

    estimators: tuple[str, ...] = ("unbiased",)

    def __init__(self, domain: Domain, epsilon: float, version: int = 0) -> None:
        super().__init__(domain, version)
        self.target_epsilon = _check_eps(epsilon)

    @property
    def m(self) -> int:
        return len(self.domain)

    def _records(self, records: np.ndarray) -> np.ndarray:
        records = np.asarray(records)
        if records.ndim != 2 or records.shape[1] != self.m:
            raise ValueError(f"records must be (n, {self.m}), got {records.shape}")
        if records.size and (records.min() < 0 or np.any(records.max(axis=0) >= self.domain.shape)):
            raise ValueError("records hold a value outside the domain")
        return records

    def _column_tensors(self, offset: int = 0) -> list[TensorSpec]:
        return [TensorSpec(marginal_key((a,)), (a,), (d,), (i + offset,))
                for i, (a, d) in enumerate(zip(self.domain.attrs, self.domain.shape))]

    @classmethod
    def from_config(cls, domain: Domain, params: Mapping[str, Any] | None, *,
                    epsilon: float | None, epsilon_scope: str = "attribute", version: int = 0) -> "_Multi":
        """One report per record costing :func:`~.mechanism.record_budget`; family parameters
        from :meth:`config_params`."""
        pr = Params(cls.name, params)
        kw = cls.config_params(pr, domain)
        pr.done()
        return cls(domain, record_budget(epsilon, epsilon_scope, len(domain)), version=version,
                   **kw)

    @classmethod
    def config_params(cls, pr: Params, domain: Domain) -> dict[str, Any]:
        """Constructor keywords read from ``params:`` (none by default)."""
        return {}

    def check_marginal(self, attrs: Sequence[str], method: str) -> str | None:
        return super().check_marginal(attrs, method) or one_way_reason(self, attrs, method)

    def estimate_all(self, counts: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Raw unbiased estimates of every attribute's marginal (domain order)."""
        raise NotImplementedError

    def column(self, counts: Mapping[str, np.ndarray], i: int
               ) -> tuple[np.ndarray, float, np.ndarray]:
        """(counts, α, β): the reports counted for attribute i, a multinomial of f_i·Q with the
        effective channel Q = α·I + 1·βᵀ, which the unbiased estimate inverts."""
        raise NotImplementedError

    def bound(self, counts: Mapping[str, np.ndarray], i: int, level: float = LEVEL) -> Bound:
        """The bootstrap bound of attribute i's unbiased estimate (no reports: the widest)."""
        c, alpha, beta = self.column(counts, i)
        if c.sum() <= 0:   # nothing to estimate from (smp: nobody sampled it yet)
            return Bound(1.0, np.zeros(len(c)), np.ones(len(c)), level, AT_LEAST, NO_REPORTS)
        return affine_bound(c, alpha, beta, level=level)

    def estimate(self, counts: Mapping[str, np.ndarray], attrs: Sequence[str],
                 method: str = "unbiased", **options: Any) -> Estimate:
        """Options: ``proper`` ('clip' | 'simplex')."""
        i = one_way_axis(self, attrs, method)
        a = self.domain.attrs[i]
        every = self.estimate_all(counts)
        est = every[i]
        n = self.counted(counts)
        var = self.variance([np.clip(x, 0, 1) for x in every], n, fixed_data=False)[i]
        vals = repair(est, options.get("proper"))
        b = self.bound(counts, i)
        return Estimate(Factor(self.domain.project((a,)), vals), method, int(n), self.epsilon,
                        error_bound=b.tvd, bound=b, extra={"variance": var.tolist()})

    def counted(self, counts: Mapping[str, np.ndarray]) -> int:
        return int(np.asarray(counts[marginal_key((self.domain.attrs[0],))]).sum())

    def variance(self, f: Sequence[np.ndarray], n: float, fixed_data: bool = True
                 ) -> list[np.ndarray]:
        """Per-cell variance of the unbiased estimate of every attribute for n reports."""
        raise NotImplementedError

    def analytic_mse(self, f: Sequence[np.ndarray], n: float, fixed_data: bool = True) -> float:
        """Expected [Corr-RR] eq. 5 MSE of the raw unbiased estimator (= mean variance)."""
        return float(np.mean([v.mean() for v in self.variance(f, n, fixed_data)]))

    def channel_matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """(records, P): the exact channel from every record of the domain (C order) to every
        report (in :meth:`report_index` order). For audits on small domains."""
        raise NotImplementedError

    def report_index(self, reports: np.ndarray) -> np.ndarray:
        """Column of :meth:`channel_matrix` of each report row."""
        return np.ravel_multi_index(tuple(np.asarray(reports, dtype=np.intp).T), self.domain.shape)

    def state(self) -> dict[str, Any]:
        return {"mechanism": self.name, "version": self.version,
                "domain": self.domain.to_dict(), "epsilon": self.target_epsilon}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "_Multi":
        return cls(Domain.from_dict(state["domain"]), float(state["epsilon"]),
                   version=int(state.get("version", 0)))


# --- SPL -----------------------------------------------------------------------------------------

class _Memoizing(_Multi):
    """A baseline that may memoize: ``memoize`` in its state."""

    memoize: Memoize | None = None

    def _set_grr_channels(self, eps_permanent: float) -> None:
        """GRR of ``eps_permanent`` per attribute as the permanent channels, the memoize
        parameter's instantaneous GRRs on top (estimators/stream/longitudinal.py), and what a
        report goes through: their composition."""
        self.permanent = [ch.grr(eps_permanent, d) for d in self.domain.shape]
        inst = None if self.memoize is None else self.memoize.instantaneous_epsilon
        self.instantaneous = None if inst is None else [ch.grr(e, d) for e, d in
                                                        zip(inst, self.domain.shape)]
        self.channels = [compose(P, Q) for P, Q in zip(
            self.permanent, self.instantaneous or [None] * self.m)]
        #: ε of every attribute's report channel (the composed GRR when memoized)
        self.eps_report = [ch.epsilon(P) for P in self.channels]

    def state(self) -> dict[str, Any]:
        return {**super().state(), **memoize_state(self.memoize)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "_Memoizing":
        return cls(Domain.from_dict(state["domain"]), float(state["epsilon"]),
                   version=int(state.get("version", 0)), memoize=memoize_of(state))


@register
class SPL(_Memoizing):
    """Split the budget: GRR(ε/m) on every attribute; ε = Σ ε(P_i) (sequential composition).
    Memoized (``memoize`` as rr-ind's): GRR(ε/m) is the permanent channel of every attribute,
    an instantaneous GRR on top; the composed GRR is what ``channels`` holds and the
    estimates invert."""

    name = "spl"

    def __init__(self, domain: Domain, epsilon: float, version: int = 0,
                 memoize: Memoize | None = None) -> None:
        super().__init__(domain, epsilon, version)
        self.eps_each = self.target_epsilon / self.m
        self.memoize = memoize
        self._set_grr_channels(self.eps_each)

    def guarantee(self) -> Guarantee:
        if self.memoize is None:
            return Guarantee.fresh(self.epsilon)
        return Guarantee.memoized_channels(self.permanent, self.instantaneous, self.memoize)

    def memoization(self) -> Memoization | None:
        if self.memoize is None:
            return None
        return Memoization(self.memoize, self.permanent, self.randomize_instantaneous)

    def randomize_instantaneous(self, permanent: np.ndarray, rng: np.random.Generator
                                ) -> np.ndarray:
        """The instantaneous GRR of every attribute (the input itself when there is none)."""
        return per_attribute(permanent, self.instantaneous, rng)

    @classmethod
    def from_config(cls, domain: Domain, params: Mapping[str, Any] | None, *,
                    epsilon: float | None, epsilon_scope: str = "attribute",
                    version: int = 0) -> "SPL":
        """One report per record costing :func:`~.mechanism.record_budget`; ``memoize`` as
        rr-ind's (the instantaneous ε per attribute follows ``epsilon_scope``)."""
        m = len(domain)
        return cls(domain, record_budget(epsilon, epsilon_scope, m), version=version,
                   memoize=only_memoize(cls.name, params, epsilon_scope, m))

    @property
    def epsilon(self) -> float:
        return ch.epsilon_of_report(self.channels)

    @property
    def epsilon_attribute(self) -> float:
        return max(ch.epsilon(P) for P in self.channels)

    @property
    def report_width(self) -> int:
        return self.m

    def report_bounds(self) -> np.ndarray:
        return np.asarray(self.domain.shape, dtype=np.int64)

    def device_program(self) -> dict[str, Any]:
        """GRR(ε/m) on every attribute (docs/device-protocol.md); memoized: as rr-ind's."""
        if self.memoize is None:
            return dp.program(self.name, self.domain, self.m,
                              [dp.channel_step([j], P) for j, P in enumerate(self.channels)])
        out = dp.program(self.name, self.domain, self.m, [
            dp.channel_step([j], Q) for j, Q in enumerate(self.instantaneous or [])])
        out["memoize"] = {"rotation_s": self.memoize.rotation_s, "permanent": [
            dp.channel_step([j], P) for j, P in enumerate(self.permanent)]}
        return out

    def randomize(self, records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Every attribute through its permanent GRR, then the instantaneous one if any."""
        x = self._records(records).astype(report_dtype(self.domain.shape), copy=False)
        out = np.empty(x.shape, dtype=x.dtype)
        for j, P in enumerate(self.permanent):
            out[:, j] = ch.randomize(x[:, j], P, rng)
        return self.randomize_instantaneous(out, rng)

    def tensors(self, marginals: Sequence[Sequence[str]] = ()) -> list[TensorSpec]:
        return self._column_tensors()

    def estimate_all(self, counts: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        out = []
        for a, d, e in zip(self.domain.attrs, self.domain.shape, self.eps_report):
            c = np.asarray(counts[marginal_key((a,))], dtype=float)
            out.append(grr_decode(c, c.sum(), e, d))
        return out

    def column(self, counts: Mapping[str, np.ndarray], i: int
               ) -> tuple[np.ndarray, float, np.ndarray]:
        """GRR: α = p − q, β = q."""
        p, q = ch.grr_pq(self.eps_report[i], self.domain.shape[i])
        return (np.asarray(counts[marginal_key((self.domain.attrs[i],))], dtype=float), p - q,
                np.full(self.domain.shape[i], q))

    def variance(self, f, n, fixed_data=True):
        return [grr_decode_variance(fk, n, e, d, fixed_data)
                for fk, d, e in zip(f, self.domain.shape, self.eps_report)]

    def channel_matrix(self):
        X = _all_records(self.domain.shape)
        Y = _all_records(self.domain.shape)
        P = np.ones((len(X), len(Y)))
        for j, C in enumerate(self.channels):
            P *= C[X[:, j]][:, Y[:, j]]
        return X, P


# --- SMP -----------------------------------------------------------------------------------------

@register
class SMP(_Memoizing):
    """Sample one attribute j uniformly and report (j, GRR_ε(x_j)); ε = max_j ε(P_j).
    Memoized (``memoize``; ``instantaneous_epsilon`` a record budget like ε): j fixed per
    (device, rotation period) by a hash of both (independent of the record), GRR_ε(x_j) the
    permanent response per (j, value), a fresh GRR over its d_j values on top; ``channels``
    and the estimates use the composed GRR."""

    name = "smp"

    def __init__(self, domain: Domain, epsilon: float, version: int = 0,
                 memoize: Memoize | None = None) -> None:
        super().__init__(domain, epsilon, version)
        self.memoize = memoize
        self._set_grr_channels(self.target_epsilon)
        self._dmax = max(domain.shape)

    @property
    def epsilon(self) -> float:
        # Pr((j, y) | x) = P_j(x_j, y)/m: the ratio over any two records is that of one column
        return max(ch.epsilon(P) for P in self.channels)

    def guarantee(self) -> Guarantee:
        """Memoized: one (attribute, value) memo per period, so a rotation costs the dearest
        permanent GRR; a day that times the periods it meets."""
        if self.memoize is None:
            return Guarantee.fresh(self.epsilon)
        per_rotation = max(ch.epsilon(P) for P in self.permanent)
        return Guarantee(self.epsilon, True, self.memoize.rotation_s, per_rotation,
                         per_rotation * periods_per_window(DAY_S, self.memoize.rotation_s))

    def memoization(self) -> Memoization | None:
        if self.memoize is None:
            return None
        return Memoization(self.memoize, self.permanent, self.randomize_instantaneous,
                           unit="marginal", draw=self.randomize_permanent)

    def randomize_permanent(self, records: np.ndarray, device_ids: np.ndarray, period: int,
                            rng: np.random.Generator) -> np.ndarray:
        """Reports (j, GRR_ε(x_j)) with j = :func:`~.partitioned.assign_by_device` of (id,
        period) over the m attributes (seed 0)."""
        from ldpstream.estimators.families.partitioned import assign_by_device
        return self._sampled(records, assign_by_device(np.asarray(device_ids), self.m, 0, period),
                             self.permanent, rng)

    def randomize_instantaneous(self, reports: np.ndarray, rng: np.random.Generator
                                ) -> np.ndarray:
        """The instantaneous GRR of each report's value (the reports themselves without)."""
        if self.instantaneous is None:
            return reports
        out = np.array(reports, copy=True)
        for a, Q in enumerate(self.instantaneous):
            sel = out[:, 0] == a
            out[sel, 1] = ch.randomize(out[sel, 1], Q, rng)
        return out

    @property
    def epsilon_attribute(self) -> float:
        return self.epsilon

    @property
    def report_width(self) -> int:
        return 2

    def report_bounds(self) -> np.ndarray:
        return np.asarray([self.m, self._dmax], dtype=np.int64)

    def device_program(self) -> dict[str, Any]:
        """A uniform attribute index in column 0, its GRR in column 1
        (docs/device-protocol.md); memoized: that select under ``memoize`` (``kind: select``,
        the index fixed per device and period) with the permanent GRRs, the instantaneous
        keep probabilities beside it."""
        def select(channels: Sequence[np.ndarray]) -> dict[str, Any]:
            return dp.select_step(0, [[dp.grr_step([j], float(P[0, 0]), out=[1])]
                                      for j, P in enumerate(channels)])
        if self.memoize is None:
            return dp.program(self.name, self.domain, 2, [select(self.channels)])
        out = dp.program(self.name, self.domain, 2, [])
        out["memoize"] = {"rotation_s": self.memoize.rotation_s, "kind": "select", "seed": "0",
                          "permanent": [select(self.permanent)],
                          "instantaneous_p": None if self.instantaneous is None else
                          [float(Q[0, 0]) for Q in self.instantaneous]}
        return out

    def randomize(self, records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A uniform attribute per report through its GRR (memoized: the permanent GRR, then
        the instantaneous one; one report per record)."""
        x = self._records(records)
        out = self._sampled(x, rng.integers(0, self.m, len(x)), self.permanent, rng)
        return self.randomize_instantaneous(out, rng)

    def _sampled(self, records: np.ndarray, j: np.ndarray, channels: Sequence[np.ndarray],
                 rng: np.random.Generator) -> np.ndarray:
        x = self._records(records)
        n = len(x)
        dtype = report_dtype((self.m, self._dmax))
        xj = x[np.arange(n), j]
        y = np.empty(n, dtype=dtype)
        for a, P in enumerate(channels):
            sel = j == a
            y[sel] = ch.randomize(xj[sel].astype(dtype), P, rng)
        return np.stack([np.asarray(j).astype(dtype), y], axis=1)

    @classmethod
    def from_config(cls, domain: Domain, params: Mapping[str, Any] | None, *,
                    epsilon: float | None, epsilon_scope: str = "attribute",
                    version: int = 0) -> "SMP":
        """One report per record costing :func:`~.mechanism.record_budget`; ``memoize``
        (``instantaneous_epsilon`` a record budget like ε)."""
        pr = Params(cls.name, params)
        raw = pr.value("memoize")
        pr.done()
        m = len(domain)
        return cls(domain, record_budget(epsilon, epsilon_scope, m), version=version,
                   memoize=None if raw is None else memoize_param(
                       raw, lambda e: (record_budget(e, epsilon_scope, m),) * m))

    def tensors(self, marginals: Sequence[Sequence[str]] = ()) -> list[TensorSpec]:
        return [TensorSpec("smp", ("attribute", "value"), (self.m, self._dmax), (0, 1))]

    def counted(self, counts):
        return int(np.asarray(counts["smp"]).sum())

    def estimate_all(self, counts: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        t = np.asarray(counts["smp"], dtype=float)
        out = []
        for j, (d, e) in enumerate(zip(self.domain.shape, self.eps_report)):
            nj = t[j].sum()
            out.append(grr_decode(t[j, :d], nj, e, d) if nj > 0 else np.full(d, np.nan))
        return out

    def column(self, counts: Mapping[str, np.ndarray], i: int
               ) -> tuple[np.ndarray, float, np.ndarray]:
        """The reports of the users who sampled attribute i (given their number), GRR."""
        d = self.domain.shape[i]
        p, q = ch.grr_pq(self.eps_report[i], d)
        return np.asarray(counts["smp"], dtype=float)[i, :d], p - q, np.full(d, q)

    def variance(self, f, n, fixed_data=True):
        # conditional on n_j ≈ n/m reports for attribute j (E[1/n_j] to second order), plus the
        # sampling of which users report j; on a fixed dataset the f(1−f)/n term cancels.
        inv = (self.m / n) * (1 + (self.m - 1) / n)
        out = []
        for fk, d, e in zip(f, self.domain.shape, self.eps_report):
            p, q = ch.grr_pq(e, d)
            fk = np.asarray(fk, dtype=float)
            lam = q + (p - q) * fk
            v = inv * lam * (1 - lam) / (p - q) ** 2
            out.append(v - fk * (1 - fk) / n if fixed_data else v)
        return out

    def channel_matrix(self):
        X = _all_records(self.domain.shape)
        offs = np.concatenate([[0], np.cumsum(self.domain.shape)])
        P = np.zeros((len(X), offs[-1]))
        for j, C in enumerate(self.channels):
            P[:, offs[j]:offs[j + 1]] = C[X[:, j]] / self.m
        return X, P

    def report_index(self, reports):
        offs = np.concatenate([[0], np.cumsum(self.domain.shape)])
        r = np.asarray(reports, dtype=np.intp)
        return offs[r[:, 0]] + r[:, 1]


# --- RS+FD / RS+RFD ------------------------------------------------------------------------------

@register
class RSFD(_Multi):
    """Random sampling plus fake data [Arcolezi et al.]: the sampled attribute through GRR(ε'),
    the others uniform fakes; the report has all m values and no index.

    ``scope="attribute"`` (published): ε' from the amplification, exact for records differing in
    one attribute (:func:`amplification_for`; Arcolezi's ln(m(e^ε−1)+1) for one common d), so
    ``epsilon_attribute == ε`` and the record-level ``epsilon == ε'``. ``scope="record"``: ε' = ε.
    """

    name = "rs-fd"

    def __init__(self, domain: Domain, epsilon: float, scope: str = "attribute",
                 version: int = 0) -> None:
        super().__init__(domain, epsilon, version)
        if scope not in ("attribute", "record"):
            raise ValueError(f"scope must be 'attribute' or 'record', got {scope!r}")
        self.scope = scope
        self.priors = self._priors()
        self.eps_prime = (amplification_for(self.target_epsilon, domain.shape, self._amp_priors())
                          if scope == "attribute" else self.target_epsilon)
        self.channels = [ch.grr(self.eps_prime, d) for d in domain.shape]

    def _priors(self) -> list[np.ndarray]:
        return [np.full(d, 1.0 / d) for d in self.domain.shape]

    def _amp_priors(self):
        return None

    @property
    def epsilon(self) -> float:
        # all reported values matching one record and none the other: Σ_j P_j(x_j,y_j)/π_j(y_j)
        # ratios are all p'/q' = e^{ε'}; no pair of records does worse
        return max(ch.epsilon(P) for P in self.channels)

    @property
    def epsilon_attribute(self) -> float:
        return _rs_attribute_eps(self.eps_prime, self.domain.shape, self.priors)

    @property
    def report_width(self) -> int:
        return self.m

    def report_bounds(self) -> np.ndarray:
        return np.asarray(self.domain.shape, dtype=np.int64)

    def _fakes(self, n: int, rng: np.random.Generator, dtype) -> np.ndarray:
        return np.stack([rng.integers(0, d, n) for d in self.domain.shape], axis=1).astype(dtype)

    def _fake_step(self, k: int) -> dict[str, Any]:
        return dp.uniform_step([k])

    def device_program(self) -> dict[str, Any] | None:
        """A hidden uniform attribute j: GRR(ε') on it, fakes on the others
        (docs/device-protocol.md)."""
        return dp.program(self.name, self.domain, self.m, [dp.select_step(None, [
            [dp.grr_step([j], float(P[0, 0])) if k == j else self._fake_step(k)
             for k in range(self.m)] for j, P in enumerate(self.channels)])])

    def randomize(self, records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        x = self._records(records)
        n = len(x)
        dtype = report_dtype(self.domain.shape)
        out = self._fakes(n, rng, dtype)
        j = rng.integers(0, self.m, n)
        for a, P in enumerate(self.channels):
            sel = np.nonzero(j == a)[0]
            out[sel, a] = ch.randomize(x[sel, a].astype(dtype), P, rng)
        return out

    def tensors(self, marginals: Sequence[Sequence[str]] = ()) -> list[TensorSpec]:
        return self._column_tensors()

    def _pq(self, d: int) -> tuple[float, float]:
        return ch.grr_pq(self.eps_prime, d)

    def estimate_all(self, counts: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        out = []
        for a, d, pri in zip(self.domain.attrs, self.domain.shape, self.priors):
            c = np.asarray(counts[marginal_key((a,))], dtype=float)
            p, q = self._pq(d)
            lam = c / c.sum()
            out.append((self.m * lam - q - (self.m - 1) * pri) / (p - q))
        return out

    def column(self, counts: Mapping[str, np.ndarray], i: int
               ) -> tuple[np.ndarray, float, np.ndarray]:
        """Q = (GRR(ε') + (m − 1)·1πᵀ)/m (sampled with probability 1/m, else a fake from π):
        α = (p − q)/m, β = (q + (m − 1)·π)/m."""
        c = np.asarray(counts[marginal_key((self.domain.attrs[i],))], dtype=float)
        p, q = self._pq(self.domain.shape[i])
        return c, (p - q) / self.m, (q + (self.m - 1) * self.priors[i]) / self.m

    def variance(self, f, n, fixed_data=True):
        out = []
        for fk, d, pri in zip(f, self.domain.shape, self.priors):
            p, q = self._pq(d)
            fk = np.asarray(fk, dtype=float)
            lam = (q + (p - q) * fk + (self.m - 1) * pri) / self.m
            v = self.m ** 2 * lam * (1 - lam) / (n * (p - q) ** 2)
            out.append(v - fk * (1 - fk) / n if fixed_data else v)
        return out

    def channel_matrix(self):
        X = _all_records(self.domain.shape)
        Y = _all_records(self.domain.shape)
        base = np.ones(len(Y))
        for k, pri in enumerate(self.priors):
            base = base * pri[Y[:, k]]
        P = np.zeros((len(X), len(Y)))
        for j, C in enumerate(self.channels):
            P += C[X[:, j]][:, Y[:, j]] / self.priors[j][Y[:, j]][None, :]
        return X, P * base[None, :] / self.m

    @classmethod
    def config_params(cls, pr: Params, domain: Domain) -> dict[str, Any]:
        """``neighbours``: ``record`` (default: ε-LDP on whole records, ε' = ε) or
        ``attribute`` (the published amplified ε', exact for one-attribute neighbours)."""
        return {"scope": pr.choice("neighbours", "record", ("record", "attribute"))}

    def state(self) -> dict[str, Any]:
        st = super().state()
        st["scope"] = self.scope
        return st

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "RSFD":
        return cls(Domain.from_dict(state["domain"]), float(state["epsilon"]),
                   scope=state.get("scope", "attribute"), version=int(state.get("version", 0)))


@register
class RSRFD(RSFD):
    """RS+RFD [Arcolezi et al.]: as RS+FD with every fake drawn from a prior π_k (a published
    distribution, e.g. a Phase I estimate; floored so every value has mass ≥ ``floor``/d_k). The
    sampled attribute's ε' is solved for the actual priors so that the declared ε holds exactly
    (``scope="attribute"``) — Arcolezi's uniform closed form would overstate the privacy when π is
    skewed. Unbiased estimator: f̂ = (m·λ̂ − q' − (m−1)π)/(p' − q').

    Two-phase (``phase=0`` at version 0, what a config without ``priors`` builds): the first
    ``phase1_reports`` devices report with SPL (GRR(ε/m) per attribute); :meth:`adapt` turns their
    clip-rescaled estimates into the priors of the next version (phase 1, RS+RFD). The estimate
    combines both phases' unbiased estimates per attribute with fixed inverse-variance weights
    (variances at the uniform distribution, so the weights do not depend on the data and the
    combination stays unbiased)."""

    name = "rs-rfd"
    PHASE1_REPORTS = 1000
    adaptive = True

    def __init__(self, domain: Domain, epsilon: float, priors: Sequence[np.ndarray] | None = None,
                 scope: str = "attribute", floor: float = 0.1, version: int = 0,
                 phase: int | None = None, phase1_reports: int | None = None,
                 phase1_fraction: float = 0.1, priors_since: int | None = None) -> None:
        self.floor = float(floor)
        if not 0 < self.floor <= 1:
            raise ValueError(f"rs-rfd: prior floor must be in (0, 1], got {floor!r}")
        if priors is None:
            priors = [np.full(d, 1.0 / d) for d in domain.shape]
        if len(priors) != len(domain):
            raise ValueError(f"rs-rfd: {len(domain)} attributes but {len(priors)} priors")
        self._raw_priors = [np.asarray(p, dtype=float) for p in priors]
        for p, d in zip(self._raw_priors, domain.shape):
            if p.shape != (d,) or not np.all(np.isfinite(p)):
                raise ValueError(f"rs-rfd: a prior must be {d} finite numbers")
        super().__init__(domain, epsilon, scope, version)
        if phase not in (None, 0, 1):
            raise ValueError(f"phase must be 0, 1 or None, got {phase!r}")
        self.phase = phase
        self.phase1_reports = self.PHASE1_REPORTS if phase1_reports is None else int(phase1_reports)
        self.phase1_fraction = float(phase1_fraction)
        self.priors_since = self.version if priors_since is None else int(priors_since)
        self.spl = SPL(domain, self.target_epsilon)

    def _priors(self) -> list[np.ndarray]:
        return [(1 - self.floor) * clip_rescale(p) + self.floor / len(p) for p in self._raw_priors]

    def _amp_priors(self):
        return self.priors

    def _fake_step(self, k: int) -> dict[str, Any]:
        d = self.domain.shape[k]
        return dp.matrix_step([k], np.tile(self.priors[k], (d, 1)))

    def device_program(self) -> dict[str, Any] | None:
        """Phase 0: SPL; then RS+RFD with fakes from the priors (a matrix of identical rows);
        None when the priors' matrices exceed the description's 4,096 entries."""
        if self.phase == 0:
            return dict(self.spl.device_program(), family=self.name)
        if sum(d * d for d in self.domain.shape) * (self.m - 1) > 4096:
            return None
        return super().device_program()

    @property
    def epsilon(self) -> float:
        return self.spl.epsilon if self.phase == 0 else super().epsilon

    @property
    def epsilon_attribute(self) -> float:
        return self.spl.epsilon_attribute if self.phase == 0 else super().epsilon_attribute

    def _fakes(self, n, rng, dtype):
        cols = []
        for pri in self.priors:
            cum = np.cumsum(pri)
            cum[-1] = 1.0
            cols.append(np.searchsorted(cum, rng.random(n), side="right"))
        return np.stack(cols, axis=1).astype(dtype)

    def randomize(self, records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """SPL reports in phase 0, RS+RFD reports otherwise."""
        return self.spl.randomize(records, rng) if self.phase == 0 else \
            super().randomize(records, rng)

    # -- the two-phase protocol
    @classmethod
    def config_params(cls, pr: Params, domain: Domain) -> dict[str, Any]:
        """As rs-fd, plus ``priors`` (one list of d_k numbers per attribute: fixed priors,
        nothing adapts) or the SPL round ``phase1_reports`` (1000) / ``phase1_fraction`` (of the
        devices ``simulate`` plans for, 0.1), and the priors' ``floor`` (0.1)."""
        kw = super().config_params(pr, domain)
        kw["floor"] = pr.number("floor", 0.1, gt=0.0, le=1.0)
        kw["phase1_reports"] = pr.integer("phase1_reports", None, ge=1)
        kw["phase1_fraction"] = pr.number("phase1_fraction", 0.1, gt=0.0, lt=1.0)
        priors = pr.value("priors")
        if priors is None:
            kw["phase"] = 0
            return kw
        if (not isinstance(priors, list) or len(priors) != len(domain) or not all(
                isinstance(p, list) and len(p) == d and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0
                    for x in p) and sum(p) > 0
                for p, d in zip(priors, domain.shape))):
            raise ParamError("priors", f"must be {len(domain)} lists of non-negative numbers "
                                       f"of lengths {list(domain.shape)}")
        kw["priors"] = [np.asarray(p, dtype=float) for p in priors]
        return kw

    def _next(self, **kw: Any) -> "RSRFD":
        st = {**self.state(), **kw}
        return RSRFD.from_state(st)

    def planned_for(self, n: int) -> "RSRFD":
        if self.phase != 0:
            return self
        return self._next(phase1_reports=max(1, int(round(self.phase1_fraction * n))))

    def accepted_versions(self) -> tuple[int, ...]:
        """Phase 1 after an SPL round: the SPL versions and this one."""
        return tuple(range(self.version + 1)) if self.phase == 1 else (self.version,)

    def _split(self, counts: VersionedCounts) -> tuple[dict[str, np.ndarray] | None,
                                                       dict[str, np.ndarray] | None]:
        """(SPL counts, RS+RFD counts of the current priors) summed over their versions."""
        spl: dict[str, np.ndarray] = {}
        rs: dict[str, np.ndarray] = {}
        for v in self.accepted_versions():
            dest = spl if (self.phase == 0 or v < self.priors_since) else rs
            for k, t in counts.get(v, {}).items():
                dest[k] = dest[k] + np.asarray(t) if k in dest else np.array(t, dtype=np.int64)
        return spl or None, rs or None

    def reports_until_adapt(self, counts: VersionedCounts) -> int | None:
        if self.phase != 0:
            return None
        spl, _ = self._split(counts)
        return max(1, self.phase1_reports - (self.spl.counted(spl) if spl else 0))

    def adapt(self, counts: VersionedCounts) -> "RSRFD | None":
        """End the SPL round: its clip-rescaled estimates become the priors (phase 1)."""
        if self.phase != 0:
            return None
        spl, _ = self._split(counts)
        if spl is None or self.spl.counted(spl) < self.phase1_reports:
            return None
        priors = [clip_rescale(f).tolist() for f in self.spl.estimate_all(spl)]
        return self._next(version=self.version + 1, phase=1, priors=priors,
                          priors_since=self.version + 1)

    def estimate_versions(self, counts: VersionedCounts, attrs: Sequence[str], method: str,
                          **options: Any) -> Estimate:
        """SPL and RS+RFD estimates combined per attribute with fixed inverse-variance weights."""
        i = one_way_axis(self, attrs, method)
        spl, rs = self._split(counts)
        if rs is None:
            if spl is None:
                raise ValueError("rs-rfd: no reports counted")
            return self.spl.estimate(spl, attrs, method, **options)
        if spl is None:
            return self.estimate(rs, attrs, method, **options)
        n1, n2 = self.spl.counted(spl), self.counted(rs)
        u = [np.full(d, 1.0 / d) for d in self.domain.shape]
        s1 = self.spl.variance(u, n1, fixed_data=False)[i].mean()
        s2 = self.variance(u, n2, fixed_data=False)[i].mean()
        w = (1 / s1) / (1 / s1 + 1 / s2)
        est = w * self.spl.estimate_all(spl)[i] + (1 - w) * self.estimate_all(rs)[i]
        f = [np.clip(est, 0, 1) if k == i else x for k, x in enumerate(u)]
        var = (w ** 2 * self.spl.variance(f, n1, fixed_data=False)[i]
               + (1 - w) ** 2 * self.variance(f, n2, fixed_data=False)[i])
        a = self.domain.attrs[i]
        lv = split_level(2)
        b = mixture([w, 1 - w], [self.spl.bound(spl, i, lv), self.bound(rs, i, lv)])
        return Estimate(Factor(self.domain.project((a,)), repair(est, options.get("proper"))),
                        method, int(n1 + n2), max(self.epsilon, self.spl.epsilon),
                        error_bound=b.tvd, bound=b,
                        extra={"variance": var.tolist(), "weight_phase1": float(w),
                               "n1": int(n1), "n2": int(n2)})

    def state(self) -> dict[str, Any]:
        st = super().state()
        st.update(priors=[p.tolist() for p in self._raw_priors], floor=self.floor,
                  phase=self.phase, phase1_reports=self.phase1_reports,
                  phase1_fraction=self.phase1_fraction, priors_since=self.priors_since)
        return st

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "RSRFD":
        return cls(Domain.from_dict(state["domain"]), float(state["epsilon"]),
                   priors=[np.asarray(p) for p in state["priors"]],
                   scope=state.get("scope", "attribute"), floor=float(state.get("floor", 0.1)),
                   version=int(state.get("version", 0)), phase=state.get("phase"),
                   phase1_reports=state.get("phase1_reports"),
                   phase1_fraction=float(state.get("phase1_fraction", 0.1)),
                   priors_since=state.get("priors_since"))
