"""A poll's read of its devices' per-device side state (batch dedupe, quota counts), bucketed
(agents/store/side_buckets.py; docs/scaling.md "Per-device state"): the buckets of each window
sized once (from the window before, or as recorded), then one atomic read of the fields with
the stored offset; a window whose recorded buckets differ from those used is read again."""
from __future__ import annotations

import dataclasses
from typing import MutableMapping, Sequence

from ldpstream.agents import metrics
from ldpstream.agents.store import keys
from ldpstream.agents.store.count_store import CountStore
from ldpstream.agents.store.side_buckets import BucketedRead, buckets_for

#: reads of one poll before giving up on agreeing with the recorded buckets (a second one is
#: needed only when another worker recorded a window's buckets since this one sized it)
ATTEMPTS = 3
#: windows whose buckets a partition remembers (older ones forgotten when more)
KEEP = 16


@dataclasses.dataclass(frozen=True)
class SideWant:
    """The fields ``ids`` (device ids) of per-device side hash ``name`` of a window, whose
    previous window's is ``previous``; ``additive``: counters (agents/store/side_buckets.py
    :class:`BucketedRead`)."""

    name: str
    previous: str
    ids: Sequence[int]
    additive: bool


async def read_side(store: CountStore, cid: str, partition: int,
                    sizes: MutableMapping[str, int], wants: Sequence[SideWant],
                    expected: int = 0) -> tuple[int | None, list[list[bytes | None]]]:
    """The stored offset of the shard and, per want, the value of each of its ids (None:
    absent), read in one atomic step. ``sizes`` (side name → buckets, the partition's) is
    filled for each window read and corrected from what Redis recorded; ``expected``: the
    collection's ``expected_senders``."""
    if len(sizes) > KEEP:
        for name in [n for n in sizes if n not in {w.name for w in wants}]:
            del sizes[name]
    for _ in range(ATTEMPTS):
        for w in wants:
            if w.ids and w.name not in sizes:
                recorded, previous = await store.side_sizing(cid, partition, w.name, w.previous)
                sizes[w.name] = recorded if recorded is not None else \
                    buckets_for(previous, expected)
        reads = [BucketedRead(w.name, sizes.get(w.name, 1), w.ids, w.additive) for w in wants]
        plans = [r.wanted() for r in reads]
        stored, raw = await store.read_side_fields(cid, partition,
                                                   [x for plan in plans for x in plan])
        out: list[list[bytes | None]] = []
        agreed, at = True, 0
        for r, plan in zip(reads, plans):
            recorded, held, values = r.merge(raw[at:at + len(plan)])
            at += len(plan)
            if recorded is not None and recorded != r.buckets:
                sizes[r.name] = recorded
                agreed = False
            elif recorded is not None:
                metrics.SIDE_BUCKET_FILL.labels(cid, r.name.rsplit(":", 1)[0],
                                                str(partition)).set(held / recorded)
            out.append(values)
        if agreed:
            return stored, out
    raise RuntimeError(f"{keys.shard_prefix(cid, partition)}: the buckets of its per-device "
                       f"side state changed {ATTEMPTS} times during one read")
