"""Numeric attributes inside ``partitioned``'s marginals (docs/numeric.md "In partitioned
marginals").

A numeric attribute arrives as an index on its input grid of G points (the value clipped into
its range and put on the nearest grid point, as for ``sw-hm``: :func:`~.numeric.quantize`). The
device then rounds it **without bias** to one of b evenly spaced *points* of that grid (the
range's ends among them; :func:`~.families.numeric.rounding_points`, the same rounding as sw-hm's
α-point rounding with a fresh α per report; once per report, the description's ``round``
step), and the point's index is an ordinary category inside the family's joint randomizer
(GRR/OLH over the marginal's cells). The channel of one marginal is therefore
``(R_1 ⊗ … ⊗ R_m) · P_oracle`` with R the G × b rounding matrix of each numeric attribute (the
identity for a categorical one); every point is a grid point, so R has a unit row per point
and ε of the product is exactly the oracle's (the budget is accounted once: a numeric
attribute is one attribute of the split).

b (``bins``) is chosen from ε and the reports a marginal expects (:func:`choose_bins`) unless
given. What the binned estimate gives: the cells on the points, the mean (unbiased: the
rounding is), quantiles and the CDF to within the points' spacing h (a value moves by less than
h when rounded), a W1 bound that adds the resolution 3h/4 (:data:`RESOLUTION_W1`).

Pure numpy, no I/O.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import sparse
from scipy.special import ndtri  # the normal quantile, without scipy.stats (1 s to import)

from ldpstream.estimators.families.numeric import (
    QUANTILES,
    distribution_bounds,
    rounding_matrix,
    rounding_points,
)
from ldpstream.estimators.kernels import numeric as nm
from ldpstream.estimators.kernels.bounds import AT_LEAST, LEVEL, stream
from ldpstream.estimators.kernels.device_program import round_index
from ldpstream.estimators.kernels.domain import Domain
from ldpstream.estimators.kernels.proper import clip_rescale
from ldpstream.estimators.mechanism import DriftTerms
from ldpstream.estimators.oracles import frequency_oracles as fo

__all__ = ["MAX_BINS", "MIN_BINS", "DEFAULT_REPORTS", "PROVISIONAL_BINS", "RESOLUTION_W1",
           "RESOLUTION_QUANTILE", "Binning", "Table", "choose_bins", "predicted_w1", "numeric_summary",
           "CellCov", "CodeCov", "EXACT_OLH_CELLS", "cell_cov",
           "ratios", "cdf_rows", "drift_terms"]

#: most points of a numeric attribute inside a marginal (categorical families refuse a column
#: of more values: docs/configuration.md)
MAX_BINS = 64
MIN_BINS = 2
#: reports the automatic ``bins`` assumes when the collection states none (``expected_reports``)
DEFAULT_REPORTS = 100_000
#: the points a numeric partner of a marginal is assumed to have while ``bins`` are chosen
PROVISIONAL_BINS = 8
#: W1 between a value's distribution and the served one read uniformly within each point's
#: cell, in spacings h: unbiased rounding moves a value by h/2 on average at most, spreading a
#: point's mass over its cell by h/4
RESOLUTION_W1 = 0.75
#: how far (in spacings) rounding and spreading can move a quantile: h + h/2
RESOLUTION_QUANTILE = 1.5
#: the W1 bound's draws' seed
SEED = 41_017


@dataclass(frozen=True)
class Binning:
    """The points of every numeric attribute of a domain: ``points[j]`` the grid indices of
    attribute j's b points (increasing, both ends of the grid among them)."""

    domain: Domain
    points: Mapping[int, np.ndarray]

    @classmethod
    def of(cls, domain: Domain, bins: Mapping[str, int]) -> "Binning":
        pts = {}
        for a, b in bins.items():
            j = domain.axes((a,))[0]
            pts[j] = rounding_points(domain.shape[j], int(b) - 1)
        return cls(domain, pts)

    def values(self, j: int) -> np.ndarray:
        """The points of numeric attribute j in its own units."""
        lo, hi = self.domain.ranges[j]  # type: ignore[index]  # numeric: has a range
        return lo + self.points[j] / (self.domain.shape[j] - 1) * (hi - lo)

    def cells(self) -> Domain:
        """The domain the marginals are counted on: a numeric attribute's categories are its
        points (labelled by their values), the others unchanged."""
        labels = [tuple(f"{v:.6g}" for v in self.values(j)) if j in self.points
                  else self.domain.categories(a) for j, a in enumerate(self.domain.attrs)]
        return Domain(self.domain.attrs, tuple(len(lab) for lab in labels), tuple(labels))

    def channel(self, j: int) -> np.ndarray:
        """R (G × b): Pr(point | grid index) of attribute j's unbiased rounding."""
        pts = self.points[j]
        return rounding_matrix(self.domain.shape[j], pts)[:, pts]

    def round(self, j: int, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Grid indices of attribute j → point indices, rounded without bias (vectorized):
        α-point rounding with a fresh uniform α per value, i.e. the point above with
        probability the fraction of the way there."""
        return round_index(x, self.points[j], rng.random(len(x)))


def predicted_w1(b: int, partner_cells: int, eps: float, n_k: float,
                 oracles: Sequence[str] = fo.COMPACT) -> float:
    """W1 ÷ range of a numeric attribute's 1-way estimate on b points from the one marginal of
    ``partner_cells`` × b cells it is read from, n_k reports, ε per report: the resolution
    h/4 (h = 1/(b − 1)) plus the noise, E∫|F̂ − F| ≈ h·Σ_{t ≤ b} E|N(0, t·s²)| ≈
    (2/3)·√(2/π)·s·√b with s² the oracle's cell variance summed over the partner cells."""
    d = b * partner_cells
    s2 = partner_cells * float(fo.choose(eps, d, oracles).variance(n_k)[0])
    return 0.25 / (b - 1) + (2.0 / 3.0) * math.sqrt(2.0 / math.pi) * math.sqrt(s2 * b)


def choose_bins(partner_cells: int, eps: float, n_k: float,
                oracles: Sequence[str] = fo.COMPACT) -> int:
    """The b in [:data:`MIN_BINS`, :data:`MAX_BINS`] of smallest :func:`predicted_w1` (from
    the shape and ε only, never the data's values)."""
    bs = range(MIN_BINS, MAX_BINS + 1)
    w = [predicted_w1(b, partner_cells, eps, n_k, oracles) for b in bs]
    return int(bs[int(np.argmin(w))])


@dataclass(frozen=True)
class CellCov:
    """Covariance of a table's unbiased cells as diag(``v``) − ``w``·``w``ᵀ (the multinomial
    form): GRR exactly, from the reports' frequencies; OLH from [Wang17] eq. 4 per cell plus the
    sampling of users (as :func:`~.bounds.oracle_bound` draws it)."""

    v: np.ndarray
    w: np.ndarray

    def of(self, G: np.ndarray) -> np.ndarray:
        """G·Cov·Gᵀ for functionals G (r × cells)."""
        Gw = G @ self.w
        return (G * self.v) @ G.T - np.outer(Gw, Gw)


@dataclass(frozen=True)
class CodeCov:
    """Covariance of an OLH table's unbiased cells, exactly: a report is a code (seed a, hashed
    value y), the codes of n users multinomial with probabilities ``pi`` (the population's cells
    f through the oracle), and cell v's support count is the number of codes with h_a(v) = y
    (``supports``: codes × cells, 0/1). The family's hash is linear (h_a(0) = 0 for every a), so
    supports of different cells are correlated (cell 0's with every other's), which [Wang17]
    eq. 4, a per-cell variance, leaves out."""

    supports: sparse.csr_array
    pi: np.ndarray
    n: int
    span: float

    def of(self, G: np.ndarray) -> np.ndarray:
        """G·Cov·Gᵀ for functionals G (r × cells): per code the functional's sum over the
        cells it supports, then the codes' multinomial covariance."""
        SG = np.asarray(self.supports @ np.atleast_2d(np.asarray(G, dtype=float)).T)
        mean = self.pi @ SG
        return ((SG.T * self.pi) @ SG - np.outer(mean, mean)) / (self.n * self.span ** 2)


#: most seeds × cells of an OLH table whose covariance is computed exactly (:class:`CodeCov`);
#: a larger one gets [Wang17] eq. 4 per cell (:class:`CellCov`)
EXACT_OLH_CELLS = 1 << 20


@lru_cache(maxsize=8)   # each at most EXACT_OLH_CELLS entries (12 MB)
def _olh_supports(eps: float, d: int, g: int) -> sparse.csr_array:
    """The OLH oracle (ε, d, g)'s supports: codes (seed a, y) × cells, 1 where h_a(v) = y."""
    o = fo.OLH(eps, d, g=g)
    H = o.hash(np.arange(o.seeds), np.arange(d))
    codes = (np.arange(o.seeds)[:, None] * g + H).ravel()
    cells = np.broadcast_to(np.arange(d), H.shape).ravel()
    return sparse.csr_array((np.ones(codes.size), (codes, cells)), shape=(o.seeds * g, d))


def cell_cov(oracle: fo.Oracle, supports: np.ndarray, n: int,
             raw: np.ndarray) -> CellCov | CodeCov:
    """The covariance of ``oracle``'s unbiased table ``raw`` from ``n`` reports, the sampling
    of users included: GRR's multinomial from the reports' frequencies (:class:`CellCov`), OLH's
    from its codes (:class:`CodeCov`, the cells f̂ clipped and rescaled), or for an OLH table of
    more than :data:`EXACT_OLH_CELLS` seeds × cells [Wang17] eq. 4 per cell."""
    span = oracle.p_star - oracle.q_star
    if isinstance(oracle, fo.GRR):
        pi = np.asarray(supports, dtype=float) / n
        return CellCov(pi / (n * span ** 2), pi / (math.sqrt(n) * span))
    f = clip_rescale(np.asarray(raw, dtype=float))
    if isinstance(oracle, fo.OLH) and oracle.seeds * oracle.d <= EXACT_OLH_CELLS:
        S = _olh_supports(float(oracle.eps), int(oracle.d), int(oracle.g))
        p, q = fo.grr_pq(oracle.eps, oracle.g)
        hit = np.asarray(S @ f)   # per code (a, y): the mass of the cells hashed to y under a
        return CodeCov(S, (q + (p - q) * hit) / oracle.seeds, n, span)
    return CellCov(oracle.variance(n, f, fixed_data=True) + f / n, f / math.sqrt(n))


def ratios(U: np.ndarray, mask: np.ndarray, raw: np.ndarray, cov: CellCov | CodeCov
           ) -> tuple[float, np.ndarray, np.ndarray]:
    """Per row u of ``U`` (q × cells) the ratio u·raw / D of the group ``mask`` (D = mask·raw,
    its unbiased share), with the ratios' covariance (q × q, the delta method through the cells'
    covariance ``cov``), and D. D ≤ 0: NaN ratios, infinite variances."""
    U = np.atleast_2d(np.asarray(U, dtype=float))
    D = float(mask @ raw)
    if D <= 0:
        return D, np.full(len(U), np.nan), np.diag(np.full(len(U), np.inf))
    r = U @ raw / D
    return D, r, cov.of((U - r[:, None] * mask[None, :]) / D)


def cdf_rows(mask: np.ndarray, point: np.ndarray, b: int) -> np.ndarray:
    """((b + 1) × cells) the group's share below each edge of the b equal bins centred on the
    points (edge t: the points below t), as functionals of the cells."""
    return np.stack([mask * (point < t) for t in range(b + 1)]).astype(float)


def _group(raw: np.ndarray, cov: CellCov | CodeCov, mask: np.ndarray, point: np.ndarray, b: int,
           pos: np.ndarray) -> tuple[float, float, float, nm.CdfBand] | None:
    """One group of cells (a category, or all): its unbiased count D, mean position (on the
    points' positions ``pos`` in [0, 1]) with its standard error (the ratio's delta method) and
    the unbiased CDF on b equal bins centred on the points, with its covariance."""
    D, (r,), var = ratios(mask * pos[point], mask, raw, cov)
    if D <= 0:
        return None
    se = math.sqrt(max(float(var[0, 0]), 0.0))
    _, F, cov_f = ratios(cdf_rows(mask, point, b), mask, raw, cov)
    return D, float(r), se, nm.CdfBand(np.linspace(0.0, 1.0, b + 1), F, cov_f)


@dataclass(frozen=True)
class Table:
    """A collected table's unbiased cells: ``domain`` (its cells' domain), ``raw`` (flat), their
    covariance ``cov`` and the ``n`` reports they come from."""

    domain: Domain
    raw: np.ndarray
    cov: CellCov | CodeCov
    n: int

    def cells_of(self, numeric: str, cat: str | None = None, k: int = 0
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(mask, point) per flat cell: 1 in the group (all cells when ``cat`` is None, else
        category k of ``cat``), and the index of the numeric attribute's point."""
        idx = np.indices(self.domain.shape).reshape(len(self.domain.shape), -1)
        point = idx[self.domain.axes((numeric,))[0]]
        mask = (np.ones(self.raw.shape) if cat is None
                else (idx[self.domain.axes((cat,))[0]] == k).astype(float))
        return mask, point

    def group(self, numeric: str, positions: np.ndarray, cat: str | None = None,
              k: int = 0) -> tuple[float, float, float, nm.CdfBand] | None:
        """:func:`_group` of all cells (``cat`` None) or of category k of ``cat``."""
        mask, point = self.cells_of(numeric, cat, k)
        return _group(self.raw, self.cov, mask, point, self.domain[numeric], positions)


def _combined(tables: Sequence[Table], numeric: str, positions: np.ndarray, cat: str | None,
              k: int) -> tuple[float, float, float, nm.CdfBand] | None:
    """The group over every table holding it (independent tables: one marginal per report):
    the mean combined by inverse variance, the unbiased CDF as the average of the tables'
    weighted by the inverse of their total variance (its covariance Σ w²·cov), the reports of
    all."""
    groups = [(t, g) for t in tables
              if (g := t.group(numeric, positions, cat, k)) is not None and g[2] > 0]
    if not groups:
        return None
    w = np.array([1.0 / g[2] ** 2 for _, g in groups])
    r = float(np.array([g[1] for _, g in groups]) @ w / w.sum())
    reports = sum(t.n * g[0] for t, g in groups)
    v = np.array([1.0 / max(float(np.trace(g[3].cov)), 1e-300) for _, g in groups])
    v = v / v.sum()
    band = nm.CdfBand(groups[0][1][3].edges, sum(x * g[3].F for x, (_, g) in zip(v, groups)),
                      sum(x * x * g[3].cov for x, (_, g) in zip(v, groups)))
    return reports, r, float(1.0 / np.sqrt(w.sum())), band


def _summary(hist: np.ndarray, group: tuple[float, float, float, nm.CdfBand], lo: float,
             hi: float, b: int, reports: float, rng: np.random.Generator) -> dict[str, Any]:
    """sw-hm's fields of one distribution (docs/numeric.md "Bounds") from the served cells
    ``hist`` (b points) and the unbiased group: the points are read as b equal bins centred on
    them over [lo − h/2, hi + h/2]; quantile intervals widened and the W1 bound raised by the
    resolution."""
    _, r, se, band = group
    z = float(ndtri(0.5 + LEVEL / 2))
    h = (hi - lo) / (b - 1)
    a0, a1 = lo - h / 2, hi + h / 2
    x = np.clip(np.asarray(hist, dtype=float), 0, None)
    x = x / x.sum() if x.sum() > 0 else np.full(b, 1.0 / b)
    quantiles, w1 = distribution_bounds(x, band, a0, a1, z, rng)
    quantiles = {p: [v, max(lo, ql - RESOLUTION_QUANTILE * h), min(hi, qh + RESOLUTION_QUANTILE * h)]
                 for p, (v, ql, qh) in quantiles.items()}
    mean = lo + r * (hi - lo)
    half = z * se * (hi - lo)
    return {"mean": mean, "mean_low": mean - half, "mean_high": mean + half,
            "stderr": se * (hi - lo), "quantiles": quantiles, "histogram": x.tolist(),
            "bins": b, "reports": int(round(reports)),
            "w1_bound": min(w1 + RESOLUTION_W1 * h, hi - lo), "w1_coverage": AT_LEAST,
            "cdf_at": [a0 + float(e) * (a1 - a0) for e in band.edges],
            "cdf": nm.cdf_at(x, band.edges).tolist(),
            "cdf_low": np.clip(band.F - z * band.se, 0, 1).tolist(),
            "cdf_high": np.clip(band.F + z * band.se, 0, 1).tolist()}


def numeric_summary(tables: Sequence[Table], served: np.ndarray, attrs: Sequence[str],
                    numeric: str, lo: float, hi: float, positions: np.ndarray,
                    oracle: str) -> dict[str, Any]:
    """The numeric fields of an estimate of ``attrs`` (``numeric`` alone, or with one
    categorical attribute): the keys sw-hm's :func:`~.families.numeric.summary_of` serves. The
    mean with its interval and the CDF band (quantile intervals, W1 bound) from the unbiased
    tables holding ``attrs`` (``tables``; :func:`_combined`), the quantiles and histogram from
    the served cells ``served`` (shaped like ``attrs``; docs/numeric.md "In partitioned
    marginals")."""
    first = tables[0]
    b = first.domain[numeric]
    rng = stream(SEED, np.concatenate([first.raw, [first.n]]))
    out: dict[str, Any] = {"of": numeric, "min": lo, "max": hi, "level": LEVEL,
                           "mechanism": oracle, "resolution": (hi - lo) / (b - 1)}
    served = np.asarray(served, dtype=float)
    if len(attrs) == 1:
        g = _combined(tables, numeric, positions, None, 0)
        if g is not None:
            out.update(_summary(served, g, lo, hi, b, g[0], rng))
        return out
    cat = next(a for a in attrs if a != numeric)
    rows = served if attrs[0] == cat else served.T
    share = np.clip(rows.sum(axis=1), 0, None)
    share = share / share.sum() if share.sum() > 0 else share
    cats = []
    for k, label in enumerate(first.domain.categories(cat)):
        g = _combined(tables, numeric, positions, cat, k)
        row: dict[str, Any] = {"category": label, "share": float(share[k])}
        if g is None or rows[k].sum() <= 0:
            row["reports"] = 0
        else:
            row.update(_summary(rows[k], g, lo, hi, b, g[0], rng))
        cats.append(row)
    out.update(by=cat, categories=cats)
    return out


def drift_terms(cur: Sequence[Table], prev: Sequence[Table], pooled: Sequence[Table],
                attrs: Sequence[str], numeric: str, lo: float, hi: float,
                positions: np.ndarray) -> DriftTerms:
    """The drift test's quantities of ``attrs`` (``numeric`` alone, or with one categorical
    attribute: per category) between two windows (docs/windows.md "Numeric attributes"): the
    mean and the share of values below each pooled quantile x_p (median, p90, p99; x_p from the
    pooled CDF, :func:`~.numeric.share_rows`), each a ratio of the unbiased cells
    (:func:`ratios`). ``cur``, ``prev``, ``pooled``: the tables holding ``attrs`` in each window
    and summed over both, in the same order. A quantity's variance under "no change" is the
    pooled table's (its covariance at the pooled reports N) at each window's size, × N / n; the
    tables' values are combined with one weight per table and quantity for both windows (inverse
    to the variance of the difference). Effect: |Δ mean| ÷ range, |Δ F(x_p)|."""
    cat = next((a for a in attrs if a != numeric), None)
    first = pooled[0]
    labels: list[str | None] = [None] if cat is None else list(first.domain.categories(cat))
    b = first.domain[numeric]
    h = (hi - lo) / (b - 1)
    names: list[str] = []
    values: list[np.ndarray] = []
    details: list[dict[str, Any]] = []
    for k, label in enumerate(labels):
        cells = [t.cells_of(numeric, cat, k) for t in pooled]
        J = [cdf_rows(mask, point, b) for mask, point in cells]
        # the pooled CDF: the tables' unbiased CDFs of the group weighted by its reports
        mass = np.array([t.n * float(mask @ t.raw) for t, (mask, _) in zip(pooled, cells)])
        if not np.any(mass > 0):
            continue
        F = np.sum([t.n * (j @ t.raw) for m, j, t in zip(mass, J, pooled) if m > 0],
                   axis=0) / mass[mass > 0].sum()
        xs: list[float] = []
        parts = []
        for tc, tp, t, (mask, point), j in zip(cur, prev, pooled, cells, J):
            xs, shares = nm.share_rows(j, F, QUANTILES)
            U = np.vstack([mask * positions[point], shares])
            D, _, cov = ratios(U, mask, t.raw, t.cov)
            d_cur, r_cur, _ = ratios(U, mask, tc.raw, tc.cov)
            d_prev, r_prev, _ = ratios(U, mask, tp.raw, tp.cov)
            if min(D, d_cur, d_prev) <= 0:
                continue   # no reports of the group in a window: nothing to compare
            v = np.clip(np.diag(cov), 0, None) * t.n   # ∝ 1/n: from the pooled size to each
            parts.append((r_cur, v / tc.n, r_prev, v / tp.n))
        if not parts:
            continue
        r_cur, v_cur, r_prev, v_prev = (np.array([p[i] for p in parts]) for i in range(4))
        total = v_cur + v_prev
        w = np.divide(1.0, total, out=np.zeros_like(total), where=total > 0)
        s = w.sum(axis=0)
        w = np.where(s > 0, w / np.where(s > 0, s, 1.0), 1.0 / len(parts))
        c, p = (w * r_cur).sum(axis=0), (w * r_prev).sum(axis=0)
        values.append(np.stack([c, (w * w * v_cur).sum(axis=0), p,
                                (w * w * v_prev).sum(axis=0)], axis=1))
        what = ["mean"] + [f"{q:g}" for q in QUANTILES]
        for i, name in enumerate(what):
            names.append(name if label is None else f"{label}/{name}")
            det: dict[str, Any] = ({"quantity": "mean", "current": float(lo + c[0] * (hi - lo)),
                                    "previous": float(lo + p[0] * (hi - lo))} if i == 0 else
                                   {"quantity": name,
                                    "at": float(np.clip(lo - h / 2 + xs[i - 1] * (hi - lo + h),
                                                        lo, hi)),
                                    "current": float(c[i]), "previous": float(p[i])})
            if label is not None:
                det["category"] = label
            details.append(det)
    if not values:
        raise ValueError(f"no reports of {numeric!r} in both windows")
    cur_v, cur_var, prev_v, prev_var = np.concatenate(values).T
    return DriftTerms(tuple(names), cur_v, cur_var, prev_v, prev_var, np.abs(cur_v - prev_v),
                      tuple(details))
