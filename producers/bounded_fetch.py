"""Fetched Kafka record batches decompressed with a bound, before any memory is spent on them.

aiokafka decompresses a fetched batch whole (``DefaultRecordBatch._maybe_uncompress``) before the
application sees a single record, so a size check on the message comes too late: a ~32 KiB zstd
batch inflating to 1 GiB takes the consumer to gigabytes of memory, or kills it under a memory
cap at every restart (its offset never moves past the batch).

:func:`install` puts :class:`BoundedRecords` in front of the fetcher (it replaces the name
``MemoryRecords`` that ``aiokafka.consumer.fetcher`` builds every fetched message set with). Every
compressed v2 batch is decompressed here, into one preallocated buffer of ``max_bytes`` (the
codec stops when the buffer is full), and handed on as the equivalent uncompressed batch (CRC
recomputed), so aiokafka decompresses nothing and nothing is decompressed twice. A batch that
would inflate beyond the bound, or that a codec cannot decode, is replaced by a batch of ONE
record at the batch's last offset whose value is :data:`GUARD_MARKER` + a JSON reason: consumers
see it as one bad message (the worker dead-letters it to ``ldp.dlq`` with reason
``decompression_bomb``), the offsets of the whole batch are consumed, nothing is allocated.
Compressed legacy (v0/v1) batches are replaced the same way (reason ``legacy_compressed``): no
client of this system writes them.
"""
from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import crc32c
import numpy as np

__all__ = ["GUARD_MARKER", "BoundedRecords", "install", "installed_bound"]

#: value prefix of a record that stands for a refused batch
GUARD_MARKER = b"LDP!refused-batch:"

_LOG_OVERHEAD = 12            # base offset (q) + batch length (i)
_MAGIC_AT = 16
_HEADER = 61                  # v2 batch header size
_ATTR_AT = 21
_CRC_AT = 17
_LAST_DELTA = struct.Struct(">i")
_CODEC_NAMES = {1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

_bound: dict[str, Any] = {"max_bytes": None, "buffer": None}


class _TooLarge(Exception):
    pass


def installed_bound() -> int | None:
    """The bound in force in this process (None: not installed)."""
    return _bound["max_bytes"]


def _out_buffer(cap: int) -> np.ndarray:
    """One reusable output buffer of ``cap + 1`` bytes (the event loop decodes one batch at a
    time; pages are touched only as far as real batches fill it)."""
    buf = _bound["buffer"]
    if buf is None or len(buf) != cap + 1:
        buf = _bound["buffer"] = np.empty(cap + 1, dtype=np.uint8)
    return buf


def _cramjam_into(codec: str, data: memoryview, cap: int) -> memoryview:
    """zstd / lz4 (frame) decompression into the bounded buffer (the view is valid until the
    next decompression)."""
    import cramjam

    out = _out_buffer(cap)
    try:
        n = int(getattr(cramjam, codec).decompress_into(data, out))
    except cramjam.DecompressionError as exc:
        if "whole buffer" in str(exc):
            raise _TooLarge() from None
        raise
    if n > cap:
        raise _TooLarge()
    return out.data[:n]


def _gzip(data: memoryview, cap: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(data, cap + 1)
    if len(out) > cap or d.unconsumed_tail:
        raise _TooLarge()
    return out


def _snappy(data: memoryview, cap: int) -> bytes:
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
    return b"".join(bytes(cramjam.snappy.decompress_raw(bytes(b))) for b in blocks)


_DECODERS = {1: _gzip, 2: _snappy, 3: lambda d, cap: _cramjam_into("lz4", d, cap),
             4: lambda d, cap: _cramjam_into("zstd", d, cap)}


def _crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C of a batch (the ``crc32c`` package: the CPU's CRC instruction, about 5× faster
    than aiokafka's table-driven one, on every fetched byte of the worker's hot path)."""
    return crc32c.crc32c(data)


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


def _uncompressed(batch: memoryview, records: bytes | memoryview) -> bytearray:
    """``batch`` (v2, compressed) rewritten with its decompressed ``records`` (one copy)."""
    out = bytearray(_HEADER + len(records))
    out[:_HEADER] = batch[:_HEADER]
    out[_HEADER:] = records
    struct.pack_into(">i", out, 8, len(out) - _LOG_OVERHEAD)
    attrs = struct.unpack_from(">h", out, _ATTR_AT)[0]
    struct.pack_into(">h", out, _ATTR_AT, attrs & ~0x07)
    struct.pack_into(">I", out, _CRC_AT, _crc32c(memoryview(out)[_ATTR_AT:]))
    return out


def bound_message_set(raw: bytes, max_bytes: int) -> bytes:
    """``raw`` (a fetched message set) with every compressed batch decompressed within
    ``max_bytes`` or replaced (see the module doc). Uncompressed batches, batches with a bad CRC
    (aiokafka reports those) and a partial trailing batch are passed through unchanged."""
    view = memoryview(raw)
    pos, size = 0, len(view)
    parts: list[bytes | bytearray | memoryview] = []
    changed = False
    while size - pos >= _MAGIC_AT + 1:
        length = struct.unpack_from(">i", view, pos + 8)[0]
        end = pos + _LOG_OVERHEAD + length
        if length < 0 or end > size:
            break
        batch = view[pos:end]
        kept: bytes | bytearray | memoryview = batch
        magic = batch[_MAGIC_AT]
        if magic >= 2 and len(batch) >= _HEADER:
            codec = struct.unpack_from(">h", batch, _ATTR_AT)[0] & 0x07
            if codec and _crc32c(batch[_ATTR_AT:]) == struct.unpack_from(">I", batch, _CRC_AT)[0]:
                kept = _decompressed_or_replaced(batch, codec, max_bytes)
                changed = True
        elif magic < 2 and len(batch) > 17 and batch[17] & 0x07:  # v0/v1 attributes byte
            kept = _replacement(batch, "legacy_compressed",
                                f"a compressed v{magic} message set; only v2 batches accepted")
            changed = True
        parts.append(kept)
        pos = end
    if not changed:
        return raw
    parts.append(view[pos:])
    return b"".join(parts)


def _decompressed_or_replaced(batch: memoryview, codec: int, max_bytes: int) -> bytes | bytearray:
    name = _CODEC_NAMES.get(codec, str(codec))
    decoder = _DECODERS.get(codec)
    if decoder is None:
        return _replacement(batch, "decompression_bomb", f"unknown compression codec {codec}")
    try:
        records = decoder(batch[_HEADER:], max_bytes)
    except _TooLarge:
        return _replacement(batch, "decompression_bomb",
                            f"{name} batch of {len(batch)} bytes inflates beyond the bound of "
                            f"{max_bytes} bytes")
    except Exception as exc:  # noqa: BLE001 - any codec failure: the batch is unreadable
        return _replacement(batch, "decompression_bomb",
                            f"{name} batch of {len(batch)} bytes does not decompress: {exc}")
    return _uncompressed(batch, records)


class BoundedRecords:
    """Stands in for aiokafka's ``MemoryRecords`` in the fetcher (same interface)."""

    def __new__(cls, raw: bytes) -> Any:
        from aiokafka.record.memory_records import MemoryRecords

        return MemoryRecords(bound_message_set(bytes(raw), int(_bound["max_bytes"])))


def install(max_bytes: int) -> None:
    """Bound the decompressed size of every batch fetched by any aiokafka consumer of this
    process at ``max_bytes`` (idempotent; a second call keeps the larger bound)."""
    import aiokafka.consumer.fetcher as fetcher

    current = _bound["max_bytes"]
    if current is None or max_bytes > current:
        _bound["max_bytes"] = int(max_bytes)
    fetcher.MemoryRecords = BoundedRecords
