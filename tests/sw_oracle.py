"""A reference Square Wave + EMS written from the paper alone (Li et al., "Estimating Numerical
Distributions under Local Differential Privacy", SIGMOD 2020, Alg. 1 and §5), independent of
estimators/kernels/numeric.py: its own sampler on continuous values, its own transition matrix
(bucket centres as the inputs, overlaps computed bucket by bucket), EM and smoothing written out.
Test-only: the numeric family is compared with it (tests/test_numeric.py, bench numeric)."""
from __future__ import annotations

import math

import numpy as np


def oracle_b(eps: float) -> float:
    ee = math.exp(eps)
    return (eps * ee - ee + 1) / (2 * ee * (ee - 1 - eps))


def oracle_randomize(values01: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray:
    """Alg. 1: with probability 2b·p the output is uniform in [v − b, v + b], otherwise uniform
    on [−b, 1 + b] outside it (drawn by rejection-free placement of a uniform of length 1)."""
    b = oracle_b(eps)
    ee = math.exp(eps)
    p = ee / (2 * b * ee + 1)
    near = rng.random(len(values01)) < 2 * b * p
    out = np.empty(len(values01))
    out[near] = values01[near] + rng.uniform(-b, b, near.sum())
    far = ~near
    r = rng.uniform(0, 1, far.sum())          # position in the far region (total length 1)
    left = values01[far]                      # length of [−b, v − b)
    out[far] = np.where(r < left, -b + r, values01[far] + b + (r - left))
    return out


def oracle_matrix(eps: float, d_in: int, d_out: int) -> np.ndarray:
    """M[j, i] = Pr[output in bucket j | input at the centre of bucket i]."""
    b = oracle_b(eps)
    ee = math.exp(eps)
    p = ee / (2 * b * ee + 1)
    q = 1 / (2 * b * ee + 1)
    width = (1 + 2 * b) / d_out
    M = np.zeros((d_out, d_in))
    for i in range(d_in):
        v = (i + 0.5) / d_in
        for j in range(d_out):
            a0, a1 = -b + j * width, -b + (j + 1) * width
            overlap = max(0.0, min(a1, v + b) - max(a0, v - b))
            M[j, i] = q * (width - overlap) + p * overlap
    return M / M.sum(axis=0, keepdims=True)


def oracle_ems(outputs: np.ndarray, eps: float, d: int = 256, tol: float = 1e-3 * 1e-3,
               max_iter: int = 5000) -> np.ndarray:
    """§5: bucketize the outputs into d buckets, then EM with the smoothing step (binomial
    weights 1/4, 1/2, 1/4; the end bins keep their weight on themselves), stopping when the
    log-likelihood gains less than ``tol``."""
    b = oracle_b(eps)
    counts = np.histogram(outputs, bins=d, range=(-b, 1 + b))[0].astype(float)
    M = oracle_matrix(eps, d, d)
    x = np.full(d, 1.0 / d)
    prev = -np.inf
    for _ in range(max_iter):
        pred = M @ x
        x = x * (M.T @ (counts / np.maximum(pred, 1e-300))) / counts.sum()
        sm = np.empty(d)
        sm[1:-1] = 0.25 * x[:-2] + 0.5 * x[1:-1] + 0.25 * x[2:]
        sm[0] = 0.75 * x[0] + 0.25 * x[1]
        sm[-1] = 0.25 * x[-2] + 0.75 * x[-1]
        x = sm / sm.sum()
        ll = float(counts @ np.log(np.maximum(M @ x, 1e-300)))
        if abs(ll - prev) < tol:
            break
        prev = ll
    return x
