"""``partitioned``: each report carries ONE declared marginal, with the whole ε (user
partitioning; CALM, Zhang et al., CCS 2018, §4; the frequency oracles of Wang et al. 2017).

The collection declares the marginals it collects (a list, or every k-way one). Each report is
assigned one of them uniformly and independently of the record — by a seeded hash of the device
id where the caller knows it (the device SDK: a device always reports the same marginal), else
by the randomizer's rng per report (the simulated fleet, ``Device``, ``simulate``) — and
reports the joint value of that marginal through the
frequency oracle of smallest variance for its domain size (GRR, or OLH where the domain is large;
:func:`~.frequency_oracles.choose`). Splitting ε over attributes is avoided entirely: one report
is one ε-LDP release of one marginal's value.

``per_report`` = r > 1 makes each report carry r marginals k, k+1, …, k+r−1 (mod K; k
uniform), each with ε/r: the number of users per marginal sets the error floor of partitioning
at large ε, and r trades it against the oracles' noise. r = 1 (the default) is CALM's one
marginal with the whole budget.

Report layout: one unsigned integer per slot, ``offset_k + code``, where ``code`` is the oracle's report
(GRR value, or OLH seed·g + hashed value) and ``offset_k`` the start of marginal k's code block,
so ``report_bounds`` validates every report exactly. Count tensors: one per collected marginal,
``p:<attrs>``, the oracle's support counts of its d_k joint values followed by the number of
reports assigned to it (shape ``(d_k + 1,)``).

ε: the marginal index is drawn independently of the record, so Pr[report | x] = π_k ·
Pr_k[code | x_k] and the worst ratio over two records is the largest oracle ε, computed from each
oracle's channel (times r for r slots, randomized independently: sequential composition).

Estimators (:attr:`Partitioned.estimators`):

* ``unbiased`` — [Wang17] eq. 3 on the marginal's own reports (or the smallest collected
  superset, summed); cells may leave [0, 1].
* ``norm-sub`` — the same after Norm-Sub.
* ``calm`` — CALM: every collected marginal estimated, made consistent on shared attribute sets
  by inverse-variance weighting, alternated with Norm-Sub (ends consistent;
  :func:`~.consistency.postprocess`); a marginal inside a collected one is its projection, any
  other (e.g. a 3-way from pairs) the maximum-entropy table with the collected sub-marginals
  (:func:`~.consistency.max_entropy`).
* ``consistent`` — ``calm`` with one more step after the first consistency:
  hierarchical positive-part James–Stein shrinkage with each table's known cell variance
  (oracle noise plus the sampling of which users report it: the target is the population's
  marginal) (:func:`~.consistency.shrink_hierarchical`): every pair toward the product of its
  1-way marginals with the variance of its consistent estimate, every larger set's top-order
  interaction toward the maximum-entropy table with its shrunk sub-marginals; keeps the 1-way
  marginals. With pairs collected it is the per-table shrinkage toward independence
  (:func:`~.consistency.shrink_to_independence`; binary-by-small pairs pooled). Measured in
  docs/partitioned.md.
* ``global`` (the default) — one distribution over the whole domain fitted by mirror descent
  to the ``consistent`` tables, or to the unbiased tables themselves (Private-PGM's loss and
  weights), each kept at the iterate of smallest SURE, Private-PGM's first mirror-descent step
  from the uniform table (:func:`~.kernels.global_fit.one_step`), or the ``consistent`` tables: whichever
  has the smallest estimated risk on the pairs and triples (:meth:`Partitioned.global_table`,
  :mod:`~.kernels.global_fit`; held-out against Private-PGM in docs/benchmarks.md).

``error_bound``: the upper 95 % quantile of the TVD of the unbiased estimate to the population's
marginal, with per-cell intervals (:func:`~.bounds.oracle_bound`, ``Estimate.bound``); the
unbiased estimate is also served projected onto the simplex (``Estimate.projected``) with the
same bound. A sub-marginal of a collected one keeps the TVD bound
(:func:`~.bounds.coarsened`). Also given, as a proxy, for norm-sub, calm and consistent when the
marginal lies inside a collected one (the post-processings do not increase the error in the
measured benchmarks). Maximum-entropy marginals carry none (their error includes model bias the
variances do not bound).
"""
from __future__ import annotations

import hashlib
import itertools
import math
import threading
from typing import Any, Mapping, Sequence

import numpy as np

from ldpstream.estimators.families import partitioned_bounds as pb
from ldpstream.estimators.families import partitioned_numeric as pn
from ldpstream.estimators.families.numeric import summary_of
from ldpstream.estimators.kernels import device_program as dp
from ldpstream.estimators.kernels.bounds import (
    CALIBRATED,
    Bound,
    coarsened,
    oracle_bound,
    reference,
    unbounded,
)
from ldpstream.estimators.kernels.consistency import (
    MaxEntResult,
    expand,
    max_entropy,
    norm_sub,
    postprocess,
    postprocess_stacked,
)
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.global_fit import Noise, choose_fit
from ldpstream.estimators.kernels.proper import clip_rescale, project_simplex, repair
from ldpstream.estimators.mechanism import (
    DriftTerms,
    Estimate,
    Mechanism,
    Memoization,
    ParamError,
    Params,
    TensorSpec,
    record_budget,
    register,
)
from ldpstream.estimators.memo import composed_grr_epsilon, memoize_param
from ldpstream.estimators.oracles import frequency_oracles as fo
from ldpstream.estimators.stream.longitudinal import DAY_S, Guarantee, Memoize, periods_per_window

__all__ = ["Partitioned", "tensor_key", "counted_shape", "numeric_bins", "assign_by_device",
           "choose_ways", "choose_per_report",
           "predicted_pair_error", "auto_candidates", "AUTO_MAX_CELLS", "AUTO_MARGIN", "AUTO_PER_REPORT",
           "AUTO_PER_REPORT_MARGIN"]


def tensor_key(attrs: Sequence[str]) -> str:
    """Count tensor of a collected marginal: ``p:`` + attribute names joined by ``|``."""
    return "p:" + "|".join(attrs)


def counted_shape(domain: Domain, bins: Mapping[str, int] | None = None) -> tuple[int, ...]:
    """The attribute sizes the marginals are counted on, for ``ways: auto``: a numeric
    attribute at its ``bins`` (else :data:`~.partitioned_numeric.PROVISIONAL_BINS`)."""
    return tuple((bins or {}).get(a, pn.PROVISIONAL_BINS) if domain.numeric_range(a) else s
                 for a, s in zip(domain.attrs, domain.shape))


def numeric_bins(domain: Domain, given: Mapping[str, int], eps: float, n: int | None,
                 marginals: Sequence[Sequence[str]] | None, per_report: int = 1,
                 oracles: Sequence[str] = fo.COMPACT) -> dict[str, int]:
    """Every numeric attribute's points: ``given``, else
    :func:`~.partitioned_numeric.choose_bins` for the smallest of ``marginals`` holding it
    (None: every pair; a numeric partner counted at
    :data:`~.partitioned_numeric.PROVISIONAL_BINS`), each marginal expecting n × per_report /
    K reports (n None: :data:`~.partitioned_numeric.DEFAULT_REPORTS`), ε per report ``eps``."""
    numeric = domain.numeric_attrs()
    wrong = [a for a in given if a not in numeric]
    if wrong:
        raise ValueError(f"bins: {wrong[0]!r} is not a numeric attribute (numeric: "
                         f"{', '.join(numeric) or 'none'})")
    if marginals is None:
        marginals = list(itertools.combinations(domain.attrs, min(2, len(domain))))
    n_k = (n or pn.DEFAULT_REPORTS) * per_report / len(marginals)
    out = {}
    for a in numeric:
        G = domain[a]
        if a in given:
            b = int(given[a])
            if not pn.MIN_BINS <= b <= min(pn.MAX_BINS, G):
                raise ValueError(f"bins: {a!r} needs {pn.MIN_BINS}…{min(pn.MAX_BINS, G)} "
                                 f"points (got {b})")
            out[a] = b
            continue
        partner = min(math.prod(pn.PROVISIONAL_BINS if o in numeric else domain[o]
                                for o in m if o != a) for m in marginals if a in m)
        out[a] = min(G, pn.choose_bins(partner, eps / per_report, n_k, oracles))
    return out


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer (vectorized, wrapping uint64 arithmetic)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def assign_by_device(device_ids: np.ndarray, k: int, seed: int,
                     period: int | None = None) -> np.ndarray:
    """Marginal index of each device: splitmix64(device id ⊕ mix(seed)) mod k — fixed per
    device, independent of its values, near-uniform over devices. Memoized collections rotate
    it: splitmix64(that hash ⊕ ``period``) mod k, fixed per (device, rotation period)."""
    s = _mix64(np.asarray([seed], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        h = _mix64(np.asarray(device_ids, dtype=np.uint64) ^ s)
        if period is not None:
            h = _mix64(h ^ np.uint64(int(period) % 2**64))
    return (h % np.uint64(k)).astype(np.int64)


#: ``ways: auto`` keeps a candidate size k only if its K = C(m, k) tables hold at most this
#: many cells in all (the count tensors, and the consistency step, grow with them) ...
AUTO_MAX_CELLS = 100_000
#: ... keeping the smallest unless a larger one predicts a pair error lower by more than this
#: fraction (set on the shapes of the two bench datasets; docs/partitioned.md)
AUTO_MARGIN = 0.2


def auto_candidates(sizes: Sequence[int], epsilon: float, oracles: Sequence[str] = fo.COMPACT,
                    per_report: int = 1, max_cells: int = AUTO_MAX_CELLS) -> list[int]:
    """The sizes ``ways: auto`` may choose: every k from 2 to m (m = the whole record) whose
    tables hold at most ``max_cells`` cells in all, number at most the device SDKs' step limit
    (:data:`~.device_program.MAX_STEPS`) and whose report codes fit in 32 bits."""
    m = len(sizes)
    out = []
    for k in range(2, m + 1):
        if math.comb(m, k) > dp.MAX_STEPS:
            continue
        ds = [math.prod(int(sizes[i]) for i in t) for t in itertools.combinations(range(m), k)]
        if sum(ds) > max_cells:
            continue
        codes = sum(fo.choose(epsilon / per_report, d, oracles).n_codes for d in ds)
        if codes < 2**32:
            out.append(k)
    return out


def predicted_pair_error(sizes: Sequence[int], n: int, epsilon: float, ways: int,
                         oracles: Sequence[str] = fo.COMPACT, per_report: int = 1) -> float:
    """Mean over attribute pairs of the expected TVD of the pair's consistent estimate when
    every ``ways``-way marginal is collected, from the shape only (attribute sizes, ``n``
    reports, ε): each of the K tables gets n·r/K reports through the oracle of smallest
    variance at ε/r ([Wang17] §4.5), its cell variance the oracle noise plus the largest user
    sampling term (1 − 1/d)/(d·n_k) (uniform data); a pair's variance is the inverse-variance
    combination over the tables containing it (CALM §4.3, c cells summed in each), its TVD the
    normal approximation ½·d_S·√(2σ²/π). The noise-error term of CALM §4; it leaves out the
    shrinkage and the reconstruction of marginals from smaller ones."""
    sizes = [int(d) for d in sizes]
    tables = list(itertools.combinations(range(len(sizes)), int(ways)))
    nk = float(n) * per_report / len(tables)
    prec: dict[tuple[int, int], float] = {}
    for t in tables:
        d = math.prod(sizes[i] for i in t)
        var = float(fo.choose(epsilon / per_report, d, oracles).variance(nk)[0]) \
            + (1.0 - 1.0 / d) / (d * nk)
        for pair in itertools.combinations(t, 2):
            c = d / (sizes[pair[0]] * sizes[pair[1]])
            prec[pair] = prec.get(pair, 0.0) + 1.0 / (c * var)
    return float(np.mean([0.5 * sizes[a] * sizes[b] * math.sqrt(2.0 / (math.pi * p))
                          for (a, b), p in prec.items()]))


def choose_ways(sizes: Sequence[int], n: int, epsilon: float,
                oracles: Sequence[str] = fo.COMPACT, per_report: int = 1,
                candidates: Sequence[int] | None = None, margin: float = AUTO_MARGIN) -> int:
    """``ways: auto``: the declared-marginal size from the data's shape only (attribute sizes,
    expected reports ``n``, ε per report), never its values. Candidates: ``candidates``, else
    :func:`auto_candidates` (2 … m, up to the whole record: at large ε the users' sampling
    dominates the oracle's noise, and a report of k attributes gives every pair
    k(k − 1)/(m(m − 1)) of the users). Going up from the smallest, a larger candidate replaces
    the kept one when it predicts (:func:`predicted_pair_error`) a pair error lower by more than
    ``margin`` (below (1 − margin) × the kept one's). The prediction leaves
    out two terms that pull in opposite directions: the maximum-entropy reconstruction of a
    marginal from smaller ones (≥ 0, favours the larger size) and the shrinkage of
    ``consistent`` (pooled over many small pairs, it removes more of the pairs' noise at
    small ε than the prediction sees); measured, the second wins on the bench's data
    (docs/partitioned.md). With fewer than two attributes: m."""
    m = len(sizes)
    if candidates is None:
        candidates = auto_candidates(sizes, epsilon, oracles, per_report)
    ks = sorted({int(k) for k in candidates if 2 <= int(k) <= m})
    if not ks:   # fewer than two attributes: m; else pairs
        return min(m, 2)
    best = ks[0]
    pred = predicted_pair_error(sizes, n, epsilon, best, oracles, per_report)
    for k in ks[1:]:
        p = predicted_pair_error(sizes, n, epsilon, k, oracles, per_report)
        if p < (1.0 - margin) * pred:
            best, pred = k, p
    return best


#: ``ways: auto`` without ``per_report`` also chooses how many marginals each report carries ...
AUTO_PER_REPORT = (1, 2, 3, 4)
#: ... keeping one unless more predict a pair error lower by more than this fraction (set on
#: the bench's networks at ε = 8; docs/partitioned.md "Marginals per report")
AUTO_PER_REPORT_MARGIN = 0.1


def choose_per_report(sizes: Sequence[int], n: int, epsilon: float, ways: int,
                      oracles: Sequence[str] = fo.COMPACT,
                      candidates: Sequence[int] = AUTO_PER_REPORT,
                      margin: float = AUTO_PER_REPORT_MARGIN) -> int:
    """How many of the ``ways``-way marginals each report carries (each with ε/r), from the
    shape only: r marginals give every table r× the users at ε/r each, which pays where the
    sampling of users dominates the oracle noise (small tables, large ε). The r of smallest
    :func:`predicted_pair_error`, if below (1 − ``margin``) × one marginal's, else 1."""
    K = math.comb(len(sizes), int(ways))
    one = predicted_pair_error(sizes, n, epsilon, ways, oracles, 1)
    best, pred = 1, one
    for r in sorted({int(r) for r in candidates if 2 <= int(r) <= K}):
        p = predicted_pair_error(sizes, n, epsilon, ways, oracles, r)
        if p < (1.0 - margin) * one and p < pred:
            best, pred = r, p
    return best


#: ``params.bounds``: the unbiased table's bound as a proxy, or the served estimate's own
BOUNDS = ("proxy", "bootstrap")
#: the estimators ``bounds: bootstrap`` bounds (the others keep the unbiased table's bound)
BOOTSTRAPPED = ("global", "consistent")
#: most bootstrap draws per refresh (each one fit)
MAX_DRAWS = 1000


def derived_marginal(tables: Sequence[Factor], dom: Domain, **options: Any
                     ) -> tuple[MaxEntResult, list[Factor]]:
    """The maximum-entropy table on ``dom`` (a marginal no collected table holds) with the
    collected ``tables``' projections onto it as constraints, the maximal ones only (a subset's
    table is implied by its superset's): (the fit, the constraint tables)."""
    cons = []
    for t in tables:
        sub = tuple(a for a in dom.attrs if a in t.domain.attrs)
        if sub:
            cons.append(t.project(sub))
    keep = [c for c in cons if not any(set(c.domain.attrs) < set(o.domain.attrs)
                                       for o in cons)]
    uniq: dict[frozenset[str], Factor] = {}
    for c in keep:
        uniq.setdefault(frozenset(c.domain.attrs), c)
    return max_entropy(dom, list(uniq.values()), **options), list(uniq.values())


def _derived_cells(tables: Sequence[Factor], dom: Domain) -> np.ndarray:
    """:func:`derived_marginal`'s cells."""
    return np.asarray(derived_marginal(tables, dom)[0].table.values, dtype=float)


@register
class Partitioned(Mechanism):
    """One assigned marginal per report with the full ε; CALM-style estimation."""

    name = "partitioned"
    numeric = True
    estimators = ("consistent", "calm", "norm-sub", "unbiased", "global")
    default_estimators = ("global", "consistent")

    def __init__(self, domain: Domain, epsilon: float, marginals: Sequence[Sequence[str]] | None
                 = None, ways: int | str = 2, oracles: Sequence[str] = fo.COMPACT,
                 assign_seed: int = 0, per_report: int = 1, version: int = 0,
                 expected_reports: int | None = None, memoize: Memoize | None = None,
                 bins: Mapping[str, int] | None = None, bounds: str = "proxy",
                 bootstrap_draws: int = pb.DRAWS) -> None:
        """With ``memoize`` the oracles at ε/per_report are the permanent channels (one memo
        per assigned marginal and value, the assignment rotated per period) and
        ``memoize.instantaneous_epsilon`` (one ε per slot) a fresh GRR over each oracle's
        reported value; the estimators invert the composition (:mod:`~.memo`). A numeric
        attribute of ``domain`` (one with a range) is rounded without bias to ``bins[attr]``
        points of its grid (default :func:`~.partitioned_numeric.choose_bins`), then counted as
        a category (:mod:`~.partitioned_numeric`); memoized, with each device's own α
        (α-point rounding, Ding et al., NeurIPS 2017, §3), so the memo is keyed by the point.
        ``bounds``: ``proxy`` (the unbiased table's bound; 1 for a derived marginal) or
        ``bootstrap`` (``global`` and ``consistent`` get their own, :mod:`~.partitioned_bounds`,
        from ``bootstrap_draws`` fits per refresh)."""
        super().__init__(domain, version)
        eps = float(epsilon)
        if not np.isfinite(eps) or eps <= 0:
            raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
        self.target_epsilon = eps
        bad = [o for o in oracles if o not in fo.COMPACT]
        if bad or not oracles:
            raise ValueError(f"oracles: {bad or list(oracles)} — a partitioned report is one "
                             f"integer; choose from {', '.join(fo.COMPACT)}")
        self.oracle_names = tuple(oracles)
        # ways='auto': the size is chosen here from expected_reports; an integer ways given with
        # expected_reports is a size already chosen from them (from_config resolves it once)
        self.expected_reports = None
        if ways == "auto" or expected_reports is not None:
            if isinstance(expected_reports, bool) or not isinstance(
                    expected_reports, (int, np.integer)) or expected_reports < 1:
                raise ValueError(f"ways='auto' needs expected_reports, an integer >= 1 (got "
                                 f"{expected_reports!r})")
            self.expected_reports = int(expected_reports)
        if ways == "auto":
            r = int(per_report) if isinstance(per_report, (int, np.integer)) else 1
            # the points for pair tables, fixed before the size is chosen with them
            bins = numeric_bins(domain, bins or {}, eps, self.expected_reports, None, r,
                                self.oracle_names)
            ways = choose_ways(counted_shape(domain, bins), self.expected_reports, eps,
                               self.oracle_names, r)
        if marginals is None:
            if not 1 <= int(ways) <= len(domain):
                raise ValueError(f"ways must be in 1..{len(domain)}, got {ways!r}")
            marginals = list(itertools.combinations(domain.attrs, int(ways)))
        self.marginals = self._canonical(marginals)
        self.ways = int(ways)
        self.assign_seed = int(assign_seed)
        self._cols = [domain.axes(m) for m in self.marginals]
        K = len(self.marginals)
        #: per numeric attribute, its points inside the marginals (docs/numeric.md)
        self._given_bins = dict(bins or {})
        self.bins = numeric_bins(domain, bins or {}, eps, self.expected_reports,
                                 self.marginals,
                                 int(per_report) if isinstance(per_report, (int, np.integer))
                                 else 1, self.oracle_names)
        self.binning = pn.Binning.of(domain, self.bins)
        #: the domain the marginals are counted and estimated on (a numeric attribute's
        #: categories are its points; ``domain`` is what devices report: grid indices)
        self.cells = self.binning.cells()
        self._shapes = [tuple(self.cells.shape[c] for c in cols) for cols in self._cols]
        if isinstance(per_report, bool) or not isinstance(per_report, (int, np.integer)) \
                or not 1 <= int(per_report) <= K:
            raise ValueError(f"per_report must be an integer in 1..{K} (the collected "
                             f"marginals), got {per_report!r}")
        self.per_report = int(per_report)
        self.oracles = [fo.choose(eps / self.per_report, int(np.prod(s)), self.oracle_names)
                        for s in self._shapes]
        self.memoize = memoize
        #: the permanent oracles (the same as ``oracles`` unless memoized with an
        #: instantaneous layer: ``oracles`` are then the composed channels reports go through)
        self.permanent_oracles = list(self.oracles)
        self.instantaneous_epsilon: float | None = None
        if memoize is not None and memoize.instantaneous_epsilon is not None:
            inst = memoize.instantaneous_epsilon
            if len(inst) != self.per_report or len(set(inst)) != 1:
                raise ValueError(f"memoize.instantaneous_epsilon: one ε per slot, all equal "
                                 f"({self.per_report} slots), got {list(inst)}")
            self.instantaneous_epsilon = float(inst[0])
            self.oracles = [self._composed(o, self.instantaneous_epsilon) for o in self.oracles]
        sizes = [o.n_codes for o in self.oracles]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._memo: dict[tuple[bytes, bool], tuple[list[Factor], int, int]] = {}
        self._global_memo: dict[bytes, tuple[Factor | None, dict[str, Any]]] = {}
        self._boot_memo: dict[tuple[bytes, str], pb.Draws] = {}
        self._memo_lock = threading.Lock()
        if bounds not in BOUNDS:
            raise ValueError(f"bounds must be one of {', '.join(BOUNDS)}, got {bounds!r}")
        if isinstance(bootstrap_draws, bool) or not isinstance(bootstrap_draws, (int, np.integer)) \
                or not pb.DRAWS <= int(bootstrap_draws) <= MAX_DRAWS:
            raise ValueError(f"bootstrap_draws must be an integer in {pb.DRAWS}..{MAX_DRAWS}, "
                             f"got {bootstrap_draws!r}")
        self.bounds = bounds
        self.bootstrap_draws = int(bootstrap_draws)
        if self.offsets[-1] >= 2**32:
            raise ValueError("partitioned: the marginals' report codes exceed 32 bits; collect "
                             "fewer or smaller marginals")

    @staticmethod
    def _composed(o: fo.Oracle, eps_inst: float) -> fo.Oracle:
        """The oracle a report goes through: ``o`` then GRR(``eps_inst``) over its reported
        value (GRR: the cell; OLH: the hashed value, the seed kept)."""
        if isinstance(o, fo.OLH):
            return fo.OLH(composed_grr_epsilon(o.eps, eps_inst, o.g), o.d, g=o.g)
        return fo.GRR(composed_grr_epsilon(o.eps, eps_inst, o.d), o.d)

    def _canonical(self, marginals: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = []
        for m in marginals:
            m = tuple(str(a) for a in m)
            if not m or len(set(m)) != len(m):
                raise ValueError(f"marginal {m}: needs distinct attributes")
            unknown = [a for a in m if a not in self.domain]
            if unknown:
                raise ValueError(f"marginal {m}: unknown attribute {unknown[0]!r}")
            m = tuple(a for a in self.domain.attrs if a in m)
            if m not in out:
                out.append(m)
        if not out:
            raise ValueError("partitioned: declare at least one marginal")
        return out

    # --- privacy ---------------------------------------------------------------------------------
    @property
    def epsilon(self) -> float:
        """per_report × max_k ε(oracle_k): the indices are independent of the record, and the
        slots are randomized independently (sequential composition; see the module doc)."""
        return self.per_report * max(o.epsilon for o in self.oracles)

    def guarantee(self) -> Guarantee:
        """Memoized: per report the composed oracles' ε; per rotation the permanent oracles'
        (the assignment is fixed for the period, the reports of one value re-randomize one
        memo; a numeric value: of one α-point rounded point), per day that times the periods a
        day meets (:mod:`.longitudinal`)."""
        if self.memoize is None:
            return Guarantee.fresh(self.epsilon)
        per_rotation = self.per_report * max(o.epsilon for o in self.permanent_oracles)
        return Guarantee(self.epsilon, True, self.memoize.rotation_s, per_rotation,
                         per_rotation * periods_per_window(DAY_S, self.memoize.rotation_s))

    def memoization(self) -> Memoization | None:
        """One memo per (assigned marginal, its value): the marginal fixed per device and
        rotation period by :func:`assign_by_device`, the permanent oracle's code memoized."""
        if self.memoize is None:
            return None
        return Memoization(self.memoize, (), self.randomize_instantaneous, unit="marginal",
                           epsilons=tuple(o.epsilon for o in self.permanent_oracles),
                           draw=self.randomize_permanent)

    # --- device ----------------------------------------------------------------------------------
    @property
    def report_width(self) -> int:
        return self.per_report

    def report_bounds(self) -> np.ndarray:
        return np.full(self.per_report, self.offsets[-1], dtype=np.int64)

    def _dtype(self):
        top = int(self.offsets[-1])
        return np.uint8 if top <= 256 else np.uint16 if top <= 65536 else np.uint32

    def randomize(self, records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Every report's first marginal k drawn uniformly by ``rng`` (per report), its slots
        k, k+1, …, k+per_report−1 (mod K), then each slot's oracle (memoized: the permanent
        oracle, then the instantaneous layer; one report per record)."""
        first = rng.integers(0, len(self.marginals), len(records))
        if self.memoize is None:
            return self.randomize_assigned(records, first, rng)
        return self.randomize_instantaneous(
            self.randomize_assigned(records, first, rng, self.permanent_oracles), rng)

    def randomize_permanent(self, records: np.ndarray, device_ids: np.ndarray, period: int,
                            rng: np.random.Generator) -> np.ndarray:
        """The permanent codes of devices ``device_ids`` in rotation ``period``: each device's
        first marginal from (id, period) (:func:`assign_by_device`), then the permanent
        oracles."""
        first = assign_by_device(np.asarray(device_ids), len(self.marginals), self.assign_seed,
                                 period)
        return self.randomize_assigned(records, first, rng, self.permanent_oracles,
                                       alpha_ids=np.asarray(device_ids, dtype=np.uint64))

    def randomize_instantaneous(self, codes: np.ndarray, rng: np.random.Generator
                                ) -> np.ndarray:
        """The instantaneous GRR over the reported value of every code (a copy; the codes
        themselves without an instantaneous layer). Vectorized per marginal."""
        if self.instantaneous_epsilon is None:
            return codes
        flat = np.asarray(codes).reshape(-1).astype(np.int64)
        out = flat.copy()
        k = np.searchsorted(self.offsets, flat, side="right") - 1
        for j, o in enumerate(self.permanent_oracles):
            sel = np.flatnonzero(k == j)
            if not len(sel):
                continue
            local = flat[sel] - self.offsets[j]
            if isinstance(o, fo.OLH):
                seed, y = np.divmod(local, o.g)
                local = seed * o.g + fo.grr_randomize(y, self.instantaneous_epsilon, o.g, rng)
            else:
                local = fo.grr_randomize(local, self.instantaneous_epsilon, o.d, rng)
            out[sel] = self.offsets[j] + local
        return out.reshape(np.shape(codes)).astype(np.asarray(codes).dtype)

    def randomize_device(self, records: np.ndarray, device_ids: np.ndarray,
                         rng: np.random.Generator) -> np.ndarray:
        """As :meth:`randomize` with each report's first marginal fixed by its device id
        (:func:`assign_by_device` with ``assign_seed``): a device always reports the same
        marginals: what a device running :meth:`device_program` reports (the conformance
        tests compare the two; every SDK runs the description)."""
        ids = np.asarray(device_ids)
        if ids.shape != (len(records),):
            raise ValueError(f"device_ids must have shape ({len(records)},), got {ids.shape}")
        return self.randomize_assigned(
            records, assign_by_device(ids, len(self.marginals), self.assign_seed), rng)

    def device_records(self, records: np.ndarray, device_ids: np.ndarray) -> np.ndarray:
        """Memoized: grid indices ``(n, m)`` with each numeric value α-point rounded to its
        points with each device's α — what a device memoizes under (a reading that stays
        between its device's rounding points keeps its memo); unchanged when not memoized."""
        if self.memoize is None:
            return np.array(records, dtype=np.int64)
        return dp.device_rounded(records, self.binning.points, self.domain.attrs, device_ids)

    def device_program(self) -> dict[str, Any]:
        """One ``partition`` step: the device's first marginal from its id, each slot's oracle
        (docs/device-protocol.md). With numeric attributes, a ``round`` step per attribute
        first (its grid index to its point's index, a fresh uniform per report: what
        :meth:`randomize_assigned` does). Memoized: the step with the permanent oracles under
        ``memoize`` (``kind: partition``, the assignment rotated per period), the
        instantaneous keep probability of each table beside it; a numeric attribute is α-point
        rounded first (``memoize.round``: its points and α seed, Ding et al., NeurIPS 2017, §3)
        and its ``round`` step leads the permanent steps (the rounded value is a point: the
        step maps it to the point's index, whatever its uniform)."""
        rounds = [dp.round_step(j, pts) for j, pts in sorted(self.binning.points.items())]
        if self.memoize is None:
            return dp.program(self.name, self.domain, self.per_report,
                              [*rounds, self._partition_step(self.oracles)])
        out = dp.program(self.name, self.domain, self.per_report, [])
        inst = None if self.instantaneous_epsilon is None else [
            float(fo.grr_pq(self.instantaneous_epsilon,
                            o.g if isinstance(o, fo.OLH) else o.d)[0])
            for o in self.permanent_oracles]
        out["memoize"] = {"rotation_s": self.memoize.rotation_s, "kind": "partition",
                          "permanent": [*rounds, self._partition_step(self.permanent_oracles)],
                          "instantaneous_p": inst}
        if rounds:
            out["memoize"]["round"] = [
                dp.round_spec(self.binning.points[j], dp.alpha_seed(a))
                if j in self.binning.points else None for j, a in enumerate(self.domain.attrs)]
        return out

    def _partition_step(self, oracles: Sequence[fo.Oracle]) -> dict[str, Any]:
        tables = []
        for cols, oracle, off in zip(self._cols, oracles, self.offsets):
            t: dict[str, Any] = {"in": [int(c) for c in cols], "offset": int(off),
                                 "oracle": oracle.name, "p": float(oracle.p_star)}
            if isinstance(oracle, fo.OLH):
                t.update(g=int(oracle.g), r=int(oracle.r))
            tables.append(t)
        return {"op": "partition", "seed": str(self.assign_seed % 2**64),
                "out": list(range(self.per_report)), "tables": tables}

    def randomize_assigned(self, records: np.ndarray, first: np.ndarray,
                           rng: np.random.Generator,
                           oracles: Sequence[fo.Oracle] | None = None,
                           alpha_ids: np.ndarray | None = None) -> np.ndarray:
        """Reports of ``records`` whose first marginal indices are ``first`` (drawn
        independently of the records by the caller); each numeric attribute rounded once per
        record to its point's index (:meth:`~.partitioned_numeric.Binning.round`, the
        description's ``round`` steps; with ``alpha_ids``, the devices' ids, α-point rounded
        with each device's fixed α: the memoized description's ``memoize.round``), then slot s
        reports marginal (first + s) mod K through ``oracles`` (default: the report's)."""
        records = np.asarray(records)
        if records.ndim != 2 or records.shape[1] != len(self.domain):
            raise ValueError(f"records must be (n, {len(self.domain)}), got {records.shape}")
        if len(records) and (records.min() < 0
                             or np.any(records.max(axis=0) >= np.asarray(self.domain.shape))):
            raise ValueError("records hold a value outside the domain")
        if self.binning.points:
            records = records.astype(np.intp) if alpha_ids is None else dp.device_rounded(
                records, self.binning.points, self.domain.attrs, alpha_ids)   # a copy
            for c, pts in self.binning.points.items():
                records[:, c] = self.binning.round(c, records[:, c], rng) if alpha_ids is None \
                    else np.searchsorted(pts, records[:, c])   # the point's index
        out = np.empty((len(records), self.per_report), dtype=self._dtype())
        for s in range(self.per_report):
            out[:, s] = self._slot(records, (np.asarray(first) + s) % len(self.marginals), rng,
                                   self.oracles if oracles is None else oracles)
        return out

    def _slot(self, cells: np.ndarray, k: np.ndarray, rng: np.random.Generator,
              oracles: Sequence[fo.Oracle]) -> np.ndarray:
        """One code per record of ``cells`` (records on :attr:`cells`' domain: numeric
        attributes rounded): marginal k's joint value through its oracle."""
        out = np.empty(len(cells), dtype=np.int64)
        for j, (cols, shape, oracle) in enumerate(zip(self._cols, self._shapes, oracles)):
            sel = np.flatnonzero(k == j)
            if not len(sel):
                continue
            x = np.ravel_multi_index(tuple(cells[sel, c].astype(np.intp) for c in cols), shape)
            out[sel] = self.offsets[j] + oracle.randomize(x, rng)
        return out

    # --- server ----------------------------------------------------------------------------------
    def tensors(self, marginals: Sequence[Sequence[str]] = ()) -> list[TensorSpec]:
        """Every collected marginal's support counts (+ its report count); all of them serve
        every marginal through the consistency step."""
        return [TensorSpec(tensor_key(m), ("support",), (int(np.prod(s)) + 1,))
                for m, s in zip(self.marginals, self._shapes)]

    def count(self, reports: np.ndarray, specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
        """Per declared marginal: its oracle's support counts of the codes in its block, then
        how many codes fell in it."""
        codes = np.asarray(reports).reshape(-1).astype(np.int64)   # every slot is one code
        if codes.size and (codes.min() < 0 or codes.max() >= self.offsets[-1]):
            raise ValueError(f"report codes must lie in 0…{int(self.offsets[-1]) - 1}")
        k = np.searchsorted(self.offsets, codes, side="right") - 1
        index = {tensor_key(m): j for j, m in enumerate(self.marginals)}
        out = {}
        for s in specs:
            j = index[s.key]
            local = codes[k == j] - self.offsets[j]
            out[s.key] = np.concatenate([self.oracles[j].supports(local),
                                         [len(local)]]).astype(np.int64)
        return out

    def collected_for(self, attrs: Sequence[str]) -> int | None:
        """Index of the smallest collected marginal containing ``attrs`` (None if none)."""
        best = None
        for j, m in enumerate(self.marginals):
            if set(attrs) <= set(m) and (best is None
                                         or len(self.marginals[best]) > len(m)):
                best = j
        return best

    def check_marginal(self, attrs: Sequence[str], method: str) -> str | None:
        """Why ``method`` cannot serve ``attrs`` (None: it can)."""
        reason = super().check_marginal(attrs, method)
        if reason is not None:
            return reason
        if method in ("unbiased", "norm-sub") and self.collected_for(attrs) is None:
            return (f"{method} serves only marginals inside a collected one (this collection "
                    f"collects {len(self.marginals)} of up to "
                    f"{max(len(m) for m in self.marginals)} attributes, params.marginals / "
                    f"params.ways); use consistent or calm")
        if not any(set(attrs) & set(m) for m in self.marginals):
            return "no collected marginal shares an attribute with it"
        return None

    def _raw(self, counts: Mapping[str, np.ndarray], j: int) -> tuple[np.ndarray, int]:
        """(flat unbiased estimate, reports) of collected marginal j from its support counts."""
        t = np.asarray(counts[tensor_key(self.marginals[j])], dtype=np.int64)
        n = int(t[-1])
        if n <= 0:
            raise ValueError(f"no reports counted for the collected marginal "
                             f"{self.marginals[j]}")
        return self.oracles[j].estimate(t[:-1], n), n

    def unbiased(self, counts: Mapping[str, np.ndarray], j: int
                 ) -> tuple[Factor, float, int]:
        """(unbiased table, variance of one cell, reports) of collected marginal j. The cell
        variance is [Wang17] eq. 4 under the estimated distribution f̂
        (clipped and rescaled) plus the sampling of which users report j, averaged over cells:
        the oracle's f-free term q*(1−q*)/(n_j(p*−q*)²), its f term
        (p*(1−p*) − q*(1−q*))/(d_j·n_j(p*−q*)²) (Σf̂ = 1) and (1 − Σf̂²)/(d_j·n_j). The f term
        matters for large tables at large ε (an Adult triple of 2,160 cells, 581 reports, ε = 8:
        about a quarter of the total; leaving it out under-states the noise the shrinkage
        removes)."""
        o = self.oracles[j]
        est, n = self._raw(counts, j)
        f = clip_rescale(est)
        var = float(np.mean(o.variance(n, f, fixed_data=False)))
        return (Factor(self.cells.project(self.marginals[j]), est.reshape(self._shapes[j])),
                var, n)

    def _digest(self, counts: Mapping[str, np.ndarray]) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        for m in self.marginals:
            h.update(np.ascontiguousarray(counts[tensor_key(m)], dtype=np.int64).tobytes())
        return h.digest()

    def global_table(self, counts: Mapping[str, np.ndarray], memo: bool = True
                     ) -> tuple[Factor | None, dict[str, Any]]:
        """The ``global`` estimator's choice (docs/partitioned.md "Global fit";
        :func:`~.global_fit.choose_fit` on the unbiased tables, their per-cell variances, the
        consistent tables and, for the fit to the measurements, one variance per table):
        (the whole domain's table, or None for the consistent tables;
        what was chosen and why). Memoized on the counts' content unless ``memo`` is False
        (a bootstrap draw's counts: fitted once, kept by the bootstrap)."""
        key = self._digest(counts)
        with self._memo_lock:
            hit = self._global_memo.get(key) if memo else None
        if hit is not None:
            return hit
        raw = [self.unbiased(counts, j) for j in range(len(self.marginals))]
        ys, var = [r[0] for r in raw], [r[1] for r in raw]
        noise = [self.noise(counts, j) for j in range(len(self.marginals))]

        with self._memo_lock:
            cons = self._memo.get((key, True)) if memo else None
        first: list[tuple[list[Factor], int]] = []

        def consistent(runs: list[list[Factor]]) -> list[list[np.ndarray]]:
            # every probe's consistent tables in one stacked pass (each as if alone), with the
            # measurements' own as the first set when they are not memoized yet
            vals, passes = postprocess_stacked([t.domain for t in ys],
                                               [np.stack([r[k].values for r in runs])
                                                for k in range(len(ys))], var,
                                               noise_variance=var)
            if cons is None:
                first.append(([Factor(t.domain, v[0]) for t, v in zip(ys, vals)], passes[0]))
            return [[v[i] for v in vals] for i in range(len(runs))]

        table, info = choose_fit(self.cells, ys, [nz.var for nz in noise],
                                 None if cons is None else [t.values for t in cons[0]],
                                 consistent, noise, direct=var)
        out = (None if table is None else Factor(self.cells, table), info)
        if not memo:
            return out
        if first:
            self._remember((key, True), (first[0][0], first[0][1], sum(r[2] for r in raw)))
        with self._memo_lock:
            while len(self._global_memo) >= 8:
                self._global_memo.pop(next(iter(self._global_memo)))
            self._global_memo[key] = out
        return out

    def _reports(self, counts: Mapping[str, np.ndarray]) -> int:
        return int(sum(int(counts[tensor_key(m)][-1]) for m in self.marginals))

    def _global(self, counts: Mapping[str, np.ndarray], extra: dict[str, Any]
                ) -> Factor | None:
        """:meth:`global_table`'s table (None: the consistent tables), its account in
        ``extra["global_fit"]``."""
        table, info = self.global_table(counts)
        extra["global_fit"] = info
        extra["chosen"] = info["chosen"]   # the API's ``chosen`` field
        return table

    def cell_variance(self, counts: Mapping[str, np.ndarray], j: int) -> np.ndarray:
        """Variance of every cell of collected marginal j's unbiased table ([Wang17] eq. 4 plus
        the sampling of users) under the estimate with half a report added to every cell
        (:func:`~.bounds.reference`: a cell estimated at 0 keeps a sampling variance)."""
        est, n = self._raw(counts, j)
        var = self.oracles[j].variance(n, reference(est, n), fixed_data=False)
        return np.asarray(var).reshape(self._shapes[j])

    def noise(self, counts: Mapping[str, np.ndarray], j: int) -> Noise:
        """The noise of marginal j's unbiased table for the ``global`` estimator's risk
        estimates: a GRR table is its report counts' multinomial (π = the reports' frequencies,
        half a report added to every value), correlated across cells (:class:`~.global_fit.Noise`);
        an OLH table, independent cells of :meth:`cell_variance`."""
        o = self.oracles[j]
        if not isinstance(o, fo.GRR):
            return Noise(self.cell_variance(counts, j))
        t = np.asarray(counts[tensor_key(self.marginals[j])], dtype=float)
        n = float(t[-1])
        pi = (t[:-1] + 0.5) / (n + 0.5 * o.d)
        return Noise(self.cell_variance(counts, j), pi.reshape(self._shapes[j]),
                     1.0 / (math.sqrt(n) * (o.p_star - o.q_star)))

    def consistent_tables(self, counts: Mapping[str, np.ndarray], shrink: bool = True,
                          memo: bool = True) -> tuple[list[Factor], int, int]:
        """Every collected marginal after :func:`~.consistency.postprocess` (with the shrinkage
        toward independence when ``shrink``): (tables, Norm-Sub passes, reports). Memoized on
        the counts' content (the refresher asks once per served marginal and estimator)
        unless ``memo`` is False."""
        key = (self._digest(counts), shrink)
        with self._memo_lock:
            hit = self._memo.get(key) if memo else None
        if hit is not None:
            return hit
        raw = [self.unbiased(counts, j) for j in range(len(self.marginals))]
        # the shrinkage's σ² is the whole cell variance, oracle noise plus the sampling of
        # which users report the marginal: the target is the population's marginal, and the
        # n_j users' own table deviates from it by that sampling term (dominant at large ε)
        tables, passes = postprocess([r[0] for r in raw], [r[1] for r in raw],
                                     noise_variance=[r[1] for r in raw] if shrink else None)
        out = (tables, passes, sum(r[2] for r in raw))
        if memo:
            self._remember(key, out)
        return out

    def _remember(self, key: tuple[bytes, bool], out: tuple[list[Factor], int, int]) -> None:
        """Memoize :meth:`consistent_tables`'s answer (the refresher estimates in worker
        threads: under the lock; the 8 most recent counts kept)."""
        with self._memo_lock:
            while len(self._memo) >= 8:
                self._memo.pop(next(iter(self._memo)))
            self._memo[key] = out

    def _fit(self, counts: Mapping[str, np.ndarray], method: str) -> pb.Fit:
        """``method``'s estimate of the whole collection from ``counts`` (not memoized)."""
        whole = self.global_table(counts, memo=False)[0] if method == "global" else None
        tables = [] if whole is not None else self.consistent_tables(counts, True, memo=False)[0]
        return pb.Fit(whole, tables)

    def _served(self, fit: pb.Fit, attrs: tuple[str, ...]) -> np.ndarray:
        """``fit``'s estimate of the marginal ``attrs``, as :meth:`estimate` serves it."""
        if fit.whole is not None:
            return np.asarray(fit.whole.project(attrs).values, dtype=float)
        j = self.collected_for(attrs)
        if j is not None:
            return np.asarray(fit.tables[j].project(attrs).values, dtype=float)
        return _derived_cells(fit.tables, self.cells.project(attrs))

    def bootstrap_draws_of(self, counts: Mapping[str, np.ndarray], method: str) -> pb.Draws:
        """The bootstrap of ``method`` on ``counts`` (:func:`~.partitioned_bounds.bootstrap`):
        memoized on the counts' content, the latest two."""
        key = (self._digest(counts), method)
        with self._memo_lock:
            hit = self._boot_memo.get(key)
        if hit is not None:
            return hit
        raws = [self.unbiased(counts, j)[0] for j in range(len(self.marginals))]
        whole = self.global_table(counts)[0] if method == "global" else None   # memoized
        here = pb.Fit(whole, [] if whole is not None else self.consistent_tables(counts, True)[0])
        served = [Factor(r.domain, self._served(here, self.marginals[j]).reshape(r.values.shape))
                  for j, r in enumerate(raws)]
        seed = np.concatenate([np.asarray(counts[tensor_key(m)], dtype=float)
                               for m in self.marginals])
        out = pb.bootstrap(self.cells, [tensor_key(m) for m in self.marginals], self.oracles,
                           raws,
                           [int(counts[tensor_key(m)][-1]) for m in self.marginals], served,
                           [self.cell_variance(counts, j) for j in range(len(self.marginals))],
                           lambda c: self._fit(c, method), seed, self.bootstrap_draws)
        with self._memo_lock:
            while len(self._boot_memo) >= 2:
                self._boot_memo.pop(next(iter(self._boot_memo)))
            self._boot_memo[key] = out
        return out

    def served_bound(self, counts: Mapping[str, np.ndarray], attrs: Sequence[str], method: str,
                     served: np.ndarray) -> Bound:
        """The bootstrap bound (:mod:`~.partitioned_bounds`) of ``method``'s ``served`` cells of
        ``attrs``: calibrated for a marginal inside a collected one, noise only for a derived
        one."""
        attrs = tuple(attrs)
        draws = self.bootstrap_draws_of(counts, method)
        j = self.collected_for(attrs)
        dom = self.cells.project(attrs)
        if j is not None:
            ref = np.asarray(draws.refs[j].project(attrs).values, dtype=float)
        elif draws.whole is not None:
            ref = np.asarray(draws.whole.project(attrs).values, dtype=float)
        else:
            ref = _derived_cells(draws.refs, dom)
        est = np.stack([self._served(f, attrs) for f in draws.fits])
        return pb.bound(np.asarray(served, dtype=float).reshape(dom.shape), ref, est,
                        f"bootstrap of the served estimator: {self.bootstrap_draws} fits to "
                        f"tables drawn from the de-shrunk reference",
                        pb.NOISE_ONLY if j is None else CALIBRATED)

    def estimate(self, counts: Mapping[str, np.ndarray], attrs: Sequence[str],
                 method: str = "consistent", **options: Any) -> Estimate:
        """Options: ``proper`` ('clip' | 'simplex'); ``tol`` / ``max_iter`` (maximum entropy)."""
        attrs = tuple(attrs)
        reason = self.check_marginal(attrs, method)
        if reason is not None:
            raise ValueError(f"{self.name}: cannot estimate {attrs} with {method}: {reason}")
        dom = self.cells.project(attrs)
        j = self.collected_for(attrs)
        extra: dict[str, Any] = {}
        # the served estimate's own bound (computed once its cells are), else the proxy's
        boot = self.bounds == "bootstrap" and method in BOOTSTRAPPED
        if j is not None:
            raw, n = self._raw(counts, j)
            f = Factor(self.cells.project(self.marginals[j]), raw.reshape(self._shapes[j]))
            sub_raw = f.project(attrs).values
            if not boot:
                cb = oracle_bound(self.oracles[j], raw, n)
                if f.values.size != dom.size():   # a sub-marginal: the TVD bound carries over
                    cb = coarsened(cb, project_simplex(sub_raw))
                else:
                    cb = Bound(cb.tvd, cb.low.reshape(dom.shape), cb.high.reshape(dom.shape),
                               cb.level, cb.coverage, cb.method)
                if method != "unbiased":
                    extra["error_bound_of"] = "unbiased (proxy)"
            extra["collected_from"] = "|".join(self.marginals[j])
            extra["oracle"] = self.oracles[j].name
            if method == "unbiased":
                vals = sub_raw
            elif method == "norm-sub":
                vals = norm_sub(f).project(attrs).values
            elif method == "global" and (whole := self._global(counts, extra)) is not None:
                vals = np.array(whole.project(attrs).values)   # not a view of the memo
                n = self._reports(counts)
            else:
                tables, passes, n = self.consistent_tables(counts, method != "calm")
                vals = np.array(tables[j].project(attrs).values)   # not a view of the memo
                extra["norm_sub_passes"] = passes
            projected = (Factor(dom, project_simplex(vals))
                         if method == "unbiased" and not options.get("proper") else None)
            extra.update(self._numeric_extra(counts, j, attrs,
                                             vals if projected is None else projected.values))
            if boot:
                cb = self.served_bound(counts, attrs, method, vals)
            return Estimate(Factor(dom, repair(vals, options.get("proper"))), method, n,
                            self.epsilon, error_bound=cb.tvd, extra=extra, bound=cb,
                            projected=projected)
        whole = self._global(counts, extra) if method == "global" else None
        # a marginal no collected table holds: no unbiased estimate to bound it by, so the bound
        # is the one that always holds (bounds.unbounded: ≤ 1 for a distribution)
        if whole is not None:
            vals = repair(np.array(whole.project(attrs).values), options.get("proper"))
            ub = self.served_bound(counts, attrs, method, vals) if boot else unbounded(vals)
            return Estimate(Factor(dom, vals), method, self._reports(counts), self.epsilon,
                            error_bound=ub.tvd, bound=ub,
                            iterations=extra["global_fit"]["iterations"], extra=extra)
        tables, passes, n = self.consistent_tables(counts, method != "calm")
        kw = {k: options[k] for k in ("tol", "max_iter") if k in options}
        r, fitted = derived_marginal(tables, dom, **kw)
        extra.update(norm_sub_passes=passes, fitted_from=["|".join(c.domain.attrs)
                                                          for c in fitted],
                     gap=r.gap)
        if any(a in self.bins for a in attrs):
            extra["numeric_note"] = ("no numeric summaries: this marginal is inside no "
                                     "collected one; these are its cells on the points")
        vals = repair(r.table.values, options.get("proper"))
        ub = self.served_bound(counts, attrs, method, vals) if boot else unbounded(vals)
        return Estimate(Factor(dom, vals), method, n, self.epsilon, error_bound=ub.tvd, bound=ub,
                        iterations=r.iterations, converged=r.converged, extra=extra)

    def _numeric_extra(self, counts: Mapping[str, np.ndarray], j: int, attrs: tuple[str, ...],
                       served: np.ndarray) -> dict[str, Any]:
        """sw-hm's numeric fields of a marginal with a numeric attribute inside collected
        marginal j: for one numeric attribute, or one numeric and one categorical
        (:func:`~.partitioned_numeric.numeric_summary`); a note otherwise, none without one."""
        num = [a for a in attrs if a in self.bins]
        if not num:
            return {}
        if len(attrs) > 2 or len(num) > 1:
            return {"numeric_note": "numeric summaries are served for a numeric attribute "
                                    "alone or by one categorical attribute; these are its "
                                    "cells on its points"}
        a = num[0]
        lo, hi, pos = self._numeric_scale(a)
        return pn.numeric_summary(self._numeric_tables(counts, attrs, j), served, attrs, a, lo,
                                  hi, pos, self.oracles[j].name)

    def _numeric_tables(self, counts: Mapping[str, np.ndarray], attrs: tuple[str, ...],
                        j: int) -> list[pn.Table]:
        """The unbiased tables the numeric summaries of ``attrs`` come from: collected marginal
        j and, with one marginal per report (the tables are then independent), every other
        collected table holding ``attrs``."""
        holding = [j] + ([k for k, m in enumerate(self.marginals)
                          if k != j and set(attrs) <= set(m)] if self.per_report == 1 else [])
        tables = []
        for k in holding:
            t = np.asarray(counts[tensor_key(self.marginals[k])], dtype=np.int64)
            raw, n = self._raw(counts, k)
            tables.append(pn.Table(self.cells.project(self.marginals[k]), raw,
                                   pn.cell_cov(self.oracles[k], t[:-1], n, raw), n))
        return tables

    def _numeric_scale(self, a: str) -> tuple[float, float, np.ndarray]:
        """(min, max, the points' positions in [0, 1]) of numeric attribute ``a``."""
        jx = self.domain.axes((a,))[0]
        lo, hi = self.domain.ranges[jx]  # type: ignore[index]  # numeric: has a range
        return lo, hi, self.binning.points[jx] / (self.domain.shape[jx] - 1)

    def drift_terms(self, cur: Mapping[str, np.ndarray], prev: Mapping[str, np.ndarray],
                    attrs: Sequence[str], method: str) -> DriftTerms | None:
        """A numeric attribute alone or by one categorical attribute, inside a collected
        marginal: the mean and the share below each pooled quantile (median, p90, p99), per
        category, from the unbiased tables of the summaries whatever ``method`` serves
        (:func:`~.partitioned_numeric.drift_terms`, docs/windows.md "Numeric attributes");
        their variances from both windows' counts summed. Any other marginal: None (the cells
        are tested)."""
        attrs = tuple(attrs)
        why = self.check_marginal(attrs, method)
        if why:
            raise ValueError(why)
        num = [a for a in attrs if a in self.bins]
        j = self.collected_for(attrs)
        if j is None or len(num) != 1 or len(attrs) > 2:
            return None
        pooled = {k: np.asarray(cur[k], dtype=np.int64) + np.asarray(prev[k], dtype=np.int64)
                  for k in (tensor_key(m) for m in self.marginals)}
        tables = [self._numeric_tables(c, attrs, j) for c in (cur, prev, pooled)]
        lo, hi, pos = self._numeric_scale(num[0])
        return pn.drift_terms(*tables, attrs, num[0], lo, hi, pos)

    def planned_for(self, n: int) -> "Partitioned":
        """With a numeric attribute whose points are chosen and no ``expected_reports`` stated:
        the same collection with its points chosen for n reports (``simulate``); else
        unchanged."""
        if self.expected_reports is not None or set(self.bins) <= set(self._given_bins):
            return self
        return Partitioned(self.domain, self.target_epsilon, marginals=self.marginals,
                           oracles=self.oracle_names, assign_seed=self.assign_seed,
                           per_report=self.per_report, version=self.version,
                           expected_reports=int(n), memoize=self.memoize,
                           bins=self._given_bins)

    def cell_domain(self) -> Domain:
        """:attr:`cells`: a numeric attribute's categories are its points."""
        return self.cells

    def summary_fields(self, est: Estimate) -> dict[str, Any]:
        """``numeric`` for a marginal with a numeric attribute (docs/numeric.md "In
        partitioned marginals"; the same fields as sw-hm's)."""
        return summary_of(est)

    def analytic_variance(self, counts: Mapping[str, np.ndarray], attrs: Sequence[str],
                          method: str) -> np.ndarray:
        """Per-cell variance for the drift test. Inside a collected marginal j: the unbiased
        estimate's, [Wang17] eq. 4 with f̂ plus the sampling of users (f(1−f)/n_j), summed over
        the cells a projection adds (covariances ignored) — for ``norm-sub``/``calm``/
        ``consistent`` an upper figure (their measured errors are lower). A maximum-entropy
        marginal: through the fitted table p, for every collected sub-marginal S it was fitted
        from, Var ≈ Var(p_S)·(p/p_S)² (the delta method with p(rest | S) held fixed), the largest
        over S (for ``global``, through the ``consistent`` table)."""
        attrs = tuple(attrs)
        j = self.collected_for(attrs)
        if j is not None:
            o = self.oracles[j]
            est, n = self._raw(counts, j)
            f = clip_rescale(est)
            var = o.variance(n, f, fixed_data=False).reshape(self._shapes[j])
            return Factor(self.cells.project(self.marginals[j]), var).project(attrs).values
        # the global fit's table: through the consistent one (an approximation)
        dom = self.cells.project(attrs)
        fit, fitted = derived_marginal(self.consistent_tables(counts, method != "calm")[0], dom)
        p = np.maximum(np.asarray(fit.table.values, dtype=float), 0.0)
        out = np.zeros(p.shape)
        for c in fitted:
            sub = tuple(a for a in attrs if a in c.domain.attrs)
            p_s = expand(Factor(dom, p).project(sub).values, sub, attrs)
            v_s = expand(self.analytic_variance(counts, sub, method), sub, attrs)
            ratio = np.divide(p, p_s, out=np.zeros(p.shape), where=p_s > 0)
            out = np.maximum(out, v_s * ratio ** 2)
        return out

    # --- state -----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"mechanism": self.name, "version": self.version,
                "domain": self.domain.to_compact_dict(), "epsilon": self.target_epsilon,
                "marginals": [list(m) for m in self.marginals],
                "oracles": list(self.oracle_names), "assign_seed": self.assign_seed,
                "per_report": self.per_report,
                **({"ways_auto": {"expected_reports": self.expected_reports, "ways": self.ways,
                                  "per_report": self.per_report}}
                   if self.expected_reports is not None else {}),
                "chosen": [{"oracle": o.name, "g": o.g if isinstance(o, fo.OLH) else None}
                           for o in self.oracles],
                **({"memoize": self.memoize.to_dict()} if self.memoize is not None else {}),
                **({"bins": dict(self.bins)} if self.bins else {}),
                **({"bounds": self.bounds, "bootstrap_draws": self.bootstrap_draws}
                   if self.bounds != "proxy" else {})}

    @classmethod
    def from_config(cls, domain: Domain, params: Mapping[str, Any] | None, *, epsilon: float,
                    epsilon_scope: str = "attribute", version: int = 0) -> "Partitioned":
        """ε per report = :func:`~.mechanism.record_budget` (the whole record's budget goes to
        the one marginal reported). ``params``: ``marginals`` (list of attribute lists) or
        ``ways`` (every k-way marginal; default 2; ``auto``: :func:`choose_ways` from
        ``expected_reports``, required then, and ``per_report`` by :func:`choose_per_report`
        unless given), ``oracles`` (subset of grr, olh), ``assign_seed``, ``per_report``;
        with a numeric attribute, ``bins`` ({attribute: points}, each default
        :func:`~.partitioned_numeric.choose_bins` from ε and ``expected_reports``); ``bounds``
        (``proxy``, the default, or ``bootstrap``) and ``bootstrap_draws`` (20..1000, default
        20)."""
        pr = Params(cls.name, params)
        marginals = pr.value("marginals")
        auto = pr.value("ways") == "auto"
        ways = "auto" if auto else pr.integer("ways", 2, ge=1, le=len(domain))
        expected = pr.integer("expected_reports", None, ge=1)
        if auto and expected is None:
            raise ParamError("expected_reports", "ways: auto needs the number of reports the "
                                                 "collection expects (an integer >= 1): the "
                                                 "marginal size is chosen from it")
        numeric = domain.numeric_attrs()
        if expected is not None and not auto and not numeric:
            raise ParamError("expected_reports", "is read only with ways: auto or a numeric "
                                                 "attribute")
        bins = _bins_param(pr.value("bins"), domain)
        if marginals is not None and pr.has("ways"):
            raise ParamError("ways", "give marginals or ways, not both")
        if marginals is not None:
            if (not isinstance(marginals, list) or not marginals
                    or not all(isinstance(m, list) and m and all(isinstance(a, str) for a in m)
                               for m in marginals)):
                raise ParamError("marginals", f"must be a non-empty list of attribute lists "
                                              f"(got {marginals!r})")
            for m in marginals:
                unknown = [a for a in m if a not in domain]
                if unknown:
                    raise ParamError("marginals", f"unknown attribute {unknown[0]!r} in {m} "
                                                  f"(attributes: {', '.join(domain.attrs)})")
                if len(set(m)) != len(m):
                    raise ParamError("marginals", f"lists an attribute twice in {m}")
        raw_memo = pr.value("memoize")
        bounds = pr.choice("bounds", "proxy", BOUNDS)
        if pr.has("bootstrap_draws") and bounds != "bootstrap":
            raise ParamError("bootstrap_draws", "is read only with bounds: bootstrap")
        draws = pr.integer("bootstrap_draws", pb.DRAWS, ge=pb.DRAWS, le=MAX_DRAWS)
        oracles = pr.value("oracles")
        if oracles is None:
            oracles = list(fo.COMPACT)
        if (not isinstance(oracles, list) or not oracles
                or any(o not in fo.COMPACT for o in oracles)):
            raise ParamError("oracles", f"must be a non-empty list of {', '.join(fo.COMPACT)} "
                                        f"(got {oracles!r})")
        seed = pr.integer("assign_seed", 0, ge=0, le=2**63 - 1)
        eps = record_budget(epsilon, epsilon_scope, len(domain))
        given = pr.has("per_report")
        per_report = pr.integer("per_report", 1, ge=1)
        if auto:
            # the points for pair tables, fixed before the size is chosen with them
            bins = numeric_bins(domain, bins, eps, expected, None, per_report, oracles)
            shape = counted_shape(domain, bins)
            ways = choose_ways(shape, expected, eps, oracles, per_report)
            if not given and marginals is None:
                per_report = choose_per_report(shape, expected, eps, ways, oracles)
        K = (len({frozenset(m) for m in marginals}) if marginals is not None
             else math.comb(len(domain), ways))
        if per_report > K:
            raise ParamError("per_report", f"must be an integer <= {K} (got {per_report})")
        pr.done()
        # the instantaneous ε is a record budget like ε, split over the slots
        memoize = None if raw_memo is None else memoize_param(raw_memo, lambda e: (
            record_budget(e, epsilon_scope, len(domain)) / per_report,) * per_report)
        try:
            return cls(domain, eps, marginals=marginals, ways=ways, oracles=tuple(oracles),
                       assign_seed=seed, per_report=per_report, version=version,
                       expected_reports=expected, memoize=memoize, bins=bins,
                       bounds=str(bounds), bootstrap_draws=int(draws))
        except ValueError as exc:
            if str(exc).startswith("bins: "):
                raise ParamError("bins", str(exc)[len("bins: "):]) from None
            raise

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "Partitioned":
        return cls(Domain.from_dict(state["domain"]), float(state["epsilon"]),
                   marginals=state["marginals"], oracles=tuple(state.get("oracles", fo.COMPACT)),
                   assign_seed=int(state.get("assign_seed", 0)),
                   per_report=int(state.get("per_report", 1)),
                   version=int(state.get("version", 0)),
                   memoize=None if state.get("memoize") is None
                   else Memoize.from_dict(state["memoize"]),
                   bins={str(a): int(b) for a, b in state.get("bins", {}).items()},
                   bounds=str(state.get("bounds", "proxy")),
                   bootstrap_draws=int(state.get("bootstrap_draws", pb.DRAWS)))


def _bins_param(raw: Any, domain: Domain) -> dict[str, int]:
    """``params.bins``: {numeric attribute: points, an integer in 2…64 (at most its grid)}."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ParamError("bins", f"must be {{numeric attribute: points}} (got {raw!r})")
    numeric = domain.numeric_attrs()
    out = {}
    for a, b in raw.items():
        if a not in numeric:
            raise ParamError(f"bins.{a}", f"not a numeric attribute (numeric: "
                                          f"{', '.join(numeric) or 'none'})")
        top = min(pn.MAX_BINS, domain[a])
        if isinstance(b, bool) or not isinstance(b, int) or not pn.MIN_BINS <= b <= top:
            raise ParamError(f"bins.{a}", f"must be an integer in {pn.MIN_BINS}…{top} "
                                          f"(got {b!r})")
        out[str(a)] = int(b)
    return out
