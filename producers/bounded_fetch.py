"""Fetched Kafka record batches decompressed with a bound, before any memory is spent on them.

aiokafka decompresses a fetched batch whole (``DefaultRecordBatch._maybe_uncompress``) before the
application sees a single record, so a size check on the message comes too late: a ~32 KiB zstd
batch inflating to 1 GiB takes the consumer to gigabytes of memory, or kills it under a memory
cap at every restart (its offset never moves past the batch).

:func:`install` puts :class:`BoundedRecords` in front of the fetcher (it replaces the name
``MemoryRecords`` that ``aiokafka.consumer.fetcher`` builds every fetched message set with). It
walks the message set batch by batch as aiokafka's does, when the consumer reaches each batch.
A compressed v2 batch is checked against its CRC (the ``crc32c`` package: the CPU's CRC
instruction), decompressed into a buffer of ``max_bytes`` (the codec stops when the buffer is
full) behind a copy of its header, and handed on as the equivalent uncompressed batch, read in
place: aiokafka decompresses nothing, nothing is decompressed twice, copied into a batch of its
own or joined into a new message set, and the CRC aiokafka checks is the one computed here on
the bytes as fetched (:class:`CheckedBatch`). A batch that would inflate beyond the bound, or
that a codec cannot decode, is replaced by a batch of ONE record at the batch's last offset whose
value is :data:`GUARD_MARKER` + a JSON reason: consumers see it as one bad message (the worker
dead-letters it to ``ldp.dlq`` with reason ``decompression_bomb``), the offsets of the whole batch
are consumed, nothing is allocated. Compressed legacy (v0/v1) batches are replaced the same way
(reason ``legacy_compressed``): no client of this system writes them. A batch with a bad CRC is
handed on as fetched and fails aiokafka's CRC check, as without the guard.

The buffers: one per message set being read (aiokafka reads a batch's records to the end before
it takes the next batch, so each batch of a set reuses the set's buffer), taken from a small pool
and given back when the set is read, so the pages of a buffer are mapped once, not per batch.
"""
from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import crc32c
import numpy as np
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecord, DefaultRecordBatch
from aiokafka.record.legacy_records import LegacyRecordBatch

__all__ = ["GUARD_MARKER", "BoundedRecords", "CheckedBatch", "install", "installed_bound"]

#: value prefix of a record that stands for a refused batch
GUARD_MARKER = b"LDP!refused-batch:"

_LOG_OVERHEAD = 12            # base offset (q) + batch length (i)
_MAGIC_AT = 16
_HEADER = 61                  # v2 batch header size
_LEGACY_MIN = 26              # a v0 message with its log overhead
_ATTR_AT = 21
_CRC_AT = 17
_LAST_DELTA = struct.Struct(">i")
_LENGTH = struct.Struct(">i")
_ATTRS = struct.Struct(">h")
_CRC = struct.Struct(">I")
_CODEC_NAMES = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
#: buffers kept for the next message sets (each holds only the pages its batches touched)
_POOL_SIZE = 4

_bound: dict[str, Any] = {"max_bytes": None}
_free: list[np.ndarray] = []


class _TooLarge(Exception):
    pass


def installed_bound() -> int | None:
    """The bound in force in this process (None: not installed)."""
    return _bound["max_bytes"]


def _take_buffer(size: int) -> np.ndarray:
    while _free:
        buf = _free.pop()
        if len(buf) == size:
            return buf
    return np.empty(size, dtype=np.uint8)


def _give_back(buf: np.ndarray) -> None:
    if len(_free) < _POOL_SIZE:
        _free.append(buf)


def _cramjam_into(codec: str, data: memoryview, out: np.ndarray, cap: int) -> int:
    """zstd / lz4 (frame) decompression into ``out`` (``cap + 1`` bytes); the size written."""
    import cramjam

    try:
        n = int(getattr(cramjam, codec).decompress_into(data, out))
    except cramjam.DecompressionError as exc:
        if "whole buffer" in str(exc):
            raise _TooLarge() from None
        raise
    if n > cap:
        raise _TooLarge()
    return n


def _copy_into(records: bytes, out: np.ndarray) -> int:
    out[:len(records)] = np.frombuffer(records, dtype=np.uint8)
    return len(records)


def _gzip(data: memoryview, out: np.ndarray, cap: int) -> int:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    records = d.decompress(data, cap + 1)
    if len(records) > cap or d.unconsumed_tail:
        raise _TooLarge()
    return _copy_into(records, out)


def _snappy(data: memoryview, out: np.ndarray, cap: int) -> int:
    import cramjam

    view = memoryview(data)
    if len(view) >= 16 and view[0] == 0x82 and bytes(view[1:7]) == b"SNAPPY":
        blocks, cursor = [], 16
        while cursor < len(view):
            (size,) = struct.unpack_from(">i", view, cursor)
            blocks.append(view[cursor + 4:cursor + 4 + size])
            cursor += 4 + size
    else:
        blocks = [view]
    total = sum(int(cramjam.snappy.decompress_raw_len(bytes(b))) for b in blocks)
    if total > cap:
        raise _TooLarge()
    return _copy_into(b"".join(bytes(cramjam.snappy.decompress_raw(bytes(b))) for b in blocks),
                      out)


_DECODERS = {1: _gzip, 2: _snappy, 3: lambda d, out, cap: _cramjam_into("lz4", d, out, cap),
             4: lambda d, out, cap: _cramjam_into("zstd", d, out, cap)}


def _replacement(batch: memoryview, reason: str, detail: str) -> bytes:
    """A v2 batch holding one record at ``batch``'s last offset, value = marker + JSON."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    base = struct.unpack_from(">q", batch, 0)[0]
    magic = batch[_MAGIC_AT]
    last_delta = _LAST_DELTA.unpack_from(batch, 23)[0] if magic >= 2 else 0
    value = GUARD_MARKER + json.dumps({
        "reason": reason, "detail": detail, "first_offset": base,
        "last_offset": base + last_delta, "batch_bytes": len(batch)}).encode()
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=len(value) + 1024)
    builder.append(last_delta, timestamp=None, key=None, value=value, headers=[])
    out = bytearray(builder.build())
    struct.pack_into(">q", out, 0, base)
    return bytes(out)


def _frames(view: memoryview) -> Iterator[memoryview]:
    """The complete batches of a fetched message set, in order (a partial trailing batch, cut
    by the fetch size, is left out: the next fetch starts with it)."""
    pos, size = 0, len(view)
    while size - pos >= _MAGIC_AT + 1:
        length = _LENGTH.unpack_from(view, pos + 8)[0]
        end = pos + _LOG_OVERHEAD + length
        if length < 0 or end > size:
            return
        yield view[pos:end]
        pos = end


class CheckedBatch:
    """A v2 batch whose CRC was checked when it was fetched (its compressed bytes, for a batch
    decompressed here): what aiokafka's fetcher asks of a batch, read from aiokafka's own
    ``DefaultRecordBatch`` over the bytes handed on, with :meth:`validate_crc` answering from
    that check."""

    __slots__ = ("_batch", "_crc_ok")

    def __init__(self, batch: DefaultRecordBatch, crc_ok: bool) -> None:
        self._batch = batch
        self._crc_ok = crc_ok

    def validate_crc(self) -> bool:
        return self._crc_ok

    @property
    def base_offset(self) -> int:
        return self._batch.base_offset

    @property
    def next_offset(self) -> int:
        return self._batch.next_offset

    @property
    def producer_id(self) -> int:
        return self._batch.producer_id

    @property
    def is_control_batch(self) -> bool:
        return self._batch.is_control_batch

    @property
    def is_transactional(self) -> bool:
        return self._batch.is_transactional

    def __iter__(self) -> DefaultRecordBatch:
        return iter(self._batch)

    def __next__(self) -> DefaultRecord:
        return next(self._batch)


class BoundedRecords:
    """Stands in for aiokafka's ``MemoryRecords`` in the fetcher (same interface: ``has_next``,
    ``next_batch``, ``size_in_bytes``), each batch bounded when it is reached (module doc).
    ``max_bytes``: the bound (default: the one :func:`install` set)."""

    def __init__(self, raw: bytes, max_bytes: int | None = None) -> None:
        self._size = len(raw)
        self._cap = int(_bound["max_bytes"] if max_bytes is None else max_bytes)
        self._frames = _frames(memoryview(raw))
        self._next = next(self._frames, None)
        self._buffer: np.ndarray | None = None

    def size_in_bytes(self) -> int:
        return self._size

    def has_next(self) -> bool:
        if self._next is None and self._buffer is not None:
            _give_back(self._buffer)   # the last batch has been read
            self._buffer = None
        return self._next is not None

    def next_batch(self) -> CheckedBatch | LegacyRecordBatch | None:
        batch = self._next
        if batch is None:
            return None
        self._next = next(self._frames, None)
        magic = batch[_MAGIC_AT]
        if len(batch) < (_HEADER if magic >= 2 else _LEGACY_MIN):
            raise CorruptRecordException(f"a record batch of {len(batch)} bytes is shorter than "
                                         f"its header")
        if magic < 2:
            if len(batch) > 17 and batch[17] & 0x07:  # v0/v1 attributes byte
                return CheckedBatch(DefaultRecordBatch(_replacement(
                    batch, "legacy_compressed",
                    f"a compressed v{magic} message set; only v2 batches accepted")), True)
            return LegacyRecordBatch(batch, magic)
        crc_ok = crc32c.crc32c(batch[_ATTR_AT:]) == _CRC.unpack_from(batch, _CRC_AT)[0]
        codec = _ATTRS.unpack_from(batch, _ATTR_AT)[0] & 0x07
        if not (codec and crc_ok):
            return CheckedBatch(DefaultRecordBatch(batch), crc_ok)
        return CheckedBatch(DefaultRecordBatch(self._decompressed_or_replaced(batch, codec)), True)

    def _decompressed_or_replaced(self, batch: memoryview, codec: int) -> memoryview | bytes:
        """``batch`` (v2, compressed, CRC checked) decompressed into this set's buffer behind a
        copy of its header (length and codec rewritten), or its replacement."""
        name = _CODEC_NAMES.get(codec, str(codec))
        decoder = _DECODERS.get(codec)
        if decoder is None:
            return _replacement(batch, "decompression_bomb", f"unknown compression codec {codec}")
        if self._buffer is None:
            self._buffer = _take_buffer(_HEADER + self._cap + 1)
        buf = self._buffer
        try:
            n = decoder(batch[_HEADER:], buf[_HEADER:], self._cap)
        except _TooLarge:
            return _replacement(batch, "decompression_bomb",
                                f"{name} batch of {len(batch)} bytes inflates beyond the bound "
                                f"of {self._cap} bytes")
        except Exception as exc:  # noqa: BLE001 - any codec failure: the batch is unreadable
            return _replacement(batch, "decompression_bomb",
                                f"{name} batch of {len(batch)} bytes does not decompress: {exc}")
        out = buf.data   # the buffer's bytes (a memoryview)
        out[:_HEADER] = batch[:_HEADER]
        _LENGTH.pack_into(out, 8, _HEADER + n - _LOG_OVERHEAD)
        _ATTRS.pack_into(out, _ATTR_AT, _ATTRS.unpack_from(out, _ATTR_AT)[0] & ~0x07)
        return out[:_HEADER + n]


def install(max_bytes: int) -> None:
    """Bound the decompressed size of every batch fetched by any aiokafka consumer of this
    process at ``max_bytes`` (idempotent; a second call keeps the larger bound)."""
    import aiokafka.consumer.fetcher as fetcher

    current = _bound["max_bytes"]
    if current is None or max_bytes > current:
        _bound["max_bytes"] = int(max_bytes)
    fetcher.MemoryRecords = BoundedRecords
