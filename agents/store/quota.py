"""Per-device quotas, enforced inside the exactly-once apply (docs/security.md).

A collection with ``device_quota: {reports: q, window_s: W}`` counts at most ``q`` reports per
device id per fixed window of the *worker's clock* (window ``w = floor(now / W)`` when the worker
takes the message; never the producer's record timestamp, which a device chooses: backdating it
would move reports into windows of its choice); the excess goes to ``ldp.dlq`` with reason
``over_quota`` (the rest of the batch is counted), and a batch without device ids is refused
whole (``missing_device_ids``).

Exactly once: the per-device counts of a partition live in the side-counter hash
``ldp:{<cid>#<p>}:x:quota:<w>:<b>`` (agents/store/keys.py; bucket ``b`` of the device:
agents/store/side_buckets.py), incremented by the same Lua call that applies
the partition's count delta and moves its offset (``PartitionDelta.side``). So after any crash
the hash holds exactly the reports counted up to the stored offset, and the worker resumes from
there with those counts: a report is counted at most once, and each device at most ``q`` times
per window (reports in offset order, then in batch order; the first ``q`` of a device in a
window are counted). The quota is per partition: a device whose reports are spread over ``P``
partitions (messages without a device key) can get ``q`` counted on each; the device SDK keys a
device's messages by its id, so they all land on one partition.
"""
from __future__ import annotations

import numpy as np

__all__ = ["split_by_quota", "window_of", "side_name", "WINDOW_PREFIX"]

WINDOW_PREFIX = "quota:"


def side_name(window: int, prefix: str = WINDOW_PREFIX) -> str:
    """The side-counter name of window ``window`` of a limit (default: the device quota)."""
    return f"{prefix}{int(window)}"


def window_of(timestamp_ms: float, window_s: float) -> int:
    """The quota window of a time in unix ms (the worker's clock: agents/ingest/service.py)."""
    return int(np.floor(float(timestamp_ms) / 1000.0 / float(window_s)))


def split_by_quota(device_ids: np.ndarray, used: dict[int, int], limit: int
                   ) -> tuple[np.ndarray, dict[int, int]]:
    """Which reports of a batch (device ``device_ids[i]`` for report ``i``, in order) are within
    the quota, given the reports ``used[device]`` already counted in the window: report ``i`` is
    counted when fewer than ``limit - used[device]`` earlier reports of its device are in the
    batch. Returns (boolean mask of the counted reports, counted reports per device). Vectorized
    over reports (one dict lookup per distinct device)."""
    ids = np.asarray(device_ids, dtype=np.uint64)
    n = ids.size
    if n == 0:
        return np.zeros(0, dtype=bool), {}
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    starts = np.ones(n, dtype=bool)
    starts[1:] = s[1:] != s[:-1]
    first = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    rank = np.arange(n) - first                       # earlier reports of the same device
    uniq = s[starts]
    group = np.cumsum(starts) - 1
    used_arr = np.fromiter((used.get(int(d), 0) for d in uniq.tolist()), dtype=np.int64,
                           count=uniq.size)
    allowed = np.maximum(0, int(limit) - used_arr)
    mask = np.empty(n, dtype=bool)
    mask[order] = rank < allowed[group]
    sizes = np.diff(np.append(np.flatnonzero(starts), n))
    taken = np.minimum(sizes, allowed)
    return mask, {int(d): int(t) for d, t in zip(uniq.tolist(), taken.tolist()) if t}
