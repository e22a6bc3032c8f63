"""The Castell-family estimators over a batch of same-shape tables [Castell Alg. 2–4; MDRR §2.1].

A refresh estimates hundreds of small marginals (a 37-attribute collection has 666 2-way
marginals of 4–16 cells), where the per-call Python overhead of :func:`~.castell.castell`,
:func:`~.truncated.truncated` and :func:`~.ibu.ibu` dwarfs the arithmetic. Here every table of a
batch shares a shape (``counts`` is ``(B, d₁, …, d_w)``) and carries its own channels (``mats[k]``
is ``(B, d_k, d_k)``, or ``(d_k, d_k)`` when every table shares it), so one numpy call serves
the whole batch. Each function computes exactly
what its one-table counterpart computes (same formulas, same iteration rule and stopping test per
table), so results agree to rounding (tests: 1e-12).

The IBU batch keeps SQUAREM's control state (step length bound, evaluations, convergence) per
table and drops converged tables from the working set, so a slow table costs only its own work.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ldpstream.estimators.kernels.castell import inverses
from ldpstream.estimators.kernels.ibu import MAX_AMPLIFICATION, check_support, restrict

__all__ = ["batch_modes", "take", "castell_batch", "castell_variance_batch", "truncated_batch",
           "rr_independent_batch", "ibu_batch", "amplification_batch", "IBUBatch", "inverses"]

_FLOOR = 1e-3      # as estimators/kernels/ibu.py
_MSTEP = 4.0
_TINY = 1e-200


def batch_modes(T: np.ndarray, mats: Sequence[np.ndarray]) -> np.ndarray:
    """``T[b] ×₁ M₁[b] … ×_w M_w[b]`` for every table b, in :func:`~.castell.mode_product`'s
    convention (``out[..., j, ...] = Σ_i T[..., i, ...]·M[i, j]``). ``M_k`` is ``(B, d_k, d_k)``
    (one matrix per table) or ``(d_k, d_k)`` (shared by every table, broadcast).

    As :func:`~.castell.apply_modes`, pass k views the tensor as ``(B, d_k, rest)`` and writes
    ``(B, rest, d_k)`` — axis k rotated to the end — so after w passes the order is the
    original one and no axis is ever transposed back."""
    X = np.asarray(T, dtype=float)
    B = X.shape[0]
    for M, d in zip(mats, X.shape[1:]):
        X = np.matmul(X.reshape(B, d, -1).transpose(0, 2, 1), M)
    return X.reshape(T.shape)


def take(M: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The matrices of tables ``idx`` (a shared matrix is returned as it is)."""
    return M if M.ndim == 2 else M[idx]


def _totals(C: np.ndarray) -> np.ndarray:
    n = C.reshape(C.shape[0], -1).sum(axis=1)
    if not np.all(np.isfinite(n)) or np.any(n <= 0):
        raise ValueError("every table of the batch needs a positive, finite number of reports")
    return n


def _per_table(n: np.ndarray, ndim: int) -> np.ndarray:
    return n.reshape((-1,) + (1,) * ndim)


def castell_batch(C: np.ndarray, invs: Sequence[np.ndarray]) -> np.ndarray:
    """[Castell Alg. 3] per table: ``(Λ_b/n_b) ×₁ P₁⁻ᵀ … ×_w P_w⁻ᵀ`` (``invs`` = inverses)."""
    n = _totals(C)
    return batch_modes(C, invs) / _per_table(n, C.ndim - 1)


def castell_variance_batch(C: np.ndarray, invs: Sequence[np.ndarray]) -> np.ndarray:
    """Per table and cell, :func:`~.castell.castell_variance`: (Σ_v A[c,v]² λ_v − Π̂_c²)/n."""
    n = _per_table(_totals(C), C.ndim - 1)
    sq = batch_modes(C, [Q * Q for Q in invs]) / n
    est = batch_modes(C, invs) / n
    return np.maximum((sq - est * est) / n, 0.0)


def truncated_batch(C: np.ndarray, invs: Sequence[np.ndarray]) -> np.ndarray:
    """[Castell Alg. 4] per table: Castell clipped at 0, capped along every axis by the clipped
    Castell estimate of the marginal without that axis (see estimators/kernels/truncated.py)."""
    est = np.maximum(castell_batch(C, invs), 0.0)
    w = C.ndim - 1
    if w == 1:
        return est
    for i in range(w):
        rest = [Q for k, Q in enumerate(invs) if k != i]
        low = np.maximum(castell_batch(C.sum(axis=i + 1), rest), 0.0)
        np.minimum(est, np.expand_dims(low, i + 1), out=est)
    return est


def _clip_rescale_rows(X: np.ndarray) -> np.ndarray:
    """:func:`~.proper.clip_rescale` of every row of ``X`` (``(B, N)``)."""
    if not np.all(np.isfinite(X)):
        raise ValueError("clip_rescale: estimate has non-finite cells")
    q = np.maximum(X, 0.0)
    s = q.sum(axis=1, keepdims=True)
    uniform = np.full_like(q, 1.0 / max(q.shape[1], 1))
    return np.where(s > 0, q / np.where(s > 0, s, 1.0), uniform)


def rr_independent_batch(C: np.ndarray, invs: Sequence[np.ndarray]) -> np.ndarray:
    """[Castell Alg. 2] per table: the outer product of the clip-rescaled 1-way estimates."""
    B, w = C.shape[0], C.ndim - 1
    out = None
    for i in range(w):
        others = tuple(k + 1 for k in range(w) if k != i)
        c = C.sum(axis=others) if others else C
        m = _clip_rescale_rows(castell_batch(c, [invs[i]]))
        out = m if out is None else (out[..., None] * m.reshape((B,) + (1,) * i + (-1,)))
    assert out is not None
    return out


@dataclass(frozen=True)
class IBUBatch:
    """Per table: ``estimates`` (``(B, *shape)``, proper), ``iterations`` (EM-map evaluations)
    and ``converged``, as :class:`~.ibu.IBUResult` (no log-likelihood trace)."""

    estimates: np.ndarray
    iterations: np.ndarray
    converged: np.ndarray


class _EMBatch:
    """The EM map of estimators/kernels/ibu.py for a subset of the batch's tables."""

    def __init__(self, C: np.ndarray, mats: Sequence[np.ndarray]) -> None:
        self.shape = C.shape[1:]
        B = C.shape[0]
        self.cnt = C.reshape(B, -1)
        self.n = self.cnt.sum(axis=1)
        self.pos = self.cnt > 0
        self.lam = self.cnt / self.n[:, None]
        self.fwd = list(mats)
        self.bwd = [np.ascontiguousarray(np.swapaxes(P, -1, -2)) for P in mats]

    def __call__(self, idx: np.ndarray, pi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(F(π), ℓ(π)) for the tables ``idx`` (``pi`` is ``(len(idx), N)``)."""
        m = len(idx)
        q = batch_modes(pi.reshape((m,) + self.shape), [take(P, idx) for P in self.fwd]).reshape(m, -1)
        qi = np.maximum(q, 1e-300)
        pos = self.pos[idx]
        loglik = (self.cnt[idx] * np.log(qi)).sum(axis=1)
        ratio = np.where(pos, self.lam[idx] / qi, 0.0)
        back = batch_modes(ratio.reshape((m,) + self.shape),
                           [take(P, idx) for P in self.bwd]).reshape(m, -1)
        new = pi * back
        s = new.sum(axis=1, keepdims=True)
        new = np.where(s > 0, new / np.where(s > 0, s, 1.0), new)
        return new, loglik


def amplification_batch(mats: Sequence[np.ndarray], B: int) -> np.ndarray:
    """:func:`~.ibu.amplification` of every table's channels (``(B,)``)."""
    amp = np.ones(B)
    for M in mats:
        smallest = np.linalg.svd(M, compute_uv=False).min(axis=-1)
        amp = np.where(smallest > 0, amp / np.where(smallest > 0, smallest, 1.0), np.inf)
    return amp


def ibu_batch(C: np.ndarray, mats: Sequence[np.ndarray], invs: Sequence[np.ndarray], *,
              tol: float = 1e-8, max_iter: int = 10000, mix: float = 1e-3,
              support: str = "consistent") -> IBUBatch:
    """:func:`~.ibu.ibu` (SQUAREM-accelerated EM from the RR-Independent start, over the
    consistent support where the channels resolve it) for every table; ``mats`` are the forward
    channels, ``invs`` their inverses (for the start and the support)."""
    C = np.asarray(C, dtype=float)
    _totals(C)
    check_support(support)
    if not tol > 0:
        raise ValueError(f"ibu: tol must be > 0, got {tol!r}")
    max_iter = int(max_iter)
    if max_iter < 1:
        raise ValueError(f"ibu: max_iter must be ≥ 1, got {max_iter!r}")
    B = C.shape[0]
    N = int(np.prod(C.shape[1:]))
    F = _EMBatch(C, mats)
    start = _clip_rescale_rows(rr_independent_batch(C, invs).reshape(B, N))
    pi0 = (1.0 - mix) * start + mix / N
    if support == "consistent":
        keep = truncated_batch(C, invs).reshape(B, N) > 0
        use = (amplification_batch(mats, B) <= MAX_AMPLIFICATION) & keep.any(axis=1)
        pi0[use] = restrict(pi0[use], keep[use])
    evals = np.zeros(B, dtype=np.int64)
    step_max = np.ones(B)
    prev = np.full(B, np.nan)
    converged = np.zeros(B, dtype=bool)
    active = np.ones(B, dtype=bool)
    cycles = 0
    while active.any():
        cycles += 1
        idx = np.flatnonzero(active)
        p0 = pi0[idx]
        if cycles % 16 == 0:
            p0[p0 < _TINY] = 0.0
            pi0[idx] = p0
        pi1, L0 = F(idx, p0)
        evals[idx] += 1
        pv = prev[idx]
        conv = ~np.isnan(pv) & (np.abs(L0 - pv) <= tol * np.abs(L0))
        converged[idx[conv]] = True
        prev[idx] = L0
        plain = ~conv & (evals[idx] >= max_iter)
        pi0[idx[plain]] = pi1[plain]
        acc = ~conv & ~plain
        if acc.any():
            ia = idx[acc]
            a0, a1 = p0[acc], pi1[acc]
            pi2, L1 = F(ia, a1)
            evals[ia] += 1
            r = a1 - a0
            v = pi2 - a1
            v -= r
            sv = np.einsum("ij,ij->i", v, v)
            sr = np.einsum("ij,ij->i", r, r)
            alpha = np.where(sv > 0, np.sqrt(sr / np.where(sv > 0, sv, 1.0)), 1.0)
            alpha = np.minimum(np.maximum(alpha, 1.0), step_max[ia])
            at_max = alpha >= step_max[ia]
            simple = (alpha <= 1.0) | (evals[ia] >= max_iter)
            grow = simple & at_max
            step_max[ia[grow]] *= _MSTEP
            pi0[ia[simple]] = pi2[simple]
            ex = ~simple
            if ex.any():
                ie = ia[ex]
                al = alpha[ex][:, None]
                b0, rr_, vv = a0[ex], r[ex], v[ex]
                ext = b0 + (2.0 * al) * rr_ + (al * al) * vv
                np.maximum(ext, _FLOOR * b0, out=ext)
                ext[ext < _TINY] = 0.0
                ext /= ext.sum(axis=1, keepdims=True)
                pi3, Le = F(ie, ext)
                evals[ie] += 1
                ok = np.isfinite(Le) & (Le >= L1[ex])
                am = at_max[ex]
                pi0[ie[ok]] = pi3[ok]
                step_max[ie[ok & am]] *= _MSTEP
                pi0[ie[~ok]] = pi2[ex][~ok]
                shrink = ie[~ok & am]
                step_max[shrink] = np.maximum(1.0, step_max[shrink] / _MSTEP)
        active = ~converged & (evals < max_iter)
    return IBUBatch(pi0.reshape(C.shape), evals, converged)
