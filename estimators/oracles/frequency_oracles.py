"""Frequency oracles for one categorical value of domain size d: GRR, OUE and OLH, after Wang,
Blocki, Li & Jha, "Locally differentially private protocols for frequency estimation" (USENIX
Security 2017; below [Wang17]).

Every oracle is a *pure* protocol in the sense of [Wang17] §4: a report o *supports* a set of
values S(o), with Pr[v ∈ S(o) | x = v] = p* and Pr[v ∈ S(o) | x ≠ v] = q* for every v. The server
keeps the support count C_v of every value and estimates, unbiasedly ([Wang17] eq. 3),

    f̂_v = (C_v / n − q*) / (p* − q*),

with variance, on a fixed dataset with true frequencies f ([Wang17] eq. 4 plus its f term),

    Var[f̂_v] = q*(1 − q*) / (n (p* − q*)²) + f_v (p*(1 − p*) − q*(1 − q*)) / (n (p* − q*)²).

The f-free first term gives [Wang17]'s variances: GRR (e^ε + d − 2)/(n (e^ε − 1)²) (§4.1),
OUE 4e^ε/(n (e^ε − 1)²) (§4.3), OLH with g = e^ε + 1 the same as OUE (§4.4). :func:`choose`
applies the rule: the oracle of smallest variance for the domain size (GRR iff d < 3e^ε + 2).

* :class:`GRR` — keep x with p = e^ε/(e^ε + d − 1), else one of the other d − 1 values.
* :class:`OUE` — unary encoding; the 1-bit kept with ½, every 0-bit flipped with 1/(e^ε + 1).
* :class:`OLH` — a hash h_a: [d] → [g] drawn from an *exactly* universal family (g prime,
  h_a(v) = a · digits_g(v) mod g with a uniform in GF(g)^r, so Pr_a[h_a(v) = h_a(v′)] = 1/g for
  every v ≠ v′), then GRR over [g]; a report is one integer ``a·g + y``. Exact universality makes
  the estimator exactly unbiased (a seeded-hash family only approximates it).

ε is computed from the channel actually applied (:func:`~.channels.epsilon` of the GRR matrix; for
OUE from the two per-bit channels, whose worst pair of bits composes to ln(p(1−q)/(q(1−p))));
:meth:`Oracle.channel` gives the full matrix for audits on small domains.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ldpstream.estimators.kernels import channels as ch

__all__ = ["Oracle", "GRR", "OUE", "OLH", "choose", "make", "ORACLES", "wang_variance"]

#: oracles one report can carry as a single small integer (OUE needs d bits per report)
COMPACT = ("grr", "olh")
ORACLES = ("grr", "oue", "olh")
#: largest code space of a compact report (codes are u32 on the wire)
MAX_CODES = 2**31


def grr_pq(eps: float, d: int) -> tuple[float, float]:
    """(p, q) of GRR(ε, d) without building the d×d matrix (the same arithmetic as
    :func:`~.channels.grr`: q = 1/(e^ε + d − 1), p = 1 − (d − 1)q)."""
    q = 1.0 / (math.exp(eps) + d - 1) if eps < 700 else 0.0
    return 1.0 - (d - 1) * q, q


def grr_randomize(x: np.ndarray, eps: float, d: int, rng: np.random.Generator) -> np.ndarray:
    """GRR(ε, d) on every value of ``x``: keep with p, else a uniform other value (vectorized)."""
    x = np.asarray(x, dtype=np.int64)
    keep = rng.random(x.shape) < grr_pq(eps, d)[0]
    other = rng.integers(0, d - 1, size=x.shape, dtype=np.int64)
    return np.where(keep, x, other + (other >= x))


def _check(eps: float, d: int) -> tuple[float, int]:
    eps = float(eps)
    if not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"epsilon must be a finite number > 0, got {eps!r}")
    if int(d) != d or int(d) < 2:
        raise ValueError(f"domain size must be an integer ≥ 2, got {d!r}")
    return eps, int(d)


@dataclass(frozen=True)
class Oracle:
    """A pure frequency oracle (support probabilities ``p_star``/``q_star``)."""

    eps: float
    d: int

    name = "oracle"

    # --- protocol constants ---------------------------------------------------------------------
    @property
    def p_star(self) -> float:
        raise NotImplementedError

    @property
    def q_star(self) -> float:
        raise NotImplementedError

    @property
    def epsilon(self) -> float:
        """ε computed from the channel applied."""
        raise NotImplementedError

    @property
    def n_codes(self) -> int:
        """Number of distinct compact reports (0 for OUE, which sends d bits)."""
        raise NotImplementedError

    # --- device ---------------------------------------------------------------------------------
    def randomize(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Reports of the values ``x`` (vectorized): codes in ``[0, n_codes)``, or OUE bit rows."""
        raise NotImplementedError

    # --- server ---------------------------------------------------------------------------------
    def supports(self, reports: np.ndarray) -> np.ndarray:
        """Support counts C_v of a batch of reports (int64, shape ``(d,)``)."""
        raise NotImplementedError

    def estimate(self, supports: np.ndarray, n: float) -> np.ndarray:
        """[Wang17] eq. 3: f̂ = (C/n − q*)/(p* − q*) (unbiased; may leave [0, 1])."""
        if n <= 0:
            raise ValueError("no reports")
        return (np.asarray(supports, dtype=float) / n - self.q_star) / (self.p_star - self.q_star)

    def variance(self, n: float, f: np.ndarray | None = None, fixed_data: bool = True
                 ) -> np.ndarray:
        """Per-value variance of :meth:`estimate` with ``n`` reports; ``f=None``: the f-free term
        of [Wang17] (the value reported in the paper). ``fixed_data=False`` adds the f(1−f)/n of
        sampling the users."""
        p, q = self.p_star, self.q_star
        base = np.full(self.d, q * (1 - q) / (n * (p - q) ** 2))
        if f is None:
            return base
        f = np.asarray(f, dtype=float)
        v = base + f * (p * (1 - p) - q * (1 - q)) / (n * (p - q) ** 2)
        return v if fixed_data else v + f * (1 - f) / n

    def channel(self) -> np.ndarray:
        """The exact channel ``P[x, report]`` (rows: values; columns: every possible report in
        :meth:`report_index` order). For audits on small domains."""
        raise NotImplementedError

    def report_index(self, reports: np.ndarray) -> np.ndarray:
        """Column of :meth:`channel` of each report."""
        return np.asarray(reports, dtype=np.int64)


@dataclass(frozen=True)
class GRR(Oracle):
    """Generalized randomized response (direct encoding) [Wang17] §4.1."""

    name = "grr"

    @property
    def _pq(self) -> tuple[float, float]:
        return grr_pq(self.eps, self.d)

    @property
    def p_star(self) -> float:
        return self._pq[0]

    @property
    def q_star(self) -> float:
        return self._pq[1]

    @property
    def epsilon(self) -> float:
        # every column of the GRR matrix holds p once and q elsewhere: ε = ln(p/q)
        p, q = self._pq
        return math.log(p / q) if q > 0 else math.inf

    @property
    def n_codes(self) -> int:
        return self.d

    def randomize(self, x, rng):
        return grr_randomize(x, self.eps, self.d, rng)

    def supports(self, reports):
        return np.bincount(np.asarray(reports, dtype=np.intp), minlength=self.d).astype(np.int64)

    def channel(self):
        return ch.grr(self.eps, self.d)


@dataclass(frozen=True)
class OUE(Oracle):
    """Optimized unary encoding [Wang17] §4.3: bit x kept with p = ½, every other bit set with
    q = 1/(e^ε + 1)."""

    name = "oue"

    @property
    def p_star(self) -> float:
        return 0.5

    @property
    def q_star(self) -> float:
        return 1.0 / (math.exp(self.eps) + 1.0) if self.eps < 700 else 0.0

    def bit_channel(self) -> np.ndarray:
        """The channel every bit goes through: rows = input bit, columns = output bit."""
        p, q = self.p_star, self.q_star
        return np.array([[1 - q, q], [1 - p, p]])

    @property
    def epsilon(self) -> float:
        # x and x' differ in exactly two bits (x's and x''s); the other bits have the same law.
        # Per bit b the likelihood ratio of y_b between input bit 1 and 0 is at most
        # max_y P[1,y]/P[0,y]; the pair composes: ln max_y(P[1,y]/P[0,y]) + ln max_y(P[0,y]/P[1,y]).
        P = self.bit_channel()
        return float(np.log(np.max(P[1] / P[0])) + np.log(np.max(P[0] / P[1])))

    @property
    def n_codes(self) -> int:
        return 0

    def randomize(self, x, rng):
        x = np.asarray(x, dtype=np.int64)
        bits = (rng.random((len(x), self.d)) < self.q_star).astype(np.uint8)
        bits[np.arange(len(x)), x] = (rng.random(len(x)) < self.p_star).astype(np.uint8)
        return bits

    def supports(self, reports):
        return np.asarray(reports, dtype=np.int64).sum(axis=0)

    def channel(self):
        if self.d > 12:
            raise ValueError("OUE channel matrix is 2^d wide; audit only small d")
        ys = (np.arange(2 ** self.d)[:, None] >> np.arange(self.d)[None, :]) & 1  # (2^d, d)
        p, q = self.p_star, self.q_star
        P = np.empty((self.d, 2 ** self.d))
        for x in range(self.d):
            prob = np.where(ys == 1, q, 1 - q)
            prob[:, x] = np.where(ys[:, x] == 1, p, 1 - p)
            P[x] = prob.prod(axis=1)
        return P

    def report_index(self, reports):
        r = np.asarray(reports, dtype=np.int64)
        return (r << np.arange(self.d)[None, :]).sum(axis=1)


def _primes_upto(n: int) -> np.ndarray:
    sieve = np.ones(n + 1, dtype=bool)
    sieve[:2] = False
    for i in range(2, int(n ** 0.5) + 1):
        if sieve[i]:
            sieve[i * i::i] = False
    return np.flatnonzero(sieve)


def _digits(v: np.ndarray, g: int, r: int) -> np.ndarray:
    """Base-g digits (least significant first) of ``v``: shape ``v.shape + (r,)``."""
    v = np.asarray(v, dtype=np.int64)
    return (v[..., None] // (g ** np.arange(r, dtype=np.int64))) % g


def _olh_r(g: int, d: int) -> int:
    r = 1
    while g ** r < d:
        r += 1
    return r


@dataclass(frozen=True)
class OLH(Oracle):
    """Optimized local hashing [Wang17] §4.4 with an exactly universal linear hash family:
    g prime, r = ⌈log_g d⌉, seed a ∈ GF(g)^r (an integer < g^r), h_a(v) = Σ_i a_i·v_i mod g over
    the base-g digits v_i of v, then GRR_g(ε) on h_a(x). Report code = a·g + y. Support of (a, y):
    {v : h_a(v) = y}, so p* = e^ε/(e^ε + g − 1), q* = 1/g exactly."""

    g: int = 0

    name = "olh"

    def __post_init__(self) -> None:
        if self.g == 0:
            object.__setattr__(self, "g", best_olh_g(self.eps, self.d))
        if self.g < 2 or any(self.g % k == 0 for k in range(2, int(self.g ** 0.5) + 1)):
            raise ValueError(f"OLH hash range g must be a prime ≥ 2, got {self.g}")

    @property
    def r(self) -> int:
        return _olh_r(self.g, self.d)

    @property
    def seeds(self) -> int:
        return self.g ** self.r

    @property
    def p_star(self) -> float:
        return grr_pq(self.eps, self.g)[0]

    @property
    def q_star(self) -> float:
        return 1.0 / self.g

    @property
    def epsilon(self) -> float:
        # Pr[(a, y) | x] = GRR_g(h_a(x), y)/g^r; h_a separates some pair of values (a = e_0
        # separates 0 and 1), so the worst ratio is GRR_g's, ln(p/q)
        p, q = grr_pq(self.eps, self.g)
        return math.log(p / q) if q > 0 else math.inf

    @property
    def n_codes(self) -> int:
        return self.seeds * self.g

    def hash(self, seeds: np.ndarray, v: np.ndarray) -> np.ndarray:
        """h_a(v) for every seed (rows) and value (columns)."""
        a = _digits(np.asarray(seeds), self.g, self.r)              # (n, r)
        dv = _digits(np.asarray(v), self.g, self.r)                 # (m, r)
        return (a @ dv.T) % self.g

    def randomize(self, x, rng):
        x = np.asarray(x, dtype=np.int64)
        a = rng.integers(0, self.seeds, len(x), dtype=np.int64)
        h = (_digits(a, self.g, self.r) * _digits(x, self.g, self.r)).sum(axis=1) % self.g
        y = grr_randomize(h, self.eps, self.g, rng)
        return a * self.g + y

    def supports(self, reports, chunk_cells: int = 1 << 22):
        r = np.asarray(reports, dtype=np.int64)
        a, y = r // self.g, r % self.g
        out = np.zeros(self.d, dtype=np.int64)
        values = np.arange(self.d)
        step = max(1, chunk_cells // self.d)
        for i in range(0, len(r), step):
            h = self.hash(a[i:i + step], values)
            out += (h == y[i:i + step, None]).sum(axis=0)
        return out

    def channel(self):
        codes = np.arange(self.n_codes)
        a, y = codes // self.g, codes % self.g
        h = self.hash(a, np.arange(self.d)).T                       # (d, codes)
        p, q = grr_pq(self.eps, self.g)
        return np.where(h == y[None, :], p, q) / self.seeds


def _olh_base_variance(eps: float, g: int) -> float:
    p, q = grr_pq(eps, g)[0], 1.0 / g
    return q * (1 - q) / (p - q) ** 2


def best_olh_g(eps: float, d: int) -> int:
    """The prime g minimizing OLH's variance (continuous optimum e^ε + 1 [Wang17] §4.4) among
    those whose code space g^(r+1) stays below :data:`MAX_CODES`."""
    eps, d = _check(eps, d)
    hi = int(min(max(3.0, 2 * (math.exp(min(eps, 30.0)) + 1)), 1 << 20))
    best, best_v = 2, math.inf
    for g in _primes_upto(hi):
        g = int(g)
        if g ** (_olh_r(g, d) + 1) > MAX_CODES:
            continue
        v = _olh_base_variance(eps, g)
        if v < best_v:
            best, best_v = g, v
    return best


def wang_variance(name: str, eps: float, d: int, n: float = 1.0) -> float:
    """[Wang17]'s f-free variance of one estimated frequency: GRR (e^ε+d−2)/(n(e^ε−1)²), OUE
    4e^ε/(n(e^ε−1)²), OLH q*(1−q*)/(n(p*−q*)²) at its prime g."""
    eps, d = _check(eps, d)
    e = math.exp(eps)
    if name == "grr":
        return (e + d - 2) / (n * (e - 1) ** 2)
    if name == "oue":
        return 4 * e / (n * (e - 1) ** 2)
    if name == "olh":
        return _olh_base_variance(eps, best_olh_g(eps, d)) / n
    raise ValueError(f"unknown frequency oracle {name!r}; choose one of {', '.join(ORACLES)}")


def make(name: str, eps: float, d: int) -> Oracle:
    """The oracle ``name`` for ε and domain size d."""
    eps, d = _check(eps, d)
    if name == "grr":
        return GRR(eps, d)
    if name == "oue":
        return OUE(eps, d)
    if name == "olh":
        return OLH(eps, d)
    raise ValueError(f"unknown frequency oracle {name!r}; choose one of {', '.join(ORACLES)}")


def choose(eps: float, d: int, allowed: Sequence[str] = ORACLES) -> Oracle:
    """The variance rule [Wang17] §4.5: the allowed oracle of smallest f-free variance for this
    domain size (GRR beats OUE iff d < 3e^ε + 2). Ties go to the earlier of GRR, OUE, OLH."""
    eps, d = _check(eps, d)
    names = [n for n in ORACLES if n in allowed]
    if not names:
        raise ValueError(f"no frequency oracle allowed; choose from {', '.join(ORACLES)}")
    best = min(names, key=lambda n: (wang_variance(n, eps, d), ORACLES.index(n)))
    return make(best, eps, d)
