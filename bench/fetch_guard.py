"""``ldpstream bench fetch [--json] [--quick]``: cost of the bounded decompression of fetched
batches (producers/bounded_fetch.py) beside aiokafka's own, in one run.

Fetched message sets are built the way the device side produces them: record batches of
report-batch messages (500 rr-ind reports of 8 attributes each, ~4 KiB) compressed with lz4 (the
publisher's default) or zstd, ~1 MiB of messages per batch. Timed per codec, on the same bytes,
best of ``repeats``: aiokafka decoding every record (``MemoryRecords``, native decompression),
and the guard's ``BoundedRecords`` read the same way (each batch decompressed once into the bounded
buffer and read there, its CRC checked on the fetched bytes). Reported: MB/s of uncompressed
messages and the ratio guard/native time.
"""
from __future__ import annotations

import json
import struct
import time
from typing import Any

import numpy as np

CODECS = {"lz4": 3, "zstd": 4}


def _message_set(codec: int, batches: int, per_batch: int, rng: np.random.Generator) -> tuple[bytes, int]:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    from ldpstream.producers.codec import encode_batch

    shape = np.array([9, 16, 7, 15, 6, 5, 2, 2])
    out, raw, base = [], 0, 0
    for _ in range(batches):
        b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                      producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                      batch_size=1 << 24)
        for i in range(per_batch):
            msg = encode_batch("adult", 0, rng.integers(0, shape, size=(500, 8)),
                               device_ids=rng.integers(0, 10**6, size=500, dtype=np.uint64))
            raw += len(msg)
            b.append(i, timestamp=None, key=None, value=msg, headers=[])
        blob = bytearray(b.build())
        struct.pack_into(">q", blob, 0, base)
        base += per_batch
        out.append(bytes(blob))
    return b"".join(out), raw


def _decode_all(records: Any) -> int:
    """Bytes of every record value of a ``MemoryRecords`` or ``BoundedRecords``, each batch's
    CRC checked as aiokafka's fetcher checks it."""
    n = 0
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc()
        for r in batch:
            n += len(r.value)
    return n


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run(quick: bool = False) -> list[dict[str, Any]]:
    from aiokafka.record.memory_records import MemoryRecords

    from ldpstream.producers.bounded_fetch import BoundedRecords

    rng = np.random.default_rng(0)
    batches, per_batch, repeats = (4, 64, 3) if quick else (16, 256, 5)
    rows = []
    for name, codec in CODECS.items():
        raw, size = _message_set(codec, batches, per_batch, rng)
        assert _decode_all(BoundedRecords(raw, 16 << 20)) == _decode_all(MemoryRecords(raw)) == size
        native = _best(lambda: _decode_all(MemoryRecords(raw)), repeats)
        guarded = _best(lambda: _decode_all(BoundedRecords(raw, 16 << 20)), repeats)
        rows.append({"codec": name, "messages_mb": round(size / 1e6, 2),
                     "compressed_mb": round(len(raw) / 1e6, 2),
                     "native_mb_s": round(size / native / 1e6, 1),
                     "guarded_mb_s": round(size / guarded / 1e6, 1),
                     "ratio": round(guarded / native, 2)})
    return rows


def main(args: Any) -> int:
    rows = run(quick=bool(getattr(args, "quick", False)))
    if getattr(args, "json", False):
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'codec':6} {'messages MB':>11} {'compressed MB':>13} {'aiokafka MB/s':>13} "
          f"{'guarded MB/s':>12} {'time ratio':>10}")
    for r in rows:
        print(f"{r['codec']:6} {r['messages_mb']:>11} {r['compressed_mb']:>13} "
              f"{r['native_mb_s']:>13} {r['guarded_mb_s']:>12} {r['ratio']:>10}")
    return 0
