"""The bound of the estimate partitioned serves, not of a proxy: a parametric bootstrap of the
``global`` or ``consistent`` estimator itself (docs/partitioned.md "Bootstrap bounds").

The proxy bound (the unbiased table's, :func:`~.bounds.oracle_bound`) covers the served
estimate far more often than 95 % and is several times its error; a marginal no collected table
holds gets the trivial bound 1. Here the estimator is run again on tables drawn through the
mechanism's own channels (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, §6.5,
the parametric bootstrap), and the bound is the 95 % quantile of the served estimate's TVD to the
distribution the tables were drawn from:

1. **the reference**, one table per collected marginal: the served table moved toward the
   unbiased one (projected onto the simplex) until its interaction (the table minus its additive
   main effects) carries the energy the unbiased table's does beyond its noise,
   ‖I(u)‖² − E‖I(noise)‖² (:func:`deshrunk`). The served tables themselves are shrunk: drawn
   from them, every draw would look like the shrinkage's own target and the bound would
   under-cover (measured: 58–85 %); drawn from the unbiased tables, the reference is noisier
   than the truth and the bound over-covers. The de-shrunk tables are then made the marginals
   of one distribution over the whole domain, their maximum-entropy one (:func:`realized`),
   which is also the reference of a marginal no collected table holds;
2. :data:`DRAWS` report tables per collected marginal drawn from the reference through its
   oracle, as many reports as the marginal counted (GRR: the multinomial of its report values,
   normal once every expected count is ≥ 50; OLH: the normal approximation of its unbiased
   table, [Wang17] eq. 4 plus the sampling of users, as :func:`~.bounds.oracle_bound`);
3. each draw estimated by the same estimator (the whole risk-based choice for ``global``); per
   served marginal the ⌈0.95·(B+1)⌉-th smallest TVD(draw's estimate, reference), and per cell
   a t interval around served less the draws' mean deviation (:func:`bound`).

It costs :data:`DRAWS` fits per refresh, so it is opt-in (``params.bounds: bootstrap``). The
draws are seeded by the counts (the same counts give the same bound). A derived marginal's bound
covers the noise, not the model: a three-way interaction no collected table sees is in neither
the estimate nor the reference (``coverage`` :data:`NOISE_ONLY`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
from scipy.stats import t as student_t

from ldpstream.estimators.kernels.bounds import (
    CALIBRATED,
    LEVEL,
    SEED,
    Bound,
    multinomial,
    normal_estimates,
    stream,
)
from ldpstream.estimators.kernels.consistency import max_entropy
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.global_fit import MAX_CELLS
from ldpstream.estimators.kernels.proper import project_simplex
from ldpstream.estimators.oracles import frequency_oracles as fo

__all__ = ["DRAWS", "NOISE_ONLY", "Fit", "Draws", "interaction", "deshrunk", "draw_tables",
           "bootstrap", "realized", "bound", "REFIT_MAX"]

#: bootstrap draws per refresh (the 95 % quantile of 20 is their largest)
DRAWS = 20
#: largest domain whose reference is refitted exactly (a dense cells × cells system: 134 MB)
REFIT_MAX = 4096
#: ``Bound.coverage`` of a derived marginal's bound: ≈ 95 % of the noise, not the model's bias
NOISE_ONLY = "noise only"


@dataclass(frozen=True)
class Fit:
    """One estimate of the whole collection: the global fit's table over the whole domain, or
    None and the collected marginals' (consistent) tables."""

    whole: Factor | None
    tables: list[Factor]


@dataclass(frozen=True)
class Draws:
    """The bootstrap of one set of counts: the reference tables of the collected marginals, the
    estimator's fit of every draw, and the whole domain's reference they are the marginals of
    (None above :data:`~.global_fit.MAX_CELLS`)."""

    refs: list[Factor]
    fits: list[Fit]
    whole: Factor | None = None


def interaction(x: np.ndarray) -> np.ndarray:
    """``x`` minus its additive main effects (grand mean plus one term per axis): what a table
    holds beyond the product-free part every estimator keeps."""
    x = np.asarray(x, dtype=float)
    g = float(x.mean())
    add = np.full(x.shape, g)
    for ax in range(x.ndim):
        other = tuple(a for a in range(x.ndim) if a != ax)
        add = add + (x.mean(axis=other, keepdims=True) - g)
    return x - add


def deshrunk(raw: np.ndarray, served: np.ndarray, cell_var: np.ndarray) -> np.ndarray:
    """The reference of one collected marginal: ``served`` + t·(Π(raw) − served), Π the
    projection onto the simplex, with the smallest t ∈ [0, 1] whose interaction energy reaches
    ‖I(raw)‖² − Σ var·(1 − (1 + Σ(kᵢ − 1))/N) (the unbiased table's energy less its noise's share
    in the interaction's subspace); t = 0 when the served table already holds that much.
    Clipped at 0 and normalized."""
    raw = np.asarray(raw, dtype=float)
    s = np.asarray(served, dtype=float).reshape(raw.shape)
    u = project_simplex(raw.reshape(-1)).reshape(raw.shape)
    N = raw.size
    frac = 1.0 - (1 + sum(k - 1 for k in raw.shape)) / N
    target = max(float((interaction(raw) ** 2).sum()) - float(np.sum(cell_var)) * frac, 0.0)
    Ps, Pd = interaction(s), interaction(u - s)
    a, b, c = float((Pd ** 2).sum()), 2.0 * float((Ps * Pd).sum()), float((Ps ** 2).sum()) - target
    t = 0.0
    if c < 0 and a > 0:
        t = min(1.0, (-b + math.sqrt(max(b * b - 4 * a * c, 0.0))) / (2 * a))
    r = np.clip(s + t * (u - s), 0.0, None)
    return r / r.sum()


def draw_tables(oracle: fo.Oracle, ref: np.ndarray, n: int, draws: int,
                rng: np.random.Generator) -> np.ndarray:
    """``draws`` support-count vectors of ``n`` reports of a marginal whose cells are ``ref``,
    through ``oracle`` (GRR: its report values' multinomial; else the normal approximation of
    the unbiased table, turned back into supports)."""
    ref = np.clip(np.asarray(ref, dtype=float).reshape(-1), 0.0, None)
    ref = ref / ref.sum()
    p, q = oracle.p_star, oracle.q_star
    if isinstance(oracle, fo.GRR):
        sup = multinomial(rng, n, (p - q) * ref + q, draws)
    else:
        sup = n * (q + (p - q) * normal_estimates(oracle, ref, n, draws, rng))
    return np.clip(np.rint(sup), 0, n).astype(np.int64)


def bootstrap(cells: Domain, keys: Sequence[str], oracles: Sequence[fo.Oracle],
              raws: Sequence[Factor], ns: Sequence[int], served: Sequence[Factor],
              cell_vars: Sequence[np.ndarray], fit: Callable[[Mapping[str, np.ndarray]], Fit],
              seed_table: np.ndarray, draws: int = DRAWS) -> Draws:
    """The references of the collected marginals (``keys``: their count tensors' keys, with
    their oracles, unbiased tables, report counts, served tables and cell variances) made the
    marginals of one distribution over ``cells`` (:func:`realized`), then ``draws`` count sets
    drawn from them and ``fit`` on each. Seeded by ``seed_table`` (the counts)."""
    rng = stream(SEED, seed_table)
    refs = [Factor(r.domain, deshrunk(r.values, s.values, v))
            for r, s, v in zip(raws, served, cell_vars)]
    whole = realized(cells, refs)
    if whole is not None:
        refs = [Factor(r.domain, np.asarray(whole.project(r.domain.attrs).values, dtype=float))
                for r in refs]
    drawn = [draw_tables(o, ref.values, int(n), draws, rng)
             for o, ref, n in zip(oracles, refs, ns)]
    fits = []
    for b in range(draws):
        counts = {k: np.concatenate([d[b], [int(n)]]).astype(np.int64)
                  for k, d, n in zip(keys, drawn, ns)}
        fits.append(fit(counts))
    return Draws(refs, fits, whole)


def realized(cells: Domain, refs: Sequence[Factor]) -> Factor | None:
    """The maximum-entropy distribution over ``cells`` with the de-shrunk tables as its
    marginals (where they disagree: refitted to the closest realizable ones up to
    :data:`REFIT_MAX` cells, IPF's table where it stalls above), or None above
    :data:`~.global_fit.MAX_CELLS`. Each de-shrunk table takes its interaction from its own
    noisy unbiased table; drawn from as they are, they are tables no one distribution has, which
    the global fit cannot represent, so the draws' estimates err more than the served one does
    and the bound over-covers."""
    if cells.size() > MAX_CELLS:
        return None
    # the exact refit toward the closest realizable marginals solves a cells × cells system
    # (109 GiB for 7 Adult attributes); above REFIT_MAX cells IPF's table where it stalls
    return max_entropy(cells, list(refs), refit=cells.size() <= REFIT_MAX).table


def bound(served: np.ndarray, reference: np.ndarray, estimates: np.ndarray, method: str,
          coverage: str = CALIBRATED, level: float = LEVEL) -> Bound:
    """The bound of ``served`` from the draws' ``estimates`` ``(B, cells)`` of the marginal
    whose reference is ``reference``: the ⌈level·(B+1)⌉-th smallest TVD(estimate, reference);
    per cell, served less the draws' mean deviation μ from the reference (the estimator's bias
    there) ± Student's t quantile times their root mean square deviation √(μ² + s²): the bias
    at the truth is known only as well as μ itself, so the interval widens by it (measured:
    the cells' coverage 96–97 %, 89 % with ± t·s alone; 20 draws are too few for the cells' own
    2.5 % quantiles). In [0, 1]."""
    s = np.asarray(served, dtype=float)
    dev = np.asarray(estimates, dtype=float).reshape(len(estimates), -1) \
        - np.asarray(reference, dtype=float).reshape(1, -1)
    B = dev.shape[0]
    k = min(B, math.ceil(level * (B + 1))) - 1
    tvd = float(np.partition(0.5 * np.abs(dev).sum(axis=1), k)[k])
    mu = dev.mean(axis=0)
    half = float(student_t.ppf((1.0 + level) / 2, B - 1)) * np.sqrt(np.mean(dev ** 2, axis=0))
    mid = s.reshape(-1) - mu
    low = np.clip(mid - half, 0.0, 1.0).reshape(s.shape)
    high = np.clip(mid + half, 0.0, 1.0).reshape(s.shape)
    return Bound(tvd, low, high, level, coverage, method)
