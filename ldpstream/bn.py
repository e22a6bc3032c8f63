"""A small reader for discrete Bayesian networks in BIF format and a seeded ancestral sampler.

Enough for the bnlearn repository networks used by [RRBA] (Survey, Alarm, Child): ``variable``
blocks with ``type discrete [ d ] { states };`` and ``probability ( X | P1, P2 )`` blocks with
``table …;`` (no parents) or one ``(s1, s2) p…;`` row per parent configuration.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ldpstream.estimators.kernels.domain import Domain

_VAR = re.compile(r"variable\s+([^\s{]+)\s*\{[^}]*?type\s+discrete\s*\[\s*(\d+)\s*\]\s*\{([^}]*)\}",
                  re.S)
_PROB = re.compile(r"probability\s*\(\s*([^)|]+?)\s*(?:\|\s*([^)]*))?\)\s*\{([^}]*)\}", re.S)
_NUM = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class BIFError(ValueError):
    """The BIF text cannot be read; the message names the variable or block."""


@dataclass(frozen=True)
class BayesNet:
    """Variables in file order, their states, parents and CPTs ``cpt[x]`` of shape
    ``(*parent sizes, d_x)`` (rows sum to 1)."""

    variables: tuple[str, ...]
    states: dict[str, tuple[str, ...]]
    parents: dict[str, tuple[str, ...]]
    cpt: dict[str, np.ndarray]

    @property
    def domain(self) -> Domain:
        return Domain(self.variables, tuple(len(self.states[v]) for v in self.variables),
                      tuple(self.states[v] for v in self.variables))

    def order(self) -> list[str]:
        """A topological order (parents first)."""
        done: list[str] = []
        pending = list(self.variables)
        while pending:
            ready = [v for v in pending if all(p in done for p in self.parents[v])]
            if not ready:
                raise BIFError(f"the network has a cycle among {pending}")
            done += ready
            pending = [v for v in pending if v not in ready]
        return done

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` records by forward (ancestral) sampling: ``(n, m)`` state indices, columns in
        ``variables`` order. Vectorized per variable (inverse CDF on the CPT rows)."""
        out = np.zeros((n, len(self.variables)), dtype=np.int64)
        col = {v: i for i, v in enumerate(self.variables)}
        for v in self.order():
            cpt = self.cpt[v]
            rows = cpt.reshape(-1, cpt.shape[-1])
            if self.parents[v]:
                idx = np.ravel_multi_index(tuple(out[:, col[p]] for p in self.parents[v]),
                                           cpt.shape[:-1])
            else:
                idx = np.zeros(n, dtype=np.int64)
            cum = np.cumsum(rows, axis=1)
            cum[:, -1] = 1.0
            u = rng.random(n)
            out[:, col[v]] = (u[:, None] >= cum[idx][:, :-1]).sum(axis=1)
        return out

    def joint(self) -> np.ndarray:
        """The exact joint distribution (small networks only), axes in ``variables`` order."""
        shape = tuple(len(self.states[v]) for v in self.variables)
        joint = np.ones(shape)
        for v in self.variables:
            axes = [self.variables.index(p) for p in self.parents[v]] + [self.variables.index(v)]
            cpt = self.cpt[v]
            order = np.argsort(axes)
            t = np.transpose(cpt, order)
            bshape = [shape[i] if i in axes else 1 for i in range(len(shape))]
            joint = joint * t.reshape(bshape)
        return joint


def parse_bif(text: str) -> BayesNet:
    """Parse BIF text (see the module docstring for the subset understood)."""
    text = re.sub(r"//[^\n]*", "", text)
    states: dict[str, tuple[str, ...]] = {}
    for name, d, sts in _VAR.findall(text):
        vals = tuple(s.strip() for s in sts.split(",") if s.strip())
        if len(vals) != int(d):
            raise BIFError(f"variable {name}: declares {d} states but lists {len(vals)}")
        states[name] = vals
    if not states:
        raise BIFError("no discrete variables found")
    parents: dict[str, tuple[str, ...]] = {}
    cpt: dict[str, np.ndarray] = {}
    for child, pars, body in _PROB.findall(text):
        child = child.strip()
        if child not in states:
            raise BIFError(f"probability block for unknown variable {child!r}")
        par = tuple(p.strip() for p in pars.split(",") if p.strip()) if pars else ()
        for p in par:
            if p not in states:
                raise BIFError(f"variable {child}: unknown parent {p!r}")
        shape = tuple(len(states[p]) for p in par) + (len(states[child]),)
        table = np.full(shape, np.nan)
        m = re.search(r"table\s+([^;]*);", body)
        if m:
            if par:  # cell order of a conditional ``table`` differs between tools: refuse it
                raise BIFError(f"variable {child}: 'table' with parents is not supported; "
                               "write one '(parent states) p…;' row per configuration")
            probs = [float(x) for x in _NUM.findall(m.group(1))]
            if len(probs) != shape[-1]:
                raise BIFError(f"variable {child}: table has {len(probs)} numbers, needs {shape[-1]}")
            table = np.array(probs)
        for cfg, nums in re.findall(r"\(([^)]*)\)\s*([^;]*);", body):
            key = tuple(s.strip() for s in cfg.split(","))
            try:
                idx = tuple(states[p].index(s) for p, s in zip(par, key))
            except ValueError:
                raise BIFError(f"variable {child}: unknown parent state in ({cfg})") from None
            probs = [float(x) for x in _NUM.findall(nums)]
            if len(probs) != shape[-1] or len(idx) != len(par):
                raise BIFError(f"variable {child}: row ({cfg}) is malformed")
            table[idx] = probs
        if np.isnan(table).any():
            raise BIFError(f"variable {child}: probability table is incomplete")
        if not np.allclose(table.sum(axis=-1), 1.0, atol=1e-6):
            raise BIFError(f"variable {child}: a probability row does not sum to 1")
        parents[child] = par
        cpt[child] = table / table.sum(axis=-1, keepdims=True)
    missing = [v for v in states if v not in cpt]
    if missing:
        raise BIFError(f"variable {missing[0]}: no probability block")
    return BayesNet(tuple(states), states, parents, cpt)


def read_bif(path: str | Path) -> BayesNet:
    try:
        return parse_bif(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BIFError(f"{path}: no such file") from None


def survey_path() -> Path:
    """The Survey network bundled with the package (``ldpstream/data/survey.bif``, from the
    bnlearn repository; see ``ldpstream/data/SURVEY-SOURCE.md``)."""
    from importlib import resources
    path = Path(str(resources.files("ldpstream") / "data" / "survey.bif"))
    if not path.exists():
        raise BIFError(f"{path}: bundled survey.bif is missing (reinstall ldpstream)")
    return path
