"""Drift between two windows' estimates, calibrated to the LDP noise.

Two estimates of the same marginal from disjoint windows differ by sampling noise even when the
population is stationary; under LDP that noise is large (an ε = 1 castell estimate of a 3-way
marginal over 185k reports moves by a TVD of 0.1–0.2). A fixed TVD threshold therefore either
fires on noise or never fires. Here the difference is judged against the estimates' own
variances:

**Variance** (:func:`cell_variance`). Per cell, the sampling variance of the estimate:

* ``castell`` — closed form, :func:`~.castell.castell_variance` (multinomial covariance of the
  randomized table with the plug-in λ = Λ/n, pushed through the linear inverse [Castell §III-B]);
* every other estimator of an independent-channel mechanism (``truncated``, ``ibu``,
  ``rr-independent``, ``hybrid``…) — a bootstrap of the randomized table: ``R`` replicate tables
  Λ* ~ Multinomial(n, Λ/n) (the same plug-in), each estimated by the same estimator, vectorized
  over the replicates (estimators/kernels/batched.py). The replicates' Castell estimates serve as a
  control variate: the estimator's bootstrap variance is multiplied by
  ``castell_variance / bootstrap variance of castell`` on the same replicates, which removes most
  of the Monte Carlo noise of a small ``R`` (the two estimators' errors are strongly correlated);
* other mechanism families — the same bootstrap of every count tensor (each a multinomial
  histogram of the reports) through ``Mechanism.estimate``, without the control variate. This
  ignores covariance *between* tensors, so it is exact for estimators that read one tensor and an
  approximation otherwise.

The bootstrap is seeded by ``seed`` and the counts themselves, so a variance is a deterministic
function of its inputs (a refresh that sees the same counts gets the same answer).

**Test** (:func:`drift_test`). With D = cur − prev and V = Var(cur) + Var(prev) per cell (the
windows do not overlap, so the estimates are independent), the statistic is the largest
standardized cell difference ``max_c |D_c| / sqrt(V_c)`` and the threshold is the two-sided normal
quantile at the Šidák-corrected level ``1 − (1 − α)^{1/k}`` over the k cells. Each z_c is
approximately standard normal under stationarity (the estimates are sums of many independent
reports), and Šidák's inequality — P(all |Z_c| ≤ t) ≥ Π_c P(|Z_c| ≤ t) for jointly normal Z with
any correlation — makes the false-alarm probability per evaluation at most α, equal to α when the
cells are independent; the correlation between cells of one table (their sum is fixed) makes the
rate slightly lower. Only per-cell variances are needed, which every estimator has; a χ²/Wald
statistic would need each estimator's full covariance (|Ω|² entries, which the truncated and EM
estimators do not have in closed form).

The variances the test gets are :func:`null_variances`: both windows' counts pooled (under "no
change" they sample one population), as the two-sample proportion test pools. Each window's own
variance (:func:`cell_variance`) depends on where its estimate landed — a truncated cell clipped
to 0 has a small bootstrap variance — and makes the clipping estimators alarm at about twice α on
noisy tables (tests/test_drift.py measures both).

Reading it: the statistic is "how many standard errors the most-changed cell moved"; a statistic
of 20 against a threshold of 4 is a change far outside the noise, while the TVD says how large the
change is (docs/windows.md).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from scipy.special import ndtri

from ldpstream.estimators.kernels import batched
from ldpstream.estimators.kernels.castell import castell_variance
from ldpstream.estimators.mechanism import (
    DriftTerms,
    Estimate,
    Mechanism,
    VersionedCounts,
    marginal_key,
)

__all__ = ["DriftResult", "drift_test", "drift_tests", "terms_test", "sidak_threshold",
           "cell_variance", "null_variances",
           "pooled_tables", "replicate_rng", "null_size",
           "table_variances",
           "REPLICATES", "BATCHED_METHODS"]

#: bootstrap replicates per variance: with the Castell control variate even 8 keep the drift test
#: calibrated (alarm rates within 3 standard errors of α in tests/test_drift.py's setting)
REPLICATES = 16

#: estimators with a batched kernel (estimators/kernels/batched.py) for mechanisms with product channels
BATCHED_METHODS = ("castell", "truncated", "ibu", "rr-independent")


@dataclass(frozen=True)
class DriftResult:
    """``tvd`` between the two estimates, the calibrated ``statistic`` (max |z| over cells), its
    ``threshold`` at the configured false-alarm probability, and ``alarm`` =
    statistic > threshold and tvd ≥ the minimum effect."""

    tvd: float
    statistic: float
    threshold: float
    alarm: bool
    #: a family's own test (:func:`terms_test`): per quantity what it compared, with its z
    detail: tuple[dict, ...] = ()


def sidak_threshold(cells: int, alpha: float) -> float:
    """Two-sided standard-normal quantile at the Šidák level ``1 − (1 − α)^{1/cells}``: a max of
    ``cells`` jointly normal |z| exceeds it with probability at most α."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"drift alpha must be in (0, 1), got {alpha!r}")
    if cells < 1:
        raise ValueError(f"drift test needs at least one cell, got {cells}")
    per_cell = -math.expm1(math.log1p(-alpha) / cells)
    return float(-ndtri(per_cell / 2.0))


def _cells(name: str, x: np.ndarray) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"drift test: {name} has non-finite cells")
    return a


def drift_test(cur: np.ndarray, cur_var: np.ndarray, prev: np.ndarray, prev_var: np.ndarray, *,
               alpha: float = 1e-3, min_effect: float = 0.0) -> DriftResult:
    """Compare two independent estimates of one marginal (module docstring: max |z| with a
    Šidák threshold). ``cur_var``/``prev_var`` are per-cell variances (:func:`null_variances`)."""
    arrays = [np.asarray(x, dtype=float)[None] for x in (cur, cur_var, prev, prev_var)]
    return drift_tests(*arrays, alpha=alpha, min_effect=min_effect)[0]


def drift_tests(cur: np.ndarray, cur_var: np.ndarray, prev: np.ndarray, prev_var: np.ndarray, *,
                alpha: float = 1e-3, min_effect: float = 0.0) -> list[DriftResult]:
    """:func:`drift_test` of a batch of same-shape marginals (axis 0), in one numpy pass."""
    cur, prev = _cells("cur", cur), _cells("prev", prev)
    cur_var, prev_var = _cells("cur_var", cur_var), _cells("prev_var", prev_var)
    if not (cur.shape == prev.shape == cur_var.shape == prev_var.shape):
        raise ValueError(f"drift test: shapes differ: cur {cur.shape[1:]}, cur_var "
                         f"{cur_var.shape[1:]}, prev {prev.shape[1:]}, prev_var "
                         f"{prev_var.shape[1:]}")
    if np.any(cur_var < 0) or np.any(prev_var < 0):
        raise ValueError("drift test: variances must be ≥ 0")
    min_effect = float(min_effect)
    if not min_effect >= 0:
        raise ValueError(f"drift min_effect must be ≥ 0, got {min_effect!r}")
    K = cur.shape[0]
    threshold = sidak_threshold(int(np.prod(cur.shape[1:], dtype=np.int64)), float(alpha))
    diff = np.abs(cur - prev).reshape(K, -1)
    var = (cur_var + prev_var).reshape(K, -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 0, diff / np.sqrt(var), np.where(diff > 0, np.inf, 0.0))
    stats = z.max(axis=1)
    tvds = 0.5 * diff.sum(axis=1)
    return [DriftResult(float(t), float(st), threshold, bool(st > threshold and t >= min_effect))
            for t, st in zip(tvds, stats)]


def terms_test(terms: DriftTerms, *, alpha: float = 1e-3, min_effect: float = 0.0) -> DriftResult:
    """The drift test of a family's own quantities (``Mechanism.drift_terms``; numeric: a mean,
    quantiles): max |z| over them against the Šidák threshold, as :func:`drift_tests` does over
    cells. ``tvd`` is the largest effect (a share, at most the TVD between the windows); the
    alarm needs one quantity beyond the threshold with an effect of at least ``min_effect``."""
    cur, prev = _cells("cur", terms.cur), _cells("prev", terms.prev)
    var = _cells("cur_var", terms.cur_var) + _cells("prev_var", terms.prev_var)
    effect = _cells("effect", terms.effect)
    if not (cur.shape == prev.shape == var.shape == effect.shape == (len(terms.names),)):
        raise ValueError("drift terms: one value, variance and effect per quantity")
    if np.any(var < 0):
        raise ValueError("drift test: variances must be ≥ 0")
    threshold = sidak_threshold(len(cur), float(alpha))
    diff = np.abs(cur - prev)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 0, diff / np.sqrt(var), np.where(diff > 0, np.inf, 0.0))
    moved = (z > threshold) & (effect >= float(min_effect))
    detail = tuple({**(terms.detail[i] if i < len(terms.detail) else {"quantity": name}),
                    "z": float(z[i]), "effect": float(effect[i])}
                   for i, name in enumerate(terms.names))
    return DriftResult(float(effect.max()), float(z.max()), threshold, bool(moved.any()), detail)


# --- variances ----------------------------------------------------------------------------------

def replicate_rng(seed: int, attrs: Sequence[str], method: str, table: np.ndarray) -> np.random.Generator:
    """A generator determined by ``seed``, the marginal, the estimator and the counts."""
    tag = zlib.crc32(("|".join(attrs) + "#" + method).encode())
    data = zlib.crc32(np.ascontiguousarray(table, dtype=np.float64).tobytes())
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, tag, data])


def _replicates(table: np.ndarray, rng: np.random.Generator, replicates: int,
                n: int | None = None) -> np.ndarray:
    """``replicates`` tables ~ Multinomial(n, table/Σtable) (n defaults to Σtable), shape
    ``(replicates, *table.shape)``."""
    flat = np.asarray(table, dtype=float).reshape(-1)
    total = float(flat.sum())
    n = int(round(total)) if n is None else int(n)
    if total <= 0 or n <= 0:
        raise ValueError("no reports counted: no variance")
    return (rng.multinomial(n, flat / total, size=replicates)
            .reshape((replicates,) + table.shape).astype(float))


def table_variances(tables: np.ndarray, mats: Sequence[np.ndarray], methods: Sequence[str],
                    rngs: Sequence[np.random.Generator], *, replicates: int = REPLICATES,
                    n: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """Per-cell variances, per method of ``methods`` (each one of :data:`BATCHED_METHODS`), for a
    batch of randomized tables ``(T, *shape)`` with channels ``mats[k]`` (``(T, d_k, d_k)`` or
    shared ``(d_k, d_k)``); module docstring. ``rngs[t]`` draws table t's replicates, which every
    method shares. With ``n``, the variance of an estimate from ``n[t]`` reports drawn with table
    t's frequencies (default: the table's own total)."""
    tables = np.asarray(tables, dtype=float)
    T = tables.shape[0]
    unknown = [m for m in methods if m not in BATCHED_METHODS]
    if unknown:
        raise ValueError(f"no batched variance for {unknown}; batched: {BATCHED_METHODS}")
    invs = batched.inverses(mats)
    totals = tables.reshape(T, -1).sum(axis=1)
    draw = totals.round().astype(np.int64) if n is None else np.asarray(n, dtype=np.int64)
    if draw.shape != (T,):
        raise ValueError(f"n must give one count per table ({T}), got shape {draw.shape}")
    scale = (totals / np.maximum(draw, 1)).reshape((T,) + (1,) * (tables.ndim - 1))
    exact = batched.castell_variance_batch(tables, invs) * scale
    out = {m: exact for m in methods if m == "castell"}
    boot = [m for m in methods if m != "castell"]
    if not boot:
        return out
    R = int(replicates)
    if R < 2:
        raise ValueError(f"bootstrap needs at least 2 replicates, got {R}")
    reps = np.concatenate([_replicates(tables[t], rngs[t], R, int(draw[t])) for t in range(T)])
    rmats = [_per_replicate(M, R) for M in mats]
    rinvs = [_per_replicate(Q, R) for Q in invs]
    shape = (T, R) + tables.shape[1:]
    ref = batched.castell_batch(reps, rinvs).reshape(shape)
    for m in boot:
        if m == "truncated":
            est = batched.truncated_batch(reps, rinvs)
        elif m == "rr-independent":
            est = batched.rr_independent_batch(reps, rinvs)
        else:
            est = batched.ibu_batch(reps, rmats, rinvs).estimates
        out[m] = _controlled(est.reshape(shape), ref, exact)
    return out


def _per_replicate(M: np.ndarray, replicates: int) -> np.ndarray:
    """Per-table matrices repeated for each table's replicates (a shared matrix stays shared)."""
    return M if M.ndim == 2 else np.repeat(M, replicates, axis=0)


def _controlled(est: np.ndarray, ref: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Bootstrap variance of ``est`` over axis 1, scaled by exact/bootstrap variance of ``ref``
    (the Castell control variate; plain bootstrap where ``ref`` did not vary)."""
    v_est = est.var(axis=1, ddof=1)
    v_ref = ref.var(axis=1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(v_ref > 0, v_est * exact / v_ref, v_est)
    return scaled


def _estimates_on(mech: Mechanism, counts: Mapping[str, np.ndarray], attrs: tuple[str, ...],
                 method: str, draws: Mapping[str, np.ndarray]) -> np.ndarray:
    """``method``'s estimates with every tensor of ``draws`` (``(R, *shape)`` replicates) in turn
    replacing its counterpart in ``counts``, stacked along axis 0."""
    R = len(next(iter(draws.values())))
    out = []
    for r in range(R):
        rep = dict(counts)
        rep.update({k: d[r] for k, d in draws.items()})
        out.append(np.asarray(mech.estimate(rep, attrs, method).factor.project(attrs).values,
                              dtype=float))
    return np.stack(out)


def cell_variance(mech: Mechanism, counts: VersionedCounts, attrs: Sequence[str], method: str,
                  est: Estimate, *, seed: int = 0, replicates: int = REPLICATES) -> np.ndarray:
    """Per-cell sampling variance of ``est`` (``mech``'s ``method`` estimate of ``attrs`` from
    ``counts``), shaped like ``est.factor.values`` (module docstring for how)."""
    attrs = tuple(attrs)
    if tuple(est.factor.domain.attrs) != attrs:
        raise ValueError(f"estimate is over {est.factor.domain.attrs}, not {attrs}")
    combined = mech.combined_counts(counts)
    closed = mech.analytic_variance(combined, attrs, method)
    if closed is not None:
        return np.asarray(closed, dtype=float)
    R = int(replicates)
    own = mech.marginal_table(combined, attrs)
    if own is not None:
        table = np.asarray(own, dtype=float)
        rng = replicate_rng(seed, attrs, "own", table)
        P = mech.product_channels(attrs)
        if P is not None:
            if method in BATCHED_METHODS:
                return table_variances(table[None], P, [method], [rng], replicates=R)[method][0]
            draws = _replicates(table, rng, R)
            reps = _estimates_on(mech, {}, attrs, method, {marginal_key(attrs): draws})
            ref = batched.castell_batch(draws, batched.inverses(P))
            return _controlled(reps[None], ref[None], castell_variance(table, P)[None])[0]
        draws = _replicates(table, rng, R)
        return _estimates_on(mech, {}, attrs, method, {marginal_key(attrs): draws}).var(axis=0,
                                                                                       ddof=1)
    flat = np.concatenate([np.asarray(t, dtype=float).reshape(-1) for t in combined.values()])
    rng = replicate_rng(seed, attrs, "own", flat)
    draws = {k: _replicates(np.asarray(t), rng, R) for k, t in combined.items()}
    return _estimates_on(mech, combined, attrs, method, draws).var(axis=0, ddof=1)


def pooled_tables(mech: Mechanism, a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray],
                  attrs: tuple[str, ...]) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, int]]]:
    """The two windows' tensors (``mech.combined_counts`` of each) summed — the population both
    sample under "no change" — and each tensor's report totals per window. Tables of an
    independent-channel mechanism are reduced to the marginal first."""
    ta, tb = mech.marginal_table(a, attrs), mech.marginal_table(b, attrs)
    if ta is not None and tb is not None:
        key = marginal_key(attrs)
        a = {key: np.asarray(ta, dtype=float)}
        b = {key: np.asarray(tb, dtype=float)}
    if set(a) != set(b):
        raise ValueError("the two windows hold different tensors: "
                         f"{sorted(set(a) ^ set(b))}")
    pooled, totals = {}, {}
    for k in a:
        ta, tb = np.asarray(a[k], dtype=float), np.asarray(b[k], dtype=float)
        if ta.shape != tb.shape:
            raise ValueError(f"tensor {k}: shapes differ between the windows ({ta.shape}, "
                             f"{tb.shape})")
        pooled[k] = ta + tb
        totals[k] = (int(round(float(ta.sum()))), int(round(float(tb.sum()))))
    return pooled, totals


def null_variances(mech: Mechanism, cur: VersionedCounts, prev: VersionedCounts,
                   attrs: Sequence[str], method: str, *, seed: int = 0,
                   replicates: int = REPLICATES) -> tuple[np.ndarray, np.ndarray]:
    """Per-cell variances of the ``cur`` and ``prev`` windows' estimates under the hypothesis the
    drift test checks — both windows sample one population — from the *pooled* randomized counts
    (the pooled two-sample test). These are what :func:`drift_test` should get: a window's own
    variance depends on where its estimate landed (a clipped cell has a small variance), which
    makes the truncated and EM estimators alarm at about twice α on noisy tables; pooled, they
    stay at or below α (tests/test_drift.py).

    One set of replicates is drawn at the windows' mean size n̄ and its variance scaled by
    n̄/n_cur and n̄/n_prev (exact for castell, whose variance is ∝ 1/n; first order for the others,
    and windows of one length hold similar numbers of reports)."""
    attrs = tuple(attrs)
    pooled, totals = pooled_tables(mech, mech.combined_counts(cur), mech.combined_counts(prev),
                                   attrs)
    closed = mech.analytic_variance(pooled, attrs, method)
    if closed is not None:   # ∝ 1/n: from the pooled size N to each window's
        n_cur, n_prev = (sum(t[i] for t in totals.values()) for i in (0, 1))
        null_size(n_cur, n_prev)
        v = np.asarray(closed, dtype=float) * (n_cur + n_prev)
        return v / n_cur, v / n_prev
    R = int(replicates)
    key = marginal_key(attrs)
    channels = mech.product_channels(attrs)
    if channels is not None and method in BATCHED_METHODS:
        table = pooled[key]
        n_cur, n_prev = totals[key]
        mid = null_size(n_cur, n_prev)
        rng = replicate_rng(seed, attrs, "null", table)
        v = table_variances(table[None], channels, [method], [rng], replicates=R,
                            n=[mid])[method][0]
        return v * (mid / n_cur), v * (mid / n_prev)
    flat = np.concatenate([t.reshape(-1) for t in pooled.values()])
    rng = replicate_rng(seed, attrs, "null", flat)
    mids = {k: null_size(*t) for k, t in totals.items()}
    draws = {k: _replicates(t, rng, R, mids[k]) for k, t in pooled.items()}
    v = _estimates_on(mech, pooled, attrs, method, draws).var(axis=0, ddof=1)
    n_cur, n_prev = totals[key] if key in totals else next(iter(totals.values()))
    mid = mids[key] if key in mids else next(iter(mids.values()))
    return v * (mid / n_cur), v * (mid / n_prev)


def null_size(n_cur: int, n_prev: int) -> int:
    """Reports per replicate of the null bootstrap: the windows' mean size."""
    if n_cur <= 0 or n_prev <= 0:
        raise ValueError("a window without reports has no drift")
    return max(1, int(round((n_cur + n_prev) / 2)))
