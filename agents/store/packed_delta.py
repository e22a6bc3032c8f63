"""Packed chunk deltas: the cells of a dense delta sent as one byte string and added inside Redis
by one read and one write of the count string (``PACKED_ADD_LUA`` in agents/store/scripts.py),
instead of one ``BITFIELD INCRBY`` per nonzero cell (docs/windows.md "Where the counts live, and
for how long").

A chunk's delta goes packed when it is dense: at least :data:`PACKED_MIN_CELLS` nonzero cells,
filling at least :data:`PACKED_FILL` of the span from its first to its last nonzero cell. The span
is what is read, added and written back, so the packed form leaves the string exactly as the
increments of its nonzero cells would (same length, same bytes)."""
from __future__ import annotations

import struct

import numpy as np

__all__ = ["PACKED_MARK", "PACKED_FILL", "PACKED_MIN_CELLS", "packed_blob", "wants_packed"]

#: the first byte of a packed chunk delta (a text one starts with '#')
PACKED_MARK = b"*"
#: nonzero cells ÷ span from which a chunk delta goes packed: inside Redis an increment costs
#: about 2.5 µs a nonzero cell, the packed sum about 0.4 µs a cell of the span (docs/windows.md
#: "Where the counts live, and for how long"), so the crossover is near 0.17
PACKED_FILL = 0.25
#: fewer nonzero cells than this always go as increments
PACKED_MIN_CELLS = 64


def wants_packed(nonzero: int, span: int, fill: float = PACKED_FILL) -> bool:
    """A chunk delta of ``nonzero`` nonzero cells over ``span`` cells goes packed."""
    return nonzero >= PACKED_MIN_CELLS and nonzero >= fill * span


def packed_blob(values: np.ndarray, first: int) -> bytes:
    """The packed form of the deltas ``values`` of cells ``first, first + 1, ...`` of a chunk:
    the mark, ``first`` as a little-endian u32, the deltas as big-endian int64 (the count
    string's own byte order)."""
    return PACKED_MARK + struct.pack("<I", int(first)) + \
        np.ascontiguousarray(values, dtype=">i8").tobytes()
