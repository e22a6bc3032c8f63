"""One distribution fitted to every measured marginal, stopped where its predicted error is
smallest (docs/partitioned.md "Global fit").

Measurements: tables y_S (unbiased, noisy) of the attribute sets S with known cell variances
σ²_S (one per table, or one per cell). The fit is the loss Private-PGM minimises (McKenna,
Sheldon & Miklau, ICML 2019, §3),
L(p) = ½ Σ_S ‖p_S − y_S‖² / σ²_S over distributions p of the whole domain (a dense table here),
by entropic mirror descent from the uniform table with a backtracking step (ibid. Alg. 1).
Run to convergence it fits the noise; the iterates in between are smoother (closer to the
uniform, maximum-entropy start). The iterate kept is the one of smallest Stein's unbiased risk
estimate (Stein 1981) of its fitted marginals,

    SURE_t = Σ_S ‖y_S − p_t,S‖² / σ²_S − N + 2·div_t,

(N measured cells), an unbiased estimate of Σ_S ‖p_t,S − μ_S‖² / σ²_S (μ: the true marginals)
for Gaussian noise. The divergence div_t = Σ ∂(p_t,S/σ_S)/∂(y_S/σ_S) is estimated by Monte Carlo
(Ramani, Blu & Unser 2008): seeded probes b ~ N(0, I) (:data:`PROBES`), each a run on
y + h·σ·b with the same steps, div_t ≈ mean of bᵀ(p'_t − p_t)/(h·σ). :func:`sure` gives the
same estimate for any other estimator, so two are compared on one scale.

The descent may fit smoothed tables instead of y (``smoothed``: an estimator's tables at y and
at each probe's y + h·σ·b, e.g. the shrunk consistent tables of ``partitioned``): its iterates
then start from the uniform table toward the smoothed tables, and SURE is that of the
composition (residual to y, divergence through both).

>>> from ldpstream.estimators.kernels.domain import Domain, Factor
>>> dom = Domain(["a", "b"], [2, 2])
>>> y = [Factor(Domain(["a"], [2]), np.array([0.7, 0.3])),
...      Factor(Domain(["b"], [2]), np.array([0.4, 0.6]))]
>>> r = global_fit(dom, y, [1e-6, 1e-6])
>>> np.round(r.table, 3).tolist()       # exact measurements: their product
[[0.28, 0.42], [0.12, 0.18]]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ldpstream.estimators.kernels.domain import Domain, Factor

__all__ = ["GlobalFit", "global_fit", "choose_fit", "sure", "probes", "MAX_CELLS", "MAX_ITER", "PATIENCE",
           "PROBE_STEP", "PROBE_SEED", "PROBES", "GROWTH"]

#: largest domain (cells of the full table) fitted; larger ones keep the consistent tables
MAX_CELLS = 400_000
#: mirror-descent iterations at most
MAX_ITER = 300
#: iterations without a new smallest SURE after which the descent stops
PATIENCE = 10
#: the probe's size in units of each cell's standard deviation
PROBE_STEP = 1e-3
#: probes averaged in the divergence's Monte Carlo estimate
PROBES = 4
#: the step's growth after an accepted step (backtracking halves it when needed)
GROWTH = 1.2
#: seed of the probe (the fit is a function of the measurements)
PROBE_SEED = 20_190_611


@dataclass(frozen=True)
class GlobalFit:
    """``table``: the kept iterate (the domain's shape, sums to 1); ``iterations``: its index;
    ``risk``: its SURE; ``ran``: iterations run."""

    table: np.ndarray
    iterations: int
    risk: float
    ran: int


@dataclass(frozen=True)
class _Target:
    drop: tuple[int, ...]        # axes summed out of the full table
    perm: tuple[int, ...]        # the measurement's axes → domain order
    shape: tuple[int, ...]       # broadcast shape in the full table
    y: np.ndarray                # measurement, domain axis order
    sd: np.ndarray               # σ_S per cell, domain axis order


Variance = float | np.ndarray


def _sd(table: Factor, variance: Variance) -> np.ndarray:
    """σ per cell of ``table`` (a scalar variance broadcast)."""
    v = np.broadcast_to(np.asarray(variance, dtype=float), np.shape(table.values))
    return np.sqrt(np.maximum(v, 1e-300))


def _targets(domain: Domain, tables: Sequence[Factor], variances: Sequence[Variance]
             ) -> list[_Target]:
    out = []
    for t, v in zip(tables, variances):
        ax = domain.axes(t.domain.attrs)
        kept = sorted(ax)
        perm = tuple(list(ax).index(i) for i in kept)
        out.append(_Target(tuple(i for i in range(len(domain)) if i not in ax), perm,
                           tuple(domain.shape[i] if i in ax else 1 for i in range(len(domain))),
                           np.transpose(np.asarray(t.values, dtype=float), perm),
                           np.transpose(_sd(t, v), perm)))
    return out


def probes(tables: Sequence[Factor], seed: int = PROBE_SEED) -> list[np.ndarray]:
    """The seeded standard-normal probe, one array per table (the table's shape)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(np.shape(t.values)) for t in tables]


def sure(tables: Sequence[Factor], variances: Sequence[Variance], fitted: Sequence[np.ndarray],
         perturbed: Sequence[np.ndarray], probe: Sequence[np.ndarray],
         step: float = PROBE_STEP) -> float:
    """SURE (module docstring) of an estimator whose fitted tables are ``fitted`` at the
    measurements and ``perturbed`` at y + ``step``·σ·``probe`` (each in its table's axes)."""
    res = div = 0.0
    n = 0
    for t, v, f, g, b in zip(tables, variances, fitted, perturbed, probe):
        sd = _sd(t, v)
        res += float((((np.asarray(t.values) - f) / sd) ** 2).sum())
        div += float((b * (g - f) / sd).sum()) / step
        n += b.size
    return res - n + 2.0 * div


def _loss_grad(p: np.ndarray, targets: Sequence[_Target], shift: Sequence[np.ndarray]
               ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Loss, gradient and fitted marginals of a stack of tables ``p`` (leading axis: the
    run at the measurements, then one per probe; ``shift[k]``: the measurements' offset per
    run, shape (runs, …))."""
    loss = np.zeros(len(p))
    grad = np.zeros(p.shape)
    fitted = []
    for k, t in enumerate(targets):
        mu = p.sum(axis=tuple(d + 1 for d in t.drop)) if t.drop else p
        r = (mu - (t.y + shift[k])) / t.sd ** 2
        loss += 0.5 * (r * r * t.sd ** 2).reshape(len(p), -1).sum(axis=1)
        grad = grad + r.reshape((len(p),) + t.shape)
        fitted.append(mu)
    return loss, grad, fitted


def _step(p: np.ndarray, grad: np.ndarray, eta: float) -> np.ndarray:
    axes = tuple(range(1, p.ndim))
    q = p * np.exp(-eta * (grad - grad.max(axis=axes, keepdims=True)))
    return q / q.sum(axis=axes, keepdims=True)


def global_fit(domain: Domain, tables: Sequence[Factor], variances: Sequence[Variance], *,
               max_iter: int = MAX_ITER, patience: int = PATIENCE, n_probes: int = PROBES,
               seed: int = PROBE_SEED, smoothed: Sequence[Sequence[np.ndarray]] | None = None,
               on_iterate: Callable[[int, np.ndarray, float], None] | None = None) -> GlobalFit:
    """The fit of the module docstring, the divergence averaged over ``n_probes`` probes.
    ``smoothed``: the descent fits these tables instead of the measurements — ``smoothed[0]``
    an estimator's tables at the measurements, ``smoothed[i]`` its tables at the i-th probe's
    (y + :data:`PROBE_STEP`·σ·:func:`probes` ``(tables, seed + i − 1)``) — and SURE is that of
    the composition (the residual still to the measurements). ``on_iterate(t, p_t, SURE_t)``:
    called every iteration (tests, benchmarks)."""
    if domain.size() > MAX_CELLS:
        raise ValueError(f"global fit: the domain has {domain.size():,} cells, more than "
                         f"{MAX_CELLS:,}")
    targets = _targets(domain, tables, variances)
    runs = 1 + n_probes
    probe = [np.stack([np.zeros(t.y.shape)] + [np.transpose(b, t.perm) for b in bs])
             for t, bs in zip(targets, zip(*[probes(tables, seed + i)
                                            for i in range(n_probes)]))]
    shift = [PROBE_STEP * t.sd * b for t, b in zip(targets, probe)]
    if smoothed is not None:   # the fitted tables' offsets from the measurements, per run
        shift = [np.stack([np.transpose(np.asarray(run[k], dtype=float), t.perm) for run in
                           smoothed]) - t.y for k, t in enumerate(targets)]
    n = sum(t.y.size for t in targets)
    p = np.full((runs,) + tuple(domain.shape), 1.0 / domain.size())
    loss, grad, fit = _loss_grad(p, targets, shift)
    eta = min(float(t.sd.min()) for t in targets) ** 2
    best = (np.inf, 0, p[0])
    it = 0
    for it in range(1, max_iter + 1):
        while True:   # backtracking on the run at the measurements (mirror-descent bound)
            q = _step(p, grad, eta)
            lq, gq, fq = _loss_grad(q, targets, shift)
            bound = loss[0] + float((grad[0] * (q[0] - p[0])).sum()) + float(
                np.abs(q[0] - p[0]).sum()) ** 2 / (2 * eta)
            if lq[0] <= bound or eta < 1e-300:
                break
            eta *= 0.5
        p, loss, grad, fit = q, lq, gq, fq   # the probes' runs take the same steps
        div = sum(float((b[1:] * (f[1:] - f[0]) / t.sd).sum()) / PROBE_STEP
                  for t, b, f in zip(targets, probe, fit)) / n_probes
        res = sum(float((((f[0] - t.y) / t.sd) ** 2).sum()) for t, f in zip(targets, fit))
        risk = res - n + 2.0 * div
        if on_iterate is not None:
            on_iterate(it, p[0], risk)
        if risk < best[0]:
            best = (risk, it, p[0])
        elif it - best[1] >= patience:
            break
        eta *= GROWTH
    return GlobalFit(best[2], best[1], float(best[0]), it)


def choose_fit(domain: Domain, tables: Sequence[Factor], variances: Sequence[Variance],
               smoothed: Sequence[np.ndarray],
               smoother: Callable[[list[Factor]], list[np.ndarray]]
               ) -> tuple[np.ndarray | None, dict[str, Any]]:
    """A smoothing estimator's tables (``smoothed`` = ``smoother(tables)``) or the global fit
    to them, whichever has the smaller SURE against the measurements ``tables`` (the same
    :data:`PROBES` probes for both): (the global fit's table, or None for the smoothed tables;
    ``{"chosen": "global" | "consistent", "sure_global", "sure_consistent", "iterations"}`` or,
    above :data:`MAX_CELLS` cells, ``{"chosen": "consistent", "reason"}``)."""
    info: dict[str, Any] = {"chosen": "consistent"}
    if domain.size() > MAX_CELLS:
        info["reason"] = (f"the domain has {domain.size():,} cells, more than the global "
                          f"fit's {MAX_CELLS:,}")
        return None, info
    risks, runs = [], [list(smoothed)]
    for i in range(PROBES):
        b = probes(tables, PROBE_SEED + i)
        moved = smoother([Factor(t.domain, np.asarray(t.values) + PROBE_STEP * _sd(t, v) * bb)
                          for t, v, bb in zip(tables, variances, b)])
        risks.append(sure(tables, variances, smoothed, moved, b))
        runs.append(moved)
    risk = float(np.mean(risks))
    fit = global_fit(domain, tables, variances, smoothed=runs)
    info.update(sure_global=round(fit.risk, 3), sure_consistent=round(risk, 3),
                iterations=fit.iterations)
    if fit.risk < risk:
        info["chosen"] = "global"
        return fit.table, info
    return None, info
