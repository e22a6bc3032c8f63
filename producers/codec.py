"""The report-batch wire format, shared by devices (producers) and workers (agents).

One Kafka message carries a *report batch*: a header, optional device ids, then ``n`` packed
reports of ``width`` small unsigned integers each (docs/pipeline.md, "Wire format"). All integers are
little-endian::

    offset  size  field
    0       4     magic b"LDPB"
    4       1     format version (1)
    5       1     flags (bit 0: device ids present; bit 1: batch key present; bit 2:
                  authenticated by the sender device, needs bit 1; others must be 0)
    6       1     L = length of the collection id
    7       L     collection id, UTF-8 (1..255 bytes)
    7+L     4     config version, u32
    11+L    8     sent_at, f64 unix seconds (finite)
    19+L    4     n, u32 (>= 1)
    23+L    2     width, u16 (>= 1)
    25+L    1     value dtype code: 1 = u8, 2 = u16, 4 = u32
    26+L    16    batch key (only when flags bit 1): sender device id u64, sequence u64
    ...     8n    device ids, u64 (only when flags bit 0)
    ...     n*width*code  values, row-major
    ...     1+F   fleet name: u8 length F (1..255) + UTF-8 (only when flags bit 2)
    ...     32    MAC: HMAC-SHA256 under the sender's device key of every byte before it
                  (only when flags bit 2; ldpstream/credentials/device_keys.py)

The *batch key* makes a batch idempotent: a device numbers its batches (sequence strictly
increasing per sender id), and a batch that arrives twice (a retry after a lost answer, an MQTT
redelivery) is counted once.

Decoding is vectorized (``np.frombuffer``); no Python loop over reports; :func:`decode_uniform`
decodes many same-layout messages (e.g. single reports) as one byte matrix. The JSON form of the same
batch (:func:`batch_to_json`) is accepted wherever the binary one is (the HTTP gateway).
:func:`check_batch` validates a decoded batch against the known
mechanisms; :func:`dlq_record` builds the dead-letter record for ``ldp.dlq``.
"""
from __future__ import annotations

import base64
import json
import math
import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from ldpstream.credentials.device_keys import MAC_BYTES, batch_mac
from ldpstream.producers.bounded_fetch import GUARD_MARKER

if TYPE_CHECKING:  # pragma: no cover
    from ldpstream.estimators.mechanism import Mechanism

from ldpstream.names import MAX_MESSAGE_BYTES

__all__ = ["MAGIC", "FORMAT_VERSION", "MAX_MESSAGE_BYTES", "DECODE_REASONS",
           "CHECK_REASONS", "DecodeError", "ReportBatch", "encode_batch", "decode_batch",
           "decode_uniform", "is_keyed", "check_batch", "explain_batch", "batch_to_json",
           "batch_from_json", "dlq_record"]

MAGIC = b"LDPB"
FORMAT_VERSION = 1
FLAG_DEVICE_IDS = 0x01
FLAG_BATCH_KEY = 0x02
FLAG_AUTH = 0x04
_KNOWN_FLAGS = FLAG_DEVICE_IDS | FLAG_BATCH_KEY | FLAG_AUTH
DLQ_PAYLOAD_LIMIT = 64 * 1024
DECODE_REASONS = frozenset({"oversized", "bad_magic", "truncated", "malformed",
                            "decompression_bomb", "legacy_compressed"})
CHECK_REASONS = frozenset({"unknown_collection", "unknown_version", "wrong_width", "out_of_domain"})

_DTYPES: dict[int, np.dtype[Any]] = {1: np.dtype("<u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}
_HEAD0 = struct.Struct("<4sBBB")          # magic, format version, flags, collection length
_HEAD1 = struct.Struct("<IdIHB")          # config version, sent_at, n, width, dtype code
_KEY = struct.Struct("<QQ")               # batch key: sender device id, sequence
_U64_MAX = 2**64 - 1
_U32_MAX = 2**32 - 1


class DecodeError(ValueError):
    """Bytes that are not a valid report batch. ``reason`` is one of :data:`DECODE_REASONS`;
    ``collection`` is the collection id when the header got that far (for the DLQ record)."""

    def __init__(self, reason: str, detail: str, collection: str | None = None) -> None:
        assert reason in DECODE_REASONS, reason
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.collection = collection


@dataclass(frozen=True, eq=False)
class ReportBatch:
    """A decoded batch: ``reports`` is ``(n, width)`` unsigned ints (native byte order),
    ``device_ids`` ``(n,)`` uint64 or None, ``key`` the batch key ``(sender, sequence)`` or None;
    an authenticated batch names its sender's ``fleet`` and carries its ``mac`` (verified by the
    worker, agents/ingest/identity_gate.py)."""

    collection: str
    version: int
    reports: np.ndarray
    device_ids: np.ndarray | None = None
    sent_at: float = 0.0
    key: tuple[int, int] | None = None
    fleet: str | None = None
    mac: bytes | None = None

    @property
    def n(self) -> int:
        return int(self.reports.shape[0])

    @property
    def width(self) -> int:
        return int(self.reports.shape[1])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReportBatch):
            return NotImplemented
        ids_eq = (self.device_ids is None and other.device_ids is None) or (
            self.device_ids is not None and other.device_ids is not None
            and np.array_equal(self.device_ids, other.device_ids))
        return (self.collection == other.collection and self.version == other.version
                and self.sent_at == other.sent_at and self.key == other.key
                and self.fleet == other.fleet and self.mac == other.mac
                and self.reports.shape == other.reports.shape
                and np.array_equal(self.reports, other.reports) and ids_eq)

    # unhashable, as a dataclass with __eq__ is; typeshed declares __hash__ a method
    __hash__ = None  # type: ignore[assignment]


def _dtype_code(max_value: int) -> int:
    return 1 if max_value < 2**8 else 2 if max_value < 2**16 else 4


def _as_reports(reports: Any) -> np.ndarray:
    arr = np.asarray(reports)
    if arr.ndim == 1:  # a single report
        arr = arr.reshape(1, -1)
    if arr.ndim != 2:
        raise ValueError(f"reports must be 2-D (n, width), got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iub":
        raise ValueError(f"reports must be integers, got dtype {arr.dtype}")
    return arr


def encode_batch(collection: str, version: int, reports: Any, *, device_ids: Any = None,
                 sent_at: float | None = None, key: tuple[int, int] | None = None,
                 auth: tuple[str, bytes] | None = None) -> bytes:
    """Pack ``reports`` (``(n, width)`` non-negative ints; a 1-D array is one report) into the
    wire format. The value dtype is the smallest of u8/u16/u32 that holds the largest value;
    ``key`` is the batch key ``(sender device id, sequence)``, both u64; ``auth`` = (fleet,
    the sender's device key) appends the fleet and the MAC (needs ``key``)."""
    cid = collection.encode("utf-8")
    if not 1 <= len(cid) <= 255:
        raise ValueError(f"collection id must be 1..255 UTF-8 bytes, got {len(cid)}")
    if not 0 <= int(version) <= _U32_MAX:
        raise ValueError(f"version must fit in u32, got {version}")
    arr = _as_reports(reports)
    n, width = arr.shape
    if n < 1 or width < 1:
        raise ValueError(f"a batch needs n >= 1 reports of width >= 1, got shape {arr.shape}")
    if n > _U32_MAX or width > 0xFFFF:
        raise ValueError(f"batch too large: shape {arr.shape}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > _U32_MAX:
        raise ValueError(f"report values must be in [0, 2**32), got [{lo}, {hi}]")
    code = _dtype_code(hi)
    sent = time.time() if sent_at is None else float(sent_at)
    if not math.isfinite(sent):
        raise ValueError("sent_at must be finite")
    flags = 0
    key_bytes = b""
    if key is not None:
        if len(key) != 2:
            raise ValueError(f"key must be (sender, sequence), got {key!r}")
        sender, seq = _int(key[0], "key sender"), _int(key[1], "key sequence")
        if not (0 <= sender <= _U64_MAX and 0 <= seq <= _U64_MAX):
            raise ValueError(f"key must be (sender, sequence), both in [0, 2**64), got {key!r}")
        flags |= FLAG_BATCH_KEY
        key_bytes = _KEY.pack(sender, seq)
    ids_bytes = b""
    if device_ids is not None:
        ids = _int_array(device_ids, "device_ids", np.uint64)
        if ids.shape != (n,):
            raise ValueError(f"device_ids must have shape ({n},), got {ids.shape}")
        flags |= FLAG_DEVICE_IDS
        ids_bytes = ids.astype("<u8").tobytes()
    fleet_bytes = b""
    if auth is not None:
        if key is None:
            raise ValueError("an authenticated batch needs a batch key (its sender)")
        name = auth[0].encode("utf-8")
        if not 1 <= len(name) <= 255 or len(auth[1]) != MAC_BYTES:
            raise ValueError("auth must be (fleet of 1..255 UTF-8 bytes, 32-byte device key)")
        flags |= FLAG_AUTH
        fleet_bytes = bytes([len(name)]) + name
    body = b"".join((_HEAD0.pack(MAGIC, FORMAT_VERSION, flags, len(cid)), cid,
                     _HEAD1.pack(int(version), sent, n, width, code), key_bytes, ids_bytes,
                     np.ascontiguousarray(arr, dtype=_DTYPES[code]).tobytes(), fleet_bytes))
    return body if auth is None else body + batch_mac(auth[1], body)


def is_keyed(value: bytes | None) -> bool:
    """Whether a message's header sets the batch-key flag, read without decoding it (the worker
    reads the dedupe state of a poll's senders before it takes the poll)."""
    return value is not None and len(value) >= _HEAD0.size and value[:4] == MAGIC \
        and bool(value[5] & FLAG_BATCH_KEY)


def decode_batch(data: bytes | bytearray | memoryview, *,
                 max_bytes: int = MAX_MESSAGE_BYTES) -> ReportBatch:
    """Parse one message. Raises :class:`DecodeError` (and nothing else) for bad bytes."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError("malformed", f"expected bytes, got {type(data).__name__}")
    data = bytes(data) if not isinstance(data, bytes) else data
    size = len(data)
    if data.startswith(GUARD_MARKER):
        raise _refused_batch(data)
    if size > max_bytes:
        raise DecodeError("oversized", f"{size} bytes > limit {max_bytes}")
    if data[:4] != MAGIC[:min(4, size)]:
        raise DecodeError("bad_magic", f"starts with {data[:4]!r}, expected {MAGIC!r}")
    if size < _HEAD0.size:
        raise DecodeError("truncated", f"{size} bytes, header needs at least {_HEAD0.size}")
    _, fmt, flags, clen = _HEAD0.unpack_from(data, 0)
    if fmt != FORMAT_VERSION:
        raise DecodeError("malformed", f"unknown format version {fmt}")
    if flags & ~_KNOWN_FLAGS:
        raise DecodeError("malformed", f"unknown flag bits 0x{flags:02x}")
    if clen == 0:
        raise DecodeError("malformed", "empty collection id")
    pos = _HEAD0.size + clen
    if size < pos + _HEAD1.size:
        raise DecodeError("truncated", f"{size} bytes, header needs {pos + _HEAD1.size}")
    try:
        collection = data[_HEAD0.size:pos].decode("utf-8")
    except UnicodeDecodeError:
        raise DecodeError("malformed", "collection id is not UTF-8") from None
    version, sent_at, n, width, code = _HEAD1.unpack_from(data, pos)
    pos += _HEAD1.size
    if code not in _DTYPES:
        raise DecodeError("malformed", f"unknown value dtype code {code}", collection)
    if n == 0 or width == 0:
        raise DecodeError("malformed", f"empty batch (n={n}, width={width})", collection)
    if not math.isfinite(sent_at):
        raise DecodeError("malformed", f"sent_at is {sent_at}", collection)
    key_len = _KEY.size if flags & FLAG_BATCH_KEY else 0
    ids_len = 8 * n if flags & FLAG_DEVICE_IDS else 0
    need = pos + key_len + ids_len + n * width * code
    fleet = None
    if flags & FLAG_AUTH:
        if not key_len:
            raise DecodeError("malformed", "an authenticated batch without a batch key",
                              collection)
        if size < need + 1:
            raise DecodeError("truncated", f"{size} bytes, the fleet name starts at {need}",
                              collection)
        flen = data[need]
        if flen == 0:
            raise DecodeError("malformed", "empty fleet name", collection)
        if size >= need + 1 + flen:
            try:
                fleet = data[need + 1:need + 1 + flen].decode("utf-8")
            except UnicodeDecodeError:
                raise DecodeError("malformed", "fleet name is not UTF-8", collection) from None
        need += 1 + flen + MAC_BYTES
    if size < need:
        raise DecodeError("truncated", f"{size} bytes, n={n} width={width} dtype={code} needs {need}",
                          collection)
    if size > need:
        raise DecodeError("malformed", f"{size - need} trailing bytes after n={n} reports",
                          collection)
    key = None
    if key_len:
        key = _KEY.unpack_from(data, pos)
        pos += key_len
    device_ids = None
    if ids_len:
        device_ids = np.frombuffer(data, dtype="<u8", count=n, offset=pos).astype(np.uint64,
                                                                                 copy=False)
        pos += ids_len
    dt = _DTYPES[code]
    reports = np.frombuffer(data, dtype=dt, count=n * width, offset=pos).reshape(n, width)
    reports = reports.astype(dt.newbyteorder("="), copy=False)
    return ReportBatch(collection, int(version), reports, device_ids, float(sent_at),
                       None if key is None else (int(key[0]), int(key[1])), fleet,
                       data[-MAC_BYTES:] if fleet is not None else None)


def _refused_batch(data: bytes) -> DecodeError:
    """The error for a record that stands for a batch the fetch guard refused
    (producers/bounded_fetch.py): its reason and detail are in the record."""
    try:
        info = json.loads(data[len(GUARD_MARKER):])
        reason, detail = str(info["reason"]), str(info["detail"])
        detail += f" (offsets {info['first_offset']}..{info['last_offset']})"
    except (ValueError, KeyError, TypeError):
        reason, detail = "decompression_bomb", "a refused batch"
    return DecodeError(reason if reason in DECODE_REASONS else "decompression_bomb", detail)


def decode_uniform(values: list, max_bytes: int = MAX_MESSAGE_BYTES,
                   with_ids: bool = False) -> ReportBatch | None:
    """Decode many messages of identical layout at once (the worker's fast path, e.g. a stream of
    single-report messages of one collection): all of the same length, and header bytes equal to
    the first message's except ``sent_at``. The first message is decoded and validated by
    :func:`decode_batch`; the others then have the same structure, so their headers and their
    values are each joined into one array (a slice of each message, no per-message decode). Returns one batch holding
    every report (``sent_at`` = the newest, ``device_ids`` dropped unless ``with_ids``: then
    None when the messages carry none), or None when the messages are not uniform or carry
    batch keys (the caller then decodes them one by one with :func:`decode_batch`, which keeps
    each key)."""
    if not values or values[0] is None:
        return None
    first_raw = bytes(values[0])
    size = len(first_raw)
    if size > max_bytes or size < _HEAD0.size:
        return None
    for v in values:
        if v is None or len(v) != size:
            return None
    try:
        first = decode_batch(first_raw, max_bytes=max_bytes)
    except DecodeError:
        return None
    _, _, flags, clen = _HEAD0.unpack_from(first_raw, 0)
    if flags & FLAG_BATCH_KEY:
        return None
    sent_at = _HEAD0.size + clen + 4             # sent_at: the f64 after the u32 config version
    head = _HEAD0.size + clen + _HEAD1.size      # end of the header (after the dtype code)
    ids = 8 * first.n if flags & FLAG_DEVICE_IDS else 0
    if with_ids and not ids:
        return None
    # each part of every message joined straight from the messages' bytes (one copy of the
    # reports, not a copy of the whole messages and another of their reports)
    views = [memoryview(v) for v in values]
    heads = np.frombuffer(b"".join([v[:head] for v in views]), dtype=np.uint8).reshape(
        len(values), head)
    if not ((heads[:, :sent_at] == heads[0, :sent_at]).all()
            and (heads[:, sent_at + 8:] == heads[0, sent_at + 8:]).all()):
        return None
    sent = np.ascontiguousarray(heads[:, sent_at:sent_at + 8]).view("<f8").ravel()
    if not np.isfinite(sent).all():
        return None
    dt = _DTYPES[first_raw[head - 1]]
    reports = np.frombuffer(b"".join([v[head + ids:] for v in views]), dtype=dt).reshape(
        -1, first.width)
    device_ids = np.frombuffer(b"".join([v[head:head + ids] for v in views]), dtype="<u8").astype(
        np.uint64, copy=False) if with_ids else None
    return ReportBatch(first.collection, first.version,
                       reports.astype(dt.newbyteorder("="), copy=False), device_ids,
                       float(sent.max()))


#: per-column bounds repeated along a row-major report matrix, by (bounds, dtype)
_TILED: dict[tuple[bytes, str], np.ndarray] = {}


def _tiled(row: np.ndarray, size: int) -> np.ndarray:
    """``row`` repeated to ``size`` elements (a view of a cached array): the reports' bounds
    check as one long comparison, ten times faster than an ``(n, width)`` against ``(1, width)``
    broadcast, whose inner loop is one report's ``width`` elements."""
    key = (row.tobytes(), row.dtype.str)
    have = _TILED.get(key)
    if have is None or have.size < size:
        if len(_TILED) > 64:
            _TILED.clear()
        reps = -(-max(size, 2 * (0 if have is None else have.size), 4096) // row.size)
        have = _TILED[key] = np.tile(row, reps)
    return have[:size]


def explain_batch(batch: ReportBatch,
                  known: Mapping[str, Mapping[int, "Mechanism"]]) -> tuple[str, str] | None:
    """Like :func:`check_batch` but returns ``(reason, detail)``."""
    versions = known.get(batch.collection)
    if versions is None:
        return "unknown_collection", f"collection {batch.collection!r} is not configured"
    mech = versions.get(batch.version)
    if mech is None:
        return "unknown_version", (f"collection {batch.collection!r} has no version "
                                   f"{batch.version} (known: {sorted(versions)})")
    if batch.reports.ndim != 2 or batch.width != mech.report_width:
        return "wrong_width", (f"reports have width {batch.reports.shape[-1]}, mechanism "
                               f"{mech.name} expects {mech.report_width}")
    bounds = np.asarray(mech.report_bounds()).reshape(1, -1)
    reports = batch.reports
    if reports.dtype.kind in "iu":
        # compare in the reports' own dtype (an int64 bound would promote every cell): a value
        # is out of domain iff it exceeds bound − 1, clipped to what the dtype can hold
        top = np.minimum(bounds - 1, np.iinfo(reports.dtype).max).astype(reports.dtype)
        flat = reports.reshape(-1)
        if top.min() == top.max():   # every field has the same bound: one max, no temporaries
            over = flat.size > 0 and flat.max() > top[0, 0]
        else:
            over = bool((flat > _tiled(top.ravel(), flat.size)).any())
        if not (over or (reports.dtype.kind == "i" and (flat < 0).any())):
            return None
        bad = reports > top
    else:
        bad = reports >= bounds
    if reports.dtype.kind == "i":
        bad |= reports < 0
    if bad.any():
        rows, cols = np.nonzero(bad)
        return "out_of_domain", (f"{len(np.unique(rows))} of {batch.n} reports out of domain, "
                                 f"first: report {rows[0]} field {cols[0]} = "
                                 f"{batch.reports[rows[0], cols[0]]} >= {bounds[0, cols[0]]}")
    return None


def check_batch(batch: ReportBatch, known: Mapping[str, Mapping[int, "Mechanism"]]) -> str | None:
    """None when every report of ``batch`` is valid for ``known[collection][version]``, else a
    reason in :data:`CHECK_REASONS` (vectorized against ``mechanism.report_bounds()``)."""
    res = explain_batch(batch, known)
    return None if res is None else res[0]


def batch_to_json(batch: ReportBatch) -> str:
    """The debug form: a JSON object with the same fields as the binary batch."""
    return json.dumps({
        "format": FORMAT_VERSION,
        "collection": batch.collection,
        "version": batch.version,
        "sent_at": batch.sent_at,
        "device_ids": None if batch.device_ids is None else [int(x) for x in batch.device_ids],
        "key": None if batch.key is None else {"sender": batch.key[0], "sequence": batch.key[1]},
        "reports": np.asarray(batch.reports).tolist(),
    })


def batch_from_json(text: str | bytes) -> ReportBatch:
    """Parse the debug form (raises :class:`DecodeError` with reason ``malformed``)."""
    try:
        obj = json.loads(text)
    except (ValueError, TypeError) as exc:
        raise DecodeError("malformed", f"not JSON: {exc}") from None
    except RecursionError:
        raise DecodeError("malformed", "JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise DecodeError("malformed", "JSON batch must be an object")
    unknown = set(obj) - {"format", "collection", "version", "sent_at", "device_ids", "key",
                          "reports"}
    if unknown:
        raise DecodeError("malformed", f"unknown fields {sorted(unknown)}")
    if obj.get("format", FORMAT_VERSION) != FORMAT_VERSION:
        raise DecodeError("malformed", f"unknown format {obj.get('format')!r}")
    coll = obj.get("collection")
    if not isinstance(coll, str):
        raise DecodeError("malformed", "collection must be a string")
    key_obj = obj.get("key")
    if key_obj is not None and (not isinstance(key_obj, dict)
                                or set(key_obj) != {"sender", "sequence"}):
        raise DecodeError("malformed", 'key must be {"sender": int, "sequence": int} or null', coll)
    try:
        key = None if key_obj is None else (_int(key_obj["sender"], "key sender"),
                                             _int(key_obj["sequence"], "key sequence"))
        blob = encode_batch(coll, _int(obj.get("version"), "version"),
                            _int_array(obj.get("reports"), "reports"),
                            device_ids=obj.get("device_ids"),
                            sent_at=float(obj.get("sent_at", 0.0)), key=key)
    except (ValueError, TypeError, OverflowError) as exc:
        raise DecodeError("malformed", str(exc), coll) from None
    except RecursionError:
        raise DecodeError("malformed", "reports nested too deeply", coll) from None
    return decode_batch(blob, max_bytes=max(len(blob), MAX_MESSAGE_BYTES))


def _int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name} must be an integer")
    return v


def _int_array(v: Any, name: str, dtype: Any = np.int64) -> np.ndarray:
    """Integers from a (nested) list; big Python ints (device ids up to 2**64-1) kept exact."""
    if isinstance(v, np.ndarray):
        arr = v
    else:
        try:
            arr = np.asarray(v)
            if arr.dtype.kind in "fO" and arr.size and all(
                    isinstance(x, int) and not isinstance(x, bool) for x in np.ravel(
                        np.asarray(v, dtype=object))):
                arr = np.array(v, dtype=np.uint64)  # ints beyond int64 (numpy made floats)
        except (ValueError, TypeError, OverflowError):
            raise ValueError(f"{name} must be a (nested) list of integers") from None
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a (nested) list of integers")
    if arr.size and arr.dtype.kind == "i" and arr.min() < 0 and np.dtype(dtype).kind == "u":
        raise ValueError(f"{name} must be non-negative")
    return arr.astype(dtype)


def dlq_record(reason: str, detail: str, *, collection: str | None = None, topic: str | None = None,
               partition: int | None = None, offset: int | None = None,
               payload: bytes | None = None, received_at: float | None = None) -> bytes:
    """The dead-letter record (JSON bytes for topic ``ldp.dlq``); the payload is base64 of at most
    the first 64 KiB of the rejected message (``payload_bytes`` is its full length)."""
    payload = payload or b""
    return json.dumps({
        "reason": reason,
        "detail": detail,
        "collection": collection,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "received_at": time.time() if received_at is None else float(received_at),
        "payload_b64": base64.b64encode(bytes(payload[:DLQ_PAYLOAD_LIMIT])).decode("ascii"),
        "payload_bytes": len(payload),
    }, separators=(",", ":")).encode("utf-8")
