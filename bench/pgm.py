"""The Private-PGM column of ``ldpstream bench marginals`` (docs/partitioned.md "Measured"): the
``mbi`` package (PyPI, optional: ``pip install '.[pgm]'``; JAX on CPU) fed the same noisy
measurements as ``partitioned`` — every collected marginal's unbiased table from
:meth:`~ldpstream.estimators.families.partitioned.Partitioned.unbiased` with its standard deviation —
fitted by MirrorDescent (McKenna, Sheldon & Miklau, ICML 2019) and projected onto each marginal
asked for."""
from __future__ import annotations

import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from ldpstream.estimators.families.partitioned import Partitioned

__all__ = ["available", "pgm_marginals", "ITERS"]

#: MirrorDescent iterations per fit (mbi's default)
ITERS = 1000


def available() -> bool:
    """Whether ``mbi`` imports (it is an optional dependency)."""
    try:
        _mbi()
    except ImportError:
        return False
    return True


def _mbi() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import jax
        jax.config.update("jax_enable_x64", True)
        jax.config.update("jax_enable_compilation_cache", False)
        import mbi
        from mbi.estimation import MirrorDescent
    return mbi, MirrorDescent


def pgm_marginals(mech: Partitioned, counts: Mapping[str, np.ndarray],
                  sets: Sequence[tuple[str, ...]]) -> dict[tuple[str, ...], np.ndarray]:
    """Private-PGM's estimate of every marginal in ``sets`` (axes in each set's order)."""
    mbi, MirrorDescent = _mbi()
    measurements = []
    for j, m in enumerate(mech.marginals):
        table, var, _ = mech.unbiased(counts, j)
        measurements.append(mbi.LinearMeasurement(
            np.asarray(table.values, dtype=float).reshape(-1), tuple(m),
            stddev=float(np.sqrt(var))))
    domain = mbi.Domain(mech.domain.attrs, mech.domain.shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MirrorDescent().estimate(domain, measurements, known_total=1.0, iters=ITERS)
    return {a: np.asarray(model.project(a).datavector(flatten=False), dtype=float)
            for a in sets}
