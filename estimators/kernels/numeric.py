"""Numeric readings under local DP as channels over a grid (docs/numeric.md).

A numeric value x in [lo, hi] is first put on an input grid of G points (the nearest one,
:func:`quantize`; clipped values counted), then randomized by a channel whose outputs are cells,
so that reports are counted like any other (the count-tensor model):

* Duchi et al.'s mechanism (two cells ±C) and the Piecewise mechanism (PM), its output rounded
  without bias to a grid of K points, and the Hybrid mechanism (HM, PM with probability α else
  Duchi) estimate the mean [Wang et al., "Collecting and Analyzing Multidimensional Data with
  Local Differential Privacy", ICDE 2019, §III-A/B/C]; on t = 2(x−lo)/(hi−lo) − 1 ∈ [−1, 1].
* The k-point mechanism (``points``): t rounded without bias to one of k evenly spaced points
  of [−1, 1], then k-ary randomized response; k chosen from ε (:func:`points_k`).
* The Square Wave mechanism (SW), its output bucketed, estimates the distribution with EMS
  (EM with a binomial smoothing step) [Li et al., "Estimating Numerical Distributions under
  Local Differential Privacy", SIGMOD 2020, §4–5]; on v = (x−lo)/(hi−lo) ∈ [0, 1].

Every channel is an explicit matrix ``P[i, k] = Pr(cell k | grid point i)``: ε is computed from
it (:func:`~.channels.epsilon`), the estimators invert it, and the direct samplers
(:func:`sample_pm`, :func:`sample_sw`, ...) draw from exactly it (tests/test_numeric.py checks
both). Pure numpy, no I/O.

>>> P, y = pm_channel(1.0, grid_t(5), 33)
>>> bool(abs(epsilon(P) - 1.0) < 1e-9), bool(np.allclose(P @ y, grid_t(5)))
(True, True)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from ldpstream.estimators.kernels.channels import epsilon

__all__ = ["DEFAULT_GRID", "numeric_labels", "grid_t", "grid_v", "quantize", "duchi_channel",
           "pm_channel", "hm_channel", "points_channel", "points_k", "sample_points",
           "hm_alpha", "sw_b", "sw_half_width", "sw_channel", "closed_form_variance",
           "worst_variance", "MEAN_MECHANISMS", "LEGACY_MEAN_MECHANISMS", "POINTS_MIN",
           "POINTS_MAX", "mean_cells", "choose_mean", "MeanEstimate", "mean_estimate", "ems",
           "auto_bins", "cv_bins", "edge_segments", "ratio_cov", "share_rows", "grid_mid",
           "grid_bin_weights", "binned_channel", "spread_on_grid",
           "cdf_at", "quantile", "w1_hist", "w1_samples",
           "sample_duchi", "sample_pm", "sample_sw", "round_to_grid", "epsilon", "CdfBand",
           "unbiased_cdf", "Task", "layout", "task_channel", "wave"]

#: the mean mechanisms, in the order :func:`choose_mean` prefers on a tie
MEAN_MECHANISMS = ("hm", "pm", "duchi", "points")
#: the mean mechanisms before ``points``: what ``mean: auto`` chose among in a state stored
#: without the points' k
LEGACY_MEAN_MECHANISMS = ("hm", "pm", "duchi")
#: the k-point mechanism's fewest and most points
POINTS_MIN, POINTS_MAX = 2, 64
#: ε below which HM is Duchi alone (α = 0) [Wang et al. §III-C, ε* ≈ 0.61]
HM_EPS_STAR = 0.61


def grid_t(G: int) -> np.ndarray:
    """The G input grid points on [−1, 1] (mean mechanisms)."""
    return np.linspace(-1.0, 1.0, int(G))


def grid_v(G: int) -> np.ndarray:
    """The G input grid points on [0, 1] (Square Wave)."""
    return np.linspace(0.0, 1.0, int(G))


def quantize(values: np.ndarray, lo: float, hi: float, G: int) -> tuple[np.ndarray, int]:
    """Values → nearest of G grid points on [lo, hi] (indices, int64) and how many were clipped
    into the range; NaN raises."""
    x = np.asarray(values, dtype=float)
    if np.isnan(x).any():
        raise ValueError("numeric values must not be NaN")
    clipped = int(np.count_nonzero((x < lo) | (x > hi)))
    v = (np.clip(x, lo, hi) - lo) / (hi - lo)
    return np.rint(v * (G - 1)).astype(np.int64), clipped


#: input grid points of a numeric attribute unless its config says otherwise
DEFAULT_GRID = 1025


def numeric_labels(lo: float, hi: float, G: int) -> tuple[str, ...]:
    """The labels of a numeric attribute's grid points (their values)."""
    return tuple(f"{v:.12g}" for v in np.linspace(lo, hi, int(G)))


# --- the mean mechanisms ------------------------------------------------------------------------

def _duchi_c(eps: float) -> float:
    return (math.exp(eps) + 1) / (math.exp(eps) - 1)


def duchi_channel(eps: float, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Duchi et al.'s one-dimensional mechanism: ±C with Pr[+C] = ½ + t/(2C),
    C = (e^ε+1)/(e^ε−1) [Wang et al. Alg. 1]. Returns (P (len(t), 2), outputs)."""
    C = _duchi_c(eps)
    up = 0.5 + np.asarray(t, dtype=float) / (2 * C)
    return np.stack([1 - up, up], axis=1), np.array([-C, C])


def _hat_integral(u: np.ndarray) -> np.ndarray:
    """∫_{−∞}^{u} max(0, 1 − |s|) ds."""
    u = np.clip(u, -1.0, 1.0)
    return np.where(u <= 0, (1 + u) ** 2 / 2, 1 - (1 - u) ** 2 / 2)


def _pm_params(eps: float) -> tuple[float, float, float]:
    """(C, p, q) of PM: density p on [l(t), r(t)], q = p/e^ε elsewhere on [−C, C]."""
    e2 = math.exp(eps / 2)
    C = (e2 + 1) / (e2 - 1)
    p = (math.exp(eps) - e2) / (2 * e2 + 2)
    return C, p, p / math.exp(eps)


def pm_channel(eps: float, t: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """The Piecewise mechanism [Wang et al. Alg. 2] followed by rounding its output y to the two
    neighbouring points of a K-point grid on [−C, C] with weights linear in the distance (so
    E[rounded] = y): ``P[i, k] = ∫ f(y | t_i) · hat_k(y) dy`` in closed form."""
    C, p, q = _pm_params(eps)
    t = np.asarray(t, dtype=float)
    y = np.linspace(-C, C, int(K))
    h = y[1] - y[0]
    lft = (C + 1) / 2 * t - (C - 1) / 2
    rgt = lft + C - 1

    def mass(a: np.ndarray, b: np.ndarray) -> np.ndarray:   # ∫_a^b hat_k, (len(a), K)
        return h * (_hat_integral((b[:, None] - y) / h) - _hat_integral((a[:, None] - y) / h))

    whole = mass(np.array([-C]), np.array([C]))
    P = q * whole + (p - q) * mass(lft, rgt)
    return P / P.sum(axis=1, keepdims=True), y


def hm_alpha(eps: float) -> float:
    """HM's probability of PM: 1 − e^{−ε/2} above ε*, else 0 [Wang et al. §III-C]."""
    return 1 - math.exp(-eps / 2) if eps > HM_EPS_STAR else 0.0


def hm_channel(eps: float, t: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """The Hybrid mechanism: PM (rounded to K points) with probability α, else Duchi; the
    outputs of both, PM's first."""
    a = hm_alpha(eps)
    Pp, yp = pm_channel(eps, t, K)
    Pd, yd = duchi_channel(eps, t)
    return np.concatenate([a * Pp, (1 - a) * Pd], axis=1), np.concatenate([yp, yd])


def _points_pb(eps: float, k: int) -> tuple[float, float]:
    """(p, B) of k-ary randomized response: the point kept with p = e^ε/(e^ε + k − 1), each
    other with B = 1/(e^ε + k − 1)."""
    d = math.exp(eps) + k - 1
    return math.exp(eps) / d, 1.0 / d


def points_channel(eps: float, t: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k-point mechanism: t rounded without bias to its two neighbours among the k evenly
    spaced points c_0 … c_{k−1} of [−1, 1] (the upper one with probability the fractional
    position, so E[c] = t), then k-ary randomized response (:func:`_points_pb`). Returns
    (P (len(t), k), outputs a_y = c_y / (p − B)): unbiased, as Σc = 0."""
    k = int(k)
    if not POINTS_MIN <= k <= POINTS_MAX:
        raise ValueError(f"the k-point mechanism needs {POINTS_MIN} … {POINTS_MAX} points "
                         f"(got {k})")
    p, B = _points_pb(eps, k)
    c = np.linspace(-1.0, 1.0, k)
    pos = (np.asarray(t, dtype=float) + 1) / 2 * (k - 1)
    R = np.clip(1 - np.abs(pos[:, None] - np.arange(k)), 0.0, None)   # the rounding's weights
    return B + (p - B) * R, c / (p - B)


def _points_worst(eps: float, k: int) -> float:
    t = grid_t(DEFAULT_GRID)
    return worst_variance(*points_channel(eps, t, k), t)


@lru_cache(maxsize=256)
def points_k(eps: float) -> int:
    """The k-point mechanism's k at ε: the k of :data:`POINTS_MIN` … :data:`POINTS_MAX` with
    the smallest worst-case variance on the default input grid, computed from the channels (on
    a tie the fewer points). Rounding to more points adds less rounding noise but spreads
    randomized response over more cells: k grows with ε (2 at ε = 1, 3 at 2, 5 at 4, 17 at
    8)."""
    wv = {k: float(f"{_points_worst(float(eps), k):.9g}")
          for k in range(POINTS_MIN, POINTS_MAX + 1)}
    return min(wv, key=lambda k: (wv[k], k))


def mean_channel(name: str, eps: float, t: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """The channel and output values of mean mechanism ``name`` (one of MEAN_MECHANISMS); ``K``
    is PM's output grid (pm, hm) or the number of points (points)."""
    if name == "duchi":
        return duchi_channel(eps, t)
    if name == "pm":
        return pm_channel(eps, t, K)
    if name == "hm":
        return hm_channel(eps, t, K)
    if name == "points":
        return points_channel(eps, t, K)
    raise ValueError(f"unknown mean mechanism {name!r} (known: {', '.join(MEAN_MECHANISMS)})")


def closed_form_variance(name: str, eps: float, t: np.ndarray | float,
                         k: int | None = None) -> np.ndarray:
    """Var[y | t] of one report, the papers' closed forms (continuous PM, no rounding):
    Duchi C² − t²; PM t²/(e^{ε/2}−1) + (e^{ε/2}+3)/(3(e^{ε/2}−1)²); HM their α-mixture
    [Wang et al. Lemmas 1, 3, §III-C]. The k-point mechanism's (``k`` default
    :func:`points_k`) is exact: ((p − B)(t² + ρ(t)) + B·Σc²)/(p − B)² − t², ρ(t) the
    rounding's variance (t − c_j)(c_{j+1} − t) between neighbouring points."""
    t = np.asarray(t, dtype=float)
    if name == "points":
        k = points_k(eps) if k is None else int(k)
        p, B = _points_pb(eps, k)
        h = 2 / (k - 1)
        j = np.minimum(np.floor((t + 1) / h), k - 2)
        rho = (t - (-1 + j * h)) * (-1 + (j + 1) * h - t)
        s2 = float((np.linspace(-1, 1, k) ** 2).sum())
        return ((p - B) * (t ** 2 + rho) + B * s2) / (p - B) ** 2 - t ** 2
    duchi = _duchi_c(eps) ** 2 - t ** 2
    e2 = math.exp(eps / 2)
    pm = t ** 2 / (e2 - 1) + (e2 + 3) / (3 * (e2 - 1) ** 2)
    if name == "duchi":
        return duchi
    if name == "pm":
        return pm
    a = hm_alpha(eps)
    return a * pm + (1 - a) * duchi


def worst_variance(P: np.ndarray, outputs: np.ndarray, t: np.ndarray) -> float:
    """max over grid points of Var[y | t] computed from the channel itself (rounding included)."""
    return float(np.max(P @ outputs ** 2 - (P @ outputs) ** 2))


def mean_cells(name: str, K: int, k: int) -> int:
    """The cells of mean mechanism ``name``: PM's ``K`` (HM's K + 2), Duchi's 2, the k-point
    mechanism's ``k``."""
    return {"hm": K + 2, "pm": K, "duchi": 2, "points": k}[name]


@lru_cache(maxsize=256)
def choose_mean(eps: float, K: int, G: int = DEFAULT_GRID, among: tuple[str, ...] = MEAN_MECHANISMS,
                points: int | None = None) -> str:
    """The mean mechanism of ``among`` with the smallest worst-case variance at ε, from the
    channels as applied on a G-point grid (PM rounded to K points, ``points`` points or
    :func:`points_k`'s); on a tie the one with fewer cells, then the earlier in ``among``
    (below ε* HM is Duchi, and 2 points are Duchi: Duchi is chosen) (docs/numeric.md "Which
    mean mechanism")."""
    t = grid_t(G)
    k = points_k(eps) if points is None else int(points)
    wv = {m: worst_variance(*mean_channel(m, eps, t, k if m == "points" else K), t)
          for m in among}
    return min(among, key=lambda m: (float(f"{wv[m]:.9g}"), mean_cells(m, K, k)))


@dataclass(frozen=True)
class MeanEstimate:
    """The unbiased mean of t (on [−1, 1]), its standard error and a two-sided interval at
    ``level`` (normal, with the reports' own sample variance), from ``n`` reports."""

    mean: float
    stderr: float
    low: float
    high: float
    n: int
    level: float


def mean_estimate(counts: np.ndarray, outputs: np.ndarray, level: float = 0.95) -> MeanEstimate:
    """Σ counts·y / n; the standard error s/√n from the outputs' sample variance (each report is
    an independent draw given its device's value, so it covers sampling and randomization)."""
    from scipy.special import ndtri
    c = np.asarray(counts, dtype=float)
    n = float(c.sum())
    if n < 2:
        raise ValueError(f"a mean needs at least 2 reports (have {int(n)})")
    mu = float(c @ outputs / n)
    var = float(c @ (outputs - mu) ** 2 / (n - 1))
    se = math.sqrt(var / n)
    z = float(ndtri(0.5 + level / 2))
    return MeanEstimate(mu, se, mu - z * se, mu + z * se, int(n), level)


# --- one attribute's report: its tasks and their cells ------------------------------------------

@dataclass(frozen=True)
class Task:
    """One way a report of a numeric attribute is made: ``kind`` (``pm``, ``duchi``, ``points``:
    the mean; ``sw``: the distribution), the probability ``weight`` that a report does it, and
    its cells ``offset`` … ``offset + cells − 1`` in the attribute's report column."""

    kind: str
    weight: float
    offset: int
    cells: int
    #: Square Wave's half-width b (``sw`` only; None: Li et al.'s :func:`sw_b`)
    b: float | None = None


def layout(mean: str, eps: float, share: float, K: int, buckets: int,
           points: int = POINTS_MIN, b: float | None = None) -> tuple[Task, ...]:
    """THE cells of a numeric attribute's report column, in order: the mean mechanism's (PM's K
    rounded points, Duchi's 2, HM's PM then Duchi, the k-point mechanism's ``points``), then
    Square Wave's ``buckets``; a report does the mean task with probability ``share`` (HM: PM
    with α of it); ``b``: SW's half-width (None: :func:`sw_b`). The family's channel, its
    randomizer, its count tensors and the device description all come from it (a task of
    weight 0 keeps its cells)."""
    if mean == "hm":
        a = hm_alpha(eps)
        parts = [("pm", share * a, K), ("duchi", share * (1 - a), 2)]
    elif mean in ("pm", "duchi", "points"):
        parts = [(mean, share, mean_cells(mean, K, points))]
    else:
        raise ValueError(f"unknown mean mechanism {mean!r} (known: {', '.join(MEAN_MECHANISMS)})")
    out, off = [], 0
    for kind, w, k in parts + [("sw", 1 - share, buckets)]:
        out.append(Task(kind, float(w), off, int(k), b if kind == "sw" else None))
        off += int(k)
    return tuple(out)


def task_channel(t: Task, eps: float, G: int) -> np.ndarray:
    """``P[i, k]`` (G × t.cells) of one task on a G-point input grid."""
    if t.kind == "pm":
        return pm_channel(eps, grid_t(G), t.cells)[0]
    if t.kind == "duchi":
        return duchi_channel(eps, grid_t(G))[0]
    if t.kind == "points":
        return points_channel(eps, grid_t(G), t.cells)[0]
    return sw_channel(eps, grid_v(G), t.cells, t.b)


def wave(t: Task, eps: float) -> dict[str, float | bool | tuple[float, float]]:
    """The parameters of the ``wave`` step (estimators/kernels/device_program.py) that draws
    from :func:`task_channel` on the grid position z = i/(G − 1): PM's window [l, l + C − 1],
    l = (C + 1)·z − C, in [−C, C], hit with e^{ε/2}/(e^{ε/2} + 1), rounded to K points; Square
    Wave's [z − b, z + b] in [−b, 1 + b], hit with 2be^ε/(2be^ε + 1), bucketed; Duchi's point
    t = 2z − 1 rounded to the two points ±C; the k-point mechanism's [z − h/2, z + h/2],
    h = 1/(k − 1), in [−h/2, 1 + h/2], hit with e^ε/(e^ε + k − 1), bucketed into k cells of
    width h centred on the points (the window covers the two buckets around z in proportion
    to its distance from their centres: the unbiased rounding, then randomized response)."""
    if t.kind == "duchi":
        C = _duchi_c(eps)
        return {"lo": -C, "hi": C, "at": (2.0, -1.0), "width": 0.0, "p": 1.0, "rounded": True}
    if t.kind == "pm":
        C, _, _ = _pm_params(eps)
        e2 = math.exp(eps / 2)
        return {"lo": -C, "hi": C, "at": (C + 1, -C), "width": C - 1, "p": e2 / (e2 + 1),
                "rounded": True}
    if t.kind == "points":
        h = 1.0 / (t.cells - 1)
        return {"lo": -h / 2, "hi": 1 + h / 2, "at": (1.0, -h / 2), "width": h,
                "p": _points_pb(eps, t.cells)[0], "rounded": False}
    b = sw_b(eps) if t.b is None else t.b
    e = math.exp(eps)
    return {"lo": -b, "hi": 1 + b, "at": (1.0, -b), "width": 2 * b,
            "p": 2 * b * e / (2 * b * e + 1), "rounded": False}


# --- Square Wave and EMS ------------------------------------------------------------------------

def sw_b(eps: float) -> float:
    """SW's half-width b = (εe^ε − e^ε + 1) / (2e^ε(e^ε − 1 − ε)) [Li et al. §4.2]."""
    e = math.exp(eps)
    return (eps * e - e + 1) / (2 * e * (e - 1 - eps))


#: the default half-width's floor c·e^{−ε/3} (:func:`sw_half_width`; measured, docs/numeric.md)
SW_B_FLOOR = 0.2


def sw_half_width(eps: float) -> float:
    """SW's half-width b for a new collection: Li et al.'s :func:`sw_b`, or c·e^{−ε/3}
    (c = :data:`SW_B_FLOOR`) when that is wider (ε above about 2.6). Li et al.'s b maximizes
    the mutual information; at large ε it is so narrow that most of the error is the reports
    sent outside the window (1/(2be^ε + 1) of them: 12 % at ε = 8); a wider window keeps more
    of them near the value, and EMS on fine buckets still resolves it (docs/numeric.md "The
    distribution: Square Wave and EMS": W1 over b measured on Beta(5, 2) and Adult's age)."""
    return max(sw_b(eps), SW_B_FLOOR * math.exp(-eps / 3))


def _sw_pq(eps: float, b: float | None = None) -> tuple[float, float, float]:
    b = sw_b(eps) if b is None else float(b)
    e = math.exp(eps)
    return b, e / (2 * b * e + 1), 1 / (2 * b * e + 1)


def sw_channel(eps: float, v: np.ndarray, buckets: int, b: float | None = None) -> np.ndarray:
    """SW [Li et al. Alg. 1]: output density p on [v−b, v+b], q = p/e^ε elsewhere on
    [−b, 1+b], bucketed into ``buckets`` equal cells; ``P[i, j]`` exactly. ``b``: the
    half-width (None: :func:`sw_b`)."""
    b, p, q = _sw_pq(eps, b)
    edges = np.linspace(-b, 1 + b, int(buckets) + 1)
    v = np.asarray(v, dtype=float)[:, None]
    inside = np.clip(np.minimum(edges[1:], v + b) - np.maximum(edges[:-1], v - b), 0, None)
    P = q * np.diff(edges)[None, :] + (p - q) * inside
    return P / P.sum(axis=1, keepdims=True)


def grid_mid(d: int) -> np.ndarray:
    """The midpoints of d equal bins of [0, 1]."""
    return (np.arange(d) + 0.5) / d


def grid_bin_weights(G: int, d: int) -> np.ndarray:
    """W (G × d): the share of each of d equal bins of [0, 1] in grid point i, the point standing
    for the values it is the nearest of, [(i − ½)/(G − 1), (i + ½)/(G − 1)] ∩ [0, 1]; a point on
    a bin edge is split between its two bins. Rows sum to 1; every column is positive."""
    i = np.arange(int(G))
    lo = np.clip((i - 0.5) / (G - 1), 0.0, 1.0)
    hi = np.clip((i + 0.5) / (G - 1), 0.0, 1.0)
    e = np.linspace(0.0, 1.0, int(d) + 1)
    W = np.clip(np.minimum(hi[:, None], e[1:]) - np.maximum(lo[:, None], e[:-1]), 0.0, None)
    return W / W.sum(axis=1, keepdims=True)


def binned_channel(P_fine: np.ndarray, d: int) -> np.ndarray:
    """The channel of d equal input bins of [0, 1] from the fine grid's rows: the value uniform
    within its bin, so a bin's row is the average of its grid points' rows weighted by their
    shares in it (:func:`grid_bin_weights`; a point on an edge counts half in each bin, which
    keeps the bins' masses those of the values, not shifted by half a grid step)."""
    W = grid_bin_weights(P_fine.shape[0], d)
    return (W.T @ P_fine) / W.sum(axis=0)[:, None]


def spread_on_grid(x: np.ndarray, G: int) -> np.ndarray:
    """A histogram on d equal bins of [0, 1] on the G grid points: each bin's mass spread over
    its points by their shares in it (:func:`grid_bin_weights`); sums to x's total."""
    W = grid_bin_weights(G, np.shape(x)[-1])
    return np.asarray(x, dtype=float) / W.sum(axis=0) @ W.T


def _smooth(x: np.ndarray) -> np.ndarray:
    """The binomial smoothing step [1, 2, 1]/4 along the last axis, mass kept at the ends."""
    pad = np.concatenate([x[..., :1], x, x[..., -1:]], axis=-1)
    s = (pad[..., :-2] + 2 * pad[..., 1:-1] + pad[..., 2:]) / 4
    return s / s.sum(axis=-1, keepdims=True)


def ems(counts: np.ndarray, M: np.ndarray, *, tol: float = 1e-8, max_iter: int = 10_000,
        init: np.ndarray | None = None, smooth: bool = True) -> tuple[np.ndarray, int]:
    """EMS [Li et al. §5]: EM on the channel ``M`` (d × buckets) with a smoothing step after
    every M-step, until the log-likelihood per report changes by less than ``tol``.
    ``counts``: (buckets,) or (B, buckets) (B fits at once). Returns (x (d,) or (B, d),
    iterations)."""
    c = np.atleast_2d(np.asarray(counts, dtype=float))
    n = c.sum(axis=1, keepdims=True)
    d = M.shape[0]
    x = np.full((c.shape[0], d), 1.0 / d) if init is None else np.atleast_2d(init).astype(float)
    x = x / x.sum(axis=1, keepdims=True)
    ll_old = np.full(c.shape[0], -np.inf)
    it = 0
    while it < max_iter:
        it += 1
        lam = np.maximum(x @ M, 1e-300)
        x = x * ((c / lam) @ M.T) / n
        if smooth:
            x = _smooth(x)
        ll = (c * np.log(np.maximum(x @ M, 1e-300))).sum(axis=1) / n[:, 0]
        if np.all(np.abs(ll - ll_old) < tol):
            break
        ll_old = ll
    return (x[0] if np.ndim(counts) == 1 else x), it


def auto_bins(eps: float, n: int, *, lo: int = 16, hi: int = 1024) -> int:
    """The estimate's number of bins from ε and n (docs/numeric.md "Granularity"): the power of
    two nearest 3·n^{1/3}·C_ε, C_ε = (e^ε+1)/(e^ε−1) the noise scale of one report. EMS smooths
    over a fixed number of neighbouring bins, so the bin count sets how much it smooths: the
    classic histogram rate n^{1/3}, widened as the noise grows; the constant 3 is measured
    (W1 over bin counts on Beta(5, 2), docs/numeric.md). Clipped to [lo, hi]."""
    d = 3 * max(n, 1) ** (1 / 3) * _duchi_c(eps)
    return int(min(hi, max(lo, 2 ** round(math.log2(d)))))


def cv_bins(counts: np.ndarray, channels: Mapping[int, np.ndarray],
            rng: np.random.Generator) -> int:
    """The bin count d (a key of ``channels``: d → the channel of d bins) whose EMS fit of one
    half of the reports gives the other half the highest likelihood, both ways (the counts
    split in two by binomial thinning: two independent samples of the same channel output).
    Held-out likelihood chooses how much EMS smooths from the data (docs/numeric.md
    "Granularity")."""
    c = np.asarray(counts, dtype=np.int64)
    half = rng.binomial(c, 0.5)
    folds = np.stack([half, c - half]).astype(float)
    score = {}
    for d, M in channels.items():
        x, _ = ems(folds, M)
        lam = np.maximum(x @ M, 1e-300)
        score[d] = float(folds[1] @ np.log(lam[0]) + folds[0] @ np.log(lam[1]))
    return max(score, key=lambda d: (score[d], -d))


def edge_segments(d: int, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per point of ``xs`` ∈ [0, 1]: the left edge k of its bin (of d equal bins) and its
    fraction t of the way to edge k + 1 (linear interpolation weights 1 − t and t)."""
    pos = np.clip(np.asarray(xs, dtype=float), 0, 1) * d
    k = np.minimum(pos.astype(np.int64), d - 1)
    return k, pos - k


def edge_weights(d: int, x: float) -> np.ndarray:
    """Linear interpolation weights of the point x ∈ [0, 1] on the d + 1 edges of d equal
    bins."""
    (k,), (t,) = edge_segments(d, np.array([x]))
    w = np.zeros(d + 1)
    w[k], w[k + 1] = 1 - t, t
    return w


def ratio_cov(a: np.ndarray, U: np.ndarray, T: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                     float]:
    """Per row u of ``U`` (q × cells), the ratio r = u·m / Σm of the unbiased counts m = a·T
    of one category (``a``: its row of the inverse categorical channel, ``T``: categories ×
    cells counted; one category: a = [1], T = counts[None]), the ratios' covariance (q × q,
    delta method, Poisson variance of T), and Σm. A mean is u = the outputs; a CDF value u = its
    row of :func:`cdf_map`. Σm ≤ 0: NaN ratios, infinite variances."""
    a, U, T = (np.asarray(v, dtype=float) for v in (a, np.atleast_2d(U), T))
    m = a @ T
    D = float(m.sum())
    if D <= 0:
        return np.full(len(U), np.nan), np.diag(np.full(len(U), np.inf)), D
    r = U @ m / D
    g = a[None, :, None] * (U[:, None, :] - r[:, None, None])     # ∂r/∂T · D, (q, cat, cells)
    gT = (g * T[None]).reshape(len(U), -1)
    return r, gT @ g.reshape(len(U), -1).T / D ** 2, D


def ratio_stats(a: np.ndarray, U: np.ndarray, T: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                       float]:
    """:func:`ratio_cov` with the ratios' standard errors instead of their covariance."""
    r, cov, D = ratio_cov(a, U, T)
    return r, np.sqrt(np.clip(np.diag(cov), 0, None)), D


#: runs of a quantile's accepted points less than this many bins apart are one, by default
#: (:meth:`CdfBand.quantile_interval`; measured, docs/numeric.md "Bounds")
MERGE_BINS = 0.5


@dataclass(frozen=True)
class CdfBand:
    """The unbiased CDF at the edges of d equal bins of [0, 1] (least squares through the
    binned channel, :func:`unbiased_cdf`) with its covariance: the bounds of every
    distribution estimate (docs/numeric.md "Bounds")."""

    edges: np.ndarray
    F: np.ndarray
    cov: np.ndarray

    @property
    def se(self) -> np.ndarray:
        return np.sqrt(np.clip(np.diag(self.cov), 0, None))

    def weights(self, x: float) -> np.ndarray:
        """Linear interpolation weights of the point x ∈ [0, 1] on the edges."""
        return edge_weights(len(self.edges) - 1, x)

    def interval(self, w: np.ndarray, z: float) -> tuple[float, float]:
        """(estimate, half-width) of the linear functional w·F (a CDF value, a range mass)."""
        return float(w @ self.F), z * math.sqrt(max(float(w @ self.cov @ w), 0.0))

    def quantile_interval(self, p: float, z: float, near: float,
                          merge: float = MERGE_BINS) -> tuple[float, float]:
        """The quantile's interval: the points x (of :data:`W1_POINTS` on [0, 1]) where the
        band does not reject F(x) = p, |F(x) − p| ≤ z·sd(x), sd(x) the standard error of the
        interpolated CDF at x from the covariance (the interpolated standard errors of the
        edges overstate it between them). These points form runs: sd(x) dips between edges (an
        artefact of interpolating), so runs less than ``merge`` bins apart are one; a noisy
        unbiased CDF is not monotone, so there can be several: the interval is the run nearest
        ``near`` (the point estimate), not their hull, which over-covers (docs/numeric.md
        "Bounds"). When no point passes, the point where F first reaches p."""
        x = np.linspace(0, 1, W1_POINTS)
        k, t = edge_segments(len(self.edges) - 1, x)
        F = (1 - t) * self.F[k] + t * self.F[k + 1]
        C = self.cov
        var = np.clip((1 - t) ** 2 * C[k, k] + 2 * t * (1 - t) * C[k, k + 1]
                      + t ** 2 * C[k + 1, k + 1], 0, None)
        ok = np.flatnonzero((F - p) ** 2 <= z * z * var)
        if not len(ok):
            at = first_crossing(self.edges, self.F, p)
            return at, at
        cut = np.flatnonzero(np.diff(ok) > merge * (W1_POINTS - 1) / (len(self.edges) - 1))
        starts, ends = x[np.r_[ok[0], ok[cut + 1]]], x[np.r_[ok[cut], ok[-1]]]
        k = int(np.argmin(np.maximum(starts - near, 0) + np.maximum(near - ends, 0)))
        return float(starts[k]), float(ends[k])

    def of_reported(self, N: float) -> "CdfBand":
        """This band about the CDF of the N values reported (the counts: some or all of their
        reports) rather than of a population they were drawn from: the covariance less the
        values' own sampling covariance (min(F_a, F_b) − F_a·F_b)/N."""
        Fc = np.clip(self.F, 0, 1)
        return CdfBand(self.edges, self.F,
                       self.cov - (np.minimum.outer(Fc, Fc) - np.outer(Fc, Fc)) / float(N))

    def w1_noise(self, z_level: float, draws: int, rng: np.random.Generator) -> float:
        """The ``z_level`` quantile of ∫|F_u − F| under the normal approximation of the
        unbiased CDF's noise."""
        vals, vecs = np.linalg.eigh(self.cov)
        root = vecs * np.sqrt(np.clip(vals, 0, None))
        noise = rng.standard_normal((draws, len(self.F))) @ root.T
        return float(np.quantile(np.trapezoid(np.abs(noise), self.edges, axis=1), z_level))


def first_crossing(x: np.ndarray, y: np.ndarray, p: float) -> float:
    """The smallest x where the piecewise-linear y(x) reaches p (x[-1] when it never does)."""
    k = int(np.argmax(y >= p)) if np.any(y >= p) else -1
    if k < 0:
        return float(x[-1])
    if k == 0:
        return float(x[0])
    y0, y1 = y[k - 1], y[k]
    return float(x[k - 1] + (x[k] - x[k - 1]) * (p - y0) / (y1 - y0)) if y1 > y0 else float(x[k])


def share_rows(J: np.ndarray, F: np.ndarray, ps: Sequence[float]) -> tuple[list[float], np.ndarray]:
    """The pooled quantiles' share test (docs/windows.md "Numeric attributes"): per p of ``ps``
    the point x_p ∈ [0, 1] where the pooled CDF ``F`` (at the d + 1 equal edges) first reaches
    p, and the row of the CDF at x_p (interpolated between the edges) as a functional of the
    cells, ``edge_weights(x_p)·J`` (J: (d + 1) × cells, the CDF at the edges per cell)."""
    J = np.asarray(J, dtype=float)
    edges = np.linspace(0, 1, len(J))
    xs = [first_crossing(edges, np.asarray(F, dtype=float), p) for p in ps]
    return xs, np.stack([edge_weights(len(J) - 1, x) @ J for x in xs])


def cdf_map(M: np.ndarray) -> np.ndarray:
    """J ((d + 1) × buckets): the unbiased CDF at the edges of the d bins of ``M`` is J·c/n,
    the least-squares inverse of the bucket frequencies (pinv(Mᵀ)) summed."""
    A = np.linalg.pinv(M.T)
    return np.concatenate([np.zeros((1, M.shape[1])), np.cumsum(A, axis=0)])


def unbiased_cdf(counts: np.ndarray, M: np.ndarray) -> CdfBand:
    """F at the edges of the d bins of ``M`` (d × buckets): the least-squares inverse of the
    bucket frequencies, f = pinv(Mᵀ)·c/n, summed; its covariance by the delta method with the
    multinomial covariance of c/n (plug-in frequencies: :func:`ratio_cov` of one category).
    Unbiased when the value is uniform within each bin (the binned channel's model)."""
    J = cdf_map(M)
    F, cov, _ = ratio_cov(np.ones(1), J, np.asarray(counts, dtype=float)[None])
    return CdfBand(np.linspace(0, 1, M.shape[0] + 1), F, cov)


# --- distributions on bins: CDF, quantiles, W1 ---------------------------------------------------

def cdf_at(hist: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The CDF at x ∈ [0, 1] of a histogram on equal bins of [0, 1], uniform inside each bin.
    ``hist``: (d,) or (B, d) → (len(x),) or (B, len(x))."""
    h = np.atleast_2d(np.asarray(hist, dtype=float))
    d = h.shape[1]
    F = np.concatenate([np.zeros((h.shape[0], 1)), np.cumsum(h, axis=1)], axis=1)
    pos = np.clip(np.asarray(x, dtype=float), 0, 1) * d
    k = np.minimum(pos.astype(np.int64), d - 1)
    out = F[:, k] + h[:, k] * (pos - k)
    return out[0] if np.ndim(hist) == 1 else out


def quantile(hist: np.ndarray, qs: Sequence[float] | np.ndarray) -> np.ndarray:
    """Quantiles in [0, 1] of a histogram on equal bins of [0, 1] (uniform inside bins).
    ``hist``: (d,) or (B, d) → (len(qs),) or (B, len(qs))."""
    h = np.atleast_2d(np.asarray(hist, dtype=float))
    h = h / h.sum(axis=1, keepdims=True)
    d = h.shape[1]
    F = np.cumsum(h, axis=1)
    qs = np.asarray(qs, dtype=float)
    out = np.empty((h.shape[0], len(qs)))
    for r in range(h.shape[0]):   # one searchsorted per histogram (row), not per report
        k = np.minimum(np.searchsorted(F[r], qs, side="left"), d - 1)
        below = np.where(k > 0, F[r][k - 1], 0.0)
        frac = np.where(h[r, k] > 0, (qs - below) / np.maximum(h[r, k], 1e-300), 0.5)
        out[r] = (k + np.clip(frac, 0, 1)) / d
    return out[0] if np.ndim(hist) == 1 else out


#: points of the grid the W1 integrals are evaluated on
W1_POINTS = 4097


def w1_hist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """W1 = ∫|F_a − F_b| on [0, 1] between histograms on equal bins (any two bin counts;
    ``a`` may be (B, d) for many at once)."""
    x = np.linspace(0, 1, W1_POINTS)
    return np.trapezoid(np.abs(cdf_at(a, x) - cdf_at(b, x)), x, axis=-1)


def w1_samples(hist: np.ndarray, values01: np.ndarray) -> float:
    """W1 on [0, 1] between a histogram (uniform inside bins) and the empirical distribution of
    ``values01``."""
    x = np.linspace(0, 1, W1_POINTS)
    emp = np.searchsorted(np.sort(np.asarray(values01, dtype=float)), x, side="right")
    return float(np.trapezoid(np.abs(cdf_at(hist, x) - emp / len(values01)), x))


# --- the direct samplers (what a device runs; they draw from the channels above) ---------------

def round_to_grid(y: np.ndarray, lo: float, hi: float, K: int,
                  rng: np.random.Generator) -> np.ndarray:
    """y ∈ [lo, hi] → the index of one of its two neighbours on a K-point grid, the upper one
    with probability equal to the fractional position (unbiased)."""
    pos = (np.asarray(y, dtype=float) - lo) / (hi - lo) * (K - 1)
    k = np.minimum(np.floor(pos).astype(np.int64), K - 2)
    return k + (rng.random(k.shape) < pos - k)


def sample_duchi(eps: float, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Duchi's cell (0: −C, 1: +C) of every t."""
    return (rng.random(np.shape(t)) < 0.5 + np.asarray(t) / (2 * _duchi_c(eps))).astype(np.int64)


def _two_sided(u: np.ndarray, a: np.ndarray, b: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """u ∈ [0, 1) → uniform point of [lo, a) ∪ (b, hi]."""
    left = a - lo
    s = u * (left + hi - b)
    return np.where(s < left, lo + s, b + (s - left))


def sample_pm(eps: float, t: np.ndarray, K: int, rng: np.random.Generator) -> np.ndarray:
    """PM's rounded cell (0…K−1) of every t: uniform on [l, r] with probability
    e^{ε/2}/(e^{ε/2}+1), else uniform on the rest of [−C, C]; then :func:`round_to_grid`."""
    C, _, _ = _pm_params(eps)
    t = np.asarray(t, dtype=float)
    lft = (C + 1) / 2 * t - (C - 1) / 2
    rgt = lft + C - 1
    e2 = math.exp(eps / 2)
    u = rng.random(t.shape)
    inner = rng.random(t.shape) < e2 / (e2 + 1)
    y = np.where(inner, lft + u * (C - 1), _two_sided(u, lft, rgt, -C, C))
    return round_to_grid(y, -C, C, K, rng)


def sample_hm(eps: float, t: np.ndarray, K: int, rng: np.random.Generator) -> np.ndarray:
    """HM's cell: PM's (0…K−1) with probability α, else Duchi's shifted to K, K+1."""
    pm = rng.random(np.shape(t)) < hm_alpha(eps)
    return np.where(pm, sample_pm(eps, t, K, rng), K + sample_duchi(eps, t, rng))


def sample_points(eps: float, t: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """The k-point mechanism's cell (0…k−1) of every t: :func:`round_to_grid` on the k points,
    kept with p = e^ε/(e^ε + k − 1), else one of the other k − 1 uniformly."""
    c = round_to_grid(t, -1.0, 1.0, k, rng)
    move = rng.random(c.shape) >= _points_pb(eps, k)[0]
    return np.where(move, (c + 1 + rng.integers(0, k - 1, c.shape)) % k, c)


def sample_mean(name: str, eps: float, t: np.ndarray, K: int,
                rng: np.random.Generator) -> np.ndarray:
    """The cell of mean mechanism ``name`` for every t (the columns of :func:`mean_channel`;
    ``K`` as there)."""
    if name == "duchi":
        return sample_duchi(eps, t, rng)
    if name == "pm":
        return sample_pm(eps, t, K, rng)
    if name == "points":
        return sample_points(eps, t, K, rng)
    return sample_hm(eps, t, K, rng)


def sample_sw(eps: float, v: np.ndarray, buckets: int, rng: np.random.Generator,
              b: float | None = None) -> np.ndarray:
    """SW's bucket of every v ∈ [0, 1]: uniform on [v−b, v+b] with probability 2bp, else
    uniform on the rest of [−b, 1+b]; then the bucket holding it (``b``: as
    :func:`sw_channel`)."""
    b, p, _ = _sw_pq(eps, b)
    v = np.asarray(v, dtype=float)
    u = rng.random(v.shape)
    inner = rng.random(v.shape) < 2 * b * p
    y = np.where(inner, v - b + u * 2 * b, _two_sided(u, v - b, v + b, -b, 1 + b))
    j = np.floor((y + b) / (1 + 2 * b) * buckets).astype(np.int64)
    return np.clip(j, 0, buckets - 1)
