"""Consistent RRBA tables across views ([RRBA] §4.3, docs/mechanisms.md §4) and the maximum-entropy
combination of consistent low-order tables into a higher-order one.

Least squares: minimise Σ_S ‖T_S − T̂_S‖² subject to A·x = b, where the rows of A say "every
marginal shared by two tables is equal" and "every table sums to 1". The KKT system
[[I, Aᵀ], [A, 0]]·[x; λ] = [x̂; b] is solved through its Schur complement
(A·Aᵀ)·λ = A·x̂ − b (pivoted Cholesky: the equality rows are redundant, and every solution λ
gives the same x = x̂ − Aᵀ·λ).
Non-negativity is then restored exactly, as the solution of the same LS with x ≥ 0 added (a
convex QP), by a semismooth Newton method on its dual (x(ν) = max(x̂ − Aᵀν, 0); Newton steps on
A·x(ν) = b with the generalized Jacobian A·D·Aᵀ and an exact line search on the piecewise-quadratic
dual), started from the equality-only multipliers; about 10–15 iterations on Adult-sized
problems. (Dykstra's alternating projections, which converge to the same point slowly, are the
fallback.) The result is not a clipped copy: it stays consistent.

>>> t1 = np.array([[0.3, 0.2], [0.1, 0.4]])          # attributes (a, b)
>>> t2 = np.array([[0.6, 0.0], [0.2, 0.2]])          # attributes (a, c): a-marginal 0.6/0.4
>>> out = consistent_tables([(("a", "b"), t1), (("a", "c"), t2)])
>>> np.allclose(out[0].sum(axis=1), out[1].sum(axis=1)), round(float(out[0].sum()), 9)
(True, 1.0)
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy import sparse
from scipy.linalg import cho_factor, cho_solve, lapack, solve_triangular

__all__ = ["consistency_system", "project_affine", "consistent_tables", "marginal_of",
           "maxent_table"]

Table = tuple[tuple, np.ndarray]


def marginal_of(attrs: Sequence, table: np.ndarray, sub: Sequence) -> np.ndarray:
    """Sum ``table`` (axes named by ``attrs``) down to the attributes ``sub``, in that order."""
    attrs, sub = list(attrs), list(sub)
    keep = [attrs.index(a) for a in sub]
    drop = tuple(i for i in range(len(attrs)) if i not in keep)
    out = table.sum(axis=drop) if drop else table
    remaining = [i for i in range(len(attrs)) if i in keep]
    return np.transpose(out, [remaining.index(i) for i in keep])


def _marginal_rows(attrs: Sequence, shape: Sequence[int], sub: Sequence) -> tuple[np.ndarray, int]:
    """For every cell of ``table`` (raveled), the raveled cell of its ``sub``-marginal; and the
    number of marginal cells."""
    size = int(np.prod(shape))
    cells = np.indices(shape).reshape(len(shape), size)
    attrs = list(attrs)
    sub_shape = [shape[attrs.index(a)] for a in sub]
    rows = np.ravel_multi_index(tuple(cells[attrs.index(a)] for a in sub), sub_shape)
    return rows, int(np.prod(sub_shape))


def consistency_system(tables: Sequence[Table]) -> tuple[sparse.csc_array, np.ndarray, list[int]]:
    """(A, b, offsets): the equality constraints over the concatenated raveled tables (A sparse).

    For every attribute set I that is the intersection of two tables' attributes, all tables
    containing I are tied to the first of them on their I-marginal; plus one sum-to-1 row per
    table. ``offsets[i]`` is where table i starts in x."""
    attrs = [tuple(a) for a, _ in tables]
    shapes = [np.shape(t) for _, t in tables]
    offsets = [int(o) for o in np.cumsum([0] + [int(np.prod(s)) for s in shapes])]
    n = offsets[-1]
    inter = set()
    for i in range(len(attrs)):
        for j in range(i + 1, len(attrs)):
            shared = tuple(a for a in attrs[i] if a in attrs[j])
            if shared:
                inter.add(tuple(sorted(shared, key=str)))
    R, C, V, rhs = [], [], [], []
    row0 = 0
    for I in sorted(inter, key=lambda s: (len(s), [str(a) for a in s])):
        holders = [i for i in range(len(attrs)) if set(I) <= set(attrs[i])]
        r0, size = _marginal_rows(attrs[holders[0]], shapes[holders[0]], I)
        for h in holders[1:]:
            rh, _ = _marginal_rows(attrs[h], shapes[h], I)
            R += [row0 + r0, row0 + rh]
            C += [offsets[holders[0]] + np.arange(len(r0)), offsets[h] + np.arange(len(rh))]
            V += [np.ones(len(r0)), -np.ones(len(rh))]
            rhs.append(np.zeros(size))
            row0 += size
    for i in range(len(attrs)):
        width = offsets[i + 1] - offsets[i]
        R.append(np.full(width, row0))
        C.append(offsets[i] + np.arange(width))
        V.append(np.ones(width))
        rhs.append(np.ones(1))
        row0 += 1
    A = sparse.coo_array((np.concatenate(V), (np.concatenate(R), np.concatenate(C))),
                         shape=(row0, n)).tocsc()
    return A, np.concatenate(rhs), offsets


def _solve_gram(M: np.ndarray, r: np.ndarray) -> np.ndarray:
    """A solution of the consistent symmetric PSD system M·y = r (M = A·Aᵀ, rank-deficient
    because the equality rows are redundant): pivoted Cholesky PᵀMP = UᵀU with rank detection,
    the free components set to 0. Every solution gives the same Aᵀ·y, hence the same x."""
    c, piv, rank, info = lapack.dpstrf(M, lower=0)
    if info < 0:  # pragma: no cover - LAPACK argument error
        raise ValueError(f"dpstrf failed (info={info})")
    piv = piv - 1
    U = np.triu(c[:rank, :rank])
    z = solve_triangular(U, solve_triangular(U, r[piv[:rank]], trans="T"))
    y = np.zeros(M.shape[0])
    y[piv[:rank]] = z
    return y


def _gram(A) -> np.ndarray:
    G = A @ A.T
    return G.toarray() if sparse.issparse(G) else G


def project_affine(x: np.ndarray, A, b: np.ndarray) -> np.ndarray:
    """Euclidean projection of x onto {A·x = b}: the KKT solution x − Aᵀ(AAᵀ)⁺(Ax − b)."""
    return x - A.T @ _solve_gram(_gram(A), A @ x - b)


def _exact_step(c: np.ndarray, d: np.ndarray, db: float) -> float:
    """argmax_t θ(ν + t·Δ) for the piecewise-quadratic concave dual: the root of the
    non-increasing piecewise-linear φ'(t) = dᵀ·max(c − t·d, 0) − Δᵀb (c = x̂ − Aᵀν, d = AᵀΔ),
    found by bisection over the sorted breakpoints c_i/d_i and linear interpolation."""
    def dphi(t: float) -> float:
        return float(d @ np.maximum(c - t * d, 0.0) - db)

    nz = d != 0
    bp = np.unique(c[nz] / d[nz])
    bp = bp[bp > 0]
    if len(bp) == 0 or dphi(bp[-1]) > 0:          # past the last kink φ' is linear
        t0 = float(bp[-1]) if len(bp) else 0.0
        f0, f1 = dphi(t0), dphi(t0 + 1.0)
        return t0 + f0 / (f0 - f1) if f0 > f1 else max(t0, 1.0)
    if dphi(bp[0]) <= 0:
        a, b = 0.0, float(bp[0])
    else:
        i, j = 0, len(bp) - 1                      # φ'(bp[i]) > 0 ≥ φ'(bp[j])
        while j - i > 1:
            mid = (i + j) // 2
            if dphi(bp[mid]) > 0:
                i = mid
            else:
                j = mid
        a, b = float(bp[i]), float(bp[j])
    fa, fb = dphi(a), dphi(b)
    return a + fa * (b - a) / (fa - fb) if fa > fb else a


def _semismooth_newton(x_hat: np.ndarray, A, b: np.ndarray, tol: float,
                       max_iter: int) -> np.ndarray | None:
    """Projection of x̂ onto {A·x = b, x ≥ 0} through its dual: x(ν) = max(x̂ − Aᵀν, 0) maximises
    the concave θ(ν) = ½‖x(ν) − x̂‖² + νᵀ(A·x(ν) − b), whose gradient is A·x(ν) − b. Newton
    directions from the generalized Hessian −A·D·Aᵀ (D = the free cells, plus a 1e-10 ridge
    that keeps it definite where the equality rows are redundant) and an exact line search on
    the piecewise-quadratic θ; stops when A·x(ν) = b within ``tol``. None if it does not."""
    nu = _solve_gram(_gram(A), A @ x_hat - b)          # the equality-only KKT multipliers
    for _ in range(max_iter):
        c = x_hat - A.T @ nu
        x = np.maximum(c, 0.0)
        g = A @ x - b
        if np.max(np.abs(g)) < tol:
            return x
        M = _gram(A[:, c > 0])
        M[np.diag_indices_from(M)] += 1e-10
        step = cho_solve(cho_factor(M), g)
        nu = nu + _exact_step(c, A.T @ step, float(step @ b)) * step
    return None


def _dykstra(x_hat: np.ndarray, A: np.ndarray, b: np.ndarray, tol: float,
             max_iter: int) -> np.ndarray:
    G = np.linalg.pinv(_gram(A))
    z, p_aff, q_pos = x_hat.copy(), np.zeros_like(x_hat), np.zeros_like(x_hat)
    for _ in range(max_iter):
        r = z + p_aff
        y = r - A.T @ (G @ (A @ r - b))
        p_aff = r - y
        z_new = np.maximum(y + q_pos, 0.0)
        q_pos = y + q_pos - z_new
        done = np.max(np.abs(A @ z_new - b)) < tol and np.max(np.abs(z_new - z)) < tol
        z = z_new
        if done:
            break
    return z


def consistent_tables(tables: Sequence[Table], nonnegative: bool = True, tol: float = 1e-12,
                      max_iter: int = 100) -> list[np.ndarray]:
    """Least-squares consistent versions of ``tables`` (list of (attrs, array)), [RRBA] §4.3.

    With ``nonnegative`` the result solves the LS with x ≥ 0 added (semismooth Newton on the dual;
    Dykstra as the fallback)."""
    if not tables:
        return []
    A, b, off = consistency_system(tables)
    x_hat = np.concatenate([np.asarray(t, dtype=float).ravel() for _, t in tables])
    x = project_affine(x_hat, A, b)
    if nonnegative and np.any(x < -tol):
        sol = _semismooth_newton(x_hat, A, b, 1e-11, max_iter)
        x = sol if sol is not None else _dykstra(x_hat, A, b, 1e-10, 20000)
    elif nonnegative:
        x = np.maximum(x, 0.0)
    return [x[off[i]:off[i + 1]].reshape(np.shape(t)) for i, (_, t) in enumerate(tables)]


def maxent_table(attrs: Sequence, shape: Sequence[int], marginals: Sequence[Table],
                 max_iter: int = 200, tol: float = 1e-9) -> tuple[np.ndarray, int]:
    """Maximum-entropy table over ``attrs`` matching the given marginals (iterative proportional
    fitting from the uniform table). Returns (table, iterations). Marginals over attribute sets
    not contained in ``attrs`` are rejected."""
    attrs = list(attrs)
    table = np.full(tuple(shape), 1.0 / int(np.prod(shape)))
    for sub, _ in marginals:
        if not set(sub) <= set(attrs):
            raise ValueError(f"marginal over {sub} is not inside {attrs}")
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 - the count is returned after the loop
        prev = table.copy()
        for sub, target in marginals:
            sub = list(sub)
            cur = marginal_of(attrs, table, sub)
            ratio = np.divide(target, cur, out=np.zeros_like(cur, dtype=float), where=cur > 0)
            # broadcast ratio (axes ordered as sub) back onto the table's axes
            order = sorted(range(len(sub)), key=lambda i: attrs.index(sub[i]))
            r = np.transpose(ratio, order)
            expand = [attrs.index(sub[i]) for i in order]
            bshape = [table.shape[i] if i in expand else 1 for i in range(len(attrs))]
            table = table * r.reshape(bshape)
        if np.max(np.abs(table - prev)) < tol:
            break
    s = table.sum()
    return (table / s if s > 0 else table), it
