"""How many threads BLAS may use for the estimators' skinny products (docs/estimators.md).

The products of :mod:`~.castell` (inner dimension d_i) and the small dense solves of
:mod:`~.marginal_fit` are close to memory-bound, and a multi-threaded BLAS collapses when the
cores are shared (measured: 30× slower per pass on a loaded 2-core machine), so one thread is
the robust default. Needs ``threadpoolctl`` (a scikit-learn dependency); without it the setting
is ignored.
"""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager

__all__ = ["BLAS_THREADS", "blas_limit"]

#: BLAS threads inside :func:`blas_limit` (``None``: leave BLAS as it is)
BLAS_THREADS: int | None = 1
_controller: Any = None


def blas_limit() -> ContextManager[Any]:
    """Context manager limiting BLAS to :data:`BLAS_THREADS` threads (a no-op if unavailable)."""
    global _controller
    if BLAS_THREADS is None:
        return contextlib.nullcontext()
    if _controller is None:
        try:
            from threadpoolctl import ThreadpoolController
            _controller = ThreadpoolController()
        except Exception:  # pragma: no cover - optional dependency
            _controller = False
    if _controller is False:
        return contextlib.nullcontext()
    return _controller.limit(limits=BLAS_THREADS, user_api="blas")
