"""Redis count tensors, applied exactly once (DESIGN.md, "Exactly-once counting").

A worker counts a batch of reports with numpy and hands the per-tensor deltas to
:meth:`CountStore.apply_many` (or :meth:`CountStore.apply` for one partition) together with the
range of Kafka offsets the delta covers on its partition: ``(expected, offset]``, where
``expected`` is the offset the worker believes is stored (the one it sought from, or the end of
its previous delta; -1 when nothing is stored yet). One Lua script call compares-and-sets the
stored offset and adds every nonzero cell with ``BITFIELD ... INCRBY i64`` (at most 1,000
operations per BITFIELD call: Lua's ``unpack`` limit is 8,000 values and each operation takes 4):

- stored == ``expected`` (absent counts as -1): the delta is added and ``offset`` stored → APPLIED;
- stored >= ``offset``: the range is already counted (a replay, e.g. a retry after a timeout, or
  another worker got there first) → REPLAYED, nothing changes;
- anything else (stored inside the range, or behind ``expected``): the delta does not start where
  the counts end → CONFLICT, nothing changes; the worker must drop what it has pending for the
  partition and re-read from stored + 1 (:class:`ApplyResult` carries the stored offset).

So the applied ranges of a partition form one gap-free, overlap-free chain whoever applies them:
a frozen worker ("zombie") whose apply lands after the new owner read the offset is harmless —
either its range meets the stored offset (then it is counted and the new owner's overlapping delta
conflicts) or it conflicts itself. Without ``expected`` (``None``) a delta is applied when
``offset`` > stored (the pre-CAS rule, kept for callers that do not track ranges; it cannot detect
a stale overlapping delta, so the ingest service always passes ``expected``).

Several partitions of one collection go in ONE script call (:meth:`CountStore.apply_many`, one
call per flush of the ingest service): the call is atomic as a whole (no client sees part of it),
but it is not all-or-nothing — each partition is compared and applied on its own, so a partition
that conflicts (another worker took it over) does not hold back the others.

Keys, all under the hash tag ``{collection}`` so one script may touch them on Redis Cluster::

    ldp:{<id>}:t:<tensor key>:<chunk>    int64 big-endian cells (BITFIELD i64), chunk_cells each
    ldp:{<id>}:offsets                   hash partition -> last applied offset
    ldp:{<id>}:n                         reports counted
    ldp:{<id>}:sent_at_max               newest ``sent_at`` counted (unix seconds)
    ldp:{<id>}:est:<method>:<marginal>   latest estimate (JSON)
    ldp:{<id>}:hist:<method>:<marginal>  capped list of past estimates (JSON, newest first; the
                                         refresher caps it at history_cap_for(window, interval))

Tensors are read with GETRANGE and ``np.frombuffer(..., '>i8')``; a missing key or a short
string reads as zeros.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
import time
from typing import Any, Mapping, Sequence

import numpy as np

from ..estimators.mechanism import TensorSpec, marginal_key

__all__ = ["CountStore", "ApplyStatus", "ApplyResult", "PartitionDelta", "BITFIELD_OPS_PER_CALL",
           "DEFAULT_CHUNK_CELLS", "DEFAULT_HISTORY_CAP", "MAX_HISTORY_CAP", "history_cap_for",
           "key_prefix"]

DEFAULT_CHUNK_CELLS = 2**22           # 32 MiB of int64 per Redis string
BITFIELD_OPS_PER_CALL = 1000          # 4 values per op; Lua unpack() takes at most 8000
DEFAULT_HISTORY_CAP = 256             # past estimates kept per (method, marginal) by default
MAX_HISTORY_CAP = 10_000              # the most a collection may ask for (config.py enforces it)


def history_cap_for(drift_window_s: float, refresh_interval_s: float) -> int:
    """Past estimates to keep per (method, marginal) so that drift always finds one
    ``drift_window_s`` old: ``ceil(2 · drift_window_s / refresh_interval_s) + 4``.

    One refresh per interval needs ``window / interval + 1`` entries; the factor 2 covers refreshes
    closer together than the interval (several workers: the refresh lease lasts 0.8 interval;
    forced ``POST .../refresh``; timer jitter). A fixed cap would silently disable drift for a
    window longer than ``cap × interval``."""
    w, i = float(drift_window_s), float(refresh_interval_s)
    if not (w > 0 and i > 0 and math.isfinite(w) and math.isfinite(i)):
        raise ValueError(f"drift window and refresh interval must be finite and > 0 (got {w}, {i})")
    return math.ceil(2.0 * w / i) + 4

# KEYS: offsets, n, sent_at_max, chunk keys...
# ARGV: ops per BITFIELD call, number of partitions P, then 6 values per partition: partition,
#       expected previous offset ('' = unchecked: apply when offset > stored), offset, n_reports,
#       sent_at ('' = none), number of its chunk keys; then one text blob per chunk key (KEYS[4..]
#       in order, each partition's keys consecutive): "#<cell> <delta> #<cell> <delta> ...". One
#       blob per key keeps redis-py's argument packing out of the hot path (20k separate args cost
#       ~17 ms), and string.gmatch hands the script ready-made arguments (half the in-Redis time
#       of unpacking binary records with struct and formatting them in Lua, measured here).
# Returns per partition: status (1 applied, 0 replayed, -1 conflict), stored offset after (-1: none).
_APPLY_LUA = """
local maxargs = 4 * tonumber(ARGV[1])
local nparts = tonumber(ARGV[2])
local blob0 = 2 + 6 * nparts - 3
local k = 4
local out = {}
local n_add = 0
local applied = false
local sent, sent_s = nil, nil
for i = 0, nparts - 1 do
  local h = 3 + 6 * i
  local offset = tonumber(ARGV[h + 2])
  local nkeys = tonumber(ARGV[h + 5])
  local raw = redis.call('HGET', KEYS[1], ARGV[h])
  local stored = -1
  if raw then stored = tonumber(raw) end
  local status
  if ARGV[h + 1] == '' then
    if stored < offset then status = 1 else status = 0 end
  elseif stored == tonumber(ARGV[h + 1]) then status = 1
  elseif stored >= offset then status = 0
  else status = -1 end
  if status == 1 then
    for j = k, k + nkeys - 1 do
      local args = {}
      local a = 0
      for cell, delta in string.gmatch(ARGV[blob0 + j], '(%S+) (%S+)') do
        args[a + 1] = 'INCRBY'; args[a + 2] = 'i64'; args[a + 3] = cell; args[a + 4] = delta
        a = a + 4
        if a >= maxargs then
          redis.call('BITFIELD', KEYS[j], unpack(args, 1, a))
          a = 0
        end
      end
      if a > 0 then redis.call('BITFIELD', KEYS[j], unpack(args, 1, a)) end
    end
    redis.call('HSET', KEYS[1], ARGV[h], ARGV[h + 2])
    stored = offset
    applied = true
    n_add = n_add + tonumber(ARGV[h + 3])
    if ARGV[h + 4] ~= '' and ((not sent) or tonumber(ARGV[h + 4]) > sent) then
      sent = tonumber(ARGV[h + 4]); sent_s = ARGV[h + 4]
    end
  end
  k = k + nkeys
  out[2 * i + 1] = status
  out[2 * i + 2] = stored
end
if applied then redis.call('INCRBY', KEYS[2], n_add) end
if sent then
  local cur = redis.call('GET', KEYS[3])
  if (not cur) or tonumber(cur) < sent then redis.call('SET', KEYS[3], sent_s) end
end
return out
"""


class ApplyStatus(str, enum.Enum):
    """Outcome of one partition's delta in :meth:`CountStore.apply_many`."""

    APPLIED = "applied"      # counted; the stored offset is now the delta's offset
    REPLAYED = "replayed"    # stored offset >= the delta's offset: already counted, skipped
    CONFLICT = "conflict"    # the delta does not start at the stored offset: refused


_STATUS = {1: ApplyStatus.APPLIED, 0: ApplyStatus.REPLAYED, -1: ApplyStatus.CONFLICT}


@dataclasses.dataclass(frozen=True)
class PartitionDelta:
    """Counts of the reports at offsets ``(expected, offset]`` of one partition.

    ``expected``: the stored offset the delta continues from (-1: nothing stored yet); it is the
    offset the consumer sought from or the end of its previous delta, not ``first offset - 1``
    (Kafka offsets may have gaps: control records, compaction, retention). ``None`` applies the
    delta whenever ``offset`` > stored (unchecked; cannot detect an overlapping stale delta)."""

    partition: int
    offset: int
    deltas: Mapping[str, np.ndarray]
    n_reports: int
    expected: int | None = None
    sent_at_max: float | None = None


@dataclasses.dataclass(frozen=True)
class ApplyResult:
    """``status`` of a partition's delta and the partition's stored offset after the call
    (``None``: nothing stored). On CONFLICT (or a REPLAYED delta ending below ``stored``) a
    consumer must drop its pending deltas of the partition and re-read from ``stored + 1``."""

    partition: int
    status: ApplyStatus
    stored: int | None

    @property
    def applied(self) -> bool:
        return self.status is ApplyStatus.APPLIED


def key_prefix(collection: str) -> str:
    """``ldp:{<collection>}`` — every key of a collection starts with it (one hash slot)."""
    return "ldp:{" + collection + "}"


def _glob_escape(s: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in s)


class CountStore:
    """Count tensors, offsets and estimates of collections in Redis (``redis.asyncio``).

    ``redis`` is a ``redis.asyncio.Redis`` (or ``RedisCluster``) client; hiredis is used by
    redis-py when installed.
    """

    def __init__(self, redis: Any, *, chunk_cells: int = DEFAULT_CHUNK_CELLS,
                 history_cap: int = DEFAULT_HISTORY_CAP,
                 ops_per_call: int = BITFIELD_OPS_PER_CALL) -> None:
        if chunk_cells < 1:
            raise ValueError("chunk_cells must be >= 1")
        if not 1 <= ops_per_call <= 2000:
            raise ValueError("ops_per_call must be in 1..2000 (Lua unpack limit)")
        self.redis = redis
        self.chunk_cells = int(chunk_cells)
        self.history_cap = int(history_cap)
        self.ops_per_call = int(ops_per_call)
        self._apply = redis.register_script(_APPLY_LUA)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> "CountStore":
        """A store on a new ``redis.asyncio`` client for ``url``."""
        import redis.asyncio as aioredis

        return cls(aioredis.from_url(url), **kwargs)

    async def close(self) -> None:
        close = getattr(self.redis, "aclose", None) or self.redis.close
        await close()

    # --- key names ------------------------------------------------------------------------------
    def chunk_key(self, collection: str, tensor_key: str, chunk: int) -> str:
        return f"{key_prefix(collection)}:t:{tensor_key}:{chunk}"

    def _est_key(self, collection: str, kind: str, method: str, attrs: Sequence[str]) -> str:
        return f"{key_prefix(collection)}:{kind}:{method}:{marginal_key(tuple(attrs))}"

    # --- counting -------------------------------------------------------------------------------
    def _apply_args(self, collection: str, deltas: Mapping[str, np.ndarray]
                    ) -> tuple[list[str], list[str]]:
        """Chunk keys and, per key, the text ``"#<cell> <delta> ..."`` of its nonzero cells."""
        keys: list[str] = []
        blobs: list[str] = []
        for tkey, delta in deltas.items():
            flat = np.asarray(delta).ravel()
            if flat.size and flat.dtype.kind not in "iub":
                raise TypeError(f"delta {tkey!r} must be integer counts, got dtype {flat.dtype}")
            flat = flat.astype(np.int64, copy=False)
            nz = np.flatnonzero(flat)
            if nz.size == 0:
                continue
            chunk_of = nz // self.chunk_cells
            pairs = np.empty(2 * nz.size, dtype=np.int64)
            pairs[0::2] = nz - chunk_of * self.chunk_cells
            pairs[1::2] = flat[nz]
            cuts = np.flatnonzero(np.diff(chunk_of)) + 1
            for s, e in zip(np.concatenate(([0], cuts)).tolist(),
                            np.concatenate((cuts, [nz.size])).tolist()):
                keys.append(self.chunk_key(collection, tkey, int(chunk_of[s])))
                blobs.append(("#%d %d " * (e - s)) % tuple(pairs[2 * s:2 * e].tolist()))
        return keys, blobs

    async def apply(self, collection: str, partition: int, offset: int,
                    deltas: Mapping[str, np.ndarray], n_reports: int, *,
                    sent_at_max: float | None = None, expected: int | None = None) -> bool:
        """Add ``deltas`` (tensor key → integer array, flattened in C order) and record ``offset``
        for ``partition`` in one atomic script; True when applied.

        ``expected`` (the stored offset this delta continues from, -1 for none) makes it a
        compare-and-set: applied only when the stored offset equals it; False when the range is
        already counted or does not meet the stored offset (:meth:`apply_many` tells which).
        Without ``expected``: False (and nothing changes) when ``offset`` is not above the stored
        offset. ``sent_at_max`` (optional) raises ``ldp:{id}:sent_at_max`` (freshness gauge).
        """
        res = await self.apply_many(collection, [PartitionDelta(
            int(partition), int(offset), deltas, int(n_reports), expected, sent_at_max)])
        return res[0].applied

    async def apply_many(self, collection: str,
                         items: Sequence[PartitionDelta]) -> list[ApplyResult]:
        """Apply the deltas of several partitions of ``collection`` in ONE script call (see the
        module docstring for the compare-and-set). The call is atomic as a whole, but each
        partition is decided on its own: some may be APPLIED while others are REPLAYED or in
        CONFLICT (those change nothing). Results are in the order of ``items``."""
        if not items:
            return []
        pre = key_prefix(collection)
        keys: list[str] = []
        blobs: list[str] = []
        head: list[Any] = []
        for it in items:
            offset = int(it.offset)
            if it.expected is not None:
                expected = int(it.expected)
                if expected < -1 or offset <= expected:
                    raise ValueError(f"partition {it.partition}: delta range ({expected}, "
                                     f"{offset}] is empty or starts below -1")
            if offset < 0:
                raise ValueError(f"partition {it.partition}: offset must be >= 0 (got {offset})")
            k, b = self._apply_args(collection, it.deltas)
            keys += k
            blobs += b
            sent = it.sent_at_max
            sent_s = "" if sent is None or not math.isfinite(sent) else repr(float(sent))
            head += [int(it.partition), "" if it.expected is None else int(it.expected), offset,
                     int(it.n_reports), sent_s, len(k)]
        res = await self._apply(keys=[f"{pre}:offsets", f"{pre}:n", f"{pre}:sent_at_max", *keys],
                                args=[self.ops_per_call, len(items), *head, *blobs])
        out = []
        for i, it in enumerate(items):
            stored = int(res[2 * i + 1])
            out.append(ApplyResult(int(it.partition), _STATUS[int(res[2 * i])],
                                   None if stored < 0 else stored))
        return out

    # --- reading --------------------------------------------------------------------------------
    def _chunks(self, size: int) -> list[tuple[int, int]]:
        """(chunk index, cells in that chunk) of a tensor of ``size`` cells."""
        return [(c, min(self.chunk_cells, size - c * self.chunk_cells))
                for c in range(max(1, -(-size // self.chunk_cells)))] if size else []

    async def read_all(self, collection: str, specs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
        """Every tensor of ``specs`` (int64, ``spec.shape``), read in one MULTI/EXEC so they form a
        consistent snapshot."""
        plan: list[tuple[TensorSpec, list[tuple[int, int]]]] = []
        pipe = self.redis.pipeline(transaction=True)
        for spec in specs:
            chunks = self._chunks(spec.size)
            plan.append((spec, chunks))
            for c, cells in chunks:
                pipe.getrange(self.chunk_key(collection, spec.key, c), 0, 8 * cells - 1)
        raw = await pipe.execute() if any(ch for _, ch in plan) else []
        out: dict[str, np.ndarray] = {}
        i = 0
        for spec, chunks in plan:
            flat = np.zeros(spec.size, dtype=np.int64)
            for c, cells in chunks:
                buf = raw[i] or b""
                i += 1
                k = min(len(buf) // 8, cells)
                if k:
                    start = c * self.chunk_cells
                    flat[start:start + k] = np.frombuffer(buf, dtype=">i8", count=k)
            out[spec.key] = flat.reshape(spec.shape)
        return out

    async def read(self, collection: str, spec: TensorSpec) -> np.ndarray:
        """One tensor (int64, ``spec.shape``); missing cells are zeros."""
        return (await self.read_all(collection, [spec]))[spec.key]

    async def offsets(self, collection: str) -> dict[int, int]:
        """Last applied Kafka offset per partition."""
        raw = await self.redis.hgetall(f"{key_prefix(collection)}:offsets")
        return {int(k): int(v) for k, v in raw.items()}

    async def n(self, collection: str) -> int:
        """Reports counted so far."""
        raw = await self.redis.get(f"{key_prefix(collection)}:n")
        return int(raw) if raw is not None else 0

    async def sent_at_max(self, collection: str) -> float | None:
        """Newest ``sent_at`` among counted batches (None before any)."""
        raw = await self.redis.get(f"{key_prefix(collection)}:sent_at_max")
        return None if raw is None else float(raw)

    # --- estimates ------------------------------------------------------------------------------
    async def put_estimate(self, collection: str, method: str, attrs: Sequence[str],
                           payload: Mapping[str, Any], *, history_cap: int | None = None) -> None:
        """Store the latest estimate and push it on the capped history (one MULTI/EXEC).
        ``payload`` gets ``updated_at`` (now) if it has none. ``history_cap``: entries kept (the
        collection's :func:`history_cap_for`; default: the store's ``history_cap``)."""
        cap = self.history_cap if history_cap is None else int(history_cap)
        if cap < 1:
            raise ValueError(f"history_cap must be >= 1 (got {cap})")
        doc = _finite_json(dict(payload))
        doc.setdefault("updated_at", time.time())
        text = json.dumps(doc, allow_nan=False)
        hist = self._est_key(collection, "hist", method, attrs)
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(self._est_key(collection, "est", method, attrs), text)
        pipe.lpush(hist, text)
        pipe.ltrim(hist, 0, cap - 1)
        await pipe.execute()

    async def get_estimate(self, collection: str, method: str,
                           attrs: Sequence[str]) -> dict[str, Any] | None:
        """The latest estimate payload, or None."""
        raw = await self.redis.get(self._est_key(collection, "est", method, attrs))
        return None if raw is None else json.loads(raw)

    async def estimate_history(self, collection: str, method: str, attrs: Sequence[str],
                               since_s: float) -> list[dict[str, Any]]:
        """Past estimates whose ``updated_at`` lies within the last ``since_s`` seconds (a
        duration, not a timestamp), oldest first."""
        cutoff = time.time() - float(since_s)
        raw = await self.redis.lrange(self._est_key(collection, "hist", method, attrs), 0, -1)
        out = []
        for item in raw:  # newest first; stop at the first one too old
            doc = json.loads(item)
            if float(doc.get("updated_at", 0.0)) < cutoff:
                break
            out.append(doc)
        out.reverse()
        return out

    # --- admin ----------------------------------------------------------------------------------
    async def reset(self, collection: str) -> int:
        """Delete every key of ``collection`` (counts, offsets, n, estimates, history, and any
        other ``ldp:{id}:*`` key). Returns the number of keys deleted."""
        pattern = _glob_escape(key_prefix(collection)) + ":*"
        deleted = 0
        batch: list[Any] = []
        async for key in self.redis.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += await self.redis.delete(*batch)
                batch = []
        if batch:
            deleted += await self.redis.delete(*batch)
        return int(deleted)


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
