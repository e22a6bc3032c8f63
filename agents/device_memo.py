"""Estimates that count devices, not reports, for memoized collections (docs/privacy-over-time.md,
"Memoized collections count devices").

A device that memoizes [RAPPOR §3] sends the same permanent response again and again: its
thousandth report adds no information about its record. So for a collection whose mechanism
memoizes (``Mechanism.memoization() is not None``) the worker counts each device once, at its
*latest* report: a new report of a device *moves* its contribution, subtracting its previous
report from the bucket it was counted in (fine, coarse and all-time tensors) and adding the new
one. Every window that ends now then holds each device that reported in it exactly once, and
the count tables, their totals, the error bounds and the drift variances all count devices.

The state is one entry per device and shard, ``<version>:<bucket + 1>:<report values>``
(bucket 0: counted in the all-time tensor only), in the side hash ``memo:<layout>:<e>`` of the
count layout and the worker's clock epoch ``e = floor(now / L)``, ``L`` = the collection's
bucket retention (2 × the longest window + one bucket; one day when only ``all`` is kept). It
is written by the same Lua apply that adds the counts and moves the offset (``SideValues``),
so exactly-once holds for it too.
An entry is looked up in the epochs ``e`` and ``e - 1`` and expires two epochs after its own:
a device silent for longer than ``L`` is counted afresh (its old report has left every finite
window by then; the all-time tensor then holds it twice).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ldpstream.windows import BucketPolicy

__all__ = ["PREFIX", "side_name", "epoch_length", "epoch_of", "encode", "decode", "Moves",
           "latest_per_device", "STATE_BYTES_PER_DEVICE"]

PREFIX = "memo:"
DAY_S = 86_400.0
#: Redis memory of one device's entry (hash field + value + overhead, measured: docs/privacy-over-time.md)
STATE_BYTES_PER_DEVICE = 100


def side_name(epoch: int, layout_id: str) -> str:
    """The side hash of the devices' latest reports written in epoch ``epoch`` under the count
    layout ``layout_id`` (agents/layout.py): a config whose marginals change counts into new
    keys, and its devices start afresh there too."""
    return f"{PREFIX}{layout_id}:{int(epoch)}"


def epoch_length(policy: BucketPolicy) -> float:
    """How long a device's entry is kept at least: the buckets' retention (one day if none)."""
    return policy.retention_s() if policy.bucketed else DAY_S


def epoch_of(now: float, policy: BucketPolicy) -> int:
    return int(math.floor(now / epoch_length(policy)))


def encode(version: int, bucket: int, report: np.ndarray) -> str:
    """A device's entry: the mechanism version, fine bucket + 1 (0: all-time only) and report."""
    return ":".join([str(int(version)), str(int(bucket) + 1), *map(str, report.tolist())])


def decode(entry: str) -> tuple[int, int, np.ndarray]:
    """(version, fine bucket or -1, report values) of an entry written by :func:`encode`."""
    parts = [int(x) for x in entry.split(":")]
    return parts[0], parts[1] - 1, np.asarray(parts[2:], dtype=np.int64)


@dataclass
class Moves:
    """What one run of reports (one version) changes: ``keep`` indexes the reports counted (the
    latest of each device), ``removed`` the previous reports subtracted (their entries' report
    part, per (version, bucket)), ``entries`` the devices' new entries."""

    keep: np.ndarray
    removed: dict[tuple[int, int], list[str]] = field(default_factory=dict)
    entries: dict[int, str] = field(default_factory=dict)

    def removed_rows(self) -> dict[tuple[int, int], np.ndarray]:
        """The subtracted reports as ``(k, width)`` arrays, parsed in one pass per group."""
        return {k: np.array(":".join(rows).split(":"), dtype=np.int64).reshape(len(rows), -1)
                for k, rows in self.removed.items()}


def latest_per_device(device_ids: np.ndarray, reports: np.ndarray, buckets: np.ndarray,
                      version: int, known: Callable[[int], str | None]) -> Moves:
    """The latest report of each device among ``reports`` (in order), the previous entries it
    supersedes (``known(device)``: its entry, None if none) and the new entries. One lookup
    and one string format per distinct device; the reports themselves are handled by numpy."""
    ids = np.asarray(device_ids, dtype=np.uint64)
    _, rev_idx = np.unique(ids[::-1], return_index=True)
    keep = np.sort(ids.size - 1 - rev_idx)
    kept_ids = ids[keep].tolist()
    rows = np.column_stack([np.broadcast_to(buckets, ids.shape)[keep] + 1,
                            reports[keep]]).astype(np.int64).tolist()
    fmt = f"{int(version)}:" + ":".join(["%d"] * (reports.shape[1] + 1))
    moves = Moves(keep, entries={d: fmt % tuple(r) for d, r in zip(kept_ids, rows)})
    removed = moves.removed
    for d in kept_ids:
        old = known(d)
        if old is not None:
            v, b, rest = old.split(":", 2)
            removed.setdefault((int(v), int(b) - 1), []).append(rest)
    return moves
