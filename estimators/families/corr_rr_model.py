"""The linear model of Corr-RR (docs/corr-rr.md): one copy table's phases as a linear channel
(:class:`PhaseModel`: shapes, ε, n₁, n₂, the copy channels and their moments) and the combination
of both phases' unbiased estimators (:class:`Combined`). The estimator (corr_rr.py) and its
bootstrap bounds (corr_rr_bounds.py) both build on it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import special

from ldpstream.estimators.kernels import channels as ch
from ldpstream.estimators.kernels.linalg import blockdiag, contrast, spd_inv
from ldpstream.estimators.kernels.proper import clip_rescale


@dataclass
class Combined:
    """The parts of a corr-rr estimate (flattened over attributes, domain order). ``weight``
    (per attribute): the weight of the pooled mean (pooled path) or of the Phase II decode D
    (three-source path); ``extra`` holds the fitted τ² or all three weights and the per-cell
    MSE estimates ``mse_cells``."""

    unbiased: np.ndarray
    decode: np.ndarray
    weight: np.ndarray
    estimate: np.ndarray
    cov_unbiased: np.ndarray
    mse_estimate: float
    bias2_estimate: float
    extra: dict[str, Any] = field(default_factory=dict)
    #: (K1, K2): U = u + K1(f̂ᴵ − u) + K2(λ̂ − Hu) at the final plug-in (the bound's draws)
    gains: tuple[np.ndarray, np.ndarray] | None = None


class PhaseModel:
    """The linear model of one copy table: shapes, ε, n₁, n₂ and the copy channels M[j][k]."""

    def __init__(self, shape: Sequence[int], eps: float, n1: float, n2: float,
                 M: Sequence[Sequence[np.ndarray | None]]) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.m = len(self.shape)
        self.eps = float(eps)
        self.n1, self.n2 = float(n1), float(n2)
        self.n = self.n1 + self.n2
        self.off = np.concatenate([[0], np.cumsum(self.shape)]).astype(int)
        self.D = int(self.off[-1])
        self.P1 = [ch.grr(self.eps / self.m, d) for d in self.shape]
        self.P2 = [ch.grr(self.eps, d) for d in self.shape]
        self.pq1 = [ch.grr_pq(self.eps / self.m, d) for d in self.shape]
        self.pq2 = [ch.grr_pq(self.eps, d) for d in self.shape]
        m = self.m
        # Mbig_j = [M_j1 | … | M_jm] with M_jj = I
        self.Mbig = []
        for j in range(m):
            blocks = [np.eye(self.shape[j]) if k == j else np.asarray(M[j][k], dtype=float)
                      for k in range(m)]
            self.Mbig.append(np.hstack(blocks))
        H = np.zeros((self.D, self.D))
        for j in range(m):
            sj = slice(self.off[j], self.off[j + 1])
            H[:, sj] = (self.Mbig[j].T @ self.P2[j].T) / m
        self.H = H
        self.Q = blockdiag([contrast(d) for d in self.shape])
        self.u = np.concatenate([np.full(d, 1.0 / d) for d in self.shape])
        self.delta2 = np.concatenate([np.full(d, p - q) for d, (p, q) in zip(self.shape, self.pq2)])
        self.q2 = np.concatenate([np.full(d, q) for d, (p, q) in zip(self.shape, self.pq2)])
        self.omega = np.concatenate([np.full(d, 1.0 / (m * d)) for d in self.shape])

    # -- pieces ----------------------------------------------------------------------------------
    def split(self, v: np.ndarray) -> list[np.ndarray]:
        return [v[self.off[k]:self.off[k + 1]] for k in range(self.m)]

    def lam(self, f: np.ndarray) -> np.ndarray:
        return self.H @ f

    def cov1(self, f: np.ndarray) -> np.ndarray:
        """Cov of the Phase I (SPL) decode f̂ᴵ (block diagonal, i.i.d. users)."""
        if self.n1 <= 0:
            return np.zeros((self.D, self.D))
        blocks = []
        for k, (p, q) in enumerate(self.pq1):
            g = self.P1[k].T @ f[self.off[k]:self.off[k + 1]]
            blocks.append((np.diag(g) - np.outer(g, g)) / (self.n1 * (p - q) ** 2))
        return blockdiag(blocks)

    def cov2(self, f: np.ndarray) -> np.ndarray:
        """Cov of the Phase II column frequencies λ̂ (exact for i.i.d. users)."""
        E = np.zeros((self.D, self.D))
        for j in range(self.m):
            g = self.P2[j].T @ f[self.off[j]:self.off[j + 1]]
            E += (self.Mbig[j].T * g) @ self.Mbig[j]
        E /= self.m
        lam = self.lam(f)
        for k in range(self.m):
            s = slice(self.off[k], self.off[k + 1])
            E[s, s] = np.diag(lam[s])
        return (E - np.outer(lam, lam)) / max(self.n2, 1.0)

    # -- GLS ---------------------------------------------------------------------------------------
    def gls(self, fw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                           np.ndarray]:
        """(K1, K2, Σ1, Σ2, Cov U) with U = u + K1(f̂ᴵ − u) + K2(λ̂ − Hu), weights at ``fw``."""
        Q = self.Q
        S1, S2 = self.cov1(fw), self.cov2(fw)
        G = Q.T @ self.H @ Q
        R2 = Q.T @ S2 @ Q
        R2i = spd_inv(R2)
        info = G.T @ R2i @ G
        if self.n1 > 0:
            R1i = spd_inv(Q.T @ S1 @ Q)
            info = info + R1i
        else:
            R1i = np.zeros_like(info)
        C = spd_inv(info)
        K1 = Q @ C @ R1i @ Q.T
        K2 = Q @ C @ G.T @ R2i @ Q.T
        cov = K1 @ S1 @ K1.T + K2 @ S2 @ K2.T
        return K1, K2, S1, S2, cov

    def information(self, fw: np.ndarray) -> np.ndarray:
        """C⁻¹ = R₁⁻¹ + GᵀR₂⁻¹G: the information of the GLS estimate in sum-zero coordinates at
        the plug-in ``fw`` (Phase I and Phase II column frequencies)."""
        Q = self.Q
        G = Q.T @ self.H @ Q
        info = G.T @ spd_inv(Q.T @ self.cov2(fw) @ Q) @ G
        if self.n1 > 0:
            info = info + spd_inv(Q.T @ self.cov1(fw) @ Q)
        return 0.5 * (info + info.T)

    def unbiased(self, f1: np.ndarray, lam: np.ndarray, fw: np.ndarray
                 ) -> tuple[np.ndarray, tuple]:
        K1, K2, S1, S2, cov = self.gls(fw)
        U = self.u + (K1 @ (f1 - self.u) if self.n1 > 0 else 0.0) + K2 @ (lam - self.H @ self.u)
        return U, (K1, K2, S1, S2, cov)

    # -- the published decode ------------------------------------------------------------------------
    def decode(self, f1: np.ndarray | None, lam: np.ndarray) -> np.ndarray:
        d2 = (lam - self.q2) / self.delta2
        if f1 is None or self.n1 <= 0:
            return d2
        return (self.n1 * f1 + self.n2 * d2) / self.n

    def decode_affine(self) -> tuple[np.ndarray, np.ndarray, float, float]:
        """(T, t0, w1, w2): E[B] = T f + t0, B = w1 f̂ᴵ + w2 (λ̂ − q)/Δ."""
        w1 = self.n1 / self.n if self.n1 > 0 else 0.0
        w2 = 1.0 - w1
        T = w1 * np.eye(self.D) + w2 * (self.H / self.delta2[:, None])
        t0 = -w2 * self.q2 / self.delta2
        return T, t0, w1, w2

    # -- combination ---------------------------------------------------------------------------------
    def source_cov(self, gl: tuple) -> dict[str, np.ndarray]:
        """Per-cell variances and covariances of the three estimates of every marginal:
        P = f̂ᴵ (Phase I, SPL decode), D = (λ̂ − q)/Δ (Phase II column read as GRR(ε), the
        published decode without Phase I) and U (GLS). P and D come from disjoint users."""
        K1, K2, S1, S2, covU = gl
        Dg = 1.0 / self.delta2
        z = np.zeros(self.D)
        return {"PP": np.diag(S1).copy(), "DD": np.diag(S2) * Dg ** 2, "UU": np.diag(covU).copy(),
                "PD": z, "PU": np.einsum("ij,ij->i", S1, K1),
                "DU": Dg * np.einsum("ij,ij->i", S2, K2)}

    def decode_bias_map(self) -> tuple[np.ndarray, np.ndarray]:
        """(A, a0): the bias of D is A f + a0 (A = H/Δ − I, a0 = −q/Δ; exact for any table)."""
        return self.H / self.delta2[:, None] - np.eye(self.D), -self.q2 / self.delta2

    _SRC = ("P", "D", "U")

    def _source_matrix(self, cv: Mapping[str, np.ndarray], s: slice, b2: np.ndarray
                       ) -> np.ndarray:
        om = self.omega[s]
        M = np.empty((3, 3))
        for i, a in enumerate(self._SRC):
            for j, b in enumerate(self._SRC):
                key = a + b if a + b in cv else b + a
                M[i, j] = float(om @ cv[key][s])
        M[1, 1] += float(om @ b2[s])
        return M

    @staticmethod
    def simplex_weights(M: np.ndarray) -> np.ndarray:
        """argmin wᵀMw over w ≥ 0, Σw = 1 (every support of a 3-vector tried; closed form on
        each)."""
        best, bw = np.inf, None
        n = len(M)
        for mask in range(1, 1 << n):
            idx = [i for i in range(n) if mask >> i & 1]
            A = M[np.ix_(idx, idx)]
            try:
                x = np.linalg.solve(A + 1e-300 * np.eye(len(idx)), np.ones(len(idx)))
            except np.linalg.LinAlgError:
                continue
            if x.sum() <= 0 or np.any(x < -1e-12):
                continue
            w = np.zeros(n)
            w[idx] = np.clip(x, 0, None) / np.clip(x, 0, None).sum()
            v = float(w @ M @ w)
            if v < best - 1e-300:
                best, bw = v, w
        if bw is None:  # degenerate: fall back to the unbiased estimate
            bw = np.array([0.0, 0.0, 1.0])
        return bw

    def source_weights(self, cv: Mapping[str, np.ndarray], b2: np.ndarray) -> np.ndarray:
        """m×3 weights on (P, D, U) per attribute minimising the eq. 5 MSE, given the per-cell
        squared bias ``b2`` of D."""
        return np.array([self.simplex_weights(self._source_matrix(
            cv, slice(self.off[k], self.off[k + 1]), b2)) for k in range(self.m)])

    def _mix(self, W: np.ndarray, P: np.ndarray, Dd: np.ndarray, U: np.ndarray) -> np.ndarray:
        Wc = np.repeat(W, self.shape, axis=0)
        return Wc[:, 0] * P + Wc[:, 1] * Dd + Wc[:, 2] * U

    def _mse_cells(self, W: np.ndarray, cv: Mapping[str, np.ndarray], b2: np.ndarray
                   ) -> np.ndarray:
        Wc = np.repeat(W, self.shape, axis=0)
        out = b2 * Wc[:, 1] ** 2
        for i, a in enumerate(self._SRC):
            for j, b in enumerate(self._SRC):
                key = a + b if a + b in cv else b + a
                out = out + Wc[:, i] * Wc[:, j] * cv[key]
        return out

    #: a bias of D is acted on only if the pooled Σω·b̂² is significant at this level under "no
    #: bias" (a false alarm puts weight on the far noisier U); then per cell ω(b̂² − Var b̂)
    alpha: float = 1e-2

    def bias2(self, bhat: np.ndarray, V: np.ndarray) -> np.ndarray:
        """Per-cell ω·b² estimates from b̂ ~ N(b, V): zero unless the pooled quadratic form
        Q = Σω b̂² exceeds the (1 − α) quantile of its no-bias law (Satterthwaite: g·χ²_h with
        g = tr((ΩV)²)/tr(ΩV), h = tr(ΩV)²/tr((ΩV)²)); else the unbiased per-cell ω(b̂² − V_ii)."""
        OV = self.omega[:, None] * V
        Q = float(self.omega @ bhat ** 2)
        t1 = float(np.trace(OV))
        t2 = float(np.sum(OV * OV.T))
        if t1 <= 0 or t2 <= 0:
            return self.omega * bhat ** 2
        g, h = t2 / t1, t1 * t1 / t2
        if Q <= g * 2.0 * special.gammaincinv(h / 2.0, 1 - self.alpha):  # χ²_h quantile
            return np.zeros_like(bhat)
        return self.omega * (bhat ** 2 - np.diag(V))

    def combine(self, f1: np.ndarray | None, lam: np.ndarray) -> Combined:
        """Three-source estimate (any domain sizes): per attribute, the weights on P, D and U
        (non-negative, summing to 1) that minimise the estimated eq. 5 MSE, D's squared bias
        estimated from U (:meth:`bias2`). Variance weights throughout: the GLS inside U, and
        Phase I against Phase II in the mix (the published count weights n₁/n, n₂/n are not
        used). Two passes: covariances at the proper published decode, then at the first
        estimate."""
        B = self.decode(f1, lam)
        f1v = f1 if f1 is not None else self.u
        Dd = (lam - self.q2) / self.delta2
        A, a0 = self.decode_bias_map()
        fw = np.concatenate([clip_rescale(b) for b in self.split(B)])
        for _ in range(2):
            U, gl = self.unbiased(f1v, lam, fw)
            cv = self.source_cov(gl)
            if self.n1 <= 0:  # no Phase I: P gets no weight
                cv["PP"] = np.full(self.D, 1e300)
            bhat = A @ U + a0
            V = A @ gl[4] @ A.T
            b2 = self.bias2(bhat, V) / self.omega
            W = self.source_weights(cv, np.maximum(b2, 0.0))
            est = self._mix(W, f1v, Dd, U)
            fw = np.concatenate([clip_rescale(x) for x in self.split(est)])
        b2u = np.maximum(bhat ** 2 - np.diag(V), 0.0)  # unbiased per cell, floored
        cells = self._mse_cells(W, cv, b2u)
        return Combined(U, B, W[:, 1], est, gl[4], float(self.omega @ cells),
                        float(self.omega @ b2u),
                        {"weights": {s: W[:, i].tolist() for i, s in
                                     enumerate(("phase1", "decode", "unbiased"))},
                         "mse_unbiased": float(self.omega @ cv["UU"]), "mse_cells": cells},
                        gains=(gl[0], gl[1]))

    def combine_pooled(self, f1: np.ndarray | None, lam: np.ndarray,
                       alpha: float | str | None = "aic", per_attribute: bool = True) -> Combined:
        """One common domain size: the GLS estimate U pooled across attributes by empirical
        Bayes (:mod:`.corr_rr_eb`): the deviations from the mean marginal are shrunk by their
        REML-fitted variances (pooled unless a common τ passes AIC, then per attribute;
        ``alpha``: see :func:`.corr_rr_eb.fit_pooling`), all the way to the pooled GLS mean when the pooled
        model wins. Two passes: covariances at the proper published decode, then at the first
        estimate."""
        from ldpstream.estimators.families.corr_rr_eb import fit_pooling, pooled_smoother
        if len(set(self.shape)) != 1:
            raise ValueError("pooling across attributes needs one common domain size")
        m, k = self.m, self.shape[0] - 1
        B = self.decode(f1, lam)
        f1v = f1 if f1 is not None else self.u
        fw = np.concatenate([clip_rescale(b) for b in self.split(B)])
        Q = self.Q
        for _ in range(2):
            U, gl = self.unbiased(f1v, lam, fw)
            th = Q.T @ (U - self.u)
            C = Q.T @ gl[4] @ Q
            C = 0.5 * (C + C.T)
            fit = fit_pooling(th, C, m, k, alpha, per_attribute)
            S = pooled_smoother(C, fit.tau2, m, k)
            est = self.u + Q @ (S @ th)
            fw = np.concatenate([clip_rescale(x) for x in self.split(est)])
        # stated MSE per cell: the variance for the fitted τ (exact), plus the squared bias
        # expected under the fitted deviation model, E(Rθ)² = diag(R D_τ Rᵀ) (R J = 0: the pooled
        # mean is unbiased). An unbiased estimate of (Rθ)² from U is far too noisy at small ε.
        R = S - np.eye(len(S))
        var = np.einsum("ij,jk,ik->i", Q @ S, C, Q @ S)
        Dt = np.kron(np.diag(fit.tau2), np.eye(k))
        b2 = np.einsum("ij,jk,ik->i", Q @ R, Dt, Q @ R)
        cells = var + b2
        # weight of the pooled mean per attribute (1: fully pooled), for reporting
        cbar = np.array([np.trace(C[i * k:(i + 1) * k, i * k:(i + 1) * k]) / k for i in range(m)])
        wpool = np.where(fit.tau2 > 0, cbar / (cbar + fit.tau2), 1.0)
        return Combined(U, B, wpool, est, gl[4], float(self.omega @ cells),
                        float(self.omega @ b2),
                        {"tau2": fit.tau2.tolist(), "lr": fit.lr, "pooled": fit.pooled,
                         "mse_unbiased": float(self.omega @ np.diag(gl[4])),
                         "mse_cells": cells}, gains=(gl[0], gl[1]))

    def predicted(self, f: np.ndarray, post: np.ndarray | None = None) -> dict[str, float]:
        """Planning: predicted eq. 5 MSEs of U, of the published decode B and of the
        three-source combination at the plug-in f, the squared bias charged with ``post`` (the
        plug-in's uncertainty)."""
        gl = self.gls(f)
        cv = self.source_cov(gl)
        if self.n1 <= 0:
            cv["PP"] = np.full(self.D, 1e300)
        A, a0 = self.decode_bias_map()
        b = A @ f + a0
        b2 = b ** 2
        T, t0, w1, w2 = self.decode_affine()
        bB = (T - np.eye(self.D)) @ f + t0
        bB2 = bB ** 2
        if post is not None:  # expected squared bias over what the plan does not know
            b2 = b2 + np.einsum("ij,jk,ik->i", A, post, A)
            TI = T - np.eye(self.D)
            bB2 = bB2 + np.einsum("ij,jk,ik->i", TI, post, TI)
        W = self.source_weights(cv, b2)
        cells = self._mse_cells(W, cv, b2)
        varB = w1 ** 2 * np.where(cv["PP"] < 1e300, cv["PP"], 0.0) + w2 ** 2 * cv["DD"]
        return {"unbiased": float(self.omega @ cv["UU"]),
                "decode": float(self.omega @ (varB + bB2)),
                "combined": float(self.omega @ cells),
                "weight_decode": float(np.mean(W[:, 1]))}


# --- the copy table -----------------------------------------------------------------------------------
