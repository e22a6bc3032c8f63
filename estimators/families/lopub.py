"""LoPub as a :class:`~ldpstream.estimators.mechanism.Mechanism` [LoPub; docs/mechanisms.md §6].

A report is the concatenation of every attribute's flipped Bloom filter: ``report_width = Σ m_j``
values in {0, 1} (:mod:`~ldpstream.estimators.families.lopub_bloom`). The server keeps count tensors:

* ``n`` — reports counted (shape ``(1,)``);
* ``b:<a>`` — per-bit counts of attribute a (``(m_a,)``; Lasso JD and 1-way estimates);
* ``c:<a>|<b>`` — bit co-occurrence counts of a pair (``(m_a, m_b)``; the co-occurrence estimator),
  and of a w-way marginal when its ``Π m_j`` cells fit ``max_cooccurrence_cells``.

:meth:`LoPub.estimate` runs the count-based estimators (``lasso``, ``cooccurrence``); ``em`` and
``lasso-em`` need per-report likelihoods and take the reports (``reports=``, or
:meth:`LoPub.estimate_reports`), reduced to their table of distinct match vectors.

``error_bound``: the unbiased co-occurrence estimate's calibrated bootstrap bound
(:mod:`~ldpstream.estimators.families.lopub_bounds`); lasso, EM and lasso-EM serve it plus their
TVD to the co-occurrence estimate (:func:`~ldpstream.estimators.kernels.bounds.triangle`).

``epsilon`` is computed from the actual filters (Σ_j ln((2−f)/f)·max Hamming distance between two
values' filters; see :mod:`~ldpstream.estimators.families.lopub_bloom`); ``epsilon_eq8`` is the paper's eq. 8
(2h·ln((2−f)/f) per attribute, summed), an upper bound that is reached only when the filters of
two values of every attribute are disjoint. ``epsilon_exact`` is an alias of ``epsilon``.

>>> from ldpstream.estimators.kernels.domain import Domain
>>> mech = LoPub(Domain(("a", "b"), (3, 2)), f=0.5, bits=16, hashes=2, seed=1)
>>> mech.report_width, round(mech.epsilon_eq8, 4), mech.epsilon <= mech.epsilon_eq8
(32, 8.7889, True)
>>> LoPub.from_state(mech.state()).state() == mech.state()
True
>>> [s.key for s in mech.tensors([("a", "b")])]
['n', 'b:a', 'b:b', 'c:a|b']
"""
from __future__ import annotations

from itertools import combinations
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from ldpstream.estimators.families import lopub_bloom as bloom
from ldpstream.estimators.families.lopub_bounds import cooccurrence_bound
from ldpstream.estimators.families.lopub_cooccurrence import (
    cooccurrence_counts,
    cooccurrence_from_bits,
    solve_cooccurrence,
)
from ldpstream.estimators.families.lopub_em import distinct_reports, em_jd
from ldpstream.estimators.families.lopub_lasso import lasso_jd
from ldpstream.estimators.kernels import device_program as dp
from ldpstream.estimators.kernels.bounds import Bound, triangle, unbounded
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.proper import clip_rescale, project_simplex
from ldpstream.estimators.mechanism import Estimate, Mechanism, ParamError, Params, TensorSpec, record_budget, register

__all__ = ["LoPub", "STATE_FORMAT", "DEFAULT_P_FP"]

#: format of :meth:`LoPub.state` (bump on an incompatible change)
STATE_FORMAT = 1
#: Bloom false-positive rate behind the default m_j and h (eqs. 6–7)
DEFAULT_P_FP = 0.01

#: ``proper=`` option: a name, or a bool (True: the simplex projection, as ``simulate --proper``)
_REPAIRS = {None: None, False: None, "none": None, "clip": clip_rescale,
            "project": project_simplex, True: project_simplex}


def _ints(value: int | Sequence[int] | None, k: int, name: str) -> list[int] | None:
    if value is None:
        return None
    vals = [int(value)] * k if np.ndim(value) == 0 else [int(v) for v in value]  # type: ignore[union-attr]  # ndim > 0: a sequence
    if len(vals) != k or any(v < 1 for v in vals):
        raise ValueError(f"{name}: need {k} positive integers, got {value!r}")
    return vals


@register
class LoPub(Mechanism):
    """Bloom filters + bit flipping per attribute [LoPub §V-B], estimated with EM JD, Lasso JD,
    Lasso+EM or the bit co-occurrence estimator."""

    name: ClassVar[str] = "lopub"
    estimators: ClassVar[tuple[str, ...]] = ("em", "lasso", "lasso-em", "cooccurrence")
    #: the estimators :meth:`estimate` runs from count tensors alone (the others need reports)
    count_estimators: ClassVar[tuple[str, ...]] = ("lasso", "cooccurrence")
    default_estimators: ClassVar[tuple[str, ...]] = estimators

    def __init__(self, domain: Domain, f: float = 0.5, *, bits: int | Sequence[int] | None = None,
                 hashes: int | None = None, p_fp: float = DEFAULT_P_FP, seed: int = 0,
                 hash_seeds: Sequence[int] | None = None, version: int = 0,
                 max_cooccurrence_cells: int = 1 << 16) -> None:
        super().__init__(domain, version)
        self.f = bloom._check_f(f)
        self.p_fp = float(p_fp)
        k = len(domain)
        self.hashes = int(hashes) if hashes is not None else bloom.bloom_hashes(self.p_fp)
        if self.hashes < 1:
            raise ValueError(f"hashes: must be ≥ 1, got {hashes!r}")
        self.bits = _ints(bits, k, "bits") or [bloom.bloom_size(d, self.p_fp) for d in domain.shape]
        self.seed = int(seed)
        if hash_seeds is None:
            self.hash_seeds = [bloom.choose_seed(d, m, self.hashes, self.seed, j)
                               for j, (d, m) in enumerate(zip(domain.shape, self.bits))]
        else:
            if len(hash_seeds) != k:
                raise ValueError(f"hash_seeds: need {k} seeds, got {len(hash_seeds)}")
            self.hash_seeds = [int(s) for s in hash_seeds]
        self.blooms = [bloom.filters(d, m, self.hashes, s)
                       for d, m, s in zip(domain.shape, self.bits, self.hash_seeds)]
        self.offsets = np.concatenate([[0], np.cumsum(self.bits)]).astype(int)
        self.max_cooccurrence_cells = int(max_cooccurrence_cells)

    # --- privacy ---------------------------------------------------------------------------------
    @property
    def epsilon_attribute(self) -> float:
        """[LoPub eq. 8] per attribute: 2h·ln((2−f)/f) (an upper bound)."""
        return bloom.epsilon_declared(self.f, self.hashes)

    @property
    def epsilon_eq8(self) -> float:
        """[LoPub eq. 8] per record: the per-attribute bound summed over attributes."""
        return bloom.epsilon_declared(self.f, self.hashes, len(self.domain))

    @property
    def epsilon(self) -> float:
        """ε one report costs, computed from the actual filters: Σ_j ln((2−f)/f)·max Hamming
        distance between two values' filters (≤ :attr:`epsilon_eq8`)."""
        return float(sum(bloom.epsilon_exact(B, self.f) for B in self.blooms))

    @property
    def epsilon_exact(self) -> float:
        """Alias of :attr:`epsilon` (the computed ε)."""
        return self.epsilon

    # --- device side ------------------------------------------------------------------------------
    @property
    def report_width(self) -> int:
        return int(self.offsets[-1])

    def report_bounds(self) -> np.ndarray:
        return np.full(self.report_width, 2, dtype=np.int64)

    def device_program(self) -> dict[str, Any] | None:
        """One ``bloom`` step per attribute (its filters as bit positions; docs/device-protocol.md);
        None beyond 1,024 report columns."""
        if self.report_width > 1024:
            return None
        return dp.program(self.name, self.domain, self.report_width, [
            dp.bloom_step(j, int(self.offsets[j]), B, self.f) for j, B in enumerate(self.blooms)])

    def randomize(self, records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Encode every attribute with its Bloom filter and flip every bit (eq. 5): uint8 0/1."""
        records = np.asarray(records)
        if records.ndim != 2 or records.shape[1] != len(self.domain):
            raise ValueError(f"records must be (n, {len(self.domain)}), got {records.shape}")
        if np.any(records < 0) or np.any(records >= np.array(self.domain.shape)):
            raise ValueError("records hold a category index outside the domain")
        return bloom.flip(bloom.encode(records, self.blooms), self.f, rng)

    # --- server side ------------------------------------------------------------------------------
    def columns(self, attr: str) -> slice:
        """Report columns holding ``attr``'s bits."""
        j = self.domain.axes((attr,))[0]
        return slice(int(self.offsets[j]), int(self.offsets[j + 1]))

    def _ordered(self, attrs: Sequence[str]) -> tuple[str, ...]:
        return tuple(sorted(attrs, key=lambda a: self.domain.axes((a,))[0]))

    def tensors(self, marginals: Sequence[Sequence[str]]) -> list[TensorSpec]:
        specs: dict[str, TensorSpec] = {"n": TensorSpec("n", ("reports",), (1,))}
        for marg in marginals:
            attrs = self._ordered(marg)
            if len(set(attrs)) != len(attrs):
                raise ValueError(f"marginal {tuple(marg)} repeats an attribute")
            for a in attrs:
                cols = tuple(range(self.columns(a).start, self.columns(a).stop))
                specs.setdefault(f"b:{a}", TensorSpec(f"b:{a}", (f"{a}#bit",), (len(cols),), cols))
            groups = list(combinations(attrs, 2))
            cells = int(np.prod([self.bits[self.domain.axes((a,))[0]] for a in attrs]))
            if len(attrs) >= 3 and cells <= self.max_cooccurrence_cells:
                groups.append(attrs)
            for g in groups:
                key = "c:" + "|".join(g)
                cols = tuple(c for a in g for c in range(self.columns(a).start,
                                                         self.columns(a).stop))
                shape = tuple(self.bits[self.domain.axes((a,))[0]] for a in g)
                specs.setdefault(key, TensorSpec(key, tuple(f"{a}#bit" for a in g), shape, cols))
        return list(specs.values())

    def count(self, reports: np.ndarray, specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
        """Per-bit and co-occurrence counts of a batch (vectorized matmuls)."""
        reports = np.asarray(reports)
        out: dict[str, np.ndarray] = {}
        for s in specs:
            if s.key == "n":
                out[s.key] = np.array([reports.shape[0]], dtype=np.int64)
                continue
            kind, _, names = s.key.partition(":")
            attrs = names.split("|")
            parts = [reports[:, self.columns(a)] for a in attrs]
            if kind not in ("b", "c"):
                raise ValueError(f"unknown LoPub tensor {s.key!r}")
            out[s.key] = cooccurrence_counts(*parts).reshape(s.shape)
        return out

    def estimate(self, counts: Mapping[str, np.ndarray], attrs: Sequence[str], method: str,
                 **options: Any) -> Estimate:
        """Estimate the joint of ``attrs`` (in the order given).

        Options: ``alpha`` (Lasso), ``proper`` (``None``/``"clip"``/``"project"``, applied to the
        co-occurrence estimate), ``tol``/``max_iter`` (EM), ``reports`` (needed by ``em`` and
        ``lasso-em``).
        """
        attrs = tuple(attrs)
        self._check(attrs, method)
        if method in ("em", "lasso-em"):
            reports = options.pop("reports", None)
            if reports is None:
                raise ValueError(f"method {method!r} needs per-report likelihoods: pass "
                                 "reports=... (or use estimate_reports)")
            return self.estimate_reports(reports, attrs, method, **options)
        if "n" not in counts:
            raise KeyError("LoPub counts lack the 'n' tensor")
        n = int(np.asarray(counts["n"]).reshape(-1)[0])
        if method == "lasso":
            values = self._lasso([counts[f"b:{a}"] for a in attrs], n, attrs, options)
            try:
                raw = self._cooccurrence_counts(counts, n, attrs)
            except KeyError:   # no co-occurrence tensor of these attributes to bound it by
                return self._result(values, attrs, method, n, bound=unbounded(values))
            return self._result(values, attrs, method, n,
                                bound=triangle(values, raw, self._bound(raw, attrs, n)))
        raw = self._cooccurrence_counts(counts, n, attrs)
        return self._result(self._repair(raw, options), attrs, method, n,
                            bound=self._bound(raw, attrs, n))

    def estimate_reports(self, reports: np.ndarray, attrs: Sequence[str], method: str,
                         **options: Any) -> Estimate:
        """Estimate from the reports themselves (offline simulation, or EM over a stored
        window). EM works on the table of distinct match vectors, never per record."""
        attrs = tuple(attrs)
        self._check(attrs, method)
        reports = np.asarray(reports)
        n = int(reports.shape[0])
        parts = [reports[:, self.columns(a)] for a in attrs]
        blooms = [self.blooms[self.domain.axes((a,))[0]] for a in attrs]
        A = [bloom.expected_bits(B, self.f) for B in blooms]
        raw = (solve_cooccurrence(cooccurrence_counts(*parts), n, A) if len(attrs) <= 2
               else cooccurrence_from_bits(parts, A))
        b = self._bound(raw, attrs, n)
        if method == "cooccurrence":
            return self._result(self._repair(raw, options), attrs, method, n, bound=b)
        bit_counts = [p.sum(axis=0, dtype=np.int64) for p in parts]
        if method == "lasso":
            values = self._lasso(bit_counts, n, attrs, options)
            return self._result(values, attrs, method, n, bound=triangle(values, raw, b))
        init = self._lasso(bit_counts, n, attrs, options) if method == "lasso-em" else None
        res = em_jd(distinct_reports(parts, blooms), blooms, self.f, init=init,
                    tol=float(options.get("tol", 1e-4)),
                    max_iter=int(options.get("max_iter", 1000)))
        extra = {} if init is None else {"lasso_support": int(np.count_nonzero(init))}
        return self._result(res.joint, attrs, method, n, iterations=res.iterations,
                            converged=res.converged, extra=extra,
                            bound=triangle(res.joint, raw, b))

    # --- configuration ----------------------------------------------------------------------------
    @classmethod
    def from_config(cls, domain: Domain, params: Mapping[str, Any] | None, *,
                    epsilon: float | None, epsilon_scope: str = "attribute", version: int = 0) -> "LoPub":
        """``params``: ``bits`` (per attribute, default from ``p_fp``), ``hashes``, ``p_fp``
        (0.01), ``seed`` (0), ``max_cooccurrence_cells``. The flip probability f is solved from
        ε (:func:`~.mechanism.record_budget`): the computed ε is ln((2−f)/f)·Σ_j H_j with H_j the
        largest Hamming distance between two of attribute j's filters, so
        f = 2/(1 + e^{ε/ΣH}). An explicit ``f`` must give that same ε."""
        pr = Params(cls.name, params)
        f = pr.number("f", None, gt=0.0, lt=1.0)
        bits = pr.value("bits")
        if bits is not None and (isinstance(bits, bool) or not (
                isinstance(bits, int) or (isinstance(bits, list) and all(
                    isinstance(b, int) and not isinstance(b, bool) for b in bits)))):
            raise ParamError("bits", f"must be an integer or one integer per attribute (got "
                                     f"{bits!r})")
        hashes = pr.integer("hashes", None, ge=1)
        p_fp = pr.number("p_fp", DEFAULT_P_FP, gt=0.0, lt=1.0)
        seed = pr.integer("seed", 0, ge=0)
        cells = pr.integer("max_cooccurrence_cells", 1 << 16, ge=1)
        pr.done()
        try:
            probe = cls(domain, 0.5, bits=bits, hashes=hashes, p_fp=p_fp, seed=seed,
                        max_cooccurrence_cells=cells)
        except ValueError as exc:
            raise ParamError("bits", str(exc)) from None
        if epsilon is None:   # ε follows from f and the filters
            return cls(domain, 0.5 if f is None else f, bits=bits, hashes=hashes, p_fp=p_fp,
                       seed=seed, hash_seeds=probe.hash_seeds, version=version,
                       max_cooccurrence_cells=cells)
        eps = record_budget(epsilon, epsilon_scope, len(domain))
        ham = probe.epsilon / np.log(3.0)   # Σ_j H_j (ε at f = 0.5 is ln 3 · Σ H)
        solved = float(2.0 / (1.0 + np.exp(eps / ham)))
        if f is not None and not np.isclose(f, solved, rtol=1e-6):
            have = float(np.log((2 - f) / f) * ham)
            raise ParamError("f", f"lopub's ε follows from f and the Bloom filters (f = {f:g} "
                                  f"gives {have:.4g} per record, epsilon asks {eps:.4g}); give "
                                  "epsilon or f, not both")
        return cls(domain, solved, bits=bits, hashes=hashes, p_fp=p_fp, seed=seed,
                   hash_seeds=probe.hash_seeds, version=version, max_cooccurrence_cells=cells)

    def check_marginal(self, attrs: Sequence[str], method: str) -> str | None:
        """em / lasso-em need every report's likelihood (whole reports), not counts;
        cooccurrence of w > 2 attributes needs a w-way bit tensor within
        ``max_cooccurrence_cells``."""
        why = super().check_marginal(attrs, method)
        if why:
            return why
        if method not in self.count_estimators:
            return (f"lopub's {method} needs whole reports (per-report likelihoods); the stream "
                    f"keeps count tensors: use {' or '.join(self.count_estimators)}")
        if method == "cooccurrence" and len(attrs) > 2:
            cells = int(np.prod([self.bits[self.domain.axes((a,))[0]] for a in attrs]))
            if cells > self.max_cooccurrence_cells:
                return (f"cooccurrence of {len(attrs)} attributes needs a {cells}-cell bit "
                        f"tensor, above max_cooccurrence_cells {self.max_cooccurrence_cells}")
        return None

    # --- helpers ----------------------------------------------------------------------------------
    def _check(self, attrs: tuple[str, ...], method: str) -> None:
        if method not in self.estimators:
            raise ValueError(f"unknown LoPub estimator {method!r}; choose one of "
                             + ", ".join(self.estimators))
        if not attrs or len(set(attrs)) != len(attrs):
            raise ValueError(f"attributes must be distinct and non-empty, got {attrs}")
        self.domain.axes(attrs)

    def _lasso(self, bit_counts: Sequence[np.ndarray], n: int, attrs: tuple[str, ...],
               options: Mapping[str, Any]) -> np.ndarray:
        blooms = [self.blooms[self.domain.axes((a,))[0]] for a in attrs]
        return lasso_jd(bit_counts, n, blooms, self.f, alpha=float(options.get("alpha", 1e-4)))

    def _repair(self, values: np.ndarray, options: Mapping[str, Any]) -> np.ndarray:
        name = options.get("proper")
        if name not in _REPAIRS:
            raise ValueError(f"proper: choose none, clip or project, got {name!r}")
        fn = _REPAIRS[name]
        return values if fn is None else fn(values)

    def _bound(self, raw: np.ndarray, attrs: tuple[str, ...], n: int) -> Bound:
        """The calibrated bound of the co-occurrence estimate ``raw`` of ``attrs``."""
        return cooccurrence_bound([bloom.expected_bits(
            self.blooms[self.domain.axes((a,))[0]], self.f) for a in attrs], raw, n)

    def _cooccurrence_counts(self, counts: Mapping[str, np.ndarray], n: int,
                             attrs: tuple[str, ...]) -> np.ndarray:
        """The (raw, unbiased) co-occurrence estimate of ``attrs`` from the count tensors."""
        ordered = self._ordered(attrs)
        key = f"b:{ordered[0]}" if len(ordered) == 1 else "c:" + "|".join(ordered)
        if key not in counts:
            raise KeyError(f"co-occurrence estimate of {attrs} needs the tensor {key!r}"
                           + (" (w-way tensors are kept only up to max_cooccurrence_cells; "
                              "estimate offline with estimate_reports)" if len(attrs) > 2 else ""))
        A = [bloom.expected_bits(self.blooms[self.domain.axes((a,))[0]], self.f) for a in ordered]
        values = solve_cooccurrence(np.asarray(counts[key]), n, A)
        return np.transpose(values, [ordered.index(a) for a in attrs])

    def _result(self, values: np.ndarray, attrs: tuple[str, ...], method: str, n: int, *,
                iterations: int | None = None, converged: bool | None = None,
                extra: dict[str, Any] | None = None, bound: Bound) -> Estimate:
        info = {"epsilon_exact": self.epsilon_exact, "f": self.f, "hashes": self.hashes,
                "bits": {a: self.bits[self.domain.axes((a,))[0]] for a in attrs}}
        info.update(extra or {})
        return Estimate(Factor(self.domain.project(attrs), np.asarray(values, dtype=float)),
                        method, n, self.epsilon, iterations=iterations, converged=converged,
                        extra=info, error_bound=bound.tvd, bound=bound)

    # --- state ------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "mechanism": self.name,
            "version": self.version,
            "format": STATE_FORMAT,
            "domain": self.domain.to_dict(),
            "f": self.f,
            "bits": list(self.bits),
            "hashes": self.hashes,
            "hash_seeds": [str(s) for s in self.hash_seeds],   # 64-bit: strings survive JSON
            "p_fp": self.p_fp,
            "seed": self.seed,
            "max_cooccurrence_cells": self.max_cooccurrence_cells,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "LoPub":
        if state.get("mechanism") != cls.name:
            raise ValueError(f"state is for {state.get('mechanism')!r}, not {cls.name!r}")
        fmt = int(state.get("format", 0))
        if fmt != STATE_FORMAT:
            raise ValueError(f"LoPub state format {fmt} is not supported (expected {STATE_FORMAT})")
        domain = Domain.from_dict(state["domain"])
        return cls(domain, float(state["f"]), bits=state["bits"], hashes=int(state["hashes"]),
                   p_fp=float(state.get("p_fp", DEFAULT_P_FP)), seed=int(state.get("seed", 0)),
                   hash_seeds=[int(s) for s in state["hash_seeds"]],
                   version=int(state.get("version", 0)),
                   max_cooccurrence_cells=int(state.get("max_cooccurrence_cells", 1 << 16)))
