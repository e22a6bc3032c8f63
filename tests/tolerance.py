"""Float comparisons that hold on any CPU and BLAS kernel.

A fixed absolute tolerance (``atol=1e-9``) means something different for cells near 1e3 than for
probabilities near 1e-3, and the last bits of a sum depend on the kernel OpenBLAS picks for the CPU
(AVX-512, Haswell, ...). Here the tolerance is relative to the magnitude compared: every element
may differ by ``rel`` times the largest magnitude of the expected array (so cells near zero are
judged on the array's scale, not their own).
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def scale(desired: ArrayLike) -> float:
    """The magnitude an array comparison is relative to: its largest absolute entry."""
    d = np.abs(np.asarray(desired, dtype=float))
    return float(d.max()) if d.size else 0.0


def assert_close(actual: ArrayLike, desired: ArrayLike, rel: float, err_msg: str = "") -> None:
    """``|actual - desired| <= rel·|desired| + rel·max|desired|`` element by element."""
    np.testing.assert_allclose(actual, desired, rtol=rel, atol=rel * scale(desired),
                               err_msg=err_msg)


def close(actual: ArrayLike, desired: ArrayLike, rel: float) -> bool:
    """The boolean form of :func:`assert_close`."""
    return bool(np.allclose(actual, desired, rtol=rel, atol=rel * scale(desired)))
