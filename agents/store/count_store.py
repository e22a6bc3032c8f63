"""Redis count tensors, applied exactly once, per shard and time bucket (docs/windows.md,
docs/pipeline.md "Exactly once").

A worker counts a batch of reports with numpy and hands the deltas to
:meth:`CountStore.apply_many` together with the range of Kafka offsets they cover on their
partition: ``(expected, offset]``, where ``expected`` is the offset the worker believes is stored
(the one it sought from, or the end of its previous delta; -1 when nothing is stored yet). One Lua
call per partition ("shard", agents/store/keys.py) compares-and-sets the stored offset and adds every
nonzero cell with ``BITFIELD ... INCRBY i64`` (at most 1,000 operations per BITFIELD call: Lua's
``unpack`` limit is 8,000 values and each operation takes 4):

- stored == ``expected`` (absent counts as -1): the delta is added and ``offset`` stored → APPLIED;
- stored >= ``offset``: the range is already counted (a replay, e.g. a retry after a timeout, or
  another worker got there first) → REPLAYED, nothing changes;
- anything else (stored inside the range, or behind ``expected``): the delta does not start where
  the counts end → CONFLICT, nothing changes; the worker must drop what it has pending for the
  partition and re-read from stored + 1 (:class:`ApplyResult` carries the stored offset).

So the applied ranges of a partition form one gap-free, overlap-free chain whoever applies them: a
frozen worker ("zombie") whose apply lands after the new owner read the offset is harmless. Without
``expected`` (``None``) a delta is applied when ``offset`` > stored (kept for callers that do not
track ranges; the ingest service always passes ``expected``).

A delta is keyed by (layout, fine bucket): the layout (agents/store/layout.py) of the mechanism version
the reports used, and the fine time bucket of their record timestamp (ldpstream/windows.py; None: the
all-time tensor only). The script adds it to the fine bucket, to the coarse bucket containing it
and to the all-time tensor, and sets every bucket key to expire after the retention
(``PEXPIREAT``, deterministic: the same on a replay). The partitions of one flush are applied by
concurrent calls, each decided on its own (a conflict on one does not hold back the others); each
call also adds the shard's ``side`` counters (quotas) atomically with the counts.

Cells are read with GETRANGE and ``np.frombuffer(..., '>i8')``; a missing key or a short string
reads as zeros.
"""
from __future__ import annotations

import asyncio
import functools
import json
import math
import time
import uuid
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ldpstream.agents.store import keys
from ldpstream.agents.store.apply_delta import (
    _STATUS,
    ApplyResult,
    CellsKey,
    PartitionDelta,
    SideBucketMeta,
    SideLog,
    SidePatch,
    SideStaged,
    SideValues,
    expand_levels,
)
from ldpstream.agents.store.apply_guard import expire_ms, finite_or_none
from ldpstream.agents.store.layout import Layout
from ldpstream.agents.store.packed_delta import PACKED_FILL, packed_blob, wants_packed
from ldpstream.agents.store.scripts import (
    APPLY_LUA,
    FIELDS_LUA,
    NOTE_START_LUA,
    REBASE_LUA,
    RESET_HOLD_S,
    RESET_SHARD_LUA,
    ROWS_LUA,
    SIZING_LUA,
)
from ldpstream.redis_client import run_script, run_script_after_sets
from ldpstream.windows import BucketPolicy

__all__ = ["CountStore", "BITFIELD_OPS_PER_CALL", "DEFAULT_CHUNK_CELLS", "STAGE_TTL_MS"]

#: how long a staging key (:class:`SideStaged`) outlives an apply that never came
STAGE_TTL_MS = 600_000

#: side-counter name of the poison-pill breaker's state (starts, attempts per message)
BREAKER = "breaker"
DEFAULT_CHUNK_CELLS = 2**22           # 32 MiB of int64 per Redis string
BITFIELD_OPS_PER_CALL = 1000          # 4 values per op; Lua unpack() takes at most 8000


def _parts(partitions: int | Sequence[int]) -> list[int]:
    """``partitions``: a collection's partition count, or the partitions themselves."""
    return list(range(partitions)) if isinstance(partitions, int) else [int(p) for p in partitions]


class CountStore:
    """Count tensors, offsets and estimates of collections in Redis (``redis.asyncio`` client,
    single server or ``RedisCluster``)."""

    def __init__(self, redis: Any, *, chunk_cells: int = DEFAULT_CHUNK_CELLS,
                 ops_per_call: int = BITFIELD_OPS_PER_CALL,
                 packed_fill: float = PACKED_FILL) -> None:
        """``packed_fill``: the fill from which a chunk delta goes packed
        (agents/store/packed_delta.py; ``math.inf``: never, 0: whenever it has enough cells)."""
        if chunk_cells < 1:
            raise ValueError("chunk_cells must be >= 1")
        if not 1 <= ops_per_call <= 2000:
            raise ValueError("ops_per_call must be in 1..2000 (Lua unpack limit)")
        self.redis = redis
        self.chunk_cells = int(chunk_cells)
        self.ops_per_call = int(ops_per_call)
        self.packed_fill = float(packed_fill)
        self._apply = redis.register_script(APPLY_LUA)
        self._rebase = redis.register_script(REBASE_LUA)
        self._rows = redis.register_script(ROWS_LUA)
        self._fields = redis.register_script(FIELDS_LUA)
        self._sizing = redis.register_script(SIZING_LUA)
        self._note_start = redis.register_script(NOTE_START_LUA)
        self._reset_shard = redis.register_script(RESET_SHARD_LUA)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> "CountStore":
        """A store on a new ``redis.asyncio`` client for ``url`` (one server, or a Redis Cluster
        for ``redis+cluster://``: ldpstream/redis_client.py)."""
        from ldpstream.redis_client import connect

        return cls(connect(url), **kwargs)

    async def close(self) -> None:
        await self.redis.aclose()

    # --- counting -------------------------------------------------------------------------------
    def _blobs(self, collection: str, partition: int,
               expanded: Mapping[tuple[Layout, str, int], tuple[np.ndarray, float | None]]
               ) -> tuple[list[str], list[Any]]:
        """Chunk keys and, per key, [PEXPIREAT ms or '', its delta]: packed when dense
        (agents/store/packed_delta.py), else "#<cell> <delta> ..." of its nonzero cells."""
        out_keys: list[str] = []
        args: list[Any] = []
        cc = self.chunk_cells
        for (layout, level, bucket), (flat, exp) in expanded.items():
            nz = np.flatnonzero(flat)
            if nz.size == 0:
                continue
            chunk_of = nz // cc
            cuts = np.flatnonzero(np.diff(chunk_of)) + 1
            exp_ms = expire_ms(exp)
            for s, e in zip(np.concatenate(([0], cuts)).tolist(),
                            np.concatenate((cuts, [nz.size])).tolist()):
                chunk = int(chunk_of[s])
                base = chunk * cc
                lo, hi = int(nz[s]), int(nz[e - 1])
                out_keys.append(keys.counts_key(collection, partition, layout.id, layout.version,
                                                level, bucket, chunk))
                blob: str | bytes
                if wants_packed(e - s, hi - lo + 1, self.packed_fill):
                    blob = packed_blob(flat[lo:hi + 1], lo - base)
                else:
                    pairs = np.empty(2 * (e - s), dtype=np.int64)
                    pairs[0::2] = nz[s:e] - base
                    pairs[1::2] = flat[nz[s:e]]
                    blob = ("#%d %d " * (e - s)) % tuple(pairs.tolist())
                args += [exp_ms, blob]
        return out_keys, args

    async def apply_many(self, collection: str, items: Sequence[PartitionDelta],
                         policy: BucketPolicy | None = None) -> list[ApplyResult]:
        """Apply the deltas of several partitions of ``collection`` (one script call each,
        concurrently; see the module docstring for the compare-and-set). Each partition is decided
        on its own. Results are in the order of ``items``."""
        calls = []
        for it in items:
            offset = int(it.offset)
            if it.expected is not None:
                expected = int(it.expected)
                if expected < -1 or offset <= expected:
                    raise ValueError(f"partition {it.partition}: delta range ({expected}, "
                                     f"{offset}] is empty or starts below -1")
            if offset < 0:
                raise ValueError(f"partition {it.partition}: offset must be >= 0 (got {offset})")
            p = int(it.partition)
            ck, cargs = self._blobs(collection, p, expand_levels(it.cells, policy))
            sk: list[str] = []
            sargs: list[Any] = []
            staged: dict[str, bytes | bytearray | memoryview] = {}
            for name, sc in it.side.items():
                blob: str | bytes
                if isinstance(sc, SideStaged):
                    stage = keys.side_key(collection, p, f"{name}:stage:{uuid.uuid4().hex}")
                    staged[stage] = sc.data
                    sk += [stage, keys.side_key(collection, p, name)]
                    sargs += ["", "<", expire_ms(sc.expire_at), ">"]
                    continue
                if isinstance(sc, SidePatch):
                    blob = sc.data
                elif isinstance(sc, SideLog):
                    blob = (b"!" if sc.replace else b"+") + sc.data
                elif isinstance(sc, SideBucketMeta):
                    blob = f"?{int(sc.buckets)}"
                elif isinstance(sc, SideValues):
                    blob = "=" + " ".join(f"{f} {v}" for f, v in sc.values.items())
                else:
                    blob = " ".join(f"{f} {int(v)}" for f, v in sc.increments.items() if int(v))
                if blob not in ("", "=", b"+"):
                    sk.append(keys.side_key(collection, p, name))
                    sargs += [expire_ms(sc.expire_at), blob]
            sent = finite_or_none(it.sent_at_max)
            sent_s = "" if sent is None else repr(sent)
            calls.append(functools.partial(
                self._run_apply, staged,
                [keys.offsets_key(collection, p), keys.sent_at_key(collection, p), *ck, *sk],
                [self.ops_per_call, "" if it.expected is None else int(it.expected), offset,
                 int(it.n_reports), sent_s, len(ck), len(sk), *cargs, *sargs]))
        # one call per item; items of different partitions run concurrently, those of one
        # partition in their order (each continues from the previous one's offset)
        order: dict[int, list[int]] = {}
        for i, it in enumerate(items):
            order.setdefault(int(it.partition), []).append(i)
        res: list[Any] = [None] * len(items)

        async def run(idx: list[int]) -> None:
            for i in idx:
                res[i] = await calls[i]()

        await asyncio.gather(*(run(idx) for idx in order.values()))
        out = []
        for it, (status, stored) in zip(items, res):
            stored = int(stored)
            out.append(ApplyResult(int(it.partition), _STATUS[int(status)],
                                   None if stored < 0 else stored))
        return out

    async def _run_apply(self, staged: Mapping[str, bytes | bytearray | memoryview],
                         keys_: list[str],
                         args: list[Any]) -> Any:
        """One apply call, its staged side strings written first (they expire by themselves
        if the call never comes: a crash in between)."""
        return await run_script_after_sets(
            self.redis, self._apply, keys_, args,
            {k: d if isinstance(d, bytes) else memoryview(d) for k, d in staged.items()},
            STAGE_TTL_MS)

    async def apply(self, collection: str, partition: int, offset: int,
                    cells: Mapping[CellsKey, np.ndarray], n_reports: int, *,
                    sent_at_max: float | None = None, expected: int | None = None,
                    policy: BucketPolicy | None = None) -> bool:
        """One partition's delta (see :meth:`apply_many`); True when applied."""
        res = await self.apply_many(collection, [PartitionDelta(
            int(partition), int(offset), cells, int(n_reports), expected, sent_at_max)], policy)
        return res[0].applied

    # --- reading --------------------------------------------------------------------------------
    def _chunks(self, size: int) -> list[tuple[int, int]]:
        """(chunk index, cells in that chunk) of a layout of ``size`` cells."""
        return [(c, min(self.chunk_cells, size - c * self.chunk_cells))
                for c in range(max(1, -(-size // self.chunk_cells)))]

    async def read_cells(self, collection: str, layout: Layout,
                         where: Iterable[tuple[int, str, int]]) -> dict[tuple[int, str, int], np.ndarray]:
        """Flat int64 cells of ``layout`` at each (partition, level, bucket) of ``where`` (one
        pipelined round trip; a missing key reads as zeros)."""
        where = list(where)
        if not where:
            return {}
        chunks = self._chunks(layout.size)
        pipe = self.redis.pipeline(transaction=False)
        for p, level, b in where:
            for c, cells in chunks:
                pipe.getrange(keys.counts_key(collection, p, layout.id, layout.version, level, b,
                                              c), 0, 8 * cells - 1)
        raw = await pipe.execute()
        out: dict[tuple[int, str, int], np.ndarray] = {}
        i = 0
        for w in where:
            flat = np.zeros(layout.size, dtype=np.int64)
            for c, cells in chunks:
                buf = raw[i] or b""
                i += 1
                k = min(len(buf) // 8, cells)
                if k:
                    start = c * self.chunk_cells
                    flat[start:start + k] = np.frombuffer(buf, dtype=">i8", count=k)
            out[w] = flat
        return out

    async def read_heads(self, collection: str, layout: Layout,
                         where: Iterable[tuple[int, str, int]]) -> dict[tuple[int, str, int], int]:
        """Cell 0 (reports counted) of each (partition, level, bucket): what changed since the
        last read is seen without reading the tensors (a bucket only grows)."""
        where = list(where)
        if not where:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for p, level, b in where:
            pipe.getrange(keys.counts_key(collection, p, layout.id, layout.version, level, b, 0),
                          0, 7)
        raw = await pipe.execute()
        return {w: (int(np.frombuffer(r, dtype=">i8", count=1)[0]) if r and len(r) >= 8 else 0)
                for w, r in zip(where, raw)}

    async def read_all_time(self, collection: str, partitions: int | Sequence[int],
                            layouts: Mapping[int, Layout]) -> dict[int, dict[str, np.ndarray]]:
        """All-time counts summed over ``partitions``: version → tensor key → counts."""
        out: dict[int, dict[str, np.ndarray]] = {}
        partitions = _parts(partitions)
        for v, layout in layouts.items():
            got = await self.read_cells(collection, layout,
                                        [(p, keys.LEVEL_ALL, 0) for p in partitions])
            total = np.zeros(layout.size, dtype=np.int64)
            for flat in got.values():
                total += flat
            out[v] = layout.unpack(total)
        return out

    async def offset(self, collection: str, partition: int) -> int | None:
        """Last applied Kafka offset of one partition (None: nothing applied yet)."""
        raw = await self.redis.hget(keys.offsets_key(collection, partition), "offset")
        return None if raw is None else int(raw)

    async def offsets(self, collection: str, partitions: int | Sequence[int]) -> dict[int, int]:
        """Last applied Kafka offset of each of ``partitions`` that has one."""
        partitions = _parts(partitions)
        pipe = self.redis.pipeline(transaction=False)
        for p in partitions:
            pipe.hget(keys.offsets_key(collection, p), "offset")
        raw = await pipe.execute()
        return {int(p): int(v) for p, v in zip(partitions, raw) if v is not None}

    async def read_side_fields(self, collection: str, partition: int,
                               wanted: Sequence[tuple[str, Sequence[str]]]
                               ) -> tuple[int | None, list[list[bytes | None]]]:
        """The stored offset of a shard and, read in the same atomic step, the values of the
        ``fields`` of each of its side hashes ``(name, fields)`` in ``wanted`` (None: absent);
        one script call (agents/store/scripts.py ``FIELDS_LUA``)."""
        if not wanted:
            return await self.offset(collection, partition), []
        raw = await run_script(
            self.redis, self._fields,
            [keys.offsets_key(collection, partition),
             *(keys.side_key(collection, partition, name) for name, _ in wanted)],
            [" ".join(fields) for _, fields in wanted])
        stored = None if raw[0] is None else int(raw[0])
        return stored, [[None if v is None else bytes(v) for v in vals] for vals in raw[1:]]

    async def side_sizing(self, collection: str, partition: int, name: str, previous: str
                          ) -> tuple[int | None, int]:
        """The buckets recorded for the per-device side hash ``name`` of a window (None: none
        yet) and the fields of the window before (side hash ``previous``, bucketed or written
        by earlier versions as one hash); agents/store/side_buckets.py."""
        raw = await run_script(
            self.redis, self._sizing,
            [keys.side_key(collection, partition, keys.side_meta_name(name)),
             keys.side_key(collection, partition, keys.side_meta_name(previous)),
             keys.side_key(collection, partition, previous)], [])
        return (None if raw[0] is None else int(raw[0])), int(raw[1])

    async def read_side_bytes(self, collection: str, partition: int, name: str) -> bytes | None:
        """A side string of the shard (a :class:`SideLog`'s; None when absent)."""
        raw = await self.redis.get(keys.side_key(collection, partition, name))
        return None if raw is None else bytes(raw)

    async def read_side_rows(self, collection: str, partition: int, name: str, row_bytes: int,
                             offsets: bytes) -> bytes:
        """Rows of ``row_bytes`` at the byte ``offsets`` (u32 little-endian) of a side string,
        concatenated (agents/store/memo_log.py: a device state segment)."""
        if not offsets:
            return b""
        raw = await run_script(self.redis, self._rows,
                               [keys.side_key(collection, partition, name)],
                               [int(row_bytes), offsets])
        return bytes(raw)

    # --- poison-pill breaker (agents/ingest/breaker.py) ------------------------------------------------
    async def hold(self, collection: str, partition: int,
                   offset: int | None) -> tuple[bool, tuple[int, int] | None]:
        """A worker takes the partition, starting after ``offset`` (None: the beginning). Returns
        (the previous owner died holding it, the (first offset, size) of the chunk it was
        processing carefully from the same offset, if any)."""
        died, chunk = await run_script(self.redis, self._note_start,
                                       [keys.side_key(collection, partition, BREAKER)],
                                       [-1 if offset is None else int(offset)])
        text = chunk.decode() if isinstance(chunk, bytes) else str(chunk)
        first, _, size = text.partition(":")
        return bool(int(died)), (int(first), int(size)) if text else None

    async def note_chunk(self, collection: str, partition: int, first: int, size: int) -> None:
        """The holder starts processing ``size`` messages from offset ``first`` carefully."""
        await self.redis.hset(keys.side_key(collection, partition, BREAKER), "chunk",
                              f"{int(first)}:{int(size)}")

    async def release(self, collection: str, partitions: Sequence[int]) -> None:
        """The holder lets the partitions go cleanly (revoked, stopping)."""
        pipe = self.redis.pipeline(transaction=False)
        for p in partitions:
            pipe.hset(keys.side_key(collection, p, BREAKER), mapping={"live": 0, "chunk": ""})
        await pipe.execute()

    # --- log identity (agents/ingest/log_identity.py) -------------------------------------------------
    async def log_states(self, collection: str, partitions: int | Sequence[int]
                         ) -> dict[int, tuple[int | None, str | None]]:
        """Per partition: (stored offset or None, log mark or None): the mark (field ``log`` of
        the offsets hash) names one record of the log the offset counts in."""
        partitions = _parts(partitions)
        pipe = self.redis.pipeline(transaction=False)
        for p in partitions:
            pipe.hmget(keys.offsets_key(collection, p), "offset", "log")
        out = {}
        for p, (off, mark) in zip(partitions, await pipe.execute()):
            out[int(p)] = (None if off is None else int(off),
                           None if mark is None else (mark.decode() if isinstance(mark, bytes)
                                                      else str(mark)))
        return out

    async def set_log_mark(self, collection: str, partition: int, mark: str) -> bool:
        """Record ``mark`` as the partition's log mark unless one is recorded (HSETNX)."""
        return bool(await self.redis.hsetnx(keys.offsets_key(collection, partition), "log", mark))

    async def rebase_log(self, collection: str, partition: int, expected: int | None,
                         new: int | None, event: Mapping[str, Any]) -> tuple[bool, int | None]:
        """Compare-and-set the stored offset from ``expected`` to ``new`` (None: nothing stored)
        after its log was found recreated or truncated; drops the log mark, counts the reset and
        keeps ``event`` (JSON) in the offsets hash. Returns (done, stored offset after)."""
        ok, stored = await run_script(self.redis, self._rebase, [keys.offsets_key(collection,
                                                                                  partition)],
                                      [-1 if expected is None else int(expected),
                                       -1 if new is None else int(new), json.dumps(dict(event))])
        stored = int(stored)
        return bool(int(ok)), None if stored < 0 else stored

    async def n(self, collection: str, partitions: int | Sequence[int]) -> int:
        """Reports counted so far on ``partitions`` (all versions, all time)."""
        pipe = self.redis.pipeline(transaction=False)
        for p in _parts(partitions):
            pipe.hget(keys.offsets_key(collection, p), "n")
        return sum(int(v) for v in await pipe.execute() if v is not None)

    async def sent_at_max(self, collection: str, partitions: int | Sequence[int]) -> float | None:
        """Newest ``sent_at`` among counted batches (None before any)."""
        pipe = self.redis.pipeline(transaction=False)
        for p in _parts(partitions):
            pipe.get(keys.sent_at_key(collection, p))
        vals = [float(v) for v in await pipe.execute() if v is not None]
        return max(vals) if vals else None

    # --- estimates ------------------------------------------------------------------------------
    async def put_estimates(self, collection: str,
                            payloads: Sequence[Mapping[str, Any]]) -> None:
        """Store the latest estimate of each payload (its ``window``, ``method`` and ``attrs``
        name the key), in one pipelined round trip. A payload gets ``updated_at`` (now) if it
        has none."""
        pipe = self.redis.pipeline(transaction=False)
        for payload in payloads:
            doc = _finite_json(dict(payload))
            doc.setdefault("updated_at", time.time())
            pipe.set(keys.estimate_key(collection, doc["window"], doc["method"], doc["attrs"]),
                     json.dumps(doc, allow_nan=False))
        if payloads:
            await pipe.execute()

    async def get_estimate(self, collection: str, window: str, method: str,
                           attrs: Sequence[str]) -> dict[str, Any] | None:
        """The latest estimate payload, or None."""
        raw = await self.redis.get(keys.estimate_key(collection, window, method, attrs))
        return None if raw is None else json.loads(raw)

    # --- admin ----------------------------------------------------------------------------------
    async def scan_keys(self, collection: str) -> list[Any]:
        """Every key of ``collection`` (all shards, collection-wide keys and estimates)."""
        found: list[Any] = []
        for pattern in keys.collection_patterns(collection):
            found += [k async for k in self.redis.scan_iter(match=pattern, count=1000)]
        return found

    async def reset(self, collection: str, *, keep_offsets: bool = False) -> int:
        """Delete every key of ``collection`` (counts, estimates, leases, offsets).
        ``keep_offsets``: keep each partition's stored Kafka offset (its ``n`` is zeroed), so that
        reports already counted are not counted again when a partition moves to another worker,
        which seeks to the stored offset. Each shard is reset by one script call, all its keys at
        once, with its applies held off from before its keys are listed (a held-off delta is
        refused as a CONFLICT: the worker re-reads and applies it after): applies land wholly
        before or wholly after, so ``n`` always equals the counts. Returns the keys deleted."""
        deleted = 0
        shards: set[str] = set()
        for key in await self.scan_keys(collection):
            name = key.decode() if isinstance(key, bytes) else str(key)
            if name.startswith("ldp:{%s#" % collection):
                shards.add(name[:name.index("}") + 1])
            else:
                deleted += int(await self.redis.delete(key))
        for prefix in sorted(shards):
            deleted += await self._reset_one(prefix, keep_offsets)
        return deleted

    async def _reset_one(self, prefix: str, keep_offsets: bool) -> int:
        """Reset the shard whose keys start with ``prefix`` (see :meth:`reset`)."""
        off = prefix + ":off"
        await self.redis.hset(off, "reset_until", int((time.time() + RESET_HOLD_S) * 1000))
        names = [k async for k in self.redis.scan_iter(match=keys.glob_escape(prefix) + ":*",
                                                       count=1000)]
        return int(await run_script(self.redis, self._reset_shard, [off, *names],
                                    ["1" if keep_offsets else "0"]))


def _finite_json(obj: Any) -> Any:
    """JSON-ready copy: numpy arrays/scalars to Python, tuples to lists, NaN/inf to None."""
    if isinstance(obj, np.ndarray):
        obj = obj.tolist()
    elif isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, dict):
        return {str(k): _finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_json(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
