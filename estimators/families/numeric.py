"""``sw-hm``: numeric attributes (docs/numeric.md), each reported through one channel whose
outputs are cells, so reports are counted like any other family's.

An attribute with a range (the schema's, or the ``ranges`` parameter) is numeric: its domain
size G is the number of points of its input grid on [min, max], a record holds the grid index of
each value (:func:`~.numeric.quantize`); any other attribute is categorical and goes through
GRR(ε). Per numeric attribute a report is one cell of

* the mean task (probability ``mean_share``): Duchi, PM or HM [Wang et al., ICDE 2019] on
  t ∈ [−1, 1], PM rounded without bias to ``mean_grid`` points, or the k-point mechanism (t
  rounded without bias to k points, then k-ary randomized response; k from ε or
  ``mean_points``); ``mean: auto`` takes the one with the smallest worst-case variance at ε
  (:func:`~.numeric.choose_mean`), or
* the distribution task: Square Wave [Li et al., SIGMOD 2020] of half-width ``sw_b`` (default
  from ε: :func:`~.numeric.sw_half_width`) bucketed into ``buckets`` cells (default from b:
  :func:`sw_buckets`).

The attribute's channel is ``[s·P_mean, (1−s)·P_sw]`` (G × cells): its ε is computed from it and
is the attribute's ε (each task at full ε, a device does one of them). Estimators:

* ``mean`` — the unbiased mean with a normal interval from the reports' own variance;
* ``distribution`` — EMS on the SW cells at a granularity chosen from ε and n
  (:func:`~.numeric.auto_bins`), with quantiles, the CDF, range masses and their 95 % intervals
  and a bound on the W1 error, from the unbiased least-squares CDF (:func:`~.numeric.unbiased_cdf`);
* either, of a (categorical, numeric) pair: per category (docs/numeric.md "By category").
"""
from __future__ import annotations

import dataclasses
import math
from functools import cached_property
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.special import ndtri  # the normal quantile, without scipy.stats (1 s to import)

from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels import device_program as dp
from ldpstream.estimators.kernels import numeric as nm
from ldpstream.estimators.kernels.bounds import AT_LEAST, LEVEL, product_channel_bound, stream, unbounded
from ldpstream.estimators.kernels.device_program import (
    alpha_round,
    alpha_seed,
    device_alpha,
    device_rounded,
)
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.proper import project_simplex
from ldpstream.estimators.mechanism import (
    DriftTerms,
    Estimate,
    Mechanism,
    Memoization,
    ParamError,
    Params,
    TensorSpec,
    attribute_budget,
    marginal_key,
    marginal_tensors,
    register,
)
from ldpstream.estimators.memo import memoize_of, memoize_param, memoize_state
from ldpstream.estimators.stream.longitudinal import Guarantee, Memoize

__all__ = ["Numeric", "summary_of", "distribution_bounds", "sw_buckets", "band_bins",
           "bound_bins", "numeric_domain", "QUANTILES",
           "SEED", "ALPHA_POINTS", "rounding_points", "rounding_matrix", "device_alpha",
           "alpha_round", "alpha_seed"]

#: the quantiles every distribution estimate serves (with intervals)
QUANTILES = (0.5, 0.9, 0.99)
#: normal draws of the W1 bound's noise term
W1_DRAWS = 400
#: the W1 draws' seed (bounds are a function of the counts: bounds.stream)
SEED = 31_337
#: most bins of the unbiased CDF the bounds come from
BAND_BINS = 32
#: a category's quantile intervals: runs of accepted points less than this many bins apart
#: are one (:meth:`~.numeric.CdfBand.quantile_interval`; measured, docs/numeric.md)
CATEGORY_MERGE_BINS = 1.0
#: default points of the PM output grid
MEAN_GRID = 129
#: the input grid ``mean: auto`` compared the mean mechanisms on in states stored before the
#: k-point mechanism
LEGACY_CHOICE_GRID = 65


#: intervals of α-point rounding of a memoized collection (docs/numeric.md "Memoization")
ALPHA_POINTS = 16


def rounding_points(G: int, s: int) -> np.ndarray:
    """The grid indices of the s + 1 evenly spaced points of α-point rounding (the range's ends
    among them) on a G-point grid."""
    return np.unique(np.round(np.linspace(0, G - 1, int(s) + 1)).astype(np.int64))


def rounding_matrix(G: int, pts: np.ndarray) -> np.ndarray:
    """R (G × G): grid point x goes to the rounding point above it with probability its
    distance from the one below over their spacing, else to the one below — α-point rounding
    with α uniform, as the server sees it over a population (unbiased: E[rounded] = x): the
    ``round`` step's channel (:func:`~.device_program.round_channel`) on the points' columns."""
    R = np.zeros((G, G))
    R[:, pts] = dp.round_channel(pts, G)
    return R


def sw_buckets(eps: float, b: float | None = None) -> int:
    """SW output buckets: the power of two giving at least four buckets per window 2b (so a
    bucket can lie wholly inside the window and ε is attained), between 128 and 1024 (``b``:
    the half-width; None: Li et al.'s :func:`~.numeric.sw_b`)."""
    b = nm.sw_b(eps) if b is None else float(b)
    need = 4 * (1 + 2 * b) / (2 * b)
    return int(min(1024, max(128, 2 ** math.ceil(math.log2(need)))))


def band_bins(d: int, buckets: int) -> int:
    """Bins of the unbiased CDF behind the drift test: at most :data:`BAND_BINS`, ``d``, and
    half the SW buckets (so the least squares is overdetermined)."""
    return int(min(BAND_BINS, d, buckets // 2))


def bound_bins(eps: float, d: int, buckets: int, b: float | None = None) -> int:
    """Bins of the unbiased CDF behind a distribution's bounds (docs/numeric.md "Bounds"):
    :data:`BAND_BINS`, or more when SW's window 2b is narrow — the power of two nearest four
    bins per window, so that the least squares' model (the value uniform within a bin) is fine
    next to what the channel resolves; at most the estimate's d and half the SW buckets. ``b``:
    the collection's half-width; the window counted is the narrower of it and Li et al.'s
    :func:`~.numeric.sw_b` (a wider window does not make the value smoother within a bin: with
    the bins of the wider window the median's and p99's intervals covered 93–94 % at ε = 4,
    with these 95 %; docs/numeric.md "Bounds")."""
    w = nm.sw_b(eps) if b is None else min(float(b), nm.sw_b(eps))
    per_window = 2 ** round(math.log2(4 / (2 * w)))
    return int(min(max(BAND_BINS, per_window), d, buckets // 2))


def _range(attr: str, raw: Any) -> tuple[float, float]:
    """``{min: a, max: b}`` or ``[a, b]`` → (a, b) with a < b, both finite."""
    if isinstance(raw, Mapping):
        unknown = [k for k in raw if k not in ("min", "max")]
        if unknown:
            raise ParamError(f"ranges.{attr}", f"unknown key {unknown[0]!r} (allowed: min, max)")
        lo, hi = raw.get("min"), raw.get("max")
    elif isinstance(raw, (list, tuple)) and len(raw) == 2:
        lo, hi = raw
    else:
        raise ParamError(f"ranges.{attr}", f"must be {{min: a, max: b}} (got {raw!r})")
    for k, v in (("min", lo), ("max", hi)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
            raise ParamError(f"ranges.{attr}.{k}", f"must be a finite number (got {v!r})")
    assert isinstance(lo, (int, float)) and isinstance(hi, (int, float))
    if not lo < hi:
        raise ParamError(f"ranges.{attr}", f"min must be below max (got {lo!r}, {hi!r})")
    return float(lo), float(hi)


@register
class Numeric(Mechanism):
    """Means (Duchi/PM/HM/k points) and distributions (SW + EMS) of numeric attributes."""

    name = "sw-hm"
    numeric = True
    estimators = ("distribution", "mean")
    default_estimators = ("distribution",)

    def __init__(self, domain: Domain, ranges: Mapping[str, tuple[float, float]],
                 epsilon: float | Sequence[float], *, mean: str = "auto", mean_share: float = 0.5,
                 buckets: int | None = None, mean_grid: int = MEAN_GRID,
                 mean_points: int | Sequence[int] | None = None,
                 mean_mechs: Sequence[str] | None = None,
                 memoize: Memoize | None = None, alpha_points: int = ALPHA_POINTS,
                 version: int = 0, sw_b: float | Sequence[float] | None = None) -> None:
        """``mean_points``: the k-point mechanism's k, one for every attribute or one per
        attribute (default :func:`~.numeric.points_k` of its ε); ``mean_mechs``: each
        attribute's mean mechanism as resolved before (a stored state's), instead of resolving
        ``mean``; ``sw_b``: Square Wave's half-width, one or one per attribute (default
        :func:`~.numeric.sw_half_width` of its ε)."""
        super().__init__(domain, version)
        m = len(domain)
        eps = [float(epsilon)] * m if np.isscalar(epsilon) else [float(e) for e in epsilon]  # type: ignore[arg-type]  # a sequence here
        if len(eps) != m or any(not np.isfinite(e) or e <= 0 for e in eps):
            raise ValueError(f"numeric: need {m} finite epsilons > 0 (got {eps})")
        unknown = [a for a in ranges if a not in domain.attrs]
        if unknown:
            raise ParamError(f"ranges.{unknown[0]}", f"not an attribute of {list(domain.attrs)}")
        #: the numeric attributes' ranges (an attribute without one is categorical: GRR)
        self.ranges = {a: (float(ranges[a][0]), float(ranges[a][1])) for a in domain.attrs
                       if a in ranges}
        if mean != "auto" and mean not in nm.MEAN_MECHANISMS:
            raise ParamError("mean", f"must be auto or one of {', '.join(nm.MEAN_MECHANISMS)}")
        if not 0 <= mean_share <= 1:
            raise ParamError("mean_share", f"must be in [0, 1] (got {mean_share})")
        self.eps_in = eps
        self.mean_spec = mean
        self.mean_share = float(mean_share)
        self.mean_grid = int(mean_grid)
        ks = ([nm.points_k(e) for e in eps] if mean_points is None else
              [int(mean_points)] * m if isinstance(mean_points, int) else
              [int(k) for k in mean_points])
        if len(ks) != m or any(not nm.POINTS_MIN <= k <= nm.POINTS_MAX for k in ks):
            raise ParamError("mean_points", f"must be {m} integers in {nm.POINTS_MIN} … "
                                            f"{nm.POINTS_MAX} (got {mean_points!r})")
        #: the k-point mechanism's k per attribute (whichever mean mechanism is used)
        self.mean_points = ks
        if mean_mechs is not None and (len(mean_mechs) != m or any(
                mm not in nm.MEAN_MECHANISMS for mm in mean_mechs)):
            raise ParamError("mean_mechanisms", f"must be {m} of {', '.join(nm.MEAN_MECHANISMS)} "
                                                f"(got {mean_mechs!r})")
        self.mean_mechs = (list(mean_mechs) if mean_mechs is not None else
                           [nm.choose_mean(e, self.mean_grid, points=k) if mean == "auto" else mean
                            for e, k in zip(eps, ks)])
        if sw_b is None:
            bs = [nm.sw_half_width(e) for e in eps]
        else:
            bs = [float(sw_b)] * m if np.isscalar(sw_b) else [float(b) for b in sw_b]  # type: ignore[arg-type]  # a sequence here
        if len(bs) != m or any(not np.isfinite(b) or b <= 0 for b in bs):
            raise ParamError("sw_b", f"need {m} finite half-widths > 0 (got {bs})")
        #: Square Wave's half-width b per attribute (on [0, 1]; docs/numeric.md)
        self.sw_bs = bs
        self.buckets = [int(buckets) if buckets else sw_buckets(e, b) for e, b in zip(eps, bs)]
        if memoize is not None and memoize.instantaneous_epsilon is not None:
            raise ParamError("memoize.instantaneous_epsilon", "sw-hm memoizes without an "
                                                              "instantaneous layer")
        #: memoized (docs/numeric.md "Memoization"): each numeric value α-point rounded to
        #: ``alpha_points`` intervals first, its permanent response drawn once per rounded value
        self.memoize = memoize
        self.alpha_points = int(alpha_points)
        self.points = {j: rounding_points(G, self.alpha_points)
                       for j, G in enumerate(domain.shape) if self.is_numeric(j)} \
            if memoize is not None else {}

    # --- channels -------------------------------------------------------------------------------
    def is_numeric(self, j: int) -> bool:
        return self.domain.attrs[j] in self.ranges

    def mean_out(self, j: int) -> int:
        """The ``K`` of attribute j's mean mechanism (:func:`~.numeric.mean_channel`): PM's
        output grid, or the k-point mechanism's k."""
        return self.mean_points[j] if self.mean_mechs[j] == "points" else self.mean_grid

    def mean_part(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """(P_mean (G × Km), outputs on [−1, 1]'s scale) of attribute j."""
        return self._mean_parts[j]

    def _rounded(self, j: int, P: np.ndarray) -> np.ndarray:
        """``P`` (G × cells) behind attribute j's α-point rounding when memoized (R·P)."""
        if j not in self.points:
            return P
        return rounding_matrix(self.domain.shape[j], self.points[j]) @ P

    @cached_property
    def _mean_parts(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        out = {}
        for j, (mm, e, G) in enumerate(zip(self.mean_mechs, self.eps_in, self.domain.shape)):
            if self.is_numeric(j):
                P, y = nm.mean_channel(mm, e, nm.grid_t(G), self.mean_out(j))
                out[j] = (self._rounded(j, P), y)
        return out

    @cached_property
    def _sw_parts(self) -> dict[int, np.ndarray]:
        return {j: self._rounded(j, nm.sw_channel(e, nm.grid_v(G), k, b))
                for j, (e, G, k, b) in enumerate(zip(self.eps_in, self.domain.shape,
                                                     self.buckets, self.sw_bs))
                if self.is_numeric(j)}

    def sw_part(self, j: int) -> np.ndarray:
        """P_sw (G × buckets) of attribute j."""
        return self._sw_parts[j]

    def layout(self, j: int) -> tuple[nm.Task, ...]:
        """The tasks of numeric attribute j's report column and their cells
        (:func:`~.numeric.layout`: the one definition the channel, the randomizer, the count
        tensors and the device description share)."""
        return nm.layout(self.mean_mechs[j], self.eps_in[j], self.mean_share, self.mean_grid,
                         self.buckets[j], self.mean_points[j], self.sw_bs[j])

    def mean_cells(self, j: int) -> int:
        """The cells before Square Wave's in attribute j's column (the mean mechanism's)."""
        return self.layout(j)[-1].offset

    def channel(self, j: int) -> np.ndarray:
        """The channel attribute j's reports go through: its tasks' channels side by side, each
        times its weight, i.e. [s·P_mean, (1−s)·P_sw] (numeric; each behind the α-point rounding
        R when memoized), GRR(ε) (categorical)."""
        if not self.is_numeric(j):
            return ch.grr(self.eps_in[j], self.domain.shape[j])
        G = self.domain.shape[j]
        return np.concatenate([t.weight * (self.sw_part(j) if t.kind == "sw" else
                                           self._rounded(j, nm.task_channel(t, self.eps_in[j], G)))
                               for t in self.layout(j)], axis=1)

    @cached_property
    def epsilons(self) -> list[float]:
        """ε of every attribute, computed from its channel."""
        return [nm.epsilon(self.channel(j)) for j in range(len(self.domain))]

    @property
    def epsilon(self) -> float:
        return float(sum(self.epsilons))

    def epsilon_per_attribute(self) -> float:
        return float(max(self.epsilons))

    def guarantee(self) -> Guarantee:
        """Fresh: ε per report. Memoized: ε per rounded value and rotation period, the channels'
        own (computed), so a device whose values stay within their rounding intervals spends
        the record's ε once per period (docs/numeric.md "Memoization")."""
        if self.memoize is None:
            return Guarantee.fresh(self.epsilon)
        return Guarantee.memoized_channels([self.channel(j) for j in range(len(self.domain))],
                                           None, self.memoize)

    def memoization(self) -> Memoization | None:
        """Per attribute and value, the permanent response through the attribute's channel (the
        value α-point rounded with the device's α first); no instantaneous layer."""
        if self.memoize is None:
            return None
        return Memoization(self.memoize, [self.channel(j) for j in range(len(self.domain))],
                           lambda permanent, rng: np.asarray(permanent),
                           draw=lambda records, ids, period, rng: self.randomize_device(
                               records, ids, rng))

    # --- device side ----------------------------------------------------------------------------
    @property
    def report_width(self) -> int:
        return len(self.domain)

    def report_bounds(self) -> np.ndarray:
        return self._report_bounds

    @cached_property
    def _report_bounds(self) -> np.ndarray:
        """Computed once: every batch a worker takes is checked against it."""
        out = np.array([self.layout(j)[-1].offset + self.layout(j)[-1].cells
                        if self.is_numeric(j) else self.domain.shape[j]
                        for j in range(len(self.domain))], dtype=np.int64)
        out.flags.writeable = False
        return out

    def device_program(self) -> dict[str, Any] | None:
        """Per attribute: a categorical one GRR(ε) (``grr``); a numeric one a ``wave`` per task
        of weight > 0 (:meth:`layout`), under a ``select`` whose ``weights`` are the tasks'
        when there are several (docs/device-protocol.md). Memoized: those steps are the
        permanent ones (the task drawn with the response, once per rounded value), after
        ``round``: each numeric attribute's rounding points and α seed (docs/numeric.md
        "Memoization"). None when a grid exceeds :data:`~.device_program.MAX_GRID`, the steps
        exceed the limits, or the description's ε (each wave's, computed from its parameters)
        is not the channels' to 1e-9 (memoized: the channels behind the rounding)."""
        steps: list[dict[str, Any]] = []
        n_steps = 0
        for j, (G, e) in enumerate(zip(self.domain.shape, self.eps_in)):
            if not self.is_numeric(j):
                steps.append(dp.channel_step([j], self.channel(j)))
                n_steps += 1
                continue
            if G > dp.MAX_GRID:
                return None
            tasks = [t for t in self.layout(j) if t.weight > 0]
            waves = [dp.wave_step(j, j, t.offset, t.cells, **nm.wave(t, e))  # type: ignore[arg-type]
                     for t in tasks]
            steps.append(waves[0] if len(waves) == 1 else
                         dp.select_step(None, [[w] for w in waves], [t.weight for t in tasks]))
            n_steps += len(waves) + (len(waves) > 1)
        if n_steps > dp.MAX_STEPS:
            return None
        eps = [dp.step_epsilon(s, self.domain.shape) for s in steps]
        if any(abs(a - b) > 1e-9 * max(b, 1.0) for a, b in zip(eps, self.epsilons)):
            return None
        if self.memoize is None:
            return dp.program(self.name, self.domain, self.report_width, steps)
        rounding = [dp.round_spec(self.points[j], alpha_seed(a)) if j in self.points else None
                    for j, a in enumerate(self.domain.attrs)]
        if sum(len(self.points[j]) for j in self.points) + sum(
                5 * len(s["branches"]) + len(s["weights"]) if s["op"] == "select" else 5
                for s in steps if s["op"] != "grr") > dp.MAX_MATRIX_ENTRIES:
            return None
        prog = dp.program(self.name, self.domain, self.report_width, [])
        prog["memoize"] = {"rotation_s": self.memoize.rotation_s, "round": rounding,
                           "permanent": steps}
        return prog

    def randomize(self, records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Per attribute: the mean task with probability ``mean_share`` (its mechanism's cell),
        else SW's bucket shifted past the mean cells; the direct samplers of the channels.
        Memoized: each numeric value α-point rounded first, with a fresh α
        (:meth:`randomize_device`: the device's own)."""
        return self._randomize(records, rng, None)

    def _randomize(self, records: np.ndarray, rng: np.random.Generator,
                   device_ids: np.ndarray | None) -> np.ndarray:
        records = np.asarray(records)
        if records.ndim != 2 or records.shape[1] != len(self.domain):
            raise ValueError(f"records must be (n, {len(self.domain)}), got {records.shape}")
        out = np.empty(records.shape, dtype=np.uint16)
        for j, (G, e) in enumerate(zip(self.domain.shape, self.eps_in)):
            x = records[:, j].astype(np.int64)
            if len(x) and (x.min() < 0 or x.max() >= G):
                raise ValueError(f"attribute {self.domain.attrs[j]!r}: grid index outside 0…{G - 1}")
            if not self.is_numeric(j):
                out[:, j] = ch.randomize(x, self.channel(j), rng)
                continue
            if j in self.points:
                x = alpha_round(x, self.points[j], rng.random(len(x)) if device_ids is None
                                else device_alpha(device_ids, alpha_seed(self.domain.attrs[j])))
            task = rng.random(len(x)) < self.mean_share
            cell = np.empty(len(x), dtype=np.int64)
            cell[task] = nm.sample_mean(self.mean_mechs[j], e, nm.grid_t(G)[x[task]],
                                        self.mean_out(j), rng)
            sw = self.layout(j)[-1]
            cell[~task] = sw.offset + nm.sample_sw(e, nm.grid_v(G)[x[~task]], sw.cells, rng,
                                                   sw.b)
            out[:, j] = cell
        return out

    def randomize_device(self, records: np.ndarray, device_ids: np.ndarray,
                         rng: np.random.Generator) -> np.ndarray:
        """:meth:`randomize` with each device's own α (memoized; else the ids are unused)."""
        return self._randomize(records, rng, np.asarray(device_ids, dtype=np.uint64))

    def device_records(self, records: np.ndarray, device_ids: np.ndarray) -> np.ndarray:
        """Memoized: grid indices ``(n, m)`` α-point rounded with each device's α — what a
        device memoizes under (a value that stays between its rounding points keeps its
        permanent response); unchanged when not memoized."""
        return device_rounded(records, self.points, self.domain.attrs, device_ids)

    def encode(self, values: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
        """Raw values ``(n, m)`` (domain order) → grid indices, and how many were clipped per
        attribute."""
        values = np.asarray(values, dtype=float)
        out = np.empty(values.shape, dtype=np.int64)
        clipped = {}
        for j, a in enumerate(self.domain.attrs):
            if a in self.ranges:
                out[:, j], clipped[a] = nm.quantize(values[:, j], *self.ranges[a],
                                                    self.domain.shape[j])
            else:
                out[:, j] = values[:, j].astype(np.int64)
        return out, clipped

    # --- server side ----------------------------------------------------------------------------
    def tensors(self, marginals: Sequence[Sequence[str]]) -> list[TensorSpec]:
        """The marginals' count tensors, each tagged with :meth:`channel_tag` of its attributes."""
        return [dataclasses.replace(t, channel=self.channel_tag(t.axes))
                for t in marginal_tensors(self.domain, marginals, self.report_bounds())]

    def channel_tag(self, attrs: Sequence[str]) -> str:
        """What the count tensor of ``attrs`` must say of their channels beyond its shape: the
        k-point mean's k and a Square Wave half-width other than Li et al.'s; empty for the
        channels of earlier versions, whose counts keep their keys. A channel that changes with
        the same shape (the window at ε 3–6, whose buckets stay 128) then counts into new keys
        instead of adding to counts of another channel (agents/store/layout.py)."""
        parts = []
        for a in attrs:
            if a not in self.ranges:
                continue
            j = self.domain.axes((a,))[0]
            if self.mean_mechs[j] == "points":
                parts.append(f"{a}:points{self.mean_points[j]}")
            if self.sw_bs[j] != nm.sw_b(self.eps_in[j]):
                parts.append(f"{a}:b{self.sw_bs[j]:.12g}")
        return ",".join(parts)

    def check_marginal(self, attrs: Sequence[str], method: str) -> str | None:
        """One numeric attribute (mean, distribution), one categorical (distribution), or a
        categorical and a numeric one (both, per category)."""
        why = super().check_marginal(attrs, method)
        if why is not None:
            return why
        num = [a for a in attrs if a in self.ranges]
        if len(attrs) == 1 and not num and method == "mean":
            return f"{attrs[0]!r} is categorical: it has a distribution, not a mean"
        if len(attrs) == 2 and len(num) == 1 or len(attrs) == 1:
            return None
        return (f"{self.name} estimates one attribute, or a numeric one per category of a "
                f"categorical one (got {list(attrs)})")

    def _split(self, counts: Mapping[str, np.ndarray], attr: str) -> tuple[int, np.ndarray,
                                                                           np.ndarray]:
        j = self.domain.axes((attr,))[0]
        c = np.asarray(one_way(counts, attr), dtype=np.int64)
        k = self.mean_cells(j)
        return j, c[:k], c[k:]

    def estimate(self, counts: Mapping[str, np.ndarray], attrs: Sequence[str], method: str,
                 **options: Any) -> Estimate:
        """``mean`` or ``distribution`` of the one attribute in ``attrs`` (values in its own
        units). Options of ``distribution``: ``bins`` (default :func:`~.numeric.auto_bins`;
        ``"cv"``: chosen by held-out likelihood, :func:`~.numeric.cv_bins`),
        ``ranges`` (list of (a, b): masses of [a, b] with intervals)."""
        why = self.check_marginal(attrs, method)
        if why:
            raise ValueError(why)
        if len(attrs) == 2:
            return self._by_category(counts, tuple(attrs), method)
        (a,) = tuple(attrs)
        if a not in self.ranges:
            return self._categorical(counts, a)
        lo, hi = self.ranges[a]
        j, cm, cs = self._split(counts, a)
        if method == "mean":
            return self._mean(a, j, cm, lo, hi)
        return self._distribution(a, j, cs, int(cm.sum()) + int(cs.sum()), lo, hi, options)

    def _mean(self, a: str, j: int, cm: np.ndarray, lo: float, hi: float) -> Estimate:
        r = nm.mean_estimate(cm, self.mean_part(j)[1], LEVEL)
        unit = lambda t: lo + (t + 1) / 2 * (hi - lo)  # noqa: E731
        w = float(np.clip((r.mean + 1) / 2, 0, 1))
        dom = self.domain.project((a,))
        ends = np.zeros(dom.shape[0])
        ends[0], ends[-1] = 1 - w, w   # the distribution on the range's ends with this mean
        extra = {"mean": unit(r.mean), "mean_low": unit(r.low), "mean_high": unit(r.high),
                 "stderr": r.stderr * (hi - lo) / 2, "level": LEVEL, "reports": r.n,
                 "mechanism": self.mean_mechs[j], "min": lo, "max": hi}
        b = unbounded(ends)
        return Estimate(Factor(dom, ends), "mean", r.n, self.epsilon, error_bound=b.tvd,
                        bound=b, extra=extra)

    def _distribution(self, a: str, j: int, cs: np.ndarray, reported: int, lo: float, hi: float,
                      options: Mapping[str, Any]) -> Estimate:
        """EMS on the SW counts ``cs`` with the bounds of its unbiased CDF, about the values of
        the ``reported`` reports of the attribute (both tasks'; docs/numeric.md "Bounds")."""
        n = int(cs.sum())
        if n < 1:
            raise ValueError(f"no distribution reports counted for {a!r}")
        G = self.domain.shape[j]
        bins = options.get("bins")
        d = nm.auto_bins(self.eps_in[j], n)
        if bins == "cv":   # held-out likelihood over ½, 1, 2, 4 × the automatic count
            cands = {min(G, 1024, max(16, d // 2) * 2 ** k) for k in range(4)}
            d = nm.cv_bins(cs, {c: nm.binned_channel(self.sw_part(j), c) for c in cands},
                           stream(SEED, cs))
        elif bins:
            d = int(bins)
        d = min(G, d)
        x, iters = nm.ems(cs, nm.binned_channel(self.sw_part(j), d))
        band, _ = self.band(j, bound_bins(self.eps_in[j], d, len(cs), self.sw_bs[j]), np.ones(1),
                            cs[None])
        band = band.of_reported(reported)
        z = float(ndtri(0.5 + LEVEL / 2))
        span = hi - lo
        unit = lambda v: lo + float(v) * span  # noqa: E731
        e = band.edges
        F = nm.cdf_at(x, e)
        quantiles, w1 = distribution_bounds(x, band, lo, hi, z, stream(SEED, cs))
        extra: dict[str, Any] = {
            "bins": d, "reports": n, "iterations": iters, "min": lo, "max": hi,
            "mean": unit(x @ nm.grid_mid(d)), "quantiles": quantiles,
            "cdf_at": [unit(v) for v in e], "cdf": F.tolist(),
            "cdf_low": np.clip(band.F - z * band.se, 0, 1).tolist(),
            "cdf_high": np.clip(band.F + z * band.se, 0, 1).tolist(),
            "w1_bound": w1, "w1_coverage": AT_LEAST, "level": LEVEL}
        if options.get("ranges"):
            extra["ranges"] = [self._range_mass(x, band, lo, hi, ra, rb, z)
                               for ra, rb in options["ranges"]]
        extra["histogram"] = x.tolist()
        # on the attribute's grid: each bin's mass spread over its grid points
        grid = nm.spread_on_grid(x, G)
        b = unbounded(grid)   # on the grid only W1 is bounded (extra["w1_bound"])
        return Estimate(Factor(self.domain.project((a,)), grid), "distribution", n,
                        self.epsilon, error_bound=b.tvd, bound=b, iterations=iters, extra=extra)

    def _categorical(self, counts: Mapping[str, np.ndarray], a: str) -> Estimate:
        """A categorical attribute's distribution: the GRR inverse, projected on the simplex."""
        j = self.domain.axes((a,))[0]
        c = np.asarray(one_way(counts, a), dtype=float)
        n = float(c.sum())
        if n <= 0:
            raise ValueError(f"no reports counted for {a!r}")
        raw = np.linalg.solve(self.channel(j).T, c / n)
        b = product_channel_bound(c, [self.channel(j)])
        dom = self.domain.project((a,))
        return Estimate(Factor(dom, raw), "distribution", int(n), self.epsilon,
                        error_bound=b.tvd, bound=b, projected=Factor(dom, project_simplex(raw)))

    def _by_category(self, counts: Mapping[str, np.ndarray], attrs: tuple[str, str],
                     method: str) -> Estimate:
        """The numeric attribute per category of the categorical one: the joint counts of their
        cells, the categorical axis inverted through its GRR (unbiased per-category cell counts,
        signed), then per category the mean (a ratio, its interval by the delta method) or EMS
        on the clipped SW counts (docs/numeric.md "By category")."""
        c_attr, x_attr = attrs if attrs[1] in self.ranges else attrs[::-1]
        jc, jx = self.domain.axes((c_attr, x_attr))
        T = np.asarray(joint(counts, (c_attr, x_attr)), dtype=float)   # (categories, cells)
        n = int(T.sum())
        if n <= 0:
            raise ValueError(f"no reports counted for {list(attrs)}")
        A = np.linalg.inv(self.channel(jc).T)
        Mc = A @ T                                  # unbiased counts per true category
        share = project_simplex(Mc.sum(axis=1) / n)
        lo, hi = self.ranges[x_attr]
        k = self.mean_cells(jx)
        z = float(ndtri(0.5 + LEVEL / 2))
        labels = self.domain.categories(c_attr)
        G = self.domain.shape[jx]
        rows: list[dict[str, Any]] = []
        grid = np.zeros((len(labels), G))
        if method == "mean":
            y = self.mean_part(jx)[1]
            unit = lambda t: lo + (t + 1) / 2 * (hi - lo)  # noqa: E731
            for i, lab in enumerate(labels):
                # the ratio of the category's value total to its report count, linearized
                (r,), (se,), D = nm.ratio_stats(A[i], y, T[:, :k])
                r = r if D > 0 else 0.0
                w = float(np.clip((r + 1) / 2, 0, 1))
                grid[i, 0], grid[i, -1] = 1 - w, w
                rows.append({"category": lab, "share": float(share[i]), "mean": unit(r),
                             "mean_low": unit(r - z * se), "mean_high": unit(r + z * se),
                             "reports": D})
        else:
            sw = np.clip(Mc[:, k:], 0, None)
            for i, lab in enumerate(labels):
                tot = float(sw[i].sum())
                row: dict[str, Any] = {"category": lab, "share": float(share[i]),
                                       "reports": tot}
                if tot >= 1:
                    d = min(G, nm.auto_bins(self.eps_in[jx], int(tot)))
                    x, _ = nm.ems(sw[i], nm.binned_channel(self.sw_part(jx), d))
                    grid[i] = nm.spread_on_grid(x, G)
                    # its bounds from its own unbiased CDF: signed counts, a ratio per edge
                    band, D = self.band(jx, bound_bins(self.eps_in[jx], d, len(sw[i]),
                                                       self.sw_bs[jx]), A[i], T[:, k:])
                    if D > 0:
                        # runs a bin apart are one here: at half a bin a category's
                        # quantiles covered 92.5 % (docs/numeric.md "Per-category bounds")
                        qs, w1 = distribution_bounds(x, band, lo, hi, z, stream(SEED + i, T[:, k:]),
                                         CATEGORY_MERGE_BINS)
                    else:   # no unbiased count: the bounds that always hold
                        qs = {f"{p:g}": [lo + float(v) * (hi - lo), lo, hi]
                              for p, v in zip(QUANTILES, nm.quantile(x, QUANTILES))}
                        w1 = hi - lo
                    row.update(bins=d, histogram=x.tolist(),
                               mean=lo + float(x @ nm.grid_mid(d)) * (hi - lo), quantiles=qs,
                               w1_bound=w1, w1_coverage=AT_LEAST)
                else:
                    grid[i] = 1.0 / G
                rows.append(row)
        joint_values = share[:, None] * grid
        if attrs[0] != c_attr:
            joint_values = joint_values.T
        extra = {"by": c_attr, "of": x_attr, "categories": rows, "level": LEVEL,
                 "min": lo, "max": hi}
        b = unbounded(joint_values)  # per-category intervals are in extra
        return Estimate(Factor(self.domain.project(attrs), joint_values), method, n,
                        self.epsilon, error_bound=b.tvd, bound=b, extra=extra)

    @cached_property
    def _cdf_maps(self) -> dict[tuple[int, int], np.ndarray]:
        return {}

    def cdf_map(self, j: int, bins: int) -> np.ndarray:
        """:func:`~.numeric.cdf_map` of attribute j's SW channel on ``bins`` equal bins
        (cached: the drift test and the per-category bounds ask for it at every refresh)."""
        key = (j, int(bins))
        if key not in self._cdf_maps:
            self._cdf_maps[key] = nm.cdf_map(nm.binned_channel(self.sw_part(j), int(bins)))
        return self._cdf_maps[key]

    def band(self, j: int, bins: int, a: np.ndarray, T: np.ndarray) -> tuple[nm.CdfBand, float]:
        """The unbiased CDF of attribute j on ``bins`` equal bins with its covariance, of the
        category whose row of the inverse categorical channel is ``a`` (``T``: categories × SW
        cells counted; the whole population: a = [1], T = the counts as one row), and its
        unbiased count (:func:`~.numeric.ratio_cov`: with a = [1] the multinomial covariance)."""
        J = self.cdf_map(j, bins)
        F, cov, D = nm.ratio_cov(a, J, T)
        return nm.CdfBand(np.linspace(0, 1, len(J)), F, cov), D

    def drift_terms(self, cur: Mapping[str, np.ndarray], prev: Mapping[str, np.ndarray],
                    attrs: Sequence[str], method: str) -> DriftTerms | None:
        """The mean (``mean``) or the three quantiles (``distribution``) of the numeric
        attribute of ``attrs``, per category when ``attrs`` has a categorical one
        (docs/windows.md "Numeric attributes"). A quantile moved when the share of values below
        the two windows' pooled p-quantile x_p changed: F_cur(x_p) against F_prev(x_p), from the
        unbiased CDF. Each is a ratio of linear functionals of the counts
        (:func:`~.numeric.ratio_stats`); its variance under "no change" from the pooled counts,
        at each window's size. The effect is |Δ mean| ÷ range, or |Δ F(x_p)| (a share of the
        values: at most the TVD between the windows). A categorical attribute alone: None (the
        GRR cells are tested)."""
        why = self.check_marginal(attrs, method)
        if why:
            raise ValueError(why)
        num = [a for a in attrs if a in self.ranges]
        if not num:
            return None
        x_attr = num[0]
        jx = self.domain.axes((x_attr,))[0]
        if len(attrs) == 2:
            c_attr = next(a for a in attrs if a != x_attr)
            tabs = [np.asarray(joint(c, (c_attr, x_attr)), dtype=float) for c in (cur, prev)]
            A = np.linalg.inv(self.channel(self.domain.axes((c_attr,))[0]).T)
            labels: list[str | None] = list(self.domain.categories(c_attr))
        else:
            tabs = [np.asarray(one_way(c, x_attr), dtype=float)[None, :] for c in (cur, prev)]
            A, labels = np.eye(1), [None]
        n_cur, n_prev = (float(t.sum()) for t in tabs)
        if n_cur <= 0 or n_prev <= 0:
            raise ValueError("a window without reports has no drift")
        k = self.mean_cells(jx)
        cols = slice(0, k) if method == "mean" else slice(k, None)
        pool = tabs[0] + tabs[1]
        N = n_cur + n_prev
        lo, hi = self.ranges[x_attr]
        J = None if method == "mean" else self.cdf_map(jx, band_bins(BAND_BINS, self.buckets[jx]))
        y = self.mean_part(jx)[1]
        names, rows = [], []
        for i, lab in enumerate(labels):
            if method == "mean":
                U, what, at = y[None, :], ["mean"], [None]
            else:
                assert J is not None
                F, _, D = nm.ratio_stats(A[i], J, pool[:, cols])
                if D <= 0:
                    continue
                xs, U = nm.share_rows(J, F, QUANTILES)
                what, at = [f"{p:g}" for p in QUANTILES], [lo + x * (hi - lo) for x in xs]
            _, se_pool, D = nm.ratio_stats(A[i], U, pool[:, cols])
            (r_cur, _, d_cur), (r_prev, _, d_prev) = (nm.ratio_stats(A[i], U, t[:, cols])
                                                      for t in tabs)
            if D <= 0 or d_cur <= 0 or d_prev <= 0:
                continue   # a category without reports in a window: nothing to compare
            for q in range(len(U)):
                v = se_pool[q] ** 2 * N   # ∝ 1/n: from the pooled size to each window's
                rows.append((r_cur[q], v / n_cur, r_prev[q], v / n_prev))
                names.append(what[q] if lab is None else f"{lab}/{what[q]}")
                if method == "mean":
                    det = {"quantity": "mean", "current": lo + (r_cur[q] + 1) / 2 * (hi - lo),
                           "previous": lo + (r_prev[q] + 1) / 2 * (hi - lo)}
                else:
                    det = {"quantity": what[q], "at": at[q], "current": r_cur[q],
                           "previous": r_prev[q]}
                if lab is not None:
                    det["category"] = lab
                rows[-1] += (det,)
        if not rows:
            raise ValueError(f"no reports of {x_attr!r} in both windows")
        cur_v, cur_var, prev_v, prev_var = (np.array([r[i] for r in rows], dtype=float)
                                            for i in range(4))
        scale = 0.5 if method == "mean" else 1.0   # t on [−1, 1]: a share of the range
        return DriftTerms(tuple(names), cur_v, cur_var, prev_v, prev_var,
                          np.abs(cur_v - prev_v) * scale, tuple(r[4] for r in rows))

    def summary_fields(self, est: Estimate) -> dict[str, Any]:
        """``numeric``: what a numeric estimate serves beside its cells (:func:`summary_of`)."""
        return summary_of(est)

    @staticmethod
    def _range_mass(x: np.ndarray, band: nm.CdfBand, lo: float, hi: float, ra: float,
                    rb: float, z: float) -> list[float]:
        """[a, b, mass, low, high]: the EMS mass of [a, b] and the interval of the unbiased
        CDF's difference."""
        pa, pb = (np.clip([ra, rb], lo, hi) - lo) / (hi - lo)
        m = float(np.diff(nm.cdf_at(x, np.array([pa, pb])))[0])
        mu, half = band.interval(band.weights(pb) - band.weights(pa), z)
        return [ra, rb, m, float(np.clip(min(mu - half, m), 0, 1)),
                float(np.clip(max(mu + half, m), 0, 1))]

    # --- construction ---------------------------------------------------------------------------
    @classmethod
    def from_config(cls, domain: Domain, params: Mapping[str, Any] | None, *,
                    epsilon: float | None, epsilon_scope: str = "attribute",
                    version: int = 0) -> "Numeric":
        """``params``: ``ranges`` ({attribute: {min, max}}; default: the schema's range of a
        numeric attribute; an attribute with none is categorical, through GRR), ``mean`` (auto, hm, pm,
        duchi, points), ``mean_share`` (0.5), ``buckets`` (SW cells; default from ε), ``mean_grid``
        (PM output points, 129), ``mean_points`` (the k-point mechanism's k, 2 … 64; default
        from ε; with ``mean`` auto or points), ``sw_b`` (SW's half-width on [0, 1], in (0, 0.5],
        or ``li``: Li et al.'s; default from ε: :func:`~.numeric.sw_half_width`)."""
        pr = Params(cls.name, params)
        raw = pr.value("ranges")
        mean = pr.choice("mean", "auto", ("auto",) + nm.MEAN_MECHANISMS)
        share = pr.number("mean_share", 0.5, ge=0.0, le=1.0)
        buckets = pr.integer("buckets", None, ge=8, le=4096)
        grid = pr.integer("mean_grid", MEAN_GRID, ge=3, le=4097)
        k = pr.integer("mean_points", None, ge=nm.POINTS_MIN, le=nm.POINTS_MAX)
        # "li": Li et al.'s half-width at the attribute's ε (values with point masses)
        raw_b = pr.value("sw_b")
        li = raw_b == "li"
        if isinstance(raw_b, str) and not li:
            raise ParamError("sw_b", f"must be a number in (0, 0.5] or li (got {raw_b!r})")
        half = None if li else pr.number("sw_b", None, gt=0.0, le=0.5)
        raw_memo = pr.value("memoize")
        points = pr.integer("alpha_points", None, ge=1, le=1024)
        pr.done()
        if k is not None and mean not in ("auto", "points"):
            raise ParamError("mean_points", f"is the k-point mechanism's: set mean to points or "
                                            f"auto (got mean: {mean})")
        if raw_memo is not None and isinstance(raw_memo, Mapping) and raw_memo.get(
                "instantaneous_epsilon") is not None:
            raise ParamError("memoize.instantaneous_epsilon",
                             "sw-hm memoizes without an instantaneous layer (its outputs are "
                             "hundreds of cells: a GRR over them would drown the report)")
        memoize = None if raw_memo is None else memoize_param(raw_memo, lambda e: (e,))
        if points is not None and memoize is None:
            raise ParamError("alpha_points", "α-point rounding is for memoized collections: "
                                             "set memoize too")
        if raw is not None and not isinstance(raw, Mapping):
            raise ParamError("ranges", f"must be {{attribute: {{min: a, max: b}}}} (got {raw!r})")
        raw = raw or {}
        unknown = [a for a in raw if a not in domain.attrs]
        if unknown:
            raise ParamError(f"ranges.{unknown[0]}", f"not an attribute of {list(domain.attrs)}")
        # a range given here, else the schema's; an attribute with neither is categorical
        ranges = {a: _range(a, raw[a]) if a in raw else domain.numeric_range(a)
                  for a in domain.attrs}
        ranges = {a: r for a, r in ranges.items() if r is not None}
        eps = attribute_budget(epsilon, epsilon_scope, len(domain))
        if li:
            half = nm.sw_b(eps)
        return cls(domain, ranges, eps,
                   mean=str(mean), mean_share=0.5 if share is None else share,
                   buckets=buckets, mean_grid=MEAN_GRID if grid is None else grid,
                   mean_points=k, memoize=memoize, alpha_points=points or ALPHA_POINTS,
                   version=version, sw_b=half)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "Numeric":
        """The state's mean mechanisms as stored; a state stored before the k-point mechanism
        (no ``mean_points``) resolves ``mean: auto`` among the mechanisms it had, on the grid
        it used, so it keeps its layout."""
        grid = int(state["mean_grid"])
        mechs = state.get("mean_mechanisms")
        if "mean_points" not in state:
            mechs = [nm.choose_mean(float(e), grid, LEGACY_CHOICE_GRID, nm.LEGACY_MEAN_MECHANISMS)
                     if state["mean"] == "auto" else state["mean"] for e in state["epsilons"]]
        return cls(Domain.from_dict(state["domain"]),
                   {a: (float(r[0]), float(r[1])) for a, r in state["ranges"].items()},
                   state["epsilons"], mean=state["mean"], mean_share=float(state["mean_share"]),
                   buckets=None, mean_grid=grid, mean_points=state.get("mean_points"),
                   mean_mechs=mechs, memoize=memoize_of(state),
                   alpha_points=int(state.get("alpha_points", ALPHA_POINTS)),
                   version=int(state.get("version", 0)),
                   # a state from before the half-width was chosen: Li et al.'s b
                   sw_b=state.get("sw_b") or [nm.sw_b(float(e)) for e in state["epsilons"]]
                   ).with_buckets(state["buckets"])

    def with_buckets(self, buckets: Sequence[int]) -> "Numeric":
        """This state with the SW bucket count of every attribute set."""
        self.buckets = [int(b) for b in buckets]
        for cached in ("_sw_parts", "_cdf_maps", "epsilons"):
            self.__dict__.pop(cached, None)
        return self

    def state(self) -> dict[str, Any]:
        return {"mechanism": self.name, "version": self.version,
                "domain": self.domain.to_compact_dict(), "epsilons": list(self.eps_in),
                "ranges": {a: list(r) for a, r in self.ranges.items()},
                "mean": self.mean_spec, "mean_share": self.mean_share,
                "mean_grid": self.mean_grid, "buckets": list(self.buckets),
                "mean_points": list(self.mean_points), "mean_mechanisms": list(self.mean_mechs),
                "sw_b": list(self.sw_bs),
                **memoize_state(self.memoize),
                **({"alpha_points": self.alpha_points} if self.memoize is not None else {})}


def distribution_bounds(x: np.ndarray, band: nm.CdfBand, lo: float, hi: float, z: float,
            rng: np.random.Generator, merge: float = nm.MERGE_BINS
            ) -> tuple[dict[str, list[float]], float]:
    """The bounds of the EMS histogram ``x`` (bins of [0, 1]) from the unbiased CDF ``band``
    (docs/numeric.md "Bounds"), in the units of [lo, hi]: per quantile of :data:`QUANTILES`
    ``[value, low, high]``, the band's interval nearest EMS's quantile and the value EMS's
    quantile clamped into it (the band's interval is the one whose coverage is measured; EMS's
    smoothing bias can put its quantile outside, e.g. p99); and the W1 bound W1(EMS, band) + the
    ``LEVEL`` quantile of the band's ∫|noise| (triangle inequality)."""
    span = hi - lo
    quantiles = {}
    for p, qv in zip(QUANTILES, nm.quantile(x, QUANTILES)):
        ql, qh = band.quantile_interval(p, z, float(qv), merge)
        quantiles[f"{p:g}"] = [lo + float(v) * span for v in (np.clip(qv, ql, qh), ql, qh)]
    gap = float(np.trapezoid(np.abs(nm.cdf_at(x, band.edges) - band.F), band.edges))
    return quantiles, min(gap + band.w1_noise(LEVEL, W1_DRAWS, rng), 1.0) * span


def summary_of(est: Estimate) -> dict[str, Any]:
    """``numeric``: what a numeric estimate serves beside its cells (docs/api.md "Numeric
    estimates"), from its ``extra`` (sw-hm's, or a partitioned marginal's: docs/numeric.md "In
    partitioned marginals"); nothing for a categorical attribute's distribution. A mean with an
    interval beside a distribution (partitioned) carries it."""
    x = est.extra or {}
    if "min" not in x:   # a categorical attribute's GRR distribution: its cells say it all
        return {}
    iv = lambda v: {"value": v[0], "low": v[1], "high": v[2]}  # noqa: E731
    out: dict[str, Any] = {"attribute": x.get("of", est.factor.domain.attrs[0]),
                           "min": x["min"], "max": x["max"], "level": x["level"]}
    if "categories" in x:
        out["by"] = x["by"]
        rows = []
        for r in x["categories"]:
            row = {"category": r["category"], "share": r["share"], "reports": r["reports"]}
            if est.method == "mean":
                row["mean"] = {"value": r["mean"], "low": r["mean_low"],
                               "high": r["mean_high"]}
            elif "bins" in r:
                row.update(mean=_mean_of(r), quantiles={
                    p: iv(v) for p, v in r["quantiles"].items()},
                    histogram={"bins": r["bins"], "mass": r["histogram"]},
                    w1_bound=r["w1_bound"], w1_bound_coverage=r["w1_coverage"])
            rows.append(row)
        out["categories"] = rows
    elif est.method == "mean":
        out["mean"] = {"value": x["mean"], "low": x["mean_low"], "high": x["mean_high"],
                       "stderr": x["stderr"], "mechanism": x["mechanism"],
                       "reports": x["reports"]}
    elif "mean" in x:   # absent: no report of the group estimated (partitioned, small n)
        out.update(mean=_mean_of(x), reports=x["reports"],
                   quantiles={p: iv(v) for p, v in x["quantiles"].items()},
                   histogram={"bins": x["bins"], "mass": x["histogram"]},
                   cdf={"at": x["cdf_at"], "value": x["cdf"], "low": x["cdf_low"],
                        "high": x["cdf_high"]},
                   w1_bound=x["w1_bound"], w1_bound_coverage=x["w1_coverage"])
        if "ranges" in x:
            out["ranges"] = [{"from": a, "to": b, "value": m, "low": lw, "high": h}
                             for a, b, m, lw, h in x["ranges"]]
    if "resolution" in x:
        out["resolution"] = x["resolution"]
    return {"numeric": out}


def _mean_of(x: Mapping[str, Any]) -> dict[str, Any]:
    """A distribution's mean: its value, with its interval where it has one."""
    return ({"value": x["mean"]} if "mean_low" not in x else
            {"value": x["mean"], "low": x["mean_low"], "high": x["mean_high"]})


def joint(counts: Mapping[str, np.ndarray], attrs: tuple[str, str]) -> np.ndarray:
    """The joint cells of two attributes (axes in that order) from the tensor of that pair."""
    for key, order in ((marginal_key(attrs), False), (marginal_key(attrs[::-1]), True)):
        if key in counts:
            t = np.asarray(counts[key])
            return t.T if order else t
    raise KeyError(f"no count tensor holds {list(attrs)}; tensors: {sorted(counts)}")


def one_way(counts: Mapping[str, np.ndarray], attr: str) -> np.ndarray:
    """The cells of ``attr``'s reports: its own tensor, else a joint tensor holding it summed
    over the other axes."""
    key = marginal_key((attr,))
    if key in counts:
        return np.asarray(counts[key])
    for k, t in counts.items():
        axes = k[2:].split("|") if k.startswith("m:") else []
        if attr in axes:
            t = np.asarray(t)
            return t.sum(axis=tuple(i for i in range(t.ndim) if axes[i] != attr))
    raise KeyError(f"no count tensor holds {attr!r}; tensors: {sorted(counts)}")


def numeric_domain(attrs: Sequence[str], grid: int = nm.DEFAULT_GRID,
                   ranges: Mapping[str, tuple[float, float]] | None = None) -> Domain:
    """A domain of numeric attributes on ``grid``-point input grids over their ``ranges``
    (default [0, 1])."""
    rs = tuple((float(ranges[a][0]), float(ranges[a][1])) if ranges and a in ranges
               else (0.0, 1.0) for a in attrs)
    return Domain(tuple(attrs), (int(grid),) * len(attrs),
                  tuple(nm.numeric_labels(lo, hi, grid) for lo, hi in rs), rs)
