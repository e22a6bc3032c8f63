"""Per-device side hashes packed into buckets (docs/scaling.md "Per-device state").

The per-device state of one window of a partition (batch dedupe ``dedupe:<w>``, quota counts
``quota:<w>``, the daily budget's ``budget:<w>``) is one field per device. In one big hash Redis
keeps a field in a hashtable entry (~90 bytes whatever the value); a hash of at most 128 fields
(Redis' default ``hash-max-listpack-entries``) of short values is one listpack, a few bytes a
field more than its id and value. So the window's fields live in ``B`` bucket hashes
``<name>:<b>`` (agents/store/keys.py ``side_bucket_name``), ``b = bucket_of(id, B)``, field the
id as a signed 64-bit integer (:func:`bucket_fields`), and ``B``
is chosen so that a bucket holds :data:`TARGET_FILL` fields on average (with a fleet twice the
one it was sized for, 96: fewer than one bucket in a thousand passes 128):

- **chosen once per window**, by the first worker that reads the window: from the fields of the
  window before (its meta ``n``, or the field count of its single hash written by earlier
  versions) and the collection's ``expected_senders`` (the first window of a collection);
- **recorded** by the first apply that writes the window, atomically with its fields (meta hash
  ``<name>:m``, field ``b``; field ``n`` counts the window's fields). The apply script refuses,
  as a conflict, a delta bucketed with another ``B``, and every read returns the recorded ``B``
  with the values: a reader that used another one reads again. So readers and the apply agree
  on ``B`` for the window's whole life, whoever chose it.

State written by earlier versions (the window's single hash ``<name>``) is read beside the
buckets until it expires: a bucket's value wins (dedupe), or both are added (counts)."""
from __future__ import annotations

from typing import Mapping, Sequence, TypeVar

import numpy as np

from ldpstream.agents.store import keys

__all__ = ["TARGET_FILL", "LISTPACK_FIELDS", "MAX_BUCKETS", "META_B", "META_N", "buckets_for",
           "bucket_fields", "bucket_of", "BucketedRead", "split_buckets"]

V = TypeVar("V")

#: mean fields per bucket a window is sized for
TARGET_FILL = 48
#: Redis' default ``hash-max-listpack-entries``: a hash with more fields is a hashtable
LISTPACK_FIELDS = 128
#: most buckets of one window of a partition (6 million devices a partition at TARGET_FILL)
MAX_BUCKETS = 1 << 17
#: fields of the meta hash: the window's buckets, the fields written to them
META_B, META_N = "b", "n"
_MUL = np.uint64(0x9E3779B97F4A7C15)   # 2^64 / golden ratio (Fibonacci hashing)
_SHIFT = np.uint64(32)


def buckets_for(previous_fields: int, expected: int = 0) -> int:
    """The buckets of a window whose previous window held ``previous_fields`` fields, the
    collection expecting ``expected`` per partition: :data:`TARGET_FILL` fields each on average,
    at least 1, at most :data:`MAX_BUCKETS`."""
    n = max(int(previous_fields), int(expected), 0)
    return min(MAX_BUCKETS, max(1, -(-n // TARGET_FILL)))


def bucket_fields(ids: np.ndarray) -> list[str]:
    """The field names of device ids (uint64) in a bucket: the id as a signed 64-bit integer
    (``id - 2**64`` from ``2**63`` on), which a listpack stores as an integer, in at most 9
    bytes, where the 20 digits of a larger unsigned id would be text. (The single hash of
    earlier versions named fields by the unsigned id.)"""
    return [str(i) for i in np.asarray(ids, dtype=np.uint64).view(np.int64).tolist()]


def bucket_of(ids: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket (int64, in ``[0, buckets)``) of each device id (uint64): Fibonacci hashing,
    so sequential ids spread evenly too."""
    if not 1 <= int(buckets) <= MAX_BUCKETS:
        raise ValueError(f"buckets must be in [1, {MAX_BUCKETS}] (got {buckets})")
    h = (np.asarray(ids, dtype=np.uint64) * _MUL) >> _SHIFT
    return ((h * np.uint64(int(buckets))) >> _SHIFT).astype(np.int64)


class BucketedRead:
    """The reads of the fields ``ids`` of per-device side hash ``name`` (one window) bucketed
    in ``buckets``: :meth:`wanted` lists the hashes and fields for ``CountStore.read_side_fields``
    (the meta, the single hash of earlier versions, then each bucket touched), :meth:`merge`
    turns what was read back into one value per id. ``additive``: counters (the old hash's
    value and the bucket's added) rather than values (the bucket's wins)."""

    def __init__(self, name: str, buckets: int, ids: Sequence[int] | np.ndarray,
                 additive: bool) -> None:
        self.name = name
        self.buckets = int(buckets)
        self.additive = additive
        self.ids = np.asarray(ids, dtype=np.uint64)
        self.fields = [str(i) for i in self.ids.tolist()]
        self.signed = bucket_fields(self.ids)
        b = bucket_of(self.ids, self.buckets)
        self.order = np.argsort(b, kind="stable")
        sb = b[self.order]
        cuts = np.flatnonzero(sb[1:] != sb[:-1]) + 1
        self.groups = [(int(sb[lo]), self.order[lo:hi])
                       for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), sb.size])
                       if hi > lo]

    def wanted(self) -> list[tuple[str, list[str]]]:
        if not self.fields:
            return []
        f = self.signed
        return [(keys.side_meta_name(self.name), [META_B, META_N]), (self.name, self.fields),
                *((keys.side_bucket_name(self.name, b), [f[i] for i in idx.tolist()])
                  for b, idx in self.groups)]

    def merge(self, values: Sequence[Sequence[bytes | None]]
              ) -> tuple[int | None, int, list[bytes | None]]:
        """(the window's recorded buckets, None: none yet; the fields its buckets hold; the
        value of each id, None: absent) from the values :meth:`wanted`'s reads returned, in its
        order."""
        if not self.fields:
            return None, 0, []
        recorded = None if values[0][0] is None else int(values[0][0])
        held = 0 if values[0][1] is None else int(values[0][1])
        out: list[bytes | None] = list(values[1])
        for (_, idx), vals in zip(self.groups, values[2:]):
            for i, v in zip(idx.tolist(), vals):
                if v is None:
                    continue
                old = out[i]
                out[i] = v if not self.additive or old is None else \
                    str(int(old) + int(v)).encode()
        return recorded, held, out


def split_buckets(name: str, buckets: int, values: Mapping[int, V]) -> list[tuple[str, dict[str, V]]]:
    """``values`` (device id → value) of per-device side hash ``name`` grouped by bucket: the
    side name of each bucket touched and its fields (:func:`bucket_fields`) and values."""
    ids = np.fromiter(values.keys(), dtype=np.uint64, count=len(values))
    out: dict[int, dict[str, V]] = {}
    for f, b, v in zip(bucket_fields(ids), bucket_of(ids, buckets).tolist(), values.values()):
        out.setdefault(b, {})[f] = v
    return [(keys.side_bucket_name(name, b), f) for b, f in sorted(out.items())]
