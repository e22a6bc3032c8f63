"""Corr-RR as published [Corr-RR] §3 (docs/mechanisms.md §5): the two-phase device protocol shared by
``corr-rr`` and ``corr-rr-paper``, the published closed-form p_y, and the published estimate.

Protocol (one report per user, ε-LDP on whole records):

* **Phase I** (a fraction β of users): SPL — GRR(ε/m) on every attribute.
* **Phase II** (the others): a pivot j drawn uniformly, y_j = GRR_ε(x_j); every other attribute k
  gets a value drawn from a *copy channel* M_jk(y_j, ·) that depends on y_j only (post-processing,
  so the report costs ε whatever M is). The report holds all m values and not the pivot.

  - one common domain size d: M_jk keeps y_j with probability p_y(j,k), else a uniform one of the
    other d−1 values (the published Corr-RR);
  - different domain sizes (Cond-RR, §3.3.4–3.3.5): M_jk(y, ·) is the Phase I estimate of
    Pr(X_k | Y_j = y) (:mod:`.cond_rr`), optionally mixed with the uniform distribution.

  Both families are affine in one parameter t_jk ∈ [0, 1] per ordered pair
  (M_jk = M0_jk + t_jk·M1_jk): t = p_y, or the weight of the conditional.

* **Published estimate** (``corr-rr-paper``): every Phase II column decoded as if it were GRR(ε)
  reports (unbiased for pivots only), combined with Phase I by counts:
  f̂ = (n₁·f̂ᴵ + n₂·f̂ᴵᴵ)/(n₁+n₂). Its bias does not shrink with ε.

Reports are ``[phase, y_1, …, y_m]`` (phase 0 = Phase I, 1 = Phase II); count tensors
``corr:<a>`` of shape (2, d_a) (and ``corr:<a>|<b>`` of shape (2, d_a, d_b) when Cond-RR needs
Phase I pairs). The state carries the p_y (or conditional) table and its ``version``; the table is
a pure function of the Phase I estimates (:meth:`TwoPhase.refine`), so a controller can republish
it as Phase I refines.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ldpstream.estimators.families.multi_baselines import grr_decode, one_way_axis, one_way_reason, report_dtype
from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels import device_program as dp
from ldpstream.estimators.kernels.bounds import Bound, product_channel_bound, triangle, unbounded
from ldpstream.estimators.kernels.domain import Domain, Factor
from ldpstream.estimators.kernels.proper import repair
from ldpstream.estimators.mechanism import (
    Estimate,
    Mechanism,
    ParamError,
    Params,
    TensorSpec,
    VersionedCounts,
    record_budget,
    register,
)

__all__ = ["TwoPhase", "CorrRRPaper", "paper_py", "paper_py_table", "grr_copy_channel",
           "phase1_estimates", "run_two_phase"]


# --- the published p_y ----------------------------------------------------------------------------

def paper_py(f_a: np.ndarray, f_b: np.ndarray, eps: float, n2: float) -> float:
    """The published closed form (docs/mechanisms.md §5, as in the authors' code): pivot a, other b.

    d₀ = 1 − f_a − f_b; e = 2f_b − 1; α = (1−Δ)/d + (Δ/2)(d₀ + 2f_a); β = (Δ/2)e;
    D₁ = d₀e/2 + β(1−2α)/(n₂Δ²); D₂ = e²/4 − β²/(n₂Δ²); p_y = clip(−ΣD₁/(2ΣD₂), 0, 1);
    0.5 when |ΣD₂| or |Δ| is ~0 or n₂ ≤ 1. (Takes the bias slope from f_b where the copied
    column's decode depends on f_a, and d₀, e are binary-only terms; kept as published.)
    """
    f_a = np.asarray(f_a, dtype=float)
    f_b = np.asarray(f_b, dtype=float)
    d = len(f_a)
    if n2 <= 1:
        return 0.5
    p, q = ch.grr_pq(eps, d)
    delta = p - q
    if abs(delta) < 1e-12:
        return 0.5
    d0 = 1.0 - f_a - f_b
    e = 2.0 * f_b - 1.0
    alpha = (1.0 - delta) / d + (delta / 2.0) * (d0 + 2.0 * f_a)
    beta = (delta / 2.0) * e
    D1 = d0 * e / 2.0 + beta * (1.0 - 2.0 * alpha) / (n2 * delta ** 2)
    D2 = e * e / 4.0 - beta * beta / (n2 * delta ** 2)
    s1, s2 = float(D1.sum()), float(D2.sum())
    if abs(s2) < 1e-12:
        return 0.5
    return float(np.clip(-s1 / (2.0 * s2), 0.0, 1.0))


def paper_py_table(f1: Sequence[np.ndarray], eps: float, n2: float) -> np.ndarray:
    """m×m table of :func:`paper_py` per ordered pair (pivot row, other column); diagonal 1."""
    m = len(f1)
    T = np.ones((m, m))
    for a in range(m):
        for b in range(m):
            if a != b:
                T[a, b] = paper_py(f1[a], f1[b], eps, n2)
    return T


def grr_copy_channel(p_y: float, d: int) -> np.ndarray:
    """Keep y with probability p_y, else a uniform one of the other d−1 values."""
    M = np.full((d, d), (1.0 - p_y) / (d - 1))
    np.fill_diagonal(M, p_y)
    return M


# --- Phase I helpers ------------------------------------------------------------------------------

def phase1_estimates(counts1: Sequence[np.ndarray], eps: float, shape: Sequence[int]
                     ) -> list[np.ndarray]:
    """Unbiased SPL marginals from Phase I column counts (GRR(ε/m) decode)."""
    m = len(shape)
    return [grr_decode(c, max(float(np.sum(c)), 1.0), eps / m, d) for c, d in zip(counts1, shape)]


# --- the shared two-phase mechanism ---------------------------------------------------------------

class TwoPhase(Mechanism):
    """Device side and count layout of Corr-RR / Cond-RR (see the module docstring).

    ``copy``: ``"py"`` (one common d; t = p_y) or ``"cond"`` (t = weight of the Phase I
    conditional; any domain sizes). ``table``: m×m array of t (diagonal ignored); ``cond``: the
    conditional matrices C[j][k] (d_j × d_k) for ``copy="cond"``. ``n_plan``: the number of users
    the table was planned for (Phase I + II), used to plan the next table.

    ``phase``: the phase this version's devices report in — 0 (Phase I), 1 (Phase II) or None
    (each device is in Phase I with probability β). Live, version 0 is Phase I; the rule that ends
    it: once ``phase1_reports`` Phase I reports are counted, :meth:`adapt` computes the copy
    table from them (:meth:`refine`) and publishes it as the next version, in Phase II. Phase I
    reports of every version are estimated from; Phase II reports of the versions since
    ``table_since`` (those made with the current table).
    """

    estimators: tuple[str, ...] = ()
    adaptive = True
    #: the estimate does not depend on the copy table (the published GRR decode): Phase II
    #: reports of every table are estimated from, so the table may be refined in Phase II
    TABLE_FREE_ESTIMATE: bool = False
    #: Phase I reports before the table is computed (the default of the live rule)
    PHASE1_REPORTS = 1000

    def __init__(self, domain: Domain, epsilon: float, phase1_fraction: float = 0.1,
                 copy: str | None = None, table: np.ndarray | None = None,
                 cond: Sequence[Sequence[np.ndarray | None]] | None = None,
                 n_plan: int | None = None, version: int = 0, phase: int | None = None,
                 phase1_reports: int | None = None, table_since: int | None = None,
                 refine_reports: int | None = None) -> None:
        super().__init__(domain, version)
        self.refine_reports = None if refine_reports is None else int(refine_reports)
        if self.refine_reports is not None and (not self.TABLE_FREE_ESTIMATE
                                                or self.refine_reports < 1):
            raise ValueError(f"{self.name} cannot refine its table in Phase II (its estimate "
                             "weights Phase II reports by the table they used)")
        if phase not in (None, 0, 1):
            raise ValueError(f"phase must be 0, 1 or None, got {phase!r}")
        self.phase = phase
        self.phase1_reports = self.PHASE1_REPORTS if phase1_reports is None else int(phase1_reports)
        if self.phase1_reports < 1:
            raise ValueError(f"phase1_reports must be ≥ 1, got {phase1_reports!r}")
        self.table_since = self.version if table_since is None else int(table_since)
        self.target_epsilon = float(epsilon)
        if not np.isfinite(self.target_epsilon) or self.target_epsilon <= 0:
            raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
        self.beta = float(phase1_fraction)
        if not 0 < self.beta < 1:
            raise ValueError(f"phase1_fraction must be in (0, 1), got {phase1_fraction!r}")
        m = len(domain)
        if m < 2:
            raise ValueError(f"{self.name} needs at least 2 attributes")
        same = len(set(domain.shape)) == 1
        self.copy = copy or ("py" if same else "cond")
        if self.copy not in ("py", "cond"):
            raise ValueError(f"copy must be 'py' or 'cond', got {copy!r}")
        if self.copy == "py" and not same:
            raise ValueError(f"{self.name}: p_y copies need one common domain size, got "
                             f"{domain.shape}; use copy='cond' (Cond-RR)")
        self.n_plan = None if n_plan is None else int(n_plan)
        self.eps1 = self.target_epsilon / m
        self.P1 = [ch.grr(self.eps1, d) for d in domain.shape]
        self.P2 = [ch.grr(self.target_epsilon, d) for d in domain.shape]
        if table is None:
            table = self._initial_table()
        self.table = np.array(table, dtype=float).reshape(m, m)
        np.fill_diagonal(self.table, 1.0)
        if np.any(~np.isfinite(self.table)) or self.table.min() < 0 or self.table.max() > 1:
            raise ValueError(f"{self.name}: copy table entries must be in [0, 1]")
        if self.copy == "cond":
            if cond is None:
                cond = [[None if j == k else np.full((dj, dk), 1.0 / dk)
                         for k, dk in enumerate(domain.shape)] for j, dj in enumerate(domain.shape)]
            self.cond = [[None if j == k else _check_stochastic(np.asarray(cond[j][k], dtype=float),
                                                                 domain.shape[j], domain.shape[k])
                          for k in range(m)] for j in range(m)]
        else:
            self.cond = None
        if self.refine_reports is not None and self.copy != "py":
            raise ValueError(f"{self.name} can refine p_y copies only (Cond-RR's conditionals "
                             "need Phase I pairs); drop refine_reports")

    # -- copy channels ---------------------------------------------------------------------------
    def _initial_table(self) -> np.ndarray:
        m = len(self.domain)
        if self.copy == "py":
            return np.full((m, m), 1.0 / self.domain.shape[0])  # copies independent of y: RS+FD-like
        return np.zeros((m, m))

    def affine(self, j: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(M0, M1) with M_jk(t) = M0 + t·M1."""
        dj, dk = self.domain.shape[j], self.domain.shape[k]
        if self.copy == "py":
            M0 = (np.ones((dj, dk)) - np.eye(dj)) / (dj - 1)
            return M0, np.eye(dj) - M0
        U = np.full((dj, dk), 1.0 / dk)
        return U, self.cond[j][k] - U

    def copy_channel(self, j: int, k: int) -> np.ndarray:
        M0, M1 = self.affine(j, k)
        return np.clip(M0 + self.table[j, k] * M1, 0.0, None)

    def _copy_rows(self, j: int, k: int) -> np.ndarray:
        """:meth:`copy_channel` with every row summing to 1 (as devices sample it)."""
        M = self.copy_channel(j, k)
        return M / M.sum(axis=1, keepdims=True)

    def copy_channels(self) -> list[list[np.ndarray | None]]:
        m = len(self.domain)
        return [[None if j == k else self.copy_channel(j, k) for k in range(m)] for j in range(m)]

    def device_program(self) -> dict[str, Any] | None:
        """Phase I: ``[0, GRR per attribute]``; Phase II: ``[1, …]`` with a hidden uniform pivot
        j through P2_j and every other column copied from the pivot's output through M_jk
        (docs/device-protocol.md). None while devices draw their phase (``phase`` None)."""
        m = len(self.domain)
        if self.phase is None:
            return None
        if self.phase == 0:
            steps = [dp.const_step(0, 0)] + [dp.channel_step([j], P, out=[j + 1])
                                              for j, P in enumerate(self.P1)]
        else:
            steps = [dp.const_step(0, 1), dp.select_step(None, [
                [dp.channel_step([j], self.P2[j], out=[j + 1])]
                + [dp.copy_step(j + 1, k + 1, self._copy_rows(j, k)) for k in range(m) if k != j]
                for j in range(m)])]
        return dp.program(self.name, self.domain, 1 + m, steps)

    # -- privacy ---------------------------------------------------------------------------------
    @property
    def epsilon(self) -> float:
        """max(ε of Phase I's SPL report, ε of Phase II): the phase is drawn independently of the
        record and the two phases' reports are disjoint; Phase II is a uniform mixture over the
        pivot of GRR_ε followed by post-processing, so its ε is max_j ε(P2_j)."""
        return max(ch.epsilon_of_report(self.P1), max(ch.epsilon(P) for P in self.P2))

    # -- layout ----------------------------------------------------------------------------------
    @property
    def report_width(self) -> int:
        return 1 + len(self.domain)

    def report_bounds(self) -> np.ndarray:
        return np.asarray((2,) + self.domain.shape, dtype=np.int64)

    def tensors(self, marginals: Sequence[Sequence[str]] = ()) -> list[TensorSpec]:
        out = [TensorSpec(f"corr:{a}", ("phase", a), (2, d), (0, 1 + i))
               for i, (a, d) in enumerate(zip(self.domain.attrs, self.domain.shape))]
        if self.copy == "cond":
            at, sh = self.domain.attrs, self.domain.shape
            out += [TensorSpec(f"corr:{at[i]}|{at[k]}", ("phase", at[i], at[k]), (2, sh[i], sh[k]),
                               (0, 1 + i, 1 + k))
                    for i in range(len(at)) for k in range(i + 1, len(at))]
        return out

    # -- device side -----------------------------------------------------------------------------
    def _records(self, records: np.ndarray) -> np.ndarray:
        records = np.asarray(records)
        if records.ndim != 2 or records.shape[1] != len(self.domain):
            raise ValueError(f"records must be (n, {len(self.domain)}), got {records.shape}")
        if records.size and (records.min() < 0 or np.any(records.max(axis=0) >= self.domain.shape)):
            raise ValueError("records hold a value outside the domain")
        return records

    def assign_phases(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Phase of each of n users: exactly round(β·n) random users in Phase I (0), the rest in
        Phase II (1), as in the paper's experiments."""
        phase = np.ones(n, dtype=np.uint8)
        phase[rng.permutation(n)[:int(round(self.beta * n))]] = 0
        return phase

    def with_phase(self, phase: int | None) -> "TwoPhase":
        """This state with devices reporting in ``phase`` (same version)."""
        st = self.state()
        st["phase"] = phase
        return type(self).from_state(st)

    def randomize(self, records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Reports ``[phase, y…]`` in :attr:`phase` (None → :meth:`assign_phases`)."""
        x = self._records(records)
        n = len(x)
        phase = self.assign_phases(n, rng) if self.phase is None else self.phase
        phase = np.broadcast_to(np.asarray(phase, dtype=np.uint8), (n,))
        dtype = report_dtype((2,) + self.domain.shape)
        out = np.empty((n, 1 + len(self.domain)), dtype=dtype)
        out[:, 0] = phase
        i1 = np.nonzero(phase == 0)[0]
        i2 = np.nonzero(phase != 0)[0]
        if len(i1):
            out[i1, 1:] = self._phase1(x[i1], rng, dtype)
        if len(i2):
            out[i2, 1:] = self._phase2(x[i2], rng, dtype)
        return out

    def _phase1(self, x: np.ndarray, rng: np.random.Generator, dtype) -> np.ndarray:
        out = np.empty(x.shape, dtype=dtype)
        for j, P in enumerate(self.P1):
            out[:, j] = ch.randomize(x[:, j].astype(dtype), P, rng)
        return out

    def _phase2(self, x: np.ndarray, rng: np.random.Generator, dtype) -> np.ndarray:
        n, m = x.shape
        out = np.empty((n, m), dtype=dtype)
        piv = rng.integers(0, m, n)
        for j in range(m):
            g = np.nonzero(piv == j)[0]
            if not len(g):
                continue
            yj = ch.randomize(x[g, j].astype(dtype), self.P2[j], rng)
            out[g, j] = yj
            for k in range(m):
                if k != j:
                    out[g, k] = self._copy(j, k, yj, rng, dtype)
        return out

    def _copy(self, j: int, k: int, y: np.ndarray, rng: np.random.Generator, dtype) -> np.ndarray:
        if self.copy == "py":
            d = self.domain.shape[k]
            keep = rng.random(len(y)) < self.table[j, k]
            other = rng.integers(0, d - 1, len(y))
            other = other + (other >= y)
            return np.where(keep, y, other).astype(dtype)
        M = self.copy_channel(j, k)
        cum = np.cumsum(M, axis=1)
        cum[:, -1] = 1.0
        out = np.empty(len(y), dtype=dtype)
        step = 1 << 18
        for s in range(0, len(y), step):
            yy = y[s:s + step].astype(np.intp)
            u = rng.random(len(yy))
            out[s:s + step] = (u[:, None] >= cum[yy][:, :-1]).sum(axis=1)
        return out

    # -- server side: counts ---------------------------------------------------------------------
    def column_counts(self, counts: Mapping[str, np.ndarray]) -> tuple[list[np.ndarray],
                                                                        list[np.ndarray]]:
        """(Phase I column counts, Phase II column counts), domain order."""
        c1, c2 = [], []
        for a in self.domain.attrs:
            t = np.asarray(counts[f"corr:{a}"], dtype=float)
            c1.append(t[0])
            c2.append(t[1])
        return c1, c2

    def phase_sizes(self, counts: Mapping[str, np.ndarray]) -> tuple[int, int]:
        c1, c2 = self.column_counts(counts)
        return int(round(c1[0].sum())), int(round(c2[0].sum()))

    def phase1(self, counts: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Unbiased Phase I (SPL) marginal estimates."""
        c1, _ = self.column_counts(counts)
        return phase1_estimates(c1, self.target_epsilon, self.domain.shape)

    def bound(self, counts: Mapping[str, np.ndarray], i: int, method: str,
              values: np.ndarray) -> Bound:
        """The bound of attribute i's estimate ``values`` by ``method``: Phase I's (SPL through
        GRR) calibrated bootstrap bound, plus for every other estimate its TVD to Phase I's
        (:func:`~.bounds.triangle`: at least 95 %); no Phase I reports: :func:`~.bounds.unbounded`."""
        c1, _ = self.column_counts(counts)
        if c1[i].sum() <= 0:
            return unbounded(values)
        b = product_channel_bound(c1[i], [self.P1[i]])
        if method == "phase1":
            return b
        return triangle(values, self.phase1(counts)[i], b)

    def phase1_pairs(self, counts: Mapping[str, np.ndarray]) -> dict[tuple[int, int], np.ndarray]:
        """Phase I pair counts (j < k) of the ``corr:a|b`` tensors."""
        at = self.domain.attrs
        return {(j, k): np.asarray(counts[f"corr:{at[j]}|{at[k]}"], dtype=float)[0]
                for j in range(len(at)) for k in range(j + 1, len(at))}

    # -- refinement (a pure function of the Phase I counts) ---------------------------------------
    def plan(self, counts: Mapping[str, np.ndarray], n_plan: int | None = None
             ) -> tuple[int, int]:
        """(n₁, n₂) to plan the table for: the Phase I reports counted so far and the Phase II
        users expected (``n_plan`` total, default n₁/β)."""
        n1, _ = self.phase_sizes(counts)
        n_total = int(n_plan) if n_plan is not None else (self.n_plan or int(round(n1 / self.beta)))
        return n1, max(n_total - n1, 1)

    def refine(self, counts: Mapping[str, np.ndarray], n_plan: int | None = None) -> "TwoPhase":
        """A new mechanism (version + 1) whose copy table is computed from the Phase I counts."""
        raise NotImplementedError

    def _with(self, table: np.ndarray, cond, n_plan: int | None) -> "TwoPhase":
        """The next version: Phase II with the new table."""
        return type(self)(self.domain, self.target_epsilon, self.beta, self.copy, table, cond,
                          n_plan, self.version + 1, 1, self.phase1_reports, self.version + 1,
                          self.refine_reports)

    # -- the adaptive protocol ---------------------------------------------------------------------
    @classmethod
    def from_config(cls, domain: Domain, params: Mapping[str, Any] | None, *,
                    epsilon: float | None, epsilon_scope: str = "attribute", version: int = 0) -> "TwoPhase":
        """Version 0 in Phase I. ``params``: ``phase1_reports`` (the rule ending Phase I, 1000),
        ``phase1_fraction`` β (0.1: Phase I's share of the planned users, so the table is
        planned for n₂ = n₁/β − n₁ Phase II users unless ``n_plan`` users are given), ``copy``
        (``py`` | ``cond``). ε per report: :func:`~.mechanism.record_budget`."""
        pr = Params(cls.name, params)
        reports = pr.integer("phase1_reports", cls.PHASE1_REPORTS, ge=1)
        beta = pr.number("phase1_fraction", 0.1, gt=0.0, lt=1.0)
        n_plan = pr.integer("n_plan", None, ge=2)
        copy = pr.choice("copy", None, ("py", "cond"))
        refine = pr.integer("refine_reports", None, ge=1)
        pr.done()
        try:
            return cls(domain, record_budget(epsilon, epsilon_scope, len(domain)), beta, copy,
                       n_plan=n_plan, version=version, phase=0, phase1_reports=reports,
                       refine_reports=refine)
        except ValueError as exc:
            field = "refine_reports" if refine is not None and "refine" in str(exc) else "copy"
            raise ParamError(field, str(exc)) from None

    def planned_for(self, n: int) -> "TwoPhase":
        """Phase I for round(β·n) of ``n`` devices, the table planned for n."""
        if self.phase != 0:
            return self
        st = self.state()
        st.update(phase1_reports=max(1, int(round(self.beta * n))), n_plan=int(n))
        return type(self).from_state(st)

    def accepted_versions(self) -> tuple[int, ...]:
        """Every version so far: Phase I reports do not depend on the table."""
        return tuple(range(self.version + 1))

    def combined_counts(self, counts: VersionedCounts) -> dict[str, np.ndarray]:
        """Phase I rows of every version, Phase II rows of the versions since the current table
        was published (axis 0 of every tensor is the phase)."""
        out: dict[str, np.ndarray] = {s.key: np.zeros(s.shape, dtype=np.int64)
                                      for s in self.tensors()}
        for v in self.accepted_versions():
            for k, t in counts.get(v, {}).items():
                if k in out:
                    t = np.asarray(t)
                    out[k][0] += t[0]
                    if v >= self.table_since or self.TABLE_FREE_ESTIMATE:
                        out[k][1] += t[1]
        return out

    def _phase1_counted(self, counts: VersionedCounts) -> int:
        return int(self.combined_counts(counts)[self.tensors()[0].key][0].sum())

    def _phase2_of_table(self, counts: VersionedCounts) -> int:
        """Phase II reports made with the current table."""
        key = self.tensors()[0].key
        return int(sum(np.asarray(counts[v][key])[1].sum() for v in counts
                       if v >= self.table_since and key in counts[v]))

    def reports_until_adapt(self, counts: VersionedCounts) -> int | None:
        if self.phase == 0:
            return max(1, self.phase1_reports - self._phase1_counted(counts))
        if self.phase == 1 and self.refine_reports is not None:
            return max(1, self.refine_reports - self._phase2_of_table(counts))
        return None

    def adapt(self, counts: VersionedCounts) -> "TwoPhase | None":
        """End Phase I once ``phase1_reports`` Phase I reports are counted: the table planned
        from them (:meth:`refine`), published in Phase II. With ``refine_reports``, every time
        that many Phase II reports used the current table, the table planned from every report
        so far (:meth:`refine_phase2`) is the next version."""
        if self.phase == 0:
            if self._phase1_counted(counts) < self.phase1_reports:
                return None
            return self.refine(self.combined_counts(counts))
        if (self.phase == 1 and self.refine_reports is not None
                and self._phase2_of_table(counts) >= self.refine_reports):
            return self.refine_phase2(self.combined_counts(counts))
        return None

    def refine_phase2(self, counts: Mapping[str, np.ndarray]) -> "TwoPhase":
        """The next table from every report so far (families with a table-free estimate)."""
        raise NotImplementedError

    def check_marginal(self, attrs: Sequence[str], method: str) -> str | None:
        return super().check_marginal(attrs, method) or one_way_reason(self, attrs, method)

    # -- state -----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        st = {"mechanism": self.name, "version": self.version, "domain": self.domain.to_dict(),
              "epsilon": self.target_epsilon, "phase1_fraction": self.beta, "copy": self.copy,
              "table": self.table.tolist(), "n_plan": self.n_plan,
              "report": "[phase, y_1..y_m]; phase 0 = Phase I (SPL, GRR(eps/m) per attribute), "
                        "1 = Phase II (pivot GRR(eps) + copies)",
              "phase": self.phase, "phase1_reports": self.phase1_reports,
              "table_since": self.table_since, "refine_reports": self.refine_reports,
              "assignment": ("each device is in Phase I with probability phase1_fraction"
                             if self.phase is None else f"every device reports in "
                             f"Phase {'I' if self.phase == 0 else 'II'}")}
        if self.copy == "cond":
            st["cond"] = [[None if M is None else M.tolist() for M in row] for row in self.cond]
        return st

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> "TwoPhase":
        cond = state.get("cond")
        return cls(Domain.from_dict(state["domain"]), float(state["epsilon"]),
                   float(state.get("phase1_fraction", 0.1)), state.get("copy"),
                   np.asarray(state["table"], dtype=float),
                   None if cond is None else [[None if M is None else np.asarray(M) for M in row]
                                              for row in cond],
                   state.get("n_plan"), int(state.get("version", 0)), state.get("phase"),
                   state.get("phase1_reports"), state.get("table_since"),
                   state.get("refine_reports"))

    # -- audit -----------------------------------------------------------------------------------
    def phase2_channel(self) -> tuple[np.ndarray, np.ndarray]:
        """(records, P): the exact Phase II channel from every record (C order) to every report
        y (C order): Pr(y|x) = (1/m) Σ_j P2_j(x_j, y_j) Π_{k≠j} M_jk(y_j, y_k)."""
        import itertools
        shape = self.domain.shape
        X = np.array(list(itertools.product(*[range(d) for d in shape])))
        Y = X.copy()
        m = len(shape)
        P = np.zeros((len(X), len(Y)))
        for j in range(m):
            w = np.ones(len(Y))
            for k in range(m):
                if k != j:
                    w = w * self.copy_channel(j, k)[Y[:, j], Y[:, k]]
            P += self.P2[j][X[:, j]][:, Y[:, j]] * w[None, :]
        return X, P / m

    # -- estimates -------------------------------------------------------------------------------
    def estimate_all(self, counts: Mapping[str, np.ndarray], method: str | None = None
                     ) -> list[np.ndarray]:
        raise NotImplementedError


def _check_stochastic(M: np.ndarray, dj: int, dk: int) -> np.ndarray:
    if M.shape != (dj, dk) or not np.all(np.isfinite(M)) or M.min() < -1e-12:
        raise ValueError(f"copy channel must be a {dj}×{dk} non-negative matrix")
    if not np.allclose(M.sum(axis=1), 1.0, atol=1e-9):
        raise ValueError("copy channel rows must sum to 1")
    return np.clip(M, 0.0, None)


@register
class CorrRRPaper(TwoPhase):
    """``corr-rr-paper``: the published p_y table (Cond-RR's plain conditional for different
    domain sizes), the published GRR decode of every Phase II column and the count-weighted
    combination [Corr-RR] §3 — exactly as published, for comparison."""

    name = "corr-rr-paper"
    estimators = ("paper", "phase1")
    TABLE_FREE_ESTIMATE = True

    def refine_phase2(self, counts: Mapping[str, np.ndarray]) -> "CorrRRPaper":
        """p_y refined as Phase II data arrives: the published closed form with the current
        (count-weighted Phase I + Phase II) estimates, clip-rescaled, in place of the Phase I
        ones, planned for the Phase II users still expected (p_y copies only)."""
        from ldpstream.estimators.kernels.proper import clip_rescale
        n1, n2 = self.phase_sizes(counts)
        n_total = self.n_plan or int(round(n1 / self.beta))
        f = [clip_rescale(x) for x in self.estimate_all(counts, "paper")]
        return self._with(paper_py_table(f, self.target_epsilon, max(n_total - n1 - n2, 1)),
                          None, self.n_plan)

    def refine(self, counts: Mapping[str, np.ndarray], n_plan: int | None = None) -> "CorrRRPaper":
        n1, n2 = self.plan(counts, n_plan)
        f1 = self.phase1(counts)
        if self.copy == "py":
            return self._with(paper_py_table(f1, self.target_epsilon, n2), None, n1 + n2)
        from ldpstream.estimators.families.corr_rr_cond import conditional_channels
        cond = conditional_channels(self.phase1_pairs(counts), self.P1, self.P2)
        m = len(self.domain)
        return self._with(np.ones((m, m)), cond, n1 + n2)

    def estimate_all(self, counts: Mapping[str, np.ndarray], method: str | None = "paper"
                     ) -> list[np.ndarray]:
        method = method or "paper"
        c1, c2 = self.column_counts(counts)
        n1, n2 = c1[0].sum(), c2[0].sum()
        f1 = phase1_estimates(c1, self.target_epsilon, self.domain.shape) if n1 > 0 else None
        if method == "phase1":
            if f1 is None:
                raise ValueError("no Phase I reports counted")
            return f1
        f2 = [grr_decode(c, n2, self.target_epsilon, d) for c, d in zip(c2, self.domain.shape)] \
            if n2 > 0 else None
        if f1 is None and f2 is None:
            raise ValueError("no reports counted")
        if f1 is None:
            return f2
        if f2 is None:
            return f1
        return [(n1 * a + n2 * b) / (n1 + n2) for a, b in zip(f1, f2)]

    def estimate(self, counts: Mapping[str, np.ndarray], attrs: Sequence[str],
                 method: str = "paper", **options: Any) -> Estimate:
        """Options: ``proper`` ('clip' | 'simplex')."""
        i = one_way_axis(self, attrs, method)
        vals = repair(self.estimate_all(counts, method)[i], options.get("proper"))
        n1, n2 = self.phase_sizes(counts)
        b = self.bound(counts, i, method, vals)
        return Estimate(Factor(self.domain.project(tuple(attrs)), vals), method, n1 + n2,
                        self.epsilon, error_bound=b.tvd, bound=b,
                        extra={"n1": n1, "n2": n2, "version": self.version})


def run_two_phase(mech: TwoPhase, records: np.ndarray, rng: np.random.Generator,
                  n_plan: int | None = None) -> tuple[TwoPhase, dict[str, np.ndarray]]:
    """Simulate one collection: Phase I reports, refine the table from them (version + 1),
    Phase II reports under the refined table. Returns (refined mechanism, counts of all reports)."""
    records = np.asarray(records)
    phase = mech.assign_phases(len(records), rng)
    specs = mech.tensors()
    r1 = mech.with_phase(0).randomize(records[phase == 0], rng)
    counts = mech.count(r1, specs)
    refined = mech.refine(counts, n_plan if n_plan is not None else len(records))
    r2 = refined.with_phase(1).randomize(records[phase != 0], rng)
    c2 = refined.count(r2, specs)
    return refined, {k: counts[k] + c2[k] for k in counts}
