"""RR-Clusters [MDRR §4, Alg. 1]: cluster dependent attributes, RR-Joint inside each cluster,
independence across clusters (docs/mechanisms.md §3).

Clustering (Alg. 1) starts from singletons and walks cluster pairs by descending dependence (the
dependence of two clusters is the maximum over their cross pairs of attributes); it merges the
first pair whose merged cell count is ≤ ``max_cells`` (T_v) and whose dependence is
≥ ``min_dependence`` (T_d), recomputes, and stops when no pair qualifies. Dependence is measured
on the randomized data of an RR-Independent round (:func:`clusters_from_randomized`).

Estimation. Clusters are randomized independently, each by a GRR over its product domain, so a
marginal S splits into *blocks* (S ∩ C for every cluster C it touches) and the channel of S is the
Kronecker product of one GRR per block (a sub-marginal of a product GRR is again a GRR,
:func:`~.rr_joint.submarginal_pq`). With the blocks flattened to one axis each, every Castell
operation is a mode-n product, done here matrix-free (GRR: P⁻ᵀλ = (λ − q·Σλ)/(p − q)):

* :func:`castell_blocks` — Kronecker inversion across blocks (no independence assumed);
* :func:`independent_blocks` — the [MDRR] RR-Clusters estimate: product of the (clip-rescaled)
  block estimates, i.e. independence across clusters;
* :func:`truncated_blocks` — [Castell] Alg. 4 on top of :func:`castell_blocks`;
* :func:`ibu_blocks` — EM / iterative Bayesian update under the block channels.

Singleton clusters may carry any validated channel matrix instead of a GRR (dense block).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ldpstream.estimators.kernels.dependence import dependence_matrix
from ldpstream.estimators.kernels.joint_grr import submarginal_pq

__all__ = ["cluster_dependence", "cluster_attributes", "clusters_from_randomized", "Block",
           "blocks_for", "to_blocks", "from_blocks", "castell_blocks", "castell_blocks_variance",
           "independent_blocks", "truncated_blocks", "ibu_blocks", "BlockIBUResult"]


# --- Alg. 1 -------------------------------------------------------------------------------------

def cluster_dependence(dep: np.ndarray, clusters: Sequence[Sequence[int]]) -> np.ndarray:
    """k×k dependence between clusters: max over cross pairs of attributes (diagonal −inf)."""
    dep = np.asarray(dep, dtype=float)
    k = len(clusters)
    out = np.full((k, k), -np.inf)
    for a in range(k):
        for b in range(a + 1, k):
            out[a, b] = out[b, a] = dep[np.ix_(list(clusters[a]), list(clusters[b]))].max()
    return out


def cluster_attributes(dep: np.ndarray, sizes: Sequence[int], max_cells: int,
                       min_dependence: float) -> list[tuple[int, ...]]:
    """[MDRR] Alg. 1 on a pairwise dependence matrix ``dep`` of attributes with domain ``sizes``.

    Returns clusters as sorted tuples of attribute positions, ordered by their first attribute.
    Ties in dependence are broken by the smaller pair of cluster indices (deterministic).
    """
    dep = np.asarray(dep, dtype=float)
    m = len(sizes)
    if dep.shape != (m, m):
        raise ValueError(f"dependence matrix is {dep.shape}, expected {(m, m)}")
    cells = [int(s) for s in sizes]
    clusters: list[tuple[int, ...]] = [(i,) for i in range(m)]
    while len(clusters) > 1:
        cd = cluster_dependence(dep, clusters)
        a_idx, b_idx = np.triu_indices(len(clusters), k=1)
        vals = cd[a_idx, b_idx]
        order = np.lexsort((b_idx, a_idx, -vals))  # descending dependence, then index order
        merged = False
        for t in order:
            if vals[t] < min_dependence:
                break
            a, b = int(a_idx[t]), int(b_idx[t])
            size = int(np.prod([cells[i] for i in clusters[a] + clusters[b]], dtype=np.int64))
            if size <= max_cells:
                new = tuple(sorted(clusters[a] + clusters[b]))
                clusters = [c for i, c in enumerate(clusters) if i not in (a, b)] + [new]
                clusters.sort(key=lambda c: c[0])
                merged = True
                break
        if not merged:
            break
    return clusters


def clusters_from_randomized(randomized: np.ndarray, sizes: Sequence[int], max_cells: int,
                             min_dependence: float, kinds: str | Sequence[str] = "nominal"
                             ) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """Alg. 1 with dependence measured on RR-Independent randomized records [MDRR §4.1].
    Returns ``(clusters, dependence matrix)``."""
    dep = dependence_matrix(randomized, sizes, kinds)
    return cluster_attributes(dep, sizes, max_cells, min_dependence), dep


# --- block channels -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    """The channel of one block (a flattened group of attributes): a GRR(p, q) over ``size``
    cells, or a dense row-stochastic ``matrix``."""

    size: int
    p: float = float("nan")
    q: float = float("nan")
    matrix: np.ndarray | None = None

    @classmethod
    def grr(cls, p: float, q: float, size: int) -> "Block":
        return cls(int(size), float(p), float(q))

    @classmethod
    def dense(cls, matrix: np.ndarray) -> "Block":
        m = np.asarray(matrix, dtype=float)
        return cls(int(m.shape[0]), matrix=m)

    def to_matrix(self) -> np.ndarray:
        if self.matrix is not None:
            return self.matrix
        return (self.p - self.q) * np.eye(self.size) + self.q

    def inv_t(self, t: np.ndarray, axis: int) -> np.ndarray:
        """Apply P⁻ᵀ along ``axis``."""
        if self.matrix is None:
            return (t - self.q * t.sum(axis=axis, keepdims=True)) / (self.p - self.q)
        return _mode(np.linalg.inv(self.matrix).T, t, axis)

    def fwd_t(self, t: np.ndarray, axis: int) -> np.ndarray:
        """Apply Pᵀ along ``axis`` (true distribution → distribution of randomized values)."""
        if self.matrix is None:
            return (self.p - self.q) * t + self.q * t.sum(axis=axis, keepdims=True)
        return _mode(self.matrix.T, t, axis)

    def back(self, t: np.ndarray, axis: int) -> np.ndarray:
        """Apply P along ``axis`` (the EM back-projection)."""
        if self.matrix is None:
            return self.fwd_t(t, axis)  # GRR is symmetric
        return _mode(self.matrix, t, axis)


def _mode(M: np.ndarray, t: np.ndarray, axis: int) -> np.ndarray:
    """Mode-n product: out[..., i, ...] = Σ_j M[i, j] t[..., j, ...]."""
    return np.moveaxis(np.tensordot(M, t, axes=([1], [axis])), 0, axis)


def blocks_for(attrs: Sequence[str], clusters: Sequence[Sequence[str]],
               shape_of: dict[str, int], cluster_pq: Sequence[tuple[float, float]],
               dense: dict[str, np.ndarray] | None = None
               ) -> tuple[list[tuple[str, ...]], list[Block]]:
    """Split the marginal ``attrs`` into blocks (S ∩ C, attributes in ``attrs`` order, blocks in
    order of first appearance) with the GRR each cluster induces on its block; ``dense`` maps an
    attribute of a singleton cluster to its own channel matrix."""
    groups: list[tuple[str, ...]] = []
    blocks: list[Block] = []
    owner = {a: i for i, c in enumerate(clusters) for a in c}
    seen: list[int] = []
    for a in attrs:
        if a not in owner:
            raise KeyError(f"attribute {a!r} is in no cluster")
        if owner[a] not in seen:
            seen.append(owner[a])
    for ci in seen:
        group = tuple(a for a in attrs if owner[a] == ci)
        cluster = clusters[ci]
        size_g = int(np.prod([shape_of[a] for a in group], dtype=np.int64))
        if dense is not None and len(cluster) == 1 and cluster[0] in dense:
            blocks.append(Block.dense(dense[cluster[0]]))
        else:
            size_c = int(np.prod([shape_of[a] for a in cluster], dtype=np.int64))
            p, q = submarginal_pq(*cluster_pq[ci], size_c, size_g)
            blocks.append(Block.grr(p, q, size_g))
        groups.append(group)
    return groups, blocks


def to_blocks(t: np.ndarray, attrs: Sequence[str], groups: Sequence[Sequence[str]]) -> np.ndarray:
    """Transpose a table over ``attrs`` so each group is contiguous and flatten each group."""
    attrs = list(attrs)
    sizes = [int(np.prod([t.shape[attrs.index(a)] for a in g], dtype=np.int64)) for g in groups]
    t = np.transpose(t, [attrs.index(a) for g in groups for a in g])
    return t.reshape(sizes)


def from_blocks(t: np.ndarray, attrs: Sequence[str], groups: Sequence[Sequence[str]],
                shape_of: dict[str, int]) -> np.ndarray:
    """Inverse of :func:`to_blocks`."""
    flat = [a for g in groups for a in g]
    t = t.reshape([shape_of[a] for a in flat])
    return np.transpose(t, [flat.index(a) for a in attrs])


def castell_blocks(counts: np.ndarray, blocks: Sequence[Block]) -> np.ndarray:
    """Π̂ = Λ ×₁ P₁⁻ᵀ … ×_k P_k⁻ᵀ on a blocked count table (may be negative; sums to 1)."""
    lam = np.asarray(counts, dtype=float)
    n = lam.sum()
    if n <= 0:
        raise ValueError("no reports counted")
    est = lam / n
    for axis, b in enumerate(blocks):
        est = b.inv_t(est, axis)
    return est


def independent_blocks(counts: np.ndarray, blocks: Sequence[Block]) -> np.ndarray:
    """[MDRR] RR-Clusters estimate: outer product over blocks of each block's clip-rescaled
    estimate (independence across clusters)."""
    lam = np.asarray(counts, dtype=float)
    k = lam.ndim
    out = np.ones(())
    for axis, b in enumerate(blocks):
        marg = lam.sum(axis=tuple(i for i in range(k) if i != axis))
        est = np.clip(castell_blocks(marg, [b]), 0, None)
        s = est.sum()
        est = est / s if s > 0 else np.full(b.size, 1.0 / b.size)
        out = np.multiply.outer(out, est)
    return out


def castell_blocks_variance(counts: np.ndarray, blocks: Sequence[Block]) -> np.ndarray:
    """Per-cell variance of :func:`castell_blocks` (plug-in multinomial
    covariance): (Σ_v A[c,v]² λ_v − Π̂_c²)/n with A the Kronecker inverse; for a GRR block
    A∘A = a·I + b·J with a = ((1−q)² − q²)/(p−q)², b = q²/(p−q)²."""
    lam = np.asarray(counts, dtype=float)
    n = lam.sum()
    lam = lam / n
    second = lam
    for axis, b in enumerate(blocks):
        if b.matrix is None:
            d = b.p - b.q
            a_, b_ = ((1 - b.q) ** 2 - b.q ** 2) / d ** 2, b.q ** 2 / d ** 2
            second = a_ * second + b_ * second.sum(axis=axis, keepdims=True)
        else:
            A2 = np.linalg.inv(b.matrix).T ** 2
            second = np.moveaxis(np.tensordot(A2, second, axes=([1], [axis])), 0, axis)
    est = castell_blocks(counts, blocks)
    return np.maximum((second - est * est) / n, 0.0)


def truncated_blocks(estimate: np.ndarray) -> np.ndarray:
    """[Castell] Alg. 4 from an (unblocked, attribute-shaped) Castell estimate Π̂: Π₀ = max(Π̂, 0),
    then Π_i = min(Π_{i−1}, max(Π̂ summed over axis i, 0)) for every axis. Summing a Castell
    estimate over an axis gives exactly the Castell estimate of the lower marginal (P1 = 1)."""
    est = np.asarray(estimate, dtype=float)
    out = np.clip(est, 0, None)
    if est.ndim < 2:
        return out
    for axis in range(est.ndim):
        lower = np.clip(est.sum(axis=axis, keepdims=True), 0, None)
        out = np.minimum(out, lower)
    return out


@dataclass(frozen=True)
class BlockIBUResult:
    estimate: np.ndarray
    iterations: int
    converged: bool


def ibu_blocks(counts: np.ndarray, blocks: Sequence[Block], *, tol: float = 1e-8,
               max_iter: int = 10000, init: str = "castell") -> BlockIBUResult:
    """EM / iterative Bayesian update under the block channels (plain EM, no acceleration):
    Π ← Π ⊙ ((Λ/n ⊘ (Π ×ₖ Pₖᵀ)) ×ₖ Pₖ). Same stopping rule as :func:`~.ibu.ibu`: the relative
    change of the log-likelihood Σ Λ·ln(Π ×ₖ Pₖᵀ) between iterations is ≤ ``tol``."""
    lam = np.asarray(counts, dtype=float)
    n = lam.sum()
    if n <= 0:
        raise ValueError("no reports counted")
    lam = lam / n
    if init == "castell":
        pi = np.clip(castell_blocks(lam, blocks), 0, None)
        pi = pi / pi.sum() * (1 - 1e-3) + 1e-3 / pi.size  # keep every cell movable
    elif init == "uniform":
        pi = np.full(lam.shape, 1.0 / lam.size)
    else:
        raise ValueError(f"init must be 'castell' or 'uniform', got {init!r}")
    pos = lam > 0
    prev = None
    for it in range(1, int(max_iter) + 1):
        fwd = pi
        for axis, b in enumerate(blocks):
            fwd = b.fwd_t(fwd, axis)
        loglik = float(n * (lam[pos] * np.log(np.maximum(fwd[pos], 1e-300))).sum())
        if prev is not None and abs(loglik - prev) <= tol * abs(loglik):
            return BlockIBUResult(pi, it - 1, True)
        prev = loglik
        ratio = np.divide(lam, fwd, out=np.zeros_like(lam), where=fwd > 0)
        for axis, b in enumerate(blocks):
            ratio = b.back(ratio, axis)
        pi = pi * ratio
        pi /= pi.sum()
    return BlockIBUResult(pi, int(max_iter), False)
